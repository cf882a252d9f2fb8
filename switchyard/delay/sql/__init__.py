"""Named SQL of the delay store (loaded by switchyard.delay.queries)."""

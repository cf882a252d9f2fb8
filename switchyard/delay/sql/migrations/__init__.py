"""Numbered schema migrations of the delay store, applied in order."""

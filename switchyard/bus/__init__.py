"""The event bus (seed 004): Routemaster's API and delivery, with per-subscriber order."""

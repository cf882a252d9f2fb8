"""Lua scripts of the pending request queue (each one multi-step Redis change, atomic)."""

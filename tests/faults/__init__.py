"""The fault suite: traffic through RPC and the delay scheduler while faults are injected.

``python -m tests.faults`` (``./dev faults``) runs every scenario at full size, then the fuzz run,
and prints the account; ``tests/faults/test_faults.py`` runs the same scenarios, smaller, in CI.
"""

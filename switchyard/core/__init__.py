"""The core every part stands on: settings, the error tree, logging and metrics, connection helpers.

Nothing here imports a part (``rpc``, ``delay``, ``pending``, ``bus``, ``spark``) or a runtime.
"""

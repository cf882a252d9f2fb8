"""Kept importable for applications that catch Switchyard's errors by their first path.

The error tree lives in ``switchyard.core.errors`` (the root and configuration errors) and in each
part's ``errors`` module; this module re-exports the names applications catch.
"""

from switchyard.core.errors import *  # noqa: F403
from switchyard.core.errors import __all__  # noqa: F401

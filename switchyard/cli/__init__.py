"""The ``switchyard`` command line: one module per area, each registering its own subcommands."""

from switchyard.cli.main import build_parser, main

__all__ = ["build_parser", "main"]

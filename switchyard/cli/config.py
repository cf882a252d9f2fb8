"""``switchyard config``: the settings this process would run with, and where they came from."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import fields

from switchyard.cli.options import add_json_option, show
from switchyard.core.config import Connections
from switchyard.core.observability import redact_url
from switchyard.core.reader import CONFIG_PATH


def cmd_config(args: argparse.Namespace) -> int:
    connections = Connections.from_env()  # the deployed stack's parameters; each URL reads its secret below
    source = CONFIG_PATH.read(os.environ) or None
    # Fields without repr say where secrets come from: not settings.
    shown = {f.name: getattr(connections, f.name) for f in fields(connections) if f.repr}
    if args.json:
        print(json.dumps({"source": source, **{name: redact_url(v) if isinstance(v, str) else v
                                               for name, v in shown.items()}}))
        return 0
    where = f"SSM {source} and the environment" if source else "the environment"
    show(f"configuration from {where} (defaults: the local stack)",
         *(f"  {name:<18} {'-' if value is None else redact_url(str(value))}"
           for name, value in shown.items()))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    config = subparsers.add_parser("config", help="print the connection settings in effect (no passwords)")
    add_json_option(config)
    config.set_defaults(func=cmd_config)

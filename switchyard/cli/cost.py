"""``switchyard cost``: what a synthesized stack costs a month idle, before it is deployed
(switchyard/aws/cost.py reads the template; ``./dev cdk synth`` writes it to cdk.out)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from switchyard.aws.cost import TemplateError, as_json, dollars, load_resources, monthly, table, total
from switchyard.cli.options import add_json_option, print_error, show


def cmd_cost(args: argparse.Namespace) -> int:
    try:
        lines = monthly(load_resources(Path(args.assembly), args.stack_name))
    except (TemplateError, OSError, ValueError, KeyError) as exc:
        return print_error(f"cannot price {args.assembly}: {exc}")
    if args.json:
        print(json.dumps(as_json(lines)))
        return 0
    show(*table(lines), "",
         f"about {dollars(total(lines))} a month idle (us-east-1 on-demand, 730 hours; per-use items and "
         "data transfer on top: check each price source)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    cost = subparsers.add_parser(
        "cost", help="print what a synthesized stack costs a month idle (run ./dev cdk synth first)",
        description="Price the resources of a synthesized CloudFormation template (and its pools' nested "
                    "templates): what the chosen parts (switchyard:parts) at the chosen size "
                    "(switchyard:size) cost a month before any traffic.")
    cost.add_argument("--assembly", default="cdk.out", metavar="PATH",
                      help="the cloud assembly directory `cdk synth` wrote, or one template file "
                           "(default: cdk.out)")
    cost.add_argument("--stack-name", default=None, metavar="NAME",
                      help="which stack of the assembly to price (default: its only one)")
    add_json_option(cost)
    cost.set_defaults(func=cmd_cost)

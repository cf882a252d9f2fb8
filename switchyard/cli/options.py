"""Options and set-up that every command shares."""

from __future__ import annotations

import argparse
import os

from switchyard.core.deployed_config import CONFIG_PATH_ENV, config_path, load_deployed_config


def add_stack_option(parser: argparse.ArgumentParser) -> None:
    """``--stack NAME``: take the configuration a deployed stack wrote to SSM (after its deploy)."""
    parser.add_argument(
        "--stack", metavar="NAME", default=argparse.SUPPRESS,  # SUPPRESS: a subcommand's copy keeps the top's
        help="read the configuration of this deployed stack (SSM parameters and secrets at "
             "AWS_ENDPOINT_URL), as its Lambda functions do; e.g. SwitchyardLocal on LocalStack")


def use_stack(stack: str) -> int:
    """Point the process at ``stack``'s configuration and load it now, so every setting sees it."""
    os.environ[CONFIG_PATH_ENV] = config_path(stack)
    return load_deployed_config()

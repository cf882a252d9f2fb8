"""What ``./dev deploy`` reads from the account before it deploys: Lambda's concurrency limit, and
that API Gateway has its CloudWatch Logs role.

Synth checks the stack's reserved concurrency against a limit (``switchyard:concurrency``
``accountLimit``, 1,000 by default), but a new account may start at 10 or 50: CloudFormation then
creates the broker, MSK and RDS (the better part of an hour) and rolls everything back when the
first reservation does not fit. ``python -m stacks.account_limits`` prints the account's own limit
(``lambda get-account-settings``) as the context value ``./dev deploy`` hands ``cdk deploy``
(``-c switchyard:accountConcurrency=N``), so the same check fails the synth, before anything is
created. API Gateway writes the stages' logs with a role set once per account and region (the
stack makes none: a stack's own role would be deleted with it while other stacks' stages still
need it); without one, CloudFormation fails the first stage, so the deploy refuses before (only when
a chosen part has an API: the deploy's ``-c switchyard:parts=...``, else cdk.json's, names the parts).
No CDK import: it runs with boto3 alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stacks import constants


def account_concurrency(client: Any = None) -> int:
    """The account's concurrent executions limit in the client's region."""
    if client is None:
        import boto3

        client = boto3.client("lambda")
    return int(client.get_account_settings()["AccountLimit"]["ConcurrentExecutions"])


def api_gateway_log_role(client: Any = None) -> str:
    """The CloudWatch Logs role API Gateway uses in the client's account and region ("" if none)."""
    if client is None:
        import boto3

        client = boto3.client("apigateway")
    return str(client.get_account().get("cloudwatchRoleArn") or "")


API_PARTS = frozenset({constants.PART_PENDING, constants.PART_BUS})  # the parts behind API Gateway
CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"


def chosen_parts(cdk_args: Sequence[str]) -> frozenset[str]:
    """The parts ``cdk deploy cdk_args`` deploys: the last ``-c``/``--context switchyard:parts=...``,
    else cdk.json's, else all (names only: synth checks them)."""
    raw: Any = json.loads(CDK_JSON.read_text()).get("context", {}).get(constants.CTX_PARTS)
    args = list(cdk_args)
    for i, flag in enumerate(args):
        given = (args[i + 1] if i + 1 < len(args) and flag in ("-c", "--context")
                 else flag.removeprefix("--context=") if flag.startswith("--context=") else "")
        key, _, chosen = given.partition("=")
        if key == constants.CTX_PARTS:
            raw = chosen
    if isinstance(raw, str):
        raw = json.loads(raw) if raw.lstrip().startswith("[") else raw.split(",")
    return frozenset(str(part).strip() for part in raw) if raw else frozenset(constants.PARTS)


def main(cdk_args: Sequence[str] = ()) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    def refuse(why: str) -> int:
        print(f"switchyard: error: {why}", file=sys.stderr)
        return 1

    try:
        if chosen_parts(cdk_args) & API_PARTS and not api_gateway_log_role():
            return refuse("API Gateway has no CloudWatch Logs role in this account and region (apigateway "
                          "get-account), and the stages' logs need one: set it once, as docs/deployment.md "
                          "\"API Gateway's account setting\" shows, then rerun")
        limit = account_concurrency()
    except (BotoCoreError, ClientError) as exc:
        first = (str(exc).splitlines() or [""])[0]
        return refuse(f"could not read the account's Lambda and API Gateway settings (apigateway "
                      f"get-account, lambda get-account-settings): {first}; check the AWS credentials "
                      "and region")
    print(f"{constants.CTX_ACCOUNT_CONCURRENCY}={limit}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))  # ./dev deploy passes its cdk deploy arguments

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
need it); without one, CloudFormation fails the first stage, so the deploy refuses before. No CDK
import: it runs with boto3 alone.
"""

from __future__ import annotations

import sys
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


def main() -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    def refuse(why: str) -> int:
        print(f"switchyard: error: {why}", file=sys.stderr)
        return 1

    try:
        if not api_gateway_log_role():
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
    sys.exit(main())

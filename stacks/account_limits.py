"""What ``./dev deploy`` reads from the account before it deploys: Lambda's concurrency limit.

Synth checks the stack's reserved concurrency against a limit (``switchyard:concurrency``
``accountLimit``, 1,000 by default), but a new account may start at 10 or 50: CloudFormation then
creates the broker, MSK and RDS (the better part of an hour) and rolls everything back when the
first reservation does not fit. ``python -m stacks.account_limits`` prints the account's own limit
(``lambda get-account-settings``) as the context value ``./dev deploy`` hands ``cdk deploy``
(``-c switchyard:accountConcurrency=N``), so the same check fails the synth, before anything is
created. No CDK import: it runs with boto3 alone.
"""

from __future__ import annotations

import sys
from typing import Any

from stacks import constants as c


def account_concurrency(client: Any = None) -> int:
    """The account's concurrent executions limit in the client's region."""
    if client is None:
        import boto3

        client = boto3.client("lambda")
    return int(client.get_account_settings()["AccountLimit"]["ConcurrentExecutions"])


def main() -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        limit = account_concurrency()
    except (BotoCoreError, ClientError) as exc:
        print(f"switchyard: error: could not read the account's Lambda concurrency limit "
              f"(lambda get-account-settings): {exc}; check the AWS credentials and region", file=sys.stderr)
        return 1
    print(f"{c.CTX_ACCOUNT_CONCURRENCY}={limit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

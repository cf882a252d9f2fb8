"""A retention on the log groups nothing in the stack creates: AWS creates them on first write, with
no expiry, and CloudWatch Logs bills their storage forever. They are the logs of CDK's own helper
functions (custom resource providers, whose groups are ``/aws/lambda/{name}``), API Gateway's
execution logs (``API-Gateway-Execution-Logs_{api id}/{stage}``) and the broker's general log
(``/aws/amazonmq/broker/{broker id}/general``). CDK's ``LogRetention`` creates each group if it is
missing and sets its retention either way, so the order in which AWS and CloudFormation get there
does not matter (a plain ``AWS::Logs::LogGroup`` would fail on a group AWS created first).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import CfnResource, Fn, Stack
from aws_cdk import aws_amazonmq as amazonmq
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs

RETENTION = logs.RetentionDays.ONE_MONTH


def _helpers(stack: Stack) -> list[CfnResource]:
    """The stack's functions whose logs go to their default group, unmanaged."""
    found = []
    for node in stack.node.find_all():
        if not isinstance(node, CfnResource) or node.cfn_resource_type != "AWS::Lambda::Function":
            continue
        if isinstance(node, lambda_.CfnFunction) and node.logging_config is not None:
            continue  # the stack's own functions and the Provider framework's: their own log group
        found.append(node)
    return found


def retain_unmanaged_logs(stack: Stack, *, apis: Sequence[apigw.RestApi],
                          broker: amazonmq.CfnBroker | None) -> None:
    names = {f"Helper{i}": Fn.join("", ["/aws/lambda/", fn.ref]) for i, fn in enumerate(_helpers(stack))}
    for i, api in enumerate(apis):
        stage = api.deployment_stage
        names[f"ApiExecution{i}"] = Fn.join(
            "", ["API-Gateway-Execution-Logs_", api.rest_api_id, "/", stage.stage_name])
    if broker is not None:
        names["BrokerGeneral"] = Fn.join("", ["/aws/amazonmq/broker/", broker.ref, "/general"])
    for construct_id, name in names.items():
        logs.LogRetention(stack, f"LogRetention{construct_id}", log_group_name=name, retention=RETENTION)

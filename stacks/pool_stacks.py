"""One nested stack per pool: what a pool makes (its functions and their roles, event source mappings and
schedule, its worker task definition, its alarms) lives in ``{POOL_STACK_PREFIX}{pool}``, so the
parent holds the pool's broker user secrets and one ``AWS::CloudFormation::Stack`` per pool, and
CloudFormation's 500 resources per stack bound the pools at dozens, not five.

Inside its nested stack a pool's constructs sit under a twin of the construct that makes them (the
``Functions`` of ``{POOL_STACK_PREFIX}pool0``), so their logical IDs are the ones they had in a flat
stack; CDK passes what they reference in the parent as parameters and returns what the parent
references (the dashboard, the pools custom resource) as outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import NestedStack, Stack
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from stacks import constants
from switchyard.rpc.control.access import BrokerRole

POOL_QUEUES = {"orphans": "orphan", "dead_letters": "dl", "activity": "activity"}  # handler -> queue suffix
POOL_ROLES = {"orphans": BrokerRole.ORPHANS, "dead_letters": BrokerRole.DEAD_LETTERS,  # handler -> user
              "activity": BrokerRole.ACTIVITY, "reconcile": BrokerRole.RECONCILE}


@dataclass(frozen=True)
class PoolFunctions:
    orphans: lambda_.Function
    dead_letters: lambda_.Function
    activity: lambda_.Function
    reconcile: lambda_.Function

    def all(self) -> dict[str, lambda_.Function]:
        return {
            "orphans": self.orphans,
            "dead_letters": self.dead_letters,
            "activity": self.activity,
            "reconcile": self.reconcile,
        }


def root_stack(scope: Construct) -> Stack:
    """The deployed stack ``scope`` is in, past any nested stack: names and namespaces come from it."""
    stack = Stack.of(scope)
    while stack.nested_stack_parent is not None:
        stack = stack.nested_stack_parent
    return stack


def pool_stacks(stack: Stack) -> list[NestedStack]:
    """The nested stacks of ``stack``'s pools, in the order they were made."""
    return [child for child in stack.node.children if isinstance(child, NestedStack)
            and child.node.id.startswith(constants.POOL_STACK_PREFIX)]


def pool_scope(construct: Construct, pool: str) -> Construct:
    """Where ``construct`` (a child of the stack) makes ``pool``'s resources: its twin in the pool's
    nested stack, or ``construct`` itself in a stack that does not nest pools (the localstack target)."""
    root = root_stack(construct)
    if not getattr(root, constants.NESTS_POOLS_ATTR, False):
        return construct
    nested = root.node.try_find_child(f"{constants.POOL_STACK_PREFIX}{pool}")
    if nested is None:
        nested = NestedStack(root, f"{constants.POOL_STACK_PREFIX}{pool}",
                             description=f"Switchyard pool {pool}: its functions, workers and alarms")
    twin = nested.node.try_find_child(construct.node.id)
    return twin if twin is not None else Construct(nested, construct.node.id)

"""Physical names, derived from the stack's name: two stacks in one account and region (staging
beside production) share none.

CloudFormation refuses a second resource with a name the account already holds (a broker, an MSK
cluster, an alarm), and a shared task definition family would let one stack's control plane run
the other's workers. Resources that need no name get none (CloudFormation makes one up); these are
the ones whose name is required (the broker, MSK, the ElastiCache group), read by people (alarms,
the dashboard, the APIs, the EMR application) or read by code, which gets it from its environment or
the deployed configuration, never from a constant: the control plane's ``SWITCHYARD_RPC_ECS_TASK_DEFINITION``,
``SWITCHYARD_ALARM_PREFIX`` (``switchyard alarms``). Metrics are not resources but collide the same
way: each stack has its own namespace (``metrics_namespace``), which its alarms and dashboard read.
"""

from __future__ import annotations

import hashlib
import re

from constructs import Construct

from stacks import constants
from stacks.pool_stacks import root_stack
from switchyard.core.deployed_config import ALARM_PREFIX_ENV, METRICS_NAMESPACE_ENV
from switchyard.core.deployed_config import metrics_namespace as stack_metrics_namespace

DIGEST_CHARS = 8


def physical_name(scope: Construct, suffix: str, *, max_length: int = 255, lower: bool = False) -> str:
    """``{stack name}-{suffix}``; when too long, the stack name is cut and a digest of it added, so
    names stay unique. ``lower``: lower case, no repeated hyphens (ElastiCache's rule)."""
    stack = root_stack(scope).stack_name
    name = f"{stack}-{suffix}"
    if len(name) > max_length:
        digest = hashlib.sha256(stack.encode()).hexdigest()[:DIGEST_CHARS]
        keep = max_length - len(suffix) - DIGEST_CHARS - 2
        if keep < 1:
            raise ValueError(f"no room for a stack name in a {max_length}-character name ending {suffix!r}")
        name = f"{stack[:keep]}-{digest}-{suffix}"
    return re.sub("-+", "-", name.lower()) if lower else name


def broker_users_secret_prefix(scope: Construct) -> str:
    """What the names of the stack's broker role users' secrets start with: a stack name has no ``/``,
    so no other stack's secret starts so."""
    return f"{root_stack(scope).stack_name}/{constants.BROKER_USERS_SECRET_PATH}/"


def alarm_prefix(scope: Construct) -> str:
    """What every alarm name of the stack starts with (``SWITCHYARD_ALARM_PREFIX``)."""
    return f"{root_stack(scope).stack_name}-"


def alarm_name(scope: Construct, name: str) -> str:
    """The CloudWatch name of the stack's alarm that its spec calls ``name``."""
    return f"{alarm_prefix(scope)}{name}"


def dashboard_name(scope: Construct) -> str:
    """The stack's dashboard is named after the stack (the ``DashboardName`` output)."""
    return root_stack(scope).stack_name


def metrics_namespace(scope: Construct) -> str:
    """The stack's CloudWatch namespace: its functions and tasks emit there, its alarms read there."""
    return stack_metrics_namespace(root_stack(scope).stack_name)


def runtime_names(scope: Construct) -> dict[str, str]:
    """The names that code reads at run time, for the deployed configuration (SSM)."""
    return {ALARM_PREFIX_ENV: alarm_prefix(scope), METRICS_NAMESPACE_ENV: metrics_namespace(scope)}

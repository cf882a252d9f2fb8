"""IAM checked per role: a synthesized template's identity policies, the AWS calls a process makes,
and a small evaluator that decides each call as AWS would from the role's statements.

Why this exists: moto enforces identity policies (``INITIAL_NO_AUTH_ACTION_COUNT``), but it matches
resources only for SQS, IAM and STS; for every other service it checks the action against resource
``*``, so a grant scoped to one secret's ARN is denied and a wrong grant cannot be told from a right
one (measured with moto 5.2.5 on Secrets Manager). Here each call is recorded with the resource ARN
it names (botocore's ``provide-client-params`` event sees every request's parameters) and evaluated
against the role's statements: explicit Deny wins, then any Allow, else denied; ``*``/``?`` wildcards
in actions (case-insensitive) and resources; ``NotAction``/``NotResource``.

What ``allowed`` ignores: ``Condition`` blocks (a conditional Allow counts as an Allow: the
conditions are asserted on the template instead), resource-based policies, permission boundaries,
SCPs and session policies (none are used here). The calls AWS services make for the stack
(tests/stacks/test_service_principals.py) go through ``service_refusal``: the template's resource
policies (topic, bucket, key, Lambda permissions) and trust policies, with their principals and
their conditions evaluated against the request's context.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

ACCOUNT, REGION, PARTITION = "123456789012", "us-east-1", "aws"  # moto's default account
PSEUDO = {"AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::Partition": PARTITION,
          "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": "SwitchyardStack", "AWS::NoValue": None}

# AWS managed policies the template attaches, as AWS documents them (only what the evaluator needs).
MANAGED_POLICIES: dict[str, list[dict[str, Any]]] = {
    "service-role/AWSLambdaBasicExecutionRole": [
        {"Effect": "Allow", "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
         "Resource": "*"}],
    "service-role/AWSLambdaVPCAccessExecutionRole": [
        {"Effect": "Allow", "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                                       "ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces",
                                       "ec2:DescribeSubnets", "ec2:DeleteNetworkInterface",
                                       "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses"],
         "Resource": "*"}],
}


@dataclass(frozen=True)
class Call:
    """One AWS request as IAM sees it: ``action`` is ``prefix:Name``, ``resource`` an ARN (or ``*``)."""

    action: str
    resource: str

    def __str__(self) -> str:
        return f"{self.action} on {self.resource}"


@dataclass(frozen=True)
class Statement:
    effect: str
    actions: tuple[str, ...] = ()
    not_actions: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    not_resources: tuple[str, ...] = ()
    conditional: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Statement:
        def many(key: str) -> tuple[str, ...]:
            value = raw.get(key, ())
            return (value,) if isinstance(value, str) else tuple(value)

        return cls(raw["Effect"], many("Action"), many("NotAction"), many("Resource"), many("NotResource"),
                   "Condition" in raw)

    def applies(self, call: Call) -> bool:
        if self.actions:
            action_ok = any(_like(p, call.action, case=False) for p in self.actions)
        else:
            action_ok = not any(_like(p, call.action, case=False) for p in self.not_actions)
        if self.resources:
            resource_ok = any(_like(p, call.resource) for p in self.resources)
        else:
            resource_ok = not any(_like(p, call.resource) for p in self.not_resources)
        return action_ok and resource_ok


def _like(pattern: str, value: str, *, case: bool = True) -> bool:
    """IAM's matching: ``*`` any run of characters, ``?`` one character, nothing else special."""
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, value, 0 if case else re.IGNORECASE) is not None


def allowed(statements: list[Statement], call: Call) -> bool:
    """AWS's identity-policy decision: an explicit Deny wins, then an Allow, else an implicit deny."""
    if any(s.effect == "Deny" and s.applies(call) for s in statements):
        return False
    return any(s.effect == "Allow" and s.applies(call) for s in statements)


# -- the template ------------------------------------------------------------------------------------
class Resolver:
    """CloudFormation's intrinsic functions over a template, with each resource's ``Ref`` and
    ``Fn::GetAtt`` given by ``refs``/``attributes`` (the moto resources the test made) or else a
    consistent fake ARN or name derived from the logical id."""

    def __init__(self, resources: Mapping[str, Mapping[str, Any]], refs: Mapping[str, str] | None = None,
                 attributes: Mapping[tuple[str, str], Any] | None = None) -> None:
        self.resources = resources
        self.refs = dict(refs or {})
        self.attributes = dict(attributes or {})

    def ref(self, logical: str) -> Any:
        if logical in PSEUDO:
            return PSEUDO[logical]
        if logical in self.refs:
            return self.refs[logical]
        kind = self.resources[logical]["Type"]
        if kind == "AWS::SecretsManager::SecretTargetAttachment":
            return self.value(self.resources[logical]["Properties"]["SecretId"])
        if kind in ("AWS::SecretsManager::Secret", "AWS::SNS::Topic"):
            return self.get_att(logical, "Arn")
        return logical.lower()  # names: roles, functions, clusters, buckets, parameters...

    def get_att(self, logical: str, attribute: str) -> Any:
        if (logical, attribute) in self.attributes:
            return self.attributes[logical, attribute]
        kind = self.resources[logical]["Type"]
        by_id = kind in ("AWS::SecretsManager::Secret", "AWS::SNS::Topic")  # their Ref is their ARN
        name = logical.lower() if by_id else self.ref(logical)
        if kind == "AWS::SecretsManager::Secret" and "Name" in self.resources[logical].get("Properties", {}):
            name = self.value(self.resources[logical]["Properties"]["Name"])  # a named secret's ARN has it
        if attribute.endswith("Endpoints"):  # lists of URLs (Amazon MQ)
            return [f"amqps://{logical.lower()}.example:5671"]
        if attribute != "Arn":
            return f"{logical.lower()}.{attribute.lower()}"
        service, path = _ARN_SHAPES.get(kind, (kind.split("::")[1].lower(), "{kind}/{name}"))
        tail = path.format(name=name, kind=kind.split("::")[2].lower())
        if service in ("iam", "s3"):
            return f"arn:{PARTITION}:{service}::{ACCOUNT if service == 'iam' else ''}:{tail}"
        return f"arn:{PARTITION}:{service}:{REGION}:{ACCOUNT}:{tail}"

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.value(x) for x in node]
        if not isinstance(node, dict):
            return node
        if len(node) != 1:
            return {k: self.value(v) for k, v in node.items()}
        (fn, arg), = node.items()
        if fn == "Ref":
            return self.ref(arg)
        if fn == "Fn::GetAtt":
            logical, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
            return self.get_att(logical, attribute)
        if fn == "Fn::Join":
            return arg[0].join(str(self.value(x)) for x in self.value(arg[1]))
        if fn == "Fn::Select":
            return self.value(arg[1])[int(self.value(arg[0]))]
        if fn == "Fn::Split":
            return str(self.value(arg[1])).split(arg[0])
        if fn == "Fn::Sub":
            text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], self.value(arg[1]))
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(self._sub(m.group(1), extra)), text)
        if fn == "Fn::GetAZs":
            return [f"{REGION}a", f"{REGION}b"]
        if fn == "Fn::ImportValue":
            raise ValueError(f"the template imports {arg}: not resolvable here")
        return {k: self.value(v) for k, v in node.items()}

    def _sub(self, name: str, extra: Mapping[str, Any]) -> Any:
        if name in extra:
            return extra[name]
        if "." in name:
            return self.get_att(*name.split(".", 1))
        return self.ref(name)


_ARN_SHAPES: dict[str, tuple[str, str]] = {
    "AWS::IAM::Role": ("iam", "role/{name}"),
    "AWS::Lambda::Function": ("lambda", "function:{name}"),
    "AWS::S3::Bucket": ("s3", "{name}"),
    "AWS::ECS::Cluster": ("ecs", "cluster/{name}"),
    "AWS::ECS::TaskDefinition": ("ecs", "task-definition/{name}:1"),
    "AWS::SecretsManager::Secret": ("secretsmanager", "secret:{name}-AbCdEf"),
    "AWS::MSK::Cluster": ("kafka", "cluster/{name}/11111111-2222-3333-4444-555555555555-1"),
    "AWS::AmazonMQ::Broker": ("mq", "broker:{name}:b-11111111-2222-3333-4444-555555555555"),
    "AWS::Logs::LogGroup": ("logs", "log-group:{name}:*"),
    "AWS::SNS::Topic": ("sns", "{name}"),
    "AWS::KMS::Key": ("kms", "key/{name}"),
}


def references(node: Any) -> Iterator[str]:
    """Logical ids a template fragment names (``Ref``, ``Fn::GetAtt``, ``${X}`` in ``Fn::Sub``)."""
    if isinstance(node, list):
        for x in node:
            yield from references(x)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "Ref" and isinstance(value, str):
                yield value
            elif key == "Fn::GetAtt":
                yield value[0] if isinstance(value, list) else value.split(".", 1)[0]
            elif key == "Fn::Sub":
                text = value if isinstance(value, str) else value[0]
                yield from (m.split(".", 1)[0] for m in re.findall(r"\$\{([^}!]+)\}", text))
                if not isinstance(value, str):
                    yield from references(value[1])
            else:
                yield from references(value)


def raw_statements(resources: Mapping[str, Mapping[str, Any]], role: str,
                   resolver: Resolver) -> list[dict[str, Any]]:
    """Every identity statement of ``role`` (logical id), unresolved: inline, attached
    ``AWS::IAM::Policy`` documents naming it, and the AWS managed policies it lists."""
    props = resources[role]["Properties"]
    raw: list[Any] = [s for p in props.get("Policies", []) for s in p["PolicyDocument"]["Statement"]]
    for res in resources.values():
        if res["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy") and \
                {"Ref": role} in res["Properties"].get("Roles", []):
            raw.extend(res["Properties"]["PolicyDocument"]["Statement"])
    for arn in props.get("ManagedPolicyArns", []):
        name = str(resolver.value(arn)).split(":policy/", 1)[1]
        if name not in MANAGED_POLICIES:
            raise KeyError(f"{role} attaches the managed policy {name}: add it to MANAGED_POLICIES")
        raw.extend(MANAGED_POLICIES[name])
    return raw


def role_statements(resources: Mapping[str, Mapping[str, Any]], role: str,
                    resolver: Resolver) -> list[Statement]:
    """``raw_statements`` of ``role``, resolved and parsed for ``allowed``."""
    return [Statement.parse(resolver.value(s)) for s in raw_statements(resources, role, resolver)]


# -- calls ----------------------------------------------------------------------------------------
# botocore's signing name -> IAM's service prefix, where they differ.
IAM_PREFIX = {"monitoring": "cloudwatch", "emr-serverless": "emr-serverless"}
# (prefix, operation) -> IAM action name, where they differ.
ACTION_NAMES = {("s3", "ListObjectsV2"): "ListBucket", ("s3", "HeadObject"): "GetObject",
                ("s3", "DeleteObjects"): "DeleteObject",
                ("s3", "HeadBucket"): "ListBucket", ("lambda", "Invoke"): "InvokeFunction"}


def _arn(service: str, tail: str, *, region: bool = True) -> str:
    return f"arn:{PARTITION}:{service}:{REGION if region else ''}:{ACCOUNT}:{tail}"


def _secret(p: Mapping[str, Any]) -> list[str]:
    sid = p["SecretId"]
    return [sid if sid.startswith("arn:") else _arn("secretsmanager", f"secret:{sid}-??????")]


def _parameter(name: str) -> str:
    return _arn("ssm", "parameter" + ("" if name.startswith("/") else "/") + name.rstrip("/"))


def _ecs(kind: str, value: str, cluster: str = "default") -> str:
    if value.startswith("arn:"):
        return value
    return _arn("ecs", f"{kind}/{cluster}/{value}" if kind == "task" else f"{kind}/{value}")


def _task_definition(value: str) -> str:
    """The task definition RunTask is authorized on. A family without a revision runs its latest
    ACTIVE revision, and since AWS's 2024 fix IAM judges that revision's ARN (aws-cdk#30751: a grant
    on the bare family ARN no longer matches; ``family:*`` does)."""
    arn = _ecs("task-definition", value)
    return arn if ":" in arn.rsplit("/", 1)[1] else f"{arn}:latest"


def _cluster_name(p: Mapping[str, Any]) -> str:
    return str(p.get("cluster", "default")).rsplit("/", 1)[-1]


# (prefix, operation) -> the resource ARNs IAM authorizes the request on ("*": no resource-level
# permissions). A call with no rule fails the test, so a new kind of call is never waved through.
RESOURCES: dict[tuple[str, str], Callable[[Mapping[str, Any]], list[str]]] = {
    ("secretsmanager", "GetSecretValue"): _secret,
    ("ssm", "GetParametersByPath"): lambda p: [_parameter(p["Path"])],
    ("ssm", "GetParameter"): lambda p: [_parameter(p["Name"])],
    ("ssm", "GetParameters"): lambda p: [_parameter(n) for n in p["Names"]],
    ("ecs", "RunTask"): lambda p: [_task_definition(p["taskDefinition"])],
    ("ecs", "ListTasks"): lambda p: [_arn("ecs", f"container-instance/{_cluster_name(p)}/*")],
    ("ecs", "DescribeTasks"): lambda p: [_ecs("task", t, _cluster_name(p)) for t in p["tasks"]],
    ("ecs", "StopTask"): lambda p: [_ecs("task", p["task"], _cluster_name(p))],
    ("ecs", "TagResource"): lambda p: [p["resourceArn"]],
    ("s3", "GetObject"): lambda p: [f"arn:{PARTITION}:s3:::{p['Bucket']}/{p['Key']}"],
    ("s3", "PutObject"): lambda p: [f"arn:{PARTITION}:s3:::{p['Bucket']}/{p['Key']}"],
    ("s3", "DeleteObject"): lambda p: [f"arn:{PARTITION}:s3:::{p['Bucket']}/{o['Key']}"
                                       for o in p["Delete"]["Objects"]] if "Delete" in p
    else [f"arn:{PARTITION}:s3:::{p['Bucket']}/{p['Key']}"],
    ("s3", "ListBucket"): lambda p: [f"arn:{PARTITION}:s3:::{p['Bucket']}"],
    ("lambda", "InvokeFunction"): lambda p: [p["FunctionName"] if p["FunctionName"].startswith("arn:")
                                             else _arn("lambda", f"function:{p['FunctionName']}")],
    ("logs", "CreateLogStream"): lambda p: [_arn("logs", f"log-group:{p['logGroupName']}:log-stream:"
                                                        f"{p['logStreamName']}")],
    ("logs", "PutLogEvents"): lambda p: [_arn("logs", f"log-group:{p['logGroupName']}:log-stream:"
                                                     f"{p['logStreamName']}")],
    ("cloudwatch", "PutMetricData"): lambda p: ["*"],
    ("ecr", "GetAuthorizationToken"): lambda p: ["*"],
    ("ecr", "BatchGetImage"): lambda p: [_arn("ecr", f"repository/{p['repositoryName']}")],
    ("ecr", "GetDownloadUrlForLayer"): lambda p: [_arn("ecr", f"repository/{p['repositoryName']}")],
    ("sts", "GetCallerIdentity"): lambda p: ["*"],
}
NO_AUTH = {("sts", "GetCallerIdentity")}  # AWS answers these whatever the policy says
# Further actions one request is authorized for: RunTask with tags also needs ecs:TagResource on the
# task it creates (AWS's "tag-on-create" authorization).
IMPLIED: dict[tuple[str, str], Callable[[Mapping[str, Any]], list[Call]]] = {
    ("ecs", "RunTask"): lambda p: [Call("ecs:TagResource", _arn("ecs", f"task/{_cluster_name(p)}/new"))]
    if p.get("tags") else [],
}


def calls_of(service: str, operation: str, params: Mapping[str, Any]) -> list[Call]:
    """The IAM calls one API request is authorized as (``IMPLIED`` included; RunTask's
    ``iam:PassRole`` on the task definition's roles is added by the test, which knows them)."""
    prefix = IAM_PREFIX.get(service, service)
    action = ACTION_NAMES.get((prefix, operation), operation)
    if (prefix, action) in NO_AUTH:
        return []
    rule = RESOURCES.get((prefix, action))
    if rule is None:
        raise KeyError(f"no resource rule for {prefix}:{action}: add one to tests/iam_policy.RESOURCES")
    implied = IMPLIED.get((prefix, action), lambda _: [])(params)
    return [*(Call(f"{prefix}:{action}", resource) for resource in rule(params)), *implied]


@contextmanager
def recording(sink: list[dict[str, Any]]) -> Iterator[None]:
    """Record every botocore request made by clients created inside the block (any session):
    ``{"service", "operation", "params"}`` into ``sink``. Registered as a built-in handler, so the
    sessions Powertools and the code under test make for themselves carry it too."""
    from botocore import handlers

    def record(params: Mapping[str, Any], model: Any, **_: Any) -> None:
        sink.append({"service": model.service_model.signing_name, "operation": model.name,
                     "params": json.loads(json.dumps(params, default=str))})

    entry = ("provide-client-params", record)
    handlers.BUILTIN_HANDLERS.append(entry)
    try:
        yield
    finally:
        handlers.BUILTIN_HANDLERS.remove(entry)


def denied(statements: list[Statement], requests: list[Mapping[str, Any]]) -> list[str]:
    """The recorded requests ``statements`` do not allow, one line each (empty: all allowed)."""
    out = []
    for req in requests:
        for call in calls_of(req["service"], req["operation"], req["params"]):
            if not allowed(statements, call):
                out.append(str(call))
    return out



# -- what AWS services do: resource-based policies, trust policies, conditions --------------------
# Condition operators as IAM applies them to a request's context (a key the request does not carry
# fails its condition). Another operator fails the test: add it here, as IAM defines it.
OPERATORS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda want, have: want == have,
    "StringLike": _like,
    "ArnEquals": lambda want, have: want == have,
    "ArnLike": _like,
    "Bool": lambda want, have: want.lower() == have.lower(),
}


@dataclass(frozen=True)
class ServiceRequest:
    """A call AWS makes for the stack: ``principal`` is a service (``cloudwatch.amazonaws.com``) or
    a role's ARN; ``context`` the condition keys the request carries (``aws:SourceArn``...)."""

    principal: str
    call: Call
    context: Mapping[str, str]

    def __str__(self) -> str:
        keys = ", ".join(f"{k}={v}" for k, v in self.context.items())
        return f"{self.principal}: {self.call} ({keys})"


def _many(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _names_principal(principal: Any, who: str) -> bool:
    """``Principal`` of a resource statement: ``*``, a service or a role's ARN (the account's root
    names no one here: it delegates to the account's IAM policies, ``service_refusal``)."""
    if principal == "*":
        return True
    names = [*_many(principal.get("Service", ())), *_many(principal.get("AWS", ()))]
    return any(n in ("*", who) for n in names)


def conditions_hold(condition: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]) -> bool:
    for operator, keys in condition.items():
        test = OPERATORS.get(operator)
        if test is None:
            raise KeyError(f"condition operator {operator}: add it to tests/iam_policy.OPERATORS")
        for key, wanted in keys.items():
            have = context.get(key)
            if have is None or not any(test(str(w), have) for w in _many(wanted)):
                return False
    return True


def resource_decision(statements: list[Mapping[str, Any]], request: ServiceRequest) -> str | None:
    """A resource (or trust) policy's answer, its conditions evaluated: ``Deny`` (an explicit deny
    applies), ``Allow``, or None (it says nothing about the request)."""
    def applies(raw: Mapping[str, Any]) -> bool:
        return (_names_principal(raw.get("Principal", {}), request.principal)
                and Statement.parse(raw).applies(request.call)
                and conditions_hold(raw.get("Condition", {}), request.context))

    matching = {raw["Effect"] for raw in statements if applies(raw)}
    return "Deny" if "Deny" in matching else "Allow" if matching else None


def resource_policies(resources: Mapping[str, Mapping[str, Any]], resolver: Resolver) -> list[dict[str, Any]]:
    """Every resource-based statement of the template, resolved, each naming the resource it guards:
    topic, bucket, secret and log policies as written, a key policy's ``*`` as that key, and each
    ``AWS::Lambda::Permission`` as the statement Lambda makes of it."""
    out: list[dict[str, Any]] = []
    for logical, res in resources.items():
        props, kind = res.get("Properties", {}), res["Type"]
        if kind in ("AWS::SNS::TopicPolicy", "AWS::S3::BucketPolicy", "AWS::SecretsManager::ResourcePolicy"):
            document = props.get("PolicyDocument") or props["ResourcePolicy"]
            out += resolver.value(document["Statement"])
        elif kind == "AWS::KMS::Key":
            arn = resolver.get_att(logical, "Arn")
            out += [{**s, "Resource": arn} for s in resolver.value(props["KeyPolicy"]["Statement"])]
        elif kind == "AWS::Lambda::Permission":
            p = resolver.value(props)
            condition: dict[str, dict[str, str]] = {}
            if "SourceArn" in p:
                condition["ArnLike"] = {"aws:SourceArn": p["SourceArn"]}
            if "SourceAccount" in p:
                condition["StringEquals"] = {"aws:SourceAccount": p["SourceAccount"]}
            kind = "Service" if p["Principal"].endswith(".amazonaws.com") else "AWS"
            who = {kind: p["Principal"]}
            out.append({"Effect": "Allow", "Principal": who, "Action": p["Action"],
                        "Resource": p["FunctionName"], "Condition": condition})
    return out


def service_refusal(request: ServiceRequest, policies: list[dict[str, Any]],
                    identity: list[Statement] | None = None) -> str | None:
    """Why AWS would refuse ``request`` (None: it is allowed). A service principal needs a resource
    policy's Allow; a role (``identity``: its statements) needs its own Allow or the resource's,
    and a KMS key's policy must allow it (the account root's statement delegates to IAM). An
    explicit Deny in the resource's policy wins over both."""
    decision = resource_decision(policies, request)
    if decision == "Deny":
        return f"denied by the resource policy: {request}"
    if decision == "Allow":
        return None
    if identity is None:
        return f"no resource policy allows {request}"
    root = {"AWS": f"arn:{PARTITION}:iam::{ACCOUNT}:root"}
    delegated = [{**s, "Principal": "*"} for s in policies if s.get("Principal") == root]
    if request.call.action.lower().startswith("kms:") and resource_decision(delegated, request) != "Allow":
        return f"the key policy neither names the role nor delegates to IAM: {request}"
    if allowed(identity, request.call):
        return None
    return f"neither the role nor the resource policy allows {request}"

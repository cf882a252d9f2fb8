"""The core's own settings, declared once (``switchyard.core.reader.Setting``): the connections every
part shares (``switchyard.core.config.Connections`` reads them) and where their credentials come from,
logs, traces, metrics, the local HTTP gateway and the command line. The reader declares the two it
needs itself (the deployed configuration's path and cache age).
"""

from __future__ import annotations

from switchyard.core.reader import Setting

# The connections every part shares (the CDK stack writes them: stacks/parameters.py).
AMQP_URL = Setting(
    "SWITCHYARD_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F",
    "RabbitMQ (Amazon MQ on AWS: `amqps://...:5671`); several nodes of one cluster comma-separated (each "
    "connection starts at a random one, then tries the others; the first gives the user and vhost)")
AMQP_HEARTBEAT = Setting(
    "SWITCHYARD_AMQP_HEARTBEAT_S", 30,
    "seconds between AMQP heartbeats on every Switchyard connection (`0`: off); the broker drops a "
    "connection silent for two of them. Handlers never block them, however long they run",
    unit="s", old=("SWITCHYARD_AMQP_HEARTBEAT",))
MANAGEMENT_URL = Setting(
    "SWITCHYARD_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672",
    "RabbitMQ management API (queue depths, policies). A cluster without a load balancer in front may list "
    "its nodes' URLs, comma-separated (`scripts/rabbitmq-cluster.sh urls` prints such a list; each URL is "
    "checked as above): a request goes to the node that answered last, and on to the next when that one "
    "does not accept the connection within 3 s, does not answer within the request's timeout (10 s; a "
    "queue listing 30 s) or answers 502-504; `switchyard` commands start when any one answers. The vhost "
    "is the one of the first URL of `SWITCHYARD_AMQP_URL`")
REDIS_URL = Setting("SWITCHYARD_REDIS_URL", "redis://127.0.0.1:6379/0",
                    "Redis: pool state, pending request queue, event bus")
REDIS_CLUSTER = Setting(
    "SWITCHYARD_REDIS_CLUSTER", False,
    "`1`: Redis is a Redis Cluster (ElastiCache cluster mode, Valkey/Redis shards) and "
    "`SWITCHYARD_REDIS_URL` names any one node of it (`redis://` or `rediss://` for TLS; the others are "
    "found from it); the clients follow `MOVED`/`ASK`, with the same timeouts and retries. Parts that "
    "support it: the pending queue ([pending](pending.md#redis-cluster)), the rpc control plane's pool "
    "state and locks ([rpc](rpc.md#redis-cluster)), the event bus ([bus](bus.md#redis-cluster)). The "
    "stack sets it, with the configuration endpoint as the URL, when `switchyard:redis` has "
    "`clusterMode` ([deployment](deployment.md#elasticache-cluster-mode))")
REDIS_TIMEOUT = Setting(
    "SWITCHYARD_REDIS_TIMEOUT_S", 5.0,
    "seconds a Redis connect or command may take before it fails (a silent Redis never hangs a handler)",
    unit="s", old=("SWITCHYARD_REDIS_TIMEOUT",))
POSTGRES_DSN = Setting("SWITCHYARD_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/switchyard",
                       "Postgres: delay store")
KAFKA_BOOTSTRAP = Setting("SWITCHYARD_KAFKA_BOOTSTRAP", "127.0.0.1:9092",
                          "Kafka bootstrap servers (tansu locally, MSK on AWS)")
KAFKA_AUTH = Setting("SWITCHYARD_KAFKA_AUTH", "none",
                     "`aws-msk-iam`: SASL/OAUTHBEARER signed with the process's IAM role (MSK)")
# Where each service's credentials come from (switchyard.core.aws_secrets): a secret's ARN, or the
# values ECS injects from it. One row of the docs' table for each field, the services in its name.
SECRET_SERVICES = ("AMQP", "POSTGRES", "REDIS")
_SECRET_DOCS = {
    "secret_arn": ("SWITCHYARD_{AMQP,POSTGRES,REDIS}_SECRET_ARN",
                   "on AWS: a JSON secret whose keys fill `{username}`, `{password}`, ... placeholders in "
                   "that service's URL(s)"),
    "username": ("SWITCHYARD_{AMQP,POSTGRES,REDIS}_USERNAME` / `_PASSWORD",
                 "the same values injected by ECS from Secrets Manager (take precedence over the secret)"),
    "password": ("", ""),
}
SECRET_SOURCES: dict[str, dict[str, Setting[str]]] = {
    service: {field: Setting(f"SWITCHYARD_{service}_{field.upper()}", "", doc, shown="none",
                             row=row or None, documented=bool(row) and service == SECRET_SERVICES[0])
              for field, (row, doc) in _SECRET_DOCS.items()}
    for service in SECRET_SERVICES
}
LOCALSTACK_URL = Setting(
    "SWITCHYARD_LOCALSTACK_URL", "http://127.0.0.1:4566",
    "LocalStack, for `python -m scripts.localstack_deploy` and `tests/localstack` (loopback only)")
ALARM_PREFIX = Setting(
    "SWITCHYARD_ALARM_PREFIX", "",
    "the prefix of the stack's alarm names, read by `switchyard alarms` (which needs it: `--stack NAME`) "
    "(see [two stacks in one account](deployment.md#two-stacks-in-one-account-staging-beside-production))",
    shown="none (a deployed stack's configuration: `{stack}-`)")
METRICS_NAMESPACE = Setting(
    "SWITCHYARD_METRICS_NAMESPACE", "",
    "the CloudWatch namespace of a process's metrics when `POWERTOOLS_METRICS_NAMESPACE` is unset: a "
    "deployed stack's configuration sets `Switchyard/<stack>` (its functions and tasks have it as "
    "`POWERTOOLS_METRICS_NAMESPACE`), so `--stack NAME` ships into the stack's own namespace, where its "
    "alarms read", shown="unset: `Switchyard`")
LOG_FORMAT = Setting(
    "SWITCHYARD_LOG_FORMAT", "",
    "`text`: one line a person reads (`LEVEL service: message key=value`, control characters escaped as "
    "`\\x1b`, `\\n`; a traceback below when there is one); `json`: Powertools' structured lines. Workers "
    "started by the drivers inherit it", shown="`text` locally; `json` in Lambda or an ECS task")
LOG_LEVEL = Setting(
    "SWITCHYARD_LOG_LEVEL", "",
    "log level of the `switchyard` loggers: DEBUG, INFO, WARNING, ERROR or CRITICAL (any case; another "
    "value logs a warning and keeps the default) (every line, at every level, has its credentials redacted)",
    shown="`INFO` (local commands: `WARNING`, to keep terminals quiet)")
TRACE_LOG = Setting(
    "SWITCHYARD_TRACE_LOG", "",
    "the local trace log: one JSON line per hop of a request (`switchyard trace ID` reads it; [following "
    "one request](operations.md#following-one-request)). Processes started from a shell that has it "
    "(workers of the drivers, Spark's driver, a client) write to it too; `off` keeps it off; never written "
    "inside a Lambda function",
    shown="unset; the local runtimes (`switchyard local`, `delay run`, `bus serve`/`worker`, `pending "
    "serve`, `demo`) set `.local/logs/trace.jsonl`")
TRACE_LOG_MAX_BYTES = Setting(
    "SWITCHYARD_TRACE_LOG_MAX_BYTES", 16 * 1024 * 1024,
    "past this size the trace log moves to `<path>.1` (the older file, replaced each time) and a new one "
    "starts; `switchyard trace` reads both", unit="bytes", shown="`16777216` (16 MiB)")
TRACEBACK = Setting(
    "SWITCHYARD_TRACEBACK", "",
    "`1`: a CLI command that fails unexpectedly raises its Python traceback instead of the one-line error "
    "(for a bug report); errors Switchyard expects are always one line", shown="unset")
HTTP_HEAD_TIMEOUT = Setting(
    "SWITCHYARD_HTTP_HEAD_TIMEOUT_S", 10.0,
    "seconds the local HTTP gateway (`switchyard bus serve`, `pending serve`) gives a connection to send a "
    "request head (from the connection or the head's first byte); slower ones are closed (slowloris). "
    "Requests in progress and idle keep-alive connections are not cut. At the connection limit (1,000 "
    "sockets, or twice the threads) a new client closes the oldest incomplete head instead",
    unit="s", old=("SWITCHYARD_HTTP_HEAD_TIMEOUT",))
SHIP_METRICS = Setting(
    "SWITCHYARD_SHIP_METRICS", "",
    "`1`: every `switchyard` command sends the metrics it emits (the handlers' under `local`, `invoke`, "
    "`delay run`, `delay invoke`) to CloudWatch `PutMetricData` (LocalStack) instead of turning them off, "
    "with the deployed functions' `service` dimension (`switchyard-<pool>`, `switchyard-delay`), so the "
    "deployed alarms see them; stats printed to stderr at exit. Never used in Lambda (EMF on stdout there)",
    shown="unset (off)")
METRICS_FLUSH_INTERVAL = Setting(
    "SWITCHYARD_METRICS_FLUSH_INTERVAL_S", 5.0,
    "seconds between shipments of the metrics shipper (sooner when 1,000 datums wait)",
    unit="s", old=("SWITCHYARD_METRICS_FLUSH_INTERVAL",))
METRICS_MAX_BACKLOG = Setting(
    "SWITCHYARD_METRICS_MAX_BACKLOG", 20_000,
    "datums the metrics shipper keeps while CloudWatch is unreachable; beyond it the oldest are dropped "
    "(counted, logged)")
XRAY_PATCH = Setting(
    "SWITCHYARD_XRAY_PATCH", (),
    "in Lambda, modules X-Ray patches for subsegments (`botocore,requests`); none by default, since "
    "patching botocore costs ~350 ms of each cold start. Outside Lambda no tracer is built", shown="empty")

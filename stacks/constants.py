"""Construct ids, resource names and context keys of the CDK app, defined once."""

from __future__ import annotations

import string

from switchyard.core import parts

# Stack
STACK_ID = "SwitchyardStack"
LOCALSTACK_STACK_ID = "SwitchyardLocal"  # the `localstack` target's stack (stacks/localstack_stack.py)
LOCALSTACK_STACK_DESCRIPTION = "Switchyard on LocalStack: settings, secrets, alarms (services run locally)"
STACK_DESCRIPTION = "Switchyard: keyed RPC, delay scheduler, pending queue and event bus"

# Constructs (ids are part of logical ids: changing one replaces the resources under it)
NETWORK_CONSTRUCT_ID = "Network"
BROKER_CONSTRUCT_ID = "Broker"
DATA_CONSTRUCT_ID = "Data"
FUNCTIONS_CONSTRUCT_ID = "Functions"
WORKERS_CONSTRUCT_ID = "Workers"
MONITORING_CONSTRUCT_ID = "Monitoring"
ANALYTICS_CONSTRUCT_ID = "Analytics"
CONFIG_CONSTRUCT_ID = "Config"  # the configuration parameters (stacks/parameters.py)

# NetworkConstruct children
VPC_ID = "Vpc"
FLOW_LOG_ID = "FlowLog"
FLOW_LOG_GROUP_ID = "FlowLogGroup"
PUBLIC_SUBNET_NAME = "public"
EGRESS_SUBNET_NAME = "private-egress"
ISOLATED_SUBNET_NAME = "private-isolated"
VPC_CIDR = "10.40.0.0/16"  # a literal, so security group rules (and cdk-nag) can see it
VPC_MAX_AZS = 2
VPC_NAT_GATEWAYS = 1  # the default of the switchyard:natGateways context
S3_ENDPOINT_ID = "S3Endpoint"
SQS_ENDPOINT_ID = "SqsEndpoint"
SQS_ENDPOINT_SG_ID = "SqsEndpointSecurityGroup"

# BrokerConstruct children
BROKER_ID = "RabbitMqBroker"
BROKER_SECURITY_GROUP_ID = "BrokerSecurityGroup"
BROKER_SECRET_ID = "BrokerAdminSecret"
BROKER_NAME_SUFFIX = "rabbitmq"  # the broker is named {stack}-rabbitmq (stacks/names.py)
# The role users' secrets are named {stack}/broker-users/{owner}-{role}: the pools custom resource
# reads them all with one statement, whatever the number of pools (stacks/names.py).
BROKER_USERS_SECRET_PATH = "broker-users"
BROKER_NAME_CHARS = 50  # Amazon MQ's limit
BROKER_ENGINE = "RABBITMQ"
BROKER_ADMIN_USERNAME = "switchyard_admin"
# Amazon MQ refuses , : = in RabbitMQ passwords. Every other punctuation character except the
# URL-unreserved - . _ ~ would need escaping in AMQP and HTTP URLs (amqps://user:password@host),
# so the generated password leaves out all of them.
BROKER_PASSWORD_EXCLUDED_CHARACTERS = "".join(c for c in string.punctuation if c not in "-._~")
BROKER_PASSWORD_LENGTH = 32
AMQPS_PORT = 5671
HTTPS_PORT = 443
BROKER_MAINTENANCE_DAY = "SUNDAY"
BROKER_MAINTENANCE_TIME = "03:00"
BROKER_MAINTENANCE_TIME_ZONE = "UTC"

# Context keys (cdk.json "context" or `cdk synth -c key=value`) and their defaults.
CTX_BROKER_ENGINE_VERSION = "switchyard:brokerEngineVersion"
CTX_BROKER_INSTANCE_TYPE = "switchyard:brokerInstanceType"
CTX_BROKER_DEPLOYMENT_MODE = "switchyard:brokerDeploymentMode"
CTX_BROKER_APPLICATIONS = "switchyard:brokerApplications"  # a clients user each (comma-separated or a list)
DEFAULT_BROKER_ENGINE_VERSION = "4.2"  # quorum queues by default; needs an mq.m7g instance type
DEFAULT_BROKER_INSTANCE_TYPE = "mq.m7g.large"  # supports both 3.13 and 4.2
DEFAULT_BROKER_DEPLOYMENT_MODE = "SINGLE_INSTANCE"
# Amazon MQ's deployment modes and the broker instances each runs (and bills): a cluster is three
# nodes behind one endpoint.
BROKER_INSTANCES = {"SINGLE_INSTANCE": 1, "CLUSTER_MULTI_AZ": 3}
BROKER_DEPLOYMENT_MODES = tuple(BROKER_INSTANCES)

# Security groups (NetworkConstruct): one per part, rules name exactly what each part reaches.
FUNCTIONS_SG_ID = "FunctionsSecurityGroup"
API_SG_ID = "PublicApiSecurityGroup"  # the public APIs' functions: Redis admits them, nothing else
WORKERS_SG_ID = "WorkersSecurityGroup"
EMR_SG_ID = "EmrSecurityGroup"
REDIS_SG_ID = "RedisSecurityGroup"
POSTGRES_SG_ID = "PostgresSecurityGroup"
MSK_SG_ID = "MskSecurityGroup"
REDIS_PORT = 6379
# ElastiCache cluster mode (switchyard:redis clusterMode): at most 500 shards and 500 nodes per group
# (the default quota is 90 nodes; AWS raises it on request).
REDIS_MAX_SHARDS = 500
REDIS_MAX_NODES = 500
POSTGRES_PORT = 5432
MSK_IAM_PORT = 9098  # SASL/IAM over TLS, inside the VPC

# Configuration (context keys, JSON values; see stacks/config.py and docs/deployment.md)
CTX_POOLS = "switchyard:pools"
CTX_DELAY = "switchyard:delay"
CTX_MSK = "switchyard:msk"
CTX_POSTGRES = "switchyard:postgres"
CTX_REDIS = "switchyard:redis"
CTX_ALARM_EMAIL = "switchyard:alarmEmail"
CTX_EMR_IMAGE = "switchyard:emrImage"
CTX_BASE_IMAGE = "switchyard:baseImage"  # what pools' own images are built FROM (stacks/base_image.py)
CTX_LAYER_DIR = "switchyard:layerDir"
CTX_CONCURRENCY = "switchyard:concurrency"  # reserved concurrency and the account limit it must fit
# The account's own limit, read by ./dev deploy (stacks/account_limits.py); it wins over accountLimit.
CTX_ACCOUNT_CONCURRENCY = "switchyard:accountConcurrency"
CTX_CALL_TIMEOUT = "switchyard:callTimeoutSeconds"  # the deployment's default call timeout (SSM)
# The AWS target's stacks: a list of names (default [STACK_ID]), e.g. staging beside production.
CTX_STACKS = "switchyard:stacks"
CTX_PRODUCTION = "switchyard:production"  # true: deletion protection and snapshots (stacks/data.py)
CTX_NAT_GATEWAYS = "switchyard:natGateways"  # 1 (default, cheapest) up to VPC_MAX_AZS (one per AZ)
CTX_BUS = "switchyard:bus"  # the event bus's delivery workers: how many, on which capacity provider
# Which parts a stack deploys (default all) and the size that picks their instance types (stacks/sizes.py).
CTX_PARTS = "switchyard:parts"
CTX_SIZE = "switchyard:size"
PART_RPC, PART_DELAY, PART_PENDING, PART_BUS = parts.RPC, parts.DELAY, parts.PENDING, parts.BUS
PART_SPARK = parts.SPARK
PARTS = parts.PARTS
# What a part cannot be deployed without, and why (synth fails naming both).
PART_NEEDS = {PART_SPARK: ((PART_DELAY, PART_RPC),
                           "its jobs schedule calls: rows through the delay input topic, into the pools")}
# Which stack the app builds: the AWS deployment or what LocalStack can host (the rest runs locally).
CTX_TARGET = "switchyard:target"
TARGET_AWS = "aws"
TARGET_LOCALSTACK = "localstack"
TARGETS = (TARGET_AWS, TARGET_LOCALSTACK)
EXAMPLE_POOL = "core"
POSTGRES_VERSIONS = {"15": "VER_15", "16": "VER_16", "17": "VER_17"}

# Platform (stacks/platform.py): the Lambda runtime python{PYTHON_VERSION} on CPU_ARCHITECTURE, the
# layer's wheels (layers/build.sh reads both lines), the worker image's python:{PYTHON_VERSION}-slim
# and the Fargate tasks' CPU. 3.13: the newest Lambda Python that this project's machines can build
# and import-test a layer for (docs/deployment.md, "Runtime and platform").
PYTHON_VERSION = "3.13"
CPU_ARCHITECTURE = "x86_64"

# Lambda
LAYER_DIR = "layers/build/switchyard"  # what layers/build.sh writes, relative to the repository
FUNCTIONS_DIR = "functions"
LAMBDA_MEMORY_MB = 512
LOG_LEVEL = "INFO"
ESM_TIMEOUT_S = 60  # one batch: forward / answer / track, all confirmed
# An MSK mapping retries a failed batch (the records its partial batch response names) this many
# times, then sends its description (topic, partition, offsets) to the Kafka failures queue and goes
# on: a record no retry can take never blocks its partition for ever. The handlers park what is wrong
# with one record themselves, so what fails is an outage (RabbitMQ, Postgres) outlasting the retries.
KAFKA_RETRY_ATTEMPTS = 1000  # 0-10,000 in provisioned mode (AWS's default: infinite)
KAFKA_FAILURES_QUEUE_ID = "KafkaFailedBatches"
KAFKA_FAILURES_RETENTION_DAYS = 14  # SQS's longest
RECONCILE_TIMEOUT_S = 60
# fire and sweep loop until their time runs short; a schedule fires each minute, so with a
# 70 s timeout at most two overlap (the next starts before the last stops: no gap in firing).
LOOP_TIMEOUT_S = 70
FIRE_RESERVED_CONCURRENCY = 2
SWEEP_RESERVED_CONCURRENCY = 2
# The pending node API's long polls each hold an execution up to 25 s: its reservation is also its cap.
PENDING_API_RESERVED_CONCURRENCY = 100
# The bus API answers in tens of milliseconds: 100 executions serve its stage's 2,000 requests/s.
BUS_API_RESERVED_CONCURRENCY = 100
RECONCILE_RESERVED_CONCURRENCY = 1  # one pass at a time per pool (the reconciler lock agrees)
BUS_HOUSEKEEPING_RESERVED_CONCURRENCY = 1  # one housekeeping pass at a time
# Lambda keeps at least this many of the account's concurrent executions unreserved: a function whose
# reservation would leave fewer fails to deploy. The account's limit is a context value
# (switchyard:concurrency accountLimit), 1,000 by default (Lambda's default quota; new accounts may
# start lower and must raise it first).
LAMBDA_MIN_UNRESERVED = 100
DEFAULT_ACCOUNT_CONCURRENCY = 1000
DEPLOY_TIMEOUT_S = 300
# CloudFormation's resources per stack. Each pool's own resources are in a nested stack named
# POOL_STACK_PREFIX + pool (stacks/pool_stacks.py) in a stack that has NESTS_POOLS_ATTR true.
CFN_MAX_RESOURCES = 500
POOL_STACK_PREFIX = "Pool-"
NESTS_POOLS_ATTR = "nests_pools"
PIPELINE_OLD_VERSIONS_DAYS = 30  # the pipeline bucket keeps overwritten objects this long
# RDS grows its storage by itself up to this many times the allocated size (storage autoscaling).
POSTGRES_STORAGE_GROWTH = 5
# Postgres connections each warm environment keeps (the store: one per thread that uses it).
CONNECTIONS_PER_ENQUEUE = 1
CONNECTIONS_PER_FIRE = 2  # the firing thread's claims and the store worker thread
CONNECTIONS_PER_SWEEP = 1
CONNECTIONS_PER_RELAY = 1  # the scheduled-call relay parks calls for no pool in the delay store
POSTGRES_BUDGET_SHARE = 50  # percent of max_connections the functions may use; the rest: admin, EMR
SCHEDULE_RATE_MINUTES = 1
# The delay input's MSK mapping runs in provisioned mode: partial batch response is one of its error
# handling controls, and provisioned pollers invoke the function without a NAT route or interface
# endpoints in the cluster's isolated subnets (docs/deployment.md, "The delay input's event source").
# A Kafka poller drives up to 5 concurrent invocations; one invocation per partition is all the
# mapping ever runs.
DELAY_MIN_POLLERS = 1
KAFKA_INVOCATIONS_PER_POLLER = 5
# The MSK mappings' provisioned poller group (``{stack}-msk-pollers``): they share its event poller
# units (AWS: up to 100 mappings in the event source's VPC per group) instead of one set each.
MSK_POLLER_GROUP_SUFFIX = "msk-pollers"

# A new key's first call on AWS (docs/deployment.md, "A new key's first call"): its request waits, under its
# expiration (the call's timeout), for the orphan event source (its batch window, then its poll), the
# orphan handler (a cold start in the VPC: configuration, secrets, the broker), RunTask and the
# Fargate task's start, then the worker's own start. Estimates, in seconds:
FARGATE_TASK_START_S = 45  # AWS (re:Post, ECS team): "30-45 seconds or longer", the image pull included
ORPHAN_HANDLER_START_S = 15  # the mapping's poll, a VPC cold start, SSM + Secrets Manager + AMQP
WORKER_START_S = 10  # the worker process: imports, AMQP connection, consume
DEFAULT_AWS_CALL_TIMEOUT_S = 120  # the deployment's default: the estimate above (71 s) with room to spare

# ECS
BUS_WORKERS = 2  # the bus's delivery tasks (switchyard:bus workers); each runs its delivery threads
WORKER_CONTAINER = "worker"
WORKER_STOP_TIMEOUT_S = 120  # Fargate's maximum: SIGTERM, then SIGKILL this much later
WORKER_FAMILY_SUFFIX = "worker-"  # a pool's task definition family: {stack}-worker-{pool}

# Monitoring
ALARM_PERIOD_MINUTES = 5
ALARM_MATH_METRICS = 10  # CloudWatch: an alarm's metric math expression reads at most 10 metrics
# LocalStack target: alarms trip and clear within seconds (CloudWatch accepts 10 s periods; LocalStack
# evaluates them on standard-resolution data too).
LOCALSTACK_ALARM_PERIOD_S = 10
POSTGRES_CONNECTIONS_ALARM_PERCENT = 80
DELAY_BACKLOG_LATENESS_MS = 60_000  # a message a whole minute late: the fire loop is behind

# EMR Serverless
EMR_RELEASE = "emr-7.9.0"
EMR_APPLICATION_NAME_CHARS = 64

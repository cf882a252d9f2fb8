"""Alarms on what fills up and on what must never stop: the broker's memory and disk, ElastiCache's
memory, RDS's free storage, MSK's disks, and a heartbeat for each loop that runs every minute (fire,
sweep, each pool's reconcile), which treats missing data as breaching: a loop that stopped reports
nothing at all.

RabbitMQ blocks every publisher when memory passes its high watermark or free disk falls to its
limit (Amazon MQ publishes both figures and both limits); RDS and MSK stop writing when a disk is
full. Each threshold leaves time to act (a larger instance, more storage) before that point.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw

from stacks import constants
from stacks.alarm_specs import PERIOD, AlarmSpec
from stacks.broker import BrokerConstruct
from stacks.config import DeploymentConfig
from stacks.data import DataConstruct
from stacks.functions import FunctionsConstruct

GIB = 1024**3
BROKER_MEMORY_ALARM_PERCENT = 80  # of RabbitMQ's memory high watermark (RabbitMQMemLimit)
BROKER_DISK_ALARM_MULTIPLE = 2  # free disk under twice RabbitMQ's free disk limit
POSTGRES_FREE_STORAGE_ALARM_GIB = 2
MSK_DISK_ALARM_PERCENT = 80
HEARTBEAT_PERIOD = Duration.minutes(constants.ALARM_PERIOD_MINUTES)


def _metric(namespace: str, name: str, dimensions: dict[str, str], statistic: str = "Maximum") -> cw.Metric:
    return cw.Metric(namespace=namespace, metric_name=name, dimensions_map=dimensions, statistic=statistic,
                     period=PERIOD)


def _broker(broker: BrokerConstruct) -> list[AlarmSpec]:
    def mq(name: str, statistic: str = "Maximum") -> cw.Metric:
        return _metric("AWS/AmazonMQ", name, {"Broker": broker.broker.broker_name}, statistic)

    return [
        AlarmSpec(
            "rabbitmq-memory",
            cw.MathExpression(expression="100 * used / limit", label="memory used, % of the high watermark",
                              using_metrics={"used": mq("RabbitMQMemUsed"), "limit": mq("RabbitMQMemLimit")},
                              period=PERIOD),
            BROKER_MEMORY_ALARM_PERCENT,
            f"The broker uses {BROKER_MEMORY_ALARM_PERCENT}% of its memory high watermark for 10 minutes: "
            "at 100% RabbitMQ blocks every publisher (callers time out). A larger instance type, or fewer "
            "live keys (queues) per broker.",
            periods=2,
        ),
        AlarmSpec(
            "rabbitmq-disk",
            cw.MathExpression(expression="free / limit", label="free disk, multiples of the free disk limit",
                              using_metrics={"free": mq("RabbitMQDiskFree", "Minimum"),
                                             "limit": mq("RabbitMQDiskFreeLimit")},
                              period=PERIOD),
            BROKER_DISK_ALARM_MULTIPLE,
            f"The broker's free disk is under {BROKER_DISK_ALARM_MULTIPLE} times RabbitMQ's free disk limit: "
            "at the limit it blocks every publisher. Queues are holding messages no one consumes (a "
            "stopped worker group, the poison and dead letter queues).",
            comparison=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
        ),
    ]


def redis_memory(data: DataConstruct) -> list[tuple[str, cw.IMetric]]:
    """ElastiCache's memory use, % of a node's: the first node's, or in cluster mode the fullest
    shard's (its first node's) in groups of at most ``ALARM_MATH_METRICS`` shards, each with the name
    suffix of the shards it covers when there are several. The fullest matters: keys sharing a hash
    tag (the bus's) fill one shard."""
    members = data.redis_member_ids
    groups = [members[i:i + constants.ALARM_MATH_METRICS]
              for i in range(0, len(members), constants.ALARM_MATH_METRICS)]

    def node(member: str) -> cw.Metric:
        return _metric("AWS/ElastiCache", "DatabaseMemoryUsagePercentage", {"CacheClusterId": member})

    if len(members) == 1:
        return [("", node(members[0]))]
    found: list[tuple[str, cw.IMetric]] = []
    for n, group in enumerate(groups):
        first, last = n * constants.ALARM_MATH_METRICS + 1, n * constants.ALARM_MATH_METRICS + len(group)
        shards = {f"s{first + i}": node(member) for i, member in enumerate(group)}
        found.append((f"-shards-{first}-{last}" if len(groups) > 1 else "", cw.MathExpression(
            expression=f"MAX([{', '.join(shards)}])", using_metrics=shards, period=PERIOD,
            label=f"the fullest of shards {first}-{last}, % of a node's memory")))
    return found


def _redis(config: DeploymentConfig, data: DataConstruct) -> list[AlarmSpec]:
    percent = config.redis.memory_alarm_percent
    return [AlarmSpec(
        f"elasticache-memory{shards}",
        metric,
        percent,
        f"Redis uses {percent}% of a node's memory (in cluster mode: of the fullest shard's): at 100% "
        "writes fail and the control plane stops.",
        periods=2,
    ) for shards, metric in redis_memory(data)]


def _postgres(data: DataConstruct) -> AlarmSpec:
    return AlarmSpec(
        "postgres-free-storage",
        data.postgres.metric_free_storage_space(statistic="Minimum", period=PERIOD),
        POSTGRES_FREE_STORAGE_ALARM_GIB * GIB,
        f"Postgres has under {POSTGRES_FREE_STORAGE_ALARM_GIB} GiB free: storage autoscaling (up to "
        f"{constants.POSTGRES_STORAGE_GROWTH}x the allocated size) has run out or cannot keep up, and a "
        "full disk stops the delay store (nothing is enqueued or fired).",
        comparison=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
    )


def _kafka(config: DeploymentConfig, data: DataConstruct) -> AlarmSpec:
    cluster = str(data.kafka.cluster_name)
    brokers = {f"b{i}": _metric("AWS/Kafka", "KafkaDataLogsDiskUsed",
                                {"Cluster Name": cluster, "Broker ID": str(i)})
               for i in range(1, config.msk.broker_nodes + 1)}
    return AlarmSpec(
        "msk-disk",
        cw.MathExpression(expression=f"MAX([{', '.join(brokers)}])", using_metrics=brokers,
                          label="the fullest MSK broker's data disk, %", period=PERIOD),
        MSK_DISK_ALARM_PERCENT,
        f"An MSK broker's data disk is {MSK_DISK_ALARM_PERCENT}% full: at 100% the broker stops "
        "accepting writes (enqueue and fire fail). Raise the volume (switchyard:msk volumeGib) or "
        "shorten the topics' retention.",
    )


def _heartbeats(functions: FunctionsConstruct) -> list[AlarmSpec]:
    delay = ("fire", "sweep") if functions.delay else ()
    loops = {**{f"delay-{role}": (None, functions.delay[role]) for role in delay},
             **{f"{name}-reconcile": (name, fns.reconcile) for name, fns in functions.pools.items()}}
    return [AlarmSpec(
        f"{name}-heartbeat",
        fn.metric_invocations(statistic="Sum", period=HEARTBEAT_PERIOD),
        1,
        f"{name} ran no invocation for {constants.ALARM_PERIOD_MINUTES} minutes: its schedule (every minute) "
        "stopped, or the function cannot start. No data counts as this alarm: a stopped loop reports "
        "nothing.",
        comparison=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
        missing=cw.TreatMissingData.BREACHING,
        pool=pool,
    ) for name, (pool, fn) in loops.items()]


def resource_alarm_specs(config: DeploymentConfig, functions: FunctionsConstruct, data: DataConstruct,
                         broker: BrokerConstruct | None) -> list[AlarmSpec]:
    """The chosen parts' services' alarms (switchyard:parts)."""
    delay = [_postgres(data), _kafka(config, data)] if config.has(constants.PART_DELAY) else []
    return [*(_redis(config, data) if config.redis_needed else []), *(_broker(broker) if broker else []),
            *delay, *_heartbeats(functions)]

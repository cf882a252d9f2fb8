"""CloudWatch: the alarms (each threshold says why), the SNS topic they notify, one dashboard.

Metrics come from three places: the handlers (Powertools EMF, the stack's own namespace
``Switchyard/<stack name>`` (stacks/names.py: a second stack's traffic never reaches these alarms), dimension
``service`` = ``switchyard-{pool}`` or ``switchyard-delay``), the reconciler (``QueueDepth`` per
``WorkerGroup``: Amazon MQ 4.x publishes no per-queue metric) and AWS's own (Lambda, RDS,
ElastiCache, ECS).

Both targets build the alarms over Switchyard's own metrics with the same code
(``switchyard_alarm_specs``); alarms over AWS's own metrics exist only when the AWS resources are
given (``AwsResources``: the AWS target). The LocalStack target passes a short ``period``, so an
alarm trips and clears within seconds of its metrics (LocalStack evaluates alarms as CloudWatch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from constructs import Construct

from stacks import constants
from stacks.alarm_specs import PERIOD, AlarmSpec, errors_or_throttles
from stacks.alarm_topic import build_alarm_topic
from stacks.broker import BrokerConstruct
from stacks.config import DeploymentConfig, PoolConfig
from stacks.constants import PART_DELAY, PART_RPC
from stacks.data import DataConstruct
from stacks.functions import FunctionsConstruct
from stacks.names import alarm_name, dashboard_name, metrics_namespace
from stacks.pool_stacks import pool_scope
from stacks.resource_alarms import redis_memory, resource_alarm_specs
from stacks.workers import WorkersConstruct
from switchyard.core.observability import DELAY_SERVICE, SCHEDULED_SERVICE, pool_service
from switchyard.delay import metrics as delay_metrics
from switchyard.rpc import metrics as rpc_metrics

# Metrics Insights (SELECT ... FROM SCHEMA) aggregates at one-minute granularity and does not read
# high-resolution data: a shorter period is not finer, so its alarms use at least this, on both
# targets (the LocalStack target's 10 s periods are for the alarms on plain EMF metrics).
INSIGHTS_PERIOD = Duration.minutes(1)


@dataclass(frozen=True)
class AwsResources:
    """What only the AWS target has, and whose AWS metrics (Lambda, RDS, ElastiCache, ECS) it alarms on."""

    functions: FunctionsConstruct
    data: DataConstruct
    workers: WorkersConstruct | None  # None: no part of the stack runs ECS tasks
    broker: BrokerConstruct | None  # None: no rpc part


class MonitoringConstruct(Construct):
    """``topic`` (SNS), ``alarms`` (spec name -> alarm; CloudWatch name ``alarm_name(stack, spec name)``) and
    ``dashboard`` (None when not built). ``aws``: the AWS target's resources (None on LocalStack)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeploymentConfig,
        aws: AwsResources | None = None,
        period: Duration = PERIOD,
        encrypt_topic: bool = True,
        dashboard: bool = True,
    ) -> None:
        """``encrypt_topic``: with a customer managed KMS key (LocalStack 4.13 cannot create symmetric
        keys on Python 3.11: its KMS passes bytes to ``uuid.uuid5``, which takes them only from 3.12).
        ``dashboard``: build the dashboard (LocalStack's CloudFormation has no provider for
        ``AWS::CloudWatch::Dashboard``: it reports CREATE_COMPLETE and creates nothing)."""
        super().__init__(scope, construct_id)
        self.config, self.aws, self.period = config, aws, period
        shorter = period.to_seconds() < INSIGHTS_PERIOD.to_seconds()
        self.insights_period = INSIGHTS_PERIOD if shorter else period
        self.topic = build_alarm_topic(self, encrypt=encrypt_topic, email=config.alarm_email)
        self.alarms: dict[str, cw.Alarm] = {}
        for spec in self.switchyard_alarm_specs() + (self._aws_specs(aws) if aws else []):
            self.add_alarm(spec)
        self.dashboard = self._build_dashboard() if dashboard else None

    # -- metrics ---------------------------------------------------------------------------------
    def emf(self, name: str, service: str, statistic: str = "Sum", period: Duration = PERIOD) -> cw.Metric:
        return cw.Metric(
            namespace=metrics_namespace(self),
            metric_name=name,
            dimensions_map={"service": service},
            statistic=statistic,
            period=period,
        )

    def _emf(self, name: str, service: str, statistic: str = "Sum") -> cw.Metric:
        return self.emf(name, service, statistic, self.period)

    def _emf_sum(self, label: str, service: str, **metrics: str) -> cw.MathExpression:
        """One alarm input adding EMF counts, given as ``id=MetricName`` (the ids form the expression)."""
        inputs = {key: self._emf(name, service) for key, name in metrics.items()}
        return cw.MathExpression(expression=" + ".join(metrics), using_metrics=inputs, label=label,
                                 period=self.period)

    def queue_depth(self, pool: PoolConfig) -> cw.MathExpression:
        """The deepest worker group queue of the pool (Metrics Insights: groups come and go)."""
        return cw.MathExpression(
            expression=(
                f"SELECT MAX({rpc_metrics.QUEUE_DEPTH}) "
                f'FROM SCHEMA("{metrics_namespace(self)}", WorkerGroup, service) '
                f"WHERE service = '{pool_service(pool.name)}'"
            ),
            label=f"{pool.name}: deepest worker group queue",
            period=INSIGHTS_PERIOD,  # one evaluation per minute: queue_depth_alarm_minutes of them
        )

    def switchyard_alarm_specs(self) -> list[AlarmSpec]:
        """Alarms over Switchyard's own metrics (EMF, namespace ``Switchyard``): both targets."""
        specs: list[AlarmSpec] = []
        for pool in self.config.pools:
            service = pool_service(pool.name)
            mine = [
                AlarmSpec(
                    f"{pool.name}-poison-growing",
                    self._emf(rpc_metrics.DEAD_LETTER_POISONED, service),
                    1,
                    "A poison request failed delivery-limit times: a handler bug or a bad request "
                    "that no retry will fix; each one waits in the poison queue for a person.",
                ),
                AlarmSpec(
                    f"{pool.name}-requests-expiring",
                    self._emf(rpc_metrics.DEAD_LETTER_EXPIRED, service),
                    10,
                    "Ten requests in five minutes expired before a worker answered: groups start too "
                    "slowly or run too few workers for their load (callers got 'expired', nothing lost).",
                ),
                AlarmSpec(
                    f"{pool.name}-requests-rejected",
                    self._emf_sum("rejected or refused by a full queue", service,
                                  rejected=rpc_metrics.DEAD_LETTER_REJECTED,
                                  maxlen=rpc_metrics.DEAD_LETTER_MAXLEN),
                    1,
                    "A worker rejected a request or a full queue refused one: neither happens in normal "
                    "operation (Requeue republishes; queues have no length limit by default).",
                ),
                AlarmSpec(
                    f"{pool.name}-worker-group-start-failures",
                    self._emf_sum("worker group start/stop/scale failures", service,
                                  orphan=rpc_metrics.ORPHAN_GROUP_START_FAILURES,
                                  reconcile=rpc_metrics.RECONCILE_DRIVER_ERRORS),
                    1,
                    "ECS refused or throttled worker starts for 10 minutes running: the reconciler retries "
                    "every pass, so a failure that lasts two periods is capacity, quota or permissions.",
                    periods=2,
                ),
                AlarmSpec(
                    f"{pool.name}-queue-depth-above-target",
                    self.queue_depth(pool),
                    pool.queue_depth_threshold,
                    f"A group's queue held more than maxWorkers x targetBacklog = "
                    f"{pool.queue_depth_threshold} requests for {pool.queue_depth_alarm_minutes} minutes: "
                    "the group runs at its maximum and still falls behind.",
                    periods=pool.queue_depth_alarm_minutes,
                    comparison=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
                ),
            ]
            specs += [replace(spec, pool=pool.name) for spec in mine]
        if self.config.pools:
            specs.append(AlarmSpec(
                "rabbitmq-dead-lettering-stranded",
                cw.MathExpression(
                    expression=(f"SELECT MAX({rpc_metrics.RECONCILE_DEAD_LETTERING_STRANDED}) "
                                f'FROM SCHEMA("{metrics_namespace(self)}", service)'),
                    label="broker probes that found at-least-once dead-lettering stranded",
                    period=self.insights_period,
                ),
                1,
                "The broker's at-least-once dead-letter supervisor has stopped (rabbitmq-server#16652): "
                "orphans wait in the staging queues and new pools cannot be declared. Reboot the broker "
                "(aws mq reboot-broker); nothing waiting is lost. See docs/operations.md.",
            ))
        if self.config.has(PART_DELAY):
            specs += self._delay_specs()
        if self.config.has(PART_DELAY, PART_RPC):
            specs += self._scheduled_specs()
        return specs

    def _delay_specs(self) -> list[AlarmSpec]:
        sla = self.config.delay.lateness_sla_ms
        return [
            AlarmSpec(
                "delay-backlog-overdue",
                self._emf(delay_metrics.DELAY_MAX_TIMER_LATENESS, DELAY_SERVICE, "Maximum"),
                constants.DELAY_BACKLOG_LATENESS_MS,
                "A message fired a whole minute after its deadline: the fire loop is behind (or was "
                "down) and due messages are piling up.",
            ),
            AlarmSpec(
                "delay-messages-overdue",
                self._emf(delay_metrics.DELAY_MESSAGES_OVERDUE, DELAY_SERVICE, "Maximum"),
                1,
                "Messages due over a minute ago still wait unclaimed at the end of two invocations in "
                "a row: the fire loop cannot keep up (or cannot publish); they fire late, never lost.",
                periods=2,
            ),
            AlarmSpec(
                "delay-lateness-p999-above-sla",
                self._emf(delay_metrics.DELAY_MAX_TIMER_LATENESS, DELAY_SERVICE, "p99.9"),
                sla,
                f"p99.9 of each invocation's worst lateness above the {sla} ms SLA for 15 minutes "
                "(an upper bound of the per-message p99.9).",
                periods=3,
                comparison=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            ),
            AlarmSpec(
                "delay-messages-parked",
                self._emf(delay_metrics.DELAY_MESSAGES_PARKED, DELAY_SERVICE),
                1,
                "The output broker refused a message for good (too large, an invalid record): it was "
                "parked, not fired; `switchyard delay parked` lists it, `switchyard delay replay` sends it "
                "again once the cause is fixed.",
            ),
            AlarmSpec(
                "delay-sweep-takeovers",
                self._emf(delay_metrics.DELAY_SUSPECTED_FAILURES, DELAY_SERVICE),
                1,
                "The sweep reset messages held past the hold time: a fire node died or stalled; "
                "its messages fire late (never lost).",
            ),
            AlarmSpec(
                "delay-publish-or-store-errors",
                self._emf_sum("delay publish failures + store errors", DELAY_SERVICE,
                              publish=delay_metrics.DELAY_PUBLISH_FAILURES,
                              store=delay_metrics.DELAY_STORE_ERRORS),
                1,
                "MSK did not confirm, or Postgres failed, for 10 minutes: retried messages fire late.",
                periods=2,
            ),
        ]

    def _scheduled_specs(self) -> list[AlarmSpec]:
        return [
            AlarmSpec(
                "scheduled-calls-refused",
                self._emf_sum("scheduled calls refused (parked)", SCHEDULED_SERVICE,
                              unknown=rpc_metrics.SCHEDULED_UNKNOWN_POOL,
                              malformed=rpc_metrics.SCHEDULED_MALFORMED,
                              expired=rpc_metrics.SCHEDULED_EXPIRED,
                              unroutable=rpc_metrics.SCHEDULED_UNROUTABLE),
                1,
                "A scheduled call fired but was not made: its pool does not exist, it could not be read, "
                "it expired before it fired, or nothing routed it. It is parked with the reason (the "
                "pool's poison queue, else `switchyard delay parked`) for a person to act on.",
            ),
            AlarmSpec(
                "scheduled-calls-publish-failures",
                self._emf(rpc_metrics.SCHEDULED_PUBLISH_FAILURES, SCHEDULED_SERVICE),
                1,
                "The relay could not hand fired calls to RabbitMQ for 10 minutes: they are retried from "
                "the output topic (at least once), so they run late, never lost.",
                periods=2,
            ),
        ]

    def _aws_specs(self, aws: AwsResources) -> list[AlarmSpec]:
        """Alarms over AWS's own metrics of the AWS target's resources (Lambda, RDS, ElastiCache)."""
        specs: list[AlarmSpec] = []
        for pool in self.config.pools:
            fns = aws.functions.pools[pool.name]
            specs.append(AlarmSpec(
                f"{pool.name}-orphan-forwarding-failures",
                fns.orphans.metric_errors(period=PERIOD),
                1,
                "An orphan batch raised: the whole batch is redelivered and its callers wait "
                "(duplicates, never losses); one failure is worth a look, a run of them is an outage.",
                pool=pool.name,
            ))
            for role, fn in fns.all().items():
                specs.append(errors_or_throttles(f"{pool.name}-{role}", fn, pool.name))
        for role, fn in aws.functions.delay.items():
            specs.append(errors_or_throttles(f"delay-{role}", fn))
        if self.config.has(PART_DELAY, PART_RPC):
            specs.append(errors_or_throttles("scheduled-relay", aws.functions.scheduled))
        if self.config.has(PART_DELAY):
            specs += self._delay_aws_specs(aws)
        return specs + resource_alarm_specs(self.config, aws.functions, aws.data, aws.broker)

    def _delay_aws_specs(self, aws: AwsResources) -> list[AlarmSpec]:
        specs = [AlarmSpec(
            "kafka-batches-failed",
            aws.functions.kafka_failures.metric_approximate_number_of_messages_visible(period=PERIOD), 1,
            f"An MSK mapping gave up a batch after {constants.KAFKA_RETRY_ATTEMPTS} retries: the message "
            "names its topic, partition and offsets; produce those records again once the outage is over.",
        )]
        delay = self.config.delay
        specs += [
            AlarmSpec(
                "delay-msk-offset-lag",
                self.offset_lag(aws),
                delay.offset_lag_alarm,
                f"The enqueue function is {delay.offset_lag_alarm} records behind the input topic for 15 "
                "minutes: messages are stored late, and may fire late.",
                periods=3,
            ),
            AlarmSpec(
                "postgres-connections-near-limit",
                aws.data.postgres.metric_database_connections(statistic="Maximum", period=PERIOD),
                self.config.postgres.max_connections * constants.POSTGRES_CONNECTIONS_ALARM_PERCENT // 100,
                f"{constants.POSTGRES_CONNECTIONS_ALARM_PERCENT}% of max_connections "
                f"({self.config.postgres.max_connections}): new connections will soon be refused; the "
                f"functions' budget is {self.config.postgres_connection_budget}: something else holds them.",
            ),
        ]
        return specs

    @staticmethod
    def offset_lag(aws: AwsResources) -> cw.Metric:
        return cw.Metric(namespace="AWS/Lambda", metric_name="OffsetLag", statistic="Maximum", period=PERIOD,
                         dimensions_map={"FunctionName": aws.functions.delay["enqueue"].function_name})

    def add_alarm(self, spec: AlarmSpec) -> cw.Alarm:
        """The alarm of ``spec``, notifying the topic: other constructs (the bus, the pending queue) add
        theirs here, so every alarm has the same name scheme, action and missing-data rule."""
        alarm = cw.Alarm(
            pool_scope(self, spec.pool) if spec.pool else self,
            spec.name,
            alarm_name=alarm_name(self, spec.name),
            alarm_description=spec.why,
            metric=spec.metric,
            threshold=spec.threshold,
            evaluation_periods=spec.periods,
            datapoints_to_alarm=spec.periods,
            comparison_operator=spec.comparison,
            treat_missing_data=spec.missing,
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
        self.alarms[spec.name] = alarm
        return alarm

    # -- dashboard ---------------------------------------------------------------------------------
    def _build_dashboard(self) -> cw.Dashboard:
        board = cw.Dashboard(
            self, "Dashboard", dashboard_name=dashboard_name(self), default_interval=Duration.hours(3)
        )
        widgets: list[cw.IWidget] = [
            cw.AlarmStatusWidget(alarms=list(self.alarms.values()), width=24, title="Switchyard alarms")
        ]
        for pool in self.config.pools:
            service = pool_service(pool.name)
            widgets += [
                cw.GraphWidget(
                    title=f"{pool.name}: queue depth (deepest group)",
                    width=8,
                    left=[self.queue_depth(pool)],
                    left_annotations=[
                        cw.HorizontalAnnotation(value=pool.queue_depth_threshold, label="max x target")
                    ],
                ),
                self._counts_widget(
                    f"{pool.name}: dead letters and poison",
                    service,
                    (
                        rpc_metrics.DEAD_LETTER_DEAD_LETTERS,
                        rpc_metrics.DEAD_LETTER_RESPONSES,
                        rpc_metrics.DEAD_LETTER_POISONED,
                        rpc_metrics.DEAD_LETTER_WITHOUT_REASON,
                        rpc_metrics.DEAD_LETTER_EXPIRED,
                        rpc_metrics.DEAD_LETTER_DELIVERY_LIMIT,
                        rpc_metrics.DEAD_LETTER_REJECTED,
                        rpc_metrics.DEAD_LETTER_MAXLEN,
                    ),
                ),
                self._counts_widget(
                    f"{pool.name}: orphans and worker groups",
                    service,
                    (
                        rpc_metrics.ORPHAN_FORWARDED,
                        rpc_metrics.ORPHAN_NEW_GROUPS,
                        rpc_metrics.ORPHAN_GROUP_START_FAILURES,
                        rpc_metrics.RECONCILE_GROUPS_STARTED,
                        rpc_metrics.RECONCILE_GROUPS_STOPPED,
                        rpc_metrics.RECONCILE_DRIVER_ERRORS,
                    ),
                ),
            ]
        if self.config.has(PART_DELAY):
            widgets += self._delay_widgets()
        if self.aws:
            widgets += self._aws_widgets(self.aws)
        for i in range(0, len(widgets), 3):
            board.add_widgets(*widgets[i : i + 3])
        return board

    def _delay_widgets(self) -> list[cw.IWidget]:
        widgets: list[cw.IWidget] = [
            cw.GraphWidget(
                title="Delay: fire lateness (ms)",
                width=8,
                left=[
                    self._emf(delay_metrics.DELAY_MAX_TIMER_LATENESS, DELAY_SERVICE, stat)
                    for stat in ("p50", "p99", "p99.9", "Maximum")
                ],
                left_annotations=[
                    cw.HorizontalAnnotation(value=self.config.delay.lateness_sla_ms, label="SLA")
                ],
            ),
            self._counts_widget(
                "Delay: flow",
                DELAY_SERVICE,
                (
                    delay_metrics.DELAY_MESSAGES_ENQUEUED,
                    delay_metrics.DELAY_MESSAGES_FIRED,
                    delay_metrics.DELAY_RECORDS_DROPPED,
                    delay_metrics.DELAY_SUSPECTED_FAILURES,
                    delay_metrics.DELAY_MESSAGES_OVERDUE,
                ),
            ),
        ]
        if not self.config.has(PART_RPC):
            return widgets
        return [*widgets,
            self._counts_widget(
                "Scheduled calls: relayed into the pools",
                SCHEDULED_SERVICE,
                (
                    rpc_metrics.SCHEDULED_PUBLISHED,
                    rpc_metrics.SCHEDULED_PARKED,
                    rpc_metrics.SCHEDULED_PUBLISH_FAILURES,
                ),
            ),
        ]

    def _counts_widget(self, title: str, service: str, names: tuple[str, ...]) -> cw.GraphWidget:
        """One third of a row: the sums of ``names`` (EMF counts of ``service``)."""
        return cw.GraphWidget(title=title, width=8, left=[self._emf(name, service) for name in names])

    def _aws_widgets(self, aws: AwsResources) -> list[cw.IWidget]:
        every = {
            **{f"{p}-{r}": fn for p, fns in aws.functions.pools.items() for r, fn in fns.all().items()},
            **{f"delay-{r}": fn for r, fn in aws.functions.delay.items()},
            **({"scheduled-relay": aws.functions.scheduled} if self.config.has(PART_DELAY, PART_RPC) else {}),
        }
        widgets: list[cw.IWidget] = [] if not every else [
            cw.GraphWidget(
                title="Lambda errors per function",
                width=12,
                left=[fn.metric_errors(period=PERIOD, label=n) for n, fn in every.items()],
            ),
            cw.GraphWidget(
                title="Lambda throttles per function",
                width=12,
                left=[fn.metric_throttles(period=PERIOD, label=n) for n, fn in every.items()],
            ),
        ]
        if self.config.has(PART_DELAY):
            widgets += [cw.GraphWidget(title="Delay: MSK offset lag", width=8, left=[self.offset_lag(aws)]),
            cw.GraphWidget(
                title="Postgres connections",
                width=8,
                left=[aws.data.postgres.metric_database_connections(statistic="Maximum", period=PERIOD)],
                left_annotations=[
                    cw.HorizontalAnnotation(
                        value=self.config.postgres.max_connections, label="max_connections"
                    )
                ],
            )]
        if self.config.redis_needed:
            widgets.append(cw.GraphWidget(title="ElastiCache memory %", width=8,
                                          left=[metric for _, metric in redis_memory(aws.data)]))
        if aws.workers is not None:
            widgets.append(cw.GraphWidget(
                title="ECS worker tasks running",
                width=8,
                left=[
                    cw.Metric(
                        namespace="ECS/ContainerInsights",
                        metric_name="RunningTaskCount",
                        statistic="Maximum",
                        period=PERIOD,
                        dimensions_map={"ClusterName": aws.workers.cluster.cluster_name},
                    )
                ],
            ))
        return widgets

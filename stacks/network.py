"""The VPC every Switchyard resource lives in."""

from __future__ import annotations

from collections.abc import Callable

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks import constants


def allow_from(group: ec2.ISecurityGroup, port: int, what: str, *clients: ec2.ISecurityGroup) -> None:
    """Admit ``port`` on ``group`` from each client group, and from nothing else."""
    for client in clients:
        group.add_ingress_rule(client, ec2.Port.tcp(port), f"{what} from {client.node.id}")


class NetworkConstruct(Construct):
    """A VPC over two AZs with public, private-with-egress and private-isolated subnets.

    - ``egress_subnets``: workloads that call AWS APIs or the internet through the one NAT
      gateway (Lambda functions, ECS tasks, and the Amazon MQ broker, whose Lambda event source
      mappings need to reach Lambda, STS and Secrets Manager from the broker's subnets).
    - ``isolated_subnets``: data stores that talk to nothing outside the VPC (RDS, ElastiCache, MSK).

    All traffic is recorded by VPC flow logs into a CloudWatch log group.

    Security groups, one per part; nothing admits traffic from outside the VPC:
    - ``functions`` (Lambda), ``workers`` (ECS tasks), ``emr`` (EMR Serverless jobs): clients, no
      ingress at all, outbound open (AWS APIs through the NAT gateway);
    - ``redis``, ``postgres``, ``msk``: each admits its one port from exactly the clients that use
      it (``allow_from``); the broker's group lives in ``BrokerConstruct``.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, nat_gateways: int = constants.VPC_NAT_GATEWAYS
    ) -> None:
        """``nat_gateways``: 1 is cheapest; one per AZ keeps egress when an AZ fails."""
        super().__init__(scope, construct_id)
        self.flow_log_group = self._build_flow_log_group()
        self.vpc = self._build_vpc(nat_gateways)
        self.flow_log = self._build_flow_log()
        # Free (no hourly or per-GB charge): S3 traffic (the pipeline's and the streams' buckets, ECR's
        # image layers) skips the NAT gateway's per-GB processing.
        self.s3_endpoint = self.vpc.add_gateway_endpoint(
            constants.S3_ENDPOINT_ID, service=ec2.GatewayVpcEndpointAwsService.S3)
        self.functions_sg = self._group(constants.FUNCTIONS_SG_ID,
                                        "Switchyard Lambda functions: clients only")
        self._lazy: dict[str, ec2.SecurityGroup] = {}
        self.sqs_endpoint: ec2.InterfaceVpcEndpoint | None = None  # made with the MSK group

    # The other groups are made when a chosen part first asks for them (switchyard:parts): a stack
    # without the delay scheduler has no Postgres or MSK group, and no SQS endpoint.
    def _once(self, construct_id: str, description: str,
              then: Callable[[ec2.SecurityGroup], None] | None = None) -> ec2.SecurityGroup:
        if construct_id not in self._lazy:
            self._lazy[construct_id] = group = self._group(construct_id, description)
            if then is not None:
                then(group)
        return self._lazy[construct_id]

    @property
    def api_sg(self) -> ec2.SecurityGroup:
        """The functions behind the public APIs run whatever an unauthenticated request makes them run
        until its token is checked: their group is admitted by Redis only (not RDS, MSK, the broker)."""
        return self._once(constants.API_SG_ID, "Switchyard public API functions: Redis clients only",
                          lambda group: allow_from(self.redis_sg, constants.REDIS_PORT, "Redis over TLS",
                                                   group))

    @property
    def workers_sg(self) -> ec2.SecurityGroup:
        return self._once(constants.WORKERS_SG_ID, "Switchyard ECS worker tasks: clients only")

    @property
    def emr_sg(self) -> ec2.SecurityGroup:
        """EMR's jobs reach MSK and the broker: AnalyticsConstruct admits it on both."""
        return self._once(constants.EMR_SG_ID, "EMR Serverless jobs: clients only")

    @property
    def redis_sg(self) -> ec2.SecurityGroup:
        return self._once(constants.REDIS_SG_ID, "ElastiCache: TLS Redis protocol from the control plane",
                          lambda group: allow_from(group, constants.REDIS_PORT, "Redis over TLS",
                                                   self.functions_sg))

    @property
    def postgres_sg(self) -> ec2.SecurityGroup:
        return self._once(constants.POSTGRES_SG_ID, "RDS Postgres: the delay store, from the functions",
                          lambda group: allow_from(group, constants.POSTGRES_PORT, "Postgres",
                                                   self.functions_sg))

    @property
    def msk_sg(self) -> ec2.SecurityGroup:
        """The MSK event source's pollers run in the cluster's subnets with the cluster's group."""
        def admit(group: ec2.SecurityGroup) -> None:
            allow_from(group, constants.MSK_IAM_PORT, "Kafka SASL/IAM", self.functions_sg, group)
            self.sqs_endpoint = self._build_sqs_endpoint(group)

        return self._once(constants.MSK_SG_ID, "MSK: SASL/IAM over TLS from the functions and EMR", admit)

    def _build_sqs_endpoint(self, msk_sg: ec2.SecurityGroup) -> ec2.InterfaceVpcEndpoint:
        """SQS from the cluster's (isolated) subnets: the MSK mappings' on-failure destination is an
        SQS queue, which AWS asks to be reachable through an endpoint in the cluster's VPC."""
        group = self._group(constants.SQS_ENDPOINT_SG_ID,
                            "SQS endpoint: the MSK mappings on-failure destination")
        allow_from(group, 443, "SQS over TLS", msk_sg)
        return self.vpc.add_interface_endpoint(
            constants.SQS_ENDPOINT_ID, service=ec2.InterfaceVpcEndpointAwsService.SQS,
            subnets=self.isolated_subnets,
            security_groups=[group], private_dns_enabled=True, open=False)  # admits only the cluster's group

    def _group(self, construct_id: str, description: str) -> ec2.SecurityGroup:
        return ec2.SecurityGroup(self, construct_id, vpc=self.vpc, description=description,
                                 allow_all_outbound=True)

    @property
    def cidr(self) -> str:
        """The VPC's IPv4 CIDR as a plain string (not a token)."""
        return constants.VPC_CIDR

    @property
    def egress_subnets(self) -> ec2.SubnetSelection:
        return ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)

    @property
    def isolated_subnets(self) -> ec2.SubnetSelection:
        return ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)

    def _build_flow_log_group(self) -> logs.LogGroup:
        return logs.LogGroup(
            self,
            constants.FLOW_LOG_GROUP_ID,
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )

    def _build_vpc(self, nat_gateways: int) -> ec2.Vpc:
        return ec2.Vpc(
            self,
            constants.VPC_ID,
            ip_addresses=ec2.IpAddresses.cidr(constants.VPC_CIDR),
            max_azs=constants.VPC_MAX_AZS,
            nat_gateways=nat_gateways,
            restrict_default_security_group=True,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name=constants.PUBLIC_SUBNET_NAME, subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24
                ),
                ec2.SubnetConfiguration(
                    name=constants.EGRESS_SUBNET_NAME, subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=22
                ),
                ec2.SubnetConfiguration(
                    name=constants.ISOLATED_SUBNET_NAME, subnet_type=ec2.SubnetType.PRIVATE_ISOLATED,
                    cidr_mask=24
                ),
            ],
        )

    def _build_flow_log(self) -> ec2.FlowLog:
        return self.vpc.add_flow_log(
            constants.FLOW_LOG_ID,
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )

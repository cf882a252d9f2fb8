"""The Switchyard stack: constructs composed in dependency order."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from stacks import constants as c
from stacks.broker import BrokerConstruct
from stacks.network import NetworkConstruct


class SwitchyardStack(Stack):
    """Network first, then the broker; later: ElastiCache, RDS, MSK, Lambda functions, ECS."""

    def __init__(self, scope: Construct, construct_id: str = c.STACK_ID, **kwargs: Any) -> None:
        kwargs.setdefault("description", c.STACK_DESCRIPTION)
        super().__init__(scope, construct_id, **kwargs)
        self.network = self._build_network()
        self.broker = self._build_broker()
        self._build_outputs()

    def _build_network(self) -> NetworkConstruct:
        return NetworkConstruct(self, c.NETWORK_CONSTRUCT_ID)

    def _build_broker(self) -> BrokerConstruct:
        return BrokerConstruct(
            self,
            c.BROKER_CONSTRUCT_ID,
            vpc=self.network.vpc,
            vpc_cidr=self.network.cidr,
            subnets=self.network.egress_subnets,
        )

    def _build_outputs(self) -> None:
        CfnOutput(self, "BrokerArn", value=self.broker.broker.attr_arn)
        CfnOutput(self, "BrokerSecretArn", value=self.broker.secret.secret_arn)
        CfnOutput(self, "VpcId", value=self.network.vpc.vpc_id)

"""Construct ids, resource names and context keys of the CDK app, defined once."""

from __future__ import annotations

import string

# Stack
STACK_ID = "SwitchyardStack"
STACK_DESCRIPTION = "Switchyard: keyed RPC, delay scheduler, pending queue and event bus"

# Constructs (ids are part of logical ids: changing one replaces the resources under it)
NETWORK_CONSTRUCT_ID = "Network"
BROKER_CONSTRUCT_ID = "Broker"

# NetworkConstruct children
VPC_ID = "Vpc"
FLOW_LOG_ID = "FlowLog"
FLOW_LOG_GROUP_ID = "FlowLogGroup"
PUBLIC_SUBNET_NAME = "public"
EGRESS_SUBNET_NAME = "private-egress"
ISOLATED_SUBNET_NAME = "private-isolated"
VPC_CIDR = "10.40.0.0/16"  # a literal, so security group rules (and cdk-nag) can see it
VPC_MAX_AZS = 2
VPC_NAT_GATEWAYS = 1

# BrokerConstruct children
BROKER_ID = "RabbitMqBroker"
BROKER_SECURITY_GROUP_ID = "BrokerSecurityGroup"
BROKER_SECRET_ID = "BrokerAdminSecret"
BROKER_NAME = "switchyard-rabbitmq"
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
DEFAULT_BROKER_ENGINE_VERSION = "3.13"  # quorum queues; "4.2" needs an mq.m7g instance type
DEFAULT_BROKER_INSTANCE_TYPE = "mq.m7g.large"  # supports both 3.13 and 4.2
DEFAULT_BROKER_DEPLOYMENT_MODE = "SINGLE_INSTANCE"
BROKER_DEPLOYMENT_MODES = ("SINGLE_INSTANCE", "CLUSTER_MULTI_AZ")

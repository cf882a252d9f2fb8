"""Kafka client authentication for MSK: IAM (SASL/OAUTHBEARER) signed with the process's AWS role.

``SWITCHYARD_KAFKA_AUTH``: ``none`` (default: plaintext, the local tansu) or ``aws-msk-iam`` (the
deployment: MSK accepts only IAM-authenticated TLS clients, and the Lambda MSK event source uses
the same). Merge ``kafka_security_config()`` into every confluent-kafka client configuration.
"""

from __future__ import annotations

import os
from typing import Any

from switchyard.core.config import KAFKA_AUTH
from switchyard.core.errors import ConfigError

KAFKA_AUTH_IAM = "aws-msk-iam"


def kafka_security_config() -> dict[str, Any]:
    """librdkafka settings for ``SWITCHYARD_KAFKA_AUTH``: ``aws-msk-iam`` (MSK, SASL/OAUTHBEARER
    signed with the process's IAM role) or empty/``none`` (plaintext, the local tansu)."""
    auth = KAFKA_AUTH.read()
    if auth == "none":
        return {}
    if auth != KAFKA_AUTH_IAM:
        raise ConfigError(f"{KAFKA_AUTH.name} must be none or {KAFKA_AUTH_IAM}, got {auth!r}")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ConfigError("MSK IAM authentication needs AWS_REGION")

    def oauth_cb(_config: str) -> tuple[str, float]:
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

        token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)
        return token, expiry_ms / 1000

    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb}

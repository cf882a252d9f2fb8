"""Generated secrets: one JSON key holding a random alphanumeric value (keys, tokens, AUTH passwords)."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct


def generated_secret(
    scope: Construct,
    construct_id: str,
    *,
    description: str,
    key: str,
    length: int,
    include_space: bool | None = False,
) -> secretsmanager.Secret:
    """A secret ``{key: <length random letters and digits>}``, deleted with the stack.

    ``include_space=None`` leaves ``IncludeSpace`` out of the template (Secrets Manager's default is
    no space): a deployed secret keeps the generator it was made with, since CloudFormation generates
    a new value when ``GenerateSecretString`` changes (the pending tokens' secret holds tokens added
    by hand).
    """
    return secretsmanager.Secret(
        scope,
        construct_id,
        description=description,
        generate_secret_string=secretsmanager.SecretStringGenerator(
            secret_string_template="{}",
            generate_string_key=key,
            exclude_punctuation=True,
            include_space=include_space,
            password_length=length,
        ),
        removal_policy=RemovalPolicy.DESTROY,
    )

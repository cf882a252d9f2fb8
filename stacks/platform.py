"""The one platform every piece of code runs on: the Lambda runtime and architecture, the layer's
wheels (layers/build.sh reads the same constants), the worker image's Python and the Fargate tasks'
CPU. Choosing it in one place keeps them in agreement (tests/stacks/test_platform.py checks the
template, the asset manifest, the Dockerfile and the built layer against it).

x86_64, not Graviton: the layer's import check runs the handlers from the layer on the build machine,
which is x86_64 here and in CI, and the worker image builds there without emulation. Graviton is about
20% cheaper per second of Lambda and Fargate compute, a few dollars a month in the minimal deployment
(docs/deployment.md, "Runtime and platform"); switching is CPU_ARCHITECTURE = "arm64" once builds run on ARM.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_lambda as lambda_

from stacks import constants
from stacks.base_image import BUILD_ARG

REPO_ROOT = Path(__file__).resolve().parent.parent
_ARCHITECTURES = {
    "x86_64": (lambda_.Architecture.X86_64, ecs.CpuArchitecture.X86_64, ecr_assets.Platform.LINUX_AMD64),
    "arm64": (lambda_.Architecture.ARM_64, ecs.CpuArchitecture.ARM64, ecr_assets.Platform.LINUX_ARM64),
}


def lambda_runtime() -> lambda_.Runtime:
    """``python{PYTHON_VERSION}``, CDK's own Runtime object (what cdk-nag compares with the latest)."""
    return getattr(lambda_.Runtime, "PYTHON_" + constants.PYTHON_VERSION.replace(".", "_"))


def lambda_architecture() -> lambda_.Architecture:
    return _ARCHITECTURES[constants.CPU_ARCHITECTURE][0]


def fargate_platform() -> ecs.RuntimePlatform:
    return ecs.RuntimePlatform(
        cpu_architecture=_ARCHITECTURES[constants.CPU_ARCHITECTURE][1],
        operating_system_family=ecs.OperatingSystemFamily.LINUX,
    )


def worker_image() -> ecs.ContainerImage:
    """The repository's Dockerfile built for the tasks' CPU and Python (one asset: same inputs, one hash)."""
    return ecs.ContainerImage.from_asset(
        str(REPO_ROOT),
        file="Dockerfile",
        platform=_ARCHITECTURES[constants.CPU_ARCHITECTURE][2],
        build_args={"PYTHON_VERSION": constants.PYTHON_VERSION},
    )


def pool_image(directory: Path, base_image: str) -> ecs.ContainerImage:
    """A pool's own image: ``directory``'s Dockerfile built FROM ``base_image`` (its SWITCHYARD_IMAGE
    build arg, part of the asset hash: a new base rebuilds it) for the tasks' CPU."""
    return ecs.ContainerImage.from_asset(
        str(directory),
        platform=_ARCHITECTURES[constants.CPU_ARCHITECTURE][2],
        build_args={BUILD_ARG: base_image},
    )

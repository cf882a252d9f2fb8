"""One platform for all code (stacks/platform.py): the functions' runtime and CPU, the layer's, the
Fargate tasks' CPU, the Docker assets' build platform and Python, and the Dockerfile's default agree;
the runtime is one Lambda still supports. The layer's wheels and bytecode: tests/stacks/test_layer.py."""

from __future__ import annotations

import json
import re
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from stacks import constants
from tests.stacks.conftest import ROOT
from tests.stacks.test_switchyard_stack import Resources, of_type, switchyard_functions

pytestmark = pytest.mark.slow

# AWS Lambda's runtime table ("Lambda runtimes", Supported runtimes): the date each Python runtime is
# deprecated (no more patches; then function creation and updates are blocked).
LAMBDA_PYTHON_DEPRECATION = {"3.11": date(2026, 6, 30), "3.12": date(2028, 10, 31), "3.13": date(2029, 6, 30)}
DOCKER_PLATFORM = {"x86_64": "linux/amd64", "arm64": "linux/arm64"}
ECS_CPU = {"x86_64": "X86_64", "arm64": "ARM64"}


def test_every_function_and_the_layer_run_the_one_runtime_and_cpu(resources: Resources) -> None:
    runtime = f"python{constants.PYTHON_VERSION}"
    for module, functions in switchyard_functions(resources).items():
        for fn in functions.values():
            assert fn["Properties"]["Runtime"] == runtime, module
            assert fn["Properties"]["Architectures"] == [constants.CPU_ARCHITECTURE], module
    ((_, layer),) = of_type(resources, "AWS::Lambda::LayerVersion").items()
    assert layer["Properties"]["CompatibleRuntimes"] == [runtime]
    assert layer["Properties"]["CompatibleArchitectures"] == [constants.CPU_ARCHITECTURE]


def test_every_task_definition_runs_on_that_cpu(resources: Resources) -> None:
    tasks = of_type(resources, "AWS::ECS::TaskDefinition")
    assert tasks
    for name, task in tasks.items():
        assert task["Properties"]["RuntimePlatform"] == {
            "CpuArchitecture": ECS_CPU[constants.CPU_ARCHITECTURE], "OperatingSystemFamily": "LINUX"}, name


def test_every_docker_asset_is_built_for_that_cpu_and_python(synthesized: tuple[Template, Path, Any]) -> None:
    """What `cdk deploy` builds and pushes (the assets manifest), not only what the template names."""
    _, outdir, stack = synthesized
    manifest = json.loads((outdir / f"{stack.artifact_id}.assets.json").read_text())
    images = manifest.get("dockerImages", {})
    assert images, "the worker image is a Docker asset"
    for asset in images.values():
        assert asset["source"]["platform"] == DOCKER_PLATFORM[constants.CPU_ARCHITECTURE]
        assert asset["source"]["dockerBuildArgs"] == {"PYTHON_VERSION": constants.PYTHON_VERSION}


def test_the_dockerfile_defaults_to_the_same_python() -> None:
    """A plain `docker build .` (a pool's own image FROM this one) gets the runtime's Python too."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^ARG PYTHON_VERSION={re.escape(constants.PYTHON_VERSION)}$", dockerfile, re.M)
    assert "FROM python:${PYTHON_VERSION}-slim" in dockerfile


def test_the_runtime_is_one_lambda_still_supports() -> None:
    assert date.today() < LAMBDA_PYTHON_DEPRECATION[constants.PYTHON_VERSION], (
        f"python{constants.PYTHON_VERSION} is deprecated on Lambda: move PYTHON_VERSION "
        "(stacks/constants.py)")

"""One synthesis per app the stack tests share, per test session (a synth takes seconds on 2 cores):
the default app, the cluster forms', the ``localstack`` target's, production beside staging, and each
variant of ``switchyard:parts`` and ``switchyard:size`` (``VARIANTS``, synthesized when first asked)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import Stack
from aws_cdk.assertions import Template

from scripts.costs import VARIANTS
from stacks import constants
from stacks.application import build_app, stacks_of
from tests.stacks.nested import template_of

ROOT = Path(__file__).resolve().parents[2]
TWO_STACKS = ("SwitchyardProduction", "SwitchyardStaging")


@pytest.fixture(scope="session")
def layer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A stand-in layer directory: synthesis only stages and hashes the layer, and staging the real
    ~80 MB one into every test's cloud assembly would cost seconds per synth. The real layer is
    checked by tests/stacks/test_layer.py and synthesized by the CLI in ./dev test."""
    stub = tmp_path_factory.mktemp("layer")
    (stub / "python").mkdir()
    (stub / "python" / "README").write_text("stand-in layer for synthesis tests\n")
    return str(stub)


def synth(layer_dir: str, outdir: Path, **context: Any) -> tuple[Template, Path, Any]:
    """Synthesize with cdk.json's context plus ``context``; fails if cdk-nag finds anything. The
    template is the stack's with its pools' nested templates folded in (tests/stacks/nested.py)."""
    app, stack = build_app(context={constants.CTX_LAYER_DIR: layer_dir, **context}, outdir=str(outdir))
    app.synth()
    return template_of(stack), outdir, stack


@pytest.fixture(scope="session")
def synthesized(layer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Template, Path, Any]:
    return synth(layer_dir, tmp_path_factory.mktemp("cdk.out"))


@pytest.fixture(scope="session")
def template(synthesized: tuple[Template, Path, Any]) -> Template:
    return synthesized[0]


# The stacks a user may choose (issue 37): each part alone at the dev size, the parts that depend on
# each other (scheduled calls: rpc and delay; spark needs both), and all five at each size; the same
# choices docs/deployment.md prices (scripts/costs.py).
DEFAULT = "default"  # cdk.json's context alone: the ``synthesized`` app


@pytest.fixture(scope="session")
def variants(layer_dir: str, tmp_path_factory: pytest.TempPathFactory,
             synthesized: tuple[Template, Path, Any]) -> Callable[[str], tuple[Template, Path, Any]]:
    """A variant's synthesis by name (``VARIANTS`` or ``DEFAULT``), each made once per session."""
    made = {DEFAULT: synthesized}

    def get(name: str) -> tuple[Template, Path, Any]:
        if name not in made:
            made[name] = synth(layer_dir, tmp_path_factory.mktemp(f"cdk.out.{name}"), **VARIANTS[name])
        return made[name]

    return get


@pytest.fixture(scope="module")
def variant(request: pytest.FixtureRequest) -> str:
    """The variant a test runs on: ``DEFAULT`` unless ``on_variants`` parametrizes it."""
    return str(getattr(request, "param", DEFAULT))


def on_variants(*names: str) -> pytest.MarkDecorator:
    """Run a test (or, as ``pytestmark``, a module) on each named variant's ``resources``; one module
    fixture per variant, so a module's own module fixtures (a deployment) are made once each."""
    return pytest.mark.parametrize("variant", names, indirect=True, scope="module")


@pytest.fixture(scope="module")
def resources(variant: str,
              variants: Callable[[str], tuple[Template, Path, Any]]) -> dict[str, dict[str, Any]]:
    return variants(variant)[0].to_json()["Resources"]


# The cluster forms of the broker and of ElastiCache in one app (docs/deployment.md, "Cluster forms"),
# on RabbitMQ 3.13, the other engine the stack offers.
CLUSTER_FORMS = {constants.CTX_BROKER_ENGINE_VERSION: "3.13",
                 constants.CTX_BROKER_DEPLOYMENT_MODE: "CLUSTER_MULTI_AZ",
                 constants.CTX_REDIS: {"clusterMode": True, "shards": 2, "replicas": 1}}


@pytest.fixture(scope="session")
def cluster_forms(layer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Template, Path, Any]:
    return synth(layer_dir, tmp_path_factory.mktemp("cdk.out.cluster"), **CLUSTER_FORMS)


@pytest.fixture(scope="session")
def local(layer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Template, Path, Any]:
    """The ``localstack`` target's app."""
    return synth(layer_dir, tmp_path_factory.mktemp("cdk.out.local"),
                 **{constants.CTX_TARGET: constants.TARGET_LOCALSTACK})


@pytest.fixture(scope="session")
def two_stacks(layer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> list[Stack]:
    """Production and staging in one app (``switchyard:stacks``), synthesized with cdk-nag."""
    app, first = build_app(context={constants.CTX_LAYER_DIR: layer_dir,
                                    constants.CTX_STACKS: json.dumps(TWO_STACKS)},
                           outdir=str(tmp_path_factory.mktemp("cdk.out")))
    app.synth()
    stacks = stacks_of(app)
    assert [s.stack_name for s in stacks] == list(TWO_STACKS) and stacks[0] is first
    return stacks

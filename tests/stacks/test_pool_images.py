"""A pool's own image (examples/pricing): the example's cdk-context.json, as written, synthesizes a
pool whose workers run an image built from the example's directory FROM Switchyard's worker image,
beside the default pool that still builds from the root Dockerfile; a wrong image directory fails
synth with a line naming the pool and what to write."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from stacks import constants
from stacks.base_image import BUILD_ARG, base_inputs, build_command, local_tag
from stacks.config import ConfigError, DeploymentConfig, ImageDirectory
from tests.stacks.conftest import ROOT, synth
from tests.stacks.test_switchyard_stack import of_type

EXAMPLE = ROOT / "examples" / "pricing"
EXAMPLE_CONTEXT = json.loads((EXAMPLE / "cdk-context.json").read_text())


@pytest.fixture(scope="module")
def example_synth(layer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Template, Path, Any]:
    return synth(layer_dir, tmp_path_factory.mktemp("cdk.out"), **EXAMPLE_CONTEXT)


def worker_images(example_synth: tuple[Template, Path, Any]) -> dict[str, tuple[dict[str, Any], Path]]:
    """Per pool: its worker container and the Docker asset (manifest entry, staged directory) it runs."""
    template, outdir, stack = example_synth
    manifest = json.loads((outdir / f"{stack.artifact_id}.assets.json").read_text())["dockerImages"]
    found = {}
    for pool in EXAMPLE_CONTEXT[constants.CTX_POOLS]:
        (task,) = [t for t in of_type(template.to_json()["Resources"], "AWS::ECS::TaskDefinition").values()
                   if t["Properties"]["Family"].endswith(f"{constants.WORKER_FAMILY_SUFFIX}{pool['name']}")]
        (container,) = task["Properties"]["ContainerDefinitions"]
        asset_hash = container["Image"]["Fn::Sub"].rsplit(":", 1)[1]
        found[pool["name"]] = (container, manifest[asset_hash])
    return found


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_the_examples_pool_runs_its_handler_in_an_image_built_from_the_example(example_synth) -> None:
    _, outdir, _ = example_synth
    container, asset = worker_images(example_synth)["pricing"]
    assert container["Command"] == ["worker", "--handler", "pricing:quote"]
    assert asset["source"]["dockerBuildArgs"] == {BUILD_ARG: local_tag()}
    assert asset["source"].get("dockerFile", "Dockerfile") == "Dockerfile"
    staged = files_of(outdir / asset["source"]["directory"])
    # What the example's .dockerignore lets through, byte for byte: the handler, not the README.
    assert staged == {name: (EXAMPLE / name).read_bytes()
                      for name in (".dockerignore", "Dockerfile", "requirements.txt", "pricing.py")}


@pytest.mark.slow
def test_the_default_pool_still_builds_from_the_root_dockerfile(example_synth) -> None:
    _, outdir, _ = example_synth
    container, asset = worker_images(example_synth)["core"]
    assert container["Command"] == ["worker", "--handler", "switchyard.rpc.examples:describe"]
    assert asset["source"]["dockerFile"] == "Dockerfile"
    assert asset["source"]["dockerBuildArgs"] == {"PYTHON_VERSION": constants.PYTHON_VERSION}
    staged = outdir / asset["source"]["directory"]
    assert (staged / "Dockerfile").read_bytes() == (ROOT / "Dockerfile").read_bytes()
    assert (staged / "switchyard" / "rpc" / "worker" / "runtime.py").is_file()
    # ./dev deploy builds the same Dockerfile as the base, for the same platform and Python.
    command = build_command()
    assert command[command.index("--platform") + 1] == asset["source"]["platform"]
    assert command[command.index("--build-arg") + 1] == f"PYTHON_VERSION={constants.PYTHON_VERSION}"
    assert command[-1] == str(ROOT)


def test_the_base_tag_is_named_by_what_the_root_dockerfile_builds_from(tmp_path: Path) -> None:
    """A change in the base's inputs changes the tag, hence the pools' build arg and asset hash (so
    their images are rebuilt on the new base); a file outside the base's context changes nothing."""
    for name in (".dockerignore", "Dockerfile", "requirements.txt", "constraints.txt", "pyproject.toml",
                 "README.md"):
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "switchyard", tmp_path / "switchyard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert [p.relative_to(tmp_path).as_posix() for p in base_inputs(tmp_path)][:2] == [
        "Dockerfile", "README.md"]
    before = local_tag(tmp_path)
    assert before.startswith("switchyard-worker:")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "note.txt").write_text("not in the base image")
    (tmp_path / "switchyard" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "switchyard" / "__pycache__" / "x.pyc").write_bytes(b"bytecode")
    assert local_tag(tmp_path) == before
    (tmp_path / "switchyard" / "rpc" / "worker" / "runtime.py").write_text("# changed\n", "utf-8")
    assert local_tag(tmp_path) != before


def config(**context: Any) -> DeploymentConfig:
    return DeploymentConfig.from_context(Stack(App(context=context)))


def test_the_base_image_is_the_local_build_unless_the_context_names_one() -> None:
    assert config().base_image_ref == local_tag()
    published = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/switchyard-worker:1.4.0"
    assert config(**{constants.CTX_BASE_IMAGE: published}).base_image_ref == published


def test_an_image_directory_is_kept_relative_to_the_project() -> None:
    (pool,) = config(
        **{constants.CTX_POOLS: [{"name": "p", "image": {"directory": "examples/pricing/"}}]}).pools
    assert pool.image == ImageDirectory("examples/pricing")


def pool_with_image(image: Any) -> dict[str, Any]:
    return {constants.CTX_POOLS: [{"name": "p", "handler": "m:f", "image": image}]}


@pytest.mark.parametrize(("image", "message"), [
    ({"directory": "examples/nope"}, "image directory 'examples/nope' does not exist"),
    ({"directory": "../outside"}, "image directory '../outside' is outside the project"),
    ({"directory": "/tmp"}, "image directory '/tmp' is outside the project"),
    ({"directory": "docs"}, "image directory 'docs' has no Dockerfile"),
    ({"directory": "."}, "Dockerfile must start from Switchyard's worker image: 'ARG SWITCHYARD_IMAGE'"),
    ({"dir": "examples/pricing"}, 'image must be "" .*, an image URI or {"directory"'),
    ({"directory": ""}, 'image must be "" '),
    (42, 'image must be "", an image URI or {"directory": ...}, got 42'),
])
def test_a_wrong_image_fails_synth_naming_the_pool(image: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"switchyard:pools\['p'\]: {message}"):
        config(**pool_with_image(image))


def test_the_walk_through_shows_the_context_file_as_it_is() -> None:
    """The README's snippet is the tested file's content, so the two cannot drift apart."""
    (snippet,) = re.findall(r"```json\n(.*?)```", (EXAMPLE / "README.md").read_text(), re.S)
    assert json.loads("{" + snippet + "}") == EXAMPLE_CONTEXT

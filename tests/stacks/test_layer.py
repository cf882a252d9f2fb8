"""The Lambda layer as layers/build.sh builds it: within Lambda's size limit, bytecode shipped, and
every handler importable from it alone in a clean interpreter (``python -I -S``), as Lambda would.

Import times are printed by ``bench/layer_imports.py`` (the aim is 300 ms each on an idle machine);
here only success counts, since a shared 2-core CI machine measures seconds, not Lambda's numbers.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import layer_imports
from stacks import constants
from tests.stacks.conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built_layer() -> Path:
    """Build (or find up to date: the script skips when its inputs are unchanged) the layer."""
    done = subprocess.run(
        ["bash", str(ROOT / "layers/build.sh")], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MB unzipped" in done.stdout
    return layer_imports.LAYER / "python"


def test_layer_is_within_lambdas_unzipped_limit(built_layer: Path) -> None:
    total = layer_imports.size_mb(built_layer.parent) + layer_imports.size_mb(layer_imports.FUNCTIONS)
    assert total < layer_imports.LAMBDA_UNZIPPED_LIMIT_MB


def test_layer_ships_the_package_its_pins_and_bytecode(built_layer: Path) -> None:
    assert (built_layer / "switchyard" / "rpc" / "drivers" / "ecs.py").is_file()
    assert (built_layer / "switchyard" / "core" / "certs" / "rds-global-bundle.pem").is_file()
    abi = "cpython-" + constants.PYTHON_VERSION.replace(".", "")  # the Lambda runtime's bytecode
    assert list((built_layer / "switchyard" / "__pycache__").glob(f"__init__.{abi}.pyc"))
    shipped = {p.name.split("-")[0].lower() for p in built_layer.glob("*.dist-info")}
    for pinned in (ROOT / "requirements.txt").read_text().splitlines():
        if pinned and not pinned.startswith("#"):
            name = pinned.split("==")[0].split("[")[0].lower().replace("-", "_")
            assert name in shipped, f"{name} pinned in requirements.txt but missing from the layer"


@pytest.mark.parametrize("module", sorted(layer_imports.handlers()))
def test_every_handler_imports_from_the_layer_alone(built_layer: Path, module: str) -> None:
    result = layer_imports.time_import(module, layer_imports.handlers()[module], runs=1)
    assert result.error == "", result.error
    print(f"{module}: import {result.best_ms:.0f} ms")


def test_the_layers_compiled_code_is_for_the_runtimes_python_and_cpu(built_layer: Path) -> None:
    """Every C extension in the layer is built for the Lambda runtime's CPython and CPU (stacks/platform.py):
    a wheel for another interpreter or architecture imports nowhere but fails only in Lambda."""
    arch = {"x86_64": "x86_64", "arm64": "aarch64"}[constants.CPU_ARCHITECTURE]
    abi = "cpython-" + constants.PYTHON_VERSION.replace(".", "")
    extensions = [p for p in built_layer.rglob("*.so") if ".cpython-" in p.name]
    assert extensions, "no C extension found (psycopg_binary, pydantic_core, hiredis ship some)"
    wrong = [p.name for p in extensions if f".{abi}-{arch}-linux-gnu.so" not in p.name]
    assert not wrong, wrong

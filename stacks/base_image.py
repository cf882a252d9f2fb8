"""Switchyard's worker image as the base of a pool's own image (``FROM ${SWITCHYARD_IMAGE}``).

A pool whose ``image`` is a directory is built by ``cdk deploy`` as a Docker asset with the build arg
``SWITCHYARD_IMAGE``: the ``switchyard:baseImage`` context when set (the base published to your own
registry, for CI), else the local tag ``switchyard-worker:<inputs hash>`` that ``./dev deploy`` builds
first. The tag is named by what the root Dockerfile builds from (the files its .dockerignore lets
through, the Python and CPU), so a change to Switchyard changes the build arg, hence the pool's asset
hash, and ``cdk deploy`` rebuilds the pool's image on the new base instead of keeping the old one.

No CDK import: ``./dev deploy`` runs ``python -m stacks.base_image`` for the tag before the venv has
synthesized anything.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from stacks import constants

REPO_ROOT = Path(__file__).resolve().parent.parent
LOCAL_REPOSITORY = "switchyard-worker"
BUILD_ARG = "SWITCHYARD_IMAGE"  # what a pool's Dockerfile declares: ARG SWITCHYARD_IMAGE, FROM ${...}
# Docker's name of each CPU_ARCHITECTURE (stacks/platform.py builds the assets for the same one).
DOCKER_PLATFORMS = {"x86_64": "linux/amd64", "arm64": "linux/arm64"}


def base_inputs(root: Path = REPO_ROOT) -> list[Path]:
    """The files the root Dockerfile's build context holds: the ``!`` entries of its .dockerignore
    (which ignores everything else), bytecode left out."""
    allowed = [line[1:].strip().rstrip("/") for line in (root / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    files: list[Path] = []
    for entry in allowed:
        path = root / entry
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        files += [f for f in candidates
                  if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"]
    return sorted(files)


def local_tag(root: Path = REPO_ROOT) -> str:
    """``switchyard-worker:<12 hex digits>``: the tag ``./dev deploy`` builds the root Dockerfile as."""
    digest = hashlib.sha256(f"{constants.PYTHON_VERSION} {constants.CPU_ARCHITECTURE}\n".encode())
    for path in base_inputs(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return f"{LOCAL_REPOSITORY}:{digest.hexdigest()[:12]}"


def build_command(root: Path = REPO_ROOT) -> list[str]:
    """The ``docker build`` of the base, as the CDK builds the default pools' asset (platform, Python)."""
    return ["docker", "build", "--platform", DOCKER_PLATFORMS[constants.CPU_ARCHITECTURE],
            "--build-arg", f"PYTHON_VERSION={constants.PYTHON_VERSION}", "--tag", local_tag(root), str(root)]


if __name__ == "__main__":
    # ./dev deploy: the tag, or with --build-command the command that builds it, one argument a line.
    print("\n".join(build_command() if sys.argv[1:] == ["--build-command"] else [local_tag()]))

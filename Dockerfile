# Switchyard worker image: the project and its pinned runtime dependencies, running `switchyard worker`.
# Built by `cdk deploy` (stacks/workers.py) for every pool that names no image of its own; a pool
# whose handler lives in your own code uses an image built FROM this one (examples/pricing;
# docs/deployment.md, "Deploying your own handler"), and `./dev deploy` builds it as that base.
# PYTHON_VERSION: stacks/constants.py's, passed by the CDK asset (the default is the same value).
ARG PYTHON_VERSION=3.13
FROM python:${PYTHON_VERSION}-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY requirements.txt constraints.txt ./
RUN pip install --no-input -r requirements.txt -c constraints.txt
COPY pyproject.toml README.md ./
COPY switchyard ./switchyard
RUN pip install --no-input --no-deps . && useradd --system --uid 10001 switchyard
USER switchyard

# ECS stops a task with SIGTERM (the worker finishes its request in hand), then SIGKILL after the
# container's stopTimeout. The worker protocol's variables (WORKER_POOL, WORKER_KEY, ...) come
# from the task definition and the driver's RunTask overrides.
STOPSIGNAL SIGTERM
ENTRYPOINT ["switchyard"]
CMD ["worker", "--handler", "switchyard.rpc.examples:describe"]

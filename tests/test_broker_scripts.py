"""The single 4.0 broker and the 3-node cluster run from one chroot: the 4.0 script's stop, restart and
SIGKILL (the fault suite's) must reach its own node only, never a cluster node beside it (the clusters
run goes on meanwhile: `./dev test` runs both lanes at once)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT
from tests.rpc import cluster


def _listener(port: int) -> int | None:
    """The pid listening on 127.0.0.1:``port`` (from /proc: the socket's inode, then its owner)."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        for row in table.readlines()[1:]:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.split(":")[1], 16) == port:
                inodes.add(inode)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return int(pid)
    return None


def _node_pid() -> str:
    done = subprocess.run(["bash", "-c", f"source {ROOT}/scripts/rabbitmq4.sh >/dev/null 2>&1; node_pid"],
                          capture_output=True, text=True, timeout=30)
    return done.stdout.strip()


def test_the_single_brokers_script_finds_its_own_node_beside_the_cluster() -> None:
    if os.geteuid() != 0:
        pytest.skip("the chroot's brokers run as root")
    port = int(os.environ.get("SWITCHYARD_RABBITMQ4_PORT", "5673"))
    single = _listener(port)
    nodes = {_listener(cluster.base_port() + n - 1) for n in cluster.NODES} - {None}
    if single is None or not nodes:
        pytest.skip("needs the 4.0 broker and the cluster running (./dev test starts both)")
    if single < max(nodes):  # the case that once went wrong: the 4.0 node started after the cluster's
        subprocess.run([str(ROOT / "scripts/rabbitmq4.sh"), "restart"], check=True, capture_output=True,
                       timeout=180)
        single = _listener(port)
        assert single is not None, nodes  # (not "a larger pid": pids wrap, as the final trial's did)
    assert _node_pid() == str(single), (single, nodes)

"""A Redis Cluster of our own (the fault suite kills its masters; the cluster benchmark counts its
CPU): ``masters`` redis-server processes, each with ``replicas`` replicas, on free loopback ports
in a directory of its own, without persistence, like ``scripts/services.sh``'s shared cluster
(whose nodes other runs use, so never this one's faults)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.cluster import ClusterNode, RedisCluster

from tests.conftest import wait_for

# A killed master's replica takes over after this (scripts/services.sh's figure: seconds, in tests).
NODE_TIMEOUT_MS = 2000
# Node ports are drawn here: a node's cluster bus listens on its port + 10000, below 65536 and
# outside the kernel's ephemeral range (32768-60999), where a client socket could take it.
PORT_RANGE = (20000, 22767)


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_ports(count: int) -> list[int]:
    """``count`` ports that are free, each with its cluster bus port (+10000) free too."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(*PORT_RANGE)
        if port not in ports and _free(port) and _free(port + 10000):
            ports.append(port)
    return ports


class PrivateRedisCluster:
    """Start, SIGKILL a node, start it again (its nodes.conf kept: it rejoins as a replica), stop."""

    def __init__(self, workdir: Path, masters: int = 3, replicas: int = 1) -> None:
        self.workdir = workdir
        self.replicas = replicas
        self.ports = free_cluster_ports(masters * (1 + replicas))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.binary = shutil.which("redis-server") or "redis-server"

    @property
    def url(self) -> str:
        """The node clients are pointed at (the first; the scenarios never kill it)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def command(self, port: int) -> list[str]:
        node_dir = self.workdir / str(port)
        return [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--dir", str(node_dir),
                "--logfile", str(node_dir / "redis.log"), "--maxclients", "10000"]

    def start_node(self, port: int) -> None:
        (self.workdir / str(port)).mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(self.command(port), stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
        wait_for(lambda: self._answers(port), timeout=15, interval=0.05, what=f"redis-server on {port}")

    def start(self) -> PrivateRedisCluster:
        for port in self.ports:
            self.start_node(port)
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        wait_for(self.healthy, timeout=60, interval=0.1, what="the private cluster's state ok")
        return self

    def _answers(self, port: int) -> bool:
        with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as client:
            return bool(client.ping())
        return False

    def healthy(self) -> bool:
        """Every node sees every slot served, knows every node, and each master has its replicas online."""
        try:
            for port in self.ports:
                with redis.Redis(port=port, socket_timeout=1) as client:
                    info = client.cluster("info")
                    replication = client.info("replication")
                if info["cluster_state"] != "ok" or int(info["cluster_known_nodes"]) != len(self.ports):
                    return False
                if replication["role"] == "master" and int(replication["connected_slaves"]) < self.replicas:
                    return False
                if replication["role"] == "slave" and replication["master_link_status"] != "up":
                    return False
            return True
        except (redis.RedisError, KeyError):
            return False

    def client(self) -> RedisCluster:
        return RedisCluster.from_url(self.url)

    def master_of(self, client: RedisCluster, key: str) -> ClusterNode:
        """The master serving ``key`` now (the slot map read again)."""
        client.nodes_manager.initialize()
        return client.get_node_from_key(key)

    def kill(self, port: int) -> None:
        """SIGKILL one node: nothing flushed, its replica promoted after the node timeout."""
        proc = self.procs.pop(port)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def kill_master_of(self, client: RedisCluster, key: str) -> tuple[int, float]:
        """SIGKILL the master serving ``key`` once its replicas are online; its port and when."""
        wait_for(self.healthy, timeout=60, interval=0.1, what="every replica online before the kill")
        port = self.master_of(client, key).port
        assert port != self.ports[0], "the node clients are pointed at is never killed"
        self.kill(port)
        return port, time.monotonic()

    def promoted(self, client: RedisCluster, key: str, killed: int) -> bool:
        """A replica serves ``key``'s slot in place of the killed node, and says the cluster is ok."""
        try:
            node = self.master_of(client, key)
            if node.port == killed:
                return False
            with redis.Redis(port=node.port, socket_timeout=1) as direct:
                return bool(direct.cluster("info")["cluster_state"] == "ok")
        except redis.RedisError:
            return False

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs.values()]

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs.clear()

    def __enter__(self) -> PrivateRedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

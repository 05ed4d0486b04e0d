"""A real Ray cluster of two raylets on this machine, on loopback addresses only, for the scale-out tests.

Ray (2.5x and later) rewrites ``127.0.0.1`` and ``localhost`` given to ``--node-ip-address`` and
``--address`` into the machine's interface address (``resolve_ip_for_localhost``), so the nodes use
other loopback addresses, which Ray keeps: the head 127.0.0.2, the second raylet 127.0.0.3. Every
address Ray advertises and connects to is then on ``lo``. Token authentication is off
(``RAY_AUTH_MODE=disabled`` on both; Ray 2.60's head refuses a joining raylet without a token otherwise).

Each ``ray start --block`` runs in a session of its own; :meth:`LocalCluster.stop` kills exactly those
process groups and the raylets' descendants (workers put themselves in groups of their own), never
``ray stop`` (which would stop every Ray process of the machine's user).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest
from tests._serve_support import poll

HEAD_IP = "127.0.0.2"
WORKER_IP = "127.0.0.3"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _children() -> dict[int, list[int]]:
    table: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        table.setdefault(ppid, []).append(int(entry.name))
    return table


def _group_members(pgids: set[int]) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) in pgids:
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


class LocalCluster:
    """``ray start --head`` and one ``ray start --address`` on this machine, one CPU each.

    Args:
        root: A folder for the logs.
        node_env: Extra environment per node ('head', 'worker'), inherited by that node's workers.
    """

    def __init__(self, root: Path, node_env: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.root = root
        self.node_env = dict(node_env or {})
        self.port = free_port(HEAD_IP)
        self.address = f"{HEAD_IP}:{self.port}"
        # short: Ray's unix socket paths live under it
        self.temp_dir = tempfile.mkdtemp(prefix="r26-", dir="/tmp")
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self, node: str | None = None) -> dict[str, str]:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        env.update(self.node_env.get(node or "", {}))
        return env

    def _start(self, node: str, args: list[str]) -> None:
        log = open(self.root / f"ray-{node}.log", "wb")  # noqa: SIM115 - closed with the process
        common = ["--num-cpus", "1", "--object-store-memory", str(80 << 20), "--disable-usage-stats", "--block",
                  "--dashboard-agent-listen-port", str(free_port()), "--min-worker-port", "0",
                  "--max-worker-port", "0"]
        self.procs.append(subprocess.Popen(["ray", "start", *args, *common], stdout=log, stderr=subprocess.STDOUT,
                                           env=self.env(node), start_new_session=True))

    def start(self, timeout: float = 60.0) -> None:
        self._start("head", ["--head", "--node-ip-address", HEAD_IP, "--port", str(self.port),
                             "--include-dashboard=false", "--temp-dir", self.temp_dir,
                             "--ray-client-server-port", str(free_port())])
        self._wait_port(HEAD_IP, self.port, timeout)
        self._start("worker", ["--address", self.address, "--node-ip-address", WORKER_IP])

    def _wait_port(self, host: str, port: int, timeout: float) -> None:
        def listening() -> bool:
            if any(p.poll() is not None for p in self.procs):
                pytest.fail(f"ray start exited early; see {self.root}/ray-*.log")
            with socket.socket() as s:
                s.settimeout(1.0)
                return s.connect_ex((host, port)) == 0

        if not poll(listening, timeout, every=0.2):
            pytest.fail(f"the Ray head did not listen on {host}:{port} within {timeout} s")

    def wait_nodes(self, count: int = 2, timeout: float = 60.0) -> list[dict]:
        """Wait (in a driver connected with ``ray.init``) until ``count`` nodes are alive."""
        import ray

        def alive() -> list[dict] | None:
            nodes = [n for n in ray.nodes() if n["Alive"]]
            return nodes if len(nodes) >= count else None

        nodes = poll(alive, timeout, every=0.5)
        if nodes is None:
            pytest.fail(f"{count} Ray nodes were not alive within {timeout} s: {ray.nodes()}")
        return nodes

    def stop(self) -> None:
        """Kill what the two ``ray start`` commands started, and only that."""
        groups = {p.pid for p in self.procs}
        victims = _group_members(groups)
        table = _children()
        todo = list(victims)
        while todo:  # workers set their own process group: follow the parent links too
            for child in table.get(todo.pop(), []):
                if child not in victims:
                    victims.add(child)
                    todo.append(child)
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)

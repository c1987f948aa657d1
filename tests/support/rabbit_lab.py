"""A RabbitMQ cluster with one node per NetLab host, so partitions are real.

Each node runs Debian's ``rabbitmq-server`` in its own network namespace with long node
names on the lab addresses (``rabbit@10.213.0.11`` — no DNS or ``/etc/hosts`` needed),
the standard ports (each namespace has its own port space and its own epmd), and
``cluster_partition_handling = pause_minority``. Clients in this namespace reach node
``i`` through ``lab.proxy(i, AMQP_PORT)``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tests.support.netns import NetLab

_BIN = Path("/usr/lib/rabbitmq/bin")
AMQP_PORT = 5672
DIST_PORT = 25672
INSTALL_HINT = "apt-get install -y rabbitmq-server"


class NetRabbitCluster:
    """``lab.n`` RabbitMQ nodes, node ``i`` on host ``i``, clustered with node 0."""

    def __init__(self, lab: NetLab, *, net_ticktime: int = 10, start_timeout: float = 120) -> None:
        self.lab = lab
        self.net_ticktime = net_ticktime
        self.start_timeout = start_timeout
        self.base = Path(tempfile.mkdtemp(prefix="msgsafe-netrabbit-"))
        self._servers: dict[int, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> NetRabbitCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- names -----------------------------------------------------------------------------

    def node(self, i: int) -> str:
        return f"rabbit@{self.lab.addr(i)}"

    def _dir(self, i: int) -> Path:
        return self.base / f"n{i}"

    def _env(self, i: int) -> dict[str, str]:
        d = self._dir(i)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            HOME=str(self.base / "home"),
            # NOTE: Debian's /etc/rabbitmq/rabbitmq-env.conf pins epmd and distribution
            # to 127.0.0.1, which other namespaces cannot reach; use our own (empty) file.
            RABBITMQ_CONF_ENV_FILE=str(self.base / "rabbitmq-env.conf"),
            RABBITMQ_USE_LONGNAME="true",
            RABBITMQ_NODENAME=self.node(i),
            RABBITMQ_DIST_PORT=str(DIST_PORT),
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_PID_FILE=str(d / "rabbit.pid"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_PLUGINS_EXPAND_DIR=str(d / "plugins-expand"),
        )
        return env

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        if not (_BIN / "rabbitmq-server").exists():
            raise RuntimeError(f"RabbitMQ is not installed: {INSTALL_HINT}")
        home = self.base / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        (self.base / "rabbitmq-env.conf").write_text("# msgsafe netns cluster: no overrides\n")
        for i in range(self.lab.n):
            self._write_files(i)
        deadline = time.monotonic() + self.start_timeout
        for i in range(self.lab.n):
            self._launch(i)
        for i in range(self.lab.n):
            self.wait_running(i, deadline - time.monotonic())
        for i in range(1, self.lab.n):
            self.ctl(i, "stop_app")
            self.ctl(i, "join_cluster", self.node(0))
            self.ctl(i, "start_app")
        for i in range(self.lab.n):
            self.wait_running(i, deadline - time.monotonic())

    def stop(self) -> None:
        for proc in self._servers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self._servers.clear()
        shutil.rmtree(self.base, ignore_errors=True)

    def _write_files(self, i: int) -> None:
        d = self._dir(i)
        (d / "log").mkdir(parents=True)
        (d / "rabbitmq.conf").write_text(
            "\n".join(
                [
                    f"listeners.tcp.default = {AMQP_PORT}",
                    "loopback_users = none",
                    "cluster_partition_handling = pause_minority",
                    f"net_ticktime = {self.net_ticktime}",
                    "disk_free_limit.absolute = 1MB",
                    "log.console = false",
                    "log.file.level = info",
                    "",
                ]
            )
        )
        (d / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")

    def _launch(self, i: int) -> None:
        out = (self._dir(i) / "server.out").open("wb")
        with out:
            self._servers[i] = self.lab.run(
                i,
                [str(_BIN / "rabbitmq-server")],
                env=self._env(i),
                cwd=self._dir(i),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    # -- control ---------------------------------------------------------------------------

    def ctl(self, i: int, *args: str, timeout: float = 60, check: bool = True) -> str:
        """``rabbitmqctl -n <node i> ARGS``, run inside host ``i``'s namespace."""
        proc = self.lab.run(
            i,
            [str(_BIN / "rabbitmqctl"), "-n", self.node(i), *args],
            env=self._env(i),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            if check:
                raise RuntimeError(f"rabbitmqctl {' '.join(args)} timed out") from None
            return ""
        text = out.decode(errors="replace")
        if check and proc.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.node(i)}: {text}")
        return text

    def is_running(self, i: int) -> bool:
        """True when node ``i`` runs the rabbit application (a paused node does not)."""
        out = self.ctl(i, "eval", "rabbit:is_running().", timeout=30, check=False)
        return out.strip().endswith("true")

    def wait_running(self, i: int, timeout: float) -> float:
        start = time.monotonic()
        while not self.is_running(i):
            if self._servers[i].poll() is not None:
                raise RuntimeError(f"{self.node(i)} exited:\n{self.log_tail(i)}")
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"{self.node(i)} not running after {timeout:.0f}s")
            time.sleep(0.5)
        return time.monotonic() - start

    def cluster_status(self, i: int) -> dict[str, object]:
        """``cluster_status`` of node ``i`` as JSON (running_nodes, partitions, ...)."""
        out = self.ctl(i, "cluster_status", "--formatter", "json")
        status: dict[str, object] = json.loads(out[out.index("{") :])
        return status

    def connected_nodes(self, i: int) -> set[str]:
        """The Erlang nodes node ``i`` is connected to right now (``nodes()``).

        Cheap and immediate, unlike ``cluster_status``, which waits on every member.
        """
        out = self.ctl(i, "eval", "nodes().", timeout=30)
        return set(re.findall(r"'?(rabbit@[0-9.]+)'?", out))

    def pid(self, i: int) -> int:
        return int((self._dir(i) / "rabbit.pid").read_text().strip())

    def pause(self, i: int) -> None:
        os.kill(self.pid(i), signal.SIGSTOP)

    def resume(self, i: int) -> None:
        os.kill(self.pid(i), signal.SIGCONT)

    def log_tail(self, i: int, lines: int = 40) -> str:
        parts = []
        for path in [self._dir(i) / "server.out", *sorted((self._dir(i) / "log").glob("*.log"))]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

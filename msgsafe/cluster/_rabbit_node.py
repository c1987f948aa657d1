"""One RabbitMQ node of a :class:`~msgsafe.cluster.rabbitmq.RabbitCluster`: its name,
ports and files, the environment RabbitMQ's own scripts need to reach it, and those
scripts (``rabbitmq-server -detached``, ``rabbitmqctl``).

Split from :mod:`msgsafe.cluster.rabbitmq` along the line between one node and the
cluster: forming, breaking, healing and describing the cluster stay there.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from msgsafe.cluster.base import ClusterError, TlsFiles

__all__ = ["CTL", "SERVER", "RabbitNode"]

_SBIN = Path("/usr/lib/rabbitmq/bin")
SERVER = _SBIN / "rabbitmq-server"
CTL = _SBIN / "rabbitmqctl"


@dataclass(frozen=True, slots=True)
class RabbitNode:
    """One node's identity and files. Methods that run RabbitMQ's scripts take the
    cluster's dir, which holds what every node shares (the Erlang cookie in ``home/``
    and ``rabbitmq-env.conf``)."""

    index: int
    name: str  #: Erlang node name, e.g. ``msgsafe3fa2c1n0@localhost``
    port: int  #: AMQP 0-9-1 and AMQP 1.0 listener on 127.0.0.1
    dist_port: int  #: Erlang distribution port
    base: Path  #: this node's directory (data, logs, config)
    tls_port: int | None = None  #: a TLS listener on 127.0.0.1 (AMQP 0-9-1 and 1.0)
    tls: TlsFiles | None = None  #: its certificate files (given with ``tls_port``)
    #: The management HTTP API on 127.0.0.1 (None: the plugin is not enabled).
    management_port: int | None = None

    @property
    def pid_file(self) -> Path:
        return self.base / "rabbit.pid"

    @property
    def log_dir(self) -> Path:
        return self.base / "log"

    def env(self, cluster_dir: Path) -> dict[str, str]:
        """The environment RabbitMQ's scripts need to reach this node: its files and the
        cluster's shared Erlang cookie (in ``cluster_dir/home``)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            HOME=str(cluster_dir / "home"),
            RABBITMQ_CONF_ENV_FILE=str(cluster_dir / "rabbitmq-env.conf"),
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.base / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.log_dir),
            RABBITMQ_PID_FILE=str(self.pid_file),
            RABBITMQ_CONFIG_FILE=str(self.base / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.base / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base / "enabled_plugins"),
            RABBITMQ_PLUGINS_EXPAND_DIR=str(self.base / "plugins-expand"),
        )
        return env

    def write_files(self, net_ticktime: int) -> None:
        """This node's config: loopback listener, pause_minority, AMQP 1.0 plugin."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        (self.base / "rabbitmq.conf").write_text(
            "\n".join(
                [
                    f"listeners.tcp.default = 127.0.0.1:{self.port}",
                    "loopback_users = none",
                    "cluster_partition_handling = pause_minority",
                    f"net_ticktime = {net_ticktime}",
                    # NOTE: the default disk alarm (50 MB free) would block publishers on
                    # a busy CI disk; tests that want an alarm set it explicitly.
                    "disk_free_limit.absolute = 1MB",
                    "log.file.level = info",
                    "log.console = false",
                    *self._tls_lines(),
                    *self._management_lines(),
                    "",
                ]
            )
        )
        (self.base / "advanced.config").write_text("[].\n")
        plugins = "rabbitmq_amqp1_0"
        if self.management_port is not None:
            plugins += ",rabbitmq_management"
        (self.base / "enabled_plugins").write_text(f"[{plugins}].\n")

    def _management_lines(self) -> list[str]:
        if self.management_port is None:
            return []
        return ["management.tcp.ip = 127.0.0.1", f"management.tcp.port = {self.management_port}"]

    def _tls_lines(self) -> list[str]:
        if self.tls_port is None or self.tls is None:
            return []
        mutual = self.tls.require_client_cert
        return [
            f"listeners.ssl.default = 127.0.0.1:{self.tls_port}",
            f"ssl_options.cacertfile = {self.tls.ca}",
            f"ssl_options.certfile = {self.tls.cert}",
            f"ssl_options.keyfile = {self.tls.key}",
            # Mutual TLS where asked: the client's certificate must verify against ca.
            f"ssl_options.verify = {'verify_peer' if mutual else 'verify_none'}",
            f"ssl_options.fail_if_no_peer_cert = {'true' if mutual else 'false'}",
        ]

    def launch(self, cluster_dir: Path) -> None:
        """``rabbitmq-server -detached`` for this node (returns once the VM is forked)."""
        with contextlib.suppress(OSError):
            self.pid_file.unlink()
        proc = subprocess.run(
            [str(SERVER), "-detached"],
            env=self.env(cluster_dir),
            cwd=self.base,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            raise ClusterError(
                f"rabbitmq-server -detached for {self.name} failed ({proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()}"
            )

    def run_ctl(
        self, cluster_dir: Path, args: list[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl -n NODE ARGS``; a timeout comes back as exit code 124."""
        try:
            return subprocess.run(
                [str(CTL), "-n", self.name, *args],
                env=self.env(cluster_dir),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, 124, "", f"timed out after {timeout} s")

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of each of this node's logs."""
        out: list[str] = []
        for path in sorted(self.log_dir.glob("*.log")):
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(out)

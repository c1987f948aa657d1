"""Network namespaces for partition tests: N hosts you can cut off from each other.

``NetLab(n)`` builds, on this machine only, a small private network of ``n`` hosts and
one client, each in its own Linux network namespace, and removes it on exit::

    with NetLab(3) as lab:
        server = lab.run(0, ["python3", "-m", "http.server", "8000"])
        with lab.proxy(0, 8000) as door:          # 127.0.0.1:door.port in this namespace
            ...
            lab.cut(0)                            # host 0 loses hosts 1 and 2, not the client
            ...
            lab.heal(0)

Topology. Every pair of nodes (hosts and the client) gets its own link: a veth from each
node into a *hub* namespace, joined there by a two-port bridge. Each node owns one
address (``addr(i)``, ``client_addr``) on its loopback and a /32 route per peer through
that peer's link. Cutting a link sets its two hub-side ports down: both ends keep their
interfaces and routes, frames simply stop arriving — no RST, no ICMP from a router —
which is what a partitioned host sees (its ARP for the peer then fails, so new
connections eventually fail with "no route to host"). Healing sets the ports up again and
TCP connections that were not timed out resume.

Addresses come from ``10.213.0.0/24`` and exist only inside the lab's own namespaces:
nothing is added to the caller's namespace, so no traffic can leave the machine or meet
another lab. Processes reach hosts either by running in the client namespace
(:meth:`NetLab.run_client`) or, from the caller's namespace, through
:meth:`NetLab.proxy` (a :class:`~msgsafe.testing.faultproxy.FaultProxy` on loopback whose
upstream connections are opened in the client namespace) or :meth:`NetLab.connect`.

Needs root and ``ip``/``bridge`` from Debian ``iproute2``. Namespaces are named
``msgsafe-<token>-<node>``; :func:`cleanup_stale` removes those of labs whose owning
process is gone (``NetLab`` calls it on start).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from msgsafe.testing.faultproxy import FaultProxy

__all__ = [
    "CLIENT",
    "NetLab",
    "NetLabError",
    "cleanup_stale",
    "require_netns_support",
    "socket_in_netns",
]

CLIENT = -1
"""The node index of the lab's client, for :meth:`NetLab.run` and friends."""

_PREFIX = "msgsafe-"
_NETNS_DIR = Path("/run/netns")
_OWNERS_DIR = Path("/run/msgsafe-netlab")
_CLONE_NEWNET = 0x40000000
_SUBNET = "10.213.0"
_CLIENT_HOST = 1
_FIRST_HOST = 11
_MAX_HOSTS = 200
_setns_lock = threading.Lock()


class NetLabError(RuntimeError):
    """The lab could not be built or driven (not root, ``ip`` missing, a command failed)."""


def netns_or_fail(what: str) -> None:
    """Fail the calling test (never skip it) when ``what`` cannot run here, saying why."""
    import pytest

    try:
        require_netns_support()
    except NetLabError as exc:
        pytest.fail(f"{what} needs root and iproute2 (ip netns): {exc}")


def require_netns_support() -> None:
    """Raise :class:`NetLabError` saying what to install or how to run, if unsupported."""
    if os.geteuid() != 0:
        raise NetLabError(
            "network namespaces need root: run the suite as root (sudo -E pytest ...)"
        )
    missing = [tool for tool in ("ip", "bridge") if shutil.which(tool) is None]
    if missing:
        raise NetLabError(
            f"{' and '.join(missing)} not found: install Debian 'iproute2' "
            "(apt-get install -y iproute2)"
        )


def socket_in_netns(netns: str, family: int, type: int) -> socket.socket:
    """Create a socket that lives in the network namespace ``netns``.

    A socket stays in the namespace it was created in, so the calling thread enters
    ``netns`` only for the ``socket()`` call and returns to its own namespace at once.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        target = os.open(_NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetLabError(f"no network namespace named {netns!r}") from exc
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            with _setns_lock:
                if libc.setns(target, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise NetLabError(f"setns({netns}) failed: {os.strerror(err)}")
                try:
                    return socket.socket(family, type)
                finally:
                    if libc.setns(home, _CLONE_NEWNET) != 0:
                        # NOTE: a thread left in the wrong namespace would silently open
                        # every later socket there; failing loudly is the only safe way.
                        err = ctypes.get_errno()
                        raise NetLabError(f"could not return from {netns}: {os.strerror(err)}")
        finally:
            os.close(home)
    finally:
        os.close(target)


def _ip(*args: str, check: bool = True) -> str:
    """Run ``ip``/``bridge`` (first arg) and return stdout; errors become NetLabError."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetLabError(f"{' '.join(args)}: {exc}") from exc
    if check and done.returncode != 0:
        raise NetLabError(f"{' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _list_netns() -> list[str]:
    out = _ip("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_pids(name: str) -> list[int]:
    out = _ip("ip", "netns", "pids", name, check=False)
    return [int(tok) for tok in out.split() if tok.isdigit()]


def _kill_all_in(name: str, deadline_s: float = 10.0) -> None:
    """SIGKILL every process in ``name`` (daemons like epmd too) and wait until gone."""
    deadline = time.monotonic() + deadline_s
    while True:
        pids = _netns_pids(name)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise NetLabError(f"processes {pids} in {name} survive SIGKILL")
        time.sleep(0.05)


def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (guards against pid reuse), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _remove_lab(token: str, names: Sequence[str]) -> None:
    for name in names:
        _kill_all_in(name)
    for name in names:
        _ip("ip", "netns", "del", name, check=False)
    with contextlib.suppress(FileNotFoundError):
        (_OWNERS_DIR / token).unlink()


def cleanup_stale() -> list[str]:
    """Delete the namespaces of labs whose owner process is gone; return their names."""
    by_token: dict[str, list[str]] = {}
    for name in _list_netns():
        if name.startswith(_PREFIX) and name.count("-") >= 2:
            by_token.setdefault(name.split("-")[1], []).append(name)
    removed: list[str] = []
    for token, names in by_token.items():
        owner = _OWNERS_DIR / token
        try:
            pid_s, start = owner.read_text().split()
            alive = _process_start(int(pid_s)) == start
        except (OSError, ValueError):
            alive = False
        if not alive:
            _remove_lab(token, names)
            removed.extend(names)
    return removed


class NetLab:
    """``n`` hosts and a client in their own network namespaces, linked pairwise.

    Hosts are numbered ``0 .. n-1``; :data:`CLIENT` names the client. Not thread-safe:
    drive it from one thread (the proxies it hands out are thread-safe).
    """

    def __init__(self, n: int) -> None:
        if not 1 <= n <= _MAX_HOSTS:
            raise ValueError(f"n must be between 1 and {_MAX_HOSTS}, not {n}")
        self.n = n
        self.token = secrets.token_hex(3)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._proxies: list[FaultProxy] = []
        self._cut: set[frozenset[int]] = set()
        self._started = False
        self._closed = False

    # -- naming ---------------------------------------------------------------------------

    @property
    def hub(self) -> str:
        """Name of the namespace holding the links' bridges."""
        return f"{_PREFIX}{self.token}-hub"

    def netns(self, i: int) -> str:
        """Name of node ``i``'s namespace (``CLIENT`` for the client)."""
        return f"{_PREFIX}{self.token}-{self._label(self._check(i))}"

    @property
    def client_netns(self) -> str:
        """Name of the client's namespace."""
        return self.netns(CLIENT)

    def addr(self, i: int) -> str:
        """Host ``i``'s address (``CLIENT`` for the client's); valid inside the lab only."""
        self._check(i)
        return f"{_SUBNET}.{_CLIENT_HOST if i == CLIENT else _FIRST_HOST + i}"

    @property
    def client_addr(self) -> str:
        """The client's address inside the lab."""
        return self.addr(CLIENT)

    @property
    def nodes(self) -> list[int]:
        """Every node index: the hosts, then ``CLIENT``."""
        return [*range(self.n), CLIENT]

    # -- life cycle -----------------------------------------------------------------------

    def __enter__(self) -> NetLab:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Build the namespaces and links; on any failure remove what was built."""
        require_netns_support()
        if self._started:
            return
        self._started = True
        cleanup_stale()
        _OWNERS_DIR.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        # The owner file exists before any namespace, so cleanup_stale() elsewhere never
        # mistakes a lab being built for a leftover.
        (_OWNERS_DIR / self.token).write_text(f"{pid} {_process_start(pid)}\n")
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        for name in (self.hub, *(self.netns(i) for i in self.nodes)):
            _ip("ip", "netns", "add", name)
            _ip("ip", "-n", name, "link", "set", "lo", "up")
        for i in self.nodes:
            _ip("ip", "-n", self.netns(i), "addr", "add", f"{self.addr(i)}/32", "dev", "lo")
        for a, b in self._pairs():
            bridge = f"b{self._label(a)}_{self._label(b)}"
            _ip("ip", "-n", self.hub, "link", "add", bridge, "type", "bridge")
            _ip("ip", "-n", self.hub, "link", "set", bridge, "up")
            for near, far in ((a, b), (b, a)):
                port, dev = self._port(near, far), self._dev(far)
                ns = self.netns(near)
                _ip(
                    "ip", "-n", self.hub, "link", "add", port, "type", "veth",
                    "peer", "name", dev, "netns", ns,
                )  # fmt: skip
                _ip("ip", "-n", self.hub, "link", "set", port, "master", bridge, "up")
                _ip("ip", "-n", ns, "link", "set", dev, "up")
                _ip(
                    "ip", "-n", ns, "route", "add", f"{self.addr(far)}/32",
                    "dev", dev, "src", self.addr(near),
                )  # fmt: skip

    def close(self) -> None:
        """Close proxies, kill every process in the lab, delete its namespaces."""
        if self._closed:
            return
        self._closed = True
        for proxy in self._proxies:
            proxy.close()
        for proc in self._procs:
            # Only unreaped processes: a reaped pid may already belong to someone else.
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        if self._started:
            names = [self.hub, *(self.netns(i) for i in self.nodes)]
            existing = set(_list_netns())
            _remove_lab(self.token, [name for name in names if name in existing])
            with contextlib.suppress(FileNotFoundError):
                (_OWNERS_DIR / self.token).unlink()

    # -- processes and sockets ------------------------------------------------------------

    def run(
        self,
        i: int,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdout: int | IO[bytes] | None = None,
        stderr: int | IO[bytes] | None = None,
        stdin: int | IO[bytes] | None = subprocess.DEVNULL,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside node ``i``'s namespace (``ip netns exec``).

        The process gets its own session; :meth:`close` kills its whole group and any
        other process left in the lab's namespaces.
        """
        self._require_running()
        self._procs = [p for p in self._procs if p.poll() is None]
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(i), *argv],
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def run_client(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdout: int | IO[bytes] | None = None,
        stderr: int | IO[bytes] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in the client's namespace (reaches every host, never cut)."""
        return self.run(CLIENT, argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr)

    def connect(self, i: int, port: int, *, timeout: float = 5.0) -> socket.socket:
        """A TCP connection from the client's namespace to host ``i``:``port``."""
        self._require_running()
        sock = socket_in_netns(self.client_netns, socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect((self.addr(i), port))
        except BaseException:
            sock.close()
            raise
        return sock

    def proxy(self, i: int, port: int, *, connect_timeout: float = 5.0) -> FaultProxy:
        """A :class:`FaultProxy` on 127.0.0.1 here that forwards to host ``i``:``port``.

        The lab closes it on exit; closing it earlier is fine.
        """
        self._require_running()
        proxy = FaultProxy(
            self.addr(i),
            port,
            upstream_socket=functools.partial(socket_in_netns, self.client_netns),
            connect_timeout=connect_timeout,
        )
        self._proxies.append(proxy)
        return proxy

    # -- faults ---------------------------------------------------------------------------

    def cut(self, i: int) -> None:
        """Isolate host ``i`` from every other host, both directions; the client still
        reaches it (as clients still reach a partitioned broker)."""
        for j in range(self.n):
            if j != i:
                self.cut_link(i, j)

    def heal(self, i: int) -> None:
        """Undo :meth:`cut` for host ``i``."""
        for j in range(self.n):
            if j != i:
                self.heal_link(i, j)

    def cut_link(self, i: int, j: int) -> None:
        """Drop every frame between nodes ``i`` and ``j`` (``CLIENT`` allowed)."""
        self._set_link(i, j, up=False)

    def heal_link(self, i: int, j: int) -> None:
        """Let frames between ``i`` and ``j`` through again."""
        self._set_link(i, j, up=True)

    def heal_all(self) -> None:
        """Heal every link that is cut."""
        for pair in list(self._cut):
            a, b = sorted(pair)
            self.heal_link(a, b)

    def is_cut(self, i: int, j: int) -> bool:
        """Whether the link between ``i`` and ``j`` is cut."""
        return frozenset((self._check(i), self._check(j))) in self._cut

    def _set_link(self, i: int, j: int, *, up: bool) -> None:
        self._require_running()
        if self._check(i) == self._check(j):
            raise ValueError("a node has no link to itself")
        for near, far in ((i, j), (j, i)):
            _ip("ip", "-n", self.hub, "link", "set", self._port(near, far), "up" if up else "down")
        pair = frozenset((i, j))
        if up:
            self._cut.discard(pair)
        else:
            self._cut.add(pair)

    # -- helpers --------------------------------------------------------------------------

    def _pairs(self) -> Iterator[tuple[int, int]]:
        nodes = self.nodes
        for x, a in enumerate(nodes):
            for b in nodes[x + 1 :]:
                yield a, b

    def _check(self, i: int) -> int:
        if i != CLIENT and not 0 <= i < self.n:
            raise ValueError(f"no node {i} in a lab of {self.n} hosts")
        return i

    @staticmethod
    def _label(i: int) -> str:
        return "c" if i == CLIENT else str(i)

    def _port(self, near: int, far: int) -> str:
        """The hub-side port of ``near``'s link to ``far``."""
        return f"p{self._label(near)}_{self._label(far)}"

    def _dev(self, far: int) -> str:
        """The interface, inside a node, of its link to ``far``."""
        return f"to_{self._label(far)}"

    def _require_running(self) -> None:
        if not self._started or self._closed:
            raise NetLabError("the lab is not running (use it inside 'with NetLab(n)')")

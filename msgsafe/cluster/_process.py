"""Processes and ports of local broker nodes: spawn, signal, wait, with no sleeps as
synchronisation (every wait polls a condition against a deadline).

Shared by every launcher in :mod:`msgsafe.cluster`; nothing here knows a broker.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from msgsafe.cluster._port_ledger import PortLedger
from msgsafe.cluster.base import ClusterError

log = logging.getLogger("msgsafe.cluster")

#: Seconds a SIGKILLed process may take to be gone (the kernel frees a large JVM heap).
KILL_WAIT = 10.0

__all__ = [
    "Pid",
    "adopt_births",
    "births",
    "free_port",
    "free_ports",
    "kill_pid",
    "pause_pid",
    "pid_alive",
    "pid_paused",
    "port_free",
    "port_open",
    "signal_pid",
    "spawn",
    "stop_pid",
    "stop_pids",
    "tail",
    "wait_for",
    "wait_gone",
]


#: The lowest port a node is given (below: the well-known and registered services).
_LOWEST_PORT = 10000
#: The kernel's ephemeral range when it cannot be read (Linux's default).
_EPHEMERAL_DEFAULT = (32768, 60999)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (see :func:`free_ports`)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago, drawn
    outside the kernel's ephemeral range (port 0's only while none is left there).

    NOTE: a node's port must stay free while the node is down, to start it again on it.
    A port from the ephemeral range (what binding port 0 gives) is also the local port
    of any outgoing connection the kernel makes meanwhile; one connection that takes it
    (a client dialing another node) and the restarted node cannot listen there
    (EADDRINUSE) for as long as that connection lives. A suite run lost a RabbitMQ node
    that way, after a restart of the whole cluster.

    Every port drawn is held in a ledger shared by this user's processes
    (:mod:`msgsafe.cluster._port_ledger`) and not drawn again while held, so two
    processes starting nodes side by side never give two nodes one port.
    """
    low, high = _ephemeral_range()
    spans = [(_LOWEST_PORT, low - 1), (high + 1, 65535)]
    spans = [(a, b) for a, b in spans if a <= b]
    draw = random.SystemRandom()
    socks: list[socket.socket] = []
    with PortLedger.open() as ledger:
        try:
            # Every socket stays bound until all are picked, so no port comes twice.
            for _ in range(10 * count + 50):  # a drawn port may be taken, or drawn twice
                if len(socks) == count or not spans:
                    break
                port = _uniform(draw, spans)
                if ledger is not None and ledger.held(port):
                    continue
                sock = _bound(port)
                if sock is not None:
                    socks.append(sock)
            while len(socks) < count:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind(("127.0.0.1", 0))
            picked = [int(sock.getsockname()[1]) for sock in socks]
            if ledger is not None:
                ledger.record(picked)
            return picked
        finally:
            for sock in socks:
                sock.close()


def _uniform(draw: random.Random, spans: Sequence[tuple[int, int]]) -> int:
    """A port drawn evenly from the union of ``spans`` (inclusive ranges): weighing the
    spans alike drew the 4,535 ports above the ephemeral range as often as the 22,768
    below it, five times as likely to meet another process's draw."""
    at = draw.randrange(sum(last - first + 1 for first, last in spans))
    for first, last in spans:
        if at <= last - first:
            return first + at
        at -= last - first + 1
    raise AssertionError("unreachable: at < the spans' total")


def _bound(port: int) -> socket.socket | None:
    """A socket bound to ``port`` on 127.0.0.1, or None when that port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could bind ``host:port`` now: nothing listens on it or holds
    it bound. A port left in TIME_WAIT by a killed process counts as free, as it does
    for servers that set SO_REUSEADDR (every JVM broker, RabbitMQ)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class Pid(int):
    """A process id that knows when its process started, as :func:`spawn` returns it.

    A pid is only a name the kernel hands out again once its process is gone (after
    32,768 on many machines, and every JVM thread takes one): a node that died on its
    own leaves its pid in its cluster's list, and a signal to that number later would
    reach whatever process has it now (a database of another test, the user's editor).
    Every function here treats a pid whose process started at another time than
    ``born`` as gone. It is an ``int`` everywhere else (JSON, comparisons, ``os``).
    """

    born: str | None

    def __new__(cls, pid: int, born: str | None = None) -> Pid:
        made = super().__new__(cls, pid)
        made.born = born
        return made


#: Start times a cluster's saved state kept for its plain-int pids (:func:`adopt_births`).
_adopted: dict[int, str] = {}


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (``/proc/PID/stat`` field 22), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    with contextlib.suppress(IndexError):
        # The command name in parentheses may hold spaces: field 3 follows its last ")".
        return stat.rsplit(")", 1)[1].split()[19]
    return None


def _reused(pid: int) -> bool:
    """True when ``pid`` now names another process than the one it was given to."""
    born = pid.born if isinstance(pid, Pid) else _adopted.get(pid)
    if born is None:
        return False  # no start time known: trusted as before
    now = _start_time(pid)
    return now is not None and now != born


def births(pids: Sequence[int | None]) -> dict[str, str]:
    """The known start times of ``pids``, for a cluster's saved state."""
    found: dict[str, str] = {}
    for pid in pids:
        born = pid.born if isinstance(pid, Pid) else _adopted.get(pid or 0)
        if pid is not None and born is not None:
            found[str(int(pid))] = born
    return found


def adopt_births(saved: Mapping[str, str]) -> None:
    """Record start times a cluster's saved state kept (:func:`births`), so that another
    process driving that cluster (``msgsafe cluster down``, days later) never signals a
    process that merely inherited one of its pids."""
    for pid, born in saved.items():
        with contextlib.suppress(ValueError, TypeError):
            _adopted[int(pid)] = str(born)


def pid_alive(pid: int | None) -> bool:
    """True while ``pid`` exists, is the process recorded for it (not a later one that
    inherited the number) and is not a zombie (reaps our own dead children)."""
    if pid is None or _reused(pid):
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        # Our own child: waitpid alone tells. /proc shows a JVM whose main thread ended
        # as a zombie while its other threads still run the shutdown hooks.
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done != pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/status").read_text()
        return "State:\tZ" not in status or "Threads:\t1\n" not in status
    return True


def pid_paused(pid: int | None) -> bool:
    """True while ``pid`` is stopped by SIGSTOP (``/proc/PID/stat`` state ``T``, or ``t``
    under a tracer), whichever process stopped it; False when it runs or is gone."""
    if pid is None or _reused(pid):
        return False
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        # The command name in parentheses may hold spaces: the state follows its last ")".
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")
    return False


def signal_pid(pid: int | None, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``pid``; False when the process is already gone (its pid unused,
    or used by a later process, which is left alone)."""
    if pid is None or _reused(pid):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_for(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
    on_timeout: Callable[[], str] | None = None,
) -> None:
    """Poll ``condition`` until it is true; :class:`ClusterError` naming ``what`` after
    ``timeout`` seconds (with ``on_timeout()``'s text appended, e.g. a log tail)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if time.monotonic() >= deadline:
            extra = on_timeout() if on_timeout is not None else ""
            raise ClusterError(
                f"timed out after {timeout:.0f} s waiting for {what}"
                + (f"\n{extra}" if extra else "")
            )
        time.sleep(interval)


def wait_gone(pid: int | None, timeout: float) -> bool:
    """Wait until ``pid`` has exited; False if it is still there after ``timeout``."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the kernel SIGKILLs it when the process
    # that started it dies, so no broker outlives a crashed or killed test run.
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def spawn(
    argv: Sequence[str],
    *,
    log: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    detached: bool = False,
    user: str | None = None,
) -> Pid:
    """Start ``argv`` with stdout and stderr appended to ``log``; return its pid.

    ``detached=False`` (tests, benchmarks, the demo): the process dies with its parent.
    ``detached=True`` (``msgsafe cluster up``): it runs in its own session and outlives
    the command that started it; ``msgsafe cluster down`` stops it. ``user``: run as
    that user (and its group), for servers that refuse to run as root (PostgreSQL).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # NOTE: Popen switches the user before preexec_fn runs; the parent-death
                # signal is cleared by a change of user, so it must be set after it.
                preexec_fn=None if detached else _die_with_parent,
                user=user,
                group=None if user is None else _group_of(user),
                extra_groups=None if user is None else [],
            )
        except FileNotFoundError as exc:
            raise ClusterError(f"cannot run {argv[0]!r}: {exc.strerror}") from exc
    # Readable until the process is reaped, even when it died at once.
    return Pid(proc.pid, _start_time(proc.pid))


def _group_of(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_gid


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' when it cannot be read)."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"--- {path}\n" + "\n".join(text)


def kill_pid(pid: int | None, what: str) -> None:
    """SIGKILL ``pid`` and wait until it is gone (nothing when it already is);
    :class:`ClusterError` naming ``what`` when it survives."""
    signal_pid(pid, signal.SIGKILL)
    if not wait_gone(pid, KILL_WAIT):
        raise ClusterError(f"{what} (pid {pid}) survived SIGKILL")


def stop_pids(pids: Sequence[tuple[str, int | None]], grace: float) -> None:
    """Stop every ``(what, pid)`` at once: SIGCONT (a stopped process cannot act on
    SIGTERM) and SIGTERM to all, then SIGKILL what is left after ``grace`` seconds in all
    (:func:`kill_pid`). Pids that are None or gone are passed over."""
    running = [(what, pid) for what, pid in pids if pid_alive(pid)]
    for _, pid in running:
        signal_pid(pid, signal.SIGCONT)
        signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for what, pid in running:
        if not wait_gone(pid, max(0.0, deadline - time.monotonic())):
            log.warning("%s did not stop in %.0f s: SIGKILL", what, grace)
            kill_pid(pid, what)


def stop_pid(pid: int | None, what: str, grace: float) -> None:
    """:func:`stop_pids` of one process."""
    stop_pids([(what, pid)], grace)


def pause_pid(pid: int, what: str) -> None:
    """SIGSTOP ``pid`` and return once the kernel shows it stopped (:func:`pid_paused`),
    so that what the caller reads next already sees it paused."""
    if not signal_pid(pid, signal.SIGSTOP):
        raise ClusterError(f"{what} is not running")
    wait_for(lambda: pid_paused(pid) or not pid_alive(pid), 10.0, f"{what} to stop")

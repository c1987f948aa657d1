"""Whether a file lives on a filesystem that does not outlive its machine or container.

A SQLite outbox promises that what it stored survives a crash of the process, and of the
machine: true on a disk, not on memory (``tmpfs``, ``ramfs``: gone at reboot) nor in a
container's writable layer (``overlay`` and the like: gone when the container is
removed or rescheduled, which orchestrators do on their own — Kubernetes replaces a
crashed container by a new one, with a fresh writable layer). :func:`ephemeral_mount`
names the filesystem of a path's mount from ``/proc/self/mountinfo`` (Linux; elsewhere,
or when it cannot be read, nothing is known and nothing is said);
:func:`file_guarantee` rates a file there on the :class:`~msgsafe.message.Guarantee`
scale — the one answer that ``msgsafe doctor --outbox`` and the producer's
``require=`` both use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from msgsafe.message import Guarantee

__all__ = [
    "EPHEMERAL",
    "Mount",
    "ephemeral_mount",
    "file_guarantee",
    "mount_of",
    "parse_mountinfo",
    "read_mountinfo",
]

#: Filesystem types whose files are gone with the machine's memory or the container.
EPHEMERAL = {
    "tmpfs": "memory (gone at reboot)",
    "ramfs": "memory (gone at reboot)",
    "overlay": "a container's writable layer (gone when the container is removed)",
    "aufs": "a container's writable layer (gone when the container is removed)",
    "fuse.fuse-overlayfs": "a container's writable layer (gone when the container is removed)",
}

_MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of mountinfo: where it is mounted, its filesystem type and source."""

    point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in octal (\040 ...).
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a mountinfo text, in its order (a later mount on the same point hides
    an earlier one). Malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 3:
            continue
        mounts.append(Mount(_unescape(fields[4]), fields[dash + 1], _unescape(fields[dash + 2])))
    return mounts


def mount_of(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount ``path`` (absolute, symlinks resolved by the caller) is on: the longest
    mount point that contains it, the last one mounted of equals."""
    best: Mount | None = None
    text = str(path)
    for mount in mounts:
        point = mount.point.rstrip("/") or "/"
        inside = point == "/" or text == point or text.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = mount
    return best


def read_mountinfo() -> str | None:
    """This process's ``/proc/self/mountinfo``, None where it cannot be read."""
    try:
        return _MOUNTINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def ephemeral_mount(path: str | os.PathLike[str], mountinfo: str | None = None) -> Mount | None:
    """The mount of ``path`` (a file or the directory it will be in) when its filesystem
    is one of :data:`EPHEMERAL`, None otherwise or when unknown. ``mountinfo``: the text
    of ``/proc/self/mountinfo`` (read when None)."""
    if mountinfo is None:
        mountinfo = read_mountinfo()
        if mountinfo is None:
            return None
    where = Path(os.path.realpath(os.fspath(path)))
    found = mount_of(where, parse_mountinfo(mountinfo))
    return found if found is not None and found.fstype in EPHEMERAL else None


def file_guarantee(
    path: str | os.PathLike[str], mountinfo: str | None = None
) -> tuple[Guarantee, Mount | None]:
    """What a message stored in a file at ``path`` survives, and the mount that says so:
    ``NONE`` on one of :data:`EPHEMERAL` (memory, a container's writable layer: a
    reboot or a replaced container loses it), ``DURABLE`` on any other filesystem (a
    crash or reboot of this machine keeps it, the loss of its disk does not),
    ``UNKNOWN`` when the mounts cannot be read (not Linux) or none holds ``path``.
    ``mountinfo`` as :func:`ephemeral_mount`."""
    if mountinfo is None:
        mountinfo = read_mountinfo()
        if mountinfo is None:
            return Guarantee.UNKNOWN, None
    where = Path(os.path.realpath(os.fspath(path)))
    found = mount_of(where, parse_mountinfo(mountinfo))
    if found is None:
        return Guarantee.UNKNOWN, None
    if found.fstype in EPHEMERAL:
        return Guarantee.NONE, found
    return Guarantee.DURABLE, found

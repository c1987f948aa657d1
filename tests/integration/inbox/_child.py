"""A consumer's process for the inbox's crash and race tests: it handles message ids
through an inbox, each handling writing one effect row (``effects``: the id and this
process's pid) through the inbox's transaction, and dies where it is told to.

Run as ``python -m tests.integration.inbox._child URL MODE ARGS...``:

- ``die-in-work ID exit|kill``: the effect written, the process ends inside ``work``
  before the commit (``os._exit``, or it prints ``waiting`` and waits for SIGKILL);
- ``die-after-commit ID exit|kill``: ``process`` returned (committed) and the process
  ends before it could acknowledge the broker;
- ``race FIRST COUNT``: prints ``ready``, waits for a line on stdin, then handles ids
  ``m<FIRST>`` … ``m<FIRST+COUNT-1>`` in order; prints the ids whose work it ran, as
  JSON, at the end.

Works with ``sqlite:`` and ``postgresql://`` inboxes alike (``effects`` made by the test).
The tests start it with :func:`spawn`, :func:`die` and :func:`race`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from msgsafe.inbox import open_inbox

#: How long a child may take (a loaded 2-core machine, 500 ids on PostgreSQL).
CHILD_TIMEOUT_S = 300.0


def spawn(url: str, mode: str, *args: str) -> subprocess.Popen[str]:
    """This module as a child process (from the repository root)."""
    from tests.support.commands import ROOT

    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.inbox._child", url, mode, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def die(url: str, mode: str, message_id: str, how: str) -> int:
    """A child run in ``mode`` for ``message_id``, ended by ``how`` (``exit``: it calls
    ``os._exit``; ``kill``: SIGKILLed once it says it is there); its exit code."""
    child = spawn(url, mode, message_id, how)
    try:
        if how == "kill":
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line == "waiting\n", (line, child.stderr.read() if child.stderr else "")
            child.send_signal(signal.SIGKILL)
        return child.wait(CHILD_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None:
                stream.close()


def race(url: str, first: int, count: int, processes: int = 2) -> list[list[str]]:
    """``processes`` children handling the same ids at once (released together once all
    are ready); the ids each one ran ``work`` for."""
    children = [spawn(url, "race", str(first), str(count)) for _ in range(processes)]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line == "ready\n", (line, child.stderr.read() if child.stderr else "")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        ran = []
        for child in children:
            out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
            assert child.returncode == 0, err[-2000:]
            ran.append(json.loads(out.splitlines()[-1]))
        return ran
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)


def effect_sql(url: str) -> str:
    """The insert of one effect row, in the parameter style of ``url``'s driver."""
    mark = "?" if url.startswith("sqlite:") else "%s"
    return f"INSERT INTO effects (message_id, pid) VALUES ({mark}, {mark})"


def _wait_for_kill() -> None:
    sys.stdout.write("waiting\n")
    sys.stdout.flush()
    signal.pause()  # the test SIGKILLs this process now


def main(url: str, mode: str, *args: str) -> None:
    inbox = open_inbox(url)
    insert = effect_sql(url)
    pid = os.getpid()

    def effect(message_id: str) -> Any:
        def work(tx: Any) -> str:
            tx.execute(insert, (message_id, pid))
            if mode == "die-in-work":
                if args[1] == "exit":
                    os._exit(9)
                _wait_for_kill()
            return message_id

        return work

    if mode in ("die-in-work", "die-after-commit"):
        message_id, how = args
        inbox.process(message_id, effect(message_id), source="q")
        # Committed; the acknowledgement to the broker would come next.
        if how == "exit":
            os._exit(0)
        _wait_for_kill()
    elif mode == "race":
        first, count = int(args[0]), int(args[1])
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        ran = []
        for n in range(first, first + count):
            message_id = f"m{n}"
            if inbox.process(message_id, effect(message_id), source="q").ran:
                ran.append(message_id)
        sys.stdout.write(json.dumps(ran) + "\n")
        sys.stdout.flush()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    inbox.close()


if __name__ == "__main__":
    main(*sys.argv[1:])

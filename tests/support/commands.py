"""Running Python as a user would, in a child process: the ``msgsafe`` command, an
example script, any module or ``-c`` program; output decoded, exit code kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Run:
    """How a child process ended: its exit code, its output, how long it took."""

    code: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> Any:
        return json.loads(self.stdout)

    def lines(self) -> list[str]:
        return self.stdout.splitlines()


def run_python(
    *args: str,
    label: str,
    stdin: str = "",
    timeout: float = 120.0,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Run:
    """``python3 ARGS`` with the interpreter running the tests; never raises on the exit
    code (the test asserts it). ``stdin`` is always a pipe, so no child ever waits on a
    terminal; ``env`` is added to this process's environment. Prints ``$ LABEL -> exit
    N in S s`` for the test log."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )
    run = Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
    print(f"$ {label} -> exit {run.code} in {run.seconds:.1f}s")
    return run


def signalled(script: Path, *args: str, signum: int, ready: str = "handling") -> Any:
    """Run the Python ``script`` with ``args`` (this checkout first on the import path);
    once its first line says ``ready``, send it ``signum``. It must exit 0 within 30 s;
    returns the JSON of its last line. A child that did not stop is killed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == ready
        child.send_signal(signum)
        out, _ = child.communicate(timeout=30)
    finally:
        # A child that did not stop must not outlive the test (it would spin on a core).
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def msgsafe(
    *args: str,
    stdin: str = "",
    timeout: float = 120.0,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
) -> Run:
    """``python3 -m msgsafe ARGS``, from the repository root by default (so ``-m msgsafe``
    is this checkout's, wherever pytest was started). The end of stderr is printed when
    the command could not run (2 usage, 3 error, or a crash): every other exit code is an
    outcome it reports."""
    run = run_python(
        "-m",
        "msgsafe",
        *args,
        label=f"msgsafe {' '.join(args)}",
        stdin=stdin,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )
    if run.code not in (0, 1, 4, 5, 6, 7):
        print(run.stderr[-3000:])
    return run


def run_example(
    name: str,
    *args: str,
    home: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> Run:
    """Run ``examples/NAME`` with ``args`` from the repository root; ``home`` is the
    child's HOME and XDG data dir (so a test sees whether the example wrote outside its
    temp dirs)."""
    child_env = {
        # The examples import msgsafe from this checkout, installed or not.
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        **(env or {}),
    }
    run = run_python(
        str(EXAMPLES / name),
        *args,
        label=f"python3 examples/{name} {' '.join(args)}",
        timeout=timeout,
        cwd=ROOT,
        env=child_env,
    )
    print(run.stdout)
    if run.code != 0:
        print(run.stderr[-3000:])
    return run

"""Run an example script as a subprocess, as a user would: ``python3 examples/NAME.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str
    seconds: float

    def lines(self) -> list[str]:
        return self.stdout.splitlines()


def run_example(
    name: str,
    *args: str,
    home: Path,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> Run:
    """Run ``examples/NAME`` with ``args``; ``home`` is the child's HOME and XDG data dir
    (so a test sees whether the example wrote outside its temp dirs)."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    child_env["HOME"] = str(home)
    child_env["XDG_DATA_HOME"] = str(home / ".local" / "share")
    child_env.update(env or {})
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    run = Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
    print(f"$ python3 examples/{name} {' '.join(args)}  -> exit {run.code} in {run.seconds:.1f}s")
    print(run.stdout)
    if run.code != 0:
        print(run.stderr[-3000:])
    return run

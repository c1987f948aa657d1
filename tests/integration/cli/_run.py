"""Run the ``msgsafe`` command as a subprocess, as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> Any:
        return json.loads(self.stdout)


def msgsafe(*args: str, stdin: str | None = None, timeout: float = 120.0) -> Result:
    """``python3 -m msgsafe ARGS``; output decoded, exit code kept (never raises on it)."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "msgsafe", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    result = Result(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
    print(f"$ msgsafe {' '.join(args)}  -> exit {result.code} in {result.seconds:.1f}s")
    if result.code not in (0, 1, 4, 5, 6):
        print(result.stderr[-3000:])
    return result

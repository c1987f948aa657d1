"""The bootstrap installs into the checkout's own ``.venv``, never into ``python3``.

An editable install into the machine's interpreter repoints every other checkout's
``import msgsafe`` at the last checkout bootstrapped. The script runs here on a copy of
the repository's scripts with a ``python3`` on ``PATH`` that only records its calls (and
makes a recording ``.venv/bin/python`` when asked for a venv), so nothing is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RECORDER = """#!/usr/bin/env bash
echo "{name} $*" >> "$BOOTSTRAP_CALLS"
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin"
  sed 's/^echo "{name} /echo "venv-python /' "$0" > "$3/bin/python"
  chmod +x "$3/bin/python"
fi
exit 0
"""


def _checkout_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "checkout"
    (copy / "scripts").mkdir(parents=True)
    for name in ("bootstrap.sh", "venv.sh"):
        shutil.copy(ROOT / "scripts" / name, copy / "scripts" / name)
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def _run_bootstrap(copy: Path, tmp_path: Path, mode: str) -> list[str]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    python3 = fake_bin / "python3"
    python3.write_text(_RECORDER.replace("{name}", "python3"))
    python3.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "BOOTSTRAP_CALLS": str(calls)}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        ["bash", str(copy / "scripts" / "bootstrap.sh"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return calls.read_text().splitlines()


def test_the_bootstrap_installs_into_the_checkouts_venv_only(tmp_path: Path) -> None:
    copy = _checkout_copy(tmp_path)
    calls = _run_bootstrap(copy, tmp_path, "fast")
    assert calls[0] == "python3 -m venv .venv", calls
    installs = [call for call in calls if " pip install" in call]
    assert installs, calls
    assert all(call.startswith("venv-python -m pip install") for call in installs), calls
    assert not any(call.startswith("python3 -m pip") for call in calls), calls


def test_an_existing_venv_is_reused(tmp_path: Path) -> None:
    copy = _checkout_copy(tmp_path)
    venv_python = copy / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(_RECORDER.replace("{name}", "venv-python"))
    venv_python.chmod(0o755)
    calls = _run_bootstrap(copy, tmp_path, "docs")
    assert not [call for call in calls if call.startswith("python3")], calls
    assert [call.split()[:4] for call in calls] == [["venv-python", "-m", "pip", "install"]]


def test_the_scripts_run_inside_the_venv(tmp_path: Path) -> None:
    copy = _checkout_copy(tmp_path)
    shown = subprocess.run(
        ["bash", "-c", '. scripts/venv.sh && echo "$PATH" && echo "$VIRTUAL_ENV"'],
        cwd=copy,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown[0].split(":")[0] == str(copy / ".venv" / "bin")
    assert shown[1] == str(copy / ".venv")
    for script in ("test.sh", "demo.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert ". scripts/venv.sh" in text, f"scripts/{script} does not run inside .venv"

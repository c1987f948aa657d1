"""The bootstrap installs into the checkout's own ``.venv``, never into ``python3``.

An editable install into the machine's interpreter repoints every other checkout's
``import msgsafe`` at the last checkout bootstrapped. The script runs here on a copy of
the repository's scripts with a ``python3`` on ``PATH`` that only records its calls (and
makes a recording ``.venv/bin/python`` when asked for a venv), so nothing is installed.
Asked where it imports ``msgsafe`` from (``python -I -c ...``), the recording python answers
``$BOOTSTRAP_MSGSAFE``.

A second checkout whose ``.venv`` is a symlink to the first one's must not install into
it: that would repoint the first checkout's ``import msgsafe`` at the second one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_RECORDER = """#!/usr/bin/env bash
echo "{name} $*" >> "$BOOTSTRAP_CALLS"
if [ "$1" = -I ]; then
  echo "${BOOTSTRAP_MSGSAFE:-}"
fi
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


def _recording_python(path: Path, name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_RECORDER.replace("{name}", name))
    path.chmod(0o755)


def _run_bootstrap(
    copy: Path, tmp_path: Path, mode: str, msgsafe_from: Path | None = None
) -> list[str]:
    fake_bin = tmp_path / "bin"
    _recording_python(fake_bin / "python3", "python3")
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "BOOTSTRAP_CALLS": str(calls)}
    env.pop("VIRTUAL_ENV", None)
    env.pop("BOOTSTRAP_MSGSAFE", None)
    if msgsafe_from is not None:
        env["BOOTSTRAP_MSGSAFE"] = str(msgsafe_from / "msgsafe" / "__init__.py")
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
    _recording_python(copy / ".venv" / "bin" / "python", "venv-python")
    calls = _run_bootstrap(copy, tmp_path, "docs")
    assert not [call for call in calls if call.startswith("python3")], calls
    assert [call.split()[:4] for call in calls] == [
        ["venv-python", "-I", "-c", "import"],
        ["venv-python", "-m", "pip", "install"],
    ]


def _installs(calls: list[str]) -> list[str]:
    return [call for call in calls if " pip install" in call]


def test_an_install_that_would_change_nothing_is_skipped(tmp_path: Path) -> None:
    copy = _checkout_copy(tmp_path).resolve()
    _recording_python(copy / ".venv" / "bin" / "python", "venv-python")
    # The first run installs (no stamp yet), the second finds msgsafe already imported
    # from this checkout with these extras and this pyproject.toml.
    assert _installs(_run_bootstrap(copy, tmp_path, "fast", msgsafe_from=copy))
    assert _installs(_run_bootstrap(copy, tmp_path, "fast", msgsafe_from=copy)) == []
    # The fast tier's extras hold the docs ones; the demo's are not all in docs.
    assert _installs(_run_bootstrap(copy, tmp_path, "docs", msgsafe_from=copy)) == []
    # A changed pyproject.toml (a new dependency, say) installs again.
    with (copy / "pyproject.toml").open("a") as pyproject:
        pyproject.write("\n# changed\n")
    assert _installs(_run_bootstrap(copy, tmp_path, "fast", msgsafe_from=copy))
    assert _installs(_run_bootstrap(copy, tmp_path, "fast", msgsafe_from=copy)) == []


def test_a_venv_importing_another_checkouts_msgsafe_is_repointed_here(tmp_path: Path) -> None:
    copy = _checkout_copy(tmp_path).resolve()
    _recording_python(copy / ".venv" / "bin" / "python", "venv-python")
    assert _installs(_run_bootstrap(copy, tmp_path, "fast", msgsafe_from=copy))
    # Someone installed another checkout into this venv: this checkout's bootstrap takes
    # its own venv back, even with an up-to-date stamp.
    elsewhere = tmp_path / "elsewhere"
    installs = _installs(_run_bootstrap(copy, tmp_path, "fast", msgsafe_from=elsewhere))
    assert [call.split()[:4] for call in installs] == [["venv-python", "-m", "pip", "install"]]


def test_another_checkouts_venv_is_never_installed_into(tmp_path: Path) -> None:
    first = _checkout_copy(tmp_path / "first").resolve()
    _recording_python(first / ".venv" / "bin" / "python", "first-venv-python")
    second = _checkout_copy(tmp_path / "second").resolve()
    (second / ".venv").symlink_to(first / ".venv")
    # Even though the venv's msgsafe is the first checkout's, not this one's.
    calls = _run_bootstrap(second, tmp_path, "fast", msgsafe_from=first)
    assert _installs(calls) == [], calls
    assert not [call for call in calls if call.startswith("python3")], calls
    assert not (first / ".venv" / "msgsafe-installed").exists()
    # The scripts then import the second checkout's msgsafe through PYTHONPATH.
    env = {
        key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    shown = subprocess.run(
        ["bash", "-c", '. scripts/venv.sh && echo "$PYTHONPATH" && echo "$VIRTUAL_ENV"'],
        cwd=second,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown == [str(second), str(second / ".venv")]


def test_the_checkouts_own_venv_leaves_pythonpath_alone(tmp_path: Path) -> None:
    copy = _checkout_copy(tmp_path).resolve()
    _recording_python(copy / ".venv" / "bin" / "python", "venv-python")
    env = {**os.environ, "PYTHONPATH": "/somewhere"}
    shown = subprocess.run(
        ["bash", "-c", '. scripts/venv.sh && echo "$PYTHONPATH"'],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown == ["/somewhere"]


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

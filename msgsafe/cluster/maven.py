"""Broker jars and distributions from Maven Central, resolved once into a cache.

Each Java broker keeps a small pom beside its launcher (``msgsafe/cluster/poms/``);
:func:`resolve` runs ``mvn`` on it once and reuses the result. The cache lives in
``$MSGSAFE_CACHE`` or the user's cache dir (``~/.cache/msgsafe/brokers``); a run that
was interrupted leaves no ``.complete`` marker and is redone.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
import zipfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from msgsafe.cluster.base import ClusterError

__all__ = ["cache_root", "checked_lib", "damaged_jar", "fetch_lib", "java", "resolve"]

log = logging.getLogger(__name__)

_JAVA_HINT = "install Java 17 or newer: apt-get install -y openjdk-17-jre-headless"
_MVN_HINT = "install Maven: apt-get install -y maven"


def cache_root() -> Path:
    """Where resolved broker jars are kept."""
    env = os.environ.get("MSGSAFE_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("msgsafe")) / "brokers"


def java() -> str:
    """The ``java`` executable; :class:`ClusterError` naming the package when missing."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not os.access(found, os.X_OK):
        raise ClusterError(f"Java is missing: {_JAVA_HINT}")
    return found


def damaged_jar(lib: Path, required: Sequence[str] = ()) -> str | None:
    """The name of the first jar in ``lib`` that is missing (of ``required``) or is no
    readable zip (a download cut short), or None when the classpath looks whole. Reads
    only each jar's directory, so it is cheap enough to run before every start."""
    for name in required:
        if not (lib / name).is_file():
            return name
    for jar in sorted(lib.glob("*.jar")):
        try:
            with zipfile.ZipFile(jar):
                pass
        except (OSError, zipfile.BadZipFile):
            return jar.name
    return None


def resolve(name: str, goals: Sequence[str], *, timeout: float = 900.0) -> Path:
    """The cache dir of ``name`` (e.g. ``kafka-4.1.0``), filled by running ``mvn`` with
    ``goals`` on the pom ``msgsafe/cluster/poms/<name>.xml`` when not complete yet.

    The goals write below ``${cache}`` (passed as ``-Dcache=DIR``). Raises
    :class:`ClusterError` when Maven is missing or the resolution fails, quoting mvn.
    """
    target = cache_root() / name
    marker = target / ".complete"
    if marker.exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ClusterError(f"Maven is missing (needed once to fetch {name}): {_MVN_HINT}")
    pom = resources.files("msgsafe.cluster") / "poms" / f"{name}.xml"
    if not pom.is_file():
        raise ClusterError(f"no pom for {name} in msgsafe/cluster/poms/")
    if target.exists():
        shutil.rmtree(target)  # an interrupted earlier run: start over
    target.mkdir(parents=True)
    log.info("fetching %s from Maven Central into %s (once; later runs reuse it)", name, target)
    started = time.monotonic()
    with resources.as_file(pom) as pom_path:
        argv = [mvn, "-q", "-B", "-f", str(pom_path), f"-Dcache={target}", *goals]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"mvn did not finish fetching {name} in {timeout:.0f} s") from exc
    if done.returncode != 0:
        out = (done.stdout + done.stderr).strip().splitlines()[-25:]
        raise ClusterError(f"mvn could not fetch {name}:\n" + "\n".join(out))
    marker.write_text("ok\n")
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    log.info("fetched %s: %.0f MB in %.0f s", name, size / 1e6, time.monotonic() - started)
    return target


_COPY = ["dependency:copy-dependencies"]


def fetch_lib(name: str, required: Sequence[str], *, what: str, kind: str, m2: str) -> Path:
    """The ``lib`` dir (the jars) of ``name``'s pom, resolved with its dependencies; a
    damaged one is fetched once more. :class:`ClusterError` when it is damaged again:
    then Maven's own repository (``~/.m2/repository/<m2>``) holds the damaged jar.
    ``what`` names the broker in messages, ``kind`` its ``msgsafe cluster`` kind."""
    for _ in range(2):
        lib = resolve(name, _COPY) / "lib"
        damaged = damaged_jar(lib, required)
        if damaged is None:
            return lib
        log.warning("damaged %s jar %s in %s: fetching again", what, damaged, lib)
        shutil.rmtree(lib.parent)
    raise ClusterError(
        f"{damaged} is damaged in Maven's own repository too: delete "
        f"~/.m2/repository/{m2} and run `msgsafe cluster fetch {kind}`"
    )


def checked_lib(name: str, required: Sequence[str], *, what: str, kind: str) -> Path:
    """The ``lib`` dir of ``name``'s pom (resolved on first use) after a check that no
    jar is damaged; :class:`ClusterError` naming the command that fetches it again."""
    lib = resolve(name, _COPY) / "lib"
    damaged = damaged_jar(lib, required)
    if damaged is not None:
        raise ClusterError(
            f"the {what} jars in {lib} are damaged ({damaged}): "
            f"run `msgsafe cluster fetch {kind}` to fetch them again"
        )
    return lib

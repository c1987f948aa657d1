"""The clients' own test suites, run twice on the same real broker: with the real client
and with msgsafe's wrapper, and the outcomes compared.

    python3 -m tests.thirdparty.client_suites --checkout pika=DIR --checkout confluent-kafka=DIR ...

``DIR`` is a checkout of the client's repository at the commit its suite names (one
module of :mod:`tests.thirdparty.suites` a client)
(``tests/thirdparty/README.md`` says how to get one). For each side the suite's files are
copied into a temporary tree with the harness edits of :class:`Suite` (the import swap on
the wrapper side, the broker address, a pika 1.4 module name), the tests that only look
at the real client's private internals are deselected (each with its reason), and pytest
runs them. A broker is started for the run through :mod:`msgsafe.cluster` (one node).

Exit status 1 when a test that passes with the real client fails with the wrapper and is
not an intended difference; the table printed lists every count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from tests.thirdparty.suites import SUITES
from tests.thirdparty.suites.model import Suite

#: Outcome of one test id: "passed", "failed", "error" or "skipped".
Outcomes = dict[str, str]


def _copy_tree(checkout: Path, suite: Suite, root: Path, *, wrapper: bool, address: str) -> None:
    """The suite's files under ``root`` with the harness edits of ``suite`` (applied to
    the test files and to the Python files among ``support``)."""
    port = address.rsplit(":", 1)[-1]
    texts: dict[str, str] = {}
    for name in suite.test_files:
        source = checkout / name
        if not source.exists():
            raise SystemExit(f"{suite.repo}: {name} is not in the checkout {checkout}")
        texts[name] = source.read_text()
    for name in suite.support:
        source = checkout / name
        if not source.exists():
            continue  # an optional helper this commit does not have
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        elif name.endswith(".py"):
            texts[name] = source.read_text()
        else:
            shutil.copyfile(source, target)
    for old, new in suite.edits + (suite.swap if wrapper else ()):
        if not any(old in text for text in texts.values()):
            raise SystemExit(f"{suite.repo}: harness edit not applicable: {old!r}")
        for name, text in texts.items():
            texts[name] = text.replace(old, new.format(address=address, port=port))
    for name, text in texts.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for directory in {p.parent for p in root.rglob("*.py")} | {root / "tests"}:
        init = directory / "__init__.py"
        # NOTE: not every checkout has a tests/ folder (Celery's and kombu's are t/).
        if directory != root and directory.is_dir() and not init.exists():
            init.write_text("")
    if suite.conftest:
        (root / "conftest.py").write_text(suite.conftest)


def _outcomes(report: Path, test_files: tuple[str, ...]) -> Outcomes:
    """Test id -> outcome. The id is ``Class::test`` for a test of a class (whatever
    the case of its name: kombu's and Celery's classes are ``test_*``) and the test's
    name for a function; prefixed with ``module::`` when the suite has several files."""
    modules = {name.removesuffix(".py").replace("/", ".") for name in test_files}
    outcomes: Outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        module, _, klass = classname.rpartition(".")
        if classname in modules or not module:
            module, klass = classname, ""  # a function of the module
        key = f"{klass}::{name}" if klass else name
        if len(test_files) > 1:
            key = f"{module.rpartition('.')[2]}::{key}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            outcomes[key] = "failed"
        elif "error" in kinds:
            outcomes[key] = "error"
        elif "skipped" in kinds:
            outcomes[key] = "skipped"
        else:
            outcomes[key] = "passed"
    return outcomes


def run_side(checkout: Path, suite: Suite, *, wrapper: bool, address: str, work: Path) -> Outcomes:
    """Run the suite with one client; the outcome of every test that was not set aside."""
    root = work / ("wrapper" if wrapper else "real")
    _copy_tree(checkout, suite, root, wrapper=wrapper, address=address)
    report = root / "report.xml"
    deselect = [
        f"--deselect={test_file}::{name}"
        for test_file in suite.test_files
        for name in suite.set_aside
    ]
    env = {
        **os.environ,
        **suite.env,
        "PYTHONPATH": os.pathsep.join([str(root), str(Path.cwd())]),
        # The wrapper's default outbox lives in the user's data directory: keep it here.
        "XDG_DATA_HOME": str(root / "data"),
    }
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *suite.test_files,
            "-q",
            "-p",
            "no:cacheprovider",
            "--timeout=120",
            f"--junitxml={report}",
            *deselect,
            *suite.pytest_args,
        ],
        cwd=root,
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _outcomes(report, suite.test_files)


@dataclass(frozen=True)
class Comparison:
    """Both sides' outcomes of one suite."""

    name: str
    real: Outcomes
    wrapper: Outcomes
    suite: Suite

    @property
    def passing_real(self) -> set[str]:
        return {t for t, o in self.real.items() if o == "passed"}

    @property
    def passing_wrapper(self) -> set[str]:
        return {t for t, o in self.wrapper.items() if o == "passed"}

    @property
    def regressions(self) -> set[str]:
        """Passing with the real client, not with the wrapper, and not intended."""
        return self.passing_real - self.passing_wrapper - set(self.suite.intended)

    def lines(self) -> Iterator[str]:
        yield (
            f"{self.name} ({self.suite.repo}@{self.suite.commit[:12]}): "
            f"{len(self.real)} run, {len(self.suite.set_aside)} set aside; "
            f"passing: real {len(self.passing_real)}, wrapper {len(self.passing_wrapper)}"
        )
        for test in sorted(self.passing_real - self.passing_wrapper):
            why = self.suite.intended.get(test)
            label = f"intended: {why}" if why else "REGRESSION"
            yield f"  {test}: {self.wrapper.get(test, 'missing')} with the wrapper ({label})"
        for test in sorted(self.passing_wrapper - self.passing_real):
            yield f"  {test}: passes with the wrapper only (real: {self.real.get(test)})"


@contextmanager
def _broker(kind: str) -> Iterator[str]:
    """A one-node broker of ``kind`` (``rabbitmq``, ``kafka``) started through
    :mod:`msgsafe.cluster`: its ``host:port``. ``none``: the suite brings its own peer."""
    if kind == "none":
        yield ""
    elif kind == "rabbitmq":
        rabbit = RabbitCluster(size=1)
        rabbit.start()
        try:
            yield f"127.0.0.1:{rabbit.port(0)}"
        finally:
            rabbit.stop()
    elif kind == "kafka":
        kafka = KafkaCluster(nodes=1)
        kafka.start()
        try:
            yield kafka.bootstrap
        finally:
            kafka.stop()
    else:
        raise SystemExit(f"no broker of kind {kind!r}")


def compare(name: str, checkout: Path, work: Path) -> Comparison:
    suite = SUITES[name]
    with _broker(suite.broker) as address:
        real = run_side(checkout, suite, wrapper=False, address=address, work=work / name)
        wrapped = run_side(checkout, suite, wrapper=True, address=address, work=work / name)
    return Comparison(name, real, wrapped, suite)


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkout",
        action="append",
        required=True,
        metavar="CLIENT=DIR",
        help=f"a checkout of the client's repository; CLIENT is one of {sorted(SUITES)}",
    )
    args = parser.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory(prefix="client-suites-") as tmp:
        for item in args.checkout:
            name, _, directory = item.partition("=")
            if name not in SUITES or not directory:
                parser.error(f"--checkout {item!r}: CLIENT=DIR with CLIENT in {sorted(SUITES)}")
            comparison = compare(name, Path(directory), Path(tmp))
            for line in comparison.lines():
                out(line)
            failed = failed or bool(comparison.regressions)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The clients' own test suites, run twice on the same real broker: with the real client
and with msgsafe's wrapper, and the outcomes compared.

    python3 -m tests.thirdparty.client_suites --checkout pika=DIR --checkout confluent-kafka=DIR

``DIR`` is a checkout of the client's repository at the commit :data:`SUITES` names
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
from dataclasses import dataclass, field
from pathlib import Path

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster

#: Outcome of one test id: "passed", "failed", "error" or "skipped".
Outcomes = dict[str, str]


@dataclass(frozen=True)
class Suite:
    """One client's suite: where it comes from and how the harness runs it."""

    repo: str
    commit: str
    test_file: str
    #: Other files of the checkout the test file imports (copied as they are).
    support: tuple[str, ...]
    #: (old, new) text edits for both sides; ``{address}`` in ``new`` is the broker's.
    edits: tuple[tuple[str, str], ...]
    #: (old, new) text edits for the wrapper side only: the import swap.
    swap: tuple[tuple[str, str], ...]
    #: Test (class or function) name -> why it is not run: it reads private internals.
    set_aside: dict[str, str]
    #: Test id -> why the wrapper's outcome differs on purpose (one line each).
    intended: dict[str, str]
    #: conftest.py written next to the tests (harness changes that are not text edits).
    conftest: str = ""
    env: dict[str, str] = field(default_factory=dict)


_PIKA_CONFTEST = '''\
"""Harness: BlockingTestCaseBase without pika's private instrumentation.

Upstream _connect_params passes _impl_class and arms a test timer and an exception-leak
probe on connection._impl (pika's private SelectConnection); neither exists behind
another BlockingConnection, so both sides run without them.
"""


def pytest_collection_modifyitems(session, config, items):
    for module in {item.module for item in items}:
        base = getattr(module, "BlockingTestCaseBase", None)
        if base is None:
            continue

        def _connect_params(self, parameters, connection_class=None, impl_class=None):
            connection = (connection_class or module.pika.BlockingConnection)(parameters)
            self.addCleanup(lambda: connection.close() if connection.is_open else None)
            return connection

        base._connect_params = _connect_params
        base._instrument_io_loop_exception_leak_detection = lambda self, connection: None
'''

#: pika's acceptance tests: what each set-aside test reads of pika's private state.
_PIKA_PRIVATE = {
    "TestCreateAndCloseConnection": "asserts connection._impl.is_closing",
    "TestCreateConnectionFromTwoConfigsFirstUnreachable": "reads connection._impl.params",
    "TestMultiCloseConnectionRaisesWrongState": "asserts connection._impl.is_closing",
    "TestLostConnectionResultsInIsClosedConnectionAndChannel": "shuts _impl._transport._sock",
    "TestCreateAndCloseConnectionWithChannelAndConsumer": "asserts _impl._channels",
    "TestSuddenBrokerDisconnectBeforeChannel": "asserts connection._impl._transport",
    "TestNoAccessToConnectionAfterConnectionLost": "asserts connection._impl._transport",
    "TestDisconnectDuringConnectionStart": "passes _impl_class (a SelectConnection subclass)",
    "TestDisconnectDuringConnectionTune": "passes _impl_class (a SelectConnection subclass)",
    "TestDisconnectDuringConnectionProtocol": "passes _impl_class (a SelectConnection subclass)",
    "TestConnectionRegisterForBlockAndUnblock": "calls _impl._process_frame",
    "TestBlockedConnectionTimeout": "calls connection._impl._on_connection_blocked",
    "TestAddTimeoutRemoveTimeout": "builds blocking_connection._TimerEvt",
    "TestRemoveTimeoutFromTimeoutCallback": "asserts connection._ready_events",
    "TestConnectionProperties": "asserts connection._impl.is_closing",
    "TestCreateAndCloseChannel": "asserts channel._impl.is_closing",
    "TestConfirmDeliveryAfterUnroutableMessage": "asserts channel._pending_events",
    "TestUnroutableMessagesReturnedInNonPubackMode": "asserts channel._pending_events",
    "TestUnroutableMessageReturnedInPubackMode": "asserts channel._pending_events",
    "TestBasicPublishDeliveredWhenPendingUnroutable": "asserts channel._pending_events",
    "TestPublishAndConsumeWithPubacksAndQosOfOne": "asserts channel._pending_events",
    "TestTwoBasicConsumersOnSameChannel": "asserts channel._pending_events",
    "TestBasicCancelPurgesPendingConsumerCancellationEvt": "polls channel._pending_events",
    "TestBasicPublishWithoutPubacks": "asserts channel._pending_events",
    "TestStartConsumingReturnsAfterCancelFromBroker": "asserts channel._consumer_infos",
    "TestNonPubAckPublishAndConsumeHugeMessage": "asserts channel._queue_consumer_generator",
    "TestNonPubAckPublishAndConsumeManyMessages": "asserts channel._queue_consumer_generator",
    "TestConsumeGeneratorInterruptedByCancelFromBroker": "asserts _queue_consumer_generator",
    "TestConsumeGeneratorCancelEncountersCancelFromBroker": "polls _queue_consumer_generator",
}

SUITES: dict[str, Suite] = {
    "pika": Suite(
        repo="pika/pika",
        commit="09682a233db3b2db02c93d9187f35eea885433b1",
        test_file="tests/acceptance/blocking_adapter_test.py",
        support=("tests/misc/test_utils.py", "tests/misc/forward_server.py"),
        edits=(
            ("{'port': 5672}", "{{'port': {port}}}"),
            # pika 1.4 (installed) names the module pika.compat; later pika pika._utils.
            ("from pika._utils import", "from pika.compat import"),
        ),
        swap=(("import pika\nimport pika.exceptions\n", "import msgsafe.compat.pika as pika\n"),),
        set_aside=_PIKA_PRIVATE,
        intended={},
        conftest=_PIKA_CONFTEST,
    ),
    "confluent-kafka": Suite(
        repo="confluentinc/confluent-kafka-python",
        commit="01bc439c9e837e535722a05ed581ed46d2200641",
        test_file="tests/test_Producer.py",
        support=("tests/common/__init__.py",),
        edits=(
            ("localhost:9092", "{address}"),
            ("127.0.0.1:9092", "{address}"),
            # The avro extra (avro, requests) is not a msgsafe dependency: without it the
            # one test that makes an AvroProducer gets the ImportError it skips on.
            (
                "from confluent_kafka.avro import AvroProducer\n",
                "try:\n    from confluent_kafka.avro import AvroProducer\n"
                "except ImportError as _no_avro:\n"
                "    def AvroProducer(*args, _exc=_no_avro, **kwargs):\n"
                "        raise ImportError(str(_exc))\n",
            ),
        ),
        swap=(
            (
                "from confluent_kafka import Producer,",
                "from msgsafe.compat.confluent_kafka import Producer,",
            ),
        ),
        set_aside={},
        intended={
            "test_transaction_api": "transactional.id is refused: msgsafe's transactional "
            "outbox replaces Kafka transactions",
        },
    ),
}


def _copy_tree(checkout: Path, suite: Suite, root: Path, *, wrapper: bool, address: str) -> None:
    """The suite's files under ``root`` with the harness edits of ``suite``."""
    for name in (suite.test_file, *suite.support):
        source = checkout / name
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not source.exists():
            continue  # an optional helper this commit does not have
        if name != suite.test_file:
            shutil.copyfile(source, target)
            continue
        text = source.read_text()
        port = address.rsplit(":", 1)[-1]
        for old, new in suite.edits + (suite.swap if wrapper else ()):
            if old not in text:
                raise SystemExit(f"{suite.repo}:{name}: harness edit not applicable: {old!r}")
            text = text.replace(old, new.format(address=address, port=port))
        target.write_text(text)
    for directory in {p.parent for p in root.rglob("*.py")} | {root / "tests"}:
        init = directory / "__init__.py"
        if directory != root and not init.exists():
            init.write_text("")
    if suite.conftest:
        (root / "conftest.py").write_text(suite.conftest)


def _outcomes(report: Path) -> Outcomes:
    """Test id (``Class::test`` or function name with parameters) -> outcome."""
    outcomes: Outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        klass = case.get("classname", "").rsplit(".", 1)[-1]
        name = case.get("name", "")
        key = name if klass[:1].islower() else f"{klass}::{name}"
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
    deselect = [f"--deselect={suite.test_file}::{name}" for name in suite.set_aside]
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
            suite.test_file,
            "-q",
            "-p",
            "no:cacheprovider",
            "--timeout=120",
            f"--junitxml={report}",
            *deselect,
        ],
        cwd=root,
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _outcomes(report)


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
def _broker(name: str) -> Iterator[str]:
    """A one-node broker for the suite: its ``host:port``."""
    if name == "pika":
        rabbit = RabbitCluster(size=1)
        rabbit.start()
        try:
            yield f"127.0.0.1:{rabbit.port(0)}"
        finally:
            rabbit.stop()
    else:
        kafka = KafkaCluster(nodes=1)
        kafka.start()
        try:
            yield kafka.bootstrap
        finally:
            kafka.stop()


def compare(name: str, checkout: Path, work: Path) -> Comparison:
    suite = SUITES[name]
    with _broker(name) as address:
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

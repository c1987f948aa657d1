"""A quiet library: an application that configured no logging sees nothing on stderr
during an outage; one that logs at WARNING sees one concise line per state change (not
one per retry), and no third-party exception text or traceback.

Each case runs in a child process (logging is process-global) against a loopback port
nothing listens on, sending for a few seconds so that every adapter retries many times.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support.ports import refused_port

SCHEMES = ["amqp", "amqp10", "kafka"]
#: Seconds of outage each child sends through: several reconnect rounds.
OUTAGE_S = 3.0

CHILD = textwrap.dedent(
    """
    import logging, sys, time
    if sys.argv[2] != "none":
        logging.basicConfig(level=sys.argv[2].upper(), format="%(levelname)s %(name)s: %(message)s")
    import msgsafe
    from msgsafe.errors import ConnectError
    options = {"librdkafka": {"debug": sys.argv[4]}} if len(sys.argv) > 4 else {}
    producer = msgsafe.Producer(sys.argv[1], outbox=False, **options)
    deadline = time.monotonic() + float(sys.argv[3])
    sent = failed = 0
    while time.monotonic() < deadline:
        sent += 1
        try:
            producer.send("orders", b"x")
        except ConnectError:
            failed += 1
        time.sleep(0.05)  # pacing the loop, not synchronisation
    producer.close()
    print(sent, failed)
    """
)


def _run(scheme: str, mode: str, *extra: str) -> tuple[str, str]:
    """Run CHILD against a refusing port: ``mode`` is ``none`` (no logging configured)
    or the level logging is configured at; ``extra``: librdkafka's ``debug`` setting."""
    url = f"{scheme}://127.0.0.1:{refused_port()}/"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url, mode, str(OUTAGE_S), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    sent, failed = (int(n) for n in done.stdout.split())
    assert sent == failed and sent > 10, done.stdout  # every send was answered, typed
    return done.stdout, done.stderr


@pytest.mark.parametrize("scheme", SCHEMES)
def test_unconfigured_logging_prints_nothing(scheme: str) -> None:
    _, stderr = _run(scheme, "none")
    assert stderr == ""


@pytest.mark.parametrize("scheme", SCHEMES)
def test_one_concise_line_per_outage_at_warning(scheme: str) -> None:
    _, stderr = _run(scheme, "warning")
    lines = stderr.splitlines()
    assert 1 <= len(lines) <= 2, stderr
    assert all(line.startswith("WARNING msgsafe") for line in lines), stderr
    for noise in ("Traceback", "AMQPConnectionWorkflowFailed", "pika", "proton.", "Error("):
        assert noise not in stderr, stderr


@pytest.mark.parametrize("mode", ["none", "debug"])
def test_librdkafka_debug_lines_go_to_logging_not_stderr(mode: str) -> None:
    """A ``debug`` setting raises librdkafka's log level; its lines still go through
    ``logging`` (the ``msgsafe.librdkafka`` logger), never straight to stderr."""
    _, stderr = _run("kafka", mode, "broker")
    raw_lines = [line for line in stderr.splitlines() if line.startswith("%")]
    assert raw_lines == [], stderr[-2000:]
    if mode == "none":
        assert stderr == ""
    else:
        assert "DEBUG msgsafe.librdkafka: " in stderr, stderr[-2000:]
        assert "Connect to ipv4#127.0.0.1" in stderr, stderr[-2000:]

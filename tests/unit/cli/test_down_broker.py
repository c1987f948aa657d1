"""``msgsafe verify`` against a broker that is down ends within its documented limit,
names the real cause with a non-zero exit, never prints a third-party traceback, and
never says ``lost = 0`` about messages that were never accepted."""

from __future__ import annotations

import pytest

from tests.support.commands import msgsafe
from tests.support.ports import refused_port

SCHEMES = ["amqp", "amqp10", "kafka"]
#: Documented: against a down broker verify answers within connect_timeout (2 s) plus
#: start-up; asserted with a wide margin for a loaded machine.
LIMIT_S = 30.0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_verify_against_a_down_broker_names_the_cause(scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:{refused_port()}/"
    done = msgsafe("verify", url, "orders", "--count", "20")
    text = done.stdout + done.stderr
    assert done.code == 3, text
    assert done.seconds < LIMIT_S, done.seconds
    assert "refused" in text.lower(), text
    assert "Traceback" not in text and "pika" not in text, text
    assert "lost = 0" not in text, text


@pytest.mark.parametrize("scheme", SCHEMES)
def test_doctor_against_a_down_broker_names_the_cause(scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:{refused_port()}/"
    done = msgsafe("doctor", url)
    text = done.stdout + done.stderr
    assert done.code == 3, text
    assert done.seconds < LIMIT_S, done.seconds
    assert "Traceback" not in text and "ERROR pika" not in text, text
    assert len(text.strip().splitlines()) == 1, text
    assert "connection refused" in text.lower(), text

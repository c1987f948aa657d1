"""First steps: the first example a reader meets (the README's tour, the getting-started
page) shows what a stock broker needs, errors say how to fix them, the fast test target
is documented, the defaults table (docs/reference/configuration.md) matches the code, and
an option given twice with different values is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import msgsafe
from msgsafe.adapters._config import TransportOptions
from msgsafe.adapters.rabbitmq._confirms import unroutable
from msgsafe.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
GETTING_STARTED = (ROOT / "docs" / "getting-started" / "service.md").read_text()
CONFIGURATION = (ROOT / "docs" / "reference" / "configuration.md").read_text()


@pytest.mark.parametrize("page", [README, GETTING_STARTED], ids=["README", "getting-started"])
def test_first_example_declares_its_queue(page: str) -> None:
    first = re.search(r"```python\n(.*?)```", page, re.S)
    assert first is not None
    assert 'declare="quorum"' in first.group(1)
    assert "127.0.0.1:5672" in first.group(1)


def test_unroutable_says_how_to_fix_it() -> None:
    text = str(unroutable("orders", "amqp://127.0.0.1:5672"))
    assert "no queue bound for 'orders'" in text and "declare=" in text


def test_readme_shows_the_fast_test_target_that_exists() -> None:
    assert "make test-fast" in README
    assert re.search(r"^test-fast:", (ROOT / "Makefile").read_text(), re.M)


def test_defaults_table_matches_the_code() -> None:
    defaults = TransportOptions()
    assert defaults.connect_timeout == 2.0
    assert "| `connect_timeout` | 2 s |" in CONFIGURATION
    assert defaults.confirm_timeout == 10.0
    assert "| `confirm_timeout` | 10 s |" in CONFIGURATION
    assert defaults.max_message_size == 8 * 1024 * 1024
    assert "| `max_message_size` | 8 MiB |" in CONFIGURATION
    assert defaults.max_in_flight == 1000
    assert "| `max_in_flight` | 1000 |" in CONFIGURATION


def test_url_option_contradicting_a_keyword_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="given twice"):
        msgsafe.Producer("memory://steps?confirm_timeout=6", confirm_timeout=5, outbox=False)


def test_url_option_agreeing_with_a_keyword_is_accepted() -> None:
    producer = msgsafe.Producer(
        "memory://steps?confirm_timeout=5", confirm_timeout=5.0, outbox=False
    )
    producer.close()

"""What every adapter shares: option coercion and the one size check."""

from __future__ import annotations

import pytest

from msgsafe.adapters._config import oversized, size_error, to_number
from msgsafe.adapters.rabbitmq.config import BROKER_MAX_MESSAGE_SIZE, RabbitOptions
from msgsafe.errors import ConfigurationError, MessageTooLarge
from msgsafe.message import Batch, Envelope


def test_size_error_counts_body_key_and_headers() -> None:
    assert size_error(Envelope("q", b"x" * 10), 10, "e") is None
    assert size_error(Envelope("q", b"x" * 8, key=b"kk"), 10, "e") is None
    error = size_error(Envelope("q", b"x" * 8, message_id="m", key=b"kkk"), 10, "e")
    assert isinstance(error, MessageTooLarge)
    assert (error.message_id, error.endpoint) == ("m", "e")
    assert "11 bytes" in error.message
    assert size_error(Envelope("q", b"x" * 7, headers={"ab": "cd"}), 10, "e") is not None


def test_oversized_batch_uses_the_same_measure() -> None:
    batch = Batch.build(
        "q", [b"x" * 8, b"x" * 9, b"x" * 3], keys=["kk", "kk", None], message_ids=["a", "b", "c"]
    )
    found = oversized(batch, 10, "e")
    assert set(found) == {1}
    assert found[1].message_id == "b"
    for index in range(len(batch)):
        single = size_error(batch.envelope(index), 10, "e")
        assert (single is None) == (index not in found)
    assert oversized(Batch.build("q", [b"x" * 10]), 10, "e") == {}
    with_headers = Batch.build("q", [b"x" * 6, b"x" * 7], headers={"ab": "cd"})
    assert set(oversized(with_headers, 10, "e")) == {1}


def test_a_broker_limit_caps_the_option() -> None:
    assert RabbitOptions(max_message_size=2**40).size_limit == BROKER_MAX_MESSAGE_SIZE
    assert RabbitOptions(max_message_size=100).size_limit == 100


def test_to_number() -> None:
    assert to_number("n", "5", int) == 5
    assert to_number("n", 5, float) == 5.0 and isinstance(to_number("n", 5, float), float)
    assert to_number("n", "2.5", float) == 2.5
    for bad, kind in ((True, int), (2.5, int), ("x", float), (None, float)):
        with pytest.raises(ConfigurationError, match="option 'n' must be"):
            to_number("n", bad, kind)  # type: ignore[type-var]

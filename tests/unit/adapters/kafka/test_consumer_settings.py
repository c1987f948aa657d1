"""The Kafka consumer's librdkafka settings: manual commits, and a prefetch that resumes
quickly once the reader has caught up."""

from __future__ import annotations

from msgsafe.adapters.kafka.config import (
    FETCH_QUEUE_BACKOFF_MS,
    KafkaOptions,
    consumer_settings,
)
from msgsafe.endpoints import parse_url

URL = parse_url("kafka://127.0.0.1:1")


def test_a_paused_prefetch_is_looked_at_again_within_tens_of_milliseconds() -> None:
    settings = consumer_settings(URL, KafkaOptions(), "g")
    assert settings["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS
    # librdkafka's own default (1000 ms) stalled a reader that fell behind a fast fetch.
    assert 0 < FETCH_QUEUE_BACKOFF_MS <= 50
    assert settings["enable.auto.commit"] is False
    assert settings["enable.auto.offset.store"] is False


def test_a_pass_through_replaces_the_fetch_queue_backoff() -> None:
    options = KafkaOptions(librdkafka={"fetch.queue.backoff.ms": "500"})
    assert consumer_settings(URL, options, "g")["fetch.queue.backoff.ms"] == "500"

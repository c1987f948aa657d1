"""URL parsing: every scheme, host lists, options; malformed input is a ConfigurationError
and nothing else; credentials never leak."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgsafe.endpoints import Endpoint, parse_url
from msgsafe.errors import ConfigurationError

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    ("url", "protocol", "tls", "endpoints"),
    [
        ("amqp://h1", "rabbitmq", False, [("h1", 5672)]),
        ("amqps://h1", "rabbitmq", True, [("h1", 5671)]),
        ("amqp://guest:guest@h1:5673,h2:5674/%2F", "rabbitmq", False, [("h1", 5673), ("h2", 5674)]),
        ("kafka://b1:9092,b2:9093", "kafka", False, [("b1", 9092), ("b2", 9093)]),
        ("kafka+ssl://b1", "kafka", True, [("b1", 9093)]),
        ("amqp10://h1:5672,[::1]:5673", "amqp10", False, [("h1", 5672), ("::1", 5673)]),
        ("amqp10s://h1", "amqp10", True, [("h1", 5671)]),
        ("AMQP://H1", "rabbitmq", False, [("H1", 5672)]),
    ],
)
def test_schemes_and_host_lists(
    url: str, protocol: str, tls: bool, endpoints: list[tuple[str, int]]
) -> None:
    parsed = parse_url(url)
    assert parsed.protocol == protocol
    assert parsed.tls is tls
    assert [(e.host, e.port) for e in parsed.endpoints] == endpoints
    assert all(e.tls is tls for e in parsed.endpoints)


def test_vhost_credentials_and_options() -> None:
    parsed = parse_url(f"amqp://user%40x:{SECRET}@h1/my%2Fvhost?heartbeat=10&declare=quorum")
    assert parsed.path == "my/vhost"
    assert parsed.username == "user@x"
    assert parsed.password is not None and parsed.password.reveal() == SECRET
    assert dict(parsed.options) == {"heartbeat": "10", "declare": "quorum"}


def test_memory_url() -> None:
    parsed = parse_url("memory://test-1")
    assert parsed.protocol == "memory"
    assert parsed.path == "test-1"
    assert parsed.redacted() == "memory://test-1"


def test_credentials_never_shown() -> None:
    parsed = parse_url(f"amqps://admin:{SECRET}@h1:5671,h2/vh?heartbeat=5")
    for text in (repr(parsed), str(parsed), parsed.redacted(), repr(parsed.password)):
        assert SECRET not in text
        assert "admin" not in text
    assert parsed.redacted() == "amqps://h1:5671,h2:5671/vh?heartbeat=5"
    assert SECRET not in pickle.dumps(parsed.redacted()).decode("latin-1")


@pytest.mark.parametrize(
    "url",
    [
        "",
        "h1:5672",
        "http://h1",
        "amqp://",
        "amqp://h1:",
        "amqp://h1:0",
        "amqp://h1:65536",
        "amqp://h1:port",
        "amqp://h1,,h2",
        "amqp://h1,h1",
        "amqp://::1:5672",
        "amqp://[::1",
        "amqp://[zz]:1",
        "amqp://:pw@h1",
        "amqp://h 1",
        "amqp://h1/a/b",
        "amqp://h1/%zz",
        "amqp://h1?x=1&x=2",
        "amqp://h1?=1",
        "amqp://h1#frag",
        "memory://",
        "memory://a,b",
        "memory://u:p@a",
    ],
)
def test_malformed_urls_raise_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_url(url)


def test_error_for_bad_url_does_not_echo_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_url(f"amqp://u:{SECRET}@h1:notaport")
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


def test_non_string_url() -> None:
    with pytest.raises(ConfigurationError):
        parse_url(42)  # type: ignore[arg-type]


url_alphabet = st.sampled_from(
    [*"abc:/@,?&=%[]#.-_ 19", "amqp://", "kafka://", "amqp10s://", "memory://", "::", "\x00", "é"]
)


@settings(max_examples=600, deadline=None)
@given(st.lists(url_alphabet, max_size=30).map("".join))
def test_fuzzed_urls_only_raise_configuration_error(text: str) -> None:
    try:
        parsed = parse_url(text)
    except ConfigurationError:
        return
    # Whatever parses must redact and round-trip through its own redacted form.
    again = parse_url(parsed.redacted())
    assert again.endpoints == parsed.endpoints
    assert again.protocol == parsed.protocol


@settings(max_examples=300, deadline=None)
@given(
    user=st.text(min_size=1, max_size=12),
    password=st.text(min_size=1, max_size=16),
    scheme=st.sampled_from(["amqp", "amqps", "kafka", "amqp10", "amqp10s"]),
)
def test_fuzzed_credentials_never_in_repr(user: str, password: str, scheme: str) -> None:
    from urllib.parse import quote

    # A marker keeps short passwords from matching innocent text such as "amqp10".
    password = "Zq9~" + password
    url = f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@h1:1234"
    parsed = parse_url(url)
    assert parsed.password is not None and parsed.password.reveal() == password
    shown = repr(parsed) + str(parsed) + parsed.redacted()
    assert "Zq9" not in shown
    assert parsed.endpoints == (Endpoint("h1", 1234, parsed.tls),)

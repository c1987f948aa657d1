"""No network: the hand-written AMQP 1.0 encoding, the failover-server-list reader and
the adapter's options, checked against proton's own codec where one exists."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message, symbol

from msgsafe.adapters.amqp10._failover import parse_failover_list
from msgsafe.adapters.amqp10._wire import encode_message
from msgsafe.adapters.amqp10.config import load_options
from msgsafe.endpoints import Endpoint, MergePolicy, parse_url
from msgsafe.errors import ConfigurationError

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)


@settings(max_examples=100, deadline=None)
@given(
    message_id=_text.filter(bool),
    body=st.binary(max_size=70_000),
    properties=st.dictionaries(_text, st.one_of(_text, st.binary(max_size=300)), max_size=40),
)
def test_encoded_message_decodes_with_proton(
    message_id: str, body: bytes, properties: dict[str, str | bytes]
) -> None:
    decoded = Message()
    decoded.decode(encode_message(message_id, body, properties))
    assert decoded.id == message_id
    assert decoded.durable is True
    assert bytes(decoded.body) == body
    got = {
        k: (bytes(v) if isinstance(v, memoryview) else v)
        for k, v in (decoded.properties or {}).items()
    }
    assert got == properties


def test_failover_list_as_qpid_sends_it() -> None:
    current = Endpoint("10.0.0.1", 5672, tls=False)
    props = {
        symbol("failover-server-list"): [
            {
                symbol("network-host"): "10.0.0.2",
                symbol("hostname"): "b.example",
                symbol("port"): 5673,
            },
            {symbol("hostname"): "c.example", symbol("port"): 5671, symbol("scheme"): "amqps"},
            {"network-host": "d.example"},
            {symbol("hostname"): "", symbol("port"): 1},
            {symbol("hostname"): "e.example", symbol("port"): 70000},
            {symbol("hostname"): "f.example", symbol("scheme"): "gopher"},
            "not a map",
        ]
    }
    assert parse_failover_list(props, current=current) == [
        Endpoint("10.0.0.2", 5673, tls=False),
        Endpoint("c.example", 5671, tls=True),
        Endpoint("d.example", 5672, tls=False),
    ]
    assert parse_failover_list({}, current=current) == []
    assert parse_failover_list(None, current=current) == []
    assert parse_failover_list({"failover-server-list": "x"}, current=current) == []


def test_options_parse_merge_policy_and_allow_list() -> None:
    url = parse_url("amqp10://h1:5672?failover_merge=ADD&failover_allow=h2,h3:5673,[::1]:5674")
    opts = load_options(url, {"credit": 7})
    assert opts.merge_policy is MergePolicy.ADD
    assert opts.credit == 7
    assert opts.allows(Endpoint("h2", 1)) and opts.allows(Endpoint("H3", 5673))
    assert not opts.allows(Endpoint("h3", 5672)) and not opts.allows(Endpoint("h4", 5672))
    assert opts.allows(Endpoint("::1", 5674))
    assert load_options(parse_url("amqp10://h1"), {}).allows(Endpoint("anything", 1))
    for bad in ({"credit": 0}, {"failover_allow": "h:x"}, {"sasl_mechanisms": "GSSAPI"}):
        with pytest.raises(ConfigurationError):
            load_options(url, bad)


def test_adapter_logs_nothing_secret(caplog: pytest.LogCaptureFixture) -> None:
    from msgsafe.adapters import open_transport
    from msgsafe.message import Envelope

    caplog.set_level(logging.DEBUG)
    url = parse_url("amqp10://user:s3cret-pw@127.0.0.1:1")
    transport = open_transport(url, {"confirm_timeout": 0.5})
    try:
        err = transport.publish(Envelope.build("q", b"x")).exception(5)
        assert err is not None and "s3cret-pw" not in str(err)
        assert "s3cret-pw" not in repr(transport)
    finally:
        transport.close(0)
    assert all("s3cret-pw" not in r.getMessage() for r in caplog.records)

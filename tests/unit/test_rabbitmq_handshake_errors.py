"""pika's "probable authentication error" guesses: a connection dropped during the
handshake (a node booting, stopping or pausing) is transient; a broker's refusal is not."""

from __future__ import annotations

from pika import exceptions as pe

from msgsafe.adapters.rabbitmq._errors import open_error
from msgsafe.errors import AuthenticationError, ConnectError


def _lost() -> pe.StreamLostError:
    return pe.StreamLostError("Stream connection lost: ConnectionResetError(104, 'reset')")


def test_stream_lost_after_start_ok_is_a_connect_error() -> None:
    err = open_error(pe.ProbableAuthenticationError(repr(_lost())), "127.0.0.1:5672")
    assert isinstance(err, ConnectError)


def test_stream_lost_after_tune_ok_is_a_connect_error() -> None:
    err = open_error(pe.ProbableAccessDeniedError(repr(_lost())), "127.0.0.1:5672")
    assert isinstance(err, ConnectError)


def test_broker_refusal_stays_an_authentication_error() -> None:
    closed = pe.ConnectionClosedByBroker(403, "ACCESS_REFUSED - Login was refused")
    err = open_error(pe.ProbableAuthenticationError(repr(closed)), "127.0.0.1:5672")
    assert isinstance(err, AuthenticationError)

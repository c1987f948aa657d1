"""``msgsafe.compat.pika.URLParameters`` reads msgsafe's multi-host URL (what ``msgsafe
cluster up rabbitmq --nodes 3`` prints), which pika's own refuses; the connection takes
its hosts as a list's. No broker: the connection's URL is read, nothing is opened."""

from __future__ import annotations

import pika as real_pika
import pytest

from msgsafe.compat import pika
from msgsafe.compat._pika_config import connection_url
from msgsafe.compat.pika._url import expand, split_hosts
from msgsafe.errors import ConfigurationError

THREE = "amqp://guest:s3cret@127.0.0.1:5672,127.0.0.1:5673,127.0.0.1:5674"


def test_pikas_own_url_parameters_refuse_the_three_node_url() -> None:
    with pytest.raises(ValueError, match="Port could not be cast to integer"):
        real_pika.URLParameters(THREE)


def test_the_three_node_url_is_its_first_host_with_the_others_to_fail_over_to() -> None:
    params = pika.URLParameters(THREE)
    assert isinstance(params, real_pika.URLParameters)
    assert (params.host, params.port, params.virtual_host) == ("127.0.0.1", 5672, "/")
    assert [(p.host, p.port) for p in params.fail_over] == [
        ("127.0.0.1", 5673),
        ("127.0.0.1", 5674),
    ]
    for p in params.fail_over:
        assert p.credentials == params.credentials and p.virtual_host == "/"
    url, _ = connection_url(expand([params]))
    assert url.startswith("amqp://guest:s3cret@127.0.0.1:5672,127.0.0.1:5673,127.0.0.1:5674")


def test_path_and_query_hold_for_every_host() -> None:
    params = pika.URLParameters("amqp://u:p@h1:5672,h2:5673/%2Fv?heartbeat=7")
    assert [(p.host, p.virtual_host, p.heartbeat) for p in [params, *params.fail_over]] == [
        ("h1", "/v", 7),
        ("h2", "/v", 7),
    ]


def test_one_host_is_pikas_url_unchanged() -> None:
    url = "amqp://u:p@h1:5672/%2F"
    assert split_hosts(url) == [url]
    assert pika.URLParameters(url) == real_pika.URLParameters(url)
    assert pika.URLParameters(url).fail_over == []


def test_an_empty_host_is_a_configuration_error_without_the_password() -> None:
    with pytest.raises(ConfigurationError) as caught:
        pika.URLParameters("amqp://u:s3cret@h1:5672,,h2:5673/")
    assert "s3cret" not in str(caught.value)


def test_the_connection_takes_every_host_of_the_url() -> None:
    connection = pika.BlockingConnection(pika.URLParameters(THREE), lazy=True, outbox=False)
    try:
        assert [(p.host, p.port) for p in connection._parameters] == [
            ("127.0.0.1", 5672),
            ("127.0.0.1", 5673),
            ("127.0.0.1", 5674),
        ]
    finally:
        connection.close()

"""Stored messages follow the destination, not the URL's spelling, on a real RabbitMQ;
and ``msgsafe outbox drain PATH`` forwards a file to the broker its rows name.

Every node of the session cluster sits behind a fault proxy. With all of them refusing,
messages are STORED under one spelling of the URL; then the URL is edited five ways (an
option added, ``localhost`` for ``127.0.0.1``, the hosts in another order, an option
moved from the query string to a keyword argument, the vhost left implicit): every
producer finds the same outbox with everything stored so far, and the last one, with the
brokers back, delivers all of it. Counted: every receipted id is consumed, lost 0.

``drain`` with a wrong password stops at the refused login and quarantines nothing; with
no ``--url`` it forwards to the broker the rows were stored for (guest, the default
login), and every id is consumed.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from msgsafe.retry import RetryPolicy
from msgsafe.testing.faultproxy import FaultProxies
from tests.support.commands import msgsafe as run_msgsafe
from tests.support.ledger import Ledger, receive_receipted
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

FIRST = 300  #: stored under the first spelling
EACH = 50  #: stored under each further spelling while the brokers still refuse


def test_stored_messages_survive_five_respellings_of_the_url(
    rabbit_cluster: RabbitCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    queue = f"respell-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    upstreams = [("127.0.0.1", rabbit_cluster.port(i)) for i in range(rabbit_cluster.size)]
    with FaultProxies(upstreams, connect_timeout=2.0) as proxies:
        a, b, c = (proxy.port for proxy in proxies)
        user = "amqp://guest:guest@"
        first = (f"{user}127.0.0.1:{a},127.0.0.1:{b},127.0.0.1:{c}/%2F?declare=quorum", {})
        respelled: list[tuple[str, dict[str, object]]] = [
            (first[0] + "&confirm_timeout=6", {}),
            (f"{user}localhost:{a},localhost:{b},localhost:{c}/%2F?declare=quorum", {}),
            (
                f"{user}127.0.0.1:{c},127.0.0.1:{a},127.0.0.1:{b}/%2F"
                "?confirm_timeout=6&declare=quorum",
                {},
            ),
            (
                f"{user}127.0.0.1:{b},localhost:{c},127.0.0.1:{a}/%2F",
                {"declare": "quorum", "confirm_timeout": 6},
            ),
            # The last one forwards: the brokers are back by then.
            (f"{user}localhost:{c},127.0.0.1:{a},localhost:{b}?heartbeat=5", {"declare": "quorum"}),
        ]
        proxies.refuse()
        paths: set[Path] = set()
        started = time.monotonic()
        for index, (url, options) in enumerate([first, *respelled[:-1]]):
            producer = msgsafe.Producer(url, send_timeout=10, connect_timeout=1.0, **options)  # type: ignore[arg-type]
            try:
                assert producer.pending() == len(ledger.receipted), (
                    f"spelling {index} does not see what was stored before: {url}"
                )
                store = producer.outbox
                assert store is not None
                paths.add(store.path)  # type: ignore[attr-defined]
                for i in range(FIRST if index == 0 else EACH):
                    receipt = producer.send(queue, f"s{index}-{i}".encode(), key=f"k{i % 5}")
                    ledger.sent.add(receipt.message_id)
                    assert receipt.status is msgsafe.Status.STORED, receipt
                    ledger.receipted.add(receipt.message_id)
            finally:
                producer.close(10)
        stored_s = time.monotonic() - started
        assert paths and len(paths) == 1, f"one outbox for one destination, not {paths}"
        proxies.heal()
        url, options = respelled[-1]
        healed = time.monotonic()
        producer = msgsafe.Producer(
            url,
            send_timeout=10,
            connect_timeout=1.0,
            retry=RetryPolicy(initial=0.1, maximum=1.0),
            **options,  # type: ignore[arg-type]
        )
        try:
            assert producer.outbox is not None and producer.outbox.path in paths  # type: ignore[attr-defined]
            assert producer.pending() == len(ledger.receipted)
            wait_until(lambda: producer.pending() == 0, 120, "the outbox to drain")
            drained_s = time.monotonic() - healed
        finally:
            producer.close(10)
    receive_receipted(rabbit_cluster.cluster_url(), queue, ledger, deadline_s=120)
    print(f"{ledger.report('five respellings')} stored_s={stored_s:.1f} drained_s={drained_s:.1f}")
    assert len(ledger.receipted) == FIRST + 4 * EACH
    assert not ledger.lost
    assert not ledger.unknown


def test_drain_forwards_to_the_broker_the_rows_name(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    queue = f"drain-{uuid.uuid4().hex[:8]}"
    port = rabbit_cluster.port(0)
    path = tmp_path / "stored.sqlite3"
    store = SqliteOutbox(path, target=f"amqp://127.0.0.1:{port}/%2F?declare=quorum")
    envelopes = [Envelope.build(queue, f"d{i}".encode(), key=f"k{i % 3}") for i in range(200)]
    store.put(envelopes)
    store.close()
    ledger = Ledger(
        sent={e.message_id for e in envelopes}, receipted={e.message_id for e in envelopes}
    )

    wrong = run_msgsafe(
        "outbox",
        "drain",
        str(path),
        "--url",
        f"amqp://guest:wrong@127.0.0.1:{port}/%2F",
        "--timeout",
        "20",
        "-o",
        "declare=quorum",
        timeout=180,
    )
    assert wrong.code == 3, wrong.stderr
    assert "AuthenticationError" in wrong.stderr and "--url" in wrong.stderr
    assert "wrong" not in wrong.stderr.replace("--url 'amqp://USER:PASSWORD", "")
    status = json.loads(run_msgsafe("outbox", "status", str(path), "--json", timeout=180).stdout)
    assert status["waiting"] == 200 and status["quarantined"] == 0

    drained = run_msgsafe("outbox", "drain", str(path), "--json", timeout=180)
    assert drained.code == 0, drained.stderr
    assert json.loads(drained.stdout)["delivered"] == 200
    receive_receipted(rabbit_cluster.node_url(0), queue, ledger, deadline_s=60)
    print(ledger.report("drain from the rows"))
    assert not ledger.lost and not ledger.unknown

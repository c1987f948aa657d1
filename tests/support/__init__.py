"""What the test suite needs and users do not: stand-in peers and namespaced labs.

- :mod:`.amqp10_peer` — a small AMQP 1.0 peer (proton) for what no broker can be made
  to send: redirects, arbitrary advertised lists, outcomes per address (its docstring
  lists the tests that need it);
- :mod:`.netns` — network namespaces: hosts that can be cut off from each other;
- :mod:`.rabbit_lab` — a RabbitMQ cluster with one node per namespaced host;
- :mod:`.qpid_lab` — a Qpid Broker-J BDB HA group with one node per namespaced host;
- :mod:`.kafka_mock` — librdkafka's in-process mock cluster (per-request errors);
- :mod:`.ledger` — the loss ledger: ids sent, receipted and received (lost, unknown,
  duplicates, per-key order), and publishing/receiving into it through the ports;
- :mod:`.kafka_ledger` — readers of a Kafka topic that count what it holds per id;
- :mod:`.fast_path_ledger` — the ledger fed by the Kafka wrapper's delivery callbacks;
- :mod:`.waiting` — ``wait_until``: polling a condition against a deadline;
- :mod:`.commands` — ``msgsafe``, an example or any Python run in a child process.
- :mod:`.ports` — ``refused_port``: a loopback port nothing listens on.

The real brokers are launched by :mod:`msgsafe.cluster`; the in-process doubles users
get are in :mod:`msgsafe.testing`.
"""

"""What the test suite needs and users do not: stand-in peers and namespaced labs.

- :mod:`.amqp10_peer` — a small AMQP 1.0 peer (proton) for what no broker can be made
  to send: redirects, arbitrary advertised lists, outcomes per address (its docstring
  lists the tests that need it);
- :mod:`.netns` — network namespaces: hosts that can be cut off from each other;
- :mod:`.rabbit_lab` — a RabbitMQ cluster with one node per namespaced host;
- :mod:`.qpid_lab` — a Qpid Broker-J BDB HA group with one node per namespaced host;
- :mod:`.kafka_mock` — librdkafka's in-process mock cluster (per-request errors);
- :mod:`.kafka_ledger` — ids sent, receipted and received, and readers of a topic.

The real brokers are launched by :mod:`msgsafe.cluster`; the in-process doubles users
get are in :mod:`msgsafe.testing`.
"""

"""Loopback ports for the tests of a broker that is down."""

from __future__ import annotations

import socket


def refused_port() -> int:
    """A loopback port nothing listens on: a connect to it is refused at once.

    The port was free a moment ago (bound, then closed); another process may take it
    later, which the tests that use it tolerate (they read it at once).
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port

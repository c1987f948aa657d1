"""How the Broker-J launcher reads a node's role and its virtual host's state: through
the REST query API, selecting only those attributes (a full ``GET virtualhostnode``
evaluates derived attributes that throw while a node's BDB environment restarts, and
Broker-J halts on that). A local HTTP server stands in for the node's management port:
what is checked is the request the launcher makes and how it reads the answer."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest

from msgsafe.cluster.qpid import QpidCluster


class _Node(BaseHTTPRequestHandler):
    answers: ClassVar[dict[str, Any]] = {}
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        parts = urlsplit(self.path)
        found = self.answers.get(parts.path)
        body = json.dumps(found).encode() if found is not None else b"{}"
        self.send_response(200 if found is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[QpidCluster, type[_Node]]]:
    handler = type("Node", (_Node,), {"answers": {}, "asked": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cluster = QpidCluster(nodes=1, dir=tmp_path)
    cluster.http_ports = [server.server_address[1]]
    # The launcher asks only nodes it believes run: this process stands in for it.
    cluster.pids = [os.getpid()]
    cluster._running = lambda node: True  # type: ignore[method-assign]
    cluster._paused = lambda node: False  # type: ignore[method-assign]
    try:
        yield cluster, handler
    finally:
        server.shutdown()
        server.server_close()


def test_role_selects_only_the_role(node: tuple[QpidCluster, type[_Node]]) -> None:
    cluster, handler = node
    handler.answers["/api/latest/querybroker/virtualhostnode"] = {
        "headers": ["name", "role"],
        "results": [["someone-else", "REPLICA"], [cluster.name(0), "MASTER"]],
        "total": 2,
    }
    assert cluster.role(0) == "master"
    (asked,) = handler.asked
    parts = urlsplit(asked)
    assert parts.path == "/api/latest/querybroker/virtualhostnode"
    assert parse_qs(parts.query) == {"select": ["name,role"]}


def test_a_node_that_does_not_list_itself_has_no_role(
    node: tuple[QpidCluster, type[_Node]],
) -> None:
    cluster, handler = node
    handler.answers["/api/latest/querybroker/virtualhostnode"] = {
        "headers": ["name", "role"],
        "results": [["someone-else", "MASTER"]],
    }
    assert cluster.role(0) is None
    handler.answers.clear()  # 404: an old broker without the query API, or a restart
    assert cluster.role(0) is None


def test_the_virtual_host_is_active_only_when_its_state_says_so(
    node: tuple[QpidCluster, type[_Node]],
) -> None:
    cluster, handler = node
    path = "/api/latest/querybroker/virtualhost"
    handler.answers[path] = {"headers": ["name", "state"], "results": [["msgsafe", "ACTIVE"]]}
    assert cluster._virtualhost_active(0)
    assert parse_qs(urlsplit(handler.asked[-1]).query) == {"select": ["name,state"]}
    handler.answers[path] = {"headers": ["name", "state"], "results": [["msgsafe", "UNAVAILABLE"]]}
    assert not cluster._virtualhost_active(0)


def test_mastership_is_handed_over_by_setting_the_nodes_role(
    node: tuple[QpidCluster, type[_Node]],
) -> None:
    """Broker-J's "transfer mastership": a POST of role MASTER to the replica's own
    virtual host node; the launcher then waits until the node is master."""
    cluster, handler = node
    posted: list[tuple[str, Any]] = []
    roles = "/api/latest/querybroker/virtualhostnode"
    handler.answers[roles] = {
        "headers": ["name", "role"],
        "results": [[cluster.name(0), "REPLICA"]],
    }
    handler.answers["/api/latest/querybroker/virtualhost"] = {
        "headers": ["name", "state"],
        "results": [[cluster.group, "ACTIVE"]],
    }

    def do_POST(self: _Node) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        posted.append((self.path, body))
        self.answers[roles] = {
            "headers": ["name", "role"],
            "results": [[cluster.name(0), "MASTER"]],
        }
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    handler.do_POST = do_POST  # type: ignore[attr-defined]
    cluster.transfer_master(0, timeout=5.0)
    assert posted == [(f"/api/latest/virtualhostnode/{cluster.name(0)}", {"role": "MASTER"})]
    cluster.transfer_master(0, timeout=5.0)  # master already: nothing posted
    assert len(posted) == 1

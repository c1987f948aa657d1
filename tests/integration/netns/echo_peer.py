"""A tiny TCP echo peer run inside lab namespaces: ``server PORT``, ``client HOST PORT``,
``probe HOST PORT``.

``client`` keeps one connection and prints ``echo <n>`` for each line echoed back, so a
test can watch traffic stop on a cut and resume on heal. ``probe`` exits 0 when one
round trip completes within a second, 1 otherwise.
"""

from __future__ import annotations

import socket
import sys
import threading
import time


def _serve_one(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def server(port: int) -> None:
    with socket.create_server(("0.0.0.0", port), reuse_port=False) as listener:
        print("listening", flush=True)
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


def client(host: str, port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    sock.settimeout(None)  # a cut must block, not fail: TCP retransmits until heal
    reader = sock.makefile("rb")
    n = 0
    while True:
        n += 1
        sock.sendall(f"{n}\n".encode())
        line = reader.readline()
        if not line:
            print("eof", flush=True)
            return
        print(f"echo {int(line)}", flush=True)
        time.sleep(0.02)  # pace: about 50 round trips a second


def probe(host: str, port: int) -> int:
    try:
        with socket.create_connection((host, port), timeout=1) as sock:
            sock.settimeout(1)
            sock.sendall(b"probe")
            return 0 if sock.recv(5) == b"probe" else 1
    except OSError:
        return 1


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "server":
        server(int(args[0]))
    elif mode == "client":
        client(args[0], int(args[1]))
    elif mode == "probe":
        sys.exit(probe(args[0], int(args[1])))
    else:
        sys.exit(f"unknown mode {mode!r}")

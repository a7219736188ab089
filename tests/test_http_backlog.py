"""The HTTP consumers' listen backlog holds a burst of concurrent connections: with socketserver's
default of 5, the kernel dropped the handshakes of the rest while the accept loop was busy (64
concurrent range reads on the dashboard: 12 clients got a connection reset, neither an answer
nor a 503). Checked on the real server classes, before they accept anything: every handshake of
a burst completes in the kernel's queue."""
from __future__ import annotations

import select
import socket
import time

import pytest

from telemetry.consumers.dashboard.live import Hub
from telemetry.consumers.dashboard.server import DashboardServer
from telemetry.consumers.prometheus import MetricsServer

BURST = 64


def _completed_handshakes(port: int) -> int:
    socks = []
    try:
        for _ in range(BURST):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            socks.append(c)
        done: set = set()
        deadline = time.monotonic() + 10        # a hang detector: the queue takes them at once
        while time.monotonic() < deadline and len(done) < BURST:
            _, writable, _ = select.select([], [c for c in socks if c not in done], [], 0.2)
            done.update(c for c in writable if c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
        return len(done)
    finally:
        for c in socks:
            c.close()


@pytest.mark.parametrize("which", ["dashboard", "exporter"])
def test_a_burst_of_connections_waits_in_the_backlog(which):
    if which == "dashboard":
        srv = DashboardServer(("127.0.0.1", 0), Hub(), token="t" * 16)
    else:
        srv = MetricsServer(("127.0.0.1", 0), registry=None, token="t" * 16)
    try:
        assert _completed_handshakes(srv.server_address[1]) == BURST
    finally:
        srv.server_close()

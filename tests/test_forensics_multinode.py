"""Multi-node forensics (issue 19): a node daemon collects the bundle for its own ranks and its
`diagnosis/*` event reaches the head through the forward link (TCP + CURVE on loopback)."""
from __future__ import annotations

import os
import signal
import time

from test_forensics_ranks import HANG, events, kill_all, start_ranks
from telemetry.tools.keygen import make_pair
from testkit import faults


def test_a_node_daemon_reports_a_killed_rank_to_the_head(tmp_path):
    keys = tmp_path / "keys"
    make_pair(keys, "head")
    allowed = keys / "allowed"
    allowed.mkdir(mode=0o700)
    pub_key, _ = make_pair(keys, "node0")
    (allowed / pub_key.name).write_bytes(pub_key.read_bytes())
    port = faults.free_port()
    head = faults.launch(
        tmp_path / "head", faults.Endpoints(), world_size=1,
        config={"security": {"server_secret_key": str(keys / "head.key_secret"),
                             "allowed_clients_dir": str(allowed), "curve_loopback": True}},
        extra=("--remote-ingest", f"tcp://127.0.0.1:{port}"))
    node_eps = faults.Endpoints()
    node = faults.launch(
        tmp_path / "node0", node_eps, world_size=2,
        config={"diagnosis": HANG, "pollers": {"nvml_enabled": False},
                "forward": {"endpoint": f"tcp://127.0.0.1:{port}", "node_rank": 0, "num_nodes": 1,
                            "server_public_key": str(keys / "head.key"),
                            "client_secret_key": str(keys / "node0.key_secret")}})
    procs = start_ranks(node_eps.ingest, 2, 10_000, "--slow-rank", "1", "--slow-phase", "forward",
                        "--slow-s", "0.01")
    try:
        node.wait_for(lambda rs: sum(r["kind"] == "metrics" for r in rs) >= 5, timeout_s=60)
        os.kill(procs[1].pid, signal.SIGKILL)
        recs = head.wait_for(lambda rs: bool(events(rs, "diagnosis/rank_exited")), timeout_s=60)
    finally:
        kill_all(procs)
    (ev,) = events(recs, "diagnosis/rank_exited")
    assert ev["data"]["exited_rank"] == 1 and ev["data"]["exit_code"] == -9, ev
    bundle = ev["data"]["bundle"]                       # written on the node, beside its log dir
    assert bundle.startswith(str(tmp_path / "node0")) and os.path.isfile(os.path.join(bundle, "summary.json"))
    node.drain()
    head.drain()
    node.cleanup()
    head.cleanup()

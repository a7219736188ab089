"""Forward a node's aggregated records to the head node's daemon (multi-node runs).

One daemon per node aggregates its local ranks; this sink sends the node's per-step records on
to the head daemon as ordinary protocol records, so the head sees one "rank" per node:

    node daemon (ranks of node n) --PUSH, TCP + CURVE, heartbeats--> head daemon's remote ingest
      metrics (aggregated, no "rank")  -> metrics record, rank = node_rank
      event                            -> event record, data gains "rank" (the original rank)
      daemon (the node's counters)     -> event "node_daemon": a visible heartbeat at the head
      hello (the first of the node,    -> hello with world_size = num_nodes, node_rank, and
        the first with the model, and     peak_flops = device peak x ranks per node (for MFU),
        the first of each new launch,     started_at as the rank's (the head's goodput ledger
        and again on each connect)        tells a job's launches apart by it), and `link`, this
                                          end of the TCP link ("ip:port"): the head names the
                                          node whose link closes without a bye
      gpu, system                      -> stay on the node unless listed in `kinds`
      bye (a rank closed its client)   -> event "rank_bye" with the rank: the head's goodput
                                          ledger tells a launch that ended from one killed

Loss accounting is the protocol's: this sink is one `src` with its own seq and in-band drop
count, so the head reports exactly what it lost from each node. During a head outage ZeroMQ
keeps up to `max_buffered` records in the socket (its SNDHWM) and sends them once the head is
back (it reconnects by itself, every `reconnect_ivl_s` up to `reconnect_ivl_max_s`); beyond
that records are dropped and counted. ZMTP heartbeats (`heartbeat_ivl_s`, `heartbeat_timeout_s`)
detect a head that vanished without closing its connection (a partition, a dead host).

What this node could not hand to a head is counted here, in stats() (status, the daemon record,
drain.json) and in a warning line, never discarded in silence; a PUSH link has no
acknowledgement, so the counts are what libzmq lets a sender know:
- refused_by_send_queue: refused by the full send queue (the head away or not reading), exact
  (the sink's `dropped` holds these and what its own queue in the daemon dropped);
- unsent_no_handshake: at the close, the link never completed its ZMTP handshake (a head that
  accepts TCP and never speaks, a CURVE key it refuses, a starved head): nothing it was handed
  can have left, so every record is counted, exact;
- unconfirmed_at_close: the link did complete its handshake, but the close's linger ran out with
  records still queued (the head gone, or not reading), or the head was not keeping up (the send
  queue refused records on this link): libzmq discards what is left at either end without saying
  how many, so this is an upper bound (the send queue's bound plus one engine batch), "not
  confirmed"; the head's own count of what it received from this node tells the exact part.
  Beyond it: bytes the head's host acknowledged and the head never read (its own to count).
The bye, with the final seq and drop count, goes on a link of its own at the close, before the
records' link lingers: a full or cut send queue would take it with the records, and the head
would not know what this node sent. With it, the head counts what never came (its held byes,
daemon/byes.py). The bye's link is counted like the records': unsent_no_handshake + 1 if it never
completed its handshake, unconfirmed_at_close + 1 if it did so only as it closed.

Across nodes the head's reductions combine node aggregates: sums of sums and max of max are
exact; the mean of node means equals the global mean when every node has the same number of
ranks (the usual torchrun/SLURM layout); with unequal nodes it is a mean of node means.

A group head (`relay`): a head of nodes that itself forwards (remote_ingest and forward, one
level more of the same code for jobs one head cannot hold: node -> group head -> job head).
What it receives is already nodes' records, so it passes them on as a group's:
      metrics (across its nodes)       -> metrics record, rank = group_rank (forward.node_rank)
      event from a node                -> its data kept (rank, node_rank) and gains group_rank
      event of its own (a diagnosis    -> data gains node_rank (the node it is about) and
        naming one of its nodes)          group_rank
      hello (a node's)                 -> hello with world_size = the number of groups,
                                          forwarded_by "group head", nodes_per_group, and
                                          peak_flops = a node's peak x nodes per group
      daemon, gpu, system (its own)    -> event group_daemon, group_gpu, group_system
      bye (a node's forwarder ended)   -> event node_bye with the node_rank
"""
from __future__ import annotations

import logging
import os
import socket as _socket
import time
from dataclasses import dataclass, field

import msgspec
import zmq

from protocol import KIND_EVENT, KIND_HELLO, KIND_METRICS, PROTOCOL_VERSION, encode_bye
from telemetry.daemon.sinks.base import Out, Sink
from telemetry.daemon.sinks.config import SinkConfig
from telemetry.shared.numbers import is_int, is_number, positive_finite

log = logging.getLogger("telemetry.daemon.sinks.forward")

FORWARD_KINDS = ("metrics", "event", "hello", "daemon", "gpu", "system")
# libzmq's engine takes messages off the send queue into a batch of this many bytes (its
# ZMQ_OUT_BATCH_SIZE default) before writing them out: at a close those may be discarded too.
_ZMQ_OUT_BATCH_BYTES = 8192
# After closing the socket, how long to wait for its monitor to report the events it saw before
# (a handshake the close raced with); the monitor stops at once, this only bounds a stuck one.
_MONITOR_STOP_WAIT_S = 1.0
# The least time the bye's socket is given to hand its one frame to the kernel once its link is
# up, even when its handshake came at the end of the close's linger.
_BYE_LINGER_MS = 200
# The least time the bye's link is given to complete its handshake (a TCP connect and ZMTP's, with
# CURVE's), even when the close's linger is shorter (close_linger_s: 0): without it the bye of a
# node whose head is there and idle would hardly ever leave. Only a node whose head was there
# waits it; the records' linger is not lengthened.
_BYE_HANDSHAKE_MIN_S = 0.5
_MAX_HWM = 2**31 - 1
# A node whose link has not completed a handshake this long after its start says so, once (a head
# that starts later than its nodes is common; one that never comes is a config to fix).
NO_LINK_WARN_S = 30.0


@dataclass(kw_only=True, slots=True)
class ForwardConfig(SinkConfig):
    """The daemon's `forward:` config section (a node daemon's link to the head); loaded with the
    rest of the daemon config (telemetry.daemon.config), which names a bad key."""

    endpoint: str = ""                 # the head daemon's remote ingest, tcp://HEAD:PORT
    node_rank: int = 0
    num_nodes: int = 1
    server_public_key: str = ""        # the head's NAME.key (telemetry keygen); "" = no CURVE
    client_secret_key: str = ""        # this node's NAME.key_secret, allow-listed on the head
    max_buffered: int = 10_000         # records held for the head during an outage, then dropped
    # A ping every interval whatever flows, answered by the head: its cost there is per link (see
    # node_links.REMOTE_HEARTBEAT_IVL_MS). A silent head is seen 5-10 s after it went silent.
    heartbeat_ivl_s: float = 5.0
    heartbeat_timeout_s: float = 5.0
    reconnect_ivl_s: float = 0.1
    reconnect_ivl_max_s: float = 2.0
    close_linger_s: float = 2.0        # at drain, how long queued records may take to reach the head
    kinds: list[str] = field(default_factory=lambda: ["metrics", "event", "hello", "daemon"])
    # And SinkConfig's knobs for its runner, whose queue sits in front of the socket's buffer.

    def __post_init__(self) -> None:
        from telemetry.shared.endpoints import is_loopback, normalize

        SinkConfig.__post_init__(self)

        if not self.endpoint.startswith("tcp://"):
            raise ValueError(f"forward.endpoint {self.endpoint!r}: expected tcp://HEAD:PORT")
        self.endpoint = normalize(self.endpoint)
        from telemetry.daemon.aggregator import MAX_WORLD_SIZE

        # The head believes a world of at most MAX_WORLD_SIZE (a hello beyond is ignored): a
        # larger count is a typo (--num-nodes 10^9), refused here rather than ignored there.
        if not 1 <= self.num_nodes <= MAX_WORLD_SIZE:
            raise ValueError(f"forward.num_nodes must be 1..{MAX_WORLD_SIZE}, got {self.num_nodes}")
        if not 0 <= self.node_rank < self.num_nodes:
            raise ValueError(f"forward.node_rank must be in 0..{self.num_nodes - 1}, got {self.node_rank}")
        if bool(self.server_public_key) != bool(self.client_secret_key):
            raise ValueError("forward.server_public_key and forward.client_secret_key go together")
        if not self.server_public_key and not is_loopback(self.endpoint):
            raise ValueError(f"forward.endpoint {self.endpoint} is beyond loopback: set "
                             "forward.server_public_key and forward.client_secret_key (CURVE)")
        for k in self.kinds:
            if k not in FORWARD_KINDS:
                raise ValueError(f"forward.kinds: {k!r} is not one of {', '.join(FORWARD_KINDS)}")
        if not 1 <= self.max_buffered <= _MAX_HWM:       # libzmq's high-water mark is a C int
            raise ValueError(f"forward.max_buffered must be 1..{_MAX_HWM}, got {self.max_buffered}")
        if self.server_public_key:
            # Read now, as the sink will at its start: a key that cannot be read refuses the
            # config (exit 2), rather than a node daemon that runs without its link to the head.
            from telemetry.shared.security.curve import SecurityError, load_public_key, load_secret_key

            for name, load in (("client_secret_key", load_secret_key), ("server_public_key", load_public_key)):
                try:
                    load(getattr(self, name))
                except SecurityError as exc:
                    raise ValueError(f"forward.{name}: {exc}") from None
        for name in ("heartbeat_ivl_s", "heartbeat_timeout_s", "reconnect_ivl_s", "reconnect_ivl_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"forward.{name} must be > 0")
        if self.close_linger_s < 0:
            raise ValueError(f"forward.close_linger_s must be >= 0, got {self.close_linger_s}")


class ForwardSink(Sink):
    name = "forward"

    def __init__(self, cfg: ForwardConfig, *, relay: bool = False) -> None:
        """relay: this daemon is a group head (it serves nodes on its remote ingest): what it
        forwards is its nodes' (see the module docstring); cfg.node_rank is then the group's
        index and cfg.num_nodes the number of groups."""
        self.cfg = cfg
        self.relay = relay
        self._own = "group" if relay else "node"     # the prefix of this daemon's own records' events
        self.src = int.from_bytes(os.urandom(8), "little") >> 1
        self.host = _socket.gethostname()
        self._enc = msgspec.msgpack.Encoder()
        self._sock: zmq.Socket | None = None
        self._ctx: zmq.Context | None = None
        self._kinds = frozenset(cfg.kinds)
        self._hello_sent_with_model = False
        self._rank_info: dict = {}
        self._launch_started: float | None = None    # started_at of the launch last announced
        self._last_step_ns = 0                        # t of the last step forwarded (ns)
        self._mon: zmq.Socket | None = None
        self._link: str | None = None                 # this end of the TCP link to the head, "ip:port"
        self._no_link_warn_at = 0.0                   # monotonic; 0: said, or not started
        self.num_connects = 0
        self.num_disconnects = 0
        self.seq = 0
        self.num_sent = 0
        self.num_dropped = 0
        self.num_unsent_no_handshake = 0     # at close, on a link that never completed its handshake
        self.num_unconfirmed_at_close = 0    # at close, an upper bound of what the linger left queued
        self._min_frame_bytes = 0            # the smallest frame handed to the socket (ZMTP header included)
        self._link_up = False                # a handshake succeeded and no disconnect since
        self._dropped_at_link = 0            # num_dropped at the link's last handshake
        self.curve = False
        self._curve_keys: tuple | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        from telemetry.shared.security.curve import load_public_key, load_secret_key

        c = self.cfg
        self._ctx = zmq.Context(1)
        s = self._ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, c.max_buffered)
        s.setsockopt(zmq.LINGER, int(c.close_linger_s * 1000))
        s.setsockopt(zmq.HEARTBEAT_IVL, int(c.heartbeat_ivl_s * 1000))
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(c.heartbeat_timeout_s * 1000))
        # The head closes this link on hearing nothing from it for a ping interval and its timeout.
        s.setsockopt(zmq.HEARTBEAT_TTL, int((c.heartbeat_ivl_s + c.heartbeat_timeout_s) * 1000))
        s.setsockopt(zmq.RECONNECT_IVL, int(c.reconnect_ivl_s * 1000))
        s.setsockopt(zmq.RECONNECT_IVL_MAX, int(c.reconnect_ivl_max_s * 1000))
        # The keys of the config, never of the environment: a node's rank-side keys and its
        # forwarding keys stay separate.
        if c.server_public_key:
            # Kept for the bye's link at the close (the files may be gone by then).
            public, secret = load_secret_key(c.client_secret_key)
            self._curve_keys = (public, secret, load_public_key(c.server_public_key))
            self._set_curve(s)
            self.curve = True
        # Watch the link: a restarted head gets this node's hello again on reconnect.
        self._mon = s.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                                         | zmq.EVENT_MONITOR_STOPPED)
        s.connect(c.endpoint)
        self._sock = s
        self._no_link_warn_at = time.monotonic() + NO_LINK_WARN_S
        # Announce the node at once, so the head expects it before its first step arrives.
        self._send(KIND_HELLO, (self._node_info({}),))

    def consume(self, batch: list[Out]) -> None:
        self._check_link()
        kinds = self._kinds
        me = self.cfg.node_rank
        own = self._own
        mine = f"{own}_rank"     # node_rank on a node daemon, group_rank on a group head
        last_ns = 0              # the t of the last step forwarded in this batch
        for o in batch:
            kind = o.kind
            if kind not in kinds:
                if kind == "bye":
                    rec = o.record
                    name, data = (("node_bye", {"node_rank": rec.get("rank"), "group_rank": me}) if self.relay
                                  else ("rank_bye", {"rank": rec.get("rank"), "node_rank": me}))
                    self._send(KIND_EVENT, (name, data), _t_ns(rec))
                continue
            rec = o.record
            if kind == "metrics":
                if "rank" in rec:
                    continue  # per-rank (per-node) records stay on this daemon
                last_ns = _t_ns(rec)
                self._send(KIND_METRICS, (rec["step"], _numbers(rec["values"])), last_ns)
            elif kind == "event":
                data = rec.get("data", {})
                if not self.relay:
                    data = {**data, "rank": rec.get("rank"), "node_rank": me}
                elif "node_rank" in data:      # a node's event (a rank's, a node's finding): as it came
                    data = {**data, "group_rank": me}
                else:                          # the group head's own, about one of its nodes
                    data = {**data, "node_rank": rec.get("rank"), "group_rank": me}
                self._send(KIND_EVENT, (rec.get("name") or "event", data), _t_ns(rec))
            elif kind == "hello":
                if last_ns > self._last_step_ns:
                    self._last_step_ns = last_ns
                self._on_rank_hello(rec)
            else:  # daemon, gpu, system: this daemon's own records, as events at the head
                name = f"{own}_daemon" if kind == "daemon" else f"{own}_{kind}"
                data = {k: v for k, v in rec.items() if k not in ("kind", "t")}
                self._send(KIND_EVENT, (name, {**data, mine: me}), _t_ns(rec))
        if last_ns > self._last_step_ns:
            self._last_step_ns = last_ns

    def _on_rank_hello(self, rec: dict) -> None:
        """Forward a rank's hello as the node's when it says something new: the first with a
        start time, the first with the model (the head's MFU), or the first of a new launch (a
        rank started after the last step forwarded: a restarted job), so that the head's
        goodput ledger sees every launch's start. The other ranks' hellos stay on the node."""
        info = rec.get("info")
        if not isinstance(info, dict):
            return
        has_model = isinstance(info.get("model"), dict)
        started = info.get("started_at")
        started = float(started) if is_number(started) else None
        first, last_step = self._launch_started, self._last_step_ns / 1e9
        new_launch = started is not None and (first is None or (last_step > first and started > last_step))
        if not new_launch and (has_model and self._hello_sent_with_model or not has_model):
            return
        if has_model:
            self._hello_sent_with_model = True
        elif "model" in self._rank_info:        # a relaunch whose hello lacks it: the head keeps its MFU
            info = {**info, "model": self._rank_info["model"]}
        if started is not None and (first is None or started > first):
            self._launch_started = started
        self._rank_info = info
        self._send(KIND_HELLO, (self._node_info(info),), _t_ns(rec))

    def flush(self) -> None:
        self._check_link()   # called about once a second, also when no records flow
        if self.num_connects == 0 and self._no_link_warn_at and time.monotonic() >= self._no_link_warn_at:
            self._no_link_warn_at = 0.0
            self._warn_no_link()

    def _warn_no_link(self) -> None:
        """Once, NO_LINK_WARN_S after the start with no handshake yet: the records are held (up to
        max_buffered) for a head that may never come, so say it while it can be fixed, with what
        the node can tell of why (a name that does not resolve)."""
        host, _, port = self.cfg.endpoint[len("tcp://"):].rpartition(":")
        why = ""
        try:
            _socket.getaddrinfo(host.strip("[]"), int(port), type=_socket.SOCK_STREAM)
        except (OSError, ValueError) as exc:
            why = f" ({host} does not resolve: {exc})"
        log.warning("no link to the head daemon at %s after %.0f s%s: holding up to %d records for it; what is still "
                    "held at the drain is counted unsent_no_handshake", self.cfg.endpoint, NO_LINK_WARN_S, why,
                    self.cfg.max_buffered)

    def _check_link(self, *, closing: bool = False) -> bool:
        """Read the link's monitor events; closing: the bye is queued (or the socket closed), so no
        hello is sent on a handshake. Returns whether the monitor said it stopped."""
        from zmq.utils.monitor import parse_monitor_message

        mon = self._mon
        while mon is not None and mon.poll(0):
            try:
                msg = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
            except (zmq.ZMQError, ValueError):
                return False
            event = msg["event"]
            if event == zmq.EVENT_MONITOR_STOPPED:
                return True
            if event == zmq.EVENT_DISCONNECTED:
                if not self._link_up:
                    continue           # a TCP connection that never got through its handshake
                self._link_up = False
                self.num_disconnects += 1
                log.warning("lost the head daemon at %s; buffering up to %d records", self.cfg.endpoint,
                            self.cfg.max_buffered)
            elif event == zmq.EVENT_CONNECTED:
                self._link = _local_link(msg["value"])
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._link_up = True
                self._dropped_at_link = self.num_dropped
                self.num_connects += 1
                if closing:
                    continue
                if self.num_connects > 1:
                    log.warning("reconnected to the head daemon at %s", self.cfg.endpoint)
                # The hello again, now with this link's address: a restarted head learns the node
                # anew, and every head can name the node whose link closes (node_links.py).
                self._send(KIND_HELLO, (self._node_info(self._rank_info),))
        return False

    def close(self) -> None:
        if self._sock is None:
            return
        c = self.cfg
        self._check_link()
        # The linger is for a head that is there: one that never completed a handshake gets the
        # same time to do so, and if it does not, nothing queued can have left.
        deadline = time.monotonic() + c.close_linger_s
        while self.num_connects == 0 and (left_s := deadline - time.monotonic()) > 0:
            if self._mon.poll(max(1, int(left_s * 1000))):
                self._check_link(closing=True)     # no hello after the bye: the queued one goes first
        handshaken = self.num_connects > 0
        # forwarded_by: the head's goodput ledger tells this link's end from a rank's.
        bye = encode_bye(self.src, c.node_rank, self.seq, self.num_dropped, time.time_ns(),
                         {**self.stats(), "forwarded_by": "group head" if self.relay else "node daemon"})
        bye_sock = bye_mon = None
        if handshaken:
            # The bye, with the final seq the head's per-node loss figure needs, on a link of its
            # own, sent before the records' link lingers: behind a backlog (a head not keeping up)
            # the records' send queue may be full, or cut at the linger's end, and the bye with
            # it. A fresh link's queue is empty; the head holds a bye that came first until its
            # node's records are in (daemon/byes.py), and counts what never came as lost.
            bye_sock, bye_mon = self._bye_link()
            bye_opened = time.monotonic()
            data, self._sock = self._sock, bye_sock
            try:
                self._send_raw(bye)
            finally:
                self._sock = data
        else:
            self._send_raw(bye)
        linger_ms = int(max(0.0, deadline - time.monotonic()) * 1000) if handshaken else 0
        t0 = time.monotonic()
        self._sock.close(linger=linger_ms)
        # The events before the close (a handshake the close raced with), up to the monitor's stop
        # (once the socket is gone: drained, or at the end of its linger). Read before the bye's
        # link is waited for: when the stop was seen says whether the linger ran out.
        gone_at = None
        stop_by = max(time.monotonic(), t0 + linger_ms / 1000) + _MONITOR_STOP_WAIT_S
        while (left_s := stop_by - time.monotonic()) > 0 and self._mon.poll(max(1, int(left_s * 1000))):
            if self._check_link(closing=True):
                gone_at = time.monotonic()
                break
        self._mon.close(linger=0)
        self._mon = None
        bye_link = "up"
        if bye_sock is not None:
            bye_link = _bye_link_outcome(bye_sock, bye_mon, max(deadline, bye_opened + _BYE_HANDSHAKE_MIN_S))
        self._ctx.term()          # waits out the rest of the linger while records are still queued
        lingered_out = (gone_at or time.monotonic()) - t0 >= linger_ms / 1000 - 0.01
        on_link = self.num_sent - (bye_sock is not None)      # the bye went on a link of its own
        if self.num_connects == 0:
            self.num_unsent_no_handshake = self.num_sent
            log.warning("the link to the head daemon at %s never completed its handshake: %d records "
                        "were not sent (counted as unsent_no_handshake)", c.endpoint, self.num_sent)
        elif lingered_out or self.num_dropped > self._dropped_at_link:
            # No acknowledgement on a PUSH link: what the linger left, or what a head that was not
            # keeping up (its send queue refused records on this link) had not read when the link
            # closed, is known only to be at most the send queue's bound plus the batch libzmq's
            # engine had taken off it. (The head knows the exact figure from the bye's seq.)
            in_batch = -(-_ZMQ_OUT_BATCH_BYTES // max(1, self._min_frame_bytes))
            self.num_unconfirmed_at_close = min(on_link, c.max_buffered + in_batch)
            why = ("with no linger (close_linger_s: 0) whatever was still queued was discarded" if c.close_linger_s == 0
                   else f"records still queued when the close's linger ({c.close_linger_s:.1f} s) ran out" if lingered_out
                   else "the head was not keeping up (its send queue refused records)")
            log.warning("closing the link to the head daemon at %s, %s: up to %d records not confirmed sent "
                        "(unconfirmed_at_close)", c.endpoint, why, self.num_unconfirmed_at_close)
        if bye_link != "up":
            # Its link never completed a handshake: the bye cannot have left; or it did so only as
            # the socket closed: it may have.
            if bye_link == "never":
                self.num_unsent_no_handshake += 1
            else:
                self.num_unconfirmed_at_close += 1
            log.warning("the bye's link to the head daemon at %s %s: the bye counted as %s; the head counts this "
                        "node's records by what came", c.endpoint,
                        "never completed its handshake" if bye_link == "never" else "completed its handshake only "
                        "as it closed", "unsent_no_handshake" if bye_link == "never" else "unconfirmed_at_close")
        self._sock = None

    def _bye_link(self) -> tuple[zmq.Socket, zmq.Socket]:
        """A PUSH socket of its own to the head for the bye (the records' link's keys), and a
        monitor of its handshake."""
        s = self._ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, 1)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RECONNECT_IVL, int(self.cfg.reconnect_ivl_s * 1000))
        self._set_curve(s)
        mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_MONITOR_STOPPED)
        s.connect(self.cfg.endpoint)
        return s, mon

    def _set_curve(self, s: zmq.Socket) -> None:
        """Make `s` a CURVE client with this node's keys, if it has any (before its connect)."""
        if self._curve_keys is not None:
            s.curve_publickey, s.curve_secretkey, s.curve_serverkey = self._curve_keys

    def stats(self) -> dict:
        return {"sent": self.num_sent, "refused_by_send_queue": self.num_dropped, "seq": self.seq, "src": self.src,
                "endpoint": self.cfg.endpoint, "curve": self.curve, "connects": self.num_connects,
                "disconnects": self.num_disconnects, "link_up": self._link_up,
                "unsent_no_handshake": self.num_unsent_no_handshake,
                "unconfirmed_at_close": self.num_unconfirmed_at_close}

    # -- sending -------------------------------------------------------------------------------
    def _node_info(self, rank_info: dict) -> dict:
        if self.relay:
            return self._group_info(rank_info)
        c = self.cfg
        info = {k: v for k, v in rank_info.items() if k not in ("pid", "src", "local_rank")}
        world = rank_info.get("world_size")
        ranks_per_node = world // c.num_nodes if isinstance(world, int) and world >= c.num_nodes else None
        info.update({"host": self.host, "rank": c.node_rank, "node_rank": c.node_rank, "num_nodes": c.num_nodes,
                     "world_size": c.num_nodes, "forwarded_by": "node daemon", "src": self.src})
        if self._link:
            info["link"] = self._link
        if ranks_per_node:
            info["ranks_per_node"] = ranks_per_node
            info["global_world_size"] = world
            peak = _device_peak(rank_info)
            if peak:
                # The head's MFU divides by one "device" per node: give it the node's peak.
                info["peak_flops"] = peak * ranks_per_node
        return info

    def _group_info(self, node_info: dict) -> dict:
        """A group head's hello, from one of its nodes' (which speaks of the whole job: num_nodes,
        ranks_per_node, global_world_size stay as they are)."""
        c = self.cfg
        info = {k: v for k, v in node_info.items() if k not in ("pid", "src", "local_rank", "node_rank", "link")}
        nodes = node_info.get("num_nodes")
        per_group = nodes // c.num_nodes if is_int(nodes) and nodes >= c.num_nodes else None
        info.pop("peak_flops", None)
        info.update({"host": self.host, "rank": c.node_rank, "group_rank": c.node_rank, "num_groups": c.num_nodes,
                     "world_size": c.num_nodes, "forwarded_by": "group head", "src": self.src})
        if self._link:
            info["link"] = self._link
        if per_group:
            info["nodes_per_group"] = per_group
            peak = positive_finite(node_info.get("peak_flops"))    # a node's (its devices'), from its daemon
            if peak:
                # The job head's MFU divides by one "device" per group: give it the group's peak.
                info["peak_flops"] = peak * per_group
        return info

    def _send(self, kind: int, body: tuple, t_ns: int | None = None) -> None:
        frame = self._enc.encode((kind, PROTOCOL_VERSION, self.src, self.cfg.node_rank, self.seq,
                                  self.num_dropped, t_ns or time.time_ns(), *body))
        self._send_raw(frame)

    def _send_raw(self, frame: bytes) -> None:
        self.seq += 1
        try:
            self._sock.send(frame, zmq.NOBLOCK)
            self.num_sent += 1
            size = len(frame) + (2 if len(frame) < 256 else 9)     # ZMTP's frame header
            if size < self._min_frame_bytes or not self._min_frame_bytes:
                self._min_frame_bytes = size
        except zmq.Again:  # the head is away or not reading and the buffer is full: drop, counted in-band
            if not self.num_dropped:
                log.warning("the send queue to the head daemon at %s is full (%d records): dropping, counted "
                            "(dropped)", self.cfg.endpoint, self.cfg.max_buffered)
            self.num_dropped += 1


def _bye_link_outcome(sock: zmq.Socket, mon: zmq.Socket, deadline: float) -> str:
    """Close the bye's socket and say how its link went: "up" (its handshake came by `deadline`:
    the bye had the rest of the linger, at least _BYE_LINGER_MS, to leave), "never" (no handshake before the socket was
    gone: the bye cannot have left) or "raced" (a handshake as it closed: it may have)."""
    up = bool(mon.poll(max(0, int((deadline - time.monotonic()) * 1000))))
    sock.close(linger=max(_BYE_LINGER_MS, int((deadline - time.monotonic()) * 1000)) if up else 0)
    outcome = "up" if up else "never"
    stop_by = time.monotonic() + _MONITOR_STOP_WAIT_S
    while not up and (left_s := stop_by - time.monotonic()) > 0 and mon.poll(max(1, int(left_s * 1000))):
        event = mon.recv_multipart()[0]
        if int.from_bytes(event[:2], "little") == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            outcome = "raced"
        else:             # EVENT_MONITOR_STOPPED: every event before it has come
            break
    mon.close(linger=0)
    return outcome


def _t_ns(rec: dict) -> int:
    t = rec.get("t")
    return int(t * 1e9) if isinstance(t, (int, float)) and t > 0 else time.time_ns()


def _local_link(fd: int) -> str | None:
    """This end of the TCP connection behind `fd` (a monitor's EVENT_CONNECTED, read after the
    fact: None if it is gone or no longer TCP), as the head's watch names its peer."""
    from telemetry.shared.security.watch import link_name

    try:
        s = _socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        return link_name(s.getsockname()) if s.family in (_socket.AF_INET, _socket.AF_INET6) else None
    except OSError:
        return None
    finally:
        s.close()


def _numbers(values: dict) -> dict:
    # JSON null (a non-finite float on the node) and non-numbers cannot travel as metric values.
    return {k: v for k, v in values.items() if is_number(v)}


def _device_peak(info: dict) -> float | None:
    peak = info.get("peak_flops")
    if isinstance(peak, (int, float)) and peak > 0:
        return float(peak)
    try:
        from telemetry.daemon.mfu import peak_flops
    except ImportError:
        return None
    model = info.get("model") if isinstance(info.get("model"), dict) else {}
    return peak_flops(str(info.get("device_name", "unknown")), str(model.get("dtype", "bf16")))

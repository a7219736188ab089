"""The daemon: its sockets, its loop and its timers, around a pipeline of stages (pipeline.py).

    receiver -> rare records -> steps -> fan-out: sinks (JSONL, W&B, TensorBoard, custom), each
    on its own thread behind a bounded queue (full: drops counted), plus PUB, which never blocks
    and so runs inline; the analysis stages (diagnosis, forensics, goodput) are fed like sinks,
    and their events come back through post(), as do the pollers' records (from their threads).

The loop has one shape: poll the sockets with a timeout equal to the next timer's deadline,
dispatch what arrived, then do the housekeeping that is due (expire steps, release byes, the
daemon record, checkpoints). Shutdown (SIGTERM, SIGINT, a drain request, --watch-pid's process
gone) drains the stages in order within `drain_timeout_s` (shutdown.py).

Beside the loop, each in its own module: shutdown.py (the drain), self_report.py (the loss
accounting past the receiver's, `status`, the `daemon` record, the progress line),
control_server.py (status, drain, ping), continuity.py (what a restarted daemon takes over).
"""
from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import time
from pathlib import Path

import zmq

from protocol import MAX_FRAME_BYTES
from protocol.output import OutputRecord
from telemetry.shared import client_page, endpoints, ring, run_endpoints, run_lock
from telemetry.daemon import hotpath
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import DaemonConfig
from telemetry.daemon.continuity import Continuity
from telemetry.daemon.control_server import ControlServer
from telemetry.daemon.derived import Derived
from telemetry.daemon.hellos import Hellos
from telemetry.daemon.node_clocks import NodeClocks
from telemetry.daemon.node_links import (REMOTE_HEARTBEAT_IVL_MS, REMOTE_HEARTBEAT_TIMEOUT_MS, REMOTE_HEARTBEAT_TTL_MS,
                                         NodeLinks, head_context)
from telemetry.daemon.intake import Intake
from telemetry.daemon import memory, process
from telemetry.daemon.pipeline import Pipeline
from telemetry.daemon.receiver import Receiver
from telemetry.daemon.rings import RingSet
from telemetry.daemon import shutdown
from telemetry.daemon.self_report import Identity, Losses, SelfReport
from telemetry.daemon.shutdown import STOP_REASONS
from telemetry.daemon.stages.fanout import FanOut
from telemetry.daemon.stages.outputs import Outputs
from telemetry.daemon.stages.rare import RareStage
from telemetry.daemon.stages.receive import ReceiveStage
from telemetry.daemon.stages.steps import StepsStage
from telemetry.shared.goodput import EXCLUDE
from telemetry.shared.security.redact import Redactor
from telemetry.daemon.sinks.base import SinkRunner, StartupError

log = logging.getLogger("telemetry.daemon")

READY_LINE = "telemetry daemon ready"
# The longest the loop sleeps when no timer is due; bounds how stale "now" can get.
MAX_POLL_MS = 500
# A peer on the ingest socket that has not completed the ZMTP handshake in this long is dropped by
# libzmq (counted in handshake_failed): a connection that never becomes a client (a raw TCP
# socket that sends nothing) holds a connection slot and a descriptor this long at most
# (libzmq's default is 30 s). A real client's handshake takes milliseconds, CURVE's too.
HANDSHAKE_IVL_MS = 5000
# Connections the kernel holds completed for the daemon to accept (libzmq's default is 100; the
# kernel caps it at net.core.somaxconn): a burst of connects (ranks starting together, or a flood
# of raw ones) beyond it has its SYNs dropped and retried after 1, 3, 7 s, which a rank's close
# (1.5 s) may not outlast.
INGEST_BACKLOG = 1024

# Control connections at once (`telemetry status`/`drain` use one for a moment each).
MAX_CONTROL_CONNECTIONS = 64
# The daemon's housekeeping interval: which clients still send (for a drain), --watch-pid. (The
# loss accounting's checkpoints have their own: continuity.py.)
CHECKPOINT_INTERVAL_S = 1.0
# After a burst, once ingest has been quiet this long and the sink queues are empty, the heap's
# freed memory is given back to the system (memory.trim_heap; glibc keeps it otherwise).
TRIM_AFTER_QUIET_S = 2.0


class Daemon:
    def __init__(self, cfg: DaemonConfig, budget: memory.Budget | None = None) -> None:
        """budget: the memory budget with the process's baseline measured (cli.py); None inside
        another process (tests), where nothing is kept by measure (memory.Budget)."""
        self.cfg = cfg
        self.log_dir = Path(cfg.log_dir)
        self.host = socket.gethostname()
        self.stop_code = ""                    # why it stops: a code of STOP_REASONS ("" while it serves)
        self.stop_reason = ""                  # ... and in words
        self.started_mono = time.monotonic()
        self.started_wall = time.time()
        self.redactor = Redactor()   # secrets in hello configs and event data never reach a sink
        # The memory budget (memory.py): each buffer's share, what was shed beyond it.
        self.budget = budget or memory.Budget(cfg.memory_mb, links=cfg.head_links())
        self.governor: memory.Governor | None = None     # the budget kept by measure (start)
        self.shed = memory.Shed()
        self.losses = Losses()                 # lost past the receiver's accounting (self_report.py)
        self.names = memory.NameCatalogue(self.budget.max_names, self.shed)
        self.receiver = Receiver(names=self.names)
        self.aggregator = Aggregator(cfg.aggregator)
        self.derived = Derived(cfg.mfu)
        self.derived.forwards = cfg.forward is not None and cfg.forward.enabled
        # The last batches of metrics records, for hang forensics (one append per batch).
        self.recent_metrics = memory.RecentRing(self.budget.recent_bytes, self.shed)
        self.hello_infos = memory.HelloInfos(self.budget.hello_bytes, self.shed)
        # The pipeline's stages after the receiver (pipeline.py); the receiver's needs the socket (start).
        self.fanout = FanOut()
        self._outputs = Outputs(self.fanout, cfg, self.log_dir, self.budget.sink_queue_bytes)
        self.steps = StepsStage(self.aggregator, self.derived, per_rank=cfg.aggregator.per_rank, losses=self.losses,
                                shed=self.shed, names=self.names, recent=self.recent_metrics,
                                open_steps_bytes=self.budget.open_steps_bytes, fanout=self.fanout)
        self.hellos = Hellos(self.hello_infos, self.redactor)   # each rank's hello info (hellos.py)
        self.rare = RareStage(self.receiver, self.hellos, self.steps, self.losses, self.redactor, self.fanout.emit,
                              forwards=bool(cfg.forward), head=bool(cfg.remote_ingest))
        self.receive: ReceiveStage | None = None
        self.intake: Intake | None = None      # the ingest socket's read-ahead queue (start)
        self.pipeline: Pipeline | None = None
        self.links: NodeLinks | None = None      # a head's: which node each link is (start())
        self.clocks: NodeClocks | None = None    # a head's: each node's clock against its own (start())
        self.pollers: list = []
        self.diagnoser = None
        self.forensics = None                           # the ForensicsStage
        self.goodput = None                             # the GoodputStage, once started
        self.fd_limit, self.max_connections = 0, cfg.max_connections   # set by start()
        # The accounting and counts a restarted daemon carries over, checkpointed in sources.json.
        self.continuity = Continuity(self.log_dir, self.receiver, self.aggregator, cfg.aggregator.per_rank,
                                     self.started_wall)
        self._next_checkpoint = time.monotonic() + CHECKPOINT_INTERVAL_S
        self.endpoints: dict[str, str] = {}
        self._next_daemon_record = time.monotonic() + cfg.daemon_record_interval_s
        self.report: SelfReport | None = None   # status, the daemon record, the progress line (start)
        self._pub_sock: zmq.Socket | None = None   # watched for its subscribers (start)
        self._trim_due = False                 # records came in since the heap was last trimmed
        self.watched: process.Watched | None = None   # --watch-pid: drain once this process has exited
        self.remove_runtime_dir: Path | None = None   # --remove-runtime-dir: removed after the drain
        self.lock_fd: int | None = None       # the runtime directory's daemon.lock, held for life
        self.run_lock_fd: int | None = None   # the log directory's run.lock, held until shutdown
        self.num_heap_trims = 0

    @property
    def unfinished(self) -> list[str]:
        """The sinks (and "media") not drained by the drain's deadline: abandoned, or closed
        without what was queued behind their last batch (fanout.closed_short)."""
        return self.fanout.unfinished

    @property
    def runners(self) -> list[SinkRunner]:
        """Every sink's and analysis stage's runner (the fan-out's)."""
        return self.fanout.runners

    # -- start ---------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        if self.run_lock_fd is None:     # the CLI takes it before it writes anything there
            # One live daemon per log dir (RunDirInUse); then 0700 (or as configured), also when
            # run.sh made it 0755.
            self.run_lock_fd = run_lock.hold(self.log_dir)
        self.continuity.restore()
        self.continuity.write(self.fanout.num_records_out)   # a successor on this log dir knows a predecessor existed
        # Without flags, the node's default sockets: a job's own directory is for its ranks to
        # find the daemon autostart gives it (which passes them as flags), never one's by hand.
        self.endpoints = {which: endpoints.resolve(which, getattr(cfg, which), create_dir=True, job=False)
                          for which in ("ingest", "pub", "control")}
        self.fd_limit, self.max_connections = process.raise_fd_limit(cfg.max_connections)
        if cfg.remote_ingest and cfg.aggregator.world_size:
            log.info("head of %d nodes: up to %d ingest connections (max_connections: two a node and the head's "
                     "own; descriptor limit %d)", cfg.aggregator.world_size, self.max_connections, self.fd_limit)
        if self.endpoints["ingest"].startswith("ipc://"):
            # Says "a daemon serves this directory" to whoever would start one (client/autostart.py).
            self.lock_fd = endpoints.hold_daemon_lock(Path(self.endpoints["ingest"][len("ipc://"):]).parent)
        # A head's libzmq context suits its node links (node_links.head_context): at most its
        # nodes, or its connection limit where it was not told them.
        self.ctx = head_context(cfg.head_links() or (self.max_connections if cfg.remote_ingest else 0))
        # Refuses (SecurityError) to listen beyond loopback without CURVE; runs the allow-list.
        from telemetry.shared.security.curve import DaemonSecurity

        remote = endpoints.normalize(cfg.remote_ingest) if cfg.remote_ingest else ""
        self.security = DaemonSecurity(self.ctx, cfg.security, {**self.endpoints, "remote_ingest": remote})
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, cfg.connection_hwm())   # per connection: the budget shared
        self.pull.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
        self.pull.setsockopt(zmq.BACKLOG, INGEST_BACKLOG)
        # Frames are read ahead off libzmq's queues (which count messages) into one bounded in bytes.
        # On a head with CURVE node links, each frame is read with the check of which node it
        # speaks as (a node's key speaks only for that node: security/identity.py).
        guard = self.security.node_guard(self.pull, remote)
        pages = client_page.page_dir(self.endpoints["ingest"])
        # The local clients' record rings (rings.py), unless $TELEMETRY_TRANSPORT says zmq.
        rings = RingSet(pages) if pages is not None and os.environ.get(ring.ENV_TRANSPORT) != "zmq" else None
        self.intake = Intake(self.pull, self.budget.ingest_bytes, self.receiver.loops.read_frames_upto,
                             self.receiver.unread_headers, recv=guard.recv if guard is not None else None,
                             shed=self.shed, rings=rings)
        self.receive = ReceiveStage(self.pull, self.receiver, self.intake, self.losses, pages)
        self.receive.downstream, self.receive.rare = self.steps, self.rare
        if self.budget.baseline_mb is not None:
            self.governor = memory.Governor(self.budget, self.intake)
        # A planned-maintenance window (`telemetry goodput --exclude`): an event for every ledger.
        self.control_server = ControlServer(self.ctx, lambda: self.report.status(), self._request_drain,
                                            lambda window: self.fanout.event(EXCLUDE, window))
        self.control = self.control_server.sock
        for name, sock in (("ingest", self.pull), ("control", self.control)):
            self.security.prepare(sock, self.endpoints[name], name)
            self.endpoints[name] = _bind(sock, self.endpoints[name])
        if remote:
            # Node daemons: a second listener on the same PULL socket, with its own options: CURVE,
            # and ZMTP heartbeats that close the link of a node that went silent (node_links.py).
            self.pull.setsockopt(zmq.HEARTBEAT_IVL, REMOTE_HEARTBEAT_IVL_MS)
            self.pull.setsockopt(zmq.HEARTBEAT_TIMEOUT, REMOTE_HEARTBEAT_TIMEOUT_MS)
            self.pull.setsockopt(zmq.HEARTBEAT_TTL, REMOTE_HEARTBEAT_TTL_MS)
            self.links = self.rare.links = NodeLinks(self.ctx.get(zmq.IO_THREADS))
            self.clocks = self.rare.clocks = self.steps.clocks = NodeClocks()
            self.security.connections.on_tcp_gone = self.links.closed
            self.security.prepare(self.pull, remote, "remote_ingest")
            self.endpoints["remote_ingest"] = _bind(self.pull, remote)
        ingest_eps = tuple(ep for k, ep in self.endpoints.items() if k in ("ingest", "remote_ingest"))
        self.control_server.issue_token(self.endpoints["control"], self.security.control_client_keys()
                                        if "control" in self.security.secured else None)
        self._make_sinks()
        for r in self.fanout.runners:
            if hasattr(getattr(r, "sink", None), "rank_names"):
                r.sink.rank_names = self.names.names       # a W&B script's own names (wandb_sink.py)
        # Every listening socket has a connection limit: connections that are no rank (idle raw
        # ones, subscribers that never read, on loopback TCP anyone's) cannot take the daemon's
        # descriptors or, on PUB, its memory (a queue each).
        from telemetry.daemon.sinks.pub import MAX_SUBSCRIBERS

        watched = {"ingest": self.pull, "control": self.control}
        limits = {"ingest": (self.max_connections, ingest_eps),
                  "control": (MAX_CONTROL_CONNECTIONS, (self.endpoints["control"],))}
        if self._pub_sock is not None:
            watched["pub"] = self._pub_sock
            limits["pub"] = (MAX_SUBSCRIBERS, (self.endpoints["pub"],))
        self.security.watch(watched, limits=limits)
        # The pollers, and the analysis stages fed like sinks (stages/outputs.py).
        self.pollers, self.diagnoser, self.forensics, self.goodput, self.rare.diagnosis = \
            self._outputs.analysis(self.host, self.post, self.recent_metrics, self.endpoints["ingest"])
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self._poller = zmq.Poller()
        self._poller.register(self.pull, zmq.POLLIN)
        self._poller.register(self.control, zmq.POLLIN)
        self._poller.register(self._wake_r.fileno(), zmq.POLLIN)
        self.rare.diagnoser, self.rare.forensics, self.rare.media = self.diagnoser, self.forensics, self.fanout.media
        self.steps.goodput = self.goodput
        self.fanout.exit_data = lambda: self.control_server.exit_data
        # Once the analysis stages are closed: the daemon's own record, its last.
        self.fanout.last_words = lambda: self.fanout.emit(self.report.daemon_record())
        self.fanout.while_waiting = self._serve_control_while_draining
        self.pipeline = Pipeline([self.receive, self.rare, self.steps, self.fanout])
        # How long a drain may take: its deadline, and what a sink's slow phase may add to it
        # (W&B's start or finish: Sink.phase); `telemetry drain` waits that long.
        phases = max((getattr(getattr(r, "sink", None), "phase_allowance_s", 0.0) for r in self.fanout.runners),
                     default=0.0)
        limits = {"fd_limit": self.fd_limit, "max_connections": self.max_connections,
                  "rcvhwm": cfg.rcvhwm, "rcvhwm_per_connection": cfg.connection_hwm(),
                  "drain_timeout_s": cfg.drain_timeout_s, "drain_may_take_s": cfg.drain_timeout_s + phases}
        self.report = SelfReport(
            Identity(cfg.run_name, self.log_dir, self.started_wall, self.started_mono, self.endpoints, limits),
            self.budget, self.pipeline, receive=self.receive, rare=self.rare, steps=self.steps, fanout=self.fanout,
            hello_infos=self.hello_infos, security=self.security, pollers=self.pollers, continuity=self.continuity,
            governor=self.governor, heap_trims=lambda: self.num_heap_trims)
        self.pipeline.start()
        rings = self.intake.rings
        if rings is not None and rings.watch_fd is not None:
            self._poller.register(rings.watch_fd, zmq.POLLIN)     # new rings (rings.py)
        for p in self.pollers:
            p.start(self.post)
        process.tune_gc()
        process.warn_open_endpoints(self.endpoints, cfg.security)
        eps = " ".join(f"{k}={v}" for k, v in self.endpoints.items())
        try:      # where this run's live daemon is, for a consumer that follows the run (tail)
            run_endpoints.write(self.log_dir, self.endpoints)
        except OSError as exc:
            log.warning("cannot write %s in %s (%s): `telemetry tail --run-dir` will not find this daemon",
                        run_endpoints.FILE_NAME, self.log_dir, exc.strerror or exc)
        print(f"{READY_LINE} pid={os.getpid()} {eps} log_dir={self.log_dir}", flush=True)
        log.info("ready: %s", eps)
        if hotpath.native is None and not hotpath.chosen_python():
            log.warning("the C inner loops are not built (no C compiler at install?): running the "
                        "pure-Python ones: the same results at a lower ingest rate (benchmarks/RESULTS.md, Daemon ingest)")

    def _make_sinks(self) -> None:
        """Every configured sink, behind its runner in the fan-out (stages/outputs.py)."""
        self.jsonl_runner, self._pub_sock = self._outputs.sinks(
            self.ctx, self.endpoints, self.security.prepare, self.continuity.repaired_bytes, self.host)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until SIGTERM, SIGINT or a drain request; then drain and return the exit code."""
        while not self.stop_code:
            self.turn()
        return shutdown.run(self)

    def turn(self, max_wait_s: float | None = None) -> None:
        """One turn of the loop: wait for input or the next timer, dispatch, housekeeping."""
        now = time.monotonic()
        deadline = min(self._next_daemon_record, self.steps.next_deadline(now, MAX_POLL_MS / 1000),
                       self._next_checkpoint)
        timeout_ms = max(0, min(MAX_POLL_MS, int((deadline - now) * 1000) + 1))
        if max_wait_s is not None:
            timeout_ms = min(timeout_ms, int(max_wait_s * 1000))
        rings = self.intake.rings
        if len(self.intake):
            timeout_ms = 0                 # frames read ahead are waiting
        if rings is not None and rings.fd is not None and timeout_ms:
            events = self._wait_polling_rings(rings, now + timeout_ms / 1000)
        else:
            events = dict(self._poller.poll(timeout_ms))
        if rings is not None and rings.watch_fd is not None and events.pop(rings.watch_fd, None):
            rings.notified()
        if (self.pull in events or len(self.intake) or (rings is not None and rings.ready)) \
                and self.receive.ingest():
            self._trim_due = True
        if self.control in events:
            self.control_server.serve()
        if self._wake_r.fileno() in events:
            self._drain_wakeups()
        now = time.monotonic()
        self.fanout.take_inbox()
        self.steps.expire(now)
        self.rare.tick(now)
        if now >= self._next_daemon_record:
            self.fanout.emit(self.report.daemon_record())
            self.report.log_progress()
            self._next_daemon_record = now + self.cfg.daemon_record_interval_s
        checkpoint_due = self.continuity.due(now, self.fanout.num_records_out + self.fanout.num_pending())
        if now >= self._next_checkpoint:
            self.receiver.mark_progress()      # which clients are still sending, for a drain
            self._next_checkpoint = now + CHECKPOINT_INTERVAL_S
            if self.watched is not None and not self.stop_code and not self.watched.alive():
                self._watched_ended(self.watched)
        self.fanout.flush()
        if checkpoint_due:
            self.continuity.through_jsonl(self.jsonl_runner, self.fanout.num_records_out)
        if self.governor is not None and now >= self.governor.next_check:
            self.governor.check(now)
        if self._trim_due and now - self.receive.last_batch_mono >= TRIM_AFTER_QUIET_S:
            self._trim_after_burst()

    def _wait_polling_rings(self, rings: RingSet, until: float) -> dict:
        """The sockets' events, waiting at most until `until`, the local clients' rings looked at
        in between (rings.py: a millisecond apart after records came, up to MAX_POLL_S): a look
        that finds nothing costs a load per ring, not a turn of the loop."""
        while True:
            now = time.monotonic()
            wait = min(until - now, rings.wait_s(now))
            events = dict(self._poller.poll(max(0, math.ceil(wait * 1000))))
            if rings.watch_fd is not None and events.pop(rings.watch_fd, None):
                rings.notified()              # a new ring: attached, read at once
            now = time.monotonic()
            if events or now >= until or rings.look(now):
                return events

    def _trim_after_burst(self) -> None:
        """Ingest has been quiet a while: once the sinks' queues are empty, give the heap's freed
        memory back (a burst otherwise leaves the process at its peak)."""
        if self.fanout.queued():
            return
        self._trim_due = False
        if memory.trim_heap():
            self.num_heap_trims += 1

    def post(self, record: OutputRecord) -> None:
        """Thread-safe entry for pollers: the record joins the pipeline on the daemon's thread."""
        self.fanout.post(record)
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the loop is already awake (buffer full) or shutting down

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def stop(self, code: str, reason: str) -> None:
        """Stop serving and drain: `code` one of STOP_REASONS, `reason` its words."""
        assert code in STOP_REASONS, code
        if not self.stop_code:
            self.stop_code, self.stop_reason = code, reason

    def _watched_ended(self, watched: process.Watched) -> None:
        """The process it was started for has exited with no drain request (`telemetry run`
        killed, a user's own --watch-pid script ended): its exit code, where the kernel kept it,
        is the run's, as a drain request would have said (the W&B run ends with it: 137, not 0,
        for a launcher SIGKILLed with its script)."""
        code, how = watched.ended()
        if code is not None and self.control_server.exit_code is None:
            self.control_server.exit_code = code
            log.info("the process it was started for (pid %d) %s: the run's exit code is %d", watched.pid, how, code)
        self.stop("watched_process_exited", f"the process it was started for exited (pid {watched.pid})")

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        self.stop(name.lower(), name)

    # -- control -------------------------------------------------------------------------------
    def _serve_control_while_draining(self) -> None:
        """The control socket's queued requests, answered during a long drain (a status is the
        counters so far; a drain request is answered with the others, at the end)."""
        self.control_server.draining = True
        try:
            self.control_server.serve()
        except Exception as exc:       # nothing asked of it may stop the drain
            log.error("control request during the drain failed: %r", exc)

    def _request_drain(self) -> None:
        """`telemetry drain`: stop as SIGTERM would (the requester is answered after the drain)."""
        self.stop("drain_request", "drain request")

    # -- shutdown (shutdown.py) -----------------------------------------------------------------
    def close_wakeups(self) -> None:
        self._wake_r.close()
        self._wake_w.close()


def _bind(sock: zmq.Socket, ep: str) -> str:
    """Bind and return the endpoint as bound: tcp://127.0.0.1:0 becomes the port the OS picked.
    An ipc path is claimed first (endpoints.claim_ipc): a daemon already serving it is left alone."""
    endpoints.claim_ipc(ep)
    try:
        sock.bind(ep)
    except zmq.ZMQError as exc:   # a port in use: one line and exit 2 (telemetry.daemon.cli)
        raise StartupError(f"cannot bind {ep}: {exc.strerror}") from None
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()

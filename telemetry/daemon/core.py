"""The daemon: one loop that receives, aggregates, derives and hands records to the sinks.

    receiver -> aggregator -> derived -> JSON once -> sinks (JSONL, W&B, TensorBoard, custom),
    each on its own thread behind a bounded queue (full: drops counted), plus PUB, which never
    blocks and so runs inline; the diagnosis rules are a stage fed like a sink, whose events
    come back through post(), as do the pollers' records (from their own threads).

The loop has one shape: poll the sockets with a timeout equal to the next timer's deadline,
dispatch what arrived, then do the housekeeping that is due (expire steps, daemon record).
Shutdown (SIGTERM, SIGINT or a drain request) stops intake, drains the ingest socket, flushes
every stage, fsyncs, and closes, within `drain_timeout_s`; a stage still busy then is abandoned.

The pieces beside the loop, each in its own module: shutdown.py (the drain), self_report.py
(the loss accounting past the receiver's, `status`, the `daemon` record, the progress line),
control_server.py (status, drain, ping), hellos.py and byes.py (what the ranks said at their
start and end), world.py (which ranks a step waits for, the Aggregator's), continuity.py (what
a restarted daemon takes over).
"""
from __future__ import annotations

import collections
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import zmq

from protocol import MAX_FRAME_BYTES, Bye, Event, Hello, Metrics
from protocol import output
from protocol.output import ByeRecord, EventRecord, HelloRecord, MetricsRecord, OutputRecord
from telemetry.shared import catalogue, endpoints, files, run_endpoints, run_lock
from telemetry.daemon import hotpath
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import DaemonConfig
from telemetry.daemon.byes import HeldByes
from telemetry.daemon.continuity import SOURCES_FILE, Continuity
from telemetry.daemon.control_server import ControlServer
from telemetry.daemon.derived import Derived
from telemetry.daemon.hellos import Hellos
from telemetry.daemon.node_clocks import CLOCK_EVENTS, NodeClocks
from telemetry.daemon.node_links import (REMOTE_HEARTBEAT_IVL_MS, REMOTE_HEARTBEAT_TIMEOUT_MS, REMOTE_HEARTBEAT_TTL_MS,
                                         NodeLinks)
from telemetry.daemon.downsample import Downsampler
from telemetry.daemon.intake import Intake
from telemetry.daemon import memory
from telemetry.daemon.receiver import Receiver
from telemetry.daemon import shutdown, self_report
from telemetry.daemon.self_report import Losses
from telemetry.shared.jsonlines import FILE_NAME
from telemetry.shared.media import EVENT as MEDIA_EVENT
from telemetry.shared.security.redact import Redactor
from telemetry.daemon.sinks.base import InlineRunner, Out, SinkRunner, StartupError, batch_bytes

log = logging.getLogger("telemetry.daemon")

READY_LINE = "telemetry daemon ready"
# Frames taken from the ingest socket per loop turn before housekeeping gets a look-in; also the
# unit the receiver, the aggregator and the bulk reduction work in. Small enough for a batch's
# records to stay in the CPU caches between the stages (benchmarks/ingest.py on the 2-core box:
# 4096 was ~30 % slower than 1024; 256 and 512 no faster), large enough to amortise the per-batch
# work.
INGEST_BATCH = 1024
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
# Allocations between young-generation collections (CPython's default is 700); see _tune_gc.
GC_GEN0_THRESHOLD = 50_000
# The most of the time the diagnosis stage's thread may spend on the rules (see SinkRunner).
DIAGNOSIS_MAX_SHARE = 0.25
GOODPUT_MAX_SHARE = 0.05

# Control connections at once (`telemetry status`/`drain` use one for a moment each).
MAX_CONTROL_CONNECTIONS = 64
# The daemon's housekeeping interval: which clients still send (for a drain), --watch-pid. (The
# loss accounting's checkpoints have their own: continuity.py.)
CHECKPOINT_INTERVAL_S = 1.0
# Hang forensics: the check interval. The last records each rank sent are kept in a RecentRing
# bounded by its share of the memory budget (memory.py), not a number of batches.
FORENSICS_CHECK_S = 0.5
# After a burst, once ingest has been quiet this long and the sink queues are empty, the heap's
# freed memory is given back to the system (memory.trim_heap; glibc keeps it otherwise).
TRIM_AFTER_QUIET_S = 2.0


class Daemon:
    def __init__(self, cfg: DaemonConfig, budget: memory.Budget | None = None) -> None:
        """budget: the memory budget with the process's baseline measured (cli.py); None inside
        another process (tests), where nothing is kept by measure (memory.Budget)."""
        self.cfg = cfg
        self.log_dir = Path(cfg.log_dir)
        self.receiver = Receiver()
        self.aggregator = Aggregator(cfg.aggregator)
        self.derived = Derived(cfg.mfu)
        self.derived.forwards = cfg.forward is not None and cfg.forward.enabled
        self.links: NodeLinks | None = None      # a head's: which node each link is (start())
        self.clocks: NodeClocks | None = None    # a head's: each node's clock against its own (start())
        self._diagnosis_stage = None
        self.runners: list[SinkRunner] = []
        self.runners_in_order: list[SinkRunner] = []   # inline ones first; set by start()
        self.pollers: list = []
        self.diagnoser = None
        self.host = socket.gethostname()
        self._out: list[Out] = []
        self.byes = HeldByes()                          # byes behind their records (byes.py)
        self.forensics = None                           # the ForensicsStage, when it runs
        self.goodput = None                             # the GoodputStage, once started
        self.media = None                               # the MediaKeeper (not on a head)
        self.media_files = None                         # who deletes the ranks' media files
        self.fd_limit, self.max_connections = 0, cfg.max_connections   # set by start()
        self._inbox: collections.deque[dict] = collections.deque()
        self.stop_reason = ""
        self.started_mono = time.monotonic()
        self.started_wall = time.time()
        # The accounting and counts a restarted daemon carries over, checkpointed in sources.json.
        self.continuity = Continuity(self.log_dir, self.receiver, self.aggregator, cfg.aggregator.per_rank,
                                     self.started_wall)
        self.num_records_out = 0
        self.num_events_in = 0
        self.losses = Losses()                 # lost past the receiver's accounting (self_report.py)
        self._next_checkpoint = time.monotonic() + CHECKPOINT_INTERVAL_S
        self.unfinished: list[str] = []        # stages still busy at the drain deadline
        self.endpoints: dict[str, str] = {}
        self._next_daemon_record = time.monotonic() + cfg.daemon_record_interval_s
        self._latest_step: MetricsRecord | None = None
        self._progress_logged: MetricsRecord | None = None
        self.redactor = Redactor()   # secrets in hello configs and event data never reach a sink
        # The memory budget (memory.py): each buffer's share, what was shed beyond it.
        self.budget = budget or memory.Budget(cfg.memory_mb)
        self.governor: memory.Governor | None = None     # the budget kept by measure (start)
        self.shed = memory.Shed()
        # The last batches of metrics records, for hang forensics (one append per batch).
        self.recent_metrics = memory.RecentRing(self.budget.recent_bytes, self.shed)
        self.names = self.receiver.names = memory.NameCatalogue(self.budget.max_names, self.shed)
        self.hello_infos = memory.HelloInfos(self.budget.hello_bytes, self.shed)
        self.hellos = Hellos(self.hello_infos, self.redactor)   # each rank's hello info (hellos.py)
        self._pub_sock: zmq.Socket | None = None   # watched for its subscribers (start)
        self._record_bytes = 1024              # estimated bytes of a metrics record in memory (per batch)
        self.batch_frames = INGEST_BATCH      # frames per ingest batch: memory.INGEST_BATCH_BYTES of them
        self._last_ingest_mono = 0.0
        self._trim_due = False                 # records came in since the heap was last trimmed
        self.intake: Intake | None = None      # the ingest socket's read-ahead queue (start)
        self.watch_pid: int | None = None      # --watch-pid: drain once this process has exited
        self.lock_fd: int | None = None       # the runtime directory's daemon.lock, held for life
        self.run_lock_fd: int | None = None   # the log directory's run.lock, held until shutdown
        self.num_heap_trims = 0

    # -- start ---------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        if self.run_lock_fd is None:     # the CLI takes it before it writes anything there
            # One live daemon per log dir (RunDirInUse); then 0700 (or as configured), also when
            # run.sh made it 0755.
            self.run_lock_fd = run_lock.hold(self.log_dir)
        self.continuity.restore()
        self.continuity.write(self.num_records_out)   # a successor on this log dir knows a predecessor existed
        self.endpoints = {
            "ingest": endpoints.resolve("ingest", cfg.ingest, create_dir=True),
            "pub": endpoints.resolve("pub", cfg.pub, create_dir=True),
            "control": endpoints.resolve("control", cfg.control, create_dir=True),
        }
        self.fd_limit, self.max_connections = _raise_fd_limit(cfg.max_connections)
        if cfg.remote_ingest and cfg.aggregator.world_size:
            log.info("head of %d nodes: up to %d ingest connections (max_connections: two a node and the head's "
                     "own; descriptor limit %d)", cfg.aggregator.world_size, self.max_connections, self.fd_limit)
        if self.endpoints["ingest"].startswith("ipc://"):
            # Says "a daemon serves this directory" to whoever would start one (client/autostart.py).
            self.lock_fd = endpoints.hold_daemon_lock(Path(self.endpoints["ingest"][len("ipc://"):]).parent)
        self.ctx = zmq.Context(1)
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
        self.intake = Intake(self.pull, self.budget.ingest_bytes, self.receiver.loops.read_frames_upto,
                             self.receiver.unread_headers, recv=guard.recv if guard is not None else None)
        if self.budget.baseline_mb is not None:
            self.governor = memory.Governor(self.budget, self.intake)
        self.control_server = ControlServer(self.ctx, self.status, self._request_drain, self._exclude)
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
            self.links = NodeLinks()
            self.clocks = NodeClocks()
            self.security.connections.on_tcp_gone = self.links.closed
            self.security.prepare(self.pull, remote, "remote_ingest")
            self.endpoints["remote_ingest"] = _bind(self.pull, remote)
        ingest_eps = tuple(ep for k, ep in self.endpoints.items() if k in ("ingest", "remote_ingest"))
        self.control_server.issue_token(self.endpoints["control"], self.security.control_client_keys()
                                        if "control" in self.security.secured else None)
        self._make_sinks()
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
        self._make_pollers_and_diagnosis()
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
        self.runners_in_order = sorted(self.runners, key=lambda r: not isinstance(r, InlineRunner))
        for runner in self.runners:
            runner.start()
        for p in self.pollers:
            p.start(self.post)
        _tune_gc()
        _warn_open_endpoints(self.endpoints, cfg.security)
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
                        "pure-Python ones, same results at 60-70 % of the ingest rate")

    def _make_sinks(self) -> None:
        from telemetry.daemon.sinks.jsonl import JsonlSink
        from telemetry.daemon.sinks.pub import PubSink, bind_pub

        cfg = self.cfg
        j = cfg.jsonl
        self.jsonl_runner = self._add_runner(
            JsonlSink(self.log_dir, fsync_interval_s=j.fsync_interval_s, rotate_bytes=int(j.rotate_mb * 2**20),
                      sources_file=SOURCES_FILE), j)
        self.jsonl_runner.sink.num_repaired_bytes = self.continuity.repaired_bytes
        pub_sock = bind_pub(self.ctx, self.endpoints["pub"], prepare=self.security.prepare)
        self.endpoints["pub"] = pub_sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        if cfg.pub_sink.enabled:
            self._add_runner(PubSink(pub_sock), cfg.pub_sink)
            self._pub_sock = pub_sock
        else:
            pub_sock.close(linger=0)
        with_wandb = cfg.wandb.enabled and cfg.wandb.mode != "disabled"
        if not cfg.remote_ingest:
            # The ranks' media files (on this host; a head's ranks are on others): kept for the
            # dashboard, and each deleted by the last of its readers (media_keeper.py).
            from telemetry.daemon.media_keeper import READER, MediaFiles, MediaKeeper
            from telemetry.daemon.sinks.wandb_sink import MEDIA_READER     # (wandb itself: at its start)

            self.media_files = MediaFiles((READER, MEDIA_READER) if with_wandb else (READER,))
            self.media = MediaKeeper(self.log_dir, self.media_files, keep=cfg.media.keep,
                                     max_bytes=int(cfg.media.max_mb * 2**20))
            self.media.start()
        if with_wandb:
            from telemetry.daemon.sinks.wandb_sink import WandbSink

            w = cfg.wandb
            self._add_runner(WandbSink(w.mode, self.log_dir, cfg.run_name, project=w.project, entity=w.entity,
                                       finish_timeout_s=w.finish_timeout_s, media_files=self.media_files,
                                       summaries=catalogue.wandb_summaries(cfg.declared_metrics())), w)
        if cfg.tensorboard.enabled:
            from telemetry.daemon.sinks.tensorboard import TensorBoardSink

            self._add_runner(TensorBoardSink(self.log_dir), cfg.tensorboard)
        if cfg.otlp.enabled:
            from telemetry.daemon.sinks.otlp import OtlpSink

            o = cfg.otlp
            node_rank = cfg.forward.node_rank if cfg.forward is not None and cfg.forward.enabled else None
            self._add_runner(OtlpSink(self.log_dir, o.endpoint, cfg.run_name, job=o.job,
                                      export_interval_s=o.export_interval_s, timeout_s=o.timeout_s,
                                      headers=o.headers, host=self.host, node_rank=node_rank), o)
        for i, c in enumerate(cfg.custom_sinks):
            if c.enabled:
                self._add_runner(_load_sink(c.cls, self.log_dir, c.options, f"custom_sinks[{i}]"), c)
        if cfg.forward is not None and cfg.forward.enabled:
            from telemetry.daemon.sinks.forward import ForwardSink

            # With a remote ingest too, this daemon is a group head: it forwards its nodes' records.
            self._add_runner(ForwardSink(cfg.forward, relay=bool(cfg.remote_ingest)), cfg.forward)

    def _add_runner(self, sink, sink_cfg) -> SinkRunner:
        ds = None
        if sink_cfg.every_n_steps > 1 or sink_cfg.max_per_second > 0:
            # The window's own rules: the cross-rank overrides (a user's "sum" for a rate) would
            # add up a window's steps (a steady 1,000/s made 4,000 over 4 steps).
            ds = Downsampler(sink_cfg.every_n_steps, sink_cfg.max_per_second, self.cfg.aggregator.window_reductions)
        cls = InlineRunner if getattr(sink, "inline", False) else SinkRunner
        runner = cls(sink, max_queued=sink_cfg.max_queued, downsampler=ds, max_bytes=self.budget.sink_queue_bytes)
        self.runners.append(runner)
        return runner

    def _make_pollers_and_diagnosis(self) -> None:
        from telemetry.daemon.diagnosis import Diagnoser
        from telemetry.daemon.diagnosis.stage import TICK_INTERVAL_S, DiagnosisStage
        from telemetry.daemon.pollers import make_pollers

        self.pollers = make_pollers(self.cfg.pollers)
        self.diagnoser = Diagnoser(self.cfg.diagnosis, unit="node" if self.cfg.remote_ingest else "rank")
        self._add_forensics()       # also verifies this host's ranks for the pollers: always
        self._add_goodput()
        if not self.cfg.diagnosis.enabled:
            return
        # Off the daemon's thread: the rules cost per step; their events come back via post().
        # Held to a share of the time, so a backlog costs ingest little (what the rules cannot get
        # to is dropped and counted in the stage's stats).
        self._diagnosis_stage = DiagnosisStage(self.diagnoser, self.post)
        runner = SinkRunner(self._diagnosis_stage, max_queued=10_000,
                            flush_interval_s=TICK_INTERVAL_S, max_share=DIAGNOSIS_MAX_SHARE,
                            max_bytes=self.budget.sink_queue_bytes)
        self.runners.append(runner)

    def _add_goodput(self) -> None:
        """The goodput ledger, live (telemetry/daemon/goodput_stage.py): on its own thread, held
        to GOODPUT_MAX_SHARE of the time (a step costs it ~2-5 µs: 5 % is 10,000 steps a second;
        a burst waits in its queue, and at the drain it runs at full speed); it first reads what
        this log directory holds."""
        from telemetry.daemon.goodput_stage import GoodputStage

        # Without --per-rank the per-rank records go to it alone, for the per-rank ledgers
        # (goodput_stage.py), bounded like a sink queue (memory.py). Not on a head (remote
        # ingest): its "ranks" are nodes, thousands of them, whose own daemons keep their ranks'.
        rank_bytes = (0 if self.cfg.aggregator.per_rank or self.cfg.remote_ingest
                      else self.budget.sink_queue_bytes // 4)
        self.goodput = GoodputStage(self.log_dir, FILE_NAME, rank_bytes_max=rank_bytes)
        self.runners.append(SinkRunner(self.goodput, max_queued=100_000, max_share=GOODPUT_MAX_SHARE,
                                       max_bytes=self.budget.sink_queue_bytes))

    def _add_forensics(self) -> None:
        """Hang and crash forensics on their own thread (telemetry/daemon/forensics/). The stage
        also decides which hellos are this host's ranks: it verifies each claim in /proc (off
        this thread) and hands the verified pids to the pollers; nothing else here acts on a pid."""
        from telemetry.daemon.forensics import ForensicsStage

        def set_rank_pids(pids: dict[int, int]) -> None:
            for p in self.pollers:
                p.set_rank_pids(pids)

        stage = ForensicsStage(self.cfg.diagnosis, self.log_dir, self.host, self.post, self.recent_metrics,
                               ingest=self.endpoints["ingest"], on_ranks=set_rank_pids)
        self.forensics = stage
        self.runners.append(SinkRunner(stage, max_queued=10_000, flush_interval_s=FORENSICS_CHECK_S,
                                       max_bytes=self.budget.sink_queue_bytes))

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until SIGTERM, SIGINT or a drain request; then drain and return the exit code."""
        while not self.stop_reason:
            self.turn()
        return shutdown.run(self)

    def turn(self, max_wait_s: float | None = None) -> None:
        """One turn of the loop: wait for input or the next timer, dispatch, housekeeping."""
        now = time.monotonic()
        deadline = min(self._next_daemon_record, self._next_step_deadline(now), self._next_checkpoint)
        timeout_ms = max(0, min(MAX_POLL_MS, int((deadline - now) * 1000) + 1))
        if max_wait_s is not None:
            timeout_ms = min(timeout_ms, int(max_wait_s * 1000))
        if len(self.intake):
            timeout_ms = 0                 # frames read ahead are waiting
        events = dict(self._poller.poll(timeout_ms))
        if self.pull in events or len(self.intake):
            self.ingest(self.batch_frames)
        if self.control in events:
            self.control_server.serve()
        if self._wake_r.fileno() in events:
            self._drain_wakeups()
        now = time.monotonic()
        self.take_inbox()
        self.emit_steps(self.aggregator.expire(now))
        if self.byes:
            self.write_byes(self.byes.release(now, self.receiver.sources))
        if self.links is not None and self.links.busy():
            for rec in self.links.due(now, self.receiver.sources):
                self.emit(rec)
                if self._diagnosis_stage is not None:
                    self._diagnosis_stage.note(rec)      # the rules read no event but this kind
        if now >= self._next_daemon_record:
            self.emit(self.daemon_record())
            self._log_progress()
            self._next_daemon_record = now + self.cfg.daemon_record_interval_s
        checkpoint_due = self.continuity.due(now, self.num_records_out + len(self._out))
        if now >= self._next_checkpoint:
            self.receiver.mark_progress()      # which clients are still sending, for a drain
            self._next_checkpoint = now + CHECKPOINT_INTERVAL_S
            if self.watch_pid is not None and not _alive(self.watch_pid):
                self.stop_reason = f"the process it was started for exited (pid {self.watch_pid})"
        self.hand_out()
        if checkpoint_due:
            self.continuity.through_jsonl(self.jsonl_runner, self.num_records_out)
        if self.governor is not None and now >= self.governor.next_check:
            self.governor.check(now)
        if self._trim_due and now - self._last_ingest_mono >= TRIM_AFTER_QUIET_S:
            self._trim_after_burst()

    def _trim_after_burst(self) -> None:
        """Ingest has been quiet a while: once the sinks' queues are empty, give the heap's freed
        memory back (a burst otherwise leaves the process at its peak)."""
        if any(r.queued() for r in self.runners):
            return
        self._trim_due = False
        if memory.trim_heap():
            self.num_heap_trims += 1

    def _next_step_deadline(self, now: float) -> float:
        deadline = self.aggregator.next_deadline()
        return now + MAX_POLL_MS / 1000 if deadline is None else deadline

    def ingest(self, max_frames: int) -> int:
        """Read ahead what the ingest socket holds (Intake.fill: bounded in bytes, the excess shed
        and counted), then take up to `max_frames` frames from the head of that queue; return
        how many were taken.

        The hot path, in batches: the receiver takes the frames from the intake queue, decodes and
        accounts them, the aggregator adds the metrics records to their steps, and the steps
        they complete go out together (_emit_steps). Records are single frames; the parts of a
        multipart message are taken as frames of their own (see protocol/README.md): a garbage
        part is counted as malformed.
        """
        intake = self.intake
        shed_before, cut_before = intake.num_shed, intake.num_hellos_cut
        intake.fill()
        if intake.num_shed != shed_before:
            self.shed.add("ingest_frames", intake.num_shed - shed_before,
                          "frames beyond the ingest share, read ahead of a busy pipeline, are shed "
                          "(and counted lost: records_shed_at_intake)")
        if intake.num_hellos_cut != cut_before:
            self.shed.add("hellos_cut_at_intake", intake.num_hellos_cut - cut_before,
                          "hellos with an info bigger than is kept (64 KiB of JSON) are cut as they are read, "
                          "to their scalars when beyond the ingest share")
        recs, all_metrics, n = self.receiver.take(intake.pop, IndexError, max_frames)
        if not n:
            return 0
        intake.taken(n, self.receiver.batch_bytes)
        frame_bytes = self.receiver.batch_bytes // n + 1
        self._record_bytes = frame_bytes * memory.RECORD_BYTES_PER_FRAME_BYTE
        self.batch_frames = max(1, min(INGEST_BATCH, memory.INGEST_BATCH_BYTES // frame_bytes))
        self._trim_due = True
        self._last_ingest_mono = time.monotonic()
        if all_metrics:
            self._add_metrics(recs)
            return n
        run: list = []               # metrics in a row; other kinds are handled in order of arrival
        clocks = self.clocks
        for rec in _in_program_order(recs):
            kind = type(rec)
            if kind is Metrics:
                run.append(rec)
                continue
            if run:
                self._add_metrics(run)
                run = []
            try:
                if clocks is not None:
                    if kind is Hello or kind is Event and rec.name in CLOCK_EVENTS:
                        self._observe_clock(rec)
                    off = clocks.offset_ns.get(rec.src)
                    if off is not None:
                        rec = clocks.correct_one(rec, off)
                if kind is Event:
                    self.num_events_in += 1
                    data = self.redactor(rec.data)
                    self.emit(EventRecord(rec.t_ns / 1e9, rec.rank, rec.name, data))
                    if rec.name == MEDIA_EVENT and self.media is not None:
                        self.media.put(rec.rank, data)
                elif kind is Hello:
                    self.receiver.note_hello(rec.src)
                    self._on_hello(rec)
                elif kind is Bye:
                    self._on_bye(rec)
            except Exception as exc:          # the boundary should have caught it: counted, go on
                self.losses.failed(kind.__name__.lower(), exc, 1)
        if run:
            self._add_metrics(run)
        return n

    def _on_bye(self, rec: Bye) -> None:
        """Counted by the receiver; passed on so the diagnosis knows a silent rank finished,
        after the records of its client that are still on their way (held up to BYE_HOLD_S)."""
        self.receiver.note_bye(rec.src)
        if self.forensics is not None:
            self.forensics.note_bye(rec.rank)      # this rank finished: its exit is no crash
        if not self.byes.hold(rec, self.receiver.sources.get(rec.src), time.monotonic()):
            self.write_byes([rec])

    def write_byes(self, byes: list[Bye]) -> None:
        for rec in byes:
            self.emit(ByeRecord(rec.t_ns / 1e9, rec.rank, rec.stats))

    def _observe_clock(self, rec) -> None:
        """A node's record made as it was sent: its clock against this daemon's (node_clocks.py)."""
        change = self.clocks.observe(rec.src, rec.rank, rec.t_ns, time.time_ns())
        if change is None:
            return
        self.emit(change)
        off = change["data"]["offset_s"]
        unit = self.diagnoser.unit if self.diagnoser is not None else "node"
        if off:
            log.warning("%s %d's clock is %.1f s %s this daemon's: its records' times are moved by that from "
                        "now on (an event clock_offset says so)", unit, rec.rank, abs(off),
                        "ahead of" if off > 0 else "behind")
        else:
            log.warning("%s %d's clock agrees with this daemon's again: its records' times are no longer moved",
                        unit, rec.rank)

    def _add_metrics(self, recs: list) -> None:
        if self.clocks is not None and self.clocks.offset_ns:
            recs = self.clocks.correct(recs)
        self.recent_metrics.append(recs, len(recs) * self._record_bytes)
        if self.cfg.aggregator.per_rank:
            for rec in recs:
                self._emit_rank(rec)
        try:
            closed, late = self.aggregator.add_many(recs)
        except Exception as exc:              # the boundary should have caught it: counted, go on
            self.losses.failed("aggregator", exc, len(recs))
            return
        if not self.cfg.aggregator.per_rank:
            for rec in late:
                self._emit_rank(rec, late=True)   # its step went out without it; keep it
            if self.goodput is not None and self.goodput.rank_bytes_max:   # before their steps go out
                if late:
                    late_ids = set(map(id, late))
                    recs = [r for r in recs if id(r) not in late_ids]
                self.goodput.take_rank_records(recs, len(recs) * self._record_bytes)
        self.emit_steps(closed)
        max_open = self.budget.open_steps_bytes // self._record_bytes
        if self.aggregator.num_open_records > max_open:
            early = self.aggregator.shed_oldest(max_open)
            self.shed.add("steps_closed_early", len(early), "steps waited on hold more records than their share: "
                          "the oldest go out early, without the ranks that have not reported")
            self.emit_steps(early)

    def _emit_rank(self, rec: Metrics, late: bool = False) -> None:
        out = MetricsRecord(rec.t_ns / 1e9, rec.step, rec.values, rank=rec.rank)
        if late:
            out.late = True
        self.emit(out)

    def _on_hello(self, rec: Hello) -> None:
        info = self.hellos.take(rec.rank, rec.info)
        # A node daemon (forward) sees a slice of the global ranks: it waits for the ranks it has seen.
        if not self.cfg.forward:
            ws = self.hellos.world_size(rec.rank, info)
            if ws is not None:
                self.aggregator.world.note_size(ws)
        if info.get("forwarded_by") == "group head" and self.cfg.remote_ingest and self.diagnoser.unit != "group":
            # A job head fed by group heads: its "ranks" are groups of nodes, and its findings say so.
            self.diagnoser.unit = "group"
        if self.links is not None and info.get("forwarded_by"):
            self.links.on_hello(rec.rank, info, rec.src)
        self.derived.on_hello(info)
        # A pid in a hello is a claim: the forensics stage verifies it before the pollers or the
        # forensics act on it (telemetry/daemon/forensics/verify.py).
        self.emit(HelloRecord(rec.t_ns / 1e9, rec.rank, info))

    def emit_steps(self, accs: list) -> None:
        """The steps the aggregator closed, reduced across ranks, with their derived metrics; in
        chunks whose steps x names table fits memory.MAX_BATCH_CELLS (steps with different names
        each make that table grow as steps x all their names)."""
        if not accs:
            return
        chunk = max(1, memory.MAX_BATCH_CELLS // max(1, len(self.names)))
        if len(accs) > chunk:
            for i in range(0, len(accs), chunk):
                self.emit_steps(accs[i:i + chunk])
            return
        try:
            batch, recs = self.aggregator.finish_batch(accs)
        except Exception as exc:              # the boundary should have caught it: counted, go on
            self.losses.failed("reduce", exc, sum(len(acc.records) for acc in accs))
            return
        # A derivation that fails costs its names in this batch, never the steps (derived.py).
        for what, exc in self.derived.apply(batch, [rec.values for rec in recs], self.aggregator.world.size()):
            self.losses.failed(f"derived: {what}", exc, 0)
        for acc, rec in zip(accs, recs):
            try:
                line = output.encode(rec)
            except Exception as exc:
                self.losses.failed("encode", exc, len(acc.records))
                continue
            self._out.append(Out("metrics", rec, line))
        self._latest_step = recs[-1]

    def _log_progress(self) -> None:
        """One line per daemon-record interval, when a step has gone out since the last."""
        rec = self._latest_step
        if rec is None or rec is self._progress_logged:
            return
        self._progress_logged = rec
        log.info("%s", self_report.progress_line(self, rec))

    def _exclude(self, window: dict) -> None:
        """A planned-maintenance window from the control socket (`telemetry goodput --exclude`):
        an event of the run, the daemon's (no rank), for every ledger of it (goodput.py)."""
        from telemetry.shared.goodput import EXCLUDE

        self.emit(EventRecord(time.time(), None, EXCLUDE, window))

    def emit(self, rec: OutputRecord) -> None:
        self._out.append(Out(rec.kind, rec, output.encode(rec)))

    def hand_out(self) -> None:
        if not self._out:
            return
        batch, self._out = self._out, []
        self.num_records_out += len(batch)
        num_bytes = batch_bytes(batch)        # once for every queue (they hold the same records)
        # Inline sinks (PUB) first: subscribers get the batch before any sink thread is woken.
        for runner in self.runners_in_order:
            runner.put(batch, num_bytes)

    def post(self, record: OutputRecord) -> None:
        """Thread-safe entry for pollers: the record joins the pipeline on the daemon's thread."""
        self._inbox.append(record)
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the loop is already awake (buffer full) or shutting down

    def take_inbox(self) -> None:
        inbox = self._inbox
        while inbox:
            self.emit(inbox.popleft())

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _on_signal(self, signum: int, frame) -> None:
        self.stop_reason = signal.Signals(signum).name

    # -- control -------------------------------------------------------------------------------
    def _request_drain(self) -> None:
        """`telemetry drain`: stop as SIGTERM would (the requester is answered after the drain)."""
        self.stop_reason = "drain request"

    def status(self) -> dict:
        return self_report.status(self)

    def daemon_record(self) -> dict:
        return self_report.daemon_record(self)

    # -- shutdown (shutdown.py) -----------------------------------------------------------------
    def close_wakeups(self) -> None:
        self._wake_r.close()
        self._wake_w.close()


# Descriptors the daemon needs besides its ingest connections: files, sinks, pollers, sockets.
FD_RESERVE = 256


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return True


def _raise_fd_limit(max_connections: int) -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one (libzmq aborts when accept() runs out of
    descriptors); returns the soft limit now and the connections that fit in it: max_connections,
    or fewer (with a warning) when the hard limit leaves no room for them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %r", soft, want, exc)
    room = (soft if soft != resource.RLIM_INFINITY else 1 << 20) - FD_RESERVE
    if max_connections > room:
        log.warning("max_connections %d does not fit the descriptor limit %d: %d connections at most",
                    max_connections, soft, max(1, room))
        max_connections = max(1, room)
    return soft, max_connections


def _in_program_order(recs: list) -> list:
    """A batch with each client's records in the order it made them (by seq), in the slots its
    records held; the others' order is kept. A client sends its metrics with tensor values from
    its sender thread, on that thread's own socket (telemetry/client/deferred.py), and everything
    else on its main socket: two pipes, which the ingest socket interleaves in any order. So an
    event sent before a step's record (wandb/nested: how W&B must store that step's keys;
    wandb/values: the text values of its row) could be handled after the step went out (a
    loaded machine, both in one batch). Costs a pass over batches that hold other kinds than
    metrics; a sort only where a client's records came out of order."""
    last: dict[int, int] = {}
    for rec in recs:
        src, seq = rec.src, rec.seq
        if last.get(src, -1) > seq:
            break
        last[src] = seq
    else:
        return recs
    slots: dict[int, list[int]] = {}
    for i, rec in enumerate(recs):
        slots.setdefault(rec.src, []).append(i)
    out = list(recs)
    for idx in slots.values():
        if len(idx) > 1:
            for i, rec in zip(idx, sorted((recs[i] for i in idx), key=_by_seq)):
                out[i] = rec
    return out


def _by_seq(rec) -> int:
    return rec.seq


def _tune_gc() -> None:
    """Records are acyclic dicts freed by reference counting; the cyclic collector only costs.

    With the default thresholds it runs every 700 allocations and, under load, its older
    generations rescan every record waiting in the sink queues (measured: ~1-3 us per record
    of ingest). Everything built at start-up (imports, sockets, sinks) is frozen out of its
    reach, and collections are made rarer; they still run, so a cycle is still freed.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 50, 100)


def _load_sink(spec: str, log_dir: Path, options: dict, key: str):
    """Build a custom sink from "package.module:ClassName"; `key` names its config entry."""
    import importlib

    from telemetry.shared.config import ConfigError

    mod_name, _, cls_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
        return cls(log_dir=log_dir, **options)
    except Exception as exc:   # the user's code: any failure is a bad config entry, not a crash
        raise ConfigError(f"{key}: cannot build custom sink {spec}: {exc!r}") from None


# What another local user can do with a socket of ours that they can connect to.
_OPEN_TO = {"ingest": "send it records (forged steps, events, hellos)", "remote_ingest": "send it records",
            "pub": "read every record from it", "control": "connect to it (status and drain need its token)"}


def _warn_open_endpoints(eps: dict[str, str], security) -> None:
    """One warning line, at start, naming each socket bound to loopback TCP without CURVE: every
    local user can connect to those. ipc sockets in the private (0700) runtime directory are the
    owner's alone and need no word; beyond loopback the daemon refuses to start without CURVE."""
    from telemetry.shared.security.curve import needs_curve

    open_eps = [f"{name} {ep} (any local user can {_OPEN_TO.get(name, 'connect to it')})"
                for name, ep in eps.items()
                if ep.startswith("tcp://") and not (security.enabled and needs_curve(ep, security))]
    if open_eps:
        log.warning("open to every local user (loopback TCP without CURVE): %s. To close them: ipc "
                    "endpoints (the default, in a private 0700 directory) or CURVE on loopback "
                    "(security.curve_loopback; README \"Trust model\")", "; ".join(open_eps))


def _bind(sock: zmq.Socket, ep: str) -> str:
    """Bind and return the endpoint as bound: tcp://127.0.0.1:0 becomes the port the OS picked.
    An ipc path is claimed first (endpoints.claim_ipc): a daemon already serving it is left alone."""
    endpoints.claim_ipc(ep)
    try:
        sock.bind(ep)
    except zmq.ZMQError as exc:   # a port in use: one line and exit 2 (telemetry.daemon.cli)
        raise StartupError(f"cannot bind {ep}: {exc.strerror}") from None
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()


def setup_logging(log_dir: Path, level: int = logging.INFO) -> None:
    try:
        files.make_dir(log_dir, own=True)
        # Made (or an older one brought to) the run-file mode first: FileHandler keeps what it finds.
        os.close(files.open_fd(log_dir / "daemon.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT))
        handlers = (logging.StreamHandler(sys.stderr), logging.FileHandler(log_dir / "daemon.log"))
    except OSError as exc:
        raise StartupError(f"cannot use {log_dir} as the log directory: {exc.strerror or exc}") from None
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger("telemetry")
    root.setLevel(level)
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)

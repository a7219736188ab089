"""The daemon: one loop that receives, aggregates, derives and hands records to the sinks.

    receiver -> aggregator -> derived -> JSON once -> sinks (JSONL, W&B, TensorBoard, custom),
    each on its own thread behind a bounded queue (full: drops counted), plus PUB, which never
    blocks and so runs inline; the diagnosis rules are a stage fed like a sink, whose events
    come back through post(), as do the pollers' records (from their own threads).

The loop has one shape: poll the sockets with a timeout equal to the next timer's deadline,
dispatch what arrived, then do the housekeeping that is due (expire steps, daemon record).
Shutdown (SIGTERM, SIGINT or a drain request) stops intake, drains the ingest socket, flushes
every stage, fsyncs, and closes, within `drain_timeout_s`; a stage still busy then is abandoned.
"""
from __future__ import annotations

import collections
import logging
import os
import signal
import socket
import sys
import threading
import time
from functools import partial
from itertools import repeat
from pathlib import Path

import msgspec
import zmq

from protocol import MAX_FRAME_BYTES, Bye, Event, Hello, Metrics
from telemetry import endpoints
from telemetry.daemon import hotpath
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import DaemonConfig
from telemetry.daemon.control import parse_request
from telemetry.daemon.derived import Derived
from telemetry.daemon.downsample import Downsampler
from telemetry.daemon.receiver import Receiver
from telemetry.security.redact import Redactor
from telemetry.sinks.base import InlineRunner, Out, SinkRunner

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
# At shutdown, intake ends once the ingest socket has been quiet this long (records still on the
# wire from ranks that just closed get in) or after INTAKE_MAX_S (ranks still sending).
INTAKE_QUIET_S = 0.05
# Allocations between young-generation collections (CPython's default is 700); see _tune_gc.
GC_GEN0_THRESHOLD = 50_000
INTAKE_MAX_S = 1.0
# The most of the time the diagnosis stage's thread may spend on the rules (see SinkRunner).
DIAGNOSIS_MAX_SHARE = 0.25

_json = msgspec.json.Encoder()


class Daemon:
    def __init__(self, cfg: DaemonConfig) -> None:
        self.cfg = cfg
        self.log_dir = Path(cfg.log_dir)
        self.receiver = Receiver()
        self.aggregator = Aggregator(cfg.aggregator)
        self.derived = Derived(cfg.mfu)
        self.hellos: dict[int, dict] = {}
        self.runners: list[SinkRunner] = []
        self._runners_in_order: list[SinkRunner] = []   # inline ones first; set by start()
        self.pollers: list = []
        self.diagnoser = None
        self.host = socket.gethostname()
        self._out: list[Out] = []
        self._inbox: collections.deque[dict] = collections.deque()
        self._stop_reason = ""
        self._drain_requesters: list[bytes] = []
        self._started_mono = time.monotonic()
        self._started_wall = time.time()
        self.num_records_out = 0
        self.num_hellos = 0
        self.num_events_in = 0
        self.unfinished: list[str] = []        # stages still busy at the drain deadline
        self.endpoints: dict[str, str] = {}
        self._next_daemon_record = time.monotonic() + cfg.daemon_record_interval_s
        self._latest_step: dict | None = None
        self._progress_logged: dict | None = None
        self._redact = Redactor()   # secrets in hello configs and event data never reach a sink

    # -- start ---------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.endpoints = {
            "ingest": endpoints.resolve("ingest", cfg.ingest, create_dir=True),
            "pub": endpoints.resolve("pub", cfg.pub, create_dir=True),
            "control": endpoints.resolve("control", cfg.control, create_dir=True),
        }
        self.ctx = zmq.Context(1)
        # Refuses (SecurityError) to listen beyond loopback without CURVE; runs the allow-list.
        from telemetry.security.curve import DaemonSecurity, SecurityConfig

        remote = endpoints.normalize(cfg.remote_ingest) if cfg.remote_ingest else ""
        self.security = DaemonSecurity(self.ctx, SecurityConfig.from_dict(cfg.security),
                                       {**self.endpoints, "remote_ingest": remote})
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, cfg.rcvhwm)
        self.pull.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.control = self.ctx.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.setsockopt(zmq.MAXMSGSIZE, 1 << 16)
        for name, sock in (("ingest", self.pull), ("control", self.control)):
            self.security.prepare(sock, self.endpoints[name], name)
            self.endpoints[name] = _bind(sock, self.endpoints[name])
        if remote:
            # Node daemons: a second listener on the same PULL socket, with its own options.
            self.security.prepare(self.pull, remote, "remote_ingest")
            self.endpoints["remote_ingest"] = _bind(self.pull, remote)
        self.security.watch({"ingest": self.pull})
        self._make_sinks()
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
        self._runners_in_order = sorted(self.runners, key=lambda r: not isinstance(r, InlineRunner))
        for runner in self.runners:
            runner.start()
        for p in self.pollers:
            p.start(self.post)
        _tune_gc()
        eps = " ".join(f"{k}={v}" for k, v in self.endpoints.items())
        print(f"{READY_LINE} pid={os.getpid()} {eps} log_dir={self.log_dir}", flush=True)
        log.info("ready: %s", eps)
        if hotpath.native is None and not hotpath.chosen_python():
            log.warning("the C inner loops are not built (no C compiler at install?): running the "
                        "pure-Python ones, same results at 60-70 % of the ingest rate")

    def _make_sinks(self) -> None:
        from telemetry.sinks.jsonl import JsonlSink
        from telemetry.sinks.pub import PubSink, bind_pub

        cfg = self.cfg
        j = cfg.jsonl
        self.jsonl_runner = self._add_runner(
            JsonlSink(self.log_dir, fsync_interval_s=j.fsync_interval_s, rotate_bytes=int(j.rotate_mb * 2**20)), j)
        pub_sock = bind_pub(self.ctx, self.endpoints["pub"], prepare=self.security.prepare)
        self.endpoints["pub"] = pub_sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        if cfg.pub_sink.enabled:
            self._add_runner(PubSink(pub_sock), cfg.pub_sink)
        else:
            pub_sock.close(linger=0)
        if cfg.wandb.enabled and cfg.wandb.mode != "disabled":
            from telemetry.sinks.wandb_sink import WandbSink

            w = cfg.wandb
            self._add_runner(WandbSink(w.mode, self.log_dir, cfg.run_name, project=w.project, entity=w.entity,
                                       finish_timeout_s=w.finish_timeout_s), w)
        if cfg.tensorboard.enabled:
            from telemetry.sinks.tensorboard import TensorBoardSink

            self._add_runner(TensorBoardSink(self.log_dir), cfg.tensorboard)
        for c in cfg.custom_sinks:
            if c.enabled:
                self._add_runner(_load_sink(c.cls, self.log_dir, c.options), c)
        if cfg.forward:
            from telemetry.sinks.forward import ForwardConfig, ForwardSink

            fwd = ForwardConfig.from_dict(cfg.forward)
            self._add_runner(ForwardSink(fwd), fwd)

    def _add_runner(self, sink, sink_cfg) -> SinkRunner:
        ds = None
        if sink_cfg.every_n_steps > 1 or sink_cfg.max_per_second > 0:
            ds = Downsampler(sink_cfg.every_n_steps, sink_cfg.max_per_second, self.cfg.aggregator.reductions)
        cls = InlineRunner if getattr(sink, "inline", False) else SinkRunner
        runner = cls(sink, max_queued=sink_cfg.max_queued, downsampler=ds)
        self.runners.append(runner)
        return runner

    def _make_pollers_and_diagnosis(self) -> None:
        from telemetry.daemon.diagnosis_stage import TICK_INTERVAL_S, DiagnosisStage
        from telemetry.diagnosis import Diagnoser, DiagnosisConfig
        from telemetry.pollers import make_pollers
        from telemetry.pollers.config import PollersConfig

        self.pollers = make_pollers(PollersConfig.from_dict(self.cfg.pollers))
        self.diagnoser = Diagnoser(DiagnosisConfig.from_dict(self.cfg.diagnosis))
        if not getattr(self.diagnoser.cfg, "enabled", True):
            return
        # Off the daemon's thread: the rules cost per step; their events come back via post().
        # Held to a share of the time, so a backlog costs ingest little (what the rules cannot get
        # to is dropped and counted in the stage's stats).
        runner = SinkRunner(DiagnosisStage(self.diagnoser, self.post), max_queued=10_000,
                            flush_interval_s=TICK_INTERVAL_S, max_share=DIAGNOSIS_MAX_SHARE)
        self.runners.append(runner)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until SIGTERM, SIGINT or a drain request; then drain and return the exit code."""
        while not self._stop_reason:
            self.turn()
        return self._shutdown()

    def turn(self, max_wait_s: float | None = None) -> None:
        """One turn of the loop: wait for input or the next timer, dispatch, housekeeping."""
        now = time.monotonic()
        deadline = min(self._next_daemon_record, self._next_step_deadline(now))
        timeout_ms = max(0, min(MAX_POLL_MS, int((deadline - now) * 1000) + 1))
        if max_wait_s is not None:
            timeout_ms = min(timeout_ms, int(max_wait_s * 1000))
        events = dict(self._poller.poll(timeout_ms))
        if self.pull in events:
            self._ingest(INGEST_BATCH)
        if self.control in events:
            self._serve_control()
        if self._wake_r.fileno() in events:
            self._drain_wakeups()
        now = time.monotonic()
        self._take_inbox()
        self._emit_steps(self.aggregator.expire(now))
        if now >= self._next_daemon_record:
            self._emit(self._daemon_record())
            self._log_progress()
            self._next_daemon_record = now + self.cfg.daemon_record_interval_s
        self._hand_out()

    def _next_step_deadline(self, now: float) -> float:
        deadline = self.aggregator.next_deadline()
        return now + MAX_POLL_MS / 1000 if deadline is None else deadline

    def _ingest(self, max_frames: int) -> int:
        """Take up to `max_frames` frames off the ingest socket; return how many were taken.

        The hot path, in batches: the receiver takes the frames off the socket, decodes and
        accounts them in one loop, the aggregator adds the metrics in one loop, and the steps
        they complete are reduced together (Aggregator.finish_many); per record, no Python call
        but the socket's and the decoder's. Records are single frames; the parts of a multipart
        message are taken as frames of their own (see protocol/README.md): a garbage part is
        counted as malformed; nothing per good record.
        """
        recs, key_orders, all_metrics, n = self.receiver.take(partial(self.pull.recv, zmq.NOBLOCK), zmq.Again,
                                                              max_frames)
        if not n:
            return 0
        if all_metrics:
            self._add_metrics(recs, key_orders)
            return n
        run: list = []               # metrics in a row; other kinds are handled in order of arrival
        run_keys: list = []
        for rec, keys in zip(recs, key_orders):
            kind = type(rec)
            if kind is Metrics:
                run.append(rec)
                run_keys.append(keys)
                continue
            if run:
                self._add_metrics(run, run_keys)
                run, run_keys = [], []
            if kind is Event:
                self.num_events_in += 1
                self._emit({"kind": "event", "t": rec.t_ns / 1e9, "rank": rec.rank, "name": rec.name,
                            "data": self._redact(rec.data)})
            elif kind is Hello:
                self._on_hello(rec)
            elif kind is Bye:
                # Counted by the receiver; passed on so the diagnosis knows a silent rank finished.
                self._emit({"kind": "bye", "t": rec.t_ns / 1e9, "rank": rec.rank, "stats": rec.stats})
        if run:
            self._add_metrics(run, run_keys)
        return n

    def _add_metrics(self, recs: list, key_orders: list) -> None:
        if self.cfg.aggregator.per_rank:
            for rec in recs:
                self._emit_rank(rec)
        closed, late = self.aggregator.add_many(recs, key_orders)
        if not self.cfg.aggregator.per_rank:
            for rec in late:
                self._emit_rank(rec, late=True)   # its step went out without it; keep it
        self._emit_steps(closed)

    def _emit_rank(self, rec: Metrics, late: bool = False) -> None:
        out = {"kind": "metrics", "t": rec.t_ns / 1e9, "step": rec.step, "rank": rec.rank, "values": rec.values}
        if late:
            out["late"] = True
        self._emit(out)

    def _on_hello(self, rec: Hello) -> None:
        info = self._redact(rec.info)
        self.hellos[rec.rank] = info
        self.num_hellos += 1
        ws = info.get("world_size")
        # A node daemon (forward) sees a slice of the global ranks: it waits for the ranks it has seen.
        if isinstance(ws, int) and ws > 0 and not self.cfg.forward:
            self.aggregator.note_world_size(ws)
        self.derived.on_hello(info)
        # Only this host's ranks: a head daemon also hears of ranks on other nodes.
        pids = {r: h["pid"] for r, h in self.hellos.items()
                if isinstance(h.get("pid"), int) and h.get("host") in (None, self.host)}
        for p in self.pollers:
            p.set_rank_pids(pids)
        self._emit({"kind": "hello", "t": rec.t_ns / 1e9, "rank": rec.rank, "info": info})

    def _emit_steps(self, accs: list) -> None:
        if not accs:
            return
        recs = self.aggregator.finish_many(accs)
        self.derived.apply_many(accs, [rec["values"] for rec in recs], self.aggregator.expected_world())
        self._out += map(tuple.__new__, repeat(Out), zip(repeat("metrics"), recs, map(_json.encode, recs)))
        self._latest_step = recs[-1]

    def _log_progress(self) -> None:
        """One line per daemon-record interval: the run's progress, seen from the daemon (the
        trainer prints none: reading its loss would be a host-device sync)."""
        rec = self._latest_step
        if rec is None or rec is self._progress_logged:
            return
        self._progress_logged = rec
        v = rec["values"]
        parts = [f"step {rec['step']}"]
        for key, label, fmt in (("train/loss", "loss", ".4f"), ("perf/tokens_per_second", "tokens/s", ",.0f"),
                                ("perf/step_time_max", "step", ".3f"), ("perf/mfu_percent", "MFU %", ".1f")):
            x = v.get(key)
            if isinstance(x, (int, float)):
                parts.append(f"{label} {x:{fmt}}" + (" s" if label == "step" else ""))
        lost = self.receiver.totals()["records_lost"]
        log.info("progress: %s  (records in %d, lost %d)", "  ".join(parts), self.receiver.num_in, lost)

    def _emit(self, rec: dict) -> None:
        self._out.append(Out(rec["kind"], rec, _json.encode(rec)))

    def _hand_out(self) -> None:
        if not self._out:
            return
        batch, self._out = self._out, []
        self.num_records_out += len(batch)
        # Inline sinks (PUB) first: subscribers get the batch before any sink thread is woken.
        for runner in self._runners_in_order:
            runner.put(batch)

    def post(self, record: dict) -> None:
        """Thread-safe entry for pollers: the record joins the pipeline on the daemon's thread."""
        self._inbox.append(record)
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the loop is already awake (buffer full) or shutting down

    def _take_inbox(self) -> None:
        inbox = self._inbox
        while inbox:
            self._emit(inbox.popleft())

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _on_signal(self, signum: int, frame) -> None:
        self._stop_reason = signal.Signals(signum).name

    # -- control -------------------------------------------------------------------------------
    def _serve_control(self) -> None:
        while True:
            try:
                parts = self.control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) < 3 or parts[-2] != b"":
                continue  # not a REQ envelope; nothing sensible to answer
            ident, body = parts[:-1], parts[-1]
            cmd, error = parse_request(body)
            if cmd == "status":
                reply = {"ok": True, **self.status()}
            elif cmd == "ping":
                reply = {"ok": True}
            elif cmd == "drain":
                self._drain_requesters.append(ident)
                self._stop_reason = "drain request"
                continue  # answered after the drain, with the final counters
            else:
                reply = {"ok": False, "error": error}
            self._reply(ident, reply)

    def _reply(self, ident: list[bytes], reply: dict) -> None:
        try:
            self.control.send_multipart([*ident, _json.encode(reply)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def status(self) -> dict:
        totals = self.receiver.totals()
        return {
            **totals,
            "ranks": sorted(self.aggregator.ranks_seen | set(self.hellos)),
            "world_size": self.aggregator.expected_world(),
            "last_step": self.aggregator.last_step,
            "steps_out": self.aggregator.num_steps_out,
            "steps_incomplete": self.aggregator.num_steps_incomplete,
            "steps_pending": len(self.aggregator.pending),
            "records_late": self.aggregator.num_records_late,
            "records_in_by_kind": {"hello": self.num_hellos, "event": self.num_events_in,
                                   "bye": self.receiver.num_byes,
                                   "metrics": totals["records_in"] - self.num_hellos - self.num_events_in
                                   - self.receiver.num_byes},
            "ranks_gone": sorted(self.aggregator.ranks_gone),
            "queued": {r.name: r.queued() for r in self.runners},
            "records_out": self.num_records_out,
            "per_rank": {str(r): v for r, v in self.receiver.per_rank().items()},
            "sinks": {r.name: r.stats() for r in self.runners},
            "pollers": {p.name: p.stats() for p in self.pollers},
            "uptime_s": round(time.monotonic() - self._started_mono, 3),
            "started_at": self._started_wall,
            "pid": os.getpid(),
            "inner_loops": "c" if self.receiver.native is not None else "python",   # see hotpath.py
            "run_name": self.cfg.run_name,
            "log_dir": str(self.log_dir),
            "endpoints": self.endpoints,
            "security": {**self.security.stats(), "redacted": self._redact.num_redacted},
        }

    def _daemon_record(self) -> dict:
        t = self.receiver.totals()
        values = {
            "telemetry/records_in": t["records_in"],
            "telemetry/records_malformed": t["records_malformed"],
            "telemetry/dropped": t["records_lost"],
            "telemetry/dropped_by_clients": t["records_dropped_by_clients"],
            "telemetry/lost_in_transit": t["records_lost_in_transit"],
            # Records a sink never got. The diagnosis stage's own drops are rules skipped under
            # load (it is held to a share of the time), not output lost: counted apart.
            "telemetry/sink_dropped": sum(r.num_dropped for r in self.runners if r.name != "diagnosis"),
            "telemetry/diagnosis_skipped": sum(r.num_dropped for r in self.runners if r.name == "diagnosis"),
            "telemetry/steps_incomplete": self.aggregator.num_steps_incomplete,
            "telemetry/records_late": self.aggregator.num_records_late,
            "telemetry/hellos_in": self.num_hellos,
            "telemetry/events_in": self.num_events_in,
            "telemetry/byes_in": self.receiver.num_byes,
            "telemetry/steps_out": self.aggregator.num_steps_out,
            "telemetry/num_ranks": len(self.aggregator.ranks_seen),
            "telemetry/uptime_s": round(time.monotonic() - self._started_mono, 3),
            **self.security.counters(),
        }
        for r in self.runners:
            values[f"telemetry/sink/{r.name}/queued"] = r.queued()
            values[f"telemetry/sink/{r.name}/dropped"] = r.num_dropped
        return {"kind": "daemon", "t": time.time(), "values": values}

    # -- shutdown ------------------------------------------------------------------------------
    def _shutdown(self) -> int:
        """Stop intake, drain every stage and queue, flush, fsync, close: all before the deadline.

        Safe to reach once; a sink still busy at the deadline is abandoned (named in the log and
        in the drain reply) so a hung W&B never holds the daemon past `drain_timeout_s`.
        """
        now = time.monotonic()
        deadline = now + self.cfg.drain_timeout_s
        log.info("draining (%s)", self._stop_reason)
        # 1. Stop intake: take what libzmq holds or is still reading off the wire, until the socket
        #    has been quiet a moment (bounded), then close it.
        self._drain_intake(min(deadline, now + min(INTAKE_MAX_S, self.cfg.drain_timeout_s / 4)))
        self.pull.close(linger=0)
        for p in self.pollers:
            try:
                p.close()
            except Exception as exc:   # a poller must not stop the drain
                log.error("poller %s close failed: %r", getattr(p, "name", p), exc)
        self._take_inbox()
        # 2. Flush the pipeline: open steps go out with whatever ranks they have.
        self._emit_steps(self.aggregator.flush())
        self._hand_out()
        # 3. The diagnosis stage first (its last events must still reach the sinks), with a
        #    share of the time; then every sink drains, flushes, fsyncs and closes, in parallel.
        stages = [r for r in self.runners if r.name == "diagnosis"]
        sinks = [r for r in self.runners if r.name != "diagnosis"]
        unfinished = [r.name for r in stages if not r.close(max(0.0, (deadline - time.monotonic()) / 4))]
        self._take_inbox()
        self._emit(self._daemon_record())
        self._hand_out()
        for runner in sinks:
            runner.request_stop()
        unfinished += [r.name for r in sinks if not r.close(max(0.0, deadline - time.monotonic()))]
        self.unfinished = unfinished
        if unfinished:
            log.error("still busy at the drain deadline, abandoned: %s", ", ".join(unfinished))
        final = {"ok": True, "drained": not unfinished, "unfinished_sinks": unfinished, **self.status()}
        for ident in self._drain_requesters:
            self._reply(ident, final)
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)
        self.control.close(linger=200)
        self.security.close()
        self._wake_r.close()
        self._wake_w.close()
        if not unfinished:
            # With a sink thread still inside a socket call, destroying the context could hang
            # or crash; the process is about to exit anyway.
            self.ctx.destroy(linger=0)
        t = final
        log.info("stopped: %d records in, %d malformed, %d lost, %d steps out", t["records_in"],
                 t["records_malformed"], t["records_lost"], t["steps_out"])
        return 0 if self.jsonl_runner.name not in unfinished else 1

    def _drain_intake(self, until: float) -> None:
        quiet_since = time.monotonic()
        while True:
            n = self._ingest(INGEST_BATCH)
            now = time.monotonic()
            if n:
                quiet_since = now
                self._hand_out()
            elif now - quiet_since >= INTAKE_QUIET_S:
                return
            else:
                self.pull.poll(int(INTAKE_QUIET_S * 1000 / 2) + 1)
            if now >= until:
                return


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


def _load_sink(spec: str, log_dir: Path, options: dict):
    """Build a custom sink from "package.module:ClassName"."""
    import importlib

    mod_name, _, cls_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
        return cls(log_dir=log_dir, **options)
    except Exception as exc:
        raise SystemExit(f"telemetry daemon: cannot build custom sink {spec}: {exc!r}") from None


def _bind(sock: zmq.Socket, ep: str) -> str:
    """Bind and return the endpoint as bound: tcp://127.0.0.1:0 becomes the port the OS picked."""
    try:
        sock.bind(ep)
    except zmq.ZMQError as exc:
        raise SystemExit(f"telemetry daemon: cannot bind {ep}: {exc}") from None
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()


def setup_logging(log_dir: Path, level: int = logging.INFO) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger("telemetry")
    root.setLevel(level)
    for h in (logging.StreamHandler(sys.stderr), logging.FileHandler(log_dir / "daemon.log")):
        h.setFormatter(fmt)
        root.addHandler(h)

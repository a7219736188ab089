"""The daemon: one loop that receives, aggregates, derives and hands records to the sinks.

    receiver -> aggregator -> derived -> diagnosis -> sinks (JSONL, PUB, W&B, TensorBoard),
    each sink on its own thread behind a bounded queue; pollers post from their own threads.

The loop has one shape: poll the sockets with a timeout equal to the next timer's deadline,
dispatch what arrived, then do the housekeeping that is due (expire steps, daemon record,
diagnosis ticks). Shutdown (SIGTERM, SIGINT or a drain request) stops intake, drains the
ingest socket, flushes every stage, fsyncs, and closes, within `drain_timeout_s`.
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
from pathlib import Path

import msgspec
import zmq

from protocol import MAX_FRAME_BYTES, Bye, Event, Hello, Metrics
from telemetry import endpoints
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import DaemonConfig
from telemetry.daemon.control import parse_request
from telemetry.daemon.derived import Derived
from telemetry.daemon.downsample import Downsampler
from telemetry.daemon.receiver import Receiver
from telemetry.sinks.base import Out, SinkRunner

log = logging.getLogger("telemetry.daemon")

READY_LINE = "telemetry daemon ready"
# Frames taken from the ingest socket per loop turn before housekeeping gets a look-in.
INGEST_BATCH = 4096
# The longest the loop sleeps when no timer is due; bounds how stale "now" can get.
MAX_POLL_MS = 500

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
        self.pollers: list = []
        self.diagnoser = None
        self._out: list[Out] = []
        self._inbox: collections.deque[dict] = collections.deque()
        self._stop_reason = ""
        self._drain_requesters: list[bytes] = []
        self._started_mono = time.monotonic()
        self._started_wall = time.time()
        self.num_records_out = 0
        self.endpoints: dict[str, str] = {}

    # -- start ---------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.endpoints = {
            "ingest": endpoints.resolve("ingest", cfg.ingest, create_dir=True),
            "pub": endpoints.resolve("pub", cfg.pub, create_dir=True),
            "control": endpoints.resolve("control", cfg.control, create_dir=True),
        }
        for name, ep in self.endpoints.items():
            if not endpoints.is_loopback(ep):
                log.warning("%s endpoint %s listens beyond loopback", name, ep)
        self.ctx = zmq.Context(1)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, cfg.rcvhwm)
        self.pull.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.control = self.ctx.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.setsockopt(zmq.MAXMSGSIZE, 1 << 16)
        for sock, ep in ((self.pull, self.endpoints["ingest"]), (self.control, self.endpoints["control"])):
            _bind(sock, ep)
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
        for runner in self.runners:
            runner.start()
        for p in self.pollers:
            p.start(self.post)
        eps = " ".join(f"{k}={v}" for k, v in self.endpoints.items())
        print(f"{READY_LINE} pid={os.getpid()} {eps} log_dir={self.log_dir}", flush=True)
        log.info("ready: %s", eps)

    def _make_sinks(self) -> None:
        from telemetry.sinks.jsonl import JsonlSink
        from telemetry.sinks.pub import PubSink, bind_pub

        cfg = self.cfg
        j = cfg.jsonl
        self.jsonl_runner = self._add_runner(
            JsonlSink(self.log_dir, fsync_interval_s=j.fsync_interval_s, rotate_bytes=int(j.rotate_mb * 2**20)), j)
        pub_sock = bind_pub(self.ctx, self.endpoints["pub"])
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

    def _add_runner(self, sink, sink_cfg) -> SinkRunner:
        ds = None
        if sink_cfg.every_n_steps > 1 or sink_cfg.max_per_second > 0:
            ds = Downsampler(sink_cfg.every_n_steps, sink_cfg.max_per_second, self.cfg.aggregator.reductions)
        runner = SinkRunner(sink, max_queued=sink_cfg.max_queued, downsampler=ds)
        self.runners.append(runner)
        return runner

    def _make_pollers_and_diagnosis(self) -> None:
        try:
            from telemetry.pollers import make_pollers
            from telemetry.pollers.config import PollersConfig
        except ImportError:
            pass
        else:
            self.pollers = make_pollers(PollersConfig(**self.cfg.pollers))
        try:
            from telemetry.diagnosis import Diagnoser, DiagnosisConfig
        except ImportError:
            pass
        else:
            self.diagnoser = Diagnoser(DiagnosisConfig(**self.cfg.diagnosis))

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        next_daemon_record = time.monotonic() + self.cfg.daemon_record_interval_s
        poll = self._poller.poll
        while not self._stop_reason:
            now = time.monotonic()
            deadline = min(next_daemon_record, self._next_step_deadline(now))
            timeout_ms = max(0, min(MAX_POLL_MS, int((deadline - now) * 1000) + 1))
            events = dict(poll(timeout_ms))
            if self.pull in events:
                self._ingest(INGEST_BATCH)
            if self.control in events:
                self._serve_control()
            if self._wake_r.fileno() in events:
                self._drain_wakeups()
            now = time.monotonic()
            self._take_inbox()
            for acc in self.aggregator.expire(now):
                self._emit_step(acc)
            if now >= next_daemon_record:
                self._emit(self._daemon_record())
                next_daemon_record = now + self.cfg.daemon_record_interval_s
            if self.diagnoser is not None:
                for ev in self.diagnoser.tick(time.time()):
                    self._emit(ev)
            self._hand_out()
        return self._shutdown()

    def _next_step_deadline(self, now: float) -> float:
        pending = self.aggregator.pending
        if not pending:
            return now + MAX_POLL_MS / 1000
        oldest = min(acc.opened_mono for acc in pending.values())
        return oldest + self.cfg.aggregator.step_timeout_s

    def _ingest(self, max_frames: int) -> int:
        pull = self.pull
        recv = pull.recv
        accept = self.receiver.accept
        agg_add = self.aggregator.add
        per_rank = self.cfg.aggregator.per_rank
        n = 0
        while n < max_frames:
            try:
                frame = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            if pull.rcvmore:
                # Records are single frames; a multipart message is refused whole.
                while pull.rcvmore:
                    pull.recv()
                self.receiver.malformed(1, "multipart message")
                continue
            rec = accept(frame)
            if rec is None:
                continue
            kind = type(rec)
            if kind is Metrics:
                if per_rank:
                    self._emit({"kind": "metrics", "t": rec.t_ns / 1e9, "step": rec.step, "rank": rec.rank,
                                "values": rec.values})
                for acc in agg_add(rec.rank, rec.step, rec.t_ns, rec.values):
                    self._emit_step(acc)
            elif kind is Event:
                self._emit({"kind": "event", "t": rec.t_ns / 1e9, "rank": rec.rank, "name": rec.name,
                            "data": rec.data})
            elif kind is Hello:
                self._on_hello(rec)
            elif kind is Bye:
                pass  # counted by the receiver
        return n

    def _on_hello(self, rec: Hello) -> None:
        info = rec.info
        self.hellos[rec.rank] = info
        ws = info.get("world_size")
        if isinstance(ws, int) and ws > 0:
            self.aggregator.note_world_size(ws)
        self.derived.on_hello(info)
        pids = {r: h["pid"] for r, h in self.hellos.items() if isinstance(h.get("pid"), int)}
        for p in self.pollers:
            p.set_rank_pids(pids)
        self._emit({"kind": "hello", "t": rec.t_ns / 1e9, "rank": rec.rank, "info": info})

    def _emit_step(self, acc) -> None:
        rec = self.aggregator.finish(acc)
        self.derived.apply(acc, rec["values"], self.aggregator.expected_world())
        self._emit(rec)

    def _emit(self, rec: dict) -> None:
        self._out.append(Out(rec["kind"], rec, _json.encode(rec)))
        if self.diagnoser is not None and rec["kind"] != "event":
            for ev in self.diagnoser.consume(rec):
                self._out.append(Out("event", ev, _json.encode(ev)))
                msg = ev.get("data", {}).get("message")
                if msg:
                    log.warning("diagnosis: %s", msg)

    def _hand_out(self) -> None:
        if not self._out:
            return
        batch, self._out = self._out, []
        self.num_records_out += len(batch)
        for runner in self.runners:
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
            "records_out": self.num_records_out,
            "per_rank": {str(r): v for r, v in self.receiver.per_rank().items()},
            "sinks": {r.name: r.stats() for r in self.runners},
            "pollers": [p.name for p in self.pollers],
            "uptime_s": round(time.monotonic() - self._started_mono, 3),
            "started_at": self._started_wall,
            "pid": os.getpid(),
            "run_name": self.cfg.run_name,
            "log_dir": str(self.log_dir),
            "endpoints": self.endpoints,
        }

    def _daemon_record(self) -> dict:
        t = self.receiver.totals()
        values = {
            "telemetry/records_in": t["records_in"],
            "telemetry/records_malformed": t["records_malformed"],
            "telemetry/dropped": t["records_lost"],
            "telemetry/dropped_by_clients": t["records_dropped_by_clients"],
            "telemetry/lost_in_transit": t["records_lost_in_transit"],
            "telemetry/sink_dropped": sum(r.num_dropped for r in self.runners),
            "telemetry/steps_incomplete": self.aggregator.num_steps_incomplete,
            "telemetry/num_ranks": len(self.aggregator.ranks_seen),
            "telemetry/uptime_s": round(time.monotonic() - self._started_mono, 3),
        }
        for r in self.runners:
            values[f"telemetry/sink/{r.name}/queued"] = r.queued()
            values[f"telemetry/sink/{r.name}/dropped"] = r.num_dropped
        return {"kind": "daemon", "t": time.time(), "values": values}

    # -- shutdown ------------------------------------------------------------------------------
    def _shutdown(self) -> int:
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        log.info("draining (%s)", self._stop_reason)
        # 1. Stop intake: take what libzmq already holds for us, then close the socket.
        while self._ingest(INGEST_BATCH) and time.monotonic() < deadline:
            pass
        self.pull.close(linger=0)
        for p in self.pollers:
            p.close()
        self._take_inbox()
        # 2. Flush the pipeline: open steps go out with whatever ranks they have.
        for acc in self.aggregator.flush():
            self._emit_step(acc)
        self._emit(self._daemon_record())
        self._hand_out()
        # 3. Sinks drain their queues, flush, fsync and close, in parallel, before the deadline.
        for runner in self.runners:
            with runner._cond:
                runner._stopping = True
                runner._cond.notify()
        unfinished = [r.name for r in self.runners if not r.close(max(0.0, deadline - time.monotonic()))]
        if unfinished:
            log.error("sinks still busy at the drain deadline: %s", ", ".join(unfinished))
        final = {"ok": True, "drained": not unfinished, "unfinished_sinks": unfinished, **self.status()}
        for ident in self._drain_requesters:
            self._reply(ident, final)
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)
        self.control.close(linger=200)
        self._wake_r.close()
        self._wake_w.close()
        self.ctx.destroy(linger=0)
        t = final
        log.info("stopped: %d records in, %d malformed, %d lost, %d steps out", t["records_in"],
                 t["records_malformed"], t["records_lost"], t["steps_out"])
        return 0 if self.jsonl_runner.name not in unfinished else 1


def _bind(sock: zmq.Socket, ep: str) -> None:
    try:
        sock.bind(ep)
    except zmq.ZMQError as exc:
        raise SystemExit(f"telemetry daemon: cannot bind {ep}: {exc}") from None


def setup_logging(log_dir: Path, level: int = logging.INFO) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger("telemetry")
    root.setLevel(level)
    for h in (logging.StreamHandler(sys.stderr), logging.FileHandler(log_dir / "daemon.log")):
        h.setFormatter(fmt)
        root.addHandler(h)

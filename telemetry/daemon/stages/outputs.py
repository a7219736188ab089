"""What the fan-out feeds, built from the config: the sinks (JSONL first, PUB, W&B, TensorBoard,
OTLP, custom ones, a node's forward) and the analysis stages fed like sinks (hang forensics, the
goodput ledger, the diagnosis rules), each behind its runner (sinks/base.py), plus the media
keeper of this host's ranks' media files. Heavy dependencies are imported here, lazily, by the
part that needs them."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

import zmq

from telemetry.daemon.config import DaemonConfig
from telemetry.daemon.continuity import SOURCES_FILE
from telemetry.daemon.downsample import Downsampler
from telemetry.daemon.sinks.base import InlineRunner, SinkRunner
from telemetry.daemon.stages.fanout import FanOut
from telemetry.shared import catalogue
from telemetry.shared.jsonlines import FILE_NAME

# The most of the time the diagnosis stage's thread may spend on the rules (see SinkRunner).
DIAGNOSIS_MAX_SHARE = 0.25
GOODPUT_MAX_SHARE = 0.05
# Hang forensics: the check interval. The last records each rank sent are kept in a RecentRing
# bounded by its share of the memory budget (memory.py), not a number of batches.
FORENSICS_CHECK_S = 0.5


class Outputs:
    """Adds runners to `fanout`, each queue bounded by `max_bytes` (the sink queues' share)."""

    def __init__(self, fanout: FanOut, cfg: DaemonConfig, log_dir: Path, max_bytes: int) -> None:
        self.fanout = fanout
        self.cfg = cfg
        self.log_dir = log_dir
        self.max_bytes = max_bytes

    def add(self, sink, sink_cfg) -> SinkRunner:
        """A sink with its config's queue bound and downsampling; inline if it never blocks."""
        ds = None
        if sink_cfg.every_n_steps > 1 or sink_cfg.max_per_second > 0:
            # The window's own rules: the cross-rank overrides (a user's "sum" for a rate) would
            # add up a window's steps (a steady 1,000/s made 4,000 over 4 steps).
            ds = Downsampler(sink_cfg.every_n_steps, sink_cfg.max_per_second, self.cfg.aggregator.window_reductions)
        cls = InlineRunner if getattr(sink, "inline", False) else SinkRunner
        return self.fanout.add(cls(sink, max_queued=sink_cfg.max_queued, downsampler=ds, max_bytes=self.max_bytes))

    def sinks(self, ctx: zmq.Context, endpoints: dict[str, str], prepare: Callable, repaired_bytes: int,
              host: str) -> tuple[SinkRunner, zmq.Socket | None]:
        """Every configured sink; returns the JSONL sink's runner and the PUB socket (None when
        PUB is off). endpoints["pub"] becomes the endpoint as bound."""
        from telemetry.daemon.sinks.jsonl import JsonlSink
        from telemetry.daemon.sinks.pub import PubSink, bind_pub

        cfg, log_dir = self.cfg, self.log_dir
        j = cfg.jsonl
        jsonl = self.add(JsonlSink(log_dir, fsync_interval_s=j.fsync_interval_s, rotate_bytes=int(j.rotate_mb * 2**20),
                                   sources_file=SOURCES_FILE), j)
        jsonl.sink.num_repaired_bytes = repaired_bytes
        pub_sock = bind_pub(ctx, endpoints["pub"], prepare=prepare)
        endpoints["pub"] = pub_sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        if cfg.pub_sink.enabled:
            self.add(PubSink(pub_sock), cfg.pub_sink)
        else:
            pub_sock.close(linger=0)
            pub_sock = None
        with_wandb = cfg.wandb.enabled and cfg.wandb.mode != "disabled"
        if not cfg.remote_ingest:
            # The ranks' media files (on this host; a head's ranks are on others): kept for the
            # dashboard, and each deleted by the last of its readers (media_keeper.py).
            from telemetry.daemon.media_keeper import READER, MediaFiles, MediaKeeper
            from telemetry.daemon.sinks.wandb_sink import MEDIA_READER     # (wandb itself: at its start)

            media_files = self.fanout.media_files = MediaFiles((READER, MEDIA_READER) if with_wandb else (READER,))
            self.fanout.media = MediaKeeper(log_dir, media_files, keep=cfg.media.keep,
                                            max_bytes=int(cfg.media.max_mb * 2**20))
        if with_wandb:
            from telemetry.daemon.sinks.wandb_sink import WandbSink

            w = cfg.wandb
            self.add(WandbSink(w.mode, log_dir, cfg.run_name, project=w.project, entity=w.entity,
                               finish_timeout_s=w.finish_timeout_s, media_files=self.fanout.media_files,
                               summaries=catalogue.wandb_summaries(cfg.declared_metrics())), w)
        if cfg.tensorboard.enabled:
            from telemetry.daemon.sinks.tensorboard import TensorBoardSink

            self.add(TensorBoardSink(log_dir), cfg.tensorboard)
        if cfg.otlp.enabled:
            from telemetry.daemon.sinks.otlp import OtlpSink

            o = cfg.otlp
            node_rank = cfg.forward.node_rank if cfg.forward is not None and cfg.forward.enabled else None
            self.add(OtlpSink(log_dir, o.endpoint, cfg.run_name, job=o.job, export_interval_s=o.export_interval_s,
                              timeout_s=o.timeout_s, headers=o.headers, host=host, node_rank=node_rank), o)
        for i, c in enumerate(cfg.custom_sinks):
            if c.enabled:
                self.add(load_sink(c.cls, log_dir, c.options, f"custom_sinks[{i}]"), c)
        if cfg.forward is not None and cfg.forward.enabled:
            from telemetry.daemon.sinks.forward import ForwardSink

            # With a remote ingest too, this daemon is a group head: it forwards its nodes' records.
            self.add(ForwardSink(cfg.forward, relay=bool(cfg.remote_ingest)), cfg.forward)
        return jsonl, pub_sock

    def analysis(self, host: str, post: Callable, recent, ingest: str) -> tuple:
        """The pollers, and the analysis stages fed like sinks: hang forensics (which also verifies
        this host's ranks for the pollers: always), the goodput ledger, the diagnosis rules.
        Returns (pollers, diagnoser, forensics, goodput, the diagnosis stage or None)."""
        from telemetry.daemon.diagnosis import Diagnoser
        from telemetry.daemon.pollers import make_pollers

        pollers = make_pollers(self.cfg.pollers)

        def set_rank_pids(pids: dict[int, int]) -> None:
            for p in pollers:
                p.set_rank_pids(pids)

        diagnoser = Diagnoser(self.cfg.diagnosis, unit="node" if self.cfg.remote_ingest else "rank")
        forensics = self.forensics(host, post, recent, ingest, set_rank_pids)
        return pollers, diagnoser, forensics, self.goodput(), self.diagnosis(diagnoser, post)

    def forensics(self, host: str, post: Callable, recent, ingest: str, on_ranks: Callable):
        """Hang and crash forensics on their own thread (telemetry/daemon/forensics/). The stage
        also decides which hellos are this host's ranks: it verifies each claim in /proc (off
        the daemon's thread) and hands the verified pids to the pollers (`on_ranks`); nothing
        else acts on a pid."""
        from telemetry.daemon.forensics import ForensicsStage

        stage = ForensicsStage(self.cfg.diagnosis, self.log_dir, host, post, recent, ingest=ingest, on_ranks=on_ranks)
        self.fanout.add(SinkRunner(stage, max_queued=10_000, flush_interval_s=FORENSICS_CHECK_S,
                                   max_bytes=self.max_bytes, analysis=True))
        return stage

    def goodput(self):
        """The goodput ledger, live (telemetry/daemon/goodput_stage.py): on its own thread, held
        to GOODPUT_MAX_SHARE of the time (a step costs it microseconds, so that share keeps up
        with any real step rate; a burst waits in its queue, and at the drain it runs at full
        speed); it first reads what this log directory holds."""
        from telemetry.daemon.goodput_stage import GoodputStage

        # Without --per-rank the per-rank records go to it alone, for the per-rank ledgers
        # (goodput_stage.py), bounded like a sink queue (memory.py). Not on a head (remote
        # ingest): its "ranks" are nodes, thousands of them, whose own daemons keep their ranks'.
        cfg = self.cfg
        rank_bytes = 0 if cfg.aggregator.per_rank or cfg.remote_ingest else self.max_bytes // 4
        stage = GoodputStage(self.log_dir, FILE_NAME, rank_bytes_max=rank_bytes)
        self.fanout.add(SinkRunner(stage, max_queued=100_000, max_share=GOODPUT_MAX_SHARE, max_bytes=self.max_bytes,
                                   analysis=True))
        return stage

    def diagnosis(self, diagnoser, post: Callable):
        """The diagnosis rules, off the daemon's thread (they cost per step; their events come
        back via `post`), held to a share of the time, so a backlog costs ingest little (what the
        rules cannot get to is dropped and counted in the stage's stats); None when disabled."""
        from telemetry.daemon.diagnosis.stage import TICK_INTERVAL_S, DiagnosisStage

        if not self.cfg.diagnosis.enabled:
            return None
        stage = DiagnosisStage(diagnoser, post)
        self.fanout.add(SinkRunner(stage, max_queued=10_000, flush_interval_s=TICK_INTERVAL_S,
                                   max_share=DIAGNOSIS_MAX_SHARE, max_bytes=self.max_bytes, analysis=True))
        return stage


def load_sink(spec: str, log_dir: Path, options: dict, key: str):
    """Build a custom sink from "package.module:ClassName"; `key` names its config entry."""
    from telemetry.shared.config import ConfigError

    mod_name, _, cls_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
        return cls(log_dir=log_dir, **options)
    except Exception as exc:   # the user's code: any failure is a bad config entry, not a crash
        raise ConfigError(f"{key}: cannot build custom sink {spec}: {exc!r}") from None

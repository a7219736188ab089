"""The metric catalogue: one declaration per built-in metric.

Each entry says what a name is: its unit, its kind (gauge, counter, rate), how it combines
across the ranks of one step, how it combines over a downsampling window of steps (kept apart:
tokens/s of 8 ranks add up, tokens/s over 10 steps average), its display group, who produces
it, and one line of doc. A name is exact (`train/loss`), a prefix pattern (`perf/*`) or a
suffix pattern (`*/tokens`); a suffix pattern is tried in the order declared here.

From it, not beside it:
  - the reduction tables (telemetry/daemon/reductions.py: RANK_RULES, WINDOW_RULES), only the
    entries whose rule is not the mean (the default);
  - the README's table of metric names (`markdown_table`; tests/test_catalogue.py checks the
    README equals it);
  - a user's own declarations (the daemon config's `metrics:` map, same fields; `declared`).
  - Prometheus names, types, units and help (telemetry/consumers/prometheus.py: `lookup` and
    UNITS): a time in seconds ends in _seconds, GB become _bytes, a cumulative counter is a
    Prometheus counter (_total).
  - OpenTelemetry names and units (`otel`, for the daemon's OTLP sink, telemetry/daemon/sinks/
    otlp.py): dot-separated lowercase names without their unit, UCUM units, values in base units
    (UNITS: GB are sent as bytes); the same segments and the same unit table as Prometheus's.
  - the daemon's own counters in its `daemon` records, each read where `telemetry status` has
    the same figure (`status`), so the two never disagree (telemetry/daemon/self_report.py); such
    a counter has one name: status's path under telemetry/ (records_lost is telemetry/records_lost,
    memory.records_shed is telemetry/memory/records_shed). What an older daemon wrote under other names
    is read under these (`current_names`, for the consumers of run files).
The catalogue also declares what the daemon polls (GPU, host: source "poller") and its own
counters in its `daemon` records (source "self"); neither is reduced across ranks or over a
window (those records pass the downsampler as they are).
  - the groups and units the consumers show metrics under (`grouped`: the run's own names
    first): `telemetry tail`'s metrics panel, `telemetry report`'s table of every metric; the
    units of the dashboard's charts, and the sections of the charts no built-in one draws
    (telemetry/consumers/dashboard/store.py: meta_of; the run's own by their prefix).
  - W&B's define_metric in the daemon's own run (`wandb_summaries`, sinks/wandb_sink.py): every
    metric against train/step, and the summary of each entry with a `wandb_summary`. No built-in
    entry has one, by decision: W&B's default summary is the last value, as W&B's
    Hugging Face and Lightning integrations leave it, and the runs table users know shows that;
    a team that wants a loss's minimum declares it in the daemon config (`metrics:`, the same
    field). A user's own run (telemetry.wandb, the integrations) keeps the define_metric calls
    its script made, as W&B would.

Adding a metric the daemon computes: one entry here, and its computation appended to
DERIVATIONS in telemetry/daemon/derived.py (tests/test_catalogue.py adds one that way and finds it
in a real daemon's records, both rule tables, Prometheus and the README table). The README's
table is then `telemetry metrics --markdown`.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

KINDS = ("gauge", "counter", "rate")
# What W&B's define_metric(summary=...) takes (wandb_run.define_metric).
WANDB_SUMMARIES = ("min", "max", "mean", "last", "first", "none")
# Sent by the ranks; derived by the daemon for each step; polled by the daemon (GPU, host); the
# daemon's own counters (its `daemon` records, under telemetry/).
SOURCES = ("rank", "daemon", "poller", "self")
MEAN = "mean"


def status_name(path: str) -> str:
    """The daemon record's name of a counter `telemetry status` has at `path` (a key, or a dotted
    path into it): the same words under telemetry/, one segment a key."""
    return "telemetry/" + path.replace(".", "/")


# The daemon record's counters as an older daemon named them, by their names now: a run dir
# written before they took status's names is read under these (`current_names`).
RENAMED = {
    "telemetry/dropped": "telemetry/records_lost",
    "telemetry/dropped_by_clients": "telemetry/records_dropped_by_clients",
    "telemetry/lost_in_transit": "telemetry/records_lost_in_transit",
    "telemetry/unread_at_drain": "telemetry/records_unread_at_drain",
    "telemetry/shed_at_intake": "telemetry/records_shed_at_intake",
    "telemetry/hellos_in": "telemetry/records_in_by_kind/hello",
    "telemetry/events_in": "telemetry/records_in_by_kind/event",
    "telemetry/byes_in": "telemetry/records_in_by_kind/bye",
    "telemetry/memory_shed": "telemetry/memory/records_shed",
}


def current_names(values: dict) -> dict:
    """A `daemon` record's values with an older daemon's names (RENAMED) as they are named now;
    the same dict when it has none. A name now and its older one in the same record: the one now."""
    if not any(k in RENAMED for k in values):
        return values
    out = {RENAMED[k]: v for k, v in values.items() if k in RENAMED}
    out.update((k, v) for k, v in values.items() if k not in RENAMED)
    return out


@dataclass(frozen=True, slots=True)
class Metric:
    name: str                  # exact, "prefix*" or "*suffix"
    unit: str                  # "s", "tokens", "tokens/s", "GB", "%", "" (a plain number), ...
    kind: str                  # one of KINDS
    group: str                 # the display group
    doc: str                   # one line
    across_ranks: str = MEAN   # a reduction's config spelling (reductions.parse)
    over_window: str = MEAN
    source: str = "rank"       # one of SOURCES
    # A count since a start (OOMs so far, XID errors since the daemon started, records in), never
    # a per-step amount: Prometheus exposes it as a counter (_total). Only for kind "counter".
    cumulative: bool = False
    # Source "self": where `telemetry status` (and drain.json) has the same figure, a key or a
    # dotted path into it; the daemon record reads it there (self_report.py). "": its own.
    status: str = ""
    # The W&B summary of the daemon's own run for this exact name ("min", "max", "mean", "last",
    # "first", "none", or several: "min,last"): a define_metric call (sinks/wandb_sink.py). "":
    # W&B's default, the last value (every built-in entry: see the module docstring).
    wandb_summary: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.source not in SOURCES:
            raise ValueError(f"metric {self.name!r}: source {self.source!r} is not one of {', '.join(SOURCES)}")
        if self.name.count("*") > 1 or ("*" in self.name and not (self.name.startswith("*") or self.name.endswith("*"))):
            raise ValueError(f"metric {self.name!r}: a pattern is 'prefix*' or '*suffix'")
        if self.cumulative and self.kind != "counter":
            raise ValueError(f"metric {self.name!r}: only a counter is cumulative")
        if self.cumulative and self.name.endswith("_total"):
            # The exports add it (Prometheus's counter samples; its OTLP translation adds it again).
            raise ValueError(f"metric {self.name!r}: a cumulative counter's name does not end in _total")
        if self.status and self.source != "self":
            raise ValueError(f"metric {self.name!r}: only the daemon's own counters are in its status")
        if self.status and self.name != status_name(self.status):
            raise ValueError(f"metric {self.name!r}: a counter status has too is named as status names it: "
                             f"{status_name(self.status)!r}")
        if self.wandb_summary:
            ops = [op.strip() for op in self.wandb_summary.split(",")]
            bad = [op for op in ops if op not in WANDB_SUMMARIES]
            if bad or not all(ops):
                raise ValueError(f"metric {self.name!r}: wandb_summary {self.wandb_summary!r}: one or more of "
                                 f"{', '.join(WANDB_SUMMARIES)}, comma-separated")
            if "*" in self.name:
                # W&B's define_metric has prefix globs only, and a key two globs match (this one and
                # the daemon run's "*" axis) takes either (wandb-core has been seen doing both).
                raise ValueError(f"metric {self.name!r}: wandb_summary needs an exact name (a W&B glob "
                                 "would overlap the run's '*' axis, and W&B picks either)")


_PHASE = "the ranks' own phase time, no collective in it"

CATALOGUE: tuple[Metric, ...] = (
    # -- training ----------------------------------------------------------------------------------
    Metric("train/loss", "", "gauge", "training", "the optimizer step's loss (mean over its micro-batches)"),
    Metric("train/lr", "", "gauge", "training", "the learning rate of the step (HF callback: train/learning_rate)"),
    Metric("train/grad_norm", "", "gauge", "training", "the gradient norm before clipping"),
    Metric("train/epoch", "epochs", "gauge", "training", "epochs done, fractional", over_window="last"),
    Metric("train/step", "steps", "counter", "training", "the optimizer step a record is of", across_ranks="max"),
    # -- counts ------------------------------------------------------------------------------------
    Metric("perf/tokens", "tokens", "counter", "counts",
           "non-padding tokens of the optimizer step, all micro-batches", across_ranks="sum", over_window="sum"),
    Metric("perf/samples", "samples", "counter", "counts", "samples of the optimizer step",
           across_ranks="sum", over_window="sum"),
    Metric("perf/attn_doc_len_sq", "tokens²", "counter", "counts",
           "Σ Lᵢ² of the packed documents, for packing-aware MFU", across_ranks="sum", over_window="sum"),
    # -- throughput --------------------------------------------------------------------------------
    Metric("perf/tokens_per_second", "tokens/s", "rate", "throughput",
           "tokens per second, summed across ranks (derived from perf/tokens where not sent)", across_ranks="sum"),
    Metric("perf/samples_per_second", "samples/s", "rate", "throughput", "samples per second, summed across ranks",
           across_ranks="sum"),
    Metric("perf/steps_per_second", "steps/s", "rate", "throughput", "1 / the slowest rank's step time",
           source="daemon"),
    # -- per dataset, and any count or extreme of the same shape --------------------------------------
    Metric("*/tokens", "tokens", "counter", "per dataset",
           "dataset/<name>/tokens, eval/<name>/tokens: the loss-bearing tokens behind a rank's figures",
           across_ranks="sum", over_window="sum"),
    Metric("*/samples", "samples", "counter", "per dataset", "any <prefix>/samples: a count, summed",
           across_ranks="sum", over_window="sum"),
    Metric("*_count", "", "counter", "per dataset", "any name ending in _count: a count, summed",
           across_ranks="sum", over_window="sum"),
    # -- device memory -----------------------------------------------------------------------------
    Metric("memory/allocated_gb", "GB", "gauge", "device memory", "torch.cuda.memory_allocated"),
    Metric("memory/reserved_gb", "GB", "gauge", "device memory", "torch.cuda.memory_reserved"),
    Metric("memory/num_ooms", "", "counter", "device memory", "out-of-memory errors so far (cumulative)",
           across_ranks="sum", over_window="max", cumulative=True),
    Metric("memory/alloc_retries", "", "counter", "device memory", "allocator retries so far (cumulative)",
           across_ranks="sum", over_window="max", cumulative=True),
    # -- step timing -------------------------------------------------------------------------------
    Metric("perf/step_time", "s", "gauge", "step timing", "wall time of the optimizer step (a step is as slow "
           "as its slowest rank)", across_ranks="max"),
    Metric("memory/max_allocated_gb", "GB", "gauge", "device memory", "peak allocated since the last step",
           across_ranks="max", over_window="max"),
    Metric("*_max", "", "gauge", "step timing", "any name ending in _max: the largest (perf/step_time_max: "
           "the slowest rank's step)", across_ranks="max", over_window="max"),
    Metric("*_min", "", "gauge", "step timing", "any name ending in _min: the smallest (perf/step_time_min)",
           across_ranks="min", over_window="min"),
    Metric("perf/forward_time", "s", "gauge", "step timing", "forward, " + _PHASE),
    Metric("perf/backward_time", "s", "gauge", "step timing", "backward"),
    Metric("perf/optimizer_time", "s", "gauge", "step timing", "the optimizer phase"),
    Metric("perf/data_loading_time", "s", "gauge", "step timing", "the time the step waited for data"),
    Metric("perf/optimizer_update_time", "s", "gauge", "step timing",
           "the optimizer's own update (its step()), no collective in it"),
    Metric("perf/forward_compute_time", "s", "gauge", "step timing",
           "forward minus its waits (DDP's buffer broadcast, ZeRO-3's all-gathers)"),
    Metric("perf/backward_compute_time", "s", "gauge", "step timing",
           "backward up to the launch of its last gradient bucket's all-reduce (DDP)"),
    Metric("telemetry/client_s", "s", "counter", "step timing",
           "seconds the client has spent in its log() and event() calls on the training thread so far (the "
           "slowest rank's; the client adds it at most once a second): the goodput ledger's telemetry bucket",
           across_ranks="max", over_window="max", cumulative=True),
    Metric("perf/eval_time", "s", "gauge", "step timing", "wall time of the evaluation after the step (its record's "
           "eval part), the slowest rank's: the goodput ledger's eval bucket", across_ranks="max"),
    Metric("perf/data_loading_ratio", "", "gauge", "step timing", "data loading / step time"),
    Metric("perf/compute_ratio", "", "gauge", "step timing", "compute / step time"),
    # -- the straggler view (derived) --------------------------------------------------------------
    Metric("perf/slowest_rank", "rank", "gauge", "stragglers", "the rank with the longest step",
           over_window="last", source="daemon"),
    Metric("perf/straggler_rank", "rank", "gauge", "stragglers",
           "the rank whose own phase time runs longest beyond the others' (the line to plot)", source="daemon"),
    Metric("perf/straggler_excess_s", "s", "gauge", "stragglers", "how much longer its phase ran than the others' median",
           source="daemon"),
    Metric("perf/straggler_median_s", "s", "gauge", "stragglers", "the others' median of that phase", source="daemon"),
    Metric("perf/straggler_phase_index", "", "gauge", "stragglers",
           "0 data_loading, 1 forward, 2 optimizer, 3 backward, 4 optimizer_update, 5 forward_compute, "
           "6 backward_compute", source="daemon"),
    # -- MFU (derived) -----------------------------------------------------------------------------
    Metric("perf/mfu", "", "gauge", "MFU", "model FLOPs utilisation, 0..1 (analytic FLOPs, never a profiler)",
           source="daemon"),
    Metric("perf/mfu_percent", "%", "gauge", "MFU", "perf/mfu x 100", source="daemon"),
    Metric("perf/hfu", "", "gauge", "MFU", "hardware FLOPs utilisation (gradient checkpointing's recompute counted)",
           source="daemon"),
    Metric("perf/model_flops_per_second", "FLOP/s", "rate", "MFU", "model FLOPs per second, all ranks",
           source="daemon"),
    # -- per dataset: weighted by the tokens behind them (after the suffix rules above) ---------------
    Metric("*/loss", "", "gauge", "per dataset",
           "dataset/<name>/loss, eval/<name>/loss: across ranks weighted by the sibling <prefix>/tokens",
           across_ranks="weighted_mean:tokens"),
    Metric("*/accuracy", "", "gauge", "per dataset", "dataset/<name>/accuracy, eval/<name>/accuracy: weighted the same",
           across_ranks="weighted_mean:tokens"),
    # -- GPU, polled by the daemon (NVML; telemetry/daemon/pollers/nvml.py), one record per GPU -------
    *(Metric(name, unit, kind, "GPU", doc, source="poller", cumulative=cumulative)
      for name, unit, kind, doc, cumulative in (
          ("gpu/util_percent", "%", "gauge", "% of the last sample period a kernel was running", False),
          ("gpu/mem_util_percent", "%", "gauge", "% of the period device memory was read or written", False),
          ("gpu/memory_used_gb", "GB", "gauge", "device memory used, all processes, the driver's reserved "
                                                "memory apart as nvidia-smi shows it (gpu/rank<r>/memory_used_gb: "
                                                "rank r's process)", False),
          ("gpu/memory_total_gb", "GB", "gauge", "device memory in all", False),
          ("gpu/memory_percent", "%", "gauge", "used / total x 100", False),
          ("gpu/power_w", "W", "gauge", "board power draw", False),
          ("gpu/power_limit_w", "W", "gauge", "the enforced power limit", False),
          ("gpu/temperature_c", "°C", "gauge", "GPU core temperature", False),
          ("gpu/sm_clock_mhz", "MHz", "gauge", "current SM clock", False),
          ("gpu/mem_clock_mhz", "MHz", "gauge", "current memory clock", False),
          ("gpu/throttle_reasons", "", "gauge", "NVML's clocks-event (throttle) reason bitmask", False),
          ("gpu/throttle_thermal", "", "gauge", "1 while a thermal slowdown is active", False),
          ("gpu/throttle_power", "", "gauge", "1 while the power cap or power brake is active", False),
          ("gpu/throttle_hw_slowdown", "", "gauge", "1 while a hardware slowdown is active", False),
          ("gpu/throttle_idle", "", "gauge", "1 while clocks are low because the GPU is idle", False),
          ("gpu/pcie_tx_mb_s", "MB/s", "gauge", "PCIe transmit throughput (pollers.nvml_pcie)", False),
          ("gpu/pcie_rx_mb_s", "MB/s", "gauge", "PCIe receive throughput", False),
          ("gpu/ecc_corrected_errors", "", "counter", "corrected ECC errors since the driver loaded", True),
          ("gpu/ecc_uncorrected_errors", "", "counter", "uncorrected ECC errors since the driver loaded", True),
          ("gpu/xid_errors", "", "counter", "XID critical errors since the daemon started", True),
          ("gpu/last_xid", "", "gauge", "the most recent XID code", False),
          ("gpu/num_processes", "", "gauge", "compute processes on the GPU", False))),
    # -- host, polled by the daemon (psutil; telemetry/daemon/pollers/host.py) ----------------------
    *(Metric(name, unit, "gauge", "host", doc, source="poller")
      for name, unit, doc in (
          ("system/cpu_percent", "%", "all cores, 0-100 (system/rank<r>/cpu_percent: rank r's process, "
                                      "% of one core, can exceed 100)"),
          ("system/cpu_percent_core*", "%", "system/cpu_percent_core<i>: core i, 0-100 (pollers.host_per_core)"),
          ("system/load_1m", "", "load average, 1 minute"),
          ("system/load_5m", "", "load average, 5 minutes"),
          ("system/load_15m", "", "load average, 15 minutes"),
          ("system/memory_percent", "%", "RAM in use, 0-100"),
          ("system/memory_used_gb", "GB", "RAM in use (total - available)"),
          ("system/memory_available_gb", "GB", "RAM available"),
          ("system/memory_total_gb", "GB", "RAM in all"),
          ("system/swap_percent", "%", "swap in use, 0-100"),
          ("system/swap_used_gb", "GB", "swap in use"),
          ("system/disk_read_mb_s", "MB/s", "read from all block devices"),
          ("system/disk_write_mb_s", "MB/s", "written to all block devices"),
          ("system/net_rx_mb_s", "MB/s", "received on all interfaces but loopback"),
          ("system/net_tx_mb_s", "MB/s", "sent on all interfaces but loopback"),
          ("system/rss_gb", "GB", "resident memory of the training ranks' processes, summed "
                                  "(system/rank<r>/rss_gb: rank r's)"),
          ("system/num_ranks_polled", "", "rank processes that could be read this poll"),
          ("system/num_threads", "", "system/rank<r>/num_threads: rank r's process's threads"),
          ("system/num_fds", "", "system/rank<r>/num_fds: rank r's open file descriptors (what runs into "
                                 "ulimit -n)"))),
    # -- the daemon's own counters (its `daemon` records; telemetry status says the same) ------------
    *(Metric(name, unit, kind, "daemon", doc, source="self", cumulative=kind == "counter", status=status)
      for name, status, unit, kind, doc in (
          ("telemetry/records_in", "records_in", "records", "counter", "records taken in"),
          ("telemetry/records_malformed", "records_malformed", "records", "counter",
           "records that were not records (refused)"),
          ("telemetry/values_refused", "values_refused", "values", "counter",
           "metrics values refused alone, the rest of their record taken: text, a map, a list, a name "
           "not of 1..256 characters; by reason: status's values_refused_by_reason"),
          ("telemetry/records_lost", "records_lost", "records", "counter", "records lost, all causes"),
          ("telemetry/records_dropped_by_clients", "records_dropped_by_clients", "records", "counter",
           "records the clients dropped (their queue was full) and counted"),
          ("telemetry/records_lost_in_transit", "records_lost_in_transit", "records", "counter",
           "records sent and never received (seq gaps)"),
          ("telemetry/records_unread_at_drain", "records_unread_at_drain", "records", "counter",
           "records still queued when the daemon stopped"),
          ("telemetry/records_shed_at_intake", "records_shed_at_intake", "records", "counter",
           "records shed at intake (memory budget)"),
          ("telemetry/records_failed", "records_failed", "records", "counter", "records that failed in the pipeline"),
          ("telemetry/sink_dropped", "", "records", "counter", "records the sinks dropped (a queue full)"),
          ("telemetry/diagnosis_skipped", "", "records", "counter", "records the diagnosis and forensics skipped"),
          ("telemetry/steps_incomplete", "steps_incomplete", "steps", "counter", "steps written without every rank"),
          ("telemetry/records_late", "records_late", "records", "counter",
           "records that came after their step was written"),
          ("telemetry/records_unannounced", "records_unannounced", "records", "counter",
           "records of ranks no hello announced (outside the world): in their steps, never waited for"),
          ("telemetry/records_unannounced_refused", "records_unannounced_refused", "records", "counter",
           "records of ranks no hello announced beyond the 1,024 such ranks remembered, refused"),
          ("telemetry/records_in_by_kind/hello", "records_in_by_kind.hello", "records", "counter",
           "hellos taken in"),
          ("telemetry/records_in_by_kind/event", "records_in_by_kind.event", "records", "counter",
           "events taken in"),
          ("telemetry/records_in_by_kind/bye", "records_in_by_kind.bye", "records", "counter", "byes taken in"),
          ("telemetry/steps_out", "steps_out", "steps", "counter", "steps written"),
          ("telemetry/memory/records_shed", "memory.records_shed", "records", "counter",
           "records shed for the memory budget, all stages"),
          ("telemetry/auth_refused", "", "connections", "counter", "CURVE clients whose key is not allowed"),
          ("telemetry/identity_refused", "", "records", "counter",
           "records a node's key sent as another node, refused (security.identity_refused)"),
          ("telemetry/handshake_failed", "", "connections", "counter", "connections whose handshake failed"),
          ("telemetry/disconnects", "", "connections", "counter", "connections closed (a rank's normal exit is one)"),
          ("telemetry/connections_refused", "", "connections", "counter", "connections beyond the connection limit, shut at once"),
          ("telemetry/num_ranks", "", "ranks", "gauge", "ranks seen"),
          ("telemetry/uptime_s", "uptime_s", "s", "gauge", "seconds since the daemon started"),
          ("telemetry/sink/*", "", "records", "gauge",
           "telemetry/sink/<sink>/queued: a sink's queue now; telemetry/sink/<sink>/dropped: what it dropped"),
          # The goodput ledger so far (telemetry/shared/goodput.py), in the daemon records too.
          ("goodput/fraction", "", "", "gauge", "productive time / wall time so far (the goodput ledger)"),
          # Before goodput/*: the first prefix pattern that matches is the entry.
          ("goodput/settled/*", "", "s", "counter",
           "goodput/settled/<bucket>_s: the run's time in that bucket that no later record can re-book "
           "(cumulative, never lower: a live launch's steps to its last checkpoint save; all of it at "
           "the drain); goodput/settled/wall_s: the wall time settled. Summed across jobs, "
           "productive / wall is the cluster's goodput"),
          ("goodput/*", "", "s", "gauge",
           "goodput/<bucket>_s: the run's wall time so far in that bucket (productive, startup, "
           "data_loading, eval, checkpoint_save, checkpoint_restore, straggler, slow_steps, hang, redone, "
           "recovery, telemetry, excluded, unexplained; data_loading is synchronous data loading, what "
           "the steps waited for data: a loader's work overlapped with compute, the asynchronous data "
           "loading of Google's goodput library, costs no wall time and is not measured); "
           "goodput/wall_s: the wall time so far"))),
)


def rules(which: str, catalogue: tuple[Metric, ...] | None = None) -> dict[str, str]:
    """The reduction table: "across_ranks" or "over_window", name -> reduction, without the
    means (the default), in the catalogue's order (a suffix pattern is tried in that order)."""
    if which not in ("across_ranks", "over_window"):
        raise ValueError(f"rules({which!r}): across_ranks or over_window")
    catalogue = CATALOGUE if catalogue is None else catalogue     # (read now: a metric added later counts)
    return {m.name: getattr(m, which) for m in catalogue if getattr(m, which) != MEAN and m.source in REDUCED}


# The sources whose metrics are in step records, reduced across ranks and over windows.
REDUCED = ("rank", "daemon")
# The sources whose metrics are in the daemon's own records (gpu, system, daemon), never a rank's.
DAEMONS_OWN = ("poller", "self")
_RANK_SEGMENT = re.compile(r"^rank\d+$")


def lookup(name: str, catalogue: tuple[Metric, ...] | None = None) -> Metric | None:
    """The entry of `name`, as the reductions match it: the exact name, else the first prefix
    pattern, else the first suffix pattern; None for a name the catalogue does not know. A
    rank<r> segment (gpu/rank3/memory_used_gb) is looked up without it (gpu/memory_used_gb)."""
    catalogue = CATALOGUE if catalogue is None else catalogue
    parts = name.split("/")
    if len(parts) > 2:
        kept = [p for i, p in enumerate(parts) if i == 0 or i == len(parts) - 1 or not _RANK_SEGMENT.match(p)]
        name = "/".join(kept)
    exact = next((m for m in catalogue if m.name == name), None)
    if exact is not None:
        return exact
    prefix = next((m for m in catalogue if m.name.endswith("*") and name.startswith(m.name[:-1])), None)
    if prefix is not None:
        return prefix
    return next((m for m in catalogue if m.name.startswith("*") and name.endswith(m.name[1:])), None)


# -- how a metric is exported: Prometheus and OpenTelemetry ---------------------------------------
@dataclass(frozen=True, slots=True)
class Unit:
    """How a catalogue unit is exported: its UCUM code (OTLP's units), the factor from the
    catalogue's unit to that base unit (GB -> bytes: 1e9), the Prometheus name suffix ("": none)
    and how a metric name spells the unit at its end (cut before the export adds its own)."""
    ucum: str
    scale: float = 1.0
    prometheus: str = ""
    spelled: tuple[str, ...] = ()


# Every unit the catalogue uses (tests/test_catalogue.py holds each entry to this table). A count
# is a UCUM annotation ({token}: a dimensionless 1 that says what it counts): Prometheus drops
# annotations, so it adds no suffix. A plain number ("": a loss, a learning rate) has no unit:
# UCUM's "1" would make Prometheus's OTLP translation append _ratio to a gauge (train_loss_ratio).
# A rate keeps its _per_second: cut, tokens_per_second would be the name of the count itself.
UNITS: dict[str, Unit] = {
    "": Unit(""),
    "s": Unit("s", 1.0, "seconds", ("_seconds", "_s")),
    "GB": Unit("By", 1e9, "bytes", ("_gb",)),
    "MB/s": Unit("By/s", 1e6, "bytes_per_second", ("_mb_s",)),
    "W": Unit("W", 1.0, "watts", ("_w",)),
    "°C": Unit("Cel", 1.0, "celsius", ("_c",)),
    "MHz": Unit("Hz", 1e6, "hertz", ("_mhz",)),
    "%": Unit("%", 1.0, "percent", ("_percent",)),
    "tokens": Unit("{token}"),
    "tokens²": Unit("{token^2}"),
    "samples": Unit("{sample}"),
    "steps": Unit("{step}"),
    "epochs": Unit("{epoch}"),
    "rank": Unit("{rank}"),
    "ranks": Unit("{rank}"),
    "records": Unit("{record}"),
    "values": Unit("{value}"),
    "connections": Unit("{connection}"),
    "tokens/s": Unit("{token}/s"),
    "samples/s": Unit("{sample}/s"),
    "steps/s": Unit("{step}/s"),
    "FLOP/s": Unit("{flop}/s"),
}


@functools.lru_cache(maxsize=4096)
def daemons_own(name: str) -> bool:
    """Whether `name` is one the daemon's pollers or its own records export: a rank's value under
    it is not theirs, and the exporters give it a name of its own (OTLP, Prometheus)."""
    m = lookup(name)
    return m is not None and m.source in DAEMONS_OWN


def unit_entry(name: str) -> Metric | None:
    """The entry whose unit `name` has: its own (lookup), but for a name_max / name_min the
    catalogue only knows as an extreme, the unit of name (perf/step_time_max: seconds)."""
    m = lookup(name)
    if m is not None and not m.unit and m.name in ("*_max", "*_min"):
        base = lookup(name[:-4])
        if base is not None and base.unit:
            return base
    return m


_DATASET_PARENTS = ("dataset", "eval")


def split(name: str, taken: frozenset[str] = frozenset()) -> tuple[list[str], dict[str, str], list[str]]:
    """A metric name's path segments as both exports name it: (segments kept, labels, template).

    dataset/<d>/x and eval/<d>/x: the dataset is a label (`dataset`), so every dataset's loss is
    one metric; a segment rank<r> inside a name is a `rank` label and "rank" stays in the name, so a
    per-rank metric never shares its name with the total (gpu/rank3/memory_used_gb ->
    gpu, rank, memory_used_gb {rank: 3}). `taken`: labels the record itself sets (a segment never
    becomes one of them). The template is the name with its label segments as placeholders."""
    parts = name.split("/")
    labels: dict[str, str] = {}
    kept: list[str] = []
    template: list[str] = []
    in_dataset = len(parts) >= 3 and parts[0] in _DATASET_PARENTS and "dataset" not in taken
    for i, seg in enumerate(parts):
        m = _RANK_SEGMENT.match(seg)
        if i == 1 and in_dataset:
            labels["dataset"] = seg
            template.append("{dataset}")
        elif m and kept and "rank" not in labels and "rank" not in taken:
            labels["rank"] = seg[len("rank"):]
            kept.append("rank")
            template.append("rank{rank}")
        else:
            kept.append(seg)
            template.append(seg)
    return kept, labels, template


@dataclass(frozen=True, slots=True)
class OtelMetric:
    """A metric name as OpenTelemetry names it (`otel`)."""
    name: str                  # train.loss, memory.allocated, rank.train.loss
    unit: str                  # UCUM: "s", "By", "{token}/s", "" (a plain number)
    scale: float               # the record's value times this is in `unit` (GB -> By: 1e9)
    labels: dict[str, str]     # attributes from the name's segments (dataset, rank)
    doc: str
    cumulative: bool           # a count since a start: a monotonic cumulative sum, not a gauge


_NOT_IN_SEGMENT = re.compile(r"[^a-z0-9_]+")
# OpenTelemetry's instrument names: at most 255 characters.
MAX_OTEL_NAME = 255


def _otel_segment(seg: str) -> str:
    return _NOT_IN_SEGMENT.sub("_", seg.lower()).strip("_")


def _otel_join(segments: list[str]) -> str:
    name = ".".join(s for s in map(_otel_segment, segments) if s) or "unnamed"
    return name if name[0].isalpha() else "m_" + name


_plain_names: frozenset[str] | None = None


def _uncut_names() -> frozenset[str]:
    """The OpenTelemetry names of the catalogue's exact names before any unit is cut from them."""
    global _plain_names
    if _plain_names is None:
        _plain_names = frozenset(_otel_join(split(m.name)[0]) for m in CATALOGUE if "*" not in m.name)
    return _plain_names


def otel(name: str, taken: frozenset[str] = frozenset(), per_rank: bool = False) -> OtelMetric:
    """`name` (a record's metric name) as an OpenTelemetry metric, by the semantic conventions'
    naming: the path's segments become dot-separated namespaces, each lowercase snake_case
    (anything else becomes "_"); the unit the name spells at its end is cut (memory/allocated_gb
    -> memory.allocated, unit By, values x 1e9; goodput/checkpoint_save_s -> goodput.checkpoint_save,
    unit s), unless the cut name is another built-in metric's (perf/mfu_percent stays
    perf.mfu_percent beside perf.mfu); dataset and rank<r> segments become attributes as `split`
    says. `per_rank`: one rank's own value (a per-rank record) is under the `rank.` namespace
    (rank.train.loss {rank}), never the aggregate's name minus a label. A name the catalogue does
    not know (your own: train/my_metric) is a gauge of no unit under its segments' name."""
    kept, labels, _ = split(name, taken)
    m = unit_entry(name)
    unit = UNITS.get(m.unit, Unit(m.unit)) if m is not None else UNITS[""]
    out = _otel_join(kept)
    last = out.rsplit(".", 1)[-1]
    for tail in unit.spelled:
        if last.endswith(tail) and len(last) > len(tail):
            cut = out[:-len(tail)]
            if cut not in _uncut_names():
                out = cut
            break
    if per_rank:
        out = "rank." + out
    if len(out) > MAX_OTEL_NAME:
        import hashlib

        out = out[:MAX_OTEL_NAME - 9] + "_" + hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return OtelMetric(out, unit.ucum, unit.scale, labels, m.doc if m is not None else "",
                      m is not None and m.cumulative)


def declared(metrics: dict, where: str = "metrics") -> tuple[Metric, ...]:
    """A user's own declarations (the daemon config's `metrics:` map: name -> the fields of
    Metric but `name` and `source`; unit, kind and group default to "", "gauge" and "custom", or
    for a name the catalogue declares, to what it declares).
    ValueError naming the entry when one is not a declaration. (The daemon's config checks the
    reductions' spelling: reductions.parse.)"""
    out = []
    allowed = {"unit", "kind", "group", "doc", "across_ranks", "over_window", "wandb_summary"}
    for name, fields in metrics.items():
        if not isinstance(name, str) or not name or not isinstance(fields, dict):
            raise ValueError(f"{where}[{name!r}]: a metric name and a map of its fields")
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise ValueError(f"{where}[{name!r}]: unknown field(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(allowed))})")
        # A built-in name declared again (to give it a wandb_summary, say) keeps what the
        # catalogue says of it but the fields given: its reductions above all.
        base = next((m for m in CATALOGUE if m.name == name), None)
        dflt = {"unit": "", "kind": "gauge", "group": "custom", "doc": "", "across_ranks": MEAN,
                "over_window": MEAN, "wandb_summary": ""} if base is None else \
            {k: getattr(base, k) for k in allowed}
        f = {k: str(fields.get(k, dflt[k])) for k in allowed}
        try:
            out.append(Metric(name, unit=f["unit"], kind=f["kind"], group=f["group"], doc=f["doc"],
                              across_ranks=f["across_ranks"], over_window=f["over_window"],
                              wandb_summary=f["wandb_summary"],
                              source=base.source if base is not None else "rank",
                              cumulative=base.cumulative if base is not None and f["kind"] == base.kind else False))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return tuple(out)


# The group of a name the catalogue does not know: the run's own (a script's acc, val/loss, ...).
OWN_GROUP = "yours"


def wandb_summaries(extra: tuple[Metric, ...] = ()) -> list[tuple[str, str]]:
    """(name, summary) for W&B's define_metric, of every entry (the catalogue's, then `extra`: a
    daemon config's declarations) that says a wandb_summary (exact names only)."""
    return [(m.name, m.wandb_summary) for m in CATALOGUE + tuple(extra) if m.wandb_summary]


def groups() -> list[str]:
    """The display groups, in the order the catalogue first names them."""
    return list(dict.fromkeys(m.group for m in CATALOGUE))


def grouped(names) -> list[tuple[str, str, str]]:
    """(group, name, unit) of each name, as the consumers show them: the run's own names (the
    catalogue does not know them) first, under OWN_GROUP, then by the catalogue's groups in its
    order; by name within a group."""
    order = {g: i for i, g in enumerate(groups())}
    rows = []
    for name in names:
        m = lookup(name)
        if m is None:
            rows.append((-1, OWN_GROUP, name, ""))
        else:
            rows.append((order.get(m.group, len(order)), m.group, name, m.unit))
    rows.sort(key=lambda r: (r[0], r[2]))
    return [r[1:] for r in rows]


_FROM = {"rank": "the ranks", "daemon": "the daemon", "poller": "the daemon's pollers", "self": "the daemon itself"}


def markdown_table(catalogue: tuple[Metric, ...] | None = None) -> str:
    """The README's table of metric names, by group (in the order groups first appear)."""
    catalogue = CATALOGUE if catalogue is None else catalogue
    groups: dict[str, list[Metric]] = {}
    for m in catalogue:
        groups.setdefault(m.group, []).append(m)
    lines = ["| group | name | unit | kind | across ranks | over a window | from | what it is |",
             "|---|---|---|---|---|---|---|---|"]
    for group, ms in groups.items():
        for m in ms:
            reduced = m.source in REDUCED
            kind = m.kind + (", cumulative" if m.cumulative else "")
            lines.append(f"| {group} | `{m.name}` | {m.unit or '-'} | {kind} | {m.across_ranks if reduced else '-'} | "
                         f"{m.over_window if reduced else '-'} | {_FROM[m.source]} | {m.doc}"
                         + (f" (status: `{m.status}`)" if m.status else "") + " |")
    return "\n".join(lines) + "\n"

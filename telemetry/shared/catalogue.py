"""The metric catalogue: one declaration per built-in metric (issue 28 item 1, first part).

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
Still to come from it (issue 28): the daemon's counters and `status`, Prometheus names and
units, the groups and units of tail, report and the dashboard, W&B define_metric. Until then
the polled GPU and host series and the daemon's counters are described in the README's prose.

Adding a metric the daemon computes: one entry here (and its computation, in derived.py).
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("gauge", "counter", "rate")
SOURCES = ("rank", "daemon")          # sent by the ranks; derived by the daemon for each step
MEAN = "mean"


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

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.source not in SOURCES:
            raise ValueError(f"metric {self.name!r}: source {self.source!r} is not one of {', '.join(SOURCES)}")
        if self.name.count("*") > 1 or ("*" in self.name and not (self.name.startswith("*") or self.name.endswith("*"))):
            raise ValueError(f"metric {self.name!r}: a pattern is 'prefix*' or '*suffix'")


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
           across_ranks="sum", over_window="max"),
    Metric("memory/alloc_retries", "", "counter", "device memory", "allocator retries so far (cumulative)",
           across_ranks="sum", over_window="max"),
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
)


def rules(which: str, catalogue: tuple[Metric, ...] = CATALOGUE) -> dict[str, str]:
    """The reduction table: "across_ranks" or "over_window", name -> reduction, without the
    means (the default), in the catalogue's order (a suffix pattern is tried in that order)."""
    if which not in ("across_ranks", "over_window"):
        raise ValueError(f"rules({which!r}): across_ranks or over_window")
    return {m.name: getattr(m, which) for m in catalogue if getattr(m, which) != MEAN}


def declared(metrics: dict, where: str = "metrics") -> tuple[Metric, ...]:
    """A user's own declarations (the daemon config's `metrics:` map: name -> the fields of
    Metric but `name` and `source`; unit, kind and group default to "", "gauge" and "custom").
    ValueError naming the entry when one is not a declaration. (The daemon's config checks the
    reductions' spelling: reductions.parse.)"""
    out = []
    allowed = {"unit", "kind", "group", "doc", "across_ranks", "over_window"}
    for name, fields in metrics.items():
        if not isinstance(name, str) or not name or not isinstance(fields, dict):
            raise ValueError(f"{where}[{name!r}]: a metric name and a map of its fields")
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise ValueError(f"{where}[{name!r}]: unknown field(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(allowed))})")
        try:
            out.append(Metric(name, unit=str(fields.get("unit", "")), kind=str(fields.get("kind", "gauge")),
                              group=str(fields.get("group", "custom")), doc=str(fields.get("doc", "")),
                              across_ranks=str(fields.get("across_ranks", MEAN)),
                              over_window=str(fields.get("over_window", MEAN))))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return tuple(out)


def markdown_table(catalogue: tuple[Metric, ...] = CATALOGUE) -> str:
    """The README's table of metric names, by group (in the order groups first appear)."""
    groups: dict[str, list[Metric]] = {}
    for m in catalogue:
        groups.setdefault(m.group, []).append(m)
    lines = ["| group | name | unit | kind | across ranks | over a window | from | what it is |",
             "|---|---|---|---|---|---|---|---|"]
    for group, ms in groups.items():
        for m in ms:
            lines.append(f"| {group} | `{m.name}` | {m.unit or '-'} | {m.kind} | {m.across_ranks} | {m.over_window} | "
                         f"{'the ranks' if m.source == 'rank' else 'the daemon'} | {m.doc} |")
    return "\n".join(lines) + "\n"

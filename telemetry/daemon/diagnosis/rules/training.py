"""Rules on the training signals: non-finite values, loss spikes, throughput drops, stragglers."""
from __future__ import annotations

import math
import statistics
from bisect import bisect_left, insort
from collections import deque
from itertools import takewhile

from telemetry.daemon.diagnosis.config import DiagnosisConfig
from telemetry.daemon.diagnosis.rules.base import Finding, Rule, finite, num, step_of, t_of
from telemetry.shared.numbers import is_number

NONFINITE_KEYS = ("train/loss", "train/grad_norm")
# Throughput keys in order of preference: the first one a record carries is the run's measure.
THROUGHPUT_KEYS = ("perf/tokens_per_second", "perf/samples_per_second", "perf/steps_per_second")
# Robust sigma from the median absolute deviation of a normal distribution.
MAD_TO_SIGMA = 1.4826


class SortedWindow:
    """The last `size` values, also kept sorted: the median of a window of thousands costs a
    lookup, not a sort per log step (a daemon catching up on a backlog runs the rules for
    thousands of steps a second)."""

    def __init__(self, size: int) -> None:
        self._order: deque[float] = deque(maxlen=size)
        self._sorted: list[float] = []

    def append(self, x: float) -> None:
        if len(self._order) == self._order.maxlen:
            del self._sorted[bisect_left(self._sorted, self._order[0])]
        self._order.append(x)
        insort(self._sorted, x)

    def median(self) -> float:
        s, n = self._sorted, len(self._sorted)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    def quantile(self, q: float) -> float:
        """The value at fraction q (0..1) of the way from the least to the greatest (no
        interpolation): below the greatest for q < 1 from two values on, so in a short window
        one outlier is not the answer."""
        return self._sorted[int(q * (len(self._sorted) - 1))]

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self):
        return iter(self._order)


def is_our_trainer(info: object) -> bool:
    """Whether a hello's info is our trainer's (trainer/train.py): its config has the trainer's
    sections (optim) and its own keys (nonfinite_action), and no integration says it made the run
    (an integration's and the W&B drop-in's hellos carry `framework`)."""
    if not isinstance(info, dict) or "framework" in info:
        return False
    cfg = info.get("config")
    return isinstance(cfg, dict) and isinstance(cfg.get("optim"), dict) and "nonfinite_action" in cfg


class NonFinite(Rule):
    """NaN or Inf in train/loss or train/grad_norm, aggregated or per rank (critical). What it
    suggests fits the run: our trainer's settings for our trainer's run (its hello says so), the
    usual remedies in general words for any other program (a W&B script has no optim.lr)."""

    name = "nonfinite"
    kinds = frozenset({"metrics", "hello"})

    def __init__(self, cfg: DiagnosisConfig) -> None:
        super().__init__(cfg)
        self.our_trainer = False

    def consume(self, record: dict) -> list[Finding]:
        if record.get("kind") == "hello":
            self.our_trainer = self.our_trainer or is_our_trainer(record.get("info"))
            return []
        values = record.get("values")
        out = []
        for key in NONFINITE_KEYS:
            v = num(values, key)
            if v is None and isinstance(values, dict) and isinstance(values.get(key), str):
                try:  # a value that went through a text format as "NaN" / "inf"
                    v = float(values[key])
                except ValueError:
                    v = None
            if v is None or math.isfinite(v):
                continue
            rank = record.get("rank")
            where = f"rank {rank}" if rank is not None else "the aggregated step"
            if self.our_trainer:
                # What to try is what the trainer's config allows: model.dtype is fp32 or bf16 (bf16
                # has fp32's range, so no loss scaling; fp16 is refused), non-finite steps are never
                # applied.
                advice = ("try a lower optim.lr or a longer optim.warmup_steps, keep optim.grad_clip on, or "
                          "train in fp32 (model.dtype) if bf16; nonfinite_action=skip drops such steps, stop "
                          "ends the run with a checkpoint")
            else:
                advice = ("try a lower learning rate or a longer warm-up, clip the gradient norm, or train in "
                          "fp32 (with fp16, a loss scaler); skipping the optimizer step when the loss is not "
                          "finite keeps the weights")
            msg = (f"{key} is {v} at step {step_of(record)} ({where}): training has diverged or a batch "
                   f"produced an overflow; {advice}")
            # Subject is the key alone: one NaN usually shows on every rank at once; say it once.
            out.append(Finding(key, msg, t_of(record), rank=rank, severity="critical",
                               data={"key": key, "value": str(v), "step": step_of(record)}))
        return out


class LossSpike(Rule):
    """Aggregated train/loss above median + max(robust_z x sigma, min_rel x median) of the window."""

    name = "loss_spike"
    kinds = frozenset({"metrics"})
    aggregated_only = after_warmup = True

    def __init__(self, cfg: DiagnosisConfig) -> None:
        super().__init__(cfg)
        self.history = SortedWindow(cfg.loss_spike_window)

    def consume(self, record: dict) -> list[Finding]:
        loss = finite(record.get("values"), "train/loss")
        if loss is None:
            return []
        out = []
        if len(self.history) >= self.cfg.loss_spike_min_points:
            med = self.history.median()
            # The threshold is at least med + min_rel * |med|: under that, no need for sigma.
            if loss > med + self.cfg.loss_spike_min_rel * abs(med):
                sigma = MAD_TO_SIGMA * statistics.median(abs(x - med) for x in self.history)
                threshold = med + max(self.cfg.loss_spike_robust_z * sigma, self.cfg.loss_spike_min_rel * abs(med))
            else:
                sigma = threshold = math.inf
            if loss > threshold:
                msg = (f"loss spike at step {step_of(record)}: train/loss {loss:.4g} against a median of "
                       f"{med:.4g} over the last {len(self.history)} log steps (threshold {threshold:.4g}); "
                       f"a bad batch, a learning rate too high for this phase, or an fp16 overflow")
                out.append(Finding("run", msg, t_of(record), data={
                    "loss": loss, "median": med, "robust_sigma": sigma, "threshold": threshold,
                    "step": step_of(record)}))
        self.history.append(loss)
        return out


class ThroughputDrop(Rule):
    """Aggregated tokens/s (or samples/s, steps/s) under the run's median minus the larger of
    drop_fraction x the median and throughput_drop_robust_z robust sigmas of the run's own
    values (1.4826 x their median absolute deviation: a run on a shared machine swings more than
    one alone on its node, and its swings are not drops), for throughput_drop_consecutive log
    steps in a row spanning at least throughput_drop_min_s of the run's time (the records' t);
    reported once per episode. On a shared machine a balanced run beside CPU-bound processes dips
    by nearly half for a few log steps, a fraction of a second, as the scheduler moves them (the
    balanced-run test): a dip that short is the machine, not a drop."""

    name = "throughput_drop"
    kinds = frozenset({"metrics"})
    # A step without all ranks sums fewer ranks' tokens/s: that is rank_stopped's story.
    aggregated_only = after_warmup = complete_only = True
    MAX_HISTORY = 5000  # log steps kept for the median: hours of a run at one log per second

    def __init__(self, cfg: DiagnosisConfig) -> None:
        super().__init__(cfg)
        self.key: str | None = None
        self.history = SortedWindow(self.MAX_HISTORY)
        self.num_low = 0
        self.low_since: float | None = None   # the t of the first log step of the low stretch
        self.reported = False

    def consume(self, record: dict) -> list[Finding]:
        values = record.get("values")
        if self.key is None:
            self.key = next((k for k in THROUGHPUT_KEYS if finite(values, k) is not None), None)
            if self.key is None:
                return []
        v = finite(values, self.key)
        if v is None:
            return []
        out = []
        if len(self.history) >= self.cfg.throughput_min_points:
            med = self.history.median()
            # Under the fraction first (a lookup): only then the spread (a pass over the window).
            if v < (1.0 - self.cfg.throughput_drop_fraction) * med and v < med - self.cfg.throughput_drop_robust_z * (
                    MAD_TO_SIGMA * statistics.median(abs(x - med) for x in self.history)):
                self.num_low += 1
                t = record.get("t")
                t = float(t) if is_number(t) else None
                if self.num_low == 1:
                    self.low_since = t
                lasted_s = t - self.low_since if t is not None and self.low_since is not None else math.inf
                if (self.num_low >= self.cfg.throughput_drop_consecutive and lasted_s >= self.cfg.throughput_drop_min_s
                        and not self.reported):
                    self.reported = True
                    drop = 1.0 - v / med if med else 1.0
                    lasted = f" ({lasted_s:.0f} s)" if math.isfinite(lasted_s) else ""
                    msg = (f"throughput dropped at step {step_of(record)}: {self.key} {v:.4g} is {drop:.0%} "
                           f"under the run's median {med:.4g} for {self.num_low} log steps in a row{lasted}; look for "
                           f"throttling, a straggler, a slower data source, or other jobs on the node")
                    out.append(Finding("run", msg, t_of(record), data={
                        "key": self.key, "value": v, "median": med, "drop_fraction": drop,
                        "num_log_steps": self.num_low, "lasted_s": lasted_s if math.isfinite(lasted_s) else None,
                        "step": step_of(record)}))
            else:
                self.num_low = 0
                self.low_since = None
                self.reported = False
        self.history.append(v)
        return out


# Where the other ranks wait for a slow one, read from the phases measured, not assumed: a phase
# split into its work and the rest (the trainer times the collective waits apart), the rest as
# the mean across ranks of the whole minus the work. The slow rank waits about nothing, the
# others about its excess: the mean is (n-1)/n of it, at least half.
_WAITS = (("forward", "perf/forward_time", "perf/forward_compute_time",
           "in their forward before its compute (DDP's buffer broadcast, ZeRO-3's parameter all-gathers)"),
          ("backward", "perf/backward_time", "perf/backward_compute_time",
           "at the end of their backward (the gradient all-reduce)"),
          ("optimizer", "perf/optimizer_time", "perf/optimizer_update_time",
           "in their optimizer step outside its update (ZeRO's norm all-reduce and parameter all-gather)"))
_WAITS_BY_PHASE = {phase: work for phase, _, work, _ in _WAITS}
# A wait at least this fraction of the slow rank's excess is where the others wait.
WAIT_MIN_FRACTION = 0.25


def others_wait(values: dict, excess_s: float) -> tuple[str | None, float | None, str]:
    """(phase, mean wait s, a clause for the message) of where the other ranks wait."""
    best = None
    for phase, whole, work, how in _WAITS:
        w, c = finite(values, whole), finite(values, work)
        if w is not None and c is not None and (best is None or w - c > best[1]):
            best = (phase, w - c, how)
    if best is not None and best[1] >= WAIT_MIN_FRACTION * excess_s:
        phase, wait_s, how = best
        return phase, wait_s, (f"the other ranks wait for it {how}: {phase} minus its own work averages "
                               f"{wait_s:.3g} s a rank")
    return None, None, ("where the other ranks wait for it is not measured here: no phase of theirs that "
                        "holds the wait is timed apart from its work (the trainer does it for DDP's forward "
                        "and backward, ZeRO-3's forward and the optimizer's update)")


# A part of a phase that the straggler view tells apart, reported as (its phase, the part).
_PART_OF = {"optimizer_update": ("optimizer", "update"), "forward_compute": ("forward", "compute"),
            "backward_compute": ("backward", "compute")}


class Straggler(Rule):
    """One rank slow in one phase, from the per-phase straggler view (straggler_view.py): in the
    phase named by perf/straggler_phase_index, the slowest rank's time is >= straggler_ratio x the
    other ranks' median, and over it by at least straggler_min_excess_s, CAUSE_MIN_FRACTION of the
    step and half of straggler_noise_z x the run's own step-time noise (below), for
    straggler_consecutive log steps, same rank and phase (up to MAX_GAP log steps of something else
    between them, a rank descheduled for a moment, do not end the episode), with the median of the
    last straggler_consecutive of those steps' excess at least straggler_noise_z x the noise,
    straggler_noise_z x the excess's own step-to-step noise over them (a steady excess, not a
    rank swinging) and straggler_usual_factor x the run's usual excess (below); reported once
    per episode.
    Without phase timings: perf/step_time_max / perf/step_time_min >= straggler_ratio instead.

    The noise is the robust sigma of the step-to-step changes of the step time over the last
    NOISE_WINDOW log steps (1.4826 x their median absolute value / sqrt 2): on a shared machine
    one rank's phase swings by tens of ms for a few steps as other processes take the CPU, and
    the step time swings with it; a constant slowdown, from whatever step on, changes it once.
    The usual excess is the USUAL_QUANTILE of the straggler view's excess (whatever its rank and
    phase) over the last NOISE_WINDOW log steps outside the episodes reported as stragglers
    and those too large to be usual (_settle): in
    synchronous data parallel some rank is always the slowest by a little, and on a shared
    machine a rank that shares a core with another process is a few times slower in one phase for
    a while, as steady as a real straggler over 8 log steps. Such bursts come back all through a
    run, so they set its usual excess; a real straggler stands out of it. Before
    USUAL_MIN_POINTS such steps it is not known and does not count; an episode then needs
    UNKNOWN_USUAL_FACTOR x straggler_consecutive slow log steps instead (a balanced DDP run beside
    a CPU-bound process can show one rank's forward compute twice the other's for 8 log steps
    before the run has USUAL_MIN_POINTS steps outside such bursts; a straggler from the run's
    first step is then named UNKNOWN_USUAL_FACTOR x straggler_consecutive log steps past the
    warm-up, its series all along).
    While it is not known, an episode whose excess jumps to straggler_usual_factor x its level
    so far for JUMP_STEPS slow log steps in a row is split there, when its earlier part (a burst,
    learned as usual: the new level stands out of it by that factor) makes the usual excess known;
    the new level is then an episode of its own (on a loaded box every early log step can be some
    rank's burst, and a burst that runs on into a real slowdown ten times its size would otherwise
    hold the slowdown's naming back by the whole unknown-usual wait).
    On a loaded machine beside a CPU-bound process, bursts of one rank are several times the step
    times' noise and last 5-13 log steps, some as steady as a straggler (the straggler_noise_z
    test alone lets one through): the usual excess is what tells them from a real straggler
    (tests/test_diagnosis_noise.py)."""

    name = "straggler"
    kinds = frozenset({"metrics"})
    aggregated_only = after_warmup = complete_only = True

    NOISE_WINDOW = 100     # log steps of step-time changes the noise is taken over
    MAX_GAP = 2            # log steps in a row of another pick (or none) an episode survives
    USUAL_QUANTILE = 0.9   # the run's usual excess: high enough to hold its recurring bursts
    USUAL_MIN_POINTS = 5   # log steps of excess before the usual excess counts
    UNKNOWN_USUAL_FACTOR = 3   # an episode while the usual excess is not known lasts this many times longer
    JUMP_STEPS = 2         # slow log steps in a row at a new level that split an episode (class docstring)

    def __init__(self, cfg: DiagnosisConfig) -> None:
        super().__init__(cfg)
        self.num_slow = 0
        self.num_gap = 0                      # log steps since the episode's rank and phase were last slow
        self.slowest: tuple | None = None     # (rank, phase) of the current episode
        self.excesses: deque[float] = deque(maxlen=64)   # its slow log steps' excess (s)
        self.reported = False
        self.changes = SortedWindow(self.NOISE_WINDOW)
        self.last_step_s: float | None = None
        self.usual = SortedWindow(self.NOISE_WINDOW)   # the view's excess outside reported episodes (s)
        self.held: list[tuple] = []          # ((rank, phase) picked, slow?, excess s) since the open episode began

    def consume(self, record: dict) -> list[Finding]:
        values = record.get("values")
        step_s = finite(values, "perf/step_time_max")
        if step_s is not None:
            if self.last_step_s is not None:
                self.changes.append(abs(step_s - self.last_step_s))
            self.last_step_s = step_s
        if finite(values, "perf/straggler_phase_index") is not None:
            return self._by_phase(record, values)
        return self._by_step_time(record, values)

    def noise_s(self) -> float:
        """The run's step-time noise (class docstring), 0.0 before two step times."""
        return MAD_TO_SIGMA * self.changes.median() / math.sqrt(2) if len(self.changes) else 0.0

    def usual_known(self) -> bool:
        """Whether the run's usual excess is known yet (USUAL_MIN_POINTS log steps of it)."""
        return len(self.usual) >= self.USUAL_MIN_POINTS

    def usual_s(self) -> float:
        """The run's usual straggler excess (class docstring), 0.0 while not known."""
        return self.usual.quantile(self.USUAL_QUANTILE) if self.usual_known() else 0.0

    def _settle(self, held: list[tuple], floor_s: float = 0.0) -> None:
        """Take the log steps of an episode that ended into the run's usual excess: its own
        steps (the view picked its rank and phase, slow or not) if it was not reported and
        stayed within what the usual excess allows (a burst like the run's others; before the
        usual excess is known, straggler_noise_z x the run's noise), and the steps of anything
        else between them. A larger episode cut short (by gaps) may be a straggler coming and
        going: it never raises the bar for the next one."""
        own = [x for pick, _, x in held if pick == self.slowest]
        # Within what the usual excess allows; before it is known, within what the noise allows
        # (bursts about as large as the noise itself, early in a loaded run, so that it becomes
        # known: a real straggler's excess, many times that, coming and going early stays out).
        bar_s = max(floor_s, self.cfg.straggler_usual_factor * self.usual_s() if self.usual_known()
                    else self.cfg.straggler_noise_z * self.noise_s())
        learn_own = not self.reported and bool(own) and bar_s > 0 and statistics.median(own) < bar_s
        for pick, _, x in held:
            if learn_own or pick != self.slowest:
                self.usual.append(x)

    def _split_at_jump(self, who: tuple | None, excess_s: float) -> None:
        """Before a slow log step of the open episode's rank and phase: while the usual excess is
        not known, split the episode where its excess jumped to straggler_usual_factor x its level
        before (JUMP_STEPS slow log steps in a row, this one the last), when the earlier part,
        learned as usual, makes it known (class docstring). The earlier part is settled; the rest
        stays the episode."""
        if self.reported or who is None or who != self.slowest or self.usual_known():
            return
        own = [i for i, (pick, slow, _) in enumerate(self.held) if slow and pick == who]
        k = self.JUMP_STEPS - 1          # the episode's slow log steps at the new level before this one
        if len(own) <= k:
            return
        new, before = own[len(own) - k:], [self.held[i][2] for i in own[:len(own) - k]]
        level_s = min([self.held[i][2] for i in new] + [excess_s])
        if level_s < self.cfg.straggler_usual_factor * statistics.median(before):
            return
        cut = new[0] if new else len(self.held)
        if len(self.usual) + cut < self.USUAL_MIN_POINTS:   # learned, it would not make the usual known
            return
        self._settle(self.held[:cut], floor_s=level_s / self.cfg.straggler_usual_factor)
        self.held = self.held[cut:]
        self.num_slow = len(new)
        self.excesses.clear()
        self.excesses.extend(self.held[i - cut][2] for i in new)

    def _episode(self, who: tuple | None, excess_s: float = math.inf, noise_s: float = 0.0,
                 needed: int | None = None) -> bool:
        """Count a slow log step for `who` (None: not slow); True when it is time to report:
        after `needed` slow log steps (straggler_consecutive when None)."""
        if who is not None and (not self.num_slow or who == self.slowest):
            self.num_slow, self.num_gap, self.slowest = self.num_slow + 1, 0, who
        elif self.num_slow and self.num_gap < self.MAX_GAP:
            self.num_gap += 1
            return False
        else:   # the episode is over; `who` (if any) begins the next one, with its gap steps just before
            gap = self.held[len(self.held) - self.num_gap:] if self.num_gap else []
            own = list(takewhile(lambda e: e[1] and e[0] == who, reversed(gap)))[::-1]
            self._settle(self.held[:len(self.held) - len(own)])
            self.held = own
            self.num_slow, self.num_gap, self.slowest, self.reported = len(own) + (who is not None), 0, who, False
            self.excesses.clear()
            self.excesses.extend(x for _, _, x in own)
        if who is None:
            return False
        self.excesses.append(excess_s)
        n = self.cfg.straggler_consecutive
        if self.num_slow < (needed or n) or self.reported:
            return False
        last = list(self.excesses)[-n:]
        swing_s = MAD_TO_SIGMA * statistics.median(abs(a - b) for a, b in zip(last, last[1:])) / math.sqrt(2) \
            if n > 1 else 0.0
        if statistics.median(last) < max(self.cfg.straggler_noise_z * max(noise_s, swing_s),
                                         self.cfg.straggler_usual_factor * self.usual_s()):
            return False
        self.reported = True
        return True

    def _by_phase(self, record: dict, values: dict) -> list[Finding]:
        from telemetry.daemon.straggler_view import CAUSE_MIN_FRACTION, PHASES

        idx = int(finite(values, "perf/straggler_phase_index"))
        phase = PHASES[idx] if 0 <= idx < len(PHASES) else None
        rank_f = finite(values, "perf/straggler_rank")
        excess = finite(values, "perf/straggler_excess_s")
        median = finite(values, "perf/straggler_median_s")
        step_s = finite(values, "perf/step_time_max") or 0.0
        if phase is None or rank_f is None or excess is None or median is None:
            return []
        slow_s = median + excess
        noise_s = self.noise_s()
        # A phase that holds a collective, with its own work timed apart: an excess outside the
        # work is a wait. That rank waits for another; it does not hold the others up.
        work = _WAITS_BY_PHASE.get(phase)
        slow = (not (work and finite(values, work) is not None)
                and excess >= max(self.cfg.straggler_min_excess_s, CAUSE_MIN_FRACTION * step_s,
                              0.5 * self.cfg.straggler_noise_z * noise_s)
                and slow_s >= self.cfg.straggler_ratio * median)
        rank = int(rank_f)
        self._split_at_jump((rank, phase) if slow else None, excess)
        usual_s = self.usual_s()              # as it was before this step
        # Before the usual excess is known (a burst early in a run, or a straggler from its start,
        # whose steps are all the episode's), only a longer episode counts: bursts last 5-13 log steps.
        needed = self.cfg.straggler_consecutive * (1 if self.usual_known() else self.UNKNOWN_USUAL_FACTOR)
        report = self._episode((rank, phase) if slow else None, excess, noise_s, needed)
        if self.num_slow:
            self.held.append(((rank, phase), slow, max(excess, 0.0)))
        else:
            self.usual.append(max(excess, 0.0))
        if not report:
            return []
        ratio = slow_s / median if median > 0 else math.inf
        named, part = _PART_OF.get(phase, (phase, None))
        where = f"{named} (its own {part}, perf/{phase}_time)" if part else named
        wait_phase, wait_s, meanwhile = others_wait(values, excess)
        msg = (f"straggler: rank {rank} is slow in {where}: {slow_s:.3g} s against the other ranks' median "
               f"{median:.3g} s ({excess:+.3g} s) for {self.num_slow} log steps at step {step_of(record)} "
               f"(the run's step-time noise: {noise_s:.3g} s, its usual excess: {usual_s:.3g} s); {meanwhile}")
        return [Finding(f"rank{rank}", msg, t_of(record), rank=rank, data={
            "slowest_rank": rank, "phase": named, "part": part, "phase_time_s": slow_s, "others_median_s": median,
            "excess_s": excess, "ratio": ratio, "step_time_s": step_s, "num_log_steps": self.num_slow,
            "others_wait_phase": wait_phase, "others_wait_s": wait_s, "noise_s": noise_s, "usual_excess_s": usual_s,
            "step": step_of(record)})]

    def _by_step_time(self, record: dict, values: dict) -> list[Finding]:
        t_max = finite(values, "perf/step_time_max")
        t_min = finite(values, "perf/step_time_min")
        if t_max is None or t_min is None or t_min <= 0:
            return []
        slowest_f = finite(values, "perf/slowest_rank")
        slowest = int(slowest_f) if slowest_f is not None else None
        ratio = t_max / t_min
        if not self._episode((slowest, "step") if ratio >= self.cfg.straggler_ratio else None):
            return []
        who = f"rank {slowest}" if slowest is not None else "one rank"
        msg = (f"straggler: {who} is the slowest for {self.num_slow} log steps in a row, its step taking "
               f"{t_max:.3g} s against {t_min:.3g} s on the fastest rank ({ratio:.2f}x) at step "
               f"{step_of(record)}; the others wait for it at their next collective (check that node's "
               f"GPU clocks, its data loader and other processes on it)")
        return [Finding(f"rank{slowest}", msg, t_of(record), rank=slowest, data={
            "slowest_rank": slowest, "step_time_max_s": t_max, "step_time_min_s": t_min, "ratio": ratio,
            "num_log_steps": self.num_slow, "step": step_of(record)})]

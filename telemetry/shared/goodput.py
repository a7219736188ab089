"""The goodput ledger: where a run's wall-clock time went, kept as records go by.

`Ledger.feed(record)` takes the records the daemon writes (metrics.jsonl, in order: hellos,
aggregated steps, events, byes) one at a time in constant time and memory per launch (a few
numbers, one snapshot per checkpoint save, the last RECENT steps); `Ledger.result()` is the
ledger so far. `telemetry goodput RUN_DIR` feeds it the whole file (telemetry/consumers/goodput.py);
the daemon feeds it the records as it writes them and reports the running totals
(telemetry/daemon/goodput_stage.py). It splits the job's wall time, from the first process's
start to the last record of the last launch, into buckets that sum to it:

    productive          Σ over steps of step time - data loading - straggler wait - slow steps
    startup             first launch: process start -> its first step began (imports, model,
                        engine, data loader), less a checkpoint restore in it
    data_loading        Σ perf/data_loading_time: what the steps waited for data (synchronous data
                        loading; a loader's work overlapped with compute, which Google's goodput
                        library calls asynchronous, costs no wall time: no bucket, not measured)
    eval                Σ perf/eval_time (the trainer times its evaluation)
    checkpoint_save     Σ over saves of the slowest rank's checkpoint_saved duration_s
    checkpoint_restore  Σ over launches of the slowest rank's checkpoint_restored duration_s
    straggler           Σ perf/straggler_excess_s: per step, how much longer the slowest rank's
                        phase ran than the others' median (the time the others waited); when
                        that phase is data loading, the data bucket takes the others' median
                        (perf/straggler_median_s) rather than the ranks' mean, so the excess is
                        counted once. Beyond the run's own noise only: on ranks that are alike,
                        some rank is always slowest by a little (a busy host's jitter), and which
                        one changes; the excess of the steps whose straggler was not the step
                        before's is that noise, and an excess within NOISE_FACTOR times its
                        median (judged from the NOISE_MIN_SAMPLES-th such step on, against the
                        steps before) stays where it was spent (productive, or data
                        loading for that phase); before that, an excess is booked where its rank
                        was the straggler of most of the last RECENT_STRAGGLERS steps (and with
                        it its steps among those, judged noise until then: its onset, even
                        where another rank was slowest for a step between them), for now:
                        once the bound is known, such an excess within it (of the last RECENT
                        steps) goes back where it was spent (a busy host that slowed one rank
                        for the run's first steps is no straggler the run's noise does not
                        explain). A rank's first step beyond the bound (the step before's
                        straggler was not it beyond the bound) is booked when the next step's
                        straggler is the same rank beyond it too: a lone
                        spike (a busy host deschedules one rank for a step) is the run's noise,
                        booked where it was spent (a long one may then be a slow step). A rank
                        slow step after step leaves no noise sample (it is the step before's
                        straggler too), and its excess is booked
    slow_steps          Σ over steps of what a step's compute (its step time less data loading
                        and straggler wait) took beyond the launch's ideal step, where it lay
                        beyond the run's own noise: the ideal is the median compute time of its
                        steps after its first WARMUP_STEPS, the bound Tukey's outlier fence (p75 +
                        1.5 x the interquartile range, at least NOISE_FLOOR over the ideal), each
                        step judged against those of the steps before it (from the MIN_SAMPLES-th
                        on); taken out of productive. A run's jitter is no slow step; a GC pause,
                        a throttled GPU, a host sync that stalls a step is
    hang                a launch that failed: its last step -> when it failed, less the saves
                        then (an emergency save is checkpoint_save). It failed unless a train_end
                        said it finished: a rank that said hello never said bye, or after its
                        last step the daemon said diagnosis/hang or diagnosis/rank_exited (a rank
                        gone without a bye), the trainer saved an emergency_checkpoint (it raised
                        or was signalled), or a W&B run's train_end said failed; a step after
                        them and the run went on. However it ended (a rank killed, its peers'
                        error byes, a timeout, a launcher's teardown): it failed when the first
                        rank was seen gone (the daemon's diagnosis/rank_exited, gone_for_s
                        before the event; to the ms where the kernel has pidfds, else up to its
                        1 s tick) or said its bye after the last step, whichever came first; the
                        last launch, at its last record (a diagnosis/hang's counts, up to the
                        ranks' byes: the daemon says it of ranks still there; so does a non-zero
                        script_exit, the script's exit as its launcher, `telemetry run`, hands it
                        to the daemon's drain: a launcher's teardown of hung ranks may leave no
                        other record). A launch that finished leaves the time from its last step
                        to its last record unexplained (a loop of your own that closes its
                        client ends so)
    redone              the steps a failed launch made after the checkpoint the next launch
                        resumed from (its checkpoint_restored step; without one, the step
                        before its first), at their measured step time: work done twice
    recovery            a launch's end (a failed one's failure; any launch's end is at the
                        latest when the next one's first process started) -> the next launch's
                        first step, less its restore and the saves then
    telemetry           the time the client spent inside its log() and event() calls on the
                        training thread (telemetry/client_s: the slowest rank's, cumulative, sent
                        at most once a second), per launch its largest; taken out of productive
                        (the trainer's step time runs from one log call to the next, so it holds them)
    excluded            planned maintenance: the part of the windows marked excluded (module
                        constants EXCLUDE_*: the job's client's goodput/exclude_begin and
                        goodput/exclude_end events, a window still open running to the end; or
                        a goodput/exclude event with data start and end, unix times, which
                        `telemetry goodput-exclude` has the daemon write) that lay in the time
                        the job made no progress: its start-up, a failed launch's hang, a
                        recovery, each taken out of that bucket where they overlap (steps run
                        during a window are still booked as steps)
    unexplained         the rest: wall - all of the above (loop overhead, logging, anything the
                        trainer does not time), shown as such

goodput = productive / (wall - excluded). Steps are the daemon's aggregated step records (across ranks: the
step time is the slowest rank's, data loading the ranks' mean). Each step (with its eval) and
save is booked on the job's timeline from no earlier than the end of what came before it in its
launch (the step before's record, whose t is the last rank's, after its eval; a save's or a
restore's event): on ranks a few ms apart, the slowest rank's figure for one phase began while
another rank still did the one before, and the buckets would overlap (sum past the wall time). A
launch whose first step has no
perf/step_time (a W&B script, your own loop that times nothing) takes the time between its
steps' records (their `t`, the last rank's) as their step times: its first step's is 0, so
start-up runs to its first record, and a step logged again adds the time since. A launch is
the processes whose hello says they started after the previous launch's last step (hello
`started_at`, sent by every client). A step the daemon never wrote (it was down) is in `unexplained`; `steps_missing`
counts them. While a launch runs, its time since its last record is not in the wall time yet.

Per rank, from each rank's own step records, a ledger of each rank's own (RankBooks: `ranks` in
the result): its own step time, data loading, eval, client time, process start, saves, restores
and bye; its straggler bucket is the time it waited for another rank (the step's
perf/straggler_excess_s when the straggler was another rank, but never more than its own step
time less its own data loading: a rank that began the step late, descheduled on a busy host,
waited that much less, and its buckets still sum to its wall time); its excluded time the job's
windows (the daemon's goodput/exclude, any rank's begin and end) within its own. The job ledger above is the job's;
the per-rank ones say which ranks waited and which lost time to data. The daemon keeps them live
from the per-rank records it receives; they are in its files only with `--per-rank`, so without
it the daemon keeps them in RANKS_FILE (goodput_ranks.json, beside metrics.jsonl) for the
offline tools and for a daemon restarted on the run, which joins each to its book from then on
(join_rank: the time between, steps no ledger saw, unexplained); a book that begins mid-run
with nothing before it says `since` when.

On a multi-node job the head daemon keeps the job's ledger from what the nodes forward: their
aggregated steps (the slowest node's step time), each launch's start (a node forwards the hello
of a launch's first rank), the ranks' byes (as rank_bye events) and their events; a node
daemon's own records (node_daemon, node_gpu, node_system events) do not keep a launch alive, nor
do a group head's (group_daemon, ..., and node_bye, a node's forwarder ending) where the job's
head is fed by group heads, nor the bye that ends a forwarder's link (its stats say forwarded_by).

The settled ledger (`Ledger.settled`, what the daemon exports as cumulative counters) is the
part of the buckets no later record can re-book, so that none of it ever goes down: every launch
before the last one with steps; of that one, its start-up (or recovery) and restore, and its steps
and saves up to its last checkpoint save, its wall ending when that save did (were the launch to
fail, the steps after its last save would be work redone and its time since its last step hang;
a launch that starts from scratch redoes them all); all of it once a train_end said it finished.
A launch after it that has no step yet is not settled: its recovery ends at its first step. The
client time in steps redone is in `redone`, not `telemetry` (it was part of their step time).

Work redone needs the steps after the checkpoint the next launch resumed from: the ledger keeps
the running sums at each checkpoint save and the last RECENT steps; a launch that resumed from
a checkpoint older than both (not one this ledger saw saved, and more than RECENT log steps
back) is charged from the nearest save before it, and `redone_estimated` says so.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from protocol.output import OutputRecord
from telemetry.shared.numbers import is_int, is_number

BUCKETS = ("productive", "startup", "data_loading", "eval", "checkpoint_save", "checkpoint_restore", "straggler",
           "slow_steps", "hang", "redone", "recovery", "telemetry", "excluded", "unexplained")
# Buckets a ledger written before them lacks (goodput_ranks.json of an older daemon): 0 there.
NEWER_BUCKETS = ("slow_steps", "excluded")
# Planned maintenance (module docstring, `excluded`): a window the job's own client opens and
# closes (EXCLUDE_BEGIN, EXCLUDE_END events) or one given whole (EXCLUDE: data start, end; what
# `telemetry goodput-exclude` has the daemon write). At most MAX_EXCLUSIONS kept, the rest counted.
EXCLUDE_BEGIN, EXCLUDE_END, EXCLUDE = "goodput/exclude_begin", "goodput/exclude_end", "goodput/exclude"
MAX_EXCLUSIONS = 4096
CLIENT_TIME_KEY = "telemetry/client_s"   # protocol.constants.CLIENT_TIME_KEY (not imported: no zmq here)
DATA_PHASE = 0.0      # perf/straggler_phase_index of data loading (the catalogue's doc lists them)
RECENT = 512          # steps kept one by one (for a restore from a checkpoint no save event announced)
# Events the daemons write of themselves, not the ranks: they do not keep a launch alive (the
# daemon's diagnoses; a node daemon's or a group head's own records as its head receives them;
# the script's exit code a launcher hands the daemon's drain, written when the daemon drains).
DAEMON_EVENTS = ("diagnosis/", "node_daemon", "node_gpu", "node_system", "node_bye", "group_daemon", "group_gpu",
                 "group_system", "script_exit")
# What to do about each kind of loss, the report's line under the biggest.
ADVICE = {
    "startup": "start-up: cache the model and data locally, fewer imports, a warm container; it is paid per launch",
    "data_loading": "data loading: more DataLoader workers, pinned memory, prefetch, data on local disk",
    "eval": "evaluation: fewer eval batches or less often, or evaluate asynchronously",
    "checkpoint_save": "checkpoint saves: less often, asynchronous or sharded saves, a faster file system",
    "checkpoint_restore": "checkpoint restores: a faster file system, sharded checkpoints",
    "straggler": "stragglers: see diagnosis/straggler events (telemetry tail) for the rank and phase",
    "slow_steps": "slow steps: steps far beyond the run's usual step time (GC pauses, throttling, a noisy neighbour, "
                  "host syncs): look for spikes in perf/step_time",
    "hang": "hangs: set a collective timeout; the daemon's hang bundle names the rank and where it waits",
    "redone": "work redone: checkpoint more often (each lost step is paid twice)",
    "recovery": "recovery: restart faster (a job supervisor that relaunches at once, a warm node pool)",
    "telemetry": "telemetry: its calls on the training thread; log fewer values or less often",
    "excluded": "excluded: planned maintenance you marked; not counted against goodput",
    "unexplained": "unexplained: time outside the timed phases (logging, host syncs, the loop's own work)",
}
# A step's parts, in this order: step time, productive, data loading, straggler, eval.
_ST, _PROD, _DATA, _STRAG, _EVAL, _SLOW = range(6)
_ZERO = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
# Slow steps (module docstring, `slow_steps`): the first WARMUP_STEPS of a launch are not judged;
# its ideal and noise bound come from the compute time (step time - data - straggler) of the steps
# after them, in log bins of HIST_RATIO (1 %), judged once MIN_SAMPLES are in, recomputed every
# REFRESH_SAMPLES (O(1) a step); the bound is Tukey's outlier fence, at least NOISE_FLOOR over the ideal.
WARMUP_STEPS = 10
MIN_SAMPLES = 20
REFRESH_SAMPLES = 32
HIST_RATIO = 1.01
NOISE_FLOOR = 0.05
# Straggler noise (module docstring, `straggler`): the excess of a step whose straggler is not the
# step before's is the run's own noise; NOISE_FACTOR x its median (from NOISE_MIN_SAMPLES of them
# on; refreshed at each of the first 2 x REFRESH_SAMPLES, where a few more move it most, then every
# REFRESH_SAMPLES) bounds it: a median, so that the onsets of a real straggler (a flip too) do not
# raise it; 4 x the median of a half-normal excess (two alike ranks) is its 99.5th percentile.
NOISE_FACTOR = 4.0
NOISE_MIN_SAMPLES = 8
# Until the bound is known, an excess is a straggler's only where its rank was the straggler of
# most of the last RECENT_STRAGGLERS steps, this one included (on alike ranks, which is slowest
# changes step to step; a real straggler is the same rank step after step).
RECENT_STRAGGLERS = 8
_LOG_RATIO = math.log(HIST_RATIO)


def _num(v: Any) -> float | None:
    t = type(v)
    if t is float:
        return v if v == v else None
    return float(v) if t is int or (is_number(v) and v == v) else None


def _script_end(data: dict, t: float) -> float:
    """When a script_exit's script exited: its "exited_at" (telemetry run stamps it as the
    script's wait returns) where that is a finite number, never after the event's own time `t`
    (the drain's); else `t`."""
    at = _num(data.get("exited_at"))
    return min(at, t) if at is not None and math.isfinite(at) else t


def _add(a: tuple, b: tuple, sign: float = 1.0) -> tuple:
    return tuple(x + sign * y for x, y in zip(a, b))


def _unstraggle(parts: tuple, excess: float, data_phase: bool) -> tuple:
    """A step's parts with `excess` of its straggler time back where it was spent: data loading
    for that phase, else productive."""
    if data_phase:
        return parts[:_DATA] + (parts[_DATA] + excess, parts[_STRAG] - excess) + parts[_EVAL:]
    return (parts[_ST], parts[_PROD] + excess) + parts[_DATA:_STRAG] + (parts[_STRAG] - excess,) + parts[_EVAL:]


def step_parts(values: dict, room: float | None = None) -> tuple[float, ...] | None:
    """(step time, productive, data loading, straggler, eval) of an aggregated step's values, or
    None without a step time (module docstring). room: the time since what came before it on
    the job's timeline (_Launch.edge; its record's t is the last rank's, after its eval): what
    its step time and eval take at most, the step time where the values have none (a script
    that times nothing)."""
    get = values.get
    st = _num(get("perf/step_time"))
    eval_s = _num(get("perf/eval_time")) or 0.0
    if room is not None:
        room = max(0.0, room)
        eval_s = min(eval_s, room)
        room -= eval_s
    if st is None:
        if room is None:
            return None
        st = room
    elif room is not None and st > room:
        st = room
    data = _num(get("perf/data_loading_time")) or 0.0
    excess = _num(get("perf/straggler_excess_s")) or 0.0
    if excess < 0.0:
        excess = 0.0
    if excess and _num(get("perf/straggler_phase_index")) == DATA_PHASE:
        # The slow rank's data loading is in the ranks' mean: what the others waited for data is
        # their median; its excess is the straggler's, counted once.
        data = _num(get("perf/straggler_median_s")) or 0.0
    data = min(st, data)
    strag = min(st - data, excess)
    return (st, st - data - strag, data, strag, eval_s, 0.0)


@dataclass
class _Launch:
    started_at: float
    last_t: float = 0.0          # its last record of any kind
    # The same without the daemon's diagnosis/hang (a hang reached after every rank's bye was
    # decided before the last of them came: the launch ended at its byes).
    own_t: float = 0.0
    ended: bool = False          # a train_end event that did not say it failed: training was over
    num_steps: int = 0
    lo: int | None = None        # its first and last step, and when they ended / began
    hi: int | None = None
    first_began: float = 0.0
    hi_t: float = 0.0            # the t of its last step's record
    max_step_t: float = 0.0      # the latest t of any of its steps
    total: tuple = _ZERO         # Σ parts over its steps
    recent: dict = field(default_factory=dict)      # step -> parts, the last recent_max steps
    order: deque = field(default_factory=deque)     # their steps, oldest first
    snaps: dict = field(default_factory=dict)       # save step -> Σ parts over steps <= it
    pending: set = field(default_factory=set)       # save steps whose sums await a later step
    # step -> [slowest rank's duration, latest t, edge before, its client time then (client_s)]
    saves: dict = field(default_factory=dict)
    restore_s: float = 0.0
    restored_step: int | None = None
    client_s: float = 0.0        # telemetry/client_s: the largest seen
    recent_max: int = field(default_factory=lambda: RECENT)
    # How it ended (module docstring, `hang`): the ranks that said hello and those that said
    # bye; when the evidence of a failure came (the daemon's diagnosis/hang or rank_exited, an
    # emergency checkpoint, a train_end that says failed); the first bye and the first rank seen
    # gone after its last step (reset by a step after them: the run went on).
    hello_ranks: set = field(default_factory=set)
    bye_ranks: set = field(default_factory=set)
    fail_t: float | None = None
    first_bye_t: float | None = None
    first_gone_t: float | None = None
    derived: bool | None = None  # its step times from its records' own times (no perf/step_time)
    # Where its timeline is booked to: the latest end of its steps (their records' t, the last
    # rank's), saves and restores (their events' t). A step begins no earlier: the slowest
    # rank's step time began, on a rank that finished what came before sooner, while another
    # still did it (the previous step, a save, a restore), and that time is booked there.
    edge: float = 0.0
    # Slow steps: its steps' compute times after warm-up (log bin -> count), how many, and the
    # ideal and noise bound they give (None until MIN_SAMPLES; refreshed every REFRESH_SAMPLES).
    hist: dict = field(default_factory=dict)
    num_judged: int = 0
    seen_steps: int = 0
    ideal: float | None = None
    fence: float | None = None
    # Straggler noise: the noise histogram (log bin -> count), its size and the bound it gives
    # (None until NOISE_MIN_SAMPLES).
    noise_hist: dict = field(default_factory=dict)
    num_noise: int = 0
    noise_bound: float | None = None
    last_strag: int | None = None    # the straggler rank of the step before
    recent_strag: deque = field(default_factory=lambda: deque(maxlen=RECENT_STRAGGLERS))
    # step -> (excess, its phase was data loading): booked before the noise bound was known (at
    # most recent_max, the latest), judged again against it once it is (rejudge)
    provisional: dict = field(default_factory=dict)
    # (step, excess, data phase, rank): a rank's first step beyond the bound, booked
    # until the next step says whether it went on (a lone spike of a busy host's is noise)
    spike: tuple | None = None
    last_beyond: int | None = None   # the straggler rank of the step before, where beyond the bound
    # Before the bound is known: the last RECENT_STRAGGLERS steps judged noise (their straggler
    # was not yet the straggler of most recent steps), as (step, excess, data phase, rank): when a
    # rank becomes it, its steps among them were its onset and are booked too. Not only those in
    # a row: a step where another rank was slowest (a busy host's jitter) does not end an onset,
    # as it does not end the rank's count among the recent steps.
    onset: list = field(default_factory=list)

    def sift_straggler(self, step: int, parts: tuple, values: dict, new: bool) -> tuple:
        """A step's parts with its straggler excess moved back where it came from (data loading
        for that phase, else productive) when it is within the run's own noise (module
        docstring, `straggler`); a new step's excess is a noise sample when its straggler was not
        the step before's. A new step settles the step before's spike."""
        excess = parts[_STRAG]
        rank = values.get("perf/straggler_rank")     # (without it, nothing to judge by: booked)
        rank = int(rank) if is_number(rank) and rank == rank and abs(rank) < 1 << 31 else None
        if excess <= 0.0:
            if new:
                self._settle_spike(None)
                self.last_beyond = None
                self.onset.clear()
            return parts
        data_phase = _num(values.get("perf/straggler_phase_index")) == DATA_PHASE
        recent = self.recent_strag
        if new and rank is not None:
            recent.append(rank)
        known = self.noise_bound is not None
        if known:
            noise = excess <= self.noise_bound
        else:
            noise = rank is not None and 2 * recent.count(rank) <= len(recent)
        flip = new and rank is not None and self.last_strag is not None and rank != self.last_strag
        if new:
            beyond = rank if known and not noise else None
            self._settle_spike(beyond)
            if beyond is not None and beyond != self.last_beyond:
                self.spike = (step, excess, data_phase, rank)
            self.last_beyond = beyond
        if flip:
            b = int(math.floor(math.log(excess) / _LOG_RATIO))
            self.noise_hist[b] = self.noise_hist.get(b, 0) + 1
            self.num_noise += 1
            n = self.num_noise
            if n >= NOISE_MIN_SAMPLES and (n <= 2 * REFRESH_SAMPLES or n % REFRESH_SAMPLES == 0):
                seen = 0
                for b in sorted(self.noise_hist):
                    seen += self.noise_hist[b]
                    if seen >= 0.5 * n:
                        self.noise_bound = NOISE_FACTOR * HIST_RATIO ** (b + 0.5)
                        break
        if new:
            self.last_strag = rank
        if not known and self.noise_bound is not None:
            self.rejudge()
        onset = self.onset
        if new and (known or self.noise_bound is not None or rank is None):
            onset.clear()                   # the bound is known (or a step without a rank to judge by)
        if not noise:
            if not known and self.noise_bound is None and rank is not None:
                for was in onset:           # its onset, judged noise while it was not yet most steps'
                    if was[3] == rank:
                        self._unbook(was[0], -was[1], was[2])
                        self._provisional(was[0], was[1], was[2])
                onset[:] = [was for was in onset if was[3] != rank]
                self._provisional(step, excess, data_phase)     # judged again once the bound is known
            return parts
        if new and not known and self.noise_bound is None and rank is not None:
            onset.append((step, excess, data_phase, rank))
            if len(onset) > RECENT_STRAGGLERS:
                del onset[0]
        self.provisional.pop(step, None)
        return _unstraggle(parts, excess, data_phase)

    def _provisional(self, step: int, excess: float, data_phase: bool) -> None:
        self.provisional[step] = (excess, data_phase)
        if len(self.provisional) > self.recent_max:
            del self.provisional[next(iter(self.provisional))]

    def _settle_spike(self, rank: int | None) -> None:
        """The step before's spike (a rank's first step beyond the bound) went on into this
        step (its straggler `rank` again, beyond the bound): booked; else it was the run's noise,
        a lone spike of a busy host: back where it was spent."""
        spike, self.spike = self.spike, None
        if spike is not None and spike[3] != rank:
            self._unbook(spike[0], spike[1], spike[2])

    def _unbook(self, step: int, excess: float, data_phase: bool) -> None:
        """`excess` of a kept step's straggler time back where it was spent, in its parts, its
        launch's sums and the sums at each checkpoint save since; a negative one is booked as
        straggler time from where it was (a straggler's onset judged noise at first)."""
        old = self.recent.get(step)
        if old is None or old[_STRAG] < excess or old[_DATA if data_phase else _PROD] < -excess:
            return
        delta = _add(_unstraggle(old, excess, data_phase), old, -1.0)
        self.recent[step] = _add(old, delta)
        self.total = _add(self.total, delta)
        for k in self.snaps:
            if k >= step:
                self.snaps[k] = _add(self.snaps[k], delta)

    def rejudge(self) -> None:
        """The noise bound is known now: the excess booked before it (provisional) that lies
        within it goes back where it was spent, in each step's parts, its sums, and the sums at
        each checkpoint save taken since (the steps before it are no longer in `recent`: kept
        as booked)."""
        bound = self.noise_bound
        for step, (excess, data_phase) in self.provisional.items():
            if excess <= bound:
                self._unbook(step, excess, data_phase)
        self.provisional.clear()

    def judge(self, parts: tuple, new: bool) -> tuple:
        """A step's parts with its slow part (module docstring, `slow_steps`) taken out of its
        productive one, against the ideal and bound known so far; a new step's compute time goes
        into the histogram once the launch is warm."""
        compute = parts[_PROD]
        if self.fence is not None and compute > self.fence:
            slow = compute - self.ideal
            parts = parts[:_PROD] + (compute - slow,) + parts[_PROD + 1:_SLOW] + (slow,)
        if new:
            self.seen_steps += 1
            if self.seen_steps > WARMUP_STEPS and compute > 0.0:
                b = int(math.floor(math.log(compute) / _LOG_RATIO))
                self.hist[b] = self.hist.get(b, 0) + 1
                self.num_judged += 1
                n = self.num_judged
                if n >= MIN_SAMPLES and (n == MIN_SAMPLES or n % REFRESH_SAMPLES == 0):
                    self._bounds()
        return parts

    def _bounds(self) -> None:
        """The ideal (the median compute time) and the noise bound (Tukey's fence, p75 + 1.5 IQR,
        at least NOISE_FLOOR over the ideal) from the histogram."""
        n, qs, out, seen = self.num_judged, (0.25, 0.5, 0.75), [], 0
        for b in sorted(self.hist):
            seen += self.hist[b]
            while len(out) < 3 and seen >= qs[len(out)] * n:
                out.append(HIST_RATIO ** (b + 0.5))
        p25, p50, p75 = out
        self.ideal = p50
        self.fence = max(p75 + 1.5 * (p75 - p25), p50 * (1.0 + NOISE_FLOOR))

    def all_left(self) -> bool:
        """Every rank that said hello has said bye."""
        return bool(self.hello_ranks) and self.hello_ranks <= self.bye_ranks

    def failed(self) -> bool:
        """Whether it ended in a failure (module docstring, `hang`)."""
        if self.ended:        # a train_end that did not say it failed: training was over
            return False
        if self.fail_t is not None and self.fail_t >= self.max_step_t:
            return True
        return not self.bye_ranks or not self.hello_ranks <= self.bye_ranks

    def failed_at(self, limit: float) -> float:
        """When it failed: the first rank seen gone or the first bye after its last step, else
        its last record; never after `limit` (the next launch's start)."""
        cands = [x for x in (self.first_bye_t, self.first_gone_t) if x is not None]
        return min(min(cands) if cands else self.last_t, limit)

    def booked_saves(self) -> list[tuple[float, float]]:
        """(duration, end) of each save as booked on the timeline: the slowest rank's duration,
        from no earlier than the edge before it (the step it followed, as the last rank ended
        it: the slowest rank's save began while another still did that step or its eval)."""
        return [(min(d, max(0.0, t - e)) if e else d, t) for d, t, e, _ in self.saves.values()]

    def saves_within(self, a: float, b: float) -> float:
        """The part of its saves (each [its end - its duration, its end]) within [a, b]."""
        return sum(max(0.0, min(t, b) - max(t - d, a)) for d, t in self.booked_saves()) if b > a else 0.0

    def add_step(self, step: int, t: float, parts: tuple) -> None:
        if self.first_bye_t is not None and t > self.first_bye_t:
            self.first_bye_t = None               # a bye, then steps: another process left, the run went on
        if self.first_gone_t is not None and t > self.first_gone_t:
            self.first_gone_t = None
        old = self.recent.get(step)
        total = self.total
        parts = self.judge(parts, old is None)
        if old is not None:                      # the same step again: the last one counts
            self.total = total = _add(total, old, -1.0)
        else:
            if self.pending and (self.hi is None or step > self.hi):
                for s in [s for s in self.pending if s < step]:
                    self.snaps[s] = total        # the sums over the steps up to the save
                    self.pending.discard(s)
            self.num_steps += 1
            self.order.append(step)
            if len(self.order) > self.recent_max:
                self.recent.pop(self.order.popleft(), None)
        self.recent[step] = parts
        self.total = _add(total, parts)
        if self.lo is None or step < self.lo:
            self.lo, self.first_began = step, t - parts[_ST]
        if self.hi is None or step >= self.hi:
            self.hi, self.hi_t = step, t
        self.max_step_t = max(self.max_step_t, t)
        self.edge = max(self.edge, t)

    def add_save(self, step: int, t: float, dur: float) -> None:
        cur = self.saves.setdefault(step, [0.0, 0.0, self.edge, self.client_s])
        cur[0], cur[1] = max(cur[0], dur), max(cur[1], t)
        self.edge = max(self.edge, t)
        if step in self.snaps or step in self.pending:
            return
        if self.hi is None or step >= self.hi:
            self.pending.add(step)
        elif self.order and step >= self.order[0] - 1:
            self.snaps[step] = _add(self.total, self.after(step), -1.0)

    def after(self, step: int) -> tuple:
        """Σ parts over the recent steps after `step`."""
        out = _ZERO
        for s in self.order:
            if s > step:
                out = _add(out, self.recent[s])
        return out

    def client_kept(self, resumed: int | None) -> float:
        """Its client time (telemetry/client_s) in the steps it kept: up to the save the next
        launch resumed from (what it had sent by then), the steps after being redone, log calls
        and all; all of it where it had no such save."""
        at = self.saves.get(resumed) if resumed is not None and self.hi is not None and resumed < self.hi else None
        return min(self.client_s, at[3]) if at is not None else self.client_s

    def settled_part(self) -> "_Launch":
        """Itself as far as a later record can no longer re-book it (Ledger.settled): to its last
        checkpoint save (its steps up to it, its start-up, restore and saves then; a failure
        would redo the steps after it), ending when that save did, as a launch that finished.
        Without a save, to its first step's start."""
        usable = [s for s in self.saves if (s in self.snaps or s in self.pending) and self.lo is not None
                  and s >= self.lo]
        part = replace(self, ended=True, fail_t=None, first_bye_t=None, first_gone_t=None, recent={},
                       order=deque(), snaps={}, pending=set(), provisional={}, spike=None)
        if not usable:
            part.total, part.client_s, part.saves = _ZERO, 0.0, {}
            part.hi, part.num_steps = self.lo, 1
            part.hi_t = part.max_step_t = part.last_t = part.own_t = part.edge = self.first_began
            return part
        s = max(usable)
        dur, t, edge, client = self.saves[s]
        part.total = self.snaps[s] if s in self.snaps else self.total
        part.hi = min(s, self.hi)
        part.num_steps = min(self.num_steps, part.hi - self.lo + 1)
        part.saves = {k: v for k, v in self.saves.items() if k <= s}
        part.client_s = min(self.client_s, client)
        part.hi_t = part.max_step_t = part.last_t = part.own_t = part.edge = t
        return part

    def redone(self, resumed: int) -> tuple[tuple, bool]:
        """Σ parts over the steps after `resumed` (the checkpoint the next launch restored),
        and whether that is an estimate (module docstring)."""
        if self.hi is None or resumed >= self.hi:
            return _ZERO, False
        if resumed < self.lo:
            return self.total, False
        if resumed in self.snaps:
            return _add(self.total, self.snaps[resumed], -1.0), False
        if self.order and resumed >= self.order[0] - 1:
            return self.after(resumed), False
        older = [s for s in self.snaps if s < resumed]
        if older:
            return _add(self.total, self.snaps[max(older)], -1.0), True
        return self.total, True


class Ledger:
    """The goodput ledger of one job, fed its records in order (module docstring); with the
    daemon's per-rank records in the stream, one more per rank (RankBooks)."""

    def __init__(self, recent: int | None = None, per_rank: bool = True) -> None:
        """recent: the steps each launch keeps one by one (RECENT); per_rank: keep RankBooks."""
        self.launches: list[_Launch] = []
        self.num_records = 0
        self._recent = recent
        self.ranks: RankBooks | None = RankBooks() if per_rank else None
        self.exclusions: list[list[float]] = []      # [start, end] windows (end inf while open)
        self._excl_open: list[float] | None = None   # the window a begin opened and no end closed
        self.num_exclusions_not_kept = 0
        self._pending = self.ranks.pending if self.ranks is not None else None   # the same dict

    def feed_all(self, records: Iterable[dict]) -> "Ledger":
        for rec in records:
            self.feed(rec)
        return self

    def own_step(self, step: int, t: float, parts: tuple | None, client_s: float | None) -> None:
        """What feed() does with an aggregated step record, given its parts (step_parts; None
        without a step time) and telemetry/client_s: RankBooks' path for a rank's own step,
        without a record to build. A rank that times nothing gets its records' times (_parts)."""
        self.num_records += 1
        if not self.launches:
            return
        cur = self.launches[-1]
        if parts is None and cur.derived is not False:
            parts = self._parts(cur, step, t, {})
        elif parts is not None and cur.derived is None:
            cur.derived = False
        if t > cur.last_t:
            cur.last_t = t
        if t > cur.own_t:
            cur.own_t = t
        if parts is not None:
            cur.add_step(step, t, parts)
        if client_s is not None and client_s > cur.client_s:
            cur.client_s = client_s

    @staticmethod
    def _parts(cur: _Launch, step: int, t: float, values: dict) -> tuple | None:
        """A step's parts (step_parts), a new step's within the time since the launch's edge; in
        a launch whose first step had no perf/step_time (a script that times nothing), that time
        is its step time: the first step's 0 (its work is in start-up, which ends when its record
        came), a step logged again adds the time since."""
        if cur.derived is None:
            cur.derived = "perf/step_time" not in values
        new = cur.hi is None or step > cur.hi
        room = t - cur.edge if new and cur.edge else None
        if not cur.derived or "perf/step_time" in values:
            return step_parts(values, room)
        if cur.hi is None:
            return step_parts(values, 0.0)
        if step == cur.hi and t > cur.edge and step in cur.recent:
            old, more = cur.recent[step], t - cur.edge
            return (old[_ST] + more, old[_PROD] + more) + tuple(old[_DATA:])
        return step_parts(values, room)

    def feed(self, rec: dict) -> None:
        self.num_records += 1
        if not isinstance(rec, (OutputRecord, dict)):    # (a dict: a record outside the declaration)
            return
        kind = rec.get("kind")
        t = _num(rec.get("t"))
        if t is None:
            return
        launches = self.launches
        if kind == "metrics" and launches:       # the common case first: a step
            cur = launches[-1]
            if t > cur.last_t:
                cur.last_t = t
            if t > cur.own_t:
                cur.own_t = t
            step, values = rec.get("step"), rec.get("values")
            if type(step) is not int or type(values) is not dict:
                return
            if "rank" not in rec:
                parts = self._parts(cur, step, t, values)
                if parts is not None:
                    if parts[_STRAG] > 0.0 or cur.spike is not None:
                        parts = cur.sift_straggler(step, parts, values, cur.hi is None or step > cur.hi)
                    cur.add_step(step, t, parts)
                own = values.get(CLIENT_TIME_KEY)
                if own is not None:
                    own = _num(own)
                    if own is not None and own > cur.client_s:
                        cur.client_s = own
                if self._pending:                # per-rank records wait for their step
                    self.ranks.step_closed(step, values)
            elif self.ranks is not None and not rec.get("late"):
                self.ranks.rank_step(rec.get("rank"), step, t, values)
            return
        if self.ranks is not None and kind in ("hello", "event", "bye"):
            self.ranks.other(rec)
        if kind == "hello":
            info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
            started = _num(info.get("started_at"))
            if started is None:
                return
            cur = launches[-1] if launches else None
            if cur is None or (cur.num_steps and started > cur.max_step_t):
                cur = _Launch(started_at=started, last_t=t, own_t=t) if self._recent is None else \
                    _Launch(started_at=started, last_t=t, own_t=t, recent_max=self._recent)
                launches.append(cur)
            else:
                cur.started_at = min(cur.started_at, started)
            if type(rec.get("rank")) is int:
                cur.hello_ranks.add(rec["rank"])
            return
        if kind == "event" and str(rec.get("name")).startswith(EXCLUDE):
            self._exclusion(rec, t)
            if rec.get("name") == EXCLUDE:
                return            # the daemon's word, not a rank's: it keeps no launch alive
        if not launches:
            return
        if kind == "bye" and isinstance(rec.get("stats"), dict) and "forwarded_by" in rec["stats"]:
            return        # a node daemon's (a group head's) link to this head ended: not a rank's bye
        cur = launches[-1]
        name = rec.get("name") if kind == "event" else None
        if kind in ("metrics", "bye") or (kind == "event" and not str(name).startswith(DAEMON_EVENTS)):
            cur.last_t = max(cur.last_t, t)     # the ranks' own records: the launch was alive then
            cur.own_t = max(cur.own_t, t)
        elif name == "diagnosis/rank_exited":
            # The daemon saw a rank's process gone without a bye (killed, crashed): the launch
            # failed when it was first seen gone, gone_for_s before the event.
            data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
            gone = t - max(0.0, _num(data.get("gone_for_s")) or 0.0)
            cur.last_t = max(cur.last_t, gone)
            cur.own_t = max(cur.own_t, gone)
            cur.fail_t = max(cur.fail_t or t, t)
            if gone >= cur.max_step_t and (cur.first_gone_t is None or gone < cur.first_gone_t):
                cur.first_gone_t = gone
        elif name == "diagnosis/hang":
            # No step since, its ranks still there (the daemon says a hang only of live ranks):
            # the launch lasted at least this long, and unless a step comes, it failed. Not past
            # the ranks' byes, though: a hang decided as the last of them was on its way (the
            # ranks left, or were torn down, just then) comes after them; _bye undoes one that
            # came before the last of them.
            if not cur.all_left():
                cur.last_t = max(cur.last_t, t)
            cur.fail_t = max(cur.fail_t or t, t)
        if kind == "event":
            data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
            step, dur = data.get("step"), _num(data.get("duration_s"))
            step = step if is_int(step) else None
            if name == "checkpoint_saved" and step is not None and dur is not None:
                cur.add_save(step, t, dur)
            elif name == "checkpoint_restored" and dur is not None:
                cur.edge = max(cur.edge, t)
                cur.restore_s = max(cur.restore_s, dur)
                cur.restored_step = step if step is not None else cur.restored_step
            elif name == "train_end":
                # It may say how it ended (status, exit_code: a W&B run's, the trainer's on an
                # exception): a failed one is no clean end.
                if data.get("status") == "failed" or (is_int(data.get("exit_code")) and data["exit_code"] != 0):
                    cur.fail_t = max(cur.fail_t or t, t)
                else:
                    cur.ended = True
            elif name == "script_exit" and is_int(data.get("exit_code")) and data["exit_code"] != 0:
                # The launcher's word (telemetry run's drain): the script failed, and its launch
                # lasted until then. A launcher that tore its hung ranks down (torchrun's SIGTERM,
                # then SIGKILL) leaves no bye, and no rank_exited where the drain came within
                # the daemon's exit grace: without this the launch ended at its diagnosis/hang,
                # and the hang after it was nobody's (the last launch's) or recovery (a resumed one's).
                # Its end: when the script exited (exited_at, the launcher's clock), where the
                # drain request said it; never after the event (the drain, its latency later).
                end = _script_end(data, t)
                cur.fail_t = max(cur.fail_t or end, end)
                if not cur.ended:
                    cur.last_t = max(cur.last_t, end)
                    cur.own_t = max(cur.own_t, end)
            elif name == "emergency_checkpoint":          # the trainer's, on an exception or a signal
                cur.fail_t = max(cur.fail_t or t, t)
            elif name == "rank_bye":                      # a rank's bye, as a node forwards it
                self._bye(cur, rec.get("rank"), t)
        elif kind == "bye":
            self._bye(cur, rec.get("rank"), t)

    def settled(self) -> dict[str, float]:
        """The settled ledger: the part of result()'s buckets no later record can re-book,
        `bucket -> seconds` and wall_s (what the daemon exports as cumulative counters, which
        never go down; module docstring, `settled`). {} before the first step."""
        launches = self.launches
        last = next((i for i in range(len(launches) - 1, -1, -1) if launches[i].num_steps), None)
        if last is None:
            return {}
        la = launches[last]
        view = Ledger(per_rank=False)
        view.launches = launches[:last] + [la if la.ended else la.settled_part()]
        view.exclusions = self.exclusions
        led = view.result()
        return {**led["buckets_s"], "wall": led["wall_s"]}

    def exclusion(self, rec: dict) -> None:
        """A planned-maintenance event of the job's that is not this ledger's own (RankBooks: a
        rank's book takes the job's windows, another rank's record keeping its launch alive no
        longer than it was)."""
        t = _num(rec.get("t"))
        if t is not None:
            self._exclusion(rec, t)

    def _exclusion(self, rec: dict, t: float) -> None:
        """A planned-maintenance window's begin, end, or the whole of it (module docstring,
        `excluded`). Ranks that each say begin and end: the first begin opens it, the first end
        after closes it."""
        name = rec.get("name")
        if name == EXCLUDE_END:
            if self._excl_open is not None:
                self._excl_open[1] = max(t, self._excl_open[0])
                self._excl_open = None
            return
        if name == EXCLUDE_BEGIN:
            if self._excl_open is not None:
                return
            window = [t, float("inf")]
        elif name == EXCLUDE:
            data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
            a, b = _num(data.get("start")), _num(data.get("end"))
            if a is None or b is None or not b > a:
                return
            window = [a, b]
        else:
            return
        if len(self.exclusions) >= MAX_EXCLUSIONS:
            self.num_exclusions_not_kept += 1
            return
        self.exclusions.append(window)
        if name == EXCLUDE_BEGIN:
            self._excl_open = window

    def _excluded_within(self, a: float, b: float) -> float:
        """How much of [a, b] the exclusion windows cover (each second once)."""
        if b <= a or not self.exclusions:
            return 0.0
        out, reach = 0.0, a
        for x, y in sorted(self.exclusions):
            lo, hi = max(x, reach), min(y, b)
            if hi > lo:
                out += hi - lo
                reach = hi
        return out

    @staticmethod
    def _bye(cur: _Launch, rank: Any, t: float) -> None:
        """A rank closed its client: it left, it was not killed mid-step; after the launch's last
        step, the first one is when a failed launch failed (a rank that raised, or its peers'
        error)."""
        if is_int(rank):
            cur.bye_ranks.add(rank)
            if cur.last_t > cur.own_t and cur.all_left():
                cur.last_t = cur.own_t          # a diagnosis/hang's reach past the last bye
        if t >= cur.max_step_t and (cur.first_bye_t is None or t < cur.first_bye_t):
            cur.first_bye_t = t

    def result(self) -> dict[str, Any]:
        """The ledger so far: seconds per bucket, wall, goodput, and what was counted."""
        launches = self.launches
        buckets = dict.fromkeys(BUCKETS, 0.0)
        out: dict[str, Any] = {"records": self.num_records, "launches": len(launches), "steps": 0,
                               "steps_missing": 0}
        if not any(la.num_steps for la in launches):
            out.update(wall_s=0.0, goodput=None, buckets_s=buckets, note="no step records")
            return out
        estimated = False
        prev, prev_end = None, 0.0          # the last launch with steps before this one, and its end
        for i, la in enumerate(launches):
            nxt = launches[i + 1] if i + 1 < len(launches) else None
            redone, resumed = _ZERO, None
            if nxt is not None and la.num_steps:
                # Resumed from the checkpoint it restored; without a restore event, from just
                # before its first step (0 when it started over, the step before when it went on).
                resumed = nxt.restored_step if nxt.restored_step is not None else \
                    (nxt.lo - 1 if nxt.lo is not None else 0)
                redone, est = la.redone(resumed)
                estimated |= est
            kept = _add(la.total, redone, -1.0)
            buckets["redone"] += redone[_ST]
            own = min(la.client_kept(resumed) if redone != _ZERO else la.client_s, max(0.0, kept[_PROD]))
            buckets["telemetry"] += own
            buckets["productive"] += kept[_PROD] - own
            buckets["data_loading"] += kept[_DATA]
            buckets["straggler"] += kept[_STRAG]
            buckets["slow_steps"] += kept[_SLOW]
            buckets["eval"] += kept[_EVAL]
            out["steps"] += la.num_steps
            buckets["checkpoint_save"] += sum(d for d, _ in la.booked_saves())
            buckets["checkpoint_restore"] += la.restore_s
            if not la.num_steps:
                continue
            out["steps_missing"] += (la.hi - la.lo + 1) - la.num_steps
            if prev is None:
                gap = max(0.0, la.first_began - launches[0].started_at - la.restore_s)
                ex = min(gap, self._excluded_within(launches[0].started_at, la.first_began))
                buckets["startup"] += gap - ex
            else:       # the last launch with steps ended (prev_end) -> this one's first step began
                gap = max(0.0, la.first_began - prev_end - la.restore_s - prev.saves_within(prev_end, la.first_began))
                ex = min(gap, self._excluded_within(prev_end, la.first_began))
                buckets["recovery"] += gap - ex
            buckets["excluded"] += ex
            # Where it ends: a launch after it begins, at the latest, when that one's first
            # process started; a failed one, when it failed (the time after, to the next
            # launch's first step, is recovery), the last one at its last record.
            nxt_start = next((x.started_at for x in launches[i + 1:]), None)
            limit = nxt_start if nxt_start is not None else la.last_t
            prev_end = min(la.last_t, limit)
            if la.failed():
                if nxt_start is not None:
                    prev_end = la.failed_at(limit)
                gap = max(0.0, prev_end - la.hi_t - la.saves_within(la.hi_t, prev_end))
                ex = min(gap, self._excluded_within(la.hi_t, prev_end))
                buckets["hang"] += gap - ex
                buckets["excluded"] += ex
            prev = la
        wall = launches[-1].last_t - launches[0].started_at
        buckets["unexplained"] = wall - sum(v for k, v in buckets.items() if k != "unexplained")
        counted = wall - buckets["excluded"]
        out.update(wall_s=wall, goodput=buckets["productive"] / counted if counted > 0 else None, buckets_s=buckets)
        if self.num_exclusions_not_kept:
            out["exclusions_not_kept"] = self.num_exclusions_not_kept
        if estimated:
            out["redone_estimated"] = True
        ranks = self.ranks
        if ranks is not None and (ranks.books or ranks.prior):
            out["ranks"] = ranks.result()
            # Said, never lost in silence: ranks past MAX_RANK_BOOKS, per-rank steps whose
            # aggregated record never came (held for PENDING_STEPS steps).
            if ranks.num_ranks_not_kept:
                out["rank_records_not_kept"] = ranks.num_ranks_not_kept
            if ranks.num_steps_unmatched:
                out["rank_steps_unmatched"] = ranks.num_steps_unmatched
        return out


# Per rank: how many steps' per-rank records wait for their aggregated record (the daemon writes
# a step's per-rank records as they come, the step once all ranks have it), the most ranks kept,
# and the steps each rank's ledger keeps one by one (RECENT for the job's).
PENDING_STEPS = 64
# ... where the daemon hands the goodput stage a whole ingest batch of per-rank records before the
# batch's steps (goodput_stage.py): ~0.1 KB each held, 8 ranks x 4,096 steps ~ 3 MB.
BATCH_PENDING_STEPS = 4096
EARLY_EVENTS = 16       # a rank's events kept until its first step (its restore among them)
MAX_RANK_BOOKS = 256
RANK_RECENT = 64


class RankBooks:
    """A ledger per rank, from the daemon's per-rank records (`--per-rank`): the rank's own step
    time, data loading, eval and client time, its own hello, events and bye; as straggler time,
    what it waited for another rank (the step's perf/straggler_excess_s when the step's
    straggler is another rank; the straggler itself waited for nobody: its own slowness is in
    its compute or its data loading). Each rank's wall time runs from its own process start to
    its last record; goodput = its productive / its wall."""

    def __init__(self, max_pending: int = PENDING_STEPS) -> None:
        self.books: dict[int, Ledger] = {}
        # step -> rank -> (t, step time, data loading, eval, client time): its figures, until the
        # step's aggregated record comes (at most max_pending steps held; beyond, counted)
        self.pending: dict[int, dict[int, tuple]] = {}
        self.max_pending = max_pending
        self._hellos: dict[int, dict] = {}      # rank -> its last hello, until its book exists
        self._early: dict[int, list[dict]] = {}  # rank -> its events before then (a restore), in order
        # Set by begin_partial: the books begin now, not with the run (see there); rank -> when
        # its book began; ranks whose book began with a step of a launch already running.
        self.partial = False
        self.partial_from = 0.0
        self.since: dict[int, float] = {}
        self._continued: set[int] = set()
        # rank -> its ledger as a daemon before this one left it (RANKS_FILE), joined to its book
        self.prior: dict[int, dict] = {}
        self.num_steps_unmatched = 0            # per-rank steps whose aggregated record never came
        # The job's planned-maintenance events (other()), for the books begun later; at most
        # MAX_EXCLUSIONS, as the job's ledger keeps (it counts those beyond: exclusions_not_kept).
        self._exclusions: list[dict] = []
        self.num_ranks_not_kept = 0             # per-rank step records of ranks past MAX_RANK_BOOKS

    def begin_partial(self, t: float) -> None:
        """The run's earlier per-rank records are nowhere (a daemon that does not write them,
        restarted at t on a run that had steps): each rank's book begins at the process start of
        its next launch, or else (a process already running then: its earlier steps are not
        here) at its first step's start from now, and says since when (`since` in its result)
        unless it continues a prior ledger (`prior`, whose end takes t's place for that rank)."""
        self.partial = True
        self.partial_from = t
        self._hellos.clear()
        self._early.clear()

    def _book(self, rank: int, t: float = 0.0, step_s: float = 0.0) -> Ledger | None:
        book = self.books.get(rank)
        if book is None:
            if len(self.books) >= MAX_RANK_BOOKS:
                self.num_ranks_not_kept += 1
                return None
            book = self.books[rank] = Ledger(recent=RANK_RECENT, per_rank=False)
            hello = self._hellos.pop(rank, None)
            if self.partial:
                started = _num(hello["info"].get("started_at")) if hello is not None else None
                before = self.prior[rank]["until"] if rank in self.prior else self.partial_from
                if started is None or started < before:     # begins with this step (begin_partial)
                    hello = {"kind": "hello", "t": t, "rank": rank, "info": {"started_at": t - step_s}}
                    self._continued.add(rank)
            if hello is not None:
                book.feed(hello)
                if self.partial:
                    self.since[rank] = _num(hello["info"].get("started_at")) or t
            for rec in self._early.pop(rank, ()):
                book.feed(rec)
            for rec in self._exclusions:
                book.exclusion(rec)
        return book

    def rank_step(self, rank: Any, step: int, t: float, values: dict) -> None:
        """A rank's own step record: held until its step's aggregated record (step_closed)."""
        if type(rank) is not int:
            return
        pending = self.pending
        at = pending.get(step)
        if at is None:
            if len(pending) >= self.max_pending:     # the longest held (steps come in order)
                self.num_steps_unmatched += len(pending.pop(next(iter(pending))))
            at = pending[step] = {}
        get = values.get      # what its ledger needs of it, not the record (held in bulk while steps close)
        at[rank] = (t, _num(get("perf/step_time")), _num(get("perf/data_loading_time")),
                    _num(get("perf/eval_time")), _num(get(CLIENT_TIME_KEY)))

    def step_closed(self, step: int, values: dict) -> None:
        at = self.pending.pop(step, None)
        if not at:
            return
        slow = _num(values.get("perf/straggler_rank"))
        excess = _num(values.get("perf/straggler_excess_s")) or 0.0
        if excess < 0.0:
            excess = 0.0
        for rank, (t, st, data, eval_s, client_s) in at.items():
            book = self._book(rank, t, st or 0.0)
            if book is None:
                continue
            parts = None
            if st is not None:       # step_parts of the rank's own figures, the wait for another rank its straggler
                data = min(st, data or 0.0)
                strag = min(st - data, excess) if excess and slow is not None and slow != rank else 0.0
                parts = (st, st - data - strag, data, strag, eval_s or 0.0, 0.0)
            book.own_step(step, t, parts, client_s)

    def other(self, rec: dict) -> None:
        """A hello, event or bye: to the ledger of the rank it is of (a rank_exited event is of
        the rank that exited); a planned-maintenance window's events (EXCLUDE_*: the daemon's,
        of no rank, or a rank's client's) to every rank's, a book begun later too: the window is
        the job's; the script's exit (script_exit, of no rank) to the books of the ranks of
        whose end nothing else says."""
        rank = rec.get("rank")
        if rec.get("kind") == "event" and str(rec.get("name")).startswith(EXCLUDE):
            if len(self._exclusions) < MAX_EXCLUSIONS:     # (those beyond: the job's exclusions_not_kept)
                self._exclusions.append(rec)
            for r, book in self.books.items():
                if r == rank:
                    book.feed(rec)          # its own event: the rank was alive then
                else:
                    book.exclusion(rec)
            return
        if rec.get("kind") == "event" and rec.get("name") == "script_exit":
            # The launcher's word that the script ended (of no rank): a rank whose launch has no
            # word of its end (no bye, not seen gone) lasted until then, as the job's launch did;
            # one that ended before (its bye after its peer's error) ended in a launch that failed.
            data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
            t, code = _num(rec.get("t")), data.get("exit_code")
            t = _script_end(data, t) if t is not None else None
            for r, book in self.books.items():
                la = book.launches[-1] if book.launches else None
                if la is None or t is None:
                    continue
                if r not in la.bye_ranks and la.first_gone_t is None:
                    book.feed(rec)
                elif is_int(code) and code != 0 and not la.ended:
                    la.fail_t = max(la.fail_t or t, t)
            return
        if type(rank) is not int:
            return
        book = self.books.get(rank)
        if book is not None:
            book.feed(rec)
        elif rec.get("kind") == "hello":
            if rank in self._hellos or len(self._hellos) < MAX_RANK_BOOKS:
                self._hellos[rank] = rec
                self._early.pop(rank, None)         # a new process: the events before were another's
        elif rec.get("kind") == "event" and (rank in self._early or len(self._early) < MAX_RANK_BOOKS):
            early = self._early.setdefault(rank, [])
            if len(early) < EARLY_EVENTS:           # a restore comes first; more are not counted on
                early.append(rec)

    def result(self) -> dict[int, dict[str, Any]]:
        """rank -> its ledger: goodput, wall_s, steps, launches, buckets_s, until (its last
        record's t), since (when it began, where not with the run), joined to its prior one."""
        out = {}
        for rank in sorted(set(self.books) | set(self.prior)):
            book, cur = self.books.get(rank), None
            led = book.result() if book is not None else {}
            if led.get("wall_s"):
                cur = {k: led[k] for k in ("goodput", "wall_s", "steps", "launches", "buckets_s")}
                cur["until"] = book.launches[-1].last_t
                if rank in self.since and not self.prior.get(rank):
                    cur["since"] = self.since[rank]
            joined = join_rank(self.prior[rank], cur, rank in self._continued) if self.prior.get(rank) else cur
            if joined is not None:
                out[rank] = joined
        return out


def join_rank(prior: dict, cur: dict | None, continues: bool) -> dict:
    """A rank's ledger as an earlier daemon left it (RANKS_FILE), then its book since this daemon
    began: buckets and steps add up; the time between the two (the earlier daemon's last write to
    this one's first step of the rank: steps no ledger saw) is unexplained; a book that began with
    a step of the launch the prior one ended in (continues) is not another launch."""
    if cur is None:
        return prior
    gap = max(0.0, (cur["until"] - cur["wall_s"]) - prior["until"])
    buckets = {k: prior["buckets_s"].get(k, 0.0) + cur["buckets_s"].get(k, 0.0) for k in BUCKETS}
    if continues or not prior["launches"]:
        buckets["unexplained"] += gap
    else:
        # A launch after the prior one's: the time between and its start-up are the restart's,
        # recovery, as in the job's ledger.
        buckets["recovery"] += gap + cur["buckets_s"].get("startup", 0.0)
        buckets["startup"] -= cur["buckets_s"].get("startup", 0.0)
    wall = prior["wall_s"] + gap + cur["wall_s"]
    counted = wall - buckets["excluded"]
    out = {"goodput": buckets["productive"] / counted if counted > 0 else None, "wall_s": wall,
           "steps": prior["steps"] + cur["steps"],
           "launches": prior["launches"] + cur["launches"] - (1 if continues and prior["launches"] else 0),
           "buckets_s": buckets, "until": max(prior["until"], cur["until"])}
    if "since" in prior:
        out["since"] = prior["since"]
    return out


# Where a daemon that does not write per-rank records keeps the per-rank ledgers, beside
# metrics.jsonl (goodput_stage.py): what `telemetry goodput` shows of them, and what a daemon
# restarted on the run continues. At most this many bytes are read of it.
RANKS_FILE = "goodput_ranks.json"
RANKS_FILE_MAX_BYTES = 16 << 20


# Per-rank records the per-rank ledgers did not count (said with them, never lost in silence).
RANK_COUNTERS = ("rank_records_dropped", "rank_records_not_kept", "rank_steps_unmatched")


def ranks_file_data(ranks: dict[int, dict], t: float, counters: dict[str, int] | None = None) -> bytes:
    import json

    doc = {"t": t, "ranks": {str(r): v for r, v in ranks.items()}, **(counters or {})}
    return (json.dumps(doc, indent=1) + "\n").encode()


def rank_counters(led: dict[str, Any]) -> dict[str, int]:
    """The RANK_COUNTERS of a ledger's result that are not zero."""
    return {k: led[k] for k in RANK_COUNTERS if led.get(k)}


def read_ranks_file(path) -> tuple[dict[int, dict] | None, str]:
    """The per-rank ledgers in a RANKS_FILE: (rank -> ledger, "") or (None, why not). Only
    well-formed entries: numbers where numbers go, every bucket."""
    doc, why = _read_ranks_doc(path)
    return _ranks_of(doc, path) if doc is not None else (None, why)


def _ranks_of(doc: dict, path) -> tuple[dict[int, dict] | None, str]:
    """The well-formed per-rank ledgers of a RANKS_FILE's document (read_ranks_file)."""
    try:
        out = {}
        for r, v in doc["ranks"].items():
            b = v["buckets_s"]
            entry = {"wall_s": float(v["wall_s"]), "steps": int(v["steps"]), "launches": int(v["launches"]),
                     "until": float(v["until"]),
                     "buckets_s": {k: float(b[k] if k not in NEWER_BUCKETS else b.get(k, 0.0)) for k in BUCKETS}}
            counted = entry["wall_s"] - entry["buckets_s"]["excluded"]
            entry["goodput"] = entry["buckets_s"]["productive"] / counted if counted > 0 else None
            if v.get("since") is not None:
                entry["since"] = float(v["since"])
            out[int(r)] = entry
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:   # a 400-digit int
        return None, f"{path}: not a per-rank ledger file ({type(exc).__name__}: {exc})"
    return out, ""


def _read_ranks_doc(path) -> tuple[dict | None, str]:
    """A RANKS_FILE's JSON, read as a run file is (a regular file, at most RANKS_FILE_MAX_BYTES):
    (the document, "") or (None, why not; "" when there is none)."""
    import json

    from telemetry.shared import files

    try:
        f = files.open_regular(path)
    except FileNotFoundError:
        return None, ""
    except (OSError, files.NotRegularFile) as exc:
        return None, f"{path}: {exc}"
    with f:
        data = f.read(RANKS_FILE_MAX_BYTES + 1)
    if len(data) > RANKS_FILE_MAX_BYTES:
        return None, f"{path}: over {RANKS_FILE_MAX_BYTES} bytes"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:   # RecursionError: nested deeper than json's recursion limit
        return None, f"{path}: not a per-rank ledger file ({type(exc).__name__}: {exc})"
    if not isinstance(doc, dict):
        return None, f"{path}: not a per-rank ledger file (not a JSON object)"
    return doc, ""


def lowest_first(ranks: dict) -> list[tuple[Any, dict]]:
    """A result's per-rank ledgers (`ranks`) as (rank, its ledger), the lowest goodput first."""
    return sorted(ranks.items(), key=lambda kv: kv[1]["goodput"] if kv[1]["goodput"] is not None else 0.0)


def top_loss(values: dict) -> tuple[str, float] | None:
    """The biggest loss (bucket, seconds) of a daemon record's goodput/* values, or None."""
    best = None
    for k in BUCKETS[1:]:
        v = values.get(f"goodput/{k}_s")
        if isinstance(v, (int, float)) and v > 0 and (best is None or v > best[1]):
            best = (k, float(v))
    return best


def ledger(records: Iterable[dict]) -> dict[str, Any]:
    """The ledger of a run's records (module docstring)."""
    return Ledger().feed_all(records).result()


def with_ranks_file(led: dict[str, Any], log_dir) -> dict[str, Any]:
    """A run's ledger from its files, with the per-rank ledgers the daemon kept (RANKS_FILE)
    where the files hold no per-rank records; `ranks_from` says so, `ranks_file_problem` why a
    file there was not read."""
    from pathlib import Path

    if led.get("ranks") or not led.get("wall_s"):
        return led
    path = Path(log_dir) / RANKS_FILE
    doc, why = _read_ranks_doc(path)                  # read once: its ledgers and its counters
    ranks, why = _ranks_of(doc, path) if doc is not None else (None, why)
    if ranks:
        counters = {k: doc[k] for k in RANK_COUNTERS if is_int(doc.get(k))}
        led = {**led, "ranks": ranks, "ranks_from": RANKS_FILE, **counters}
    elif why:
        led = {**led, "ranks_file_problem": why}
    return led


def text(led: dict[str, Any], name: str = "") -> str:
    """The ledger as a table, the biggest loss first, with what to do about it."""
    wall = led.get("wall_s") or 0.0
    if not wall:
        return f"goodput{' of ' + name if name else ''}: nothing to account ({led.get('note', 'no steps')})"
    b = led["buckets_s"]
    excluded = b.get("excluded", 0.0)
    of = f"{wall - excluded:,.1f} s wall time ({excluded:,.1f} s excluded)" if excluded else f"{wall:,.1f} s wall time"
    lines = [f"goodput{' of ' + name if name else ''}: {100 * (led['goodput'] or 0.0):.1f} % of {of} "
             f"was training ({led['steps']:,} steps, {led['launches']} launch(es)"
             + (f", {led['steps_missing']:,} step(s) the daemon did not write" if led["steps_missing"] else "") + ")",
             f"  {'productive':<20} {b['productive']:>11,.2f} s  {100 * b['productive'] / wall:6.2f} %"]
    losses = sorted((k for k in BUCKETS if k not in ("productive", "excluded")), key=lambda k: -abs(b[k]))
    if excluded:        # planned maintenance: out of the wall time goodput counts, no loss
        lines.append(f"  {'excluded':<20} {excluded:>11,.2f} s  {100 * excluded / wall:6.2f} %  (planned maintenance)")
    for k in losses:
        lines.append(f"  {k:<20} {b[k]:>11,.2f} s  {100 * b[k] / wall:6.2f} %")
    top = losses[0]
    if b[top] > 0:
        lines.append(f"biggest loss: {ADVICE[top]}")
    ranks = led.get("ranks")
    if ranks:
        shown = lowest_first(ranks)
        lines.append(f"per rank (from its own process start to its last record; {len(ranks)} rank(s), "
                     f"the lowest goodput first{', 8 shown' if len(ranks) > 8 else ''}):")
        lost = rank_counters(led)
        if lost:
            lines.append("  (incomplete: " + ", ".join(f"{k} {v:,}" for k, v in lost.items())
                         + " — per-rank records the per-rank ledgers could not count)")
        for rank, rl in shown[:8]:
            rb = rl["buckets_s"]
            worst = max((k for k in BUCKETS if k not in ("productive", "excluded")), key=lambda k: rb[k])
            since = (f" (since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(rl['since']))} UTC: its records "
                     "before were not kept)" if isinstance(rl.get("since"), (int, float)) else "")
            lines.append(f"  rank {rank:<6} {100 * (rl['goodput'] or 0.0):6.2f} % of {rl['wall_s']:,.1f} s  "
                         f"waited for other ranks {rb['straggler']:,.2f} s, data loading {rb['data_loading']:,.2f} s, "
                         f"its biggest loss {worst.replace('_', ' ')} {rb[worst]:,.2f} s{since}")
    return "\n".join(lines)

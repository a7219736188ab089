"""The Diagnoser around the rules: registry, rate limit, logging, isolation; and DiagnosisConfig."""
from __future__ import annotations

import json
import logging

import pytest

from telemetry.daemon.diagnosis import RULES, Diagnoser, DiagnosisConfig, Finding, Rule
from telemetry.shared.config import ConfigError, build

T0 = 1_763_800_000.0


def nan_loss(step, t):
    return {"kind": "metrics", "t": t, "step": step, "values": {"train/loss": float("nan")}}


def test_registry_has_every_rule_of_the_issue():
    assert set(RULES) == {"data_bound", "launch_bound", "memory_leak", "allocator", "nonfinite", "loss_spike",
                          "throughput_drop", "straggler", "throttle", "host_memory", "rank_stopped"}
    assert all(issubclass(c, Rule) and c.kinds for c in RULES.values())


def test_event_record_shape_is_the_jsonl_contract(caplog):
    d = Diagnoser(DiagnosisConfig(log_events=True))
    with caplog.at_level(logging.WARNING, logger="telemetry.daemon.diagnosis"):
        [ev] = d.consume(nan_loss(7, T0))
    assert set(ev) == {"kind", "t", "rank", "name", "data"}
    assert ev["kind"] == "event" and ev["t"] == T0 and ev["rank"] is None and ev["name"] == "diagnosis/nonfinite"
    assert ev["data"]["rule"] == "nonfinite" and ev["data"]["num_suppressed"] == 0
    json.dumps(ev.to_dict(), allow_nan=False)  # no NaN leaks into the JSONL line
    [rec] = [r for r in caplog.records if r.name == "telemetry.daemon.diagnosis"]
    assert rec.levelno == logging.ERROR and rec.getMessage() == ev["data"]["message"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="telemetry.daemon.diagnosis"):
        assert Diagnoser(DiagnosisConfig()).consume(nan_loss(7, T0))  # default: the daemon logs, not us
    assert not [r for r in caplog.records if r.name == "telemetry.daemon.diagnosis"]


def test_rate_limit_per_rule_and_subject_counts_suppressed():
    d = Diagnoser(DiagnosisConfig(min_interval_s=60, log_events=False))
    first = d.consume(nan_loss(1, T0))
    during = [e for s in range(2, 6) for e in d.consume(nan_loss(s, T0 + s))]
    after = d.consume(nan_loss(99, T0 + 61))
    assert len(first) == 1 and during == [] and len(after) == 1
    assert after[0]["data"]["num_suppressed"] == 4
    # another subject (grad norm) of the same rule is not held back by the loss's limit
    gn = d.consume({"kind": "metrics", "t": T0 + 62, "step": 100, "values": {"train/grad_norm": float("inf")}})
    assert len(gn) == 1 and gn[0]["data"]["subject"] == "train/grad_norm"
    assert d.stats()["num_events"] == 3 and d.stats()["num_suppressed"] == 4


class Boom(Rule):
    name = "boom"
    kinds = frozenset({"metrics"})

    def consume(self, record):
        raise ZeroDivisionError("rule bug")

    def tick(self, now):
        raise ZeroDivisionError("rule bug")


class Always(Rule):
    name = "always"
    kinds = frozenset({"metrics"})

    def consume(self, record):
        return [Finding("x", "seen", record["t"])]


def test_a_failing_rule_is_isolated_and_logged_once(caplog):
    cfg = DiagnosisConfig(min_interval_s=1e-9, log_events=False)
    d = Diagnoser(cfg, rules=[Boom(cfg), Always(cfg)])
    with caplog.at_level(logging.ERROR, logger="telemetry.daemon.diagnosis"):
        evs = [e for i in range(3) for e in d.consume(nan_loss(i, T0 + i))]
        d.tick(T0 + 10)
    assert [e["name"] for e in evs] == ["diagnosis/always"] * 3
    assert d.stats()["num_rule_errors"] == {"boom": 4}
    assert sum("boom failed" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("record", [None, 3, {}, {"kind": "metrics"}, {"kind": "metrics", "values": "x"},
                                    {"kind": "gpu", "values": None}, {"kind": "hello", "rank": "zero"},
                                    {"kind": "metrics", "missing_ranks": "1,2", "values": {}}])
def test_malformed_records_are_ignored(record):
    d = Diagnoser(DiagnosisConfig(log_events=False))
    assert d.consume(record) == []
    assert d.stats()["num_rule_errors"] == {}


def test_disabled_rules_and_disabled_diagnosis():
    d = Diagnoser(DiagnosisConfig(disabled_rules=["nonfinite"]))
    assert "nonfinite" not in d.stats()["rules"] and d.consume(nan_loss(1, T0)) == []
    assert Diagnoser(DiagnosisConfig(enabled=False)).rules == []


@pytest.mark.parametrize("kw, fragment", [
    ({"min_interval_s": 0}, "min_interval_s"),
    ({"gpu_util_low_percent": 150}, "gpu_util_low_percent"),
    ({"data_loading_ratio_high": 1.5}, "data_loading_ratio_high"),
    ({"data_loading_ratio_low": 0.5, "data_loading_ratio_high": 0.4}, "data_loading_ratio_low"),
    ({"leak_window": 0}, "leak_window"),
    ({"leak_window": 2.5}, "leak_window"),
    ({"straggler_ratio": 0.9}, "straggler_ratio"),
    ({"disabled_rules": ["no_such_rule"]}, "no_such_rule"),
    ({"disabled_rules": "nonfinite"}, "disabled_rules"),
    ({"log_events": 1}, "log_events"),
    ({"rank_silence_s": float("inf")}, "rank_silence_s"),
])
def test_config_rejects_bad_values(kw, fragment):
    """The `diagnosis:` mapping of a daemon config, through the project's one loader."""
    with pytest.raises(ConfigError, match=fragment):
        build(DiagnosisConfig, kw, "diagnosis")


def test_config_from_a_mapping():
    c = build(DiagnosisConfig, {"min_interval_s": 30, "disabled_rules": ["throttle"]}, "diagnosis")
    assert c.min_interval_s == 30.0 and isinstance(c.min_interval_s, float) and c.disabled_rules == ("throttle",)
    with pytest.raises(ConfigError, match="'diagnosis.min_intervl_s'"):
        build(DiagnosisConfig, {"min_intervl_s": 1}, "diagnosis")


def test_real_host_poller_record_feeds_the_host_memory_rule():
    from telemetry.daemon.pollers import PollersConfig
    from telemetry.daemon.pollers.host import HostPoller

    [rec] = HostPoller(PollersConfig(host="h0")).poll_once()
    low = Diagnoser(DiagnosisConfig(host_memory_percent_high=0.01, log_events=False))
    high = Diagnoser(DiagnosisConfig(host_memory_percent_high=100.0, log_events=False))
    [ev] = low.consume(rec)
    assert ev["name"] == "diagnosis/host_memory" and ev["data"]["host"] == "h0"
    assert ev["data"]["memory_percent"] == rec["values"]["system/memory_percent"]
    assert high.consume(rec) == []
    json.dumps(ev.to_dict(), allow_nan=False)


def test_the_common_opening_filter_is_the_dispatchs_not_each_rules():
    """A rule states which metrics records it judges; the Diagnoser checks that once, before consume."""

    class Seen(Rule):
        name = "seen"
        kinds = frozenset({"metrics", "system"})
        aggregated_only = after_warmup = complete_only = True

        def __init__(self, cfg):
            super().__init__(cfg)
            self.steps = []

        def consume(self, record):
            self.steps.append((record["kind"], record.get("step")))
            return []

    rule = Seen(DiagnosisConfig(warmup_steps=5))
    d = Diagnoser(DiagnosisConfig(warmup_steps=5), rules=[rule])
    for rec in [{"kind": "metrics", "t": 1.0, "step": 4, "values": {}},                          # warm-up
                {"kind": "metrics", "t": 1.0, "step": 5, "rank": 2, "values": {}},               # one rank's
                {"kind": "metrics", "t": 1.0, "step": 6, "missing_ranks": [1], "values": {}},    # partial
                {"kind": "metrics", "t": 1.0, "step": 7, "values": {}},                          # judged
                {"kind": "system", "t": 1.0, "host": "h", "values": {}}]:                        # other kinds: all
        d.consume(rec)
    assert rule.steps == [("metrics", 7), ("system", None)]
    plain = Rule(DiagnosisConfig())
    assert plain.judges(False, False, False)   # by default a rule sees every metrics record

"""The metric catalogue (telemetry/shared/catalogue.py) is where a metric's rules come from: the
reduction tables are built from it, the metric table of docs/metrics.md is it, and a user's own declaration in
the daemon config reaches the aggregation and the downsampling like a built-in's."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import ConfigError, load
from telemetry.daemon.downsample import Downsampler
from telemetry.daemon.reductions import RANK_RULES, WINDOW_RULES, Reducer, parse
from telemetry.daemon.sinks.base import Out
from telemetry.shared import catalogue
from aggregator_util import finish_many

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_table_is_the_catalogue():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    m = re.search(r"<!-- catalogue:begin -->\n(.*?)<!-- catalogue:end -->", doc, re.S)
    assert m, "docs/metrics.md lost its catalogue markers"
    assert m.group(1) == catalogue.markdown_table(), \
        "docs/metrics.md's metric table differs from the catalogue: paste `telemetry metrics --markdown` between the markers"


def test_every_entry_is_a_valid_declaration_and_names_are_unique():
    names = [m.name for m in catalogue.CATALOGUE]
    assert len(names) == len(set(names))
    for m in catalogue.CATALOGUE:
        parse(m.across_ranks)
        parse(m.over_window)
        assert m.doc and m.group


def test_the_reduction_tables_are_built_from_it():
    assert RANK_RULES == catalogue.rules("across_ranks") and WINDOW_RULES == catalogue.rules("over_window")
    across, window = Reducer(RANK_RULES), Reducer(WINDOW_RULES)
    # A rate adds up across ranks and averages over a window; a count adds up in both.
    assert across.rule("perf/tokens_per_second") == parse("sum") and window.rule("perf/tokens_per_second") == parse("mean")
    assert across.rule("perf/tokens") == window.rule("perf/tokens") == parse("sum")
    assert across.rule("dataset/web/loss") == parse("weighted_mean:tokens")
    assert window.rule("train/epoch") == parse("last") and window.rule("memory/num_ooms") == parse("max")
    assert across.rule("an/unknown_name") == parse("mean")
    # A metric added to the catalogue is in the tables: nothing else to edit.
    more = catalogue.CATALOGUE + (catalogue.Metric("perf/new_rate", "x/s", "rate", "throughput", "new",
                                                   across_ranks="sum"),)
    assert catalogue.rules("across_ranks", more)["perf/new_rate"] == "sum"
    assert "perf/new_rate" not in catalogue.rules("over_window", more)
    assert "perf/new_rate" in catalogue.markdown_table(more)


def test_a_declared_metric_is_aggregated_and_downsampled_by_its_rules():
    cfg = load(None, {"metrics": {"my/tokens_per_second": {"unit": "tokens/s", "kind": "rate",
                                                           "across_ranks": "sum", "over_window": "mean"},
                                  "*/ppl": {"across_ranks": "max"}},
                      "aggregator.world_size": 2})
    agg = Aggregator(cfg.aggregator)
    recs = []
    for step in range(4):
        for rank in (0, 1):
            recs.append(type("R", (), {"rank": rank, "step": step, "t_ns": 0, "parts": 1,
                                       "values": {"my/tokens_per_second": 500.0, "val/web/ppl": 3.0 + rank}})())
    done, _ = agg.add_many(recs)
    rows = finish_many(agg, done)
    assert [r["values"]["my/tokens_per_second"] for r in rows] == [1000.0] * 4      # summed across the ranks
    assert [r["values"]["val/web/ppl"] for r in rows] == [4.0] * 4                 # the declared max
    ds = Downsampler(every_n_steps=4, overrides=cfg.aggregator.window_reductions)
    out = ds.feed([Out("metrics", r, b"") for r in rows])      # the aggregator's MetricsRecords
    assert [o.record["values"]["my/tokens_per_second"] for o in out] == [1000.0]    # averaged over the window


@pytest.mark.parametrize("metrics, words", [
    ({"my/x": {"across_ranks": "median"}}, "metrics['my/x'].across_ranks"),
    ({"my/x": {"colour": "red"}}, "unknown field(s) colour"),
    ({"my/x": {"kind": "histogram"}}, "kind 'histogram'"),
    ({"a/*/b": {}}, "a pattern is 'prefix*' or '*suffix'"),
])
def test_a_declaration_that_is_not_one_is_a_config_error_naming_it(metrics, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        load(None, {"metrics": metrics})


def test_a_built_in_name_declared_again_keeps_its_rules_but_the_fields_given():
    """Declaring perf/tokens_per_second to give it a W&B summary must not make a head average it:
    its reductions stay the catalogue's (sum across ranks), only wandb_summary is new."""
    cfg = load(None, {"metrics": {"perf/tokens_per_second": {"wandb_summary": "max"},
                                  "perf/mfu_percent": {"over_window": "max"}}})
    tps, mfu = cfg.declared_metrics()
    assert (tps.across_ranks, tps.over_window, tps.unit, tps.wandb_summary) == ("sum", "mean", "tokens/s", "max")
    assert cfg.aggregator.reductions["perf/tokens_per_second"] == "sum"
    assert mfu.over_window == "max" and mfu.across_ranks == catalogue.lookup("perf/mfu_percent").across_ranks
    assert catalogue.wandb_summaries(cfg.declared_metrics()) == [("perf/tokens_per_second", "max")]


def test_telemetry_metrics_lists_the_catalogue_and_a_configs_declarations(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "d.yaml"
    cfg.write_text("metrics:\n  my/tokens_per_second: {unit: tokens/s, kind: rate, across_ranks: sum}\n")
    out = subprocess.run([sys.executable, "-m", "telemetry", "metrics", "--config", str(cfg)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 + len(catalogue.CATALOGUE) + 1
    assert any(ln.startswith("my/tokens_per_second") and "sum" in ln and "(declared)" in ln for ln in lines)
    md = subprocess.run([sys.executable, "-m", "telemetry", "metrics", "--markdown"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
    assert md.returncode == 0 and md.stdout == catalogue.markdown_table()
    cfg.write_text("metrics:\n  my/x: {across_ranks: median}\n")
    bad = subprocess.run([sys.executable, "-m", "telemetry", "metrics", "--config", str(cfg)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "metrics['my/x'].across_ranks" in bad.stderr and "Traceback" not in bad.stderr


def test_what_the_daemon_polls_and_counts_is_in_it_and_not_reduced(monkeypatch, make_daemon):
    """Every name the pollers emit (NVML through the fake pynvml, the host's psutil with this process
    as a rank) and every counter in the daemon's own record has an entry (source poller or self),
    looked up without its rank<r> segment; none of them is in the reduction tables."""
    import os
    import sys

    from telemetry.daemon.pollers import PollersConfig
    from telemetry.daemon.pollers.host import HostPoller
    from telemetry.daemon.pollers.nvml import NvmlPoller
    from testkit.fake_nvml import make_fake_pynvml

    fake = make_fake_pynvml(num_gpus=1)
    fake.gpus[0].processes = [(os.getpid(), 10**9)]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    names = set()
    for poller in (NvmlPoller(PollersConfig()), HostPoller(PollersConfig(host_per_core=True))):
        poller.set_rank_pids({0: os.getpid()})
        for _ in range(2):                           # a rank's cpu_percent comes from the second poll
            for rec in poller.poll_once():
                names.update(rec["values"])
        poller.close()
    d = make_daemon(config={"daemon_record_interval_s": 0.2})
    recs = d.wait_for(lambda rs: any(r["kind"] == "daemon" for r in rs))
    daemon_names = set(next(r for r in recs if r["kind"] == "daemon")["values"])
    assert {"gpu/memory_used_gb", "gpu/rank0/memory_used_gb", "system/rank0/rss_gb", "system/cpu_percent_core0",
            "system/rank0/cpu_percent"} <= names and "telemetry/records_in" in daemon_names
    for name, source in [*((n, "poller") for n in names), *((n, "self") for n in daemon_names)]:
        m = catalogue.lookup(name)
        assert m is not None and m.source == source, (name, m)
    assert catalogue.lookup("gpu/rank3/memory_used_gb").name == "gpu/memory_used_gb"
    rules = {**catalogue.rules("across_ranks"), **catalogue.rules("over_window")}
    assert not [m.name for m in catalogue.CATALOGUE if m.source in ("poller", "self") and m.name in rules]
    table = catalogue.markdown_table()
    assert "| GPU | `gpu/xid_errors` | - | counter, cumulative | - | - | the daemon's pollers |" in table


def test_every_derived_metric_is_declared_and_every_declared_one_is_derived():
    """derived.py's DERIVATIONS write only catalogue names; every name the catalogue says the
    daemon derives is written by one of them."""
    from telemetry.daemon.derived import DERIVATIONS
    from telemetry.shared.catalogue import CATALOGUE, lookup

    written = [name for d in DERIVATIONS for name in d.outputs]
    assert len(written) == len(set(written)), written
    for name in written:
        assert lookup(name) is not None, name
    daemon_made = {m.name for m in CATALOGUE if m.source == "daemon"}
    assert daemon_made <= set(written), daemon_made - set(written)


ADDED = '''
from telemetry.shared import catalogue
from telemetry.shared.catalogue import Metric

catalogue.CATALOGUE += (Metric("perf/tokens_per_rank", "tokens", "gauge", "counts",
                               "the step's tokens per rank that reported it", across_ranks="sum",
                               over_window="sum", source="daemon"),)
from telemetry.daemon import derived


def tokens_per_rank(batch, values, d):
    for v, ranks in zip(values, batch.ranks):
        if isinstance(v.get("perf/tokens"), int):
            v["perf/tokens_per_rank"] = v["perf/tokens"] / len(ranks)


derived.DERIVATIONS += (derived.Derivation("tokens per rank", ("perf/tokens_per_rank",), tokens_per_rank),)
'''


def test_a_metric_added_in_its_two_places_reaches_the_records_the_rules_prometheus_and_the_table(tmp_path, monkeypatch):
    """docs/metrics.md, "Adding a metric": a Derivation in derived.py and an entry in the catalogue, and
    nothing else. A real daemon started with both added (as a code change would) writes it for
    every step; the rules a head and a downsampled sink apply, Prometheus's name and help, and the
    docs/metrics.md's table come from the entry."""
    import json
    import subprocess
    import sys

    from testkit.daemon_proc import DaemonProc, daemon_command
    from testkit.faults import Endpoints

    eps = Endpoints()
    log_dir = tmp_path / "telemetry"
    cmd = daemon_command(log_dir, eps.ingest, eps.pub, eps.control, world_size=2)
    code = ADDED + "\nimport runpy\nsys.argv = ['telemetry'] + sys.argv[1:]\nrunpy.run_module('telemetry', run_name='__main__')\n"
    proc = subprocess.Popen([sys.executable, "-c", "import sys\n" + code, *cmd[3:]], cwd=ROOT,
                            env={k: v for k, v in __import__("os").environ.items() if not k.startswith("TELEMETRY_")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    d = DaemonProc(proc, log_dir, None)
    try:
        d.wait_ready(180)
        from telemetry.client import TelemetryClient

        clients = [TelemetryClient(eps.ingest, rank=r) for r in (0, 1)]
        for step in range(1, 6):
            for r, c in enumerate(clients):
                c.log(step, {"perf/tokens": 100 * (r + 1) * step, "perf/step_time": 0.1})
        for c in clients:
            c.close()
        d.wait_for(lambda rs: sum(r["kind"] == "metrics" for r in rs) >= 5)
        assert d.drain()["steps_out"] == 5
        steps = [r for r in map(json.loads, (log_dir / "metrics.jsonl").read_text().splitlines())
                 if r["kind"] == "metrics"]
        assert [r["values"]["perf/tokens_per_rank"] for r in steps] == [300 * s / 2 for s in range(1, 6)]
    finally:
        d.cleanup()
    # In this process, the same two additions: what is built from the catalogue has it.
    ns: dict = {}
    exec(ADDED.replace("catalogue.CATALOGUE +=", "added = catalogue.CATALOGUE +").replace(
        "derived.DERIVATIONS +=", "more = derived.DERIVATIONS +"), ns)
    monkeypatch.setattr(catalogue, "CATALOGUE", ns["added"])
    assert catalogue.rules("across_ranks")["perf/tokens_per_rank"] == "sum"
    assert catalogue.rules("over_window")["perf/tokens_per_rank"] == "sum"
    from telemetry.consumers import prometheus

    name, _labels = prometheus.metric_name("perf/tokens_per_rank")
    assert name.startswith("telemetry_perf_tokens_per_rank")
    assert "the step's tokens per rank" in prometheus.typed(name, "perf/tokens_per_rank").help
    assert "| counts | `perf/tokens_per_rank` | tokens | gauge | sum | sum | the daemon |" in catalogue.markdown_table()


def test_the_daemon_record_and_status_say_the_same_of_every_counter_they_share(make_daemon):
    """The daemon's own counters that `telemetry status` has too (the catalogue's `status`
    path): its last `daemon` record, written at the drain, and drain.json (the final status)
    give each the same figure, under the same words (telemetry/records_lost and records_lost...); a
    client that dropped records, malformed frames, hellos, events and a bye make them nonzero."""
    import json

    from telemetry import TelemetryClient

    d = make_daemon(world_size=1)
    tm = TelemetryClient(endpoint=d.ingest, rank=0)
    for step in range(20):
        tm.log(step, {"train/loss": 1.0})
    tm.event("something", {"x": 1})
    tm.close()
    push = d.push()
    for _ in range(3):
        push.send(b"not a record")
    d.wait_for(lambda rs: sum(r["kind"] == "metrics" for r in rs) >= 20 and any(r["kind"] == "bye" for r in rs))
    d.wait_for(lambda rs: d.status()["records_malformed"] == 3)
    final = d.drain()
    last = [r for r in d.read_jsonl() if r["kind"] == "daemon"][-1]["values"]
    on_disk = json.loads((d.log_dir / "drain.json").read_text())
    twins = [m for m in catalogue.CATALOGUE if m.source == "self" and m.status]
    assert {m.name for m in twins} >= {"telemetry/records_lost", "telemetry/records_in",
                                      "telemetry/records_in_by_kind/hello", "telemetry/memory/records_shed"}
    for m in twins:
        v = on_disk
        for k in m.status.split("."):
            v = v[k]
        if m.name == "telemetry/uptime_s":           # a moment later
            assert 0 < last[m.name] <= v, (m.name, last[m.name], v)
        else:
            assert last[m.name] == v, (m.name, m.status, last[m.name], v)
    assert last["telemetry/records_malformed"] == 3 and last["telemetry/records_in_by_kind/hello"] == 1
    assert last["telemetry/records_in_by_kind/event"] >= 1 and last["telemetry/records_in_by_kind/bye"] == 1
    assert last["telemetry/steps_out"] == 20 and final["records_lost"] == last["telemetry/records_lost"]


def test_grouped_puts_the_runs_own_names_first_then_the_catalogues_groups_in_order():
    rows = catalogue.grouped(["perf/forward_time", "val/acc", "acc", "train/loss", "gpu/util_percent",
                              "perf/tokens_per_second"])
    assert rows == [(catalogue.OWN_GROUP, "acc", ""), (catalogue.OWN_GROUP, "val/acc", ""),
                    ("training", "train/loss", ""), ("throughput", "perf/tokens_per_second", "tokens/s"),
                    ("step timing", "perf/forward_time", "s"), ("GPU", "gpu/util_percent", "%")], rows


def test_a_counter_status_has_too_has_one_name_status_s_path_under_telemetry():
    """The daemon record's counter and status's figure are one name: records_lost is
    telemetry/records_lost, memory.records_shed telemetry/memory/records_shed; an entry naming it
    otherwise is refused; each older name is mapped to a name the catalogue has now."""
    twins = [m for m in catalogue.CATALOGUE if m.source == "self" and m.status]
    assert twins and all(m.name == "telemetry/" + m.status.replace(".", "/") for m in twins), \
        [(m.name, m.status) for m in twins if m.name != "telemetry/" + m.status.replace(".", "/")]
    with pytest.raises(ValueError, match="telemetry/records_lost"):
        catalogue.Metric("telemetry/dropped", "records", "counter", "daemon", "x", source="self",
                         cumulative=True, status="records_lost")
    with pytest.raises(ValueError, match="_total"):      # Prometheus would say _total_total
        catalogue.Metric("telemetry/x_total", "records", "counter", "daemon", "x", source="self", cumulative=True)
    names = {m.name for m in catalogue.CATALOGUE}
    assert set(catalogue.RENAMED.values()) <= names and not set(catalogue.RENAMED) & names

"""results.json of benchmarks/gpu/bench.py -> the markdown tables for benchmarks/RESULTS.md.

    python -m benchmarks.gpu.report OUT/results.json
"""
from __future__ import annotations

import json
import math
import sys


def _ms(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1e3:.2f}"


def _r(x: float | None, nd: int = 4) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _e(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def markdown(results: dict, smoke: bool = False) -> str:
    meta, parts = results["meta"], results["parts"]
    label = ("CPU SMOKE (reduced form on a CPU machine; these are NOT GPU figures)" if smoke
             else f"GPU run on {parts.get('overhead', {}).get('device') or 'the GPU machine'}")
    lines = [f"### {label}", "",
             f"- command: `{meta['command']}`; {meta['date_utc']}; host {meta['host']}, {meta['cpu_count']} CPUs, "
             f"python {meta['python']}, torch {meta['torch']}, engine {meta['engine']}",
             f"- config: `{meta['preset']['config']}` + `{' '.join(meta['preset']['overrides'])}`; warm-up "
             f"{meta['preset']['warmup']} steps dropped, {meta['preset']['measure']} measured per run, "
             f"{meta['preset']['rounds']} round(s) interleaved; total {meta.get('total_s', 0):.0f} s", ""]
    for name, fn in (("overhead", _overhead), ("nosync", _nosync), ("mfu", _mfu), ("nvml", _nvml)):
        if name not in parts:
            continue
        part = parts[name]
        if "error" in part or isinstance(part.get("skipped"), str):
            lines += [f"**{name}**: {part.get('error') or 'skipped: ' + part['skipped']}", ""]
            continue
        lines += fn(part, smoke) + [""]
    return "\n".join(lines)


def _overhead(p: dict, smoke: bool = False) -> list[str]:
    out = ["**Step time** (trainer's per-step host time after warm-up; window = device-synchronized mean)", "",
           "| variant | runs | steps | median ms | p99 ms | window mean ms | median vs off [95% CI] | window vs off | per-round window vs off |",
           "|---|---|---|---|---|---|---|---|---|"]
    names = {"off": "(a) telemetry off", "ours": "(b) our client + daemon", "seed": "(c) seed-style monitor"}
    for v, row in p["variants"].items():
        if v != "off" and not row["num_runs"]:
            continue  # not run (--variants)
        ci = row.get("median_vs_off_ci95")
        vs = f"{_r(row.get('median_vs_off'))} [{_r(ci[0])}, {_r(ci[1])}]" if ci else "1"
        rounds = ", ".join(_r(x) for x in row.get("per_round_window_vs_off", [])) or "—"
        out.append(f"| {names[v]} | {row['num_runs']} | {row['num_steps']} | {_ms(row['median_s'])} | {_ms(row['p99_s'])} "
                   f"| {_ms(row['window_mean_s'])} | {vs} | {_r(row.get('window_vs_off'))} | {rounds} |")
    ours = p["variants"].get("ours", {})
    if ours.get("median_vs_off") is not None:
        r, ci = ours["median_vs_off"], ours.get("median_vs_off_ci95") or [float("nan")] * 2
        verdict = "within" if r <= 1.01 else "OVER"
        if smoke:
            verdict = "(CPU smoke: a few steps of a tiny model, not a measurement of the GPU budget)"
        out += ["", f"Budget (b) within 1 % of (a): median ratio {r:.4f} (95% CI {_r(ci[0])}-{_r(ci[1])}) -> {verdict}"
                f"{'' if smoke else ' the budget' + ('' if ci[1] <= 1.01 else ' (the CI reaches past 1.01)')}; "
                f"(c)/(a) = {_r(p['variants'].get('seed', {}).get('median_vs_off'))}."]
    if p.get("failed"):
        out += ["", "Failed runs: " + "; ".join(f"{f['name']} rc={f['rc']}" for f in p["failed"])]
    if p.get("skipped_runs"):
        out += ["", "Skipped (time budget): " + ", ".join(p["skipped_runs"])]
    return out


def _nosync(p: dict, smoke: bool = False) -> list[str]:
    out = ["**Zero syncs** (trainer step with our client to a live daemon; log_every=2)", "",
           "| engine | result | steps checked | mode | syncs on the training thread | library syncs (listed, not ours) | first site |",
           "|---|---|---|---|---|---|---|"]
    for c in p["checks"]:
        if "skipped" in c:
            out.append(f"| {c['engine']} | skipped ({c['skipped']}) | | | | | |")
            continue
        site = (c.get("sync_errors") or [None])[0] or ((c.get("reads") or [{}])[0].get("site"))
        lib = c.get("library_reads") or []
        lib_text = f"{c.get('num_library_reads') or 0}" + (f" ({lib[0]['site']}" + (", ..." if len(lib) > 1 else "") + ")"
                                                           if lib else "")
        out.append(f"| {c['engine']} | {'PASS' if c['ok'] else 'FAIL'} (rc {c['rc']}) | {c['steps_checked']} "
                   f"({c['num_log_steps_checked']} log steps) | {c['mode']} | {c['num_reads']} | "
                   f"{lib_text} | {site or '—'} |")
    for c in p["checks"]:
        for row in (c.get("library_reads") or [])[:8]:
            out.append(f"- {c['engine']}: {row['what']} x{row['count']} from step {row['first_step']} at "
                       f"`{row['site']}` (via `{row['via']}`)")
    return out


def _mfu(p: dict, smoke: bool = False) -> list[str]:
    c, m, a = p["counted"], p["matmul"], p.get("analytic") or {}
    out = ["**MFU**", "",
           "| what | value |", "|---|---|",
           f"| FlopCounterMode, one step ({c['rows']} x {c['seq_len']} unpacked, eager, {c['device']}) | {_e(c['counted_flops'])} FLOPs |",
           f"| formula (telemetry.daemon.mfu) for the same step | {_e(c['formula_flops'])} FLOPs (counted/formula {_r(c['ratio'], 6)}) |"]
    if "hardware_ratio" in c:
        out.append(f"| with recompute (HFU): counted / formula | {_e(c['hardware_counted_flops'])} / "
                   f"{_e(c['hardware_formula_flops'])} = {_r(c['hardware_ratio'], 6)} |")
    out.append(f"| measured matmul {m['n']}^3 {m['dtype']} on {m['device']} (mean of {m['num_iters']}) | "
               f"{_e(m['flops_per_second'])} FLOP/s (best {_e(m['best_flops_per_second'])}) |")
    if a:
        out += [f"| daemon: model FLOP/s (median over {a.get('num_steps')} steps) | {_e(a.get('perf/model_flops_per_second'))} |",
                f"| daemon: perf/mfu (vs the datasheet peak) | {_r(a.get('perf/mfu'))} |",
                f"| daemon: perf/hfu | {_r(a.get('perf/hfu'))} |",
                f"| model FLOP/s / measured matmul rate | {_r(p.get('mfu_vs_measured_matmul'))} |",
                f"| run's step: tokens, sum L_i^2 (packed, median) | {_e(a.get('perf/tokens'))}, {_e(a.get('perf/attn_doc_len_sq'))} |"]
    elif p.get("note"):
        out.append(f"| daemon analytic MFU | {p['note']} |")
    return out


def _nvml(p: dict, smoke: bool = False) -> list[str]:
    if not p.get("available"):
        return [f"**NVML**: {p.get('reason')}"]
    out = [f"**NVML poller vs nvidia-smi** ({len(p['samples'])} samples, GPU under a bf16 matmul load; medians)", "",
           "| field | poller | nvidia-smi | median abs diff |", "|---|---|---|---|"]
    for key, s in p["summary"].items():
        out.append(f"| {key} | {s['poller']:.4g} | {s['nvidia_smi']:.4g} | {s['median_abs_diff']:.3g} |")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    results = json.loads(open(argv[0]).read())
    print(markdown(results, smoke=not results["meta"]["cuda"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

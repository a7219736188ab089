// The telemetry dashboard page: loads /api/data (every run's series, downsampled by the server
// to the chart width), draws them with uPlot, then appends what /api/stream sends (server-sent
// events). No build step, no network beyond this server.
//
// For tests and scripts, each chart's card carries data-points (non-null points drawn),
// data-series (the series labels, "|"-separated) and data-last-x (the largest x drawn); <body>
// carries data-ready="1" once drawn and data-seq (the last change applied).
"use strict";

// -- what is drawn -----------------------------------------------------------------------------
const exact = (...names) => (k) => names.includes(k);
const re = (r) => (k) => r.test(k);
const afterAt = (k) => k.split("@")[1] || "";
const datasetOf = (k) => k.split("/")[1];

// The goodput ledger's buckets (telemetry/shared/goodput.py BUCKETS), in its order: productive at
// the bottom. The server says them (a snapshot's goodput_buckets); these until it has.
const GOODPUT_BUCKETS = ["productive", "startup", "data_loading", "eval", "checkpoint_save", "checkpoint_restore",
                         "straggler", "hang", "redone", "recovery", "telemetry", "excluded", "unexplained"]
  .map((b) => `goodput/${b}_s`);

// Where a section goes (SECTION_PLACES): "top", the run's own training signals, first; "more",
// after the run's own keys and its media; "system", the host, GPU and the daemon's own series, in
// the System section (folded until opened, as W&B's System tab).
const GROUPS = [
  { title: "Training", place: "top", charts: [
    { id: "loss", title: "Loss", axis: "step", match: (k) => k === "train/loss" || /^eval\/([^/]+\/)?loss$/.test(k),
      label: (k) => k === "train/loss" ? "train" : (k === "eval/loss" ? "eval" : `eval ${datasetOf(k)}`),
      points: (k) => k.startsWith("eval/") },
    { id: "lr", title: "Learning rate", axis: "step", match: exact("train/lr"), label: () => "lr" },
    { id: "grad_norm", title: "Gradient norm", axis: "step", match: exact("train/grad_norm"), label: () => "grad norm" },
  ]},
  { title: "Throughput and step time", place: "top", charts: [
    { id: "tokens", title: "Tokens per second (all ranks)", axis: "step", match: exact("perf/tokens_per_second"),
      label: () => "tokens/s" },
    { id: "mfu", title: "MFU (%)", axis: "step", match: exact("perf/mfu_percent"), label: () => "MFU %",
      note: "analytic FLOPs / peak" },
    { id: "step_time", title: "Step time (s) across ranks", axis: "step",
      match: exact("perf/step_time_max", "perf/step_time_min", "perf/step_time"),
      label: (k) => ({ "perf/step_time_max": "slowest rank", "perf/step_time_min": "fastest rank",
                       "perf/step_time": "mean" })[k],
      order: ["perf/step_time_max", "perf/step_time", "perf/step_time_min"] },
    { id: "rank_step_time", title: "Step time per rank (s)", axis: "step", match: re(/^perf\/step_time@rank\d+$/),
      label: (k) => afterAt(k).replace("rank", "rank "), note: "daemon --per-rank" },
    { id: "slowest_rank", title: "Slowest rank", axis: "step", match: exact("perf/slowest_rank"),
      label: () => "rank", points: () => true, integer: true },
    { id: "phases", title: "Step phases (s, stacked)", axis: "step", stacked: true,
      match: exact("perf/data_loading_time", "perf/forward_time", "perf/backward_time", "perf/optimizer_time"),
      order: ["perf/data_loading_time", "perf/forward_time", "perf/backward_time", "perf/optimizer_time"],
      label: (k) => k.replace("perf/", "").replace("_time", "").replace("_", " ") },
    { id: "memory", title: "Device memory (GB)", axis: "step",
      match: exact("memory/allocated_gb", "memory/max_allocated_gb", "memory/reserved_gb"),
      label: (k) => k.replace("memory/", "").replace("_gb", "").replace("_", " ") },
  ]},
  { title: "Per dataset", place: "top", charts: [
    { id: "dataset_loss", title: "Loss per dataset (train)", axis: "step", match: re(/^dataset\/[^/]+\/loss$/),
      label: datasetOf },
    { id: "dataset_accuracy", title: "Accuracy per dataset", axis: "step", match: re(/^(dataset|eval)\/[^/]+\/accuracy$/),
      label: (k) => (k.startsWith("eval/") ? "eval " : "") + datasetOf(k), points: (k) => k.startsWith("eval/") },
    { id: "dataset_tokens", title: "Tokens per dataset", axis: "step", match: re(/^dataset\/[^/]+\/tokens$/),
      label: datasetOf },
  ]},
  { title: "GPUs", place: "system", why: "no GPU records (no NVML on the daemon's machine)", charts: [
    { id: "gpu_util", title: "GPU utilization (%)", axis: "time", match: re(/^gpu\/util_percent@/), label: afterAt },
    { id: "gpu_memory", title: "GPU memory used (GB)", axis: "time", match: re(/^gpu\/memory_used_gb@/), label: afterAt },
    { id: "gpu_power", title: "GPU power (W)", axis: "time", match: re(/^gpu\/power_w@/), label: afterAt },
    { id: "gpu_temperature", title: "GPU temperature (°C)", axis: "time", match: re(/^gpu\/temperature_c@/), label: afterAt },
  ]},
  { title: "Host", place: "system", charts: [
    { id: "host_cpu", title: "Host CPU (%)", axis: "time", match: re(/^system\/cpu_percent@/), label: afterAt },
    { id: "host_memory", title: "Host memory (%)", axis: "time", match: re(/^system\/memory_percent@/), label: afterAt },
  ]},
  { title: "Where the time went (the goodput ledger)", place: "more", why: "no goodput ledger yet (the daemon writes it in its own records)",
    bar: true,   // the run's wall time so far as one stacked bar of its buckets, above the charts
    charts: [
    { id: "goodput_buckets", title: "Wall time by bucket (s, stacked)", axis: "time", stacked: true,
      match: (k) => GOODPUT_BUCKETS.includes(k), order: GOODPUT_BUCKETS,
      label: (k) => k.replace("goodput/", "").replace(/_s$/, "").replace(/_/g, " "),
      note: "telemetry goodput RUN_DIR: the formulas" },
    { id: "goodput_fraction", title: "Goodput (productive / wall)", axis: "time", match: exact("goodput/fraction"),
      label: () => "goodput" },
  ]},
  { title: "Telemetry (the daemon's own accounting)", place: "system", charts: [
    { id: "records_in", title: "Records in", axis: "time", match: exact("telemetry/records_in"), label: () => "records in" },
    { id: "records_lost", title: "Records lost", axis: "time",
      match: exact("telemetry/records_lost", "telemetry/records_lost_in_transit", "telemetry/sink_dropped"),
      label: (k) => ({ "telemetry/records_lost": "dropped", "telemetry/records_lost_in_transit": "lost in transit" })[k]
        ?? k.replace("telemetry/", "").replace(/_/g, " "), note: "should stay at 0" },
  ]},
];
const CHARTS = GROUPS.flatMap((g) => g.charts);
// The containers of the places, in the page's order (index.html): the run's own keys and media
// come before anything of the machine's or the daemon's.
const SECTION_PLACES = { top: "groups", own: "groups", more: "groups-more", system: "groups-system" };
// The catalogue's groups of the machine and of the daemon, and the names that are theirs whatever
// their group (telemetry/client_s is "step timing"): the System section's.
const SYSTEM_GROUPS = new Set(["GPU", "host", "daemon"]);
const SYSTEM_PREFIX_GROUPS = new Map([["system", "host"], ["gpu", "GPU"], ["telemetry", "daemon"]]);
const isSystemName = (b, group) => SYSTEM_GROUPS.has(group) || /^(system|gpu|telemetry)\//.test(b);

// Every other series a run logs (a script's own keys: acc, val/loss, nested/...) and every
// series of the metric catalogue no built-in chart draws (GPU and host series, the straggler
// view, counts): a chart per name. The run's own names (the catalogue does not know them) right
// after the built-in training sections (none of which draws anything for a plain script: its
// keys are the page's first charts), in a section per prefix (the part before the first "/";
// names without one under "Other metrics"); then the catalogue's names, in a section per
// catalogue group, in its order (the server says each series' group:
// telemetry/shared/catalogue.py), those of the machine and the daemon in the System section. A
// name's per-host or per-rank series (name@...) share its chart. The daemon's own counters
// (time-axis names of its daemon records) stay in the Telemetry section. Recomputed only when
// the set of names grows.
const baseOf = (k) => k.split("@")[0];
const builtIn = (k) => CHARTS.some((c) => c.match(k));
const NOT_CHARTED = (k) => k.startsWith("system/cpu_percent_core");   // one series per core: not drawn
function autoGroups() {
  let numKeys = 0;
  for (const id of state.order) numKeys += Object.keys(state.runs[id].series).length;
  const sig = state.order.join(",") + ":" + numKeys;
  if (state.auto && state.auto.sig === sig) return state.auto.groups;
  const extras = new Map();        // built-in group title -> the per-rank charts of its charts' names
  const axes = new Map();          // name -> its axis
  const groupOf = new Map();       // name -> its catalogue group ("": the run's own)
  const keysOf = new Map();        // name -> run -> its keys (a chart's series, without matching every key)
  for (const id of state.order) {
    for (const [k, s] of Object.entries(state.runs[id].series)) {
      if (NOT_CHARTED(k) || builtIn(k)) continue;
      if (s.axis === "time" && !k.includes("@")) continue;   // the daemon's own counters: the Telemetry section
      const b = baseOf(k);
      if (!axes.has(b)) {
        axes.set(b, s.axis);
        keysOf.set(b, new Map());
        // A name of the machine's or the daemon's the catalogue does not know (yet): its group by
        // its prefix, so it is in the System section too.
        groupOf.set(b, s.group || SYSTEM_PREFIX_GROUPS.get(b.split("/")[0]) || "");
      }
      const runs = keysOf.get(b);
      if (!runs.has(id)) runs.set(id, []);
      runs.get(id).push(k);
    }
  }
  const byPrefix = new Map();      // the run's own: prefix -> charts
  const byGroup = new Map();       // the catalogue's: group -> charts
  for (const b of [...axes.keys()].sort((x, y) => x.localeCompare(y, "en", { numeric: true }))) {
    const group = groupOf.get(b);
    const prefix = b.includes("/") ? b.split("/")[0] + "/" : "";
    // A name a built-in chart draws (train/loss): its other series (a line per rank, with the
    // daemon's --per-rank) go in that chart's section, after it, not in a section of their own.
    const home = CHARTS.some((c) => c.match(b)) ? GROUPS.find((g) => g.charts.some((c) => c.match(b))) : null;
    let list;
    if (home) {
      if (!extras.has(home.title)) extras.set(home.title, []);
      list = extras.get(home.title);
    } else {
      const into = group ? byGroup : byPrefix;
      const at = group ? (isSystemName(b, group) ? "system|" : "more|") + group : prefix;
      if (!into.has(at)) into.set(at, []);
      list = into.get(at);
    }
    const perRank = [...keysOf.get(b).values()].every((ks) => ks.every((k) => /@rank\d+$/.test(k)));
    list.push({
      id: "auto-" + b, title: home && perRank ? `${b} per rank` : b, axis: axes.get(b), auto: true,
      match: (k) => baseOf(k) === b && !NOT_CHARTED(k) && !builtIn(k),
      keys: (runId) => keysOf.get(b).get(runId) ?? [],
      label: (k) => afterAt(k).replace(/^rank(\d+)$/, "rank $1") || (b.includes("/") ? b.slice(b.lastIndexOf("/") + 1) : b),
      points: (k) => sparse(k),     // a few points (an eval every N steps): markers, not a line to nowhere
    });
  }
  const rank = (g) => { const i = state.groupOrder.indexOf(g); return i < 0 ? state.groupOrder.length : i; };
  const groups = [...byPrefix.entries()]
    .sort(([a], [b]) => (a === "" ? 1 : b === "" ? -1 : a.localeCompare(b)))
    .map(([prefix, charts]) => ({ title: prefix ? `${prefix} (logged by the run)` : "Other metrics (logged by the run)",
                                  charts, auto: true, place: "own" }))
    .concat([...byGroup.entries()]
      .map(([at, charts]) => { const [place, group] = at.split("|"); return { place, group, charts }; })
      .sort((a, b) => rank(a.group) - rank(b.group) || a.group.localeCompare(b.group))
      .map(({ place, group, charts }) => ({ title: `${group} (more series)`, id: `${place}-${group}`, charts,
                                            auto: true, place })));
  state.auto = { sig, groups, extras };
  return groups;
}

// A section's charts: a built-in one's with the per-rank charts of its names (autoGroups).
const chartsOf = (group) => (group.auto ? group.charts : [...group.charts, ...(state.auto?.extras.get(group.title) ?? [])]);

const SPARSE_POINTS = 12;
function sparse(k) {
  return state.order.every((id) => (state.runs[id].series[k]?.n ?? 0) <= SPARSE_POINTS);
}

// The filter box: a chart is shown when its title or one of its series' names holds the text.
function passesFilter(chart, list) {
  const f = state.filter;
  if (!f) return true;
  return chart.title.toLowerCase().includes(f) || list.some(({ key }) => key.toLowerCase().includes(f));
}

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
                 "#4b5563", "#65a30d", "#1e3a8a", "#7f1d1d", "#14532d", "#581c87", "#9a3412", "#155e75",
                 "#854d0e", "#9d174d", "#111827", "#3f6212"];
// Light versions of PALETTE, in its order (a band's fill and its legend's line agree).
const STACK_FILLS = ["#93c5fd", "#fca5a5", "#86efac", "#d8b4fe", "#fdba74", "#67e8f9", "#fde047", "#f9a8d4",
                     "#d1d5db", "#bef264"];
const DASHES = [[], [6, 3], [2, 3], [10, 3, 2, 3]];
const SEVERITY_COLOR = { critical: "#dc2626", warning: "#d97706", info: "#2563eb" };
const CHART_HEIGHT = 210;
// Charts drawn at once; the rest when they come near the viewport (a run of thousands of names
// would otherwise build thousands of canvases before the page answers).
const EAGER_CHARTS = 48;
const nearView = new Set();
const observer = typeof IntersectionObserver === "undefined" ? null : new IntersectionObserver((entries) => {
  for (const e of entries) {
    if (e.isIntersecting && !nearView.has(e.target.dataset.chart)) { nearView.add(e.target.dataset.chart); state.dirty = true; }
  }
}, { rootMargin: "600px 0px" });
const REDRAW_MS = 500;
// A live series grown past this many points per pixel column is fetched again, downsampled.
const RELOAD_POINTS_PER_PX = 4;

// -- state -------------------------------------------------------------------------------------
const state = { runs: {}, order: [], status: {}, seq: 0, plots: {}, dirty: false, reloading: false, stream: null,
                filter: "", auto: null, groupOrder: [], smooth: 0, logY: false, xTime: false, zoom: { step: null, time: null },
                detail: null, hiddenRuns: new Set() };

function runLabel(runId) {
  return state.order.length > 1 ? (state.runs[runId].name + " ") : "";
}
const multi = () => state.order.length > 1;

function loadSnapshot(data) {
  state.runs = {};
  state.order = [];
  for (const r of data.runs) {
    const series = {};
    for (const s of r.series) series[s.key] = { axis: s.axis, x: s.x, y: s.y, gap: s.gap, n: s.n, unit: s.unit || "",
                                                group: s.group || "" };
    if (r.group_order) state.groupOrder = r.group_order;
    if (Array.isArray(r.goodput_buckets) && r.goodput_buckets.length) {
      GOODPUT_BUCKETS.splice(0, GOODPUT_BUCKETS.length, ...r.goodput_buckets.map((b) => `goodput/${b}_s`));
    }
    state.runs[r.id] = { id: r.id, name: r.name, t0: r.t0, latest: r.latest, series,
                         events: r.events, numEvents: r.num_events, config: r.config,
                         summary: r.summary ?? {}, numSummaryDropped: r.num_summary_dropped ?? 0,
                         stepT: { s: r.step_t?.[0] ?? [], t: r.step_t?.[1] ?? [] } };
    state.order.push(r.id);
  }
  applyStatus(data.status);
  state.seq = data.seq;
  state.instance = data.instance;
}

function applyChanges(msg) {
  let needReload = false;
  for (const [runId, points] of Object.entries(msg.points)) {
    const run = state.runs[runId];
    if (!run) continue;
    for (const [key, axis, x, y, unit, group] of points) {
      if (axis === "summary") {             // a value of the run's summary (run.summary[key] = value)
        run.summary[key] = y;
        state.infoDirty = true;
        continue;
      }
      if (axis === "steptime") {            // a step's wall time (the x axis in wall time)
        const st = run.stepT;
        if (!st.s.length || x > st.s[st.s.length - 1]) { st.s.push(x); st.t.push(y); }
        if (state.xTime) state.dirty = true;
        continue;
      }
      let s = run.series[key];
      if (!s) s = run.series[key] = { axis, x: [], y: [], gap: null, n: 0, unit: unit || "", group: group || "" };
      const last = s.x.length ? s.x[s.x.length - 1] : null;
      if (last !== null && x <= last) { needReload = true; continue; }  // a resumed run logs a step again
      if (axis === "time" && s.gap && last !== null && x - last > s.gap) { s.x.push((x + last) / 2); s.y.push(null); }
      s.x.push(x); s.y.push(y); s.n += 1;
      if (axis === "step" && y !== null) run.latest[key] = y;
      if (s.x.length > RELOAD_POINTS_PER_PX * chartWidth()) needReload = true;
    }
  }
  for (const ev of msg.events) {
    const run = state.runs[ev.run];
    if (!run) continue;
    const i = run.events.findIndex((e) => e.id === ev.id);
    if (i >= 0) run.events[i] = ev; else { run.events.push(ev); run.numEvents += 1; }
  }
  state.seq = msg.seq;
  document.body.dataset.seq = String(state.seq);
  state.dirty = true;
  if (needReload) reload();
}

// While the server reads a long history, the charts are fetched again every HISTORY_RELOAD_MS
// (they fill in); once it is read, the stream's reload brings the rest.
const HISTORY_RELOAD_MS = 5000;
function applyStatus(list) {
  for (const st of list) state.status[st.run] = st;
  if (list.some((st) => st.loading_history) && Date.now() - (state.loadedAt ?? 0) > HISTORY_RELOAD_MS) reload();
  drawStatus();
  drawTiles();   // the daemon's counters come with the status
}

// -- formatting --------------------------------------------------------------------------------
function fmt(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return "—";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
  if (a >= 1000) return Math.round(v).toLocaleString("en-US");
  return Number(v.toPrecision(digits)).toString();
}
function fmtTime(t) {
  if (t === null || t === undefined) return "";
  const d = new Date(t * 1000);
  return d.toLocaleTimeString("en-GB", { hour12: false });
}
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

// -- header, tiles, events ---------------------------------------------------------------------
function drawStatus() {
  const box = document.getElementById("status");
  const sts = state.order.map((id) => state.status[id]).filter(Boolean);
  if (!sts.length) return;
  const now = Date.now() / 1000;
  const parts = [];
  let cls = "idle";
  for (const st of sts) {
    const who = multi() ? `${st.name}: ` : "";
    if (st.loading_history) {
      parts.push(`${who}reading the run's history: ${st.num_records.toLocaleString("en-US")} records so far…`);
      if (cls === "idle") cls = "down";
    } else if (st.ended) {
      parts.push(`${who}run ended (${st.ended_how})`);
      if (cls === "idle") cls = "ended";
    } else if (st.connected === false) {
      parts.push(`${who}daemon not reachable, reconnecting…`);
      cls = "down";
    } else if (st.connected === true) {
      const age = st.last_record_t ? now - st.last_record_t : null;
      parts.push(`${who}live` + (age !== null ? `, last record ${age < 1 ? "<1" : Math.round(age)} s ago` : ""));
      if (cls !== "down") cls = "live";
    } else {
      const age = st.last_record_t ? Math.round(now - st.last_record_t) : null;
      parts.push(`${who}following metrics.jsonl` + (age !== null ? `, last record ${age} s ago` : ""));
    }
  }
  box.textContent = parts.join(" · ");
  box.className = "status " + cls;
  box.dataset.connected = sts.map((s) => String(s.connected)).join(",");
  box.dataset.ended = sts.map((s) => String(s.ended)).join(",");
  const title = document.getElementById("title");
  title.textContent = state.order.map((id) => state.runs[id].name).join(" vs ");
  document.title = title.textContent + " · telemetry";
  drawShed(sts);
  const st0 = sts[0];
  // One count of records on the page: the daemon's (its "records in" tile) where it said one;
  // else the lines the dashboard read.
  const daemonCount = st0.daemon?.["telemetry/records_in"] != null;
  document.getElementById("subtitle").textContent = multi() ? `${sts.length} runs` :
    [st0.last_step == null ? null : `step ${st0.last_step}`,
     daemonCount ? null : `${st0.num_records.toLocaleString("en-US")} records read`, st0.source]
      .filter(Boolean).join(" · ");
}

// What the dashboard did not keep to stay within its memory budget (--memory-mb, --max-series).
function drawShed(sts) {
  const parts = [];
  for (const st of sts) {
    const b = st.budget;
    if (!b) continue;
    const who = multi() ? `${st.name}: ` : "";
    const said = [];
    if (b.num_values_dropped) said.push(`${b.num_values_dropped.toLocaleString("en-US")} values of series beyond ` +
                                        `the first ${b.max_series.toLocaleString("en-US")} not kept`);
    if (b.num_points_thinned) said.push(`${b.num_points_thinned.toLocaleString("en-US")} points thinned ` +
                                        "(each bucket's first, last, minimum and maximum kept)");
    if (b.num_events_forgotten) said.push(`${b.num_events_forgotten.toLocaleString("en-US")} oldest events forgotten`);
    if (said.length) parts.push(who + said.join(", "));
  }
  const box = document.getElementById("shed");
  box.textContent = parts.length ? "Memory budget: " + parts.join("; ") + "." : "";
  box.hidden = !parts.length;
}

const daemonTotal = (run, key) => state.status[run.id]?.daemon?.[key];

// [label, value, shown as, red when positive, whether the run has it]: a tile is drawn for a run
// that has its value (a plain script logs no tokens/s, MFU or step time: no tile says "—"); a
// series' tile stays while its latest value is NaN (shown "—").
const has = (...keys) => (r) => keys.some((k) => k in r.series);
const hasDaemon = (key) => (r) => daemonTotal(r, key) != null;
const TILES = [
  ["step", (r) => state.status[r.id]?.last_step, (v) => v ?? "—", false, (r) => state.status[r.id]?.last_step != null],
  ["loss", (r) => r.latest["train/loss"], (v) => fmt(v), false, has("train/loss")],
  ["tokens/s", (r) => r.latest["perf/tokens_per_second"], (v) => fmt(v), false, has("perf/tokens_per_second")],
  ["MFU", (r) => r.latest["perf/mfu_percent"], (v) => v === undefined || v === null ? "—" : v.toFixed(1) + " %", false,
   has("perf/mfu_percent")],
  ["step time", (r) => r.latest["perf/step_time_max"] ?? r.latest["perf/step_time"], (v) => v == null ? "—" : fmt(v, 3) + " s",
   false, has("perf/step_time_max", "perf/step_time")],
  ["grad norm", (r) => r.latest["train/grad_norm"], (v) => fmt(v), false, has("train/grad_norm")],
  ["lr", (r) => r.latest["train/lr"], (v) => fmt(v, 3), false, has("train/lr")],
  // The daemon's counters summed over the run's daemons (a resumed run has several).
  ["goodput", (r) => daemonTotal(r, "goodput/fraction"), (v) => v == null ? "—" : (v * 100).toFixed(1) + " %", false,
   hasDaemon("goodput/fraction")],
  ["records in", (r) => daemonTotal(r, "telemetry/records_in"), (v) => fmt(v), false, hasDaemon("telemetry/records_in")],
  ["dropped", (r) => daemonTotal(r, "telemetry/records_lost"), (v) => fmt(v), true, hasDaemon("telemetry/records_lost")],
  ["lost in transit", (r) => daemonTotal(r, "telemetry/records_lost_in_transit"), (v) => fmt(v), true,
   hasDaemon("telemetry/records_lost_in_transit")],
  ["sink dropped", (r) => daemonTotal(r, "telemetry/sink_dropped"), (v) => fmt(v), true, hasDaemon("telemetry/sink_dropped")],
];

// Comparing runs: each run's colour (its lines on every chart) and whether it is drawn.
const runColor = (id) => PALETTE[state.order.indexOf(id) % PALETTE.length];
const shownRun = (id) => !state.hiddenRuns.has(id);

function drawTiles() {
  const box = document.getElementById("tiles");
  box.replaceChildren();
  box.hidden = multi();
  document.getElementById("runs").hidden = !multi();
  if (multi()) { drawRunsTable(); return; }
  for (const [label, get, show, badIfPositive, present] of TILES) {
    for (const id of state.order) {
      const run = state.runs[id];
      if (!present(run)) continue;
      const v = get(run);
      const value = el("div", { class: "value" + (badIfPositive && v > 0 ? " bad" : ""), text: String(show(v)) });
      const tile = el("div", { class: "tile", "data-tile": label }, el("div", { class: "label", text: label }), value);
      box.append(tile);
    }
  }
}

// Several runs: a row per run instead of a tile each (5 runs made 60 tiles): its colour, a
// show/hide box, its name and the tiles' values as columns (those some run has). For tests: each
// row carries data-run (the run's name) and data-color; each value cell data-tile.
function drawRunsTable() {
  const cols = TILES.filter(([, , , , present]) => state.order.some((id) => present(state.runs[id])));
  document.getElementById("runs-head").replaceChildren(el("tr", {}, el("th", {}), el("th", { text: "run" }),
    ...cols.map(([label]) => el("th", { text: label }))));
  document.getElementById("runs-rows").replaceChildren(...state.order.map((id) => {
    const run = state.runs[id];
    const box = el("input", { type: "checkbox", "aria-label": `show ${run.name}` });
    box.checked = shownRun(id);
    box.addEventListener("change", () => {
      if (box.checked) state.hiddenRuns.delete(id); else state.hiddenRuns.add(id);
      redraw();
    });
    return el("tr", { "data-run": run.name, "data-color": runColor(id), class: shownRun(id) ? "" : "off" },
      el("td", {}, el("label", { class: "swatch-box" }, box, el("i", { class: "swatch", style: `background:${runColor(id)}` }))),
      el("th", { text: run.name }),
      ...cols.map(([label, get, show, badIfPositive, present]) => {
        const has = present(run), v = has ? get(run) : null;
        return el("td", { "data-tile": label, class: badIfPositive && v > 0 ? "bad" : "", text: has ? String(show(v)) : "" });
      }));
  }));
}

function allEvents() {
  const out = [];
  for (const id of state.order) for (const ev of state.runs[id].events) out.push(ev);
  out.sort((a, b) => (b.t ?? 0) - (a.t ?? 0));
  return out;
}

function eventRow(ev) {
  const ranks = ev.ranks_text;   // "rank 3", "ranks 0-7": one row for all the ranks that sent it
  return el("tr", { class: ev.severity },
    el("td", { class: "when", text: fmtTime(ev.t) }),
    el("td", { class: "step", text: ev.step === null || ev.step === undefined ? "" : `step ${ev.step}` }),
    el("td", { class: "name", text: (multi() ? state.runs[ev.run].name + ": " : "") + ev.name }),
    el("td", { class: "ranks", text: ranks }),
    el("td", { text: ev.message }));
}

function drawEvents() {
  const evs = allEvents();
  const diag = evs.filter((e) => e.name.startsWith("diagnosis/"));
  const other = evs.filter((e) => !e.name.startsWith("diagnosis/"));
  const dpanel = document.getElementById("diagnosis");
  dpanel.hidden = diag.length === 0;
  document.getElementById("diagnosis-count").textContent = `(${diag.length})`;
  document.getElementById("diagnosis-rows").replaceChildren(...diag.slice(0, 50).map(eventRow));
  document.getElementById("events-count").textContent = `(${other.length})`;
  const rows = other.slice(0, 200).map(eventRow);
  document.getElementById("event-rows").replaceChildren(...(rows.length ? rows :
    [el("tr", {}, el("td", { class: "dim", text: "no events yet" }))]));
}

// -- charts ------------------------------------------------------------------------------------
// A chart as wide as its own card (a grid column); chartWidth() before any card exists.
function cardWidth(card) {
  return card && card.clientWidth ? Math.max(300, card.clientWidth - 22) : chartWidth();
}

function chartWidth() {
  const grid = document.querySelector(".grid");
  const w = grid ? grid.querySelector(".card")?.clientWidth : null;
  return Math.max(300, (w || Math.min(window.innerWidth - 60, 860)) - 22);
}

// The series of every run that a chart draws: [{run, key, label, s}] in a stable order.
function chartSeries(chart) {
  const out = [];
  for (const id of state.order) {
    if (!shownRun(id)) continue;                 // a compared run hidden in the runs table
    const run = state.runs[id];
    let keys = chart.keys ? chart.keys(id).slice() : Object.keys(run.series).filter(chart.match);
    if (chart.order) keys.sort((a, b) => chart.order.indexOf(a) - chart.order.indexOf(b));
    else keys.sort((a, b) => a.localeCompare(b, "en", { numeric: true }));   // rank 2 before rank 10
    for (const key of keys) out.push({ run: id, key, label: runLabel(id) + (chart.label(key) ?? key), s: detailOf(id, key) ?? run.series[key] });
  }
  return out;
}

// A step chart's x axis is its steps, or with "x: wall time" the wall time each step ended.
const axisOf = (chart) => (chart.axis === "step" && state.xTime ? "time" : chart.axis);

function timeOfStep(run, step) {
  const { s, t } = run.stepT;
  if (!s.length || step < s[0] || step > s[s.length - 1]) return null;
  let lo = 0, hi = s.length - 1;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (s[mid] < step) lo = mid + 1; else hi = mid; }
  if (s[lo] === step || lo === 0) return t[lo];
  const f = (step - s[lo - 1]) / (s[lo] - s[lo - 1]);      // between two kept steps (a long run's are thinned)
  return t[lo - 1] + f * (t[lo] - t[lo - 1]);
}

function xOf(chart, runId, x) {
  if (chart.axis === "step" && state.xTime) {
    x = timeOfStep(state.runs[runId], x);
    if (x === null) return null;
  }
  // Several runs on one time axis: seconds since each run's first record, so they line up.
  return axisOf(chart) === "time" && multi() ? x - (state.runs[runId].t0 ?? 0) : x;
}

function buildData(chart, list) {
  const tables = list.map(({ run, s }) => {
    const xs = s.x.map((x) => xOf(chart, run, x));
    if (!xs.includes(null)) return [xs, s.y];
    const keep = xs.map((x) => x !== null);                  // steps with no wall time known: left out
    return [xs.filter((_, j) => keep[j]), s.y.filter((_, j) => keep[j])];
  });
  const data = tables.length === 1 ? tables[0] : uPlot.join(tables);
  let raw = null;
  if (chart.stacked && list.length > 1 && !multi()) {
    // Cumulative sums, drawn from the top band down so each fill covers the ones below it.
    raw = data.slice(1);
    const cum = [];
    let acc = null;
    for (let i = 0; i < raw.length; i++) {
      acc = raw[i].map((v, j) => (v === null || v === undefined ? (acc ? acc[j] : null) : (acc && acc[j] != null ? acc[j] : 0) + v));
      cum.push(acc);
    }
    return { data: [data[0], ...cum.reverse()], raw: raw.slice().reverse() };
  }
  let unsmoothed = null;
  if (state.smooth > 0) {
    // TensorBoard's smoothing: an exponential moving average, debiased; markers stay as logged.
    // The values as logged are kept, drawn faint beneath (rawBeneathPlugin).
    unsmoothed = data.map(() => null);
    for (let i = 1; i < data.length; i++) {
      if (chart.points && chart.points(list[i - 1].key)) continue;
      unsmoothed[i] = data[i];
      data[i] = smoothed(data[i], state.smooth);
    }
  }
  return { data, raw, unsmoothed };
}

function smoothed(ys, w) {
  const out = new Array(ys.length);
  let last = 0, n = 0;
  for (let j = 0; j < ys.length; j++) {
    const y = ys[j];
    if (y === null || y === undefined || !Number.isFinite(y)) { out[j] = y; continue; }
    last = last * w + (1 - w) * y;
    n += 1;
    out[j] = last / (1 - Math.pow(w, n));
  }
  return out;
}

// Zoom: a drag on a chart sets the x range of every chart on its axis (step or time); a
// double-click undoes it. Kept across live updates.
function zoomTo(axis, min, max) {
  state.zoom[axis] = min === null ? null : [min, max];
  if (axis === "step" && !state.xTime) {
    if (state.detail) { state.detail = null; state.dirty = true; }
    if (min !== null) fetchDetail(min, max);
  }
  for (const [id, p] of Object.entries(state.plots)) {
    if (p.axis !== axis) continue;
    if (min === null) p.plot.setData(p.plot.data, true);
    else p.plot.setScale("x", { min, max });
  }
}

// A zoomed step range, fetched again at the chart's width (/api/range): every point of it, from
// the dashboard's store or, where a long run's series were thinned there, from the run's files;
// used while that zoom lasts.
const DETAIL_KEYS = 200;                     // keys per request
function detailOf(runId, key) {
  const d = state.detail;
  const det = d && !state.xTime && state.zoom.step && d.min === state.zoom.step[0] && d.max === state.zoom.step[1] ?
    d.runs[runId]?.[key] : null;
  const base = det ? state.runs[runId]?.series[key] : null;
  if (!base) return null;
  // Outside the range, what the page holds (live steps too); inside, the range's every point.
  const x = [], y = [];
  for (let i = 0; i < base.x.length && base.x[i] < d.min; i++) { x.push(base.x[i]); y.push(base.y[i]); }
  x.push(...det.x); y.push(...det.y);
  for (let i = 0; i < base.x.length; i++) if (base.x[i] > d.max) { x.push(base.x[i]); y.push(base.y[i]); }
  return { ...base, x, y };
}
async function fetchDetail(min, max) {
  const wanted = {};
  for (const p of Object.values(state.plots)) {
    if (p.axis !== "step") continue;
    for (const item of p.signature.split("|")[0].split(",")) {
      const i = item.indexOf(":");
      if (i > 0) (wanted[item.slice(0, i)] ??= new Set()).add(item.slice(i + 1));
    }
  }
  const runs = {};
  let truncated = false;
  for (const [runId, keys] of Object.entries(wanted)) {
    const list = [...keys];
    for (let i = 0; i < list.length; i += DETAIL_KEYS) {
      const q = list.slice(i, i + DETAIL_KEYS).map((k) => "&key=" + encodeURIComponent(k)).join("");
      const resp = await api(`/api/range?run=${encodeURIComponent(runId)}&x0=${min}&x1=${max}&width=${chartWidth()}${q}`,
                               { cache: "no-store" });
      if (!resp.ok) continue;
      const got = await resp.json();
      truncated ||= got.truncated;
      const run = state.runs[runId];
      for (const [key, sr] of Object.entries(got.series)) {
        const base = run?.series[key];
        if (base) (runs[runId] ??= {})[key] = { x: sr.x, y: sr.y };
      }
    }
  }
  if (!state.zoom.step || state.zoom.step[0] !== min || state.zoom.step[1] !== max) return;   // zoomed elsewhere since
  state.detail = { min, max, runs, truncated };
  document.body.dataset.detail = `${min}-${max}`;
  state.dirty = true;
}

// The log scale: for a chart whose values are all positive (else it stays linear, said on its card).
function allPositive(list) {
  for (const { s } of list) for (const y of s.y) if (y !== null && y !== undefined && !(y > 0)) return false;
  return true;
}

// A rank's line (name@rank3) is the same colour on every chart: its rank's; a host's or a GPU's
// (name@node0/1) the colour given to that suffix when first drawn. Other series by their place.
const suffixColors = new Map();
function colorOf(key, keyIdx) {
  const at = key.includes("@") ? key.slice(key.indexOf("@") + 1) : null;
  if (at === null) return PALETTE[keyIdx % PALETTE.length];
  const r = /^rank(\d+)$/.exec(at);
  if (r) return PALETTE[Number(r[1]) % PALETTE.length];
  if (!suffixColors.has(at)) suffixColors.set(at, suffixColors.size);
  return PALETTE[suffixColors.get(at) % PALETTE.length];
}

function seriesOpts(chart, list, raw) {
  const stacked = raw !== null;
  const items = stacked ? list.slice().reverse() : list;
  return items.map((item, i) => {
    const keyIdx = list.filter((o) => o.run === item.run).indexOf(item);
    // Comparing runs: the run's colour (as in the runs table) on every chart, and a dash per
    // series of a run, so ten series of two runs are twenty lines told apart.
    const color = stacked ? PALETTE[(items.length - 1 - i) % PALETTE.length]
      : multi() ? runColor(item.run) : colorOf(item.key, keyIdx);
    const opts = { label: item.label, stroke: color, width: 1.5, spanGaps: false,
                   value: (u, v, si, di) => {
                     const cur = state.plots[chart.id]?.raw ?? raw;   // the values before stacking
                     const shown = stacked && cur && di !== null && di !== undefined ? cur[si - 1][di] : v;
                     return chart.integer ? (shown == null ? "—" : String(Math.round(shown))) : fmt(shown);
                   } };
    if (multi() && !stacked) opts.dash = DASHES[keyIdx % DASHES.length];
    if (stacked) opts.fill = STACK_FILLS[(items.length - 1 - i) % STACK_FILLS.length];
    if (chart.points && chart.points(item.key)) {
      opts.paths = () => null;   // markers only: eval every N steps, a rank number
      opts.points = { show: true, size: 6, space: 0, fill: color, stroke: color };
      opts.spanGaps = true;
    } else {
      opts.points = { show: false };
      opts.spanGaps = chart.axis !== "time";   // eval-only steps are undefined in joined data, not gaps
    }
    return opts;
  });
}

// With smoothing, each smoothed line's values as logged, faint, under the lines (drawn after the
// grid, before the series), read from the chart's entry in state.plots (`held`: its unsmoothed,
// renewed with each setData). Its card's data-raw-lines says how many it drew.
const RAW_ALPHA = 0.22;
function rawBeneathPlugin(held) {
  return { hooks: { drawAxes: [(u) => {
    const lines = held.unsmoothed;
    const card = u.root.closest(".card");
    let n = 0;
    if (lines) {
      const ctx = u.ctx, xs = u.data[0];
      const { left, top, width, height } = u.bbox;
      ctx.save();
      ctx.beginPath();
      ctx.rect(left, top, width, height);
      ctx.clip();
      ctx.globalAlpha = RAW_ALPHA;
      ctx.lineWidth = devicePixelRatio;
      for (let i = 1; i < lines.length; i++) {
        const ys = lines[i];
        const s = u.series[i];
        if (!ys || !s || !s.show) continue;
        ctx.strokeStyle = typeof s.stroke === "function" ? s.stroke(u, i) : s.stroke;
        ctx.beginPath();
        let pen = false;
        for (let j = 0; j < xs.length; j++) {
          const y = ys[j];
          if (y === null || y === undefined || !Number.isFinite(y)) { if (!s.spanGaps || y === null) pen = false; continue; }
          const px = u.valToPos(xs[j], "x", true), py = u.valToPos(y, "y", true);
          if (pen) ctx.lineTo(px, py); else ctx.moveTo(px, py);
          pen = true;
        }
        ctx.stroke();
        n += 1;
      }
      ctx.restore();
    }
    if (card) card.dataset.rawLines = String(n);
  }] } };
}

// Events as vertical lines on every chart: diagnosis in its severity's colour.
function markersPlugin(chart) {
  return { hooks: { draw: [(u) => {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    for (const id of state.order) {
      if (!shownRun(id)) continue;
      for (const ev of state.runs[id].events) {
        const x = axisOf(chart) === "step" ? ev.step
          : (ev.t === null || ev.t === undefined ? null : (multi() ? ev.t - (state.runs[id].t0 ?? 0) : ev.t));
        if (x === null || x === undefined) continue;
        const px = u.valToPos(x, "x", true);
        if (px < left || px > left + width) continue;
        const diag = ev.name.startsWith("diagnosis/");
        ctx.strokeStyle = diag ? (SEVERITY_COLOR[ev.severity] || SEVERITY_COLOR.warning) : "#9ca3af";
        ctx.lineWidth = (diag ? 2 : 1) * devicePixelRatio;
        ctx.setLineDash(diag ? [] : [4 * devicePixelRatio, 3 * devicePixelRatio]);
        ctx.beginPath();
        ctx.moveTo(px, top);
        ctx.lineTo(px, top + height);
        ctx.stroke();
      }
    }
    ctx.restore();
  }] } };
}

// Axis labels short enough for the axis: 135k, 1.2M, 3e-4.
function fmtAxis(v) {
  const a = Math.abs(v);
  if (a >= 1e9) return Number((v / 1e9).toPrecision(3)) + "G";
  if (a >= 1e6) return Number((v / 1e6).toPrecision(3)) + "M";
  if (a >= 1e4) return Number((v / 1e3).toPrecision(3)) + "k";
  return fmt(v, 3);
}
function axisValues(chart) {
  return (u, splits) => splits.map((v) => (chart.integer ? String(Math.round(v)) : fmtAxis(v)));
}

function makePlot(chart, card, list) {
  const { data, raw, unsmoothed } = buildData(chart, list);
  const held = { unsmoothed };                        // the chart's entry in state.plots, completed below
  const axis = axisOf(chart);
  const timeAxis = axis === "time" && !multi();
  const log = state.logY && !chart.stacked && allPositive(list);
  card.dataset.log = log ? "1" : "0";
  const opts = {
    width: cardWidth(card), height: CHART_HEIGHT,
    // One x value (a single daemon record, one step): a minute or a few steps around it, not the
    // years uPlot would span on a time axis.
    scales: { x: { time: timeAxis, range: (u, min, max) => {
      if (state.zoom[axis]) return [min, max];          // the range a zoom asked for
      const xs = u.data?.[0] ?? [];
      const one = xs.length > 0 && xs[0] === xs[xs.length - 1] ? xs[0] : null;
      if (one === null) return [min, max];
      return axis === "time" ? [one - 60, one + 60] : [one - 1, one + 1];
    } } },
    series: [{ label: axis === "step" ? "step" : (timeAxis ? "time" : "s since start"),
               value: (u, v) => (v == null ? "—" : timeAxis ? fmtTime(v) : String(Math.round(v))) },
             ...seriesOpts(chart, list, raw)],
    // Axis titles: the x axis's, and the unit the catalogue gives the chart's series (when they agree).
    axes: [{ grid: { stroke: "#eef0f3" }, label: axis === "step" ? "step" : (timeAxis ? "time" : "s since start"),
             labelSize: 16, labelFont: "11px system-ui, sans-serif" },
           { grid: { stroke: "#eef0f3" }, values: axisValues(chart), size: 60,
             label: unitOf(list), labelSize: 16, labelFont: "11px system-ui, sans-serif",
             ...(chart.integer ? { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] } : {}) }],
    legend: { live: true },
    cursor: { drag: { x: true, y: false, setScale: false }, sync: { key: axis } },
    hooks: { setSelect: [(u) => {
      if (u.select.width < 2) return;
      const min = u.posToVal(u.select.left, "x"), max = u.posToVal(u.select.left + u.select.width, "x");
      u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
      zoomTo(axis, min, max);
    }] },
    plugins: [rawBeneathPlugin(held), markersPlugin(chart)],
  };
  if (log) opts.scales.y = { distr: 3 };
  const plot = new uPlot(opts, data, card.querySelector(".plot"));
  plot.over.addEventListener("dblclick", () => zoomTo(axis, null, null));
  if (state.zoom[axis]) plot.setScale("x", { min: state.zoom[axis][0], max: state.zoom[axis][1] });
  return Object.assign(held, { plot, signature: signature(list), raw, axis });
}

// A chart exported: its points as CSV (a column per line, the values as logged: before stacking
// and smoothing; a long run's as drawn, a minimum and a maximum per pixel column) or its canvas
// as PNG. The buttons at each card's top right call these.
function chartCSV(id) {
  const p = state.plots[id];
  if (!p) return "";
  const u = p.plot;
  const cell = (v) => (v === null || v === undefined ? "" : typeof v === "number" ? String(v) :
    /[",\n]/.test(String(v)) ? `"${String(v).replace(/"/g, '""')}"` : String(v));
  const cols = u.data.map((d, i) => (i === 0 ? d : p.raw?.[i - 1] ?? p.unsmoothed?.[i] ?? d));
  const lines = [u.series.map((s) => cell(s.label)).join(",")];
  for (let j = 0; j < u.data[0].length; j++) lines.push(cols.map((c) => cell(c[j])).join(","));
  return lines.join("\n") + "\n";
}
function chartPNG(id) {
  const p = state.plots[id];
  return new Promise((resolve) => (p ? p.plot.ctx.canvas.toBlob(resolve, "image/png") : resolve(null)));
}
function download(name, blob) {
  if (!blob) return;
  const url = URL.createObjectURL(blob);
  el("a", { href: url, download: name }).click();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
function exportButtons(chart) {
  const name = chart.id.replace(/[^\w.-]+/g, "_");
  const csv = el("button", { class: "export", type: "button", title: "the chart's points as CSV", text: "CSV" });
  csv.addEventListener("click", () => download(`${name}.csv`, new Blob([chartCSV(chart.id)], { type: "text/csv" })));
  const png = el("button", { class: "export", type: "button", title: "the chart as PNG", text: "PNG" });
  png.addEventListener("click", async () => download(`${name}.png`, await chartPNG(chart.id)));
  return el("span", { class: "exports" }, csv, png);
}

function unitOf(list) {
  const units = new Set(list.map(({ s }) => s.unit || ""));
  return units.size === 1 ? [...units][0] : "";
}

function signature(list) {   // what a chart is drawn with: a new one when it changes
  return list.map((o) => o.run + ":" + o.key).join(",") + (state.logY ? "|log" : "") + (state.xTime ? "|time" : "");
}

// Whether the System section is open (its charts are drawn only then: folded, they have no width).
const systemOpen = () => document.getElementById("system").open;

function drawCharts() {
  const missing = [];
  let numShown = 0, numHidden = 0, numSystem = 0, numEager = 0, ownShown = false;
  const placed = {};                 // container id -> its sections, in the page's order
  for (const group of [...GROUPS, ...autoGroups()]) {
    const gid = "group-" + (group.id ?? group.title);
    let gEl = document.getElementById(gid);
    if (!gEl) {
      gEl = el("section", { class: "group", id: gid, "data-place": group.place }, el("h2", { text: group.title }),
               el("div", { class: "grid" }));
      // In the page at once: its charts are drawn as wide as their cards (moved to its place below).
      document.getElementById(SECTION_PLACES[group.place]).append(gEl);
    }
    (placed[SECTION_PLACES[group.place]] ??= []).push(gEl);
    const folded = group.place === "system" && !systemOpen();
    let shown = 0;
    for (const chart of chartsOf(group)) {
      const list = chartSeries(chart);
      let card = document.getElementById("chart-" + chart.id);
      if (!list.length || !passesFilter(chart, list)) {
        if (card) card.hidden = true;
        if (list.length) numHidden += 1;
        continue;
      }
      shown += 1;
      numShown += 1;
      if (group.place === "system") numSystem += 1;
      if (!folded) numEager += 1;
      if (!card) {
        const h = el("h3", { text: chart.title });
        if (chart.note) h.append(el("span", { class: "note", text: chart.note }));
        card = el("div", { class: "card", id: "chart-" + chart.id, "data-chart": chart.id }, h, el("div", { class: "plot" }),
                  exportButtons(chart));
        gEl.querySelector(".grid").append(card);
      }
      card.hidden = false;
      const sig = signature(list);
      const existing = state.plots[chart.id];
      if (!existing && folded) {
        // Drawn when the System section is opened (its toggle redraws).
      } else if (!existing && numEager > EAGER_CHARTS && observer && !nearView.has(chart.id)) {
        if (!card.dataset.observed) { observer.observe(card); card.dataset.observed = "1"; }
        // Its place until drawn: a drawn chart's height (legend included), so the page does not grow then.
        const drawnHeight = document.querySelector(".card .plot .uplot")?.offsetHeight;
        card.querySelector(".plot").style.minHeight = (drawnHeight || CHART_HEIGHT + 40) + "px";
      } else if (existing && existing.signature === sig) {
        const { data, raw, unsmoothed } = buildData(chart, list);
        existing.raw = raw;
        existing.unsmoothed = unsmoothed;
        const zoom = state.zoom[axisOf(chart)];
        existing.plot.setData(data, !zoom);
        if (zoom) existing.plot.setScale("x", { min: zoom[0], max: zoom[1] });
      } else {
        if (existing) existing.plot.destroy();
        card.querySelector(".plot").replaceChildren();
        card.querySelector(".plot").style.minHeight = "";      // its place-holding height, if any
        state.plots[chart.id] = makePlot(chart, card, list);
      }
      let points = 0, lastX = null;
      for (const { s, run } of list) {
        for (const y of s.y) if (y !== null && y !== undefined) points += 1;
        const lx = s.x.length ? xOf(chart, run, s.x[s.x.length - 1]) : null;
        if (lx !== null && (lastX === null || lx > lastX)) lastX = lx;
      }
      card.dataset.points = String(points);
      card.dataset.series = list.map((o) => o.label).join("|");
      card.dataset.lastX = lastX === null ? "" : String(lastX);
    }
    if (group.bar) drawGoodputBar(gEl);
    gEl.hidden = shown === 0;
    if (!shown && !group.auto && !state.filter) missing.push({ place: group.place, text: `${group.title}: ${group.why || "no records yet"}` });
    if (shown && group.place === "own") ownShown = true;
  }
  // Each container's sections in their order (a section that came later, e.g. a new prefix of the
  // run's keys, is moved to its place; nothing moves when the order holds).
  for (const [id, sections] of Object.entries(placed)) {
    const box = document.getElementById(id);
    const now = [...box.children];
    if (now.length !== sections.length || sections.some((s, i) => now[i] !== s)) box.append(...sections);
  }
  document.getElementById("system-count").textContent = `(${numSystem} charts: host, GPUs, the daemon's own)`;
  document.getElementById("system").hidden = numSystem === 0;
  // A script's own run (its keys charted) is not told of our trainer's sections it has no data for.
  const said = missing.filter((m) => !(ownShown && m.place === "top")).map((m) => m.text);
  document.getElementById("missing").textContent = said.length ? "Not shown: " + said.join("; ") + "." : "";
  document.getElementById("filter-count").textContent = state.filter ?
    `${numShown} chart(s) shown, ${numHidden} filtered out` : "";
}

// One stacked bar per run: its wall time so far split into the ledger's buckets (the daemon's
// latest goodput/<bucket>_s; a restarted daemon continues the ledger, so the last one's values
// are the run's), each segment as wide as its share, coloured as in the chart below. For tests:
// each row carries data-run, data-wall and data-buckets ("name=seconds|..."), each segment
// data-bucket and its share in data-share.
function drawGoodputBar(gEl) {
  let box = gEl.querySelector(".gbar-box");
  if (!box) {
    box = el("div", { class: "gbar-box", id: "goodput-bar" });
    gEl.insertBefore(box, gEl.querySelector(".grid"));
  }
  const rows = [];
  for (const id of state.order) {
    const run = state.runs[id];
    const wall = daemonTotal(run, "goodput/wall_s");
    if (!(wall > 0)) continue;
    const parts = GOODPUT_BUCKETS.map((key, k) => ({ name: key.replace("goodput/", "").replace(/_s$/, ""), k,
                                                     v: daemonTotal(run, key) ?? 0 }));
    const bar = el("div", { class: "gbar" });
    for (const p of parts) {
      if (!(p.v > 0)) continue;                         // unexplained may be a hair below 0
      const share = p.v / wall;
      bar.append(el("div", { class: "gseg", "data-bucket": p.name, "data-share": share.toFixed(6),
                             title: `${p.name.replace(/_/g, " ")}: ${fmt(p.v, 4)} s (${(100 * share).toFixed(1)} %)`,
                             style: `width:${(100 * share).toFixed(3)}%;background:${STACK_FILLS[p.k % STACK_FILLS.length]}` }));
    }
    const frac = daemonTotal(run, "goodput/fraction");
    const head = el("div", { class: "glabel", text: (multi() ? run.name + ": " : "") +
      `${frac == null ? "—" : (100 * frac).toFixed(1) + " %"} of ${fmt(wall, 4)} s was training` });
    const legend = el("div", { class: "glegend" }, ...parts.filter((p) => p.v > 0).map((p) =>
      el("span", {}, el("i", { style: `background:${STACK_FILLS[p.k % STACK_FILLS.length]}` }),
         `${p.name.replace(/_/g, " ")} ${(100 * p.v / wall).toFixed(1)} %`)));
    rows.push(el("div", { class: "grow", "data-run": run.name, "data-wall": String(wall),
                          "data-buckets": parts.map((p) => `${p.name}=${p.v}`).join("|") }, head, bar, legend));
  }
  box.replaceChildren(...rows);
  box.hidden = !rows.length;
}

// The run's config: its hello's `config` (else the hello itself), flattened to dotted keys, one
// column per run; a row whose values differ between runs is marked. Drawn once per load.
function flatten(obj, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(obj ?? {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) flatten(v, key, out);
    else out[key] = typeof v === "string" ? v : JSON.stringify(v);
  }
  return out;
}
function drawConfig() {
  const flat = state.order.map((id) => {
    const info = state.runs[id].config;
    return info && typeof info === "object" ? flatten(info.config && typeof info.config === "object" ? info.config : info) : {};
  });
  const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))].sort();
  const box = document.getElementById("config");
  box.hidden = keys.length === 0;
  document.getElementById("config-count").textContent = `(${keys.length} keys)`;
  document.getElementById("config-head").replaceChildren(multi() ?
    el("tr", {}, el("th", { text: "key" }), ...state.order.map((id) => el("th", { text: state.runs[id].name }))) : "");
  document.getElementById("config-rows").replaceChildren(...keys.map((k) => {
    const vals = flat.map((f) => f[k] ?? "");
    return el("tr", { class: multi() && new Set(vals).size > 1 ? "differs" : "", "data-key": k },
              el("th", { text: k }), ...vals.map((v) => el("td", { text: v })));
  }));
}

// The run's summary (run.summary[key] = value: W&B's last word on a run, e.g. best_bleu), its
// tags and notes (wandb.init(tags=..., notes=...), in its hello): under the tiles, a column per
// run. Rows carry data-key; the notes and tags data-run.
function drawRunInfo() {
  state.infoDirty = false;
  const keys = [...new Set(state.order.flatMap((id) => Object.keys(state.runs[id].summary)))]
    .sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  const wandbOf = (id) => { const w = state.runs[id].config?.wandb; return w && typeof w === "object" ? w : {}; };
  const about = [];
  for (const id of state.order) {
    const w = wandbOf(id);
    const who = multi() ? state.runs[id].name + ": " : "";
    const tags = Array.isArray(w.tags) ? w.tags.filter((t) => typeof t === "string") : [];
    if (tags.length) {
      about.push(el("div", { class: "tags", "data-run": state.runs[id].name }, who,
                    ...tags.map((t) => el("span", { class: "tag", text: t }))));
    }
    if (typeof w.notes === "string" && w.notes) {
      about.push(el("p", { class: "notes", "data-run": state.runs[id].name, text: who + w.notes }));
    }
  }
  const dropped = state.order.reduce((a, id) => a + state.runs[id].numSummaryDropped, 0);
  const show = (v) => (typeof v === "number" ? fmt(v, 6) : typeof v === "string" ? v : JSON.stringify(v));
  document.getElementById("run-about").replaceChildren(...about);
  document.getElementById("summary-count").textContent = `(${keys.length} keys)` +
    (dropped ? `; ${dropped.toLocaleString("en-US")} values of keys beyond the first ones kept not shown` : "");
  document.getElementById("summary-head").replaceChildren(multi() ?
    el("tr", {}, el("th", { text: "key" }), ...state.order.map((id) => el("th", { text: state.runs[id].name }))) : "");
  document.getElementById("summary-rows").replaceChildren(...keys.map((k) =>
    el("tr", { "data-key": k }, el("th", { text: k }),
       ...state.order.map((id) => el("td", { text: k in state.runs[id].summary ? show(state.runs[id].summary[k]) : "" })))));
  document.getElementById("summary-table").hidden = keys.length === 0;
  document.getElementById("run-info").hidden = keys.length === 0 && about.length === 0;
}

// -- media: what the daemon kept of the run's wandb.Image / Histogram / Table (/api/media) --------
// A card per run and key; its slider picks the step (it follows the newest until moved back).
const MEDIA_POLL_MS = 3000;
const TABLE_ROWS_SHOWN = 100;
const HEAT_ROWS = 200;                  // a histogram's steps drawn in its heat map, the newest
const media = { items: {}, total: {}, cards: {}, tables: {}, loading: false };

async function loadMedia() {
  if (media.loading || document.body.dataset.locked) return;
  media.loading = true;
  let changed = false, more = false;
  try {
    for (const id of state.order) {
      const since = media.total[id] ?? 0;
      const resp = await api(`/api/media?run=${encodeURIComponent(id)}&since=${since}`, { cache: "no-store" });
      if (!resp.ok) continue;
      const got = await resp.json();
      if (got.total === since) continue;
      const list = (media.items[id] ??= []);
      list.push(...got.items);
      if (got.forgotten) list.splice(0, Math.max(0, list.length - (got.total - got.forgotten)));
      media.total[id] = got.total;
      changed = true;
      more ||= got.more;                             // the rest, in answers of bounded size
    }
  } finally {
    media.loading = false;
  }
  if (changed) drawMedia();
  if (more) await loadMedia();
}

function mediaFile(runId, name) {
  return `/api/media/file?run=${encodeURIComponent(runId)}&name=${encodeURIComponent(name)}`;
}

// An image of the run is data: fetched with the page's credential (an <img src> could not send
// it), shown from a blob URL. A kept file never changes: the newest MEDIA_BLOBS_KEPT are kept.
const MEDIA_BLOBS_KEPT = 256;
const mediaBlobs = new Map();    // file URL -> Promise of its blob URL (or null: not readable)
function showImage(img, url) {
  let got = mediaBlobs.get(url);
  if (got) {
    mediaBlobs.delete(url);      // the newest again
  } else {
    got = api(url).then((r) => (r.ok ? r.blob() : null)).then((b) => (b ? URL.createObjectURL(b) : null), () => null);
    while (mediaBlobs.size >= MEDIA_BLOBS_KEPT) {
      const [oldest, blob] = mediaBlobs.entries().next().value;
      mediaBlobs.delete(oldest);
      blob.then((u) => u && URL.revokeObjectURL(u));
    }
  }
  mediaBlobs.set(url, got);
  got.then((u) => { if (u) img.src = u; });
}

function drawMedia() {
  const box = document.getElementById("media");
  const groups = new Map();          // "run|key" -> its entries, by step then rank
  for (const id of state.order) {
    for (const e of media.items[id] ?? []) {
      const g = `${id}|${e.key}`;
      if (!groups.has(g)) groups.set(g, { run: id, key: e.key, type: e.type, entries: [] });
      groups.get(g).entries.push(e);
    }
  }
  const cards = [];
  for (const [g, grp] of [...groups.entries()].sort((a, b) => a[1].key.localeCompare(b[1].key) || a[0].localeCompare(b[0]))) {
    grp.entries.sort((a, b) => a.step - b.step || (a.rank ?? 0) - (b.rank ?? 0));
    let card = media.cards[g];
    if (!card) card = media.cards[g] = makeMediaCard(grp);
    const n = grp.entries.length;
    const atEnd = card.pos === null || card.pos >= card.n - 1;
    card.grp = grp;
    card.n = n;
    card.slider.max = String(n - 1);
    if (atEnd) card.pos = n - 1;
    card.slider.value = String(card.pos);
    showMedia(card);
    cards.push(card.root);
  }
  document.getElementById("media-cards").replaceChildren(...cards);
  const total = [...groups.values()].reduce((a, grp) => a + grp.entries.length, 0);
  document.getElementById("media-count").textContent = `(${groups.size} keys, ${total} values)`;
  box.hidden = groups.size === 0;
}

function makeMediaCard(grp) {
  const title = el("h3", { text: (multi() ? state.runs[grp.run].name + " " : "") + grp.key });
  const body = el("div", { class: "mbody" });
  const slider = el("input", { type: "range", min: "0", max: "0", step: "1", value: "0",
                               "aria-label": `step of ${grp.key}` });
  const label = el("span", { class: "mlabel" });
  const root = el("div", { class: "mcard", "data-key": grp.key, "data-type": grp.type, "data-run": grp.run },
                  title, body, el("div", { class: "mstep" }, slider, label));
  const card = { root, body, slider, label, pos: null, n: 0, grp };
  slider.addEventListener("input", () => { card.pos = Number(slider.value); showMedia(card); syncMedia(card); });
  return card;
}

// Compared runs: moving one run's slider moves the other runs' cards of the same key to the same
// step (their last value at or before it), so the runs' images are compared step for step.
function syncMedia(moved) {
  const step = moved.grp.entries[moved.pos]?.step;
  if (step === undefined) return;
  for (const card of Object.values(media.cards)) {
    if (card === moved || card.grp.key !== moved.grp.key || card.grp.run === moved.grp.run) continue;
    let pos = -1;
    card.grp.entries.forEach((e, i) => { if (e.step <= step) pos = i; });
    card.pos = Math.max(0, pos);
    card.slider.value = String(card.pos);
    showMedia(card);
  }
}

function showMedia(card) {
  const e = card.grp.entries[card.pos];
  if (!e) return;
  card.root.dataset.step = String(e.step);
  card.label.textContent = `step ${e.step}` + (e.rank !== null && e.rank !== undefined ? ` · rank ${e.rank}` : "") +
    ` · ${card.pos + 1} of ${card.n}`;
  if (e.type === "Image") {
    card.body.replaceChildren(el("div", { class: "mimgs" }, ...e.images.map((im) => {
      const img = el("img", { alt: `${card.grp.key} at step ${e.step}`, width: String(Math.max(96, im.width)),
                              "data-file": im.file });
      showImage(img, mediaFile(card.grp.run, im.file));
      img.style.aspectRatio = `${im.width} / ${im.height}`;
      img.title = "click to enlarge";
      img.addEventListener("click", () => enlarge(img, im));
      return el("figure", {}, img, im.caption ? el("figcaption", { text: im.caption }) : "");
    })));
  } else if (e.type === "Histogram") {
    drawHistogram(card, e);
  } else if (e.type === "Table") {
    drawTable(card, e);
  }
}

// An image opened over the page, as large as the window allows (a 64x64 one scaled up, its pixels
// kept sharp); a click or Escape closes it.
function enlarge(img, im) {
  if (!img.src) return;
  const box = document.getElementById("lightbox");
  const big = box.querySelector("img");
  big.src = img.src;
  big.alt = img.alt;
  const scale = Math.min(0.9 * window.innerWidth / im.width, 0.85 * window.innerHeight / im.height);
  big.style.width = `${Math.round(im.width * scale)}px`;
  big.style.height = `${Math.round(im.height * scale)}px`;
  box.querySelector(".lcaption").textContent = `${img.alt} · ${im.width}×${im.height}` +
    (im.caption ? ` · ${im.caption}` : "");
  box.hidden = false;
}

// A histogram: the chosen step's bars over a heat map of the steps (newest at the bottom), each
// row's counts scaled to its own largest, on one value axis for all steps.
function drawHistogram(card, e) {
  let bars = card.body.querySelector("canvas.bars");
  let heat = card.body.querySelector("canvas.heat");
  if (!bars) {
    bars = el("canvas", { class: "bars", height: "120" });
    heat = el("canvas", { class: "heat", height: "120" });
    card.body.replaceChildren(bars, heat, el("div", { class: "dim mrange" }));
  }
  const rows = card.grp.entries.slice(-HEAT_ROWS);
  const lo = Math.min(...rows.map((r) => r.bins[0])), hi = Math.max(...rows.map((r) => r.bins[r.bins.length - 1]));
  const w = Math.max(200, Math.floor(card.root.clientWidth - 24) || 400);
  const xOfV = (v) => (hi > lo ? (v - lo) / (hi - lo) : 0.5) * w;
  bars.width = w; heat.width = w;
  card.body.querySelector(".mrange").textContent = `values ${fmt(lo)} … ${fmt(hi)}; ${e.counts.reduce((a, b) => a + b, 0)} counted at step ${e.step}`;
  const g = bars.getContext("2d");
  g.clearRect(0, 0, w, bars.height);
  const top = Math.max(...e.counts, 1);
  g.fillStyle = PALETTE[0];
  e.counts.forEach((c, i) => {
    const x0 = xOfV(e.bins[i]), x1 = xOfV(e.bins[i + 1]);
    const h = (c / top) * (bars.height - 4);
    g.fillRect(x0, bars.height - h, Math.max(1, x1 - x0 - 0.5), h);
  });
  const hg = heat.getContext("2d");
  hg.clearRect(0, 0, w, heat.height);
  const rh = heat.height / rows.length;
  rows.forEach((r, j) => {
    const m = Math.max(...r.counts, 1);
    r.counts.forEach((c, i) => {
      if (!c) return;
      hg.fillStyle = `rgba(37, 99, 235, ${(0.08 + 0.92 * c / m).toFixed(3)})`;
      const x0 = xOfV(r.bins[i]), x1 = xOfV(r.bins[i + 1]);
      hg.fillRect(x0, j * rh, Math.max(1, x1 - x0), Math.max(1, rh));
    });
    if (r === e) { hg.strokeStyle = "#dc2626"; hg.strokeRect(0.5, j * rh + 0.5, w - 1, Math.max(1, rh - 1)); }
  });
  card.root.dataset.counts = e.counts.join(",");
}

async function drawTable(card, e) {
  const url = mediaFile(card.grp.run, e.file);
  let doc = media.tables[url];
  if (!doc) {
    const resp = await api(url);
    if (!resp.ok) { card.body.replaceChildren(el("p", { class: "dim", text: "table not readable" })); return; }
    doc = media.tables[url] = await resp.json();
  }
  if (card.grp.entries[card.pos] !== e) return;       // the slider moved on while it loaded
  const cols = doc.columns ?? (doc.data[0] ?? []).map((_, i) => `${i}`);
  const cell = (v) => el("td", { text: typeof v === "string" ? v : JSON.stringify(v) });
  const shown = doc.data.slice(0, TABLE_ROWS_SHOWN);
  card.body.replaceChildren(el("div", { class: "mtable" }, el("table", {},
    el("thead", {}, el("tr", {}, ...cols.map((c) => el("th", { text: String(c) })))),
    el("tbody", {}, ...shown.map((row) => el("tr", {}, ...(Array.isArray(row) ? row : [row]).map(cell)))))),
    el("div", { class: "dim", text: doc.data.length > shown.length ? `first ${shown.length} of ${doc.data.length} rows` :
                                                                     `${doc.data.length} rows` }));
  card.root.dataset.rows = String(doc.data.length);
}

function redraw() {
  if (state.infoDirty) drawRunInfo();
  drawCharts();
  drawTiles();
  drawEvents();
  drawStatus();
  state.dirty = false;
}

// -- the page's credential ---------------------------------------------------------------------
// Never a cookie: a browser sends 127.0.0.1's cookies to every port of 127.0.0.1, another local
// user's server among them. The token in the page's address (#token=..., as `telemetry dashboard`
// prints it; ?token=... of older links) is exchanged once for the server's session key, which
// lives in this origin's localStorage (an origin includes the port: no other port's page reads
// it) and goes in the Authorization header of this page's own requests. The server makes a new
// key at each start, so a kept key dies with its server.
const SESSION_ITEM = "telemetry-dashboard-session";

function api(url, opts = {}) {
  const key = localStorage.getItem(SESSION_ITEM);
  const headers = key ? { ...(opts.headers ?? {}), Authorization: `Bearer ${key}` } : opts.headers;
  return fetch(url, { cache: "no-store", ...opts, headers });
}

// The token in the address, if any, taken out of it and exchanged; false if the server refused it.
async function login() {
  const token = new URLSearchParams(location.hash.slice(1)).get("token") ??
                new URLSearchParams(location.search).get("token");
  if (!token) return true;
  history.replaceState(null, "", location.pathname);
  const resp = await fetch("/api/session", { method: "POST", cache: "no-store",
                                             headers: { Authorization: `Bearer ${token}` } });
  if (!resp.ok) return false;
  const key = (await resp.json()).session;
  if (key) localStorage.setItem(SESSION_ITEM, key); else localStorage.removeItem(SESSION_ITEM);
  return true;
}

function lock(text) {
  const box = document.getElementById("status");
  box.textContent = text;
  box.className = "status down";
  document.body.dataset.locked = "1";
  if (state.stream) state.stream.abort();
  state.stream = null;
}
const NEEDS_TOKEN = "this dashboard needs its token: open the address `telemetry dashboard` printed (…/#token=…)";

// -- loading and the live stream ---------------------------------------------------------------
async function reload() {
  if (state.reloading) return;
  state.reloading = true;
  try {
    const resp = await api(`/api/data?width=${chartWidth()}`);
    if (resp.status === 403) {
      // No key, or one of an earlier start of the server: the address printed carries the token.
      localStorage.removeItem(SESSION_ITEM);
      lock(NEEDS_TOKEN);
      return;
    }
    delete document.body.dataset.locked;
    const data = await resp.json();
    state.loadedAt = Date.now();
    loadSnapshot(data);
    drawConfig();
    drawRunInfo();
    redraw();
    openStream();
    loadMedia();
  } finally {
    state.reloading = false;
  }
}

// The server-sent events of /api/stream, read with fetch (an EventSource cannot send the
// Authorization header). A stream that ends or fails is opened again after STREAM_RETRY_MS.
const STREAM_RETRY_MS = 2000;
async function openStream() {
  if (state.stream) state.stream.abort();
  const stream = new AbortController();
  state.stream = stream;
  try {
    const resp = await api(`/api/stream?since=${state.seq}&instance=${encodeURIComponent(state.instance)}`,
                           { signal: stream.signal });
    if (resp.status === 403) {
      localStorage.removeItem(SESSION_ITEM);
      lock(NEEDS_TOKEN);
      return;
    }
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "", reloading = false;
    while (!reloading) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let end;
      while (!reloading && (end = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        let name = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (state.stream !== stream) return;
        if (name === "changes") applyChanges(JSON.parse(data));
        else if (name === "status") applyStatus(JSON.parse(data).status);
        else if (name === "reload") reloading = true;
      }
    }
    if (reloading) await reload();      // which opens the next stream, unless it failed
  } catch (err) {
    if (stream.signal.aborted) return;
  }
  if (state.stream !== stream || document.body.dataset.locked) return;
  // The dashboard server itself went away (or restarts): say so, and try again.
  const box = document.getElementById("status");
  box.textContent = "dashboard server not reachable, retrying…";
  box.className = "status down";
  setTimeout(() => { if (state.stream === stream) openStream(); }, STREAM_RETRY_MS);
}

async function start() {
  const filter = document.getElementById("filter");
  filter.addEventListener("input", () => { state.filter = filter.value.trim().toLowerCase(); redraw(); });
  const xaxis = document.getElementById("xaxis");
  xaxis.addEventListener("change", () => {
    state.xTime = xaxis.value === "time";
    state.zoom = { step: null, time: null };    // a zoom in steps means nothing in time
    redraw();
  });
  const lightbox = document.getElementById("lightbox");
  lightbox.addEventListener("click", () => { lightbox.hidden = true; });
  window.addEventListener("keydown", (e) => { if (e.key === "Escape") lightbox.hidden = true; });
  // The System section's charts are drawn when it is first opened.
  document.getElementById("system").addEventListener("toggle", () => redraw());
  const logy = document.getElementById("logy");
  logy.addEventListener("change", () => { state.logY = logy.checked; redraw(); });
  const smooth = document.getElementById("smooth");
  smooth.addEventListener("input", () => {
    state.smooth = Math.min(0.99, Math.max(0, Number(smooth.value) || 0));
    document.getElementById("smooth-value").textContent = String(state.smooth);
    redraw();
  });
  // A token given to the page while it is open (the printed address pasted over a plain one).
  window.addEventListener("hashchange", async () => {
    if (!new URLSearchParams(location.hash.slice(1)).has("token")) return;
    if (await login()) reload(); else lock("wrong token: open the address `telemetry dashboard` printed");
  });
  if (await login()) await reload(); else lock("wrong token: open the address `telemetry dashboard` printed");
  document.body.dataset.ready = "1";
  setInterval(() => { if (state.dirty) redraw(); }, REDRAW_MS);
  setInterval(loadMedia, MEDIA_POLL_MS);
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const p of Object.values(state.plots)) {
        p.plot.setSize({ width: cardWidth(p.plot.root.closest(".card")), height: CHART_HEIGHT });
      }
    }, 150);
  });
}

start().catch((err) => {
  document.getElementById("status").textContent = "failed to load: " + err;
  document.body.dataset.error = String(err);
});

// #/suites (every suite, and the regressions found) and #/suites/<name> (its runs and each series
// as a line over time with every point's spread and the changes marked, drawn by the server).

import { getJSON } from "./api.js";
import { badge, bytes, chart, compareHref, h, ms, num, selectorText, short, table, when } from "./dom.js";

const expLink = (id) => (id == null ? "—" : h("a", { href: `#/experiments/${id}`, class: "exp-link" }, `#${id}`));
const ratio = (r) => (r == null ? "—" : `${Number(r).toFixed(3)}`);
const ci = (c) => (c.ci_low == null || c.ci_high == null ? "—" : `${Number(c.ci_low).toFixed(3)} – ${Number(c.ci_high).toFixed(3)}`);
// A change's before/after in its unit (SeriesChange.unit: ms, tokens/s or bytes); the exact value in the tooltip.
const valueText = (v, unit) => (v == null ? "—" : unit === "bytes" ? bytes(v)
  : unit === "tokens/s" ? `${num(v, 1)} tokens/s` : `${ms(v)} ${unit || ""}`.trim());
const beforeAfter = (c) => h("span",
  { title: c.before == null || c.after == null ? null : `${c.before} → ${c.after} ${c.unit}` },
  h("span", { class: "nowrap" }, `${valueText(c.before, c.unit)} →`), " ",
  h("span", { class: "nowrap" }, valueText(c.after, c.unit)));
const webhookText = (w) => (w ? `${w.state || "—"}${w.attempts ? ` (${w.attempts} tries)` : ""}` : "—");
const keyText = (k) => `${k.model_name || short(k.model_sha256)} · ${k.device_model} · SME2 ${k.sme2} · ${k.threads} thr`;

// A change links to both experiments and to their comparison.
function changeLinks(c) {
  return [expLink(c.baseline_experiment_id), " → ", expLink(c.experiment_id),
    c.baseline_experiment_id != null && c.experiment_id != null
      && [" ", h("a", { class: "compare-link small", href: compareHref(`E${c.baseline_experiment_id}`, `E${c.experiment_id}`) }, "compare")]];
}

function regressionsTable(regs) {
  return table(["Suite", "Series", "Change", "Ratio", "95% CI", "Status", "Experiments", "Webhook", "Detected"],
    regs.map((r) => h("tr", { dataset: { id: r.id, direction: r.direction } },
      h("td", {}, h("a", { href: `#/suites/${encodeURIComponent(r.suite)}` }, r.suite)),
      h("td", { class: "small" }, keyText(r.key)),
      h("td", {}, h("span", { class: `badge ${r.direction === "regression" ? "no" : "yes"}` }, r.direction),
        r.metric && r.metric !== "latency" && h("span", { class: "chip mono metric" }, r.metric),
        r.metric && r.metric !== "latency" && h("div", { class: "small values" }, beforeAfter(r)),
        r.sentence && h("div", { class: "muted small" }, r.sentence)),
      h("td", { class: "num" }, ratio(r.ratio)),
      h("td", { class: "num small" }, ci(r)),
      h("td", {}, badge(r.acknowledged ? "acknowledged" : r.status || "confirmed")),
      h("td", { class: "links" }, changeLinks(r)),
      h("td", { class: "small" }, webhookText(r.webhook),
        r.webhook?.last_error && h("div", { class: "alert small" }, r.webhook.last_error)),
      h("td", { class: "small" }, when(r.detected_at)))), { id: "regressions" });
}

export async function suitesView() {
  const [suites, regs] = await Promise.all([getJSON("/suites"), getJSON("/regressions?candidates=true")]);
  const rows = suites.map((s) => h("tr", { dataset: { name: s.name } },
    h("td", {}, h("a", { href: `#/suites/${encodeURIComponent(s.name)}` }, s.name), s.canary && h("span", { class: "chip" }, "canary")),
    h("td", { class: "small" }, s.models.map((m) => h("div", { title: m.sha256 }, m.name || short(m.sha256)))),
    h("td", { class: "small devices" }, selectorText(s.device?.selector)),
    h("td", {}, s.sme2), h("td", { class: "num" }, (s.threads || []).join(", ")),
    h("td", { class: "mono small" }, s.schedule),
    h("td", { class: "small" }, when(s.last_run_at)), h("td", { class: "small" }, when(s.next_run_at))));
  return {
    refresh: false,
    node: h("section", { id: "suites" },
      h("div", { class: "title" }, h("h1", {}, "Suites")),
      suites.length === 0
        ? h("p", { class: "card muted" }, "No suites yet: `sme2-client suite create NAME --model SHA256 ...` makes one.")
        : h("div", { class: "card flush" }, table(["Name", "Models", "Devices", "SME2", "Threads", "Schedule (UTC)", "Last run", "Next run"], rows, { id: "suite-list" })),
      h("h2", { class: "section" }, "Regressions and improvements"),
      regs.length === 0
        ? h("p", { class: "card muted", id: "no-regressions" }, "None detected.")
        : h("div", { class: "card flush" }, regressionsTable(regs))),
  };
}

// The latest point's memory: the program's planned bytes and weights, the runtime's allocation, peak RSS.
function memoryLine(s) {
  const m = [...s.points].reverse().find((p) => p.memory)?.memory;
  if (!m) return null;
  const parts = [["planned", m.planned_bytes], ["weights", m.weights_bytes],
    ["runtime allocated", m.runtime_allocated_bytes], ["peak RSS", m.peak_rss_bytes]].filter(([, v]) => v != null).map(([k, v]) => `${k} ${bytes(v)}`);
  return h("p", { class: "muted small series-memory" }, `Memory (latest): ${parts.join(" · ")}`);
}

// An LLM series: the latest point's phases (SeriesPoint.llm, medians over its generations). An
// emulated point has none (the API gives no speed figure for it), so nothing is shown for it.
function llmLine(s) {
  if (s.emulated) return null;
  const p = [...s.points].reverse().find((x) => x.llm);
  if (!p) return null;
  const l = p.llm;
  const tile = (label, key, digits, unit) => h("div",
    { class: `stat llm-${key}`, dataset: { value: l[key] ?? "" } },
    h("span", {}, label), h("b", {}, l[key] == null ? "—" : `${num(l[key], digits)} ${unit}`));
  return h("div", { class: "series-llm", dataset: { experiment: p.experiment_id ?? "" } },
    h("p", { class: "muted small" }, "LLM (latest point: ", when(p.at), ", ", expLink(p.experiment_id),
      `): prompt ${l.prompt ?? "?"} tokens, decode ${l.decode ?? "?"} tokens, ${l.generations} generation(s), medians`),
    h("div", { class: "stats llm-stats" }, tile("time to first token", "ttft_ms", 3, "ms"),
      tile("prefill", "prefill_tokens_per_s", 1, "tokens/s"), tile("decode", "decode_tokens_per_s", 1, "tokens/s")));
}

// The changes of the other metrics (Series.metric_changes): memory past the suite's memory threshold
// and an LLM's phases, each with its point, before → after in its unit, status and webhook delivery.
function metricChangesTable(s, hooks) {
  const changes = s.metric_changes || [];
  if (changes.length === 0) return null;
  return table(["Point", "Metric", "Change", "Before → after", "Ratio", "Status", "Webhook", "Experiments"],
    changes.map((c) => h("tr", { class: "metric-change",
      dataset: { id: c.id, metric: c.metric, unit: c.unit, direction: c.direction } },
      h("td", { class: "small point" }, c.point_index == null ? "—"
        : [h("span", { class: "num" }, c.point_index + 1),
          h("div", { class: "muted" }, when(s.points[c.point_index]?.at))]),
      h("td", { class: "mono small metric" }, c.metric),
      h("td", { class: "change" }, h("span", { class: `badge ${c.direction === "regression" ? "no" : "yes"}` }, c.direction),
        c.sentence && h("div", { class: "muted small" }, c.sentence)),
      h("td", { class: "num values" }, beforeAfter(c)),
      h("td", { class: "num" }, ratio(c.ratio)),
      h("td", { class: "status" }, badge(c.status)),
      h("td", { class: "small webhook" }, webhookText(hooks.get(c.id))),
      h("td", { class: "links" }, changeLinks(c)))), { class: "changes metric-changes" });
}

async function seriesCard(name, s, hooks) {
  const k = s.key;
  const q = new URLSearchParams({ model_sha256: k.model_sha256, device_model: k.device_model, sme2: k.sme2, threads: k.threads });
  const measured = s.points.filter((p) => p.median_ms != null).length;
  const fig = measured > 0 && await chart(`/suites/${encodeURIComponent(name)}/charts/series.svg?${q}`, "series");
  const last = s.points[s.points.length - 1];
  const why = (p) => p.device_state?.reason || p.reason || "no samples (no run of this point succeeded)";
  const latest = last && (last.median_ms == null
    ? h("p", { class: "muted small latest" }, "Latest: ", expLink(last.experiment_id),
      h("span", { class: "not-run" }, measured === 0 ? " · not run (why: above)" : ` · not run: ${why(last)}`))
    : h("p", { class: "muted small latest" }, "Latest: ", expLink(last.experiment_id),
      ` · ExecuTorch ${last.et_version || "?"} · runner ${last.runner || "?"}`));
  return h("article", { class: "card series",
    dataset: { model: k.model_sha256, device: k.device_model, sme2: k.sme2, threads: k.threads, points: s.points.length } },
    h("header", {}, h("h2", {}, k.model_name || short(k.model_sha256)),
      h("span", { class: "chip" }, k.device_model), h("span", { class: `chip sme2-${k.sme2}` }, `SME2 ${k.sme2}`),
      h("span", { class: "chip" }, `${k.threads} thread${k.threads > 1 ? "s" : ""}`),
      s.emulated && h("span", { class: "chip emulated" }, `emulated (${s.emulated})`),
      h("span", { class: "muted small" }, `${s.points.length} point${s.points.length === 1 ? "" : "s"}`
        + (measured < s.points.length ? `, ${measured} with samples` : ""))),
    s.emulated && h("p", { class: "note small emulated-note" }, `Emulated (${s.emulated}): these times are the emulator's, not a CPU's. `
      + "The series is drawn but never judged: no regression or improvement is raised from it."),
    fig,
    measured === 0 && s.points.length > 0 && h("div", { class: "no-samples" },
      h("p", { class: "note small" }, `No point of this series has samples yet: `
        + `${s.points.length === 1 ? "its run did" : "their runs did"} not measure anything.`),
      h("ul", { class: "point-reasons small" }, s.points.map((p) => h("li", { dataset: { experiment: p.experiment_id ?? "" } },
        h("span", { class: "muted" }, `${when(p.at)} `), expLink(p.experiment_id), `: not run: ${why(p)}`)))),
    latest,
    memoryLine(s),
    llmLine(s),
    (s.memory_changes || []).length > 0 && h("ul", { class: "memory-changes" }, s.memory_changes.map((c) =>
      h("li", { class: "memory-change alert small", dataset: { what: c.what, point: c.point_index } }, c.sentence))),
    s.changes.length > 0 && table(["Point", "Change", "Ratio", "95% CI", "Status", "Blamed", "Experiments"],
      s.changes.map((c) => h("tr", { class: "change", dataset: { id: c.id, direction: c.direction } },
        h("td", { class: "num" }, c.point_index == null ? "—" : c.point_index + 1),
        h("td", {}, h("span", { class: `badge ${c.direction === "regression" ? "no" : "yes"}` }, c.direction),
          c.sentence && h("div", { class: "muted small" }, c.sentence)),
        h("td", { class: "num" }, ratio(c.ratio)), h("td", { class: "num small" }, ci(c)),
        h("td", {}, badge(c.status)), h("td", {}, c.blamed || "—"),
        h("td", { class: "links" }, changeLinks(c)))), { class: "changes" }),
    metricChangesTable(s, hooks));
}

export async function suiteView({ name }) {
  const enc = encodeURIComponent(name);
  const [suite, data, regs] = await Promise.all([getJSON(`/suites/${enc}`), getJSON(`/suites/${enc}/series`),
    getJSON(`/regressions?suite=${enc}&candidates=true`)]);
  const hooks = new Map(regs.map((r) => [r.id, r.webhook]));  // each change's webhook delivery, by id
  const cards = await Promise.all(data.series.map((s) => seriesCard(suite.name, s, hooks)));
  const th = suite.thresholds || {};
  const running = (suite.runs || []).some((r) => r.status === "running" || r.status === "analyzing");
  return {
    refresh: running,
    node: h("section", { id: "suite", dataset: { name: suite.name } },
      h("div", { class: "title" }, h("h1", {}, `Suite ${suite.name}`), suite.canary && h("span", { class: "chip" }, "canary"),
        h("a", { class: "button ghost", href: "#/suites" }, "All suites")),
      h("div", { class: "card" }, h("dl", { class: "kv wide" },
        [["models", suite.models.map((m) => m.name || short(m.sha256)).join(", ")], ["devices", selectorText(suite.device?.selector)],
          ["SME2", suite.sme2], ["threads", (suite.threads || []).join(", ")], ["iterations", suite.iterations], ["sessions", suite.sessions],
          ["schedule", `${suite.schedule} (UTC)`], ["next run", when(suite.next_run_at)],
          ["min effect", th.min_effect == null ? "—" : `${(100 * th.min_effect).toFixed(1)}%`], ["alpha", th.alpha ?? "—"],
          ["memory threshold", th.memory == null ? "—" : `${(100 * th.memory).toFixed(1)}%`],
          ["webhook", suite.webhook || "none"]].map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))]))),
      h("h2", { class: "section" }, "Series"),
      cards.length ? cards : h("p", { class: "card muted", id: "no-series" }, "No points yet: the series appear once a run's experiments end."),
      h("h2", { class: "section" }, "Runs"),
      (suite.runs || []).length === 0 ? h("p", { class: "card muted" }, "Not run yet.")
        : h("div", { class: "card flush" }, table(["Run", "Triggered", "By", "Status", "Experiments"], suite.runs.map((r) => h("tr", { dataset: { id: r.id } },
          h("td", {}, `#${r.id}`), h("td", {}, when(r.triggered_at)), h("td", {}, r.trigger), h("td", {}, badge(r.status), r.reason && h("div", { class: "muted small" }, r.reason)),
          h("td", { class: "links" }, (r.experiment_ids || []).map((id, i) => [i ? ", " : "", expLink(id)])))), { id: "suite-runs" }))),
  };
}

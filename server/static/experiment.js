// One experiment: its spec, the charts (server-drawn SVG), the verdicts (SME2 off vs on, model
// A vs B) and every run's results.

import { ApiError, download, getJSON, post } from "./api.js";
import { badge, bytes, chart, compareHref, h, kv, ms, num, pct, short, table, when } from "./dom.js";
import { experimentArms, moduleCard } from "./modules.js";
import { ACTIVE } from "./views.js";

export const CATEGORIES = ["Convolution", "GEMM", "Data Movement", "Elementwise", "Other"];
const TOP_OPERATORS = 12;

const catClass = (c) => `cat-${CATEGORIES.indexOf(c)}`;

// A stacked bar of the five categories; `shares` are fractions of E2E.
function stackedBar(shares, label) {
  const total = CATEGORIES.reduce((s, c) => s + (shares[c] || 0), 0) || 1;
  return h("div", { class: "stack-row" },
    label && h("span", { class: "stack-label" }, label),
    h("div", { class: "stack", role: "img", "aria-label": `${label || ""} category shares` },
      CATEGORIES.map((c) => {
        const seg = h("span", { class: `seg ${catClass(c)}`, title: `${c}: ${pct(shares[c] || 0)}` });
        seg.style.width = `${(100 * (shares[c] || 0)) / total}%`;
        return seg;
      })));
}

function legend(values) {
  return h("ul", { class: "legend" }, CATEGORIES.map((c) => h("li", { dataset: { category: c } },
    h("span", { class: `swatch ${catClass(c)}` }), h("b", {}, c), " ", values(c))));
}

function categoriesBlock(run) {
  const cats = run.categories_ms;
  const total = CATEGORIES.reduce((s, c) => s + (cats[c] || 0), 0);
  const share = Object.fromEntries(CATEGORIES.map((c) => [c, total > 0 ? (cats[c] || 0) / total : 0]));
  return h("div", { class: "categories" },
    h("h3", {}, "Where the time goes"),
    stackedBar(share),
    legend((c) => h("span", { class: "muted" }, `${ms(cats[c])} ms · ${pct(share[c])}`)));
}

function e2eBlock(e) {
  const tile = (label, value, cls) => h("div", { class: `stat ${cls}`, dataset: { value: e[cls] } }, h("span", {}, label), h("b", {}, value));
  return h("div", { class: "stats" },
    tile("median", `${ms(e.median)} ms`, "median"),
    tile("mean", `${ms(e.mean)} ms`, "mean"),
    tile("p10", `${ms(e.p10)} ms`, "p10"),
    tile("p90", `${ms(e.p90)} ms`, "p90"),
    tile("CV", pct(e.cv), "cv"),
    tile("n", e.n, "n"));
}

// Kernel paths, as ingest computed them (analysis/kernel_paths.py, RunReport.kernel_paths): the
// path per category, SME2 coverage = the share of Convolution + GEMM time in SME2 kernels, the
// operators off SME2 and the flag. Runs analysed before kernel paths existed have none.
const kpClass = (p) => `kp kp-${String(p).replace(/[^A-Za-z0-9]+/g, "-").toLowerCase()}`;

export function kernelPaths(run) {
  const kp = run.kernel_paths;
  if (!kp || !kp.coverage) return null;
  const c = kp.coverage;
  return { byCategory: kp.by_category || {}, convGemm: c.conv_gemm_ms, sme2: c.sme2_ms, share: c.share,
    off: c.off_sme2 || [], flag: c.flag };
}

const coverageText = (share) => (share == null ? "no Convolution/GEMM time" : `${Math.round(100 * share)}%`);

function kernelPathsBlock(run) {
  const kp = kernelPaths(run);
  if (!kp) return null;
  return h("div", { class: "kernel-paths", dataset: { coverage: kp.share ?? "", flagged: kp.flag ? "yes" : "no" } },
    h("h3", {}, "Kernel paths ", h("span", { class: `badge ${kp.share > 0 ? "yes" : "neutral"} coverage` },
      `SME2 coverage ${coverageText(kp.share)}`)),
    h("p", { class: "muted small" }, `${ms(kp.sme2)} of ${ms(kp.convGemm)} ms of Convolution/GEMM per iteration ran in SME2 kernels `
      + "(from the XNNPACK operator names in the ETDump: packed-LHS PF16/PF32/PQS8/QP8 operators are KleidiAI SME/SME2, "
      + "the others NEON on Arm, native_call_* portable)."),
    kp.flag && h("p", { class: "alert flag", role: "alert" }, kp.flag),
    table(["Category", "Kernel paths (ms/iter)"], CATEGORIES.filter((c) => kp.byCategory[c]).map((c) => h("tr", { dataset: { category: c } },
      h("td", {}, h("span", { class: `swatch ${catClass(c)}` }), c),
      h("td", {}, Object.entries(kp.byCategory[c]).sort((a, b) => b[1] - a[1]).map(([p, v]) => h("span", { class: kpClass(p) }, `${p} ${ms(v)}`))))),
    { class: "kp-table" }),
    kp.off.length > 0 && h("details", { class: "off-sme2" }, h("summary", {}, `${kp.off.length} Convolution/GEMM operator type${kp.off.length > 1 ? "s" : ""} off SME2`),
      h("ul", { class: "small" }, kp.off.map((o) => h("li", {}, h("span", { class: "mono" }, o.name), ` · ${o.kernel_path} · ${ms(o.total_ms)} ms`)))));
}

function operatorsBlock(ops) {
  const top = ops.slice(0, TOP_OPERATORS);
  const portable = ops.filter((o) => !o.delegated).length;
  return h("div", {},
    h("h3", {}, "Top operators", ops.length > top.length && h("span", { class: "muted small" }, ` (${top.length} of ${ops.length})`)),
    portable > 0 && h("p", { class: "warn small" }, `${portable} portable (non-delegated) operator type${portable > 1 ? "s" : ""}: these ran outside XNNPACK, so SME2 cannot speed them up.`),
    table(["Operator", "Category", "Calls/iter", "ms/iter", "Share", "Kernel path", "Kernel"], top.map((o) => h("tr", { class: o.delegated ? "" : "portable" },
      h("td", { class: "mono" }, o.name, !o.delegated && h("span", { class: "badge portable-flag" }, "portable")),
      h("td", {}, h("span", { class: `swatch ${catClass(o.category)}` }), o.category),
      h("td", { class: "num" }, num(o.count, 1)),
      h("td", { class: "num" }, ms(o.total_ms)),
      h("td", { class: "num" }, pct(o.share)),
      h("td", { class: "kernel-path" }, o.kernel_path ? h("span", { class: kpClass(o.kernel_path) }, o.kernel_path) : "—"),
      h("td", { class: "small" }, o.kernel_hint || ""))), { class: "ops" }));
}

function kernelsBlock(k) {
  if (!k) return null;
  if (k.status !== "ok") return h("div", {}, h("h3", {}, "Kernel evidence"), h("p", { class: "muted small" }, `${k.status}: microkernel names come from a trace run (\`--mode trace\`): on an emulated device with any build, on hardware with the xnnlog runner flavour.`));
  const counts = Object.entries(k.isa_counts || {}).filter(([, n]) => n > 0).map(([isa, n]) => h("span", { class: `chip isa-${isa}` }, `${isa} ${n}`));
  return h("div", {},
    h("h3", {}, "Kernel evidence ", h("span", { class: `badge ${k.sme2_used ? "yes" : "no"}` }, k.sme2_used ? "SME2 kernels ran" : "no SME2 kernel")),
    h("div", { class: "chips" }, counts),
    h("details", {}, h("summary", {}, `${k.n_lines} log lines, microkernels by kind`),
      Object.entries(k.by_kind || {}).map(([kind, ks]) => h("div", { class: "small" }, h("b", {}, kind), ": ",
        ks.map((x, i) => [i ? ", " : "", h("span", { class: "mono" }, x.name), ` (${x.isa})`])))));
}

function stateBlock(state) {
  const show = (v) => (typeof v === "number" ? ms(v)
    : Array.isArray(v) ? v.map(show).join(", ")
      : typeof v === "object" && v !== null ? JSON.stringify(v) : String(v));
  const side = (label, obj) => h("div", {}, h("h4", {}, label), obj && Object.keys(obj).length
    ? kv(Object.entries(obj).map(([k, v]) => [k, h("span", { class: "mono small" }, show(v))]))
    : h("p", { class: "muted small" }, "not recorded"));
  return h("div", { class: "state" }, h("h3", {}, "Device state"),
    h("div", { class: "cols" }, side("Before", state.before), side("After", state.after)));
}

function artifactsBlock(run) {
  if (!run.artifacts.length) return null;
  const msg = h("span", { class: "alert small", hidden: true });
  return h("div", {}, h("h3", {}, "Artifacts"),
    h("div", { class: "artifacts" }, run.artifacts.map((name) => h("button", {
      type: "button", class: "ghost small", dataset: { artifact: name },
      onclick: () => download(run.id, name).catch((e) => { msg.textContent = e.message; msg.hidden = false; }),
    }, `⤓ ${name}`)), msg));
}

// Runs that could not be placed often share one long reason (every SME2-on run on a farm without
// SME2): said once, above the runs, with the runs it covers; each run card then points to it.
function unplacedGroups(runs) {
  const groups = new Map();
  for (const r of runs) {
    if (r.status === "unschedulable" && r.reason) groups.set(r.reason, [...(groups.get(r.reason) || []), r.id]);
  }
  return new Map([...groups].filter(([, ids]) => ids.length > 1));
}

function unplacedCard(groups) {
  if (!groups.size) return null;
  return h("div", { class: "card unplaced" }, h("h3", {}, "Could not run"),
    [...groups].map(([reason, ids]) => h("p", { class: "reason alert", dataset: { runs: ids.join(",") } },
      h("b", {}, `${ids.length} runs (${ids.map((i) => `#${i}`).join(", ")}): `), reason)));
}

function runCard(run, twoModels = false, grouped = new Map()) {
  const d = run.device;
  const r = run.runner;
  const problem = ["unschedulable", "failed", "cancelled"].includes(run.status);
  const emulator = d?.emulator;
  return h("article", { class: `card run ${problem ? "problem" : ""}`, id: `run-${run.id}`, dataset: { run: run.id, sme2: run.sme2, emulated: emulator ? "yes" : "no" } },
    h("header", {},
      h("h2", {}, `Run #${run.id}`),
      emulator && h("span", { class: "chip emulated", title: "an emulator executed this run: its times are the emulator's" }, `emulated (${emulator})`),
      twoModels && h("span", { class: "chip variant" }, `model ${run.variant || "A"}`),
      h("span", { class: `chip sme2-${run.sme2}` }, `SME2 ${run.sme2}`),
      h("span", { class: "chip" }, `${run.threads} thread${run.threads > 1 ? "s" : ""}`),
      badge(run.status),
      run.attempt > 1 && h("span", { class: "muted small" }, `attempt ${run.attempt}`)),
    run.reason && (grouped.has(run.reason)
      ? h("p", { class: "reason alert grouped" }, "Unschedulable: the reason is under “Could not run” above.")
      : h("p", { class: `reason ${problem ? "alert" : "note"}` }, run.reason)),
    h("div", { class: "cols three" },
      h("div", {}, h("h3", {}, "Device"), d ? kv([
        ["serial", h("span", { class: "mono" }, d.serial)],
        ["model", [d.model || "—", d.soc && h("span", { class: "muted" }, ` · ${d.soc}`)]],
        ["platform", `${d.platform} ${d.abi || ""}`],
        ["cores", d.cpu_cores || "—"],
        ["SME2", [h("span", { class: `badge ${d.sme2 ? "yes" : "no"}` }, d.sme2 ? "yes" : d.sme ? "no: SME, not SME2" : "no"), d.sme2_evidence && h("span", { class: "muted small" }, ` ${d.sme2_evidence}`)]],
        emulator && ["emulated", h("span", { class: "emulator" }, emulator)],
      ]) : h("p", { class: "muted" }, "not assigned")),
      h("div", {}, h("h3", {}, "Runner build"), r ? kv([
        ["id", h("span", { class: "mono runner-id" }, r.id)],
        ["flavour", `${r.flavour} · ${r.platform}`],
        ["ExecuTorch", `${r.executorch_version || "?"} ${r.executorch_commit ? `@ ${short(r.executorch_commit, 10)}` : ""}`],
        ["sha256", h("span", { class: "mono", title: r.sha256 }, short(r.sha256, 16))],
      ]) : h("p", { class: "muted" }, "none ran")),
      h("div", {}, h("h3", {}, "Timing"), kv([
        ["created", when(run.created_at)],
        ["started", when(run.started_at)],
        ["finished", when(run.finished_at)],
        ["runner wall", run.runner_wall_s == null ? "—" : `${num(run.runner_wall_s, 3)} s`],
        run.load_ms && ["load", Object.entries(run.load_ms).map(([k, v]) => `${k} ${ms(v)} ms`).join(", ")],
        run.memory && run.memory.peak_rss_bytes != null && [emulator ? "peak RSS (the emulator's)" : "peak RSS",
          h("span", { class: "peak-rss", title: run.memory.rss_source || "getrusage ru_maxrss" },
            bytes(run.memory.peak_rss_bytes))],
        run.memory && run.memory.runtime_allocated_bytes != null && ["runtime allocated",
          bytes(run.memory.runtime_allocated_bytes)],
      ]))),
    run.e2e_ms && [h("h3", {}, "End-to-end latency", emulator && h("span", { class: "badge emulated" }, "emulated")),
      emulator && h("p", { class: "note small emulated-note" }, `Emulated (${emulator}): these times are the emulator's, not a CPU's. `
        + "They show the run executed; they are no performance figure."),
      e2eBlock(run.e2e_ms)],
    run.categories_ms && categoriesBlock(run),
    llmBlock(run, emulator),
    kernelPathsBlock(run),
    run.operators && run.operators.length > 0 && operatorsBlock(run.operators),
    kernelsBlock(run.kernels),
    Object.keys(run.device_state || {}).length > 0 && stateBlock(run.device_state),
    artifactsBlock(run));
}

const VERDICT_CLASS = { speedup: "yes", slowdown: "no" };
// A ratio bound: two decimals, or an exponent when a near-empty category makes it astronomic.
const ratio = (v) => (v == null || !Number.isFinite(v) ? "—" : v >= 1000 || (v > 0 && v < 0.01) ? v.toExponential(1) : num(v, 2));

// An LLM run (RunReport.llm, analysis/llm.py): time to first token and prefill / decode tokens/s,
// each the median over generations with its 95% interval, and where each phase's time goes.
// Emulated: the emulator's times, so no speed figure; the phases' categories stay, labelled.
const llmFigure = (v, digits, unit) => (v?.median == null ? "—" : `${num(v.median, digits)} ${unit}`);
const llmInterval = (v, digits) => (v?.ci_low == null || v?.ci_high == null ? "no interval"
  : `95% CI ${num(v.ci_low, digits)} – ${num(v.ci_high, digits)}`);

function llmPhase(c, key, label) {
  if (!c) return null;
  const cell = (k) => h("span", { class: "muted", dataset: { ms: c.ms?.[k] ?? "" } },
    `${ms(c.ms?.[k])} ms · ${pct(c.share?.[k])}`);
  return h("div", { class: `llm-phase phase-${key}`, dataset: { phase: key } },
    stackedBar(c.share || {}, label), legend(cell));
}

export function llmBlock(run, emulator) {
  const l = run.llm;
  if (!l) return null;
  const tile = (label, key, digits, unit) => h("div", { class: `stat llm-${key}`,
    dataset: { value: l[key]?.median ?? "", ciLow: l[key]?.ci_low ?? "", ciHigh: l[key]?.ci_high ?? "" } },
  h("span", {}, label), h("b", {}, llmFigure(l[key], digits, unit)),
  h("span", { class: "muted small interval" }, llmInterval(l[key], digits)));
  const cats = l.categories || {};
  const speed = emulator
    ? h("p", { class: "note small emulated-note" }, `Emulated (${emulator}): no time to first token or `
      + "tokens/s: the emulator's times are no performance figure.")
    : h("div", { class: "stats llm-stats" }, tile("time to first token", "ttft_ms", 3, "ms"),
      tile("prefill", "prefill_tokens_per_s", 1, "tok/s"), tile("decode", "decode_tokens_per_s", 1, "tok/s"));
  return h("div", { class: "llm", dataset: { prompt: l.prompt ?? "", decode: l.decode ?? "",
    emulated: emulator ? "yes" : "no" } },
  h("h3", {}, "LLM: prefill and decode", emulator && h("span", { class: "badge emulated" }, "emulated")),
  h("p", { class: "muted small" }, `prompt ${l.prompt} tokens, decode ${l.decode} tokens, `
    + `${l.iterations} generation(s). Time to first token = the prefill call; tokens/s = tokens / the `
    + "phase's execute seconds (median over generations); decode categories are per token."),
  speed,
  llmPhase(cats.prefill, "prefill", "prefill"), llmPhase(cats.decode, "decode", "decode"),
  (l.warnings || []).map((w) => h("p", { class: "warn small" }, w)));
}

// A comparison's verdict per LLM phase (comparison.llm): prefill on the time to first token,
// decode on the ms per decoded token. Never for an emulated comparison.
function llmVerdictsBlock(c, la, lb) {
  const phases = Object.entries(c.llm || {});
  if (!phases.length) return null;
  const row = ([p, v]) => h("tr", { dataset: { phase: p, verdict: v.verdict || "" } },
    h("td", {}, p), h("td", { class: "small" }, v.metric),
    h("td", { class: "num" }, ms(v.baseline_ms)), h("td", { class: "num" }, ms(v.candidate_ms)),
    h("td", { class: "num ratio" }, v.speedup == null ? "—" : `${num(v.speedup, 2)}×`),
    h("td", { class: "num small" }, v.ci_low == null || v.ci_high == null ? "—"
      : `${ratio(v.ci_low)} – ${ratio(v.ci_high)}`),
    h("td", {}, h("span", { class: `badge verdict ${VERDICT_CLASS[v.verdict] || "neutral"}` },
      v.verdict || "no verdict")));
  return h("div", { class: "llm-verdicts" }, h("h4", {}, "LLM: verdict per phase"),
    table(["Phase", "Metric", `${la} ms`, `${lb} ms`, "Ratio", "95% CI", "Verdict"], phases.map(row),
      { class: "llm-verdict-table" }),
    phases.map(([p, v]) => v.sentence && h("p", { class: "small llm-sentence", dataset: { phase: p } }, v.sentence)));
}

// "95% CI 1.10 – 1.38", or why there is none (either bound may be null: insufficient data).
function interval(c) {
  const level = `${Math.round(100 * (c.ci_level || 0.95))}% CI`;
  return c.ci_low == null || c.ci_high == null ? `${level}: no interval` : `${level} ${num(c.ci_low, 3)} – ${num(c.ci_high, 3)}`;
}

// What the data would need for a verdict ("insufficient data" carries `needed`).
function neededBlock(needed) {
  if (!needed) return null;
  const parts = [];
  if (needed.sessions_per_arm != null) parts.push(`${needed.sessions_per_arm} interleaved session(s) per arm`);
  if (needed.iterations_per_session != null) parts.push(`${needed.iterations_per_session} iterations per session`);
  return h("p", { class: "needed note small", dataset: { sessions: needed.sessions_per_arm ?? "", iterations: needed.iterations_per_session ?? "" } },
    h("b", {}, "To decide: "), needed.why || (parts.length ? `about ${parts.join(", or ")}` : "no amount of data on this device would"), ".");
}

// The verdicts: the chart and a card per comparison. A summary report (above 2,000 runs) carries
// each comparison's headline (comparisons_detail "headline": no operators, narrative or outputs
// compared); "Show in full" pages the full ones in from GET /experiments/{id}/comparisons.
function verdictsSection(exp, verdicts, card) {
  const cards = h("div", { class: "comparison-cards" }, exp.comparisons.map(card));
  let note = null;
  if (exp.comparisons_detail === "headline") {
    const msg = h("span", { class: "muted small", role: "status" });
    const button = h("button", {
      type: "button", class: "ghost",
      onclick: async (e) => {
        e.target.disabled = true;
        msg.textContent = " loading…";
        try {
          const full = [];
          for (let page = 1; ; page++) {
            const got = await getJSON(`/experiments/${encodeURIComponent(exp.id)}/comparisons?page=${page}&page_size=200`);
            full.push(...got.items);
            if (!got.items.length || full.length >= got.total) break;
          }
          cards.replaceChildren(...full.map(card));
          note.remove();
        } catch (err) {
          msg.textContent = ` ${err.message}`;
          e.target.disabled = false;
        }
      },
    }, "Show in full");
    note = h("p", { class: "note small headline-note" },
      `${exp.comparisons.length} comparisons as headlines (the verdict, its interval and the categories'): `
      + "per-operator verdicts, the narrative and the outputs compared are in the full ones. ", button, msg);
  }
  return h("section", { class: "verdicts", id: "verdicts" },
    h("div", { class: "card" }, h("h3", {}, "Verdicts"), verdicts, note), cards);
}

// One verdict: SME2 off→on (kind "sme2", per model variant) or model A→B (kind "model", per
// SME2 arm) of an experiment, or a matched pair of GET /comparisons (`where` chips given).
export function comparisonCard(c, { where } = {}) {
  const [la, lb] = c.labels || (c.kind === "model" ? ["model A", "model B"] : ["SME2 off", "SME2 on"]);
  const short = c.kind === "model" ? ["A", "B"] : c.kind === "sme2" || !c.kind ? ["off", "on"] : ["base", "cand"];
  const title = c.kind === "model" ? "Model A vs B" : c.kind === "sme2" ? "SME2 off vs on" : `${la} vs ${lb}`;
  const head = h("header", {}, h("h2", {}, title),
    c.kind === "model" && h("span", { class: `chip sme2-${c.sme2}` }, `SME2 ${c.sme2}`),
    c.kind === "model" && c.a_a && h("span", { class: "chip" }, "A/A: the same model"),
    c.kind === "sme2" && c.variant && c.variant !== "A" && h("span", { class: "chip" }, `model ${c.variant}`),
    where || [h("span", { class: "chip" }, c.device || c.device_model || "any device"),
      h("span", { class: "chip" }, `${c.threads} thread${c.threads > 1 ? "s" : ""}`)],
    c.status !== "complete" && badge("incomplete"));
  const attrs = { kind: c.kind || "sme2", verdict: c.verdict || "" };
  if (c.status !== "complete") {
    return h("article", { class: "card comparison incomplete", dataset: attrs }, head,
      h("p", { class: "reason alert" }, c.reason || "one arm has no successful run"));
  }
  const facts = [coverageBlock(c, la, lb), numericsBlock(c),
    c.memory?.sentence && h("p", { class: "small memory-compared" }, c.memory.sentence)];
  // the narrative without what the headline and the numerics block already say
  const told = new Set([c.sentence, c.numerics?.sentence]);
  const lines = (c.narrative || []).filter((line) => !told.has(line));
  const narrative = lines.length > 0 && h("ul", { class: "narrative" }, lines.map((line) => h("li", {}, line)));
  if (c.emulated || c.verdict === "emulated") {
    // An emulator's timings: no ratio, interval, bars or per-category speed, whatever the entry holds.
    return h("article", { class: "card comparison emulated", dataset: { ...attrs, emulated: "yes" } }, head,
      h("div", { class: "headline" },
        h("span", { class: "badge verdict emulated" }, "emulated"),
        h("div", { class: "muted small" }, `${c.emulator ? `emulator ${c.emulator} · ` : ""}n ${(c.n || []).join(" / ")} · no speed verdict`)),
      h("p", { class: "sentence" }, c.sentence || "Emulated: timings measure the emulator, not a CPU: no speed verdict."),
      facts, narrative);
  }
  const cats = c.categories || {};
  const before = Object.fromEntries(CATEGORIES.map((k) => [k, cats[k]?.share_before || 0]));
  const after = Object.fromEntries(CATEGORIES.map((k) => [k, cats[k]?.share_after || 0]));
  const sessions = (c.sessions || []).length ? ` · sessions ${(c.sessions || []).join(" / ")}` : "";
  return h("article", { class: "card comparison", dataset: attrs }, head,
    h("div", { class: "headline" },
      h("div", { class: "speedup", dataset: { value: c.speedup ?? "" } }, c.speedup == null ? "—" : `${num(c.speedup, 2)}×`),
      h("div", {},
        h("span", { class: `badge verdict ${VERDICT_CLASS[c.verdict] || "neutral"}` }, c.verdict || "no verdict"),
        h("div", { class: "muted interval" }, interval(c)),
        h("div", { class: "muted small" }, `median ${ms(c.baseline_median_ms)} → ${ms(c.candidate_median_ms)} ms · n ${(c.n || []).join(" / ")}${sessions}`,
          c.min_effect != null && ` · minimum effect ${pct(c.min_effect)}`))),
    c.sentence && h("p", { class: "sentence" }, c.sentence),
    c.verdict === "insufficient data" && neededBlock(c.needed),
    h("div", { class: "bars" }, stackedBar(before, short[0]), stackedBar(after, short[1])),
    table(["Category", `${la} ms`, `${lb} ms`, "Ratio", "95% CI", "Verdict", `Share ${short[0]}`, `Share ${short[1]}`], CATEGORIES.map((k) => {
      const e = cats[k] || {};
      return h("tr", { dataset: { category: k } }, h("td", {}, h("span", { class: `swatch ${catClass(k)}` }), k),
        h("td", { class: "num" }, ms(e.baseline_ms)), h("td", { class: "num" }, ms(e.candidate_ms)),
        h("td", { class: "num" }, e.speedup == null ? "—" : `${num(e.speedup, 2)}×`),
        h("td", { class: "num small" }, e.ci_low == null || e.ci_high == null ? "—" : `${ratio(e.ci_low)} – ${ratio(e.ci_high)}`),
        h("td", { class: "small" }, e.verdict || "—"),
        h("td", { class: "num" }, pct(e.share_before)), h("td", { class: "num" }, pct(e.share_after)));
    }), { class: "cmp" }),
    llmVerdictsBlock(c, la, lb), facts, narrative);
}

// Per-arm SME2 coverage of a comparison ({baseline, candidate}: share, sme2_ms, conv_gemm_ms).
function coverageBlock(c, la, lb) {
  const kp = c.kernel_paths;
  if (!kp) return null;
  const arm = (label, v, which) => h("div", { class: "arm", dataset: { arm: which, share: v?.share ?? "" } }, h("b", {}, label), " ",
    !v ? h("span", { class: "muted" }, "not recorded")
      : [h("span", { class: `badge ${v.share > 0 ? "yes" : "neutral"}` }, coverageText(v.share)),
        v.share != null && h("span", { class: "muted small" }, ` ${ms(v.sme2_ms)} of ${ms(v.conv_gemm_ms)} ms`)]);
  return h("div", { class: "coverage-pair" }, h("h4", {}, "SME2 coverage of Convolution/GEMM"),
    h("div", { class: "cols" }, arm(la, kp.baseline, "baseline"), arm(lb, kp.candidate, "candidate")));
}

const NUMERICS_CLASS = { "same within tolerance": "yes", "numerics change": "no" };
const g3 = (v) => (v == null || !Number.isFinite(v) ? "—" : Number(v.toPrecision(3)).toString());

// The arms' outputs compared: status, sentence, one row per output.
function numericsBlock(c) {
  const n = c.numerics;
  if (!n) return null;
  return h("div", { class: "numerics", dataset: { status: n.status || "", verdict: n.verdict || "" } },
    h("h4", {}, "Outputs compared ", h("span", { class: `badge ${NUMERICS_CLASS[n.verdict] || "neutral"}` }, n.verdict || n.status || "not recorded")),
    n.sentence && h("p", { class: "small" }, n.sentence),
    (n.outputs || []).length > 0 && table(["Output", "dtype", "shape", "max abs", "max rel", "SNR dB", "within tolerance"],
      n.outputs.map((o) => h("tr", { class: o.within_tolerance ? "" : "out-of-tolerance" },
        h("td", { class: "num" }, o.index), h("td", {}, o.dtype), h("td", { class: "mono small" }, (o.shape || []).join("×") || "scalar"),
        h("td", { class: "num" }, g3(o.max_abs)), h("td", { class: "num" }, g3(o.max_rel)),
        h("td", { class: "num" }, o.snr_db == null ? (o.max_abs === 0 ? "∞" : "—") : g3(o.snr_db)),
        h("td", {}, h("span", { class: `badge ${o.within_tolerance ? "yes" : "no"}` }, o.within_tolerance ? "yes" : "no")))),
      { class: "numerics-table" }));
}

// What the program asks of memory before it runs (ExperimentReport.program_memory, from the .pte).
function programMemory(m) {
  const arenas = m.arenas.length;
  return h("span", { class: "program-memory", dataset: { planned: m.planned_bytes, weights: m.weights_bytes },
    title: `arenas: ${m.arenas.map(bytes).join(", ") || "none"}; constants ${bytes(m.constant_bytes)}, delegate blobs `
      + `${bytes(m.delegate_bytes)}, named data ${bytes(m.named_data_bytes)}, mutable ${bytes(m.mutable_bytes)}` },
  `${bytes(m.planned_bytes)} planned in ${arenas} arena${arenas === 1 ? "" : "s"} · weights ${bytes(m.weights_bytes)}`);
}

// Thread and core scaling (GET /experiments/{id}/scaling, ?with= joining other experiments of the
// same model): the chart (one series per device x core mask x SME2 setting; emulated devices are
// named, not drawn), then per device its table and what the view says in words. Emulated: the
// words only. The form joins experiments (the page's #/experiments/ID?with=13,14); a bad list
// gets the server's 4xx, said in the card.
function scalingCard(exp, joined, view, svg, error) {
  const f = (v, d = 2) => (v == null ? "—" : Number(v).toFixed(d));
  const input = h("input", { id: "scaling-with", name: "with", value: joined || "", placeholder: "13,14", size: 14,
    title: "other experiments of the same model, e.g. one per --core-mask" });
  const form = h("form", { class: "scaling-with small", onsubmit: (e) => {
    e.preventDefault();
    const w = input.value.trim();
    location.hash = `#/experiments/${encodeURIComponent(exp.id)}${w ? `?${new URLSearchParams({ with: w })}` : ""}`;
  } }, h("label", { for: "scaling-with" }, "Join experiments "), input, " ",
  h("button", { type: "submit", class: "ghost" }, "Join"));
  return h("div", { class: "card scaling", id: "scaling", dataset: { with: (view?.joined || []).join(",") } },
    h("h3", {}, "Thread scaling"), form, error && h("p", { class: "alert small scaling-error" }, error), svg,
    (view?.devices || []).map((d) => h("div", { class: "scaling-device", dataset: { emulated: d.emulated ? "yes" : "no" } },
      h("h4", {}, `${d.device || "?"}`, h("span", { class: "muted" }, ` · ${d.device_model || ""}`)),
      !d.emulated && table(["Arm", "Threads", "Median ms", "Speedup", "95% interval", "Efficiency"],
        d.arms.flatMap((a) => a.points.map((p) => h("tr", { class: p.threads === a.enough_threads ? "enough" : "" },
          h("td", {}, a.name), h("td", { class: "num" }, p.threads), h("td", { class: "num" }, ms(p.median_ms)),
          h("td", { class: "num" }, p.speedup ? `${f(p.speedup.estimate)}×` : "—"),
          h("td", { class: "num" }, p.speedup ? `${f(p.speedup.ci_low)}–${f(p.speedup.ci_high)}` : "—"),
          h("td", { class: "num" }, p.efficiency ? pct(p.efficiency.estimate) : "—"))))),
      d.sentences.map((t) => h("p", { class: "small scaling-sentence" }, t)))),
    (view?.sentences || []).map((t) => h("p", { class: "muted small" }, t)));
}

// How many runs are in each status: from the runs, or from a summary's run groups (runs_detail
// summary, the default above 2,000 runs: no runs in the answer, their aggregates instead).
function statusCounts(exp) {
  const counts = {};
  if (exp.runs_detail === "summary") {
    for (const g of exp.run_groups || []) {
      for (const [st, n] of Object.entries(g.runs_by_status || {})) counts[st] = (counts[st] || 0) + n;
    }
  } else {
    for (const r of exp.runs) counts[r.status] = (counts[r.status] || 0) + 1;
  }
  return counts;
}

// A summary's runs: one row per variant x SME2 arm x device x threads x mode, each run a page away.
function runGroupsCard(exp) {
  return h("div", { class: "card run-groups" },
    h("h3", {}, `${exp.runs_total} runs, summarised`),  // (CSS upper-cases h3)
    h("p", { class: "muted small" }, "Too many runs to list here: their aggregates per arm, device and thread count. "
      + `The runs themselves: GET /experiments/${exp.id}?runs=page&run_page=N (200 a page).`),
    table(["Model", "SME2", "Device", "Threads", "Mode", "Runs", "By status", "E2E median ms (min–max)", "CV"],
      (exp.run_groups || []).map((g) => h("tr", {},
        h("td", {}, g.variant), h("td", {}, g.sme2),
        h("td", {}, g.device || "—", g.emulator && h("span", { class: "chip emulated",
          title: "an emulator executed these runs: their times are the emulator's, not a CPU's" }, `emulated (${g.emulator})`)),
        h("td", { class: "num" }, g.threads),
        h("td", {}, g.mode), h("td", { class: "num" }, g.runs),
        h("td", {}, Object.entries(g.runs_by_status || {}).map(([st, n]) => `${n} ${st}`).join(", ")),
        h("td", { class: "num" }, `${ms(g.e2e_median_ms)} (${ms(g.e2e_min_ms)}–${ms(g.e2e_max_ms)})`),
        h("td", { class: "num" }, pct(g.e2e_cv))))));
}

export async function experimentView({ id, with: joined }) {
  const exp = await getJSON(`/experiments/${encodeURIComponent(id)}`);
  const s = exp.spec;
  const counts = statusCounts(exp);
  const running = Object.entries(counts).some(([st, n]) => n > 0 && ACTIVE.has(st));
  const cancelMsg = h("span", { class: "alert small", hidden: true });
  const cancel = running && h("button", {
    type: "button", class: "ghost",
    onclick: async (e) => {
      e.target.disabled = true;
      try { await post(`/experiments/${exp.id}/cancel`); window.dispatchEvent(new HashChangeEvent("hashchange")); } catch (err) {
        if (err instanceof ApiError) { cancelMsg.textContent = err.message; cancelMsg.hidden = false; }
      }
    },
  }, "Cancel");
  const base = `/experiments/${encodeURIComponent(exp.id)}/charts`;
  const measured = (counts.succeeded || 0) > 0;
  const [distribution, categories, verdicts] = await Promise.all([
    measured && chart(`${base}/distribution.svg`, "distribution"),
    measured && chart(`${base}/categories.svg`, "categories"),
    exp.comparisons.length > 0 && chart(`${base}/verdicts.svg`, "verdicts"),
  ]);
  const join = (joined || "").trim();
  const scales = (measured && (s.threads.length > 1 || s.core_mask)) || join;
  const withQuery = join ? `?${new URLSearchParams({ with: join })}` : "";
  let scalingError = null;
  const [scaling, scalingChart] = scales ? await Promise.all([
    getJSON(`/experiments/${encodeURIComponent(exp.id)}/scaling${withQuery}`)
      .catch((e) => { scalingError = e.message; return null; }),
    chart(`${base}/scaling.svg${withQuery}`, "scaling"),
  ]) : [null, null];
  const grouped = unplacedGroups(exp.runs);
  const device = s.device ? Object.entries(s.device).filter(([, v]) => v != null && !(Array.isArray(v) && !v.length)).map(([k, v]) => `${k}=${v}`).join(", ") : "";
  return {
    refresh: running,
    node: h("section", { id: "experiment", dataset: { id: exp.id } },
      h("div", { class: "title" },
        h("h1", {}, `Experiment #${exp.id}`, exp.name && h("span", { class: "muted" }, ` · ${exp.name}`)),
        badge(exp.status), running && h("span", { class: "muted live" }, "auto-refreshing"), cancel, cancelMsg,
        h("a", { class: "button ghost compare-link", href: exp.vs_model_sha256 ? compareHref(`E${exp.id}`, `E${exp.id}/B`) : compareHref(`E${exp.id}`),
          title: exp.vs_model_sha256 ? `model A vs model B of experiment ${exp.id} (change either side)` : "compare with another experiment or run" }, "Compare with…")),
      h("div", { class: "card spec" }, kv([
        ["SME2", s.sme2], ["threads", s.threads.join(", ")], ["iterations", `${s.iterations} (+${s.warmup} warm-up)`],
        exp.imported && ["measured", h("span", { class: "imported", title: `kit experiments: ${exp.imported.experiments.join(", ")}` },
          `${exp.imported.note} (${exp.imported.source}, device ${exp.imported.device})`)],
        ["mode", s.mode], ["sessions", s.sessions], ["power", s.power_profile],
        s.core_mask && ["core mask", s.core_mask], device && ["devices", device],
        ["model", h("span", { class: "mono", title: exp.model_sha256 }, `${short(exp.model_sha256, 16)} · ${(exp.model_size / 1024).toFixed(1)} KiB`)],
        exp.vs_model_sha256 && ["vs model (B)", h("span", { class: "mono", title: exp.vs_model_sha256 },
          exp.vs_model_sha256 === exp.model_sha256 ? "the same model (A/A)" : `${short(exp.vs_model_sha256, 16)}${exp.vs_model_size ? ` · ${(exp.vs_model_size / 1024).toFixed(1)} KiB` : ""}`)],
        exp.program_memory && ["planned memory", programMemory(exp.program_memory)],
        exp.vs_program_memory && ["planned memory (B)", programMemory(exp.vs_program_memory)],
        ["method", s.method || "forward"],
        ["inputs", h("span", { title: exp.inputs_sha256 || "" }, exp.inputs || "all ones (default)")],
        ["created", when(exp.created_at)],
        ...Object.entries(exp.labels || {}).map(([k, v]) => [`label ${k}`, v]),
      ], { class: "kv wide" })),
      (exp.warnings || []).length > 0 && h("div", { class: "card warnings" },
        exp.warnings.map((w) => h("p", { class: "reason note" }, w))),
      unplacedCard(grouped),
      measured && h("div", { class: "card charts" }, h("h3", {}, "Latency and where the time goes, per arm"),
        h("div", { class: "cols" }, distribution, categories)),
      measured && moduleCard(experimentArms(exp)),
      scales && scalingCard(exp, join, scaling, scalingChart, scalingError),
      exp.comparisons.length > 0 && verdictsSection(exp, verdicts, (c) => comparisonCard(grouped.size && c.reason
        ? { ...c, reason: [...grouped.keys()].reduce((text, r) => text.split(r).join("the reason under “Could not run” above"), c.reason) }
        : c)),
      exp.runs_detail === "summary" && runGroupsCard(exp),
      exp.runs.map((r) => runCard(r, Boolean(exp.vs_model_sha256), grouped))),
  };
}

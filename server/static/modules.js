// Time by module (the runs' by_module, by_source and attribution, from the model's ETRecord): an
// icicle per arm, the top-level modules across, each module's children under it, widths in ms per
// iteration. An emulated arm shows which kernel path each module's matrix work ran, never a time.
// Without an ETRecord (or with another model's) no module is named: one line says why, once.

import { h, ms, pct } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const SHOWN = new Set(["attributed", "ambiguous"]);
const REST = "not attributed";
const TOP_LEVEL = "(top level)"; // the model's own forward's operators, outside any submodule
const WIDTH = 960;
const ROW = 24;
const MAX_DEPTH = 5;
const CHAR_PX = 6.6; // 11px sans-serif, a wide character: a label that fits this never overflows
const HUES = [212, 28, 140, 280, 355, 190, 48, 100];

const shown = (run) => SHOWN.has(run.attribution?.status);

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v != null) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c != null) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// A label that fits `px`: the full name, else its last part, else that part cut with "…", else none
// (the full name is always in the cell's <title>). A bare index (a Sequential's child, `entry.0`)
// names nothing alone: its parent's part goes with it.
export function fitLabel(name, px) {
  const room = Math.floor((px - 6) / CHAR_PX);
  if (name.length <= room) return name;
  const parts = name.split(".");
  const last = parts.length > 1 && /^\d+$/.test(parts[parts.length - 1]) ? parts.slice(-2).join(".") : parts.pop();
  if (last.length <= room) return last;
  return room >= 3 ? `${last.slice(0, room - 1)}…` : "";
}

const pattern = (m) => m.replace(/(^|\.)\d+(?=\.|$)/g, "$1*");

// One arm's runs as one: each module's ms and share the mean over the runs that name modules.
function mergedRows(runs) {
  const named = runs.filter(shown);
  const acc = new Map();
  for (const r of named) {
    for (const row of r.by_module || []) {
      const key = `${row.depth}\u0000${row.module}`;
      const a = acc.get(key) || { module: row.module, depth: row.depth, ms: 0, share: 0 };
      a.ms += (row.ms || 0) / named.length;
      a.share += (row.share || 0) / named.length;
      acc.set(key, a);
    }
  }
  return [...acc.values()];
}

// The cells of an icicle: {module, depth, ms, share, x0, x1} with x in [0, 1] of the arm's E2E.
export function icicleCells(rows) {
  const rest = rows.filter((r) => r.module === REST);
  const mods = rows.filter((r) => r.module && r.module !== REST && r.depth >= 1 && r.depth <= MAX_DEPTH);
  const root = rows.find((r) => r.module === "" && !r.depth);
  const top = mods.filter((r) => r.depth === 1).reduce((s, r) => s + r.ms, 0);
  if (root && root.ms - top > 1e-9) {
    mods.push({ module: TOP_LEVEL, depth: 1, ms: root.ms - top, share: root.share ? (root.share * (root.ms - top)) / root.ms : null });
  }
  const total = mods.filter((r) => r.depth === 1).reduce((s, r) => s + r.ms, 0) + rest.reduce((s, r) => s + r.ms, 0);
  if (!(total > 0)) return [];
  const atDepth = new Map();
  for (const r of mods) atDepth.set(r.depth, [...(atDepth.get(r.depth) || []), r]);
  const parentOf = (r) => {
    const ups = new Set((atDepth.get(r.depth - 1) || []).map((u) => u.module));
    const parts = r.module.split(".");
    for (let i = parts.length - 1; i > 0; i -= 1) if (ups.has(parts.slice(0, i).join("."))) return parts.slice(0, i).join(".");
    return null;
  };
  const kids = new Map();
  for (const r of mods) {
    const p = r.depth === 1 ? "" : parentOf(r);
    if (p != null) kids.set(p, [...(kids.get(p) || []), r]);
  }
  const cells = [];
  const place = (parent, x0, hue) => {
    let x = x0;
    for (const [i, r] of (kids.get(parent) || []).sort((a, b) => b.ms - a.ms).entries()) {
      const w = r.ms / total;
      const h0 = parent === "" ? HUES[i % HUES.length] : hue;
      cells.push({ ...r, x0: x, x1: x + w, hue: h0 });
      place(r.module, x, h0);
      x += w;
    }
    return x;
  };
  const end = place("", 0, 0);
  for (const r of rest) cells.push({ ...r, depth: 1, x0: end, x1: end + r.ms / total, hue: null });
  return cells;
}

function icicle(label, rows, title) {
  const cells = icicleCells(rows);
  const depth = Math.max(1, ...cells.map((c) => c.depth));
  const height = depth * ROW + 2;
  return svg("svg", { viewBox: `0 0 ${WIDTH} ${height}`, width: WIDTH, height, role: "img", class: "icicle",
    "aria-label": `${label}: time by module` },
  svg("title", {}, title),
  cells.map((c) => {
    const x = c.x0 * WIDTH;
    const w = Math.max((c.x1 - c.x0) * WIDTH, 0);
    const y = (c.depth - 1) * ROW;
    const text = fitLabel(c.module, w);
    const fill = c.hue == null ? "#d9dce3" : `hsl(${c.hue} 60% ${Math.min(52 + 9 * (c.depth - 1), 86)}%)`;
    return svg("g", { class: "cell", "data-module": c.module, "data-depth": c.depth, "data-ms": c.ms },
      svg("title", {}, `${c.module}: ${ms(c.ms)} ms per iteration, ${pct(c.share)} of E2E`),
      svg("rect", { x: x.toFixed(2), y, width: Math.max(w - 1, 0).toFixed(2), height: ROW - 2, rx: 2, fill }),
      text && svg("text", { x: (x + 3).toFixed(2), y: y + ROW / 2 + 2, "font-size": 11, "dominant-baseline": "middle",
        fill: c.depth > 2 || c.hue == null ? "#1d2330" : "#fff" }, text));
  }));
}

// The kernel paths each module's Convolution/GEMM operators ran (an emulated arm: no time).
function kernelPathTable(runs) {
  const run = runs.find(shown);
  const paths = new Map();
  for (const r of run?.by_source || []) {
    if (!r.module || !["Convolution", "GEMM"].includes(r.category)) continue;
    const m = pattern(r.module);
    const set = paths.get(m) || new Set();
    set.add(r.kernel_path || "unknown");
    paths.set(m, set);
  }
  if (!paths.size) return h("p", { class: "muted small" }, "No Convolution/GEMM operator attributed to a module.");
  const kp = (p) => `kp kp-${String(p).replace(/[^A-Za-z0-9]+/g, "-").toLowerCase()}`;
  return h("table", { class: "module-paths" },
    h("thead", {}, h("tr", {}, h("th", {}, "Module"), h("th", {}, "Kernel paths (Convolution/GEMM)"))),
    h("tbody", {}, [...paths].map(([m, set]) => h("tr", { dataset: { module: m } },
      h("td", { class: "mono" }, m), h("td", {}, [...set].map((p) => h("span", { class: kp(p) }, p)))))));
}

function whyNone(runs) {
  const statuses = new Set(runs.map((r) => r.attribution?.status).filter(Boolean));
  if (statuses.has("mismatch")) {
    return "Time by module: the ETRecord does not belong to this model (mismatch), so it was not used and no module is named.";
  }
  if (statuses.has("no etrecord")) {
    return "Time by module: no ETRecord, so no module is named; export one with to_edge_transform_and_lower(..., "
      + "generate_etrecord=True), then get_etrecord().save(\"<model>.pte.etrecord\"), and submit it beside the model.";
  }
  return null;
}

// arms: [{label, runs, emulated}] (the experiment's succeeded runs per arm).
export function moduleCard(arms) {
  if (!arms.length) return null;
  if (!arms.some((a) => a.runs.some(shown))) {
    const why = whyNone(arms.flatMap((a) => a.runs));
    return why && h("div", { class: "card modules", dataset: { state: "none" } },
      h("h3", {}, "Time by module"), h("p", { class: "muted small no-modules" }, why));
  }
  return h("div", { class: "card modules", dataset: { state: "shown" } },
    h("h3", {}, "Time by module, per arm"),
    h("p", { class: "muted small" }, "From the model's ETRecord: the top-level modules across, each module's children "
      + "under it, widths in ms per iteration (E2E in all, the grey rest not attributed). Hover a cell for its full "
      + "name and time; repeated blocks keep their own paths."),
    arms.map((a) => {
      const attributed = a.runs.filter(shown);
      const share = attributed.length ? attributed.reduce((s, r) => s + (r.attribution.attributed_share || 0), 0) / attributed.length : null;
      const ambiguous = attributed.some((r) => r.attribution.status === "ambiguous");
      return h("figure", { class: "module-arm", dataset: { arm: a.label, emulated: a.emulated ? "yes" : "no" } },
        h("figcaption", {}, h("b", {}, a.label),
          attributed.length ? h("span", { class: "muted small" }, ` · ${pct(share)} of operator time attributed`
            + (ambiguous ? " (part of the alignment ambiguous: counted as not attributed)" : "")) : null),
        !attributed.length ? h("p", { class: "muted small" }, whyNone(a.runs) || "no module named")
          : a.emulated ? [h("p", { class: "note small" }, "Emulated: these times are the emulator's, so no time is shown; "
              + "which kernel path each module ran:"), kernelPathTable(a.runs)]
            : icicle(a.label, mergedRows(a.runs), `${a.label}: time by module`));
    }));
}

// The experiment's succeeded runs per arm (model, SME2, threads, mode, device), labelled by what varies.
export function experimentArms(exp) {
  const groups = new Map();
  for (const r of exp.runs || []) {
    if (r.status !== "succeeded") continue;
    const key = [r.variant || "A", r.sme2, r.threads, r.mode, r.device?.serial || ""];
    const k = JSON.stringify(key);
    if (!groups.has(k)) groups.set(k, { key, runs: [], emulated: false });
    const g = groups.get(k);
    g.runs.push(r);
    g.emulated = g.emulated || Boolean(r.device?.emulator);
  }
  const all = [...groups.values()];
  const varies = (i) => new Set(all.map((g) => g.key[i])).size > 1;
  return all.map((g) => ({
    runs: g.runs,
    emulated: g.emulated,
    label: [exp.vs_model_sha256 ? `model ${g.key[0]}` : null, `SME2 ${g.key[1]}`, varies(2) ? `${g.key[2]} thr` : null,
      varies(3) ? g.key[3] : null, varies(4) ? g.key[4] : null, g.emulated ? "emulated" : null].filter(Boolean).join(" · "),
  }));
}

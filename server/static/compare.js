// #/compare?baseline=E12&candidate=E13: any two experiments (or runs, R34) through GET /comparisons,
// matched by device model, SME2 arm, threads and mode (&min_effect=0.05 judges at 5%); a form to pick them.

import { ApiError, getJSON } from "./api.js";
import { chart, compareHref, h, short, table } from "./dom.js";
import { comparisonCard } from "./experiment.js";

const REF = "^\\s*([EeRr]?[0-9]{1,10}(/[ABab])?)\\s*$";

// min_effect in the URL is a fraction (0.05), the field a percentage (5)
const toPct = (f) => (f === "" || f == null || !Number.isFinite(Number(f)) ? "" : String(Number((100 * Number(f)).toPrecision(6))));

function form(baseline, candidate, minEffect, recent) {
  const input = (id, value, label) => h("label", {}, label,
    h("input", { id, name: id, value: value || "", required: true, pattern: REF, list: "recent-experiments",
      placeholder: "E12, 12, E12/B or R34", autocomplete: "off" }));
  return h("form", {
    id: "compare-form", class: "card",
    onsubmit: (e) => {
      e.preventDefault();
      const f = e.target;
      const pctValue = f.elements["compare-min-effect"].value.trim();
      location.hash = compareHref(f.elements["compare-baseline"].value.trim(), f.elements["compare-candidate"].value.trim(),
        pctValue === "" ? "" : String(Number(pctValue) / 100));
    },
  },
  h("div", { class: "row" }, input("compare-baseline", baseline, "Baseline"), input("compare-candidate", candidate, "Candidate"),
    h("label", { class: "narrow-field" }, "Min effect (%)",
      h("input", { id: "compare-min-effect", name: "compare-min-effect", type: "number", min: 0, max: 50, step: "any",
        value: toPct(minEffect), placeholder: "2", title: "differences smaller than this are not claimed (default 2%)" })),
    h("button", { type: "submit", class: "align-end" }, "Compare")),
  h("p", { class: "muted small" }, "An experiment id (12 or E12; E12/B for the second model of a --vs experiment) or a run id (R34). "
    + "Runs are matched by device model, SME2 arm, threads and mode; a ratio above 1 means the candidate is faster. "
    + "Min effect: a difference smaller than this is not claimed as a speedup or slowdown (default 2%)."),
  h("datalist", { id: "recent-experiments" }, recent.map((e) => [h("option", { value: `E${e.id}` }, `#${e.id} ${e.name || ""}`),
    e.vs_model_sha256 && h("option", { value: `E${e.id}/B` }, `#${e.id} model B ${e.name || ""}`)])));
}

function sideCard(which, s) {
  const ref = `${s.kind === "run" ? "R" : "E"}${s.id}${s.kind === "experiment" && s.variant === "B" ? "/B" : ""}`;
  return h("div", { class: `side ${which}`, dataset: { kind: s.kind, id: s.id } },
    h("h3", {}, which),
    h("p", {}, h("a", { href: `#/experiments/${s.experiment_id ?? s.id}`, class: "side-link" },
      s.kind === "run" ? `Run #${s.id} (experiment #${s.experiment_id})` : `Experiment #${s.id}${s.variant === "B" ? " (model B)" : ""}`),
    s.name && h("span", { class: "muted" }, ` · ${s.name}`), h("span", { class: "chip mono" }, ref)),
    h("div", { class: "muted small" }, "model ", h("span", { class: "mono", title: s.model_sha256 }, short(s.model_sha256, 16)),
      ` · ExecuTorch ${(s.et_versions || []).join(", ") || "?"} · runner ${(s.runner_builds || []).join(", ") || "?"}`));
}

export async function compareView({ baseline = "", candidate = "", min_effect: minEffect = "" }) {
  const recent = (await getJSON("/experiments?page=1&page_size=50")).items;
  const top = [h("div", { class: "title" }, h("h1", {}, "Compare")), form(baseline, candidate, minEffect, recent)];
  if (!baseline || !candidate) {
    return { refresh: false, node: h("section", { id: "compare" }, top,
      h("p", { class: "muted" }, "Pick two experiments (or runs), or use the “Compare with…” link on an experiment.")) };
  }
  const q = new URLSearchParams({ baseline, candidate, ...(minEffect ? { min_effect: minEffect } : {}) }).toString();
  let result;
  try {
    result = await getJSON(`/comparisons?${q}`);
  } catch (e) {
    // an unknown id (404) or nothing comparable (422): the server's reason, under the form to fix it
    if (e instanceof ApiError && (e.status === 404 || e.status === 422)) {
      return { refresh: false, node: h("section", { id: "compare" }, top,
        h("p", { id: "compare-error", class: "alert", role: "alert" }, e.message)) };
    }
    throw e;
  }
  const forest = await chart(`/comparisons/chart.svg?${q}`, "compare-verdicts");
  const where = (c) => [h("span", { class: "chip" }, c.device_model), h("span", { class: `chip sme2-${c.sme2}` }, `SME2 ${c.sme2}`),
    h("span", { class: "chip" }, `${c.threads} thread${c.threads > 1 ? "s" : ""}`), c.mode !== "timing" && h("span", { class: "chip" }, c.mode),
    c.baseline_device !== c.candidate_device && h("span", { class: "chip" }, `${c.baseline_device} vs ${c.candidate_device}`)];
  return {
    refresh: false,
    node: h("section", { id: "compare", dataset: { baseline, candidate, minEffect } }, top,
      h("div", { class: "card sides cols" }, sideCard("baseline", result.baseline), sideCard("candidate", result.candidate)),
      result.program_memory && h("p", { class: "card program-memory-compared" },
        `Planned memory (read from the programs), ${result.program_memory.sentence}`),
      result.notes.length > 0 && h("ul", { class: "card notes" }, result.notes.map((n) => h("li", {}, n))),
      h("div", { class: "card" }, h("h3", {}, "Verdicts"), forest),
      result.comparisons.map((c) => comparisonCard({ ...c, labels: c.labels || ["baseline", "candidate"], kind: "pair" }, { where: where(c) })),
      result.unmatched.length > 0 && h("div", { class: "card flush" }, table(["Side", "Device model", "SME2", "Threads", "Mode", "Why unmatched"],
        result.unmatched.map((u) => h("tr", {}, h("td", {}, u.side), h("td", {}, u.device_model), h("td", {}, u.sme2),
          h("td", { class: "num" }, u.threads), h("td", {}, u.mode), h("td", { class: "small" }, u.why))), { id: "unmatched" }))),
  };
}

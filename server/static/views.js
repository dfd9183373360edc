// The token prompt, the experiments list, the devices page and the upload form.

import { getJSON, postForm, token } from "./api.js";
import { badge, compareHref, h, short, smeText, table, when } from "./dom.js";

export const ACTIVE = new Set(["queued", "running", "assigned", "uploading", "analyzing"]);

export function tokenView(onDone, error) {
  const input = h("input", { id: "token-input", type: "password", autocomplete: "off", placeholder: "sme2_…", required: true });
  return h("section", { class: "card narrow" },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Paste an API token, or open a link that carries one (`sme2-farm demo` prints them). `sme2-farm up` prints the admin token and writes it to <data-dir>/token. It is kept in this browser's localStorage."),
    error && h("p", { id: "token-error", class: "alert", role: "alert" }, error),
    h("form", {
      onsubmit: (e) => { e.preventDefault(); token.set(input.value); onDone(); },
    }, h("label", {}, "Token", input), h("button", { type: "submit" }, "Use token")));
}

// GET /comparisons matches runs by SME2 arm too: "both" shares an arm with "off" and with "on"
const arms = (e) => (e.sme2 === "both" ? ["off", "on"] : [e.sme2]);
const sameSetup = (a, b) => a.model_sha256 === b.model_sha256 && a.mode === b.mode
  && (a.threads || []).join(",") === (b.threads || []).join(",") && arms(a).some((x) => arms(b).includes(x));
const comparable = (e) => (e.runs_by_status?.succeeded || 0) > 0;

export async function experimentsView({ page = "1", owner = "" }) {
  const n = Math.max(1, parseInt(page, 10) || 1);
  // ?owner=NAME (or "me": this token's user) keeps that user's experiments
  const whose = owner ? `&owner=${encodeURIComponent(owner)}` : "";
  const data = await getJSON(`/experiments?page=${n}&page_size=20${whose}`);
  const pages = Math.max(1, Math.ceil(data.total / data.page_size));
  // each row also links to its comparison with the previous experiment (on this page) of the same
  // model, threads and mode that measured something: a comparison GET /comparisons can make
  const rows = data.items.map((e, i) => [e, comparable(e) && data.items.slice(i + 1).find((o) => sameSetup(o, e) && comparable(o))]).map(([e, prev]) => h("tr", { dataset: { id: e.id } },
    h("td", {}, h("a", { href: `#/experiments/${e.id}` }, `#${e.id}`)),
    h("td", {}, h("a", { href: `#/experiments/${e.id}` }, e.name || "(unnamed)"),
      e.imported && h("span", { class: "chip imported", title: e.imported }, "imported")),
    h("td", {}, badge(e.status)),
    h("td", {}, h("div", { class: "chips" }, Object.entries(e.runs_by_status).map(([s, c]) => h("span", { class: `chip s-${s}` }, `${c} ${s}`)))),
    h("td", { class: "model" }, h("span", { class: "mono", title: e.model_sha256 }, short(e.model_sha256)),
      e.vs_model_sha256 && h("div", { class: "small vs-model" }, "vs B ",
        h("span", { class: "mono", title: e.vs_model_sha256 }, e.vs_model_sha256 === e.model_sha256 ? "(the same: A/A)" : short(e.vs_model_sha256)))),
    h("td", { class: "owner" }, e.owner
      ? h("a", { href: `#/experiments?owner=${encodeURIComponent(e.owner)}`, title: `only ${e.owner}'s` }, e.owner) : "—"),
    h("td", {}, when(e.created_at)),
    h("td", { class: "row-actions" },
      h("a", { class: "compare-link small", href: compareHref(`E${e.id}`), title: `compare experiment ${e.id} with another` }, "compare"),
      prev && h("a", { class: "compare-prev small", href: compareHref(`E${prev.id}`, `E${e.id}`), title: `experiment ${prev.id} → ${e.id}` }, ` vs #${prev.id}`))));
  const link = (p, label) => (p >= 1 && p <= pages && p !== n
    ? h("a", { class: "button ghost", href: `#/experiments?page=${p}${whose}` }, label)
    : h("span", { class: "button ghost disabled" }, label));
  const refresh = data.items.some((e) => ACTIVE.has(e.status));
  return {
    refresh,
    node: h("section", {},
      h("div", { class: "title" }, h("h1", {}, "Experiments"),
        refresh && h("span", { class: "muted live" }, "auto-refreshing"),
        owner
          ? h("a", { class: "button ghost", id: "owner-filter", href: "#/experiments" }, `${owner === "me" ? "mine" : owner} only · show all`)
          : h("a", { class: "button ghost", id: "owner-filter", href: "#/experiments?owner=me" }, "Mine"),
        h("a", { class: "button", href: "#/submit" }, "New experiment")),
      data.total === 0
        ? h("p", { class: "card muted" }, "No experiments yet. Upload a .pte to start one.")
        : h("div", { class: "card flush" },
          table(["ID", "Name", "Status", "Runs", "Model", "Owner", "Created", ""], rows, { id: "experiments" })),
      h("nav", { class: "pager" }, link(n - 1, "← Newer"),
        h("span", { class: "muted" }, `Page ${n} of ${pages} · ${data.total} experiment${data.total === 1 ? "" : "s"}`),
        link(n + 1, "Older →"))),
  };
}

export async function devicesView() {
  const devices = await getJSON("/devices");
  const rows = devices.map((d) => h("tr", { dataset: { serial: d.serial } },
    h("td", { class: "mono" }, d.serial,
      d.emulator && h("div", {}, h("span", { class: "chip emulated", title: "an emulator executes this device's runs: its times are the emulator's, never a speed figure" }, `emulated (${d.emulator})`))),
    h("td", {}, d.platform, d.abi && h("div", { class: "muted small" }, d.abi)),
    h("td", {}, d.model || "—", h("div", { class: "muted small" }, d.soc || ""), d.os_version && h("div", { class: "muted small" }, d.os_version)),
    h("td", { class: "num" }, d.cpu_cores || "—"),
    h("td", { class: "sme2" }, h("span", { class: `badge ${d.sme2 ? "yes" : "no"}`, dataset: { sme: String(d.sme ?? "") } }, smeText(d)),
      d.sme2_evidence && h("div", { class: "muted small" }, d.sme2_evidence)),
    h("td", {}, badge(d.state), d.current_run_id && h("div", { class: "small" }, `run ${d.current_run_id}`),
      d.state === "unhealthy" && d.state_reason && h("div", { class: "small" }, d.state_reason)),
    h("td", {}, d.agent, h("div", { class: "muted small" }, `seen ${when(d.last_seen)}`)),
    h("td", { class: "runners" }, d.runners.length
      ? d.runners.map((r) => h("div", { class: "mono small", title: `sha256 ${r.sha256}` }, r.id, " ", h("span", { class: `chip sme2-${r.sme2}` }, `SME2 ${r.sme2}`)))
      : h("span", { class: "muted" }, "none"))));
  return {
    refresh: false,
    node: h("section", {},
      h("div", { class: "title" }, h("h1", {}, "Devices")),
      devices.length === 0
        ? h("p", { class: "card muted" }, "No devices: start an agent (`sme2-farm up` runs a local one).")
        : h("div", { class: "card flush" },
          table(["Serial", "Platform", "Model / SoC", "Cores", "SME2", "State", "Agent", "Runners"], rows, { id: "devices" }))),
  };
}

export function submitView() {
  const file = h("input", { id: "model", name: "model", type: "file", accept: ".pte,.bpte", required: true });
  const inputs = h("input", { id: "inputs", name: "inputs", type: "file", accept: ".npz" });
  const method = h("input", { id: "method", value: "forward", pattern: "[A-Za-z_][A-Za-z0-9_]*" });
  const sme2 = h("select", { id: "sme2" }, ["both", "off", "on"].map((v) => h("option", { value: v }, v === "both" ? "both (off vs on)" : v)));
  const threads = h("input", { id: "threads", value: "1", pattern: "[0-9, ]+", title: "comma-separated thread counts, e.g. 1,4" });
  const iterations = h("input", { id: "iterations", type: "number", min: 1, value: 20 });
  const warmup = h("input", { id: "warmup", type: "number", min: 0, value: 2 });
  const name = h("input", { id: "name", placeholder: "optional" });
  const error = h("p", { id: "submit-error", class: "alert", role: "alert", hidden: true });
  const button = h("button", { type: "submit" }, "Submit");

  async function submit(e) {
    e.preventDefault();
    error.hidden = true;
    const spec = {
      sme2: sme2.value,
      threads: threads.value.split(/[ ,]+/).filter(Boolean).map(Number),
      iterations: Number(iterations.value),
      warmup: Number(warmup.value),
    };
    if (name.value.trim()) spec.name = name.value.trim();
    if (method.value.trim() && method.value.trim() !== "forward") spec.method = method.value.trim();
    const form = new FormData();
    form.append("model", file.files[0]);
    if (inputs.files[0]) form.append("inputs", inputs.files[0]);
    form.append("spec", JSON.stringify(spec));
    button.disabled = true;
    button.textContent = "Uploading…";
    try {
      const rep = await postForm("/experiments", form);
      location.hash = `#/experiments/${rep.id}`;
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
      button.textContent = "Submit";
    }
  }

  const field = (label, input, hint) => h("label", {}, label, input, hint && h("span", { class: "muted small" }, hint));
  return {
    refresh: false,
    node: h("section", {},
      h("div", { class: "title" }, h("h1", {}, "New experiment")),
      h("form", { id: "submit-form", class: "card narrow", onsubmit: submit },
        field("Model (.pte or .bpte)", file, "an ExecuTorch program, e.g. exported with the XNNPACK partitioner; a bundled program's first test case gives the inputs"),
        h("div", { class: "row" }, field("Inputs (.npz, optional)", inputs, "arrays '0', '1', ... in input order; default all ones"),
          field("Method", method)),
        h("div", { class: "row" }, field("SME2", sme2), field("Threads", threads, "e.g. 1,4")),
        h("div", { class: "row" }, field("Iterations", iterations), field("Warm-up", warmup)),
        field("Name", name),
        error,
        button)),
  };
}

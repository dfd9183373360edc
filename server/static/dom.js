// DOM building without innerHTML: every string becomes a text node or an attribute value.

import { getSVG } from "./api.js";

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

// Milliseconds with four significant digits: 0.04215, 12.35, 1235.
export function ms(v) {
  return v == null || !Number.isFinite(v) ? "—" : String(Number(v.toPrecision(4)));
}

// Bytes in binary units: 1536 -> "1.5 KiB".
export function bytes(v) {
  if (v == null || !Number.isFinite(v)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let x = v, i = 0;
  while (x >= 1024 && i < units.length - 1) { x /= 1024; i += 1; }
  return i === 0 ? `${x} B` : `${x.toFixed(x < 10 ? 2 : 1)} ${units[i]}`;
}
export const pct = (v) => (v == null ? "—" : `${(100 * v).toFixed(1)}%`);
export const num = (v, digits = 2) => (v == null ? "—" : Number(v).toFixed(digits));
export const short = (s, n = 12) => (s ? (s.length > n ? `${s.slice(0, n)}…` : s) : "—");

// Server timestamps are UTC; naive ones (SQLite) carry no suffix.
export function when(iso) {
  if (!iso) return "—";
  const d = new Date(/[zZ]|[+-]\d\d:\d\d$/.test(iso) ? iso : `${iso}Z`);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export function badge(status) {
  return h("span", { class: `badge s-${String(status).replace(/[^a-z]/g, "")}` }, status);
}

export function table(headers, rows, attrs = {}) {
  return h("table", attrs,
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows));
}

export function kv(pairs, attrs = {}) {
  return h("dl", { class: "kv", ...attrs }, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

// A server-drawn chart in a <figure>: the SVG, or the reason it could not be drawn (the page
// still renders). data-state says which, for tests and for CSS.
export async function chart(path, name) {
  const fig = h("figure", { class: "chart-box", dataset: { chart: name, state: "loading" } });
  try {
    fig.append(await getSVG(path));
    fig.dataset.state = "ready";
  } catch (e) {
    fig.append(h("p", { class: "alert small" }, `chart not available: ${e.message}`));
    fig.dataset.state = "error";
  }
  return fig;
}

// "E12" / "R34" references as GET /comparisons takes them, and the hash of the compare page.
export const compareHref = (baseline, candidate, minEffect) => `#/compare?${new URLSearchParams(
  Object.entries({ baseline, candidate, min_effect: minEffect }).filter(([, v]) => v)).toString()}`;

// A device selector ({"model": "Pixel 9", "sme2": true}) as text: "model Pixel 9, sme2 true"; empty: "any device".
export function selectorText(sel) {
  const parts = Object.entries(sel || {}).filter(([, v]) => v != null && v !== "" && !(Array.isArray(v) && !v.length))
    .map(([k, v]) => `${k} ${Array.isArray(v) ? v.join(" or ") : typeof v === "object" ? JSON.stringify(v) : v}`);
  return parts.length ? parts.join(", ") : "any device";
}

// A device's matrix extensions in words (protocol.sme_text): SME2, "SME, not SME2" (a CPU whose
// XNNPACK SME2 kernels cannot run), else no SME2.
export const smeText = (d) => (d.sme2 ? "SME2" : d.sme ? "SME, not SME2" : "no SME2");

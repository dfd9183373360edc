// DOM building without innerHTML: every string becomes a text node or an attribute value.

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

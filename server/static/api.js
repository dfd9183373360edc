// The farm's HTTP API with the bearer token from localStorage.

const KEY = "sme2farm.token";

export const token = {
  get: () => localStorage.getItem(KEY) || "",
  set: (t) => localStorage.setItem(KEY, t.trim()),
  clear: () => localStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// FastAPI errors: {"detail": "text"} or {"detail": [{loc, msg}, ...]}; 409s carry {"message"}.
function errorText(body) {
  const d = body && (body.detail ?? body.message);
  if (typeof d === "string") return d;
  if (Array.isArray(d)) return d.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`).join("; ");
  return d ? JSON.stringify(d) : "";
}

export async function request(path, { method = "GET", body } = {}) {
  let res;
  try {
    res = await fetch(path, { method, body, headers: { Authorization: `Bearer ${token.get()}` } });
  } catch (e) {
    throw new ApiError(0, `the server did not answer (${e.message})`);
  }
  if (!res.ok) {
    let msg = "";
    try { msg = errorText(await res.json()); } catch { /* not JSON */ }
    throw new ApiError(res.status, `${res.status} ${res.statusText}${msg ? `: ${msg}` : ""}`);
  }
  return res;
}

export const getJSON = async (path) => (await request(path)).json();

// A chart from the server (analysis/charts.py draws every chart once, for here and for reports),
// parsed as SVG and imported as nodes: no innerHTML, and nothing that fails to parse is inserted.
export async function getSVG(path) {
  const text = await (await request(path)).text();
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const root = doc.documentElement;
  if (root.localName !== "svg" || doc.getElementsByTagName("parsererror").length) {
    throw new ApiError(0, `${path} did not return an SVG chart`);
  }
  return document.importNode(root, true);
}
export const postForm = async (path, form) => (await request(path, { method: "POST", body: form })).json();
export const post = async (path) => (await request(path, { method: "POST" })).json();

// Links cannot carry the Authorization header: fetch the artifact and save it as a blob.
export async function download(runId, name) {
  const res = await request(`/runs/${runId}/artifacts/${encodeURIComponent(name)}`);
  const url = URL.createObjectURL(await res.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = `run${runId}-${name}`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

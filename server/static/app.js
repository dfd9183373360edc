// Hash router: #/experiments[?page=N], #/experiments/<id>, #/compare[?baseline=E1&candidate=E2],
// #/suites, #/suites/<name>, #/devices, #/submit.

import { ApiError, token } from "./api.js";
import { h } from "./dom.js";
import { compareView } from "./compare.js";
import { experimentView } from "./experiment.js";
import { suitesView, suiteView } from "./suites.js";
import { devicesView, experimentsView, submitView, tokenView } from "./views.js";

const REFRESH_MS = 3000;
const main = document.getElementById("main");
const changeToken = document.getElementById("change-token");
let generation = 0; // bumped by every render, so a stale fetch or timer never overwrites a newer page
let timer;

function parse(hash) {
  const [path, query = ""] = hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/").filter(Boolean);
  const params = Object.fromEntries(new URLSearchParams(query));
  if (parts[0] === "experiments" && parts[1]) return { view: experimentView, nav: "experiments", params: { ...params, id: parts[1] } };
  if (parts[0] === "compare") return { view: compareView, nav: "compare", params };
  if (parts[0] === "suites" && parts[1]) return { view: suiteView, nav: "suites", params: { ...params, name: decodeURIComponent(parts[1]) } };
  if (parts[0] === "suites") return { view: suitesView, nav: "suites", params };
  if (parts[0] === "devices") return { view: devicesView, nav: "devices", params };
  if (parts[0] === "submit") return { view: submitView, nav: "submit", params };
  return { view: experimentsView, nav: "experiments", params };
}

// A link that signs in carries a token in its fragment (`sme2-farm demo` prints them): #token=T, or
// a page's hash with ?token=T (#/experiments/3?token=T). The fragment never reaches the server; the
// token is kept as a pasted one is, and taken out of the address bar and this history entry at once.
function tokenFromLink() {
  const hash = location.hash.replace(/^#/, "");
  const [path, query = ""] = hash.startsWith("token=") ? ["", hash] : hash.split("?");
  const params = new URLSearchParams(query);
  const given = params.get("token");
  if (given === null) return;
  if (given.trim()) token.set(given);
  params.delete("token");
  const rest = params.toString();
  const clean = path + (rest ? `?${rest}` : "");
  history.replaceState(history.state, "", `${location.pathname}${location.search}${clean ? `#${clean}` : ""}`);
}

async function render() {
  const gen = ++generation;
  clearTimeout(timer);
  tokenFromLink();
  const { view, nav, params } = parse(location.hash);
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === nav);
  changeToken.hidden = !token.get();
  if (!token.get()) {
    main.replaceChildren(tokenView(render));
    return;
  }
  try {
    const out = await view(params);
    if (gen !== generation) return;
    main.replaceChildren(out.node);
    if (out.refresh) timer = setTimeout(() => gen === generation && render(), REFRESH_MS);
  } catch (e) {
    if (gen !== generation) return;
    if (e instanceof ApiError && e.status === 401) {
      token.clear();
      changeToken.hidden = true;
      main.replaceChildren(tokenView(render, `The server rejected this token (${e.message}). Paste a valid one.`));
      return;
    }
    main.replaceChildren(h("section", {}, h("p", { class: "alert", role: "alert" }, e.message),
      h("button", { type: "button", onclick: render }, "Retry")));
  }
}

changeToken.addEventListener("click", () => { token.clear(); render(); });
window.addEventListener("hashchange", render);
render();

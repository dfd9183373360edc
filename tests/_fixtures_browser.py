"""Headless Chromium for the dashboard tests: the browser, checked before any farm starts (CI fails
without it, elsewhere a plain skip), and waiting for what a page shows."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import threading
import time
from pathlib import Path

import pytest

__all__ = ["chromium", "browser"]

CHROMIUM = Path(os.environ.get("SME2_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("SME2_CHROMEDRIVER", "/usr/bin/chromedriver"))
WAIT_S = 20


@pytest.fixture(scope="session")
def chromium():
    """Checked before the farm starts: CI (SME2_REQUIRE_SERVICES=1) fails, elsewhere a plain skip."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium Python package (pip install -e '.[dev]')")
    if missing:
        msg = (f"the dashboard test needs headless Chromium; missing: {', '.join(missing)} "
               f"(apt-get install chromium chromium-driver, as listed in .ci/apt-packages.txt)")
        if os.environ.get("SME2_REQUIRE_SERVICES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return CHROMIUM, CHROMEDRIVER


@pytest.fixture
def browser(chromium, tmp_path, monkeypatch):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium-manager must never download anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(chromium[0])
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(chromium[1])), options=opts)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.downloads = downloads
    yield driver
    driver.quit()


def wait(driver, css: str, *, text: str | None = None, timeout: float = WAIT_S):
    """The first visible element matching css (whose text contains `text`, if given)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def found(d):
        for el in d.find_elements(By.CSS_SELECTOR, css):
            if el.is_displayed() and (text is None or text in el.text):
                return el
        return False

    try:
        return WebDriverWait(driver, timeout).until(found)
    except Exception:
        main = driver.find_elements(By.ID, "main")
        raise AssertionError(f"no visible {css!r}{f' with {text!r}' if text else ''}; page shows:\n"
                             f"{main[0].text if main else driver.page_source[:2000]}") from None


def screenshot(driver, path: Path) -> None:
    driver.execute_script("window.scrollTo(0, 0)")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(height + 20, 800), 6000))
    time.sleep(0.2)
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 1000)


# Every drawn <text> of a chart, in the chart's user units (the SVG is scaled to its box): its box,
# what it shows (its own text and tspans, never its <title>) and whether it has a <title>.
_MEASURE = """
const svg = arguments[0], vb = svg.viewBox.baseVal, box = svg.getBoundingClientRect();
const k = box.width / vb.width;
return [...svg.querySelectorAll("text")].map((t) => {
  const shown = [...t.childNodes].filter((n) => n.nodeName !== "title").map((n) => n.textContent).join("");
  const r = t.getBoundingClientRect();
  return { shown, title: t.querySelector("title")?.textContent || null,
           x0: (r.left - box.left) / k, y0: (r.top - box.top) / k, x1: (r.right - box.left) / k,
           y1: (r.bottom - box.top) / k, w: vb.width, h: vb.height };
}).filter((t) => t.shown.trim() && t.x1 > t.x0);
"""


def chart_texts(svg) -> list[dict]:
    """The drawn texts of a rendered chart (a selenium <svg> element), measured by the browser."""
    return svg.parent.execute_script(_MEASURE, svg)


def chart_label_problems(svg) -> list[str]:
    """A rendered chart's labels outside its viewBox, over one another, or cut with no full text to hover."""
    texts, out = chart_texts(svg), []
    for t in texts:
        if t["x0"] < -0.5 or t["y0"] < -0.5 or t["x1"] > t["w"] + 0.5 or t["y1"] > t["h"] + 0.5:
            out.append(f"outside the chart: {t['shown']!r} at x {t['x0']:.1f}..{t['x1']:.1f} of {t['w']}, "
                       f"y {t['y0']:.1f}..{t['y1']:.1f} of {t['h']}")
        if "…" in t["shown"] and not t["title"]:
            out.append(f"cut with no full text on hover: {t['shown']!r}")
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if a["x0"] < b["x1"] - 1 and b["x0"] < a["x1"] - 1 and a["y0"] < b["y1"] - 1 and b["y0"] < a["y1"] - 1:
                out.append(f"overlap: {a['shown']!r} and {b['shown']!r}")
    return out


STATIC = Path(__file__).resolve().parent.parent / "server" / "static"


@contextlib.contextmanager
def static_page(path: str, page: bytes):
    """The dashboard's static files on a free loopback port, with `page` served at `path` (a test page
    that imports the modules under test); yields the server's base URL."""

    class Static(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith(path):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
            super().do_GET()

        def guess_type(self, p):
            return "text/javascript" if str(p).endswith(".js") else super().guess_type(p)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Static, directory=str(STATIC)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

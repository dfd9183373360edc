"""A chart's heading fits its SVG in headless Chromium: the dashboard's category bars are titled
"Where the time goes (ms per iteration, 10% trimmed mean), experiment N · NAME", longer than the
640 px chart, and the end was clipped with no ellipsis. The full title stays in <title>."""

from __future__ import annotations

import base64

import pytest

from _fixtures_browser import *  # noqa: F401,F403
from sme2farm.analysis import charts

TITLE = "Where the time goes (ms per iteration, 10% trimmed mean), experiment 7 · imported tower.pte"


@pytest.mark.browser
def test_a_long_chart_title_is_cut_with_an_ellipsis_inside_the_chart(browser):
    svg = charts.category_bars([("SME2 off", {"Convolution": 1.2, "Other": 0.4})], title=TITLE)
    assert f"<title>{TITLE}</title>" in svg          # the whole title on hover
    page = "<!doctype html><html><head><meta charset='utf-8'></head><body style='margin:0'>" + svg + "</body></html>"
    browser.get("data:text/html;base64," + base64.b64encode(page.encode()).decode())
    shown, right, width = browser.execute_script("""
        const s = document.querySelector('svg'); const t = s.querySelector('text');
        const b = t.getBBox(); return [t.textContent, b.x + b.width, s.viewBox.baseVal.width];""")
    assert shown.endswith("…") and TITLE.startswith(shown[:-1].rstrip()), shown
    assert right <= width - 4, (shown, right, width)

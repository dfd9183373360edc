"""A chart's heading fits its SVG in headless Chromium: the dashboard's category bars are titled
"Where the time goes (ms per iteration, 10% trimmed mean), experiment N · NAME", longer than the
640 px chart. It wraps to a second line (the plot moves down); a title longer than two lines is
cut with an ellipsis. The full title stays in <title>."""

from __future__ import annotations

import base64

import pytest

from _fixtures_browser import *  # noqa: F401,F403
from sme2farm.analysis import charts

TITLE = "Where the time goes (ms per iteration, 10% trimmed mean), experiment 7 · imported tower.pte"


def _heading(browser, svg: str) -> tuple[list[str], float, float, float]:
    """The title's drawn lines, its right edge and bottom, and the viewBox width."""
    page = "<!doctype html><html><head><meta charset='utf-8'></head><body style='margin:0'>" + svg + "</body></html>"
    browser.get("data:text/html;base64," + base64.b64encode(page.encode()).decode())
    return browser.execute_script("""
        const s = document.querySelector('svg'); const t = s.querySelector('text.chart-title');
        const b = t.getBBox();
        return [[...t.querySelectorAll('tspan')].map((x) => x.textContent), b.x + b.width, b.y + b.height,
                s.viewBox.baseVal.width];""")


@pytest.mark.browser
def test_a_long_chart_title_wraps_inside_the_chart_and_the_plot_moves_down(browser):
    one = charts.category_bars([("SME2 off", {"Convolution": 1.2, "Other": 0.4})], title="Short")
    svg = charts.category_bars([("SME2 off", {"Convolution": 1.2, "Other": 0.4})], title=TITLE)
    assert f"<title>{TITLE}</title>" in svg          # the whole title on hover
    lines, right, bottom, width = _heading(browser, svg)
    assert len(lines) == 2 and " ".join(lines) == TITLE, lines
    assert right <= width - 4, (lines, right, width)
    bar_top = browser.execute_script("return document.querySelector('rect.segment').getBoundingClientRect().top")
    assert bar_top > bottom, (bar_top, bottom)   # the bars start under the second line
    assert int(svg.split('height="', 1)[1].split('"')[0]) > int(one.split('height="', 1)[1].split('"')[0])


@pytest.mark.browser
def test_a_title_longer_than_two_lines_is_cut_with_an_ellipsis(browser):
    title = " ".join([TITLE] * 3)
    lines, right, _, width = _heading(browser, charts.forest_plot([], title=title))
    assert len(lines) == 2 and lines[-1].endswith("…") and title.startswith(" ".join(lines)[:-1].rstrip()), lines
    assert right <= width - 4, (lines, right, width)

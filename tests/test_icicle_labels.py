"""The icicle's labels in headless Chromium (server/static/modules.js fitLabel): a module whose last
path part is a bare index (a Sequential's or ModuleList's child, `entry.0`) is never labelled by
the index alone, which names nothing; its parent's part goes with it, or no label (the full name
is on hover)."""

from __future__ import annotations

import pytest

from _fixtures_browser import static_page
PAGE = b"""<!doctype html><html><body><script type="module">
import { fitLabel } from "/modules.js";
window.fit = fitLabel;
window.ready = true;
</script></body></html>"""


@pytest.mark.browser
def test_a_bare_index_is_never_a_label_alone(browser):
    with static_page("/labels-test.html", PAGE) as base:
        browser.get(f"{base}/labels-test.html")
        from selenium.webdriver.support.ui import WebDriverWait
        WebDriverWait(browser, 10).until(lambda d: d.execute_script("return window.ready === true"))

        def fit(name, px):
            return browser.execute_script("return window.fit(arguments[0], arguments[1])", name, px)

        assert fit("entry.0", 14) == ""                  # room for one character: not "0"
        assert fit("entry.0", 60) == "entry.0"           # the whole name fits
        assert fit("stages.blocks.3", 70) == "blocks.3"  # the index with its parent's part
        assert fit("stages.blocks.3", 40) == "bloc…"     # cut as any name is, never the bare "3"
        assert fit("body.0.conv_a", 60) == "conv_a"      # a named last part is still shown alone
        assert fit("body.0.conv_a", 20) == ""

"""The documentation site works offline (issue 52, item 5): MathJax, its fonts and mermaid come from the site itself
(docs/javascripts/vendor), the theme uses the system's fonts. The site is built, served on 127.0.0.1 and loaded in
headless Chromium whose every other host fails to resolve (the network off): a formula page typesets its TeX, the
architecture page draws its diagram, nothing is fetched from another host and the console stays empty."""

from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("mkdocs", reason="the docs extra builds the site: pip install 'grpokit[docs]'")
pytest.importorskip("material", reason="the docs extra builds the site: pip install 'grpokit[docs]'")
pytest.importorskip("selenium", reason="pip install 'grpokit[dev]' (selenium) for the browser tests")
from browser import NEEDS_CHROMIUM, chromium  # noqa: E402
from paths import REPO  # noqa: E402

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site, served on 127.0.0.1: its base URL."""
    folder = tmp_path_factory.mktemp("site")
    # --no-strict: this test is about what loads; CI's own `mkdocs build --strict` checks the links
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--no-strict", "--quiet", "--site-dir", str(folder)],
                   cwd=REPO, check=True, timeout=300)  # fmt: skip
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", folder
    server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def browser():
    # the network off: every host but this machine's fails to resolve
    driver = chromium("1300,1000", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1")
    yield driver
    driver.quit()


def wait_for(driver, script: str, seconds: float = 60.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for: {script}")


def fetched(driver) -> list[str]:
    return driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")


def test_a_formula_page_typesets_offline(site, browser, tmp_path):
    base, _ = site
    browser.get(base + "algorithms/grpo/")
    # every arithmatex span typeset by MathJax (raw TeX stays in a span without mjx-container)
    wait_for(browser, "const m = document.querySelectorAll('.arithmatex'); return m.length > 0 && "
                      "[...m].every(e => e.querySelector('mjx-container'))")  # fmt: skip
    wait_for(browser, "return document.fonts.status === 'loaded'")
    urls = fetched(browser)
    assert all(url.startswith(base) for url in urls), [u for u in urls if not u.startswith(base)]
    assert any("vendor/mathjax/tex-mml-chtml.js" in u for u in urls)
    assert any(u.endswith(".woff") for u in urls)  # MathJax's own fonts, from the site
    families = browser.execute_script(
        "return [...document.fonts].filter(f => f.status === 'loaded').map(f => f.family)"
    )
    assert any("MJXTEX" in f or "MJXZERO" in f for f in families), families
    assert browser.get_log("browser") == []
    browser.save_screenshot(str(tmp_path / "grpo.png"))
    assert (tmp_path / "grpo.png").stat().st_size > 20_000


def test_the_architecture_diagram_draws_offline(site, browser):
    base, _ = site
    browser.get(base + "design/architecture/")
    # Material replaces each mermaid block with a div whose (closed) shadow root holds the drawn SVG
    wait_for(browser, "return document.querySelector('div.mermaid') !== null && "
                      "document.querySelector('pre.mermaid') === null")  # fmt: skip
    urls = fetched(browser)
    assert all(url.startswith(base) for url in urls), [u for u in urls if not u.startswith(base)]
    assert any("vendor/mermaid/mermaid.min.js" in u for u in urls)
    assert browser.get_log("browser") == []


def test_a_page_without_a_diagram_does_not_load_mermaid(site, browser):
    base, _ = site
    browser.get(base + "getting-started/")
    wait_for(browser, "return document.readyState === 'complete'")
    assert not any("mermaid.min.js" in u for u in fetched(browser))
    assert browser.get_log("browser") == []

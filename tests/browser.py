"""Headless Chromium for the browser tests (tests/e2e/test_view_browser.py, test_docs_offline.py): Debian's chromium
driven through chromedriver (apt-get install chromium chromium-driver, as .ci/run does), with the console kept."""

from __future__ import annotations

import shutil

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
NEEDS_CHROMIUM = pytest.mark.skipif(
    not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver (apt-get install, as .ci/run does)"
)


def chromium(window: str, *more_args: str):
    """A headless Chromium driver of ``window`` size ("1500,1100") with ``more_args``; the browser log kept
    (``driver.get_log("browser")``). The caller quits it."""
    from selenium import webdriver  # noqa: PLC0415 - selenium is the dev extra's; the tests import-skip without it
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={window}", *more_args):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=options)

"""The explorer's Prompt history tab (issue 50) in headless Chromium: a tiny run with prompt selection, its page
opened on the tab, no console error, the summary's counts and every row's numbers those of the checkpoint's
history, the sort by pass rate; a run without selection says why there is none."""

from __future__ import annotations

import math
import time

import grpo_runs
import pytest
from browser import NEEDS_CHROMIUM, chromium

from grpokit.model.checkpoint import load_trainer_state
from grpokit.view.data import read_run
from grpokit.view.page import clean, write_page

selenium = pytest.importorskip(
    "selenium", reason="pip install 'grpokit[dev]' (selenium) for the browser tests"
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = NEEDS_CHROMIUM


def test_the_prompt_history_tab_shows_the_checkpoints_history(tmp_path):
    on = grpo_runs.make_trainer(
        tmp_path / "on", "train.steps=3", "train.samples_every=0", "eval.enabled=false",
        "data.selection.mode=greso", "data.selection.refill=true",
    )  # fmt: skip
    on.train()
    off = grpo_runs.make_trainer(
        tmp_path / "off", "train.steps=1", "train.samples_every=0", "eval.enabled=false"
    )
    off.train()
    saved = load_trainer_state(tmp_path / "on" / "run" / "checkpoints" / "step_000003")["stream"]["selection"]
    history = saved["history"]
    runs = [clean(read_run(tmp_path / "on" / "run")), clean(read_run(tmp_path / "off" / "run"))]
    page = write_page(runs, tmp_path / "view.html")
    driver = chromium("1400,1000")
    try:
        driver.get(page.as_uri() + "#history")
        time.sleep(0.5)
        assert [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
        summary = driver.find_element(By.ID, "history-summary").text
        seen = sum(1 for v in history["visits"] if v)
        assert f"At step 3: {seen} of {len(history['visits'])} training prompts visited" in summary
        rows = driver.find_elements(By.CSS_SELECTOR, "#history-table tr[data-row]")
        listed = [i for i, (v, k) in enumerate(zip(history["visits"], history["skipped"])) if v or k]
        assert sorted(int(r.get_attribute("data-row")) for r in rows) == listed
        for r in rows:
            i = int(r.get_attribute("data-row"))
            cells = r.find_elements(By.TAG_NAME, "td")
            assert int(cells[1].text) == history["visits"][i]
            assert (
                int(cells[7].text) == history["flat_run"][i] and int(cells[8].text) == history["skipped"][i]
            )
            shown = cells[5].find_element(By.CSS_SELECTOR, "[data-value]").get_attribute("data-value")
            spread = history["reward_spread"][i]
            assert (shown == "" and math.isnan(spread)) or float(shown) == pytest.approx(spread, abs=1e-12)
        Select(driver.find_element(By.ID, "history-sort")).select_by_value("pass_rate")
        rates = [
            r.find_elements(By.TAG_NAME, "td")[3]
            .find_element(By.CSS_SELECTOR, "[data-value]")
            .get_attribute("data-value")
            for r in driver.find_elements(By.CSS_SELECTOR, "#history-table tr[data-row]")
        ]
        known = [float(v) for v in rates if v != ""]
        assert known == sorted(known, reverse=True) and known  # highest recent pass rate first
        Select(driver.find_element(By.ID, "history-run")).select_by_index(1)  # the run without selection
        assert "selection was off" in driver.find_element(By.ID, "history-summary").text
        assert driver.find_elements(By.CSS_SELECTOR, "#history-table tr") == []
        driver.save_screenshot(str(tmp_path / "view_history.png"))
    finally:
        driver.quit()

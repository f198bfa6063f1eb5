"""`grpokit view` in a real browser (headless Chromium through selenium) on real runs of the embedded demo:
no console errors; the step browser's numbers for a group equal those recomputed from the saved rollouts and
metrics.jsonl; the token colours follow the chosen quantity; two runs overlay. Screenshots of each view go
to the test's folder (and to $GRPOKIT_VIEW_SCREENSHOTS when set).

The demo is the embedded one (its task, model kind, config and `grpokit train` command) with a smaller warm
start (DemoSpec below) so that the test stays short; 4 and 2 steps, rollouts saved every 2."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpokit.demos.default import DemoSpec, demo_overrides, prepare_demo
from grpokit.rollout.record import read_rollouts, rollout_files

selenium = pytest.importorskip("selenium", reason="pip install 'grpokit[dev]' (selenium) for the browser tests")
from browser import NEEDS_CHROMIUM, chromium  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = NEEDS_CHROMIUM
SPEC = DemoSpec(max_operand=9, eval_size=20, hidden_size=32, sft_steps=40, sft_batch=32)


def _train(config: Path, out: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "grpokit", "train", str(config), "--output-dir", str(out)]
    settings = ["train.samples_every=2", "train.tensorboard=false", "eval.every=0"]
    settings += ["rollout.prompts_per_step=4", "train.stop_after_flat_steps=0", *extra]
    return subprocess.Popen([*command, *settings], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("view")
    cache = Path(os.environ.get("GRPOKIT_CACHE") or tmp / "cache")  # the demo's own cache variable
    paths = prepare_demo(SPEC, cache=cache, log=lambda message: None)
    config = tmp / "demo.yaml"
    settings = json.loads(json.dumps(demo_overrides(paths), default=str))
    # a second reward that differs within every group, however weak the short warm start left the model
    settings["rewards"].append({"name": "length_penalty", "weight": 1.0, "kwargs": {"max_len": 8, "scale": 0.5}})
    config.write_text(yaml.safe_dump(settings))
    a, b = tmp / "demo_a", tmp / "demo_b"
    jobs = [_train(config, a, "train.steps=4"), _train(config, b, "train.steps=2", "train.seed=1")]
    for job in jobs:
        output = job.communicate(timeout=600)[0]
        assert job.returncode == 0, output[-2000:]
    done = subprocess.run(
        [sys.executable, "-m", "grpokit", "view", str(a), str(b)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    page = Path(done.stdout.strip().splitlines()[-1])
    assert page == a / "view.html" and page.is_file()
    return a, b, page


@pytest.fixture(scope="module")
def browser():
    driver = chromium("1500,1100")
    yield driver
    driver.quit()


def _shot(driver, name: str, folder: Path, element=None) -> Path:
    path = folder / f"view_{name}.png"
    (element or driver).screenshot(str(path)) if element is not None else driver.save_screenshot(str(path))
    if os.environ.get("GRPOKIT_VIEW_SCREENSHOTS"):
        target = Path(os.environ["GRPOKIT_VIEW_SCREENSHOTS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / path.name)
    assert path.stat().st_size > 5_000
    return path


def _errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]


def _value(element) -> float:
    return float(element.find_element(By.CSS_SELECTOR, "[data-value]").get_attribute("data-value"))


def test_page_in_a_browser(runs, browser):
    a, b, page = runs
    shots = page.parent
    browser.get(page.as_uri())
    time.sleep(0.5)
    assert _errors(browser) == []

    # curves: both runs overlaid, with a legend naming each
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#chart-0 .u-legend .u-label")]
    assert any(label.startswith(f"{a.name}: reward/total/mean") for label in labels), labels
    assert any(label.startswith(f"{b.name}: reward/total/mean") for label in labels), labels
    assert len(browser.find_elements(By.CSS_SELECTOR, "#charts canvas")) >= 7
    _shot(browser, "curves", shots)

    # step browser: the last saved step of run a, a group with reward spread if there is one
    browser.find_element(By.CSS_SELECTOR, 'a[data-tab="steps"]').click()
    path = rollout_files(a)[-1]
    table, meta = read_rollouts(path)
    t = table.to_pydict()
    G, step = meta["group_size"], meta["step"]
    Select(browser.find_element(By.ID, "step-select")).select_by_visible_text(f"step {step}")
    groups = [t["reward"][g * G : (g + 1) * G] for g in range(len(t["reward"]) // G)]
    g = next(i for i, r in enumerate(groups) if max(r) > min(r))  # length_penalty: every group has spread
    browser.find_element(By.CSS_SELECTOR, f'#groups tr.group-row[data-group="{g}"]').click()

    rewards = groups[g]
    mean = sum(rewards) / G
    std = (sum((x - mean) ** 2 for x in rewards) / (G - 1)) ** 0.5  # grpo: std_ddof 1
    assert _value(browser.find_element(By.ID, "g-stats").find_element(By.ID, "g-mean").find_element(By.XPATH, "..")) == pytest.approx(mean, abs=1e-9)
    assert float(browser.find_element(By.CSS_SELECTOR, "#g-std [data-value]").get_attribute("data-value")) == pytest.approx(std, abs=1e-9)
    rows = browser.find_elements(By.CSS_SELECTOR, "#completions tr.completion-row")
    assert len(rows) == G
    for j, row in enumerate(rows):
        i = g * G + j
        assert _value(row.find_element(By.CSS_SELECTOR, 'td[data-field="reward"]')) == pytest.approx(t["reward"][i])
        for name in meta["reward_names"]:
            cell = row.find_element(By.CSS_SELECTOR, f'td[data-field="reward/{name}"]')
            assert _value(cell) == pytest.approx(t[f"reward/{name}"][i])
        assert _value(row.find_element(By.CSS_SELECTOR, 'td[data-field="advantage"]')) == pytest.approx(t["advantage"][i], abs=1e-6)
        want = 0.0 if max(rewards) == min(rewards) else (t["reward"][i] - mean) / (std + 1e-6)
        assert t["advantage"][i] == pytest.approx(want, abs=1e-5)  # the saved advantage is GRPO's
        shown = row.find_element(By.CSS_SELECTOR, 'td[data-field="advantage"]').text
        assert float(shown) == pytest.approx(t["advantage"][i], abs=1e-4)  # and so is the text shown

    # the step's row: metrics.jsonl's values, and the same recomputed from the saved tokens
    logged = {m["step"]: m for m in map(json.loads, (a / "metrics.jsonl").read_text().splitlines())}[step]
    summary = browser.find_element(By.ID, "step-totals")
    reward_row = summary.find_element(By.CSS_SELECTOR, 'tr[data-key="reward/total/mean"]')
    assert _value(reward_row.find_element(By.CSS_SELECTOR, "td.logged")) == pytest.approx(logged["reward/total/mean"], rel=1e-5)
    assert _value(reward_row.find_element(By.CSS_SELECTOR, "td.saved")) == pytest.approx(sum(t["reward"]) / len(t["reward"]))
    loss_row = summary.find_element(By.CSS_SELECTOR, 'tr[data-key="loss"]')
    assert _value(loss_row.find_element(By.CSS_SELECTOR, "td.saved")) == pytest.approx(logged["loss"], rel=1e-4, abs=1e-8)
    assert float(browser.find_element(By.ID, "obj-mean").text) == pytest.approx(mean, abs=1e-4)
    _shot(browser, "steps", shots)
    _shot(browser, "objective", shots, browser.find_element(By.ID, "objective"))

    # token view: the colours follow the chosen quantity
    def colours():
        return [s.get_attribute("style") for s in browser.find_elements(By.CSS_SELECTOR, "#token-view .tok")]

    rows[0].click()
    quantity = Select(browser.find_element(By.ID, "quantity"))
    quantity.select_by_value("logprobs")
    by_logprob = colours()
    assert len(by_logprob) == t["length"][g * G]
    quantity.select_by_value("kl")
    by_kl = colours()
    assert by_logprob != by_kl
    spans = browser.find_elements(By.CSS_SELECTOR, "#token-view .tok")
    shown = [float(s.get_attribute("data-value")) for s in spans]
    assert shown[0] == pytest.approx(_k3(t["logprobs"][g * G][0], t["ref_logprobs"][g * G][0]), rel=1e-4, abs=1e-7)
    quantity.select_by_value("logprobs")
    shown = [float(s.get_attribute("data-value")) for s in browser.find_elements(By.CSS_SELECTOR, "#token-view .tok")]
    assert shown == pytest.approx(t["logprobs"][g * G], abs=1e-6)
    _shot(browser, "tokens", shots, browser.find_element(By.ID, "token-box"))

    # the second run in the step browser, then filters: nothing breaks
    Select(browser.find_element(By.ID, "run-select")).select_by_visible_text(b.name)
    Select(browser.find_element(By.ID, "group-filter")).select_by_value("flat")
    Select(browser.find_element(By.ID, "group-sort")).select_by_value("std")
    assert _errors(browser) == []


def _k3(logp: float, ref: float) -> float:
    import math

    d = ref - logp
    return math.exp(d) - d - 1


def test_damaged_files_are_left_out_with_a_warning_not_the_whole_page(runs, browser, tmp_path):
    """A metrics line that does not parse and a rollouts file cut short: `grpokit view` still writes the
    page, warns about each on stderr and in the page, and shows the rest (issue 38)."""
    a, _, _ = runs
    damaged = tmp_path / "damaged"
    shutil.copytree(a, damaged)
    lines = (damaged / "metrics.jsonl").read_text().splitlines()
    (damaged / "metrics.jsonl").write_text("\n".join([lines[0], '{"step": 2, "loss": ', *lines[1:]]) + "\n")
    first, *others = rollout_files(damaged)
    first.write_bytes(first.read_bytes()[:100])
    done = subprocess.run([sys.executable, "-m", "grpokit", "view", str(damaged)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "metrics.jsonl line 2 does not parse" in done.stderr and f"{first.name}: cannot be read" in done.stderr
    browser.get((damaged / "view.html").as_uri())
    time.sleep(0.5)
    assert _errors(browser) == []
    shown = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#warnings li")]
    assert len(shown) == 2 and any("line 2" in w for w in shown)
    browser.find_element(By.CSS_SELECTOR, 'a[data-tab="steps"]').click()
    steps = [o.text for o in Select(browser.find_element(By.ID, "step-select")).options]
    assert len(steps) == len(others) >= 1  # the damaged step is left out, the others are there
    _shot(browser, "damaged", tmp_path)


def test_sft_run_shows_its_curves_without_empty_panels_and_loss_apart_from_grad_norm(browser, tmp_path):
    """An SFT run logs loss, grad_norm and lr only: three panels, loss and grad norm each on its own axis,
    and one line naming what the run did not log (before: six empty panels, loss and grad norm on one)."""
    from grpokit.view.data import read_run
    from grpokit.view.page import clean, write_page

    run = tmp_path / "sft"
    run.mkdir()
    rows = [{"step": s, "loss": 2.0 / s, "grad_norm": 40.0 + s, "lr": 1e-5} for s in range(1, 11)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_page([clean(read_run(run))], run / "view.html")
    browser.get(page.as_uri())
    time.sleep(0.5)
    assert _errors(browser) == []
    titles = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#charts .chart h3")]
    assert titles == ["loss", "grad norm (before clipping)", "learning rate"]
    assert browser.find_elements(By.CSS_SELECTOR, "#charts .empty") == []
    assert "KL to the reference" in browser.find_element(By.ID, "not-logged").text
    loss_labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#charts .chart:first-child .u-legend .u-label")]
    assert any(label.startswith("loss") for label in loss_labels) and not any("grad_norm" in x for x in loss_labels)
    _shot(browser, "sft", tmp_path)


def test_token_line_is_cleared_on_a_step_change_and_nothing_is_clipped_at_800_px(runs, browser, tmp_path):
    a, _, page = runs
    browser.set_window_size(800, 1000)
    try:
        browser.get(page.as_uri())
        time.sleep(0.5)
        browser.find_element(By.CSS_SELECTOR, 'a[data-tab="steps"]').click()
        browser.find_element(By.CSS_SELECTOR, "#groups tr.group-row").click()
        browser.find_element(By.CSS_SELECTOR, "#completions tr.completion-row").click()
        browser.find_element(By.CSS_SELECTOR, "#token-view .tok").click()
        assert browser.find_element(By.ID, "token-info").text.startswith("token 0")
        _shot(browser, "steps_800px", tmp_path)
        width = browser.execute_script("return document.documentElement.clientWidth")
        scroll = browser.execute_script("return document.documentElement.scrollWidth")
        assert scroll <= width, f"the page is {scroll} px wide in a {width} px window"
        select = Select(browser.find_element(By.ID, "step-select"))
        select.select_by_index(len(select.options) - 1 if select.first_selected_option.text != select.options[-1].text else 0)
        assert browser.find_element(By.ID, "token-info").text == ""  # before: the other step's token
        assert _errors(browser) == []
    finally:
        browser.set_window_size(1500, 1100)


def test_curves_smoothing_chosen_metric_and_one_cursor(runs, browser, tmp_path):
    """The curves' controls: smoothing (TensorBoard's debiased moving average, computed here by hand), a
    panel for any logged metric, and one cursor for every panel."""
    from selenium.webdriver.common.action_chains import ActionChains

    a, _, page = runs
    browser.get(page.as_uri())
    time.sleep(0.5)
    raw = browser.execute_script("return window.grpokitView.charts[0].data[1].slice()")
    browser.execute_script(
        "const s = document.getElementById('smoothing'); s.value = '0.5'; s.dispatchEvent(new Event('input'));"
    )
    smoothed = browser.execute_script("return window.grpokitView.charts[0].data[1].slice()")
    v = [x for x in raw if x is not None]
    s = [x for x in smoothed if x is not None]
    assert s[0] == pytest.approx(v[0], rel=1e-9)  # debiased: the first point is itself
    assert s[1] == pytest.approx((0.5 * 0.5 * v[0] + 0.5 * v[1]) / (1 - 0.25), rel=1e-9)
    Select(browser.find_element(By.ID, "metric-select")).select_by_value("kl")
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#chart-chosen .u-legend .u-label")]
    assert any("kl" in label for label in labels), labels
    first, second = browser.find_elements(By.CSS_SELECTOR, "#charts .chart .u-over")[:2]
    ActionChains(browser).move_to_element(first).perform()
    time.sleep(0.2)
    shown = browser.find_elements(By.CSS_SELECTOR, "#charts .chart")[1].find_element(By.CSS_SELECTOR, ".u-legend .u-value").text
    assert shown not in ("", "--"), shown  # the second panel follows the cursor of the first
    assert _errors(browser) == []
    _shot(browser, "curves_controls", tmp_path)


def test_the_sampler_trainer_mismatch_has_its_panel(browser, tmp_path):
    """sampler_kl and sampler_logprob_diff/mean (issue 41: any engine, vLLM's above all) share a panel."""
    from grpokit.view.data import read_run
    from grpokit.view.page import clean, write_page

    run = tmp_path / "engine"
    run.mkdir()
    rows = [
        {"step": s, "loss": 1.0, "sampler_kl": 1e-6 * s, "sampler_logprob_diff/mean": 1e-3 * s} for s in range(1, 6)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    browser.get(write_page([clean(read_run(run))], run / "view.html").as_uri())
    time.sleep(0.5)
    assert _errors(browser) == []
    titles = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#charts .chart h3")]
    assert titles == ["sampler vs trainer: KL (k3) and mean |log-prob gap|", "loss"]


def test_the_ground_truth_is_shown_beside_the_completions(runs, browser, tmp_path):
    """Each group shows its row's answer (the demo's "answer" column, math_accuracy's) above its completions:
    the sum its prompt asks for, as the rollouts file recorded it (issue 38)."""
    a, _, page = runs
    browser.set_window_size(1200, 900)
    try:
        browser.get(page.as_uri())
        browser.find_element(By.CSS_SELECTOR, 'a[data-tab="steps"]').click()
        table, meta = read_rollouts(rollout_files(a)[-1])
        t, G = table.to_pydict(), meta["group_size"]
        assert meta["ground_truth_column"] == "answer"
        Select(browser.find_element(By.ID, "step-select")).select_by_visible_text(f"step {meta['step']}")
        for g in (0, len(t["prompt"]) // G - 1):
            browser.find_element(By.CSS_SELECTOR, f'#groups tr.group-row[data-group="{g}"]').click()
            x, y = t["prompt"][g * G].rstrip("=").split("+")
            assert t["ground_truth"][g * G] == str(int(x) + int(y))  # "3+4=" -> "7"
            assert browser.find_element(By.ID, "g-truth-value").text == str(int(x) + int(y))
            assert "(column answer)" in browser.find_element(By.ID, "g-truth").text
            truth = browser.find_element(By.ID, "g-truth").rect
            completions = browser.find_element(By.ID, "completions").rect
            assert truth["y"] + truth["height"] <= completions["y"]  # above the completions, not hidden
        _shot(browser, "ground_truth", tmp_path, browser.find_element(By.ID, "group-detail"))
        assert _errors(browser) == []
    finally:
        browser.set_window_size(1500, 1100)


def test_overlaid_runs_have_a_legend_one_can_read(runs, browser, tmp_path):
    """Two runs overlaid (issue 38): a run key names each run beside its line style; in each panel's legend
    one entry per line, each metric's runs one under the other, each entry's marker its line (the metric's
    colour, the run's dash as a border style), and no entry cut or spilling out of its panel."""
    a, b, page = runs
    browser.get(page.as_uri())
    time.sleep(0.5)
    key = browser.find_elements(By.CSS_SELECTOR, "#run-key .run")
    assert [k.text.strip() for k in key] == [a.name, b.name]
    dashes = [k.find_element(By.TAG_NAME, "line").get_attribute("stroke-dasharray") for k in key]
    assert dashes == [None, "8 5"]  # run a solid, run b dashed: the lines' own patterns
    chart = browser.find_element(By.ID, "chart-0")
    entries = chart.find_elements(By.CSS_SELECTOR, ".u-legend tr.u-series")[1:]  # after the step's
    by_run = {}
    for entry in entries:
        metric = entry.find_element(By.CSS_SELECTOR, ".u-label").text.split(": ", 1)[1]
        marker = entry.find_element(By.CSS_SELECTOR, ".u-marker")
        style = browser.execute_script("const s = getComputedStyle(arguments[0]); return [s.borderTopStyle, s.borderTopColor, s.borderLeftStyle, s.height, s.borderTopWidth]", marker)
        by_run.setdefault(entry.get_attribute("data-run"), {})[metric] = (entry.rect, style)
    assert set(by_run) == {a.name, b.name} and by_run[a.name].keys() == by_run[b.name].keys()
    assert "reward/total/mean" in by_run[a.name]
    for metric, (rect_a, style_a) in by_run[a.name].items():
        rect_b, style_b = by_run[b.name][metric]
        assert rect_b["y"] == pytest.approx(rect_a["y"] + rect_a["height"], abs=2)  # run b's entry right under a's
        assert rect_a["x"] == rect_b["x"]  # one entry per line, aligned
        assert style_a[0] == "solid" and style_b[0] == "dashed" and style_a[1] == style_b[1]  # the metric's colour
        assert style_a[2] == "none" and style_a[3] == style_a[4] == "2px"  # a line (its top border), not a box
    legend = chart.find_element(By.CSS_SELECTOR, ".u-legend")
    assert browser.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth", legend)
    for entry in entries:  # nothing cut: each entry as wide as its content
        assert browser.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth + 1", entry)
    _shot(browser, "legends", tmp_path, chart)
    assert _errors(browser) == []


@pytest.mark.slow  # a 2-step tiny GRPO run with the entropy bonus, then the page
def test_the_objective_subtracts_the_entropy_bonus_and_the_total_is_the_logged_loss(browser, tmp_path):
    """With algo.entropy_coef the update minimised L = aggregate - alpha * H-bar: the step's recomputed loss is
    metrics.jsonl's (one mini-batch a step), the entropy the bonus acted on is its entropy/bonus, and the group's
    objective shows alpha, H-bar and the bonus (before: the page's loss left the bonus out)."""
    from grpo_runs import recording_trainer

    from grpokit.view.data import read_run
    from grpokit.view.page import clean, write_page

    run = tmp_path / "bonus"
    recording_trainer(run, "algo.entropy_coef=0.05", "optim.mini_batches=1").train()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    browser.get(write_page([clean(read_run(run))], run / "view.html").as_uri())
    time.sleep(0.5)
    browser.find_element(By.CSS_SELECTOR, 'a[data-tab="steps"]').click()
    summary = browser.find_element(By.ID, "step-totals")
    loss_row = summary.find_element(By.CSS_SELECTOR, 'tr[data-key="loss"]')
    assert _value(loss_row.find_element(By.CSS_SELECTOR, "td.logged")) == pytest.approx(logged["loss"], rel=1e-5)
    assert _value(loss_row.find_element(By.CSS_SELECTOR, "td.saved")) == pytest.approx(logged["loss"], rel=1e-4, abs=1e-7)
    bonus_row = summary.find_element(By.CSS_SELECTOR, 'tr[data-key="entropy/bonus"]')
    assert _value(bonus_row.find_element(By.CSS_SELECTOR, "td.saved")) == pytest.approx(logged["entropy/bonus"], rel=1e-4)
    objective = browser.find_element(By.ID, "objective")
    assert "α = 0.0500" in objective.text and "− α · H̄ =" in objective.text
    h_bar = float(browser.find_element(By.ID, "obj-bonus-entropy").text)
    assert float(browser.find_element(By.ID, "obj-bonus").text) == pytest.approx(0.05 * h_bar, rel=1e-3)
    _shot(browser, "entropy_bonus", tmp_path, objective)
    _shot(browser, "entropy_bonus_step", tmp_path, browser.find_element(By.ID, "step-summary"))
    assert _errors(browser) == []


def test_the_group_detail_follows_the_group_filter(runs, browser, tmp_path):
    """A filter that hides the selected group moves the detail pane to the first group shown, or empties it when no
    group matches (issue 52: it kept showing a group the filter had taken out)."""
    a, _, page = runs
    browser.get(page.as_uri())
    time.sleep(0.5)
    browser.find_element(By.CSS_SELECTOR, 'a[data-tab="steps"]').click()
    detail = lambda: browser.find_element(By.ID, "g-stats").text  # noqa: E731
    rows = browser.find_elements(By.CSS_SELECTOR, "#groups tr.group-row")
    rows[-1].click()  # the last group, which no narrowing filter below keeps first
    chosen = int(rows[-1].get_attribute("data-group"))
    assert detail().startswith(f"group {chosen}:")
    flat = "flat" in rows[-1].text
    Select(browser.find_element(By.ID, "group-filter")).select_by_value("spread" if flat else "flat")
    shown = [int(r.get_attribute("data-group")) for r in browser.find_elements(By.CSS_SELECTOR, "#groups tr.group-row")]
    assert chosen not in shown
    if shown:
        assert detail().startswith(f"group {shown[0]}:")
        assert browser.find_element(By.CSS_SELECTOR, "#groups tr.group-row.selected").get_attribute("data-group") == str(shown[0])
    else:
        assert browser.find_element(By.ID, "no-group").text == "No group matches the filter."
    Select(browser.find_element(By.ID, "group-filter")).select_by_value("failed")  # no reward failed in these runs
    assert browser.find_elements(By.CSS_SELECTOR, "#groups tr.group-row") == []
    assert browser.find_element(By.ID, "no-group").text == "No group matches the filter."
    assert browser.find_element(By.ID, "token-view").text == "" and browser.find_element(By.ID, "objective").text == ""
    _shot(browser, "filter_none", tmp_path)
    Select(browser.find_element(By.ID, "group-filter")).select_by_value("all")
    first = browser.find_element(By.CSS_SELECTOR, "#groups tr.group-row").get_attribute("data-group")
    assert detail().startswith(f"group {first}:")
    assert _errors(browser) == []

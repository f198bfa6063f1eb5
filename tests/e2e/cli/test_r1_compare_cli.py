"""The R1 comparison's quoted numbers (docs/guides/r1-pipeline.md, "The recipe against RL alone at equal
compute"): one check holds the page's tables to the raw results file they came from, with no run; the other
reruns seed 0 of the quoted command, for real (the demo's own pipeline, its shipped model, one
``grpokit pipeline`` process on one thread: about 2 minutes), and fails when seed 0's row no longer reproduces
within the noise the page states. The row and the noise are read from the page itself, so the page and these
checks cannot drift."""

import json
import re
import statistics

import pytest
import yaml
from paths import REPO

from grpokit.demos.r1 import RECIPE_AFTER_COLD_START, demo_pipeline
from grpokit.demos.r1_compare import compare, run_seeds, table_markdown

PAGE = REPO / "docs" / "guides" / "r1-pipeline.md"
HALF = 5e-4 + 1e-9  # half of the last printed digit of a percentage with one decimal, as a share
STAGES = ("base", "cold_start", "reason", "distill", "final", "rl_alone")


def section() -> str:
    text = PAGE.read_text()
    start = text.index("### The recipe against RL alone at equal compute (measured)")
    end = min(
        (i for i in (text.find("\n## ", start), text.find("\n### ", start + 4)) if i > 0), default=len(text)
    )
    return text[start:end]


def quoted() -> dict:
    """The page's per-seed accuracies (shares), its arm table, the per-seed difference, the raw results file
    it names and the noise it states."""
    text = section()
    flat = " ".join(text.split())

    def find(pattern: str, where: str = flat) -> tuple[str, ...]:
        m = re.search(pattern, where, re.S)
        assert m, f"{PAGE.name}: the comparison's section no longer says {pattern!r}"
        return m.groups()

    header = "| seed | " + " | ".join(STAGES) + " |"
    assert header in text, f"{PAGE.name}: the per-seed table's header is no longer {header!r}"
    rows = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\| (\d+|mean) \| (.*) \|", line.strip())
        if m:
            values = [float(v.rstrip("%")) / 100 for v in m.group(2).split(" | ")]
            assert len(values) == len(STAGES), f"{PAGE.name}: {line!r} has not one accuracy per stage"
            rows[m.group(1)] = dict(zip(STAGES, values))
    num = r"(-?[\d.]+)"
    spread = rf"{num} ± {num}% \({num}-{num}\)"
    arms = {
        "recipe": find(rf"\| recipe \(reason \+ rejection \+ distill \+ final\) \| {spread} \| {spread} \|"),
        "rl_alone": find(rf"\| RL alone \(from the cold start\) \| {spread} \| {spread} \|"),
    }
    (steps_mean, steps_std) = find(r"\| ([\d.]+) ± ([\d.]+) GRPO \|")
    difference = find(
        rf"RL alone minus the recipe, per seed: {num} ± {num} points of accuracy \({num} to {num}\)"
    )
    (raw,) = find(r"\[docs/bench-results/([\w.-]+\.json)\]")
    stage_noise, alone_noise, step_noise, lead = find(
        rf"every stage of seed 0 is within {num} points.*?RL alone within {num} points and within (\d+) steps"
        rf".*?the recipe ahead of RL alone by at least {num} points"
    )
    (quiet_steps,) = find(r"\((\d+) steps on the quiet run")
    return {
        "seeds": {int(k): v for k, v in rows.items() if k != "mean"},
        "mean": rows["mean"],
        "arms": {a: [float(v) / 100 for v in values] for a, values in arms.items()},
        "steps": (float(steps_mean), float(steps_std)),
        "difference": [float(v) / 100 for v in difference],
        "raw": REPO / "docs" / "bench-results" / raw,
        "noise": {
            "stage": float(stage_noise) / 100,
            "rl_alone": float(alone_noise) / 100,
            "steps": int(step_noise),
            "lead": float(lead) / 100,
        },
        "quiet_steps": int(quiet_steps),
    }


def test_the_page_states_the_raw_results_of_every_seed():
    """No run: every number of the page's tables is the raw results file's, rounded as printed."""
    q = quoted()
    recorded = json.loads(q["raw"].read_text())
    seeds = {int(k): v for k, v in recorded["seeds"].items()}
    assert sorted(q["seeds"]) == sorted(seeds) and len(seeds) >= 4
    for seed, row in q["seeds"].items():
        for stage in STAGES:
            assert row[stage] == pytest.approx(seeds[seed]["stages"][stage]["accuracy"], abs=HALF), (
                seed,
                stage,
            )
    for stage in STAGES:
        assert q["mean"][stage] == pytest.approx(
            statistics.fmean(r[stage] for r in q["seeds"].values()), abs=HALF
        )
    s = recorded["summary"]
    for arm in ("recipe", "rl_alone"):
        printed = q["arms"][arm]
        for i, key in enumerate(("accuracy", "format")):
            got = s[arm][key]
            assert printed[4 * i : 4 * i + 4] == pytest.approx(
                [got["mean"], got["std"], got["min"], got["max"]], abs=HALF
            ), (arm, key)
        assert s[arm]["accuracy"]["mean"] == pytest.approx(
            statistics.fmean(seeds[k][arm]["accuracy"] for k in seeds), abs=1e-12
        )
    assert q["steps"] == pytest.approx(
        (s["rl_alone"]["steps"]["mean"], s["rl_alone"]["steps"]["std"]), abs=0.5
    )
    d = s["accuracy_difference"]
    assert q["difference"] == pytest.approx([d["mean"], d["std"], d["min"], d["max"]], abs=HALF)
    # the stated noise is narrower than what separates the arms, or the check could not fail on a flipped result
    assert q["noise"]["stage"] <= 0.025 and q["noise"]["rl_alone"] <= 0.05 and q["noise"]["lead"] >= 0.1
    assert abs(q["quiet_steps"] - q["steps"][0]) <= q["noise"]["steps"]


def test_each_seed_seeds_every_stage():
    paths = {name: f"/x/{name}" for name in ("base", "train", "eval", "cold_start")}
    for seed in (0, 3):
        stages = {s["name"]: s["set"] for s in demo_pipeline(paths, seed=seed)["stages"]}
        seeded = {name: s.get("train.seed", s.get("sample.seed")) for name, s in stages.items()}
        assert set(seeded.values()) == {seed}, seeded


@pytest.mark.slow  # one grpokit pipeline process, six stages and seven held-out evaluations: about 2 minutes
def test_seed_0_of_the_quoted_comparison_reproduces(tmp_path, monkeypatch):
    q = quoted()
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))  # a fresh machine: the base is built here
    out = tmp_path / "r1-compare"
    folders = run_seeds(out, [0], jobs=1, log=lambda m: None)
    result = compare(folders, [0])
    got, row = result["seeds"][0], q["seeds"][0]

    off = []
    for stage in STAGES:
        noise = q["noise"]["rl_alone" if stage == "rl_alone" else "stage"]
        measured = got["stages"][stage]["accuracy"]
        if abs(measured - row[stage]) > noise + 1e-9:
            off.append(f"seed 0, {stage}: measured {measured:.1%}, the page quotes {row[stage]:.1%}")
    steps = got["rl_alone"]["steps"]
    quoted_steps = json.loads(q["raw"].read_text())["seeds"]["0"]["rl_alone"]["steps"]
    if abs(steps - quoted_steps) > q["noise"]["steps"]:
        off.append(f"seed 0, RL alone took {steps} steps, the raw results {quoted_steps}")
    lead = got["recipe"]["accuracy"] - got["rl_alone"]["accuracy"]
    if lead < q["noise"]["lead"]:
        off.append(
            f"seed 0: the recipe leads RL alone by {lead:.1%}, the page says at least {q['noise']['lead']:.0%}"
        )
    assert not off, (
        f"{PAGE.relative_to(REPO)}'s R1 comparison no longer reproduces (rerun the command quoted there and update "
        "the page and its raw results):\n" + "\n".join(off)
    )

    # the comparison's own bookkeeping: RL alone got the CPU seconds the recipe's four stages recorded, and
    # stopped there by itself
    folder = folders[0]
    states = {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/stage.json")}
    used = [states[f"{i:02d}-{name}"] for i, name in enumerate(RECIPE_AFTER_COLD_START, start=2)]
    charged = sum(s["summary"].get("train_cpu_seconds", s["summary"].get("cpu_seconds")) for s in used)
    alone = states["06-rl_alone"]
    assert alone["cpu_budget"]["seconds"] == pytest.approx(charged, rel=1e-12) and charged > 0
    assert f"train.max_cpu_seconds={charged!r}" in alone["command"]
    assert alone["summary"]["budget_reached"].startswith(f"train.max_cpu_seconds={charged:g} reached")
    assert alone["summary"]["train_cpu_seconds"] >= charged
    assert states["02-reason"]["summary"]["steps"] == 30  # no budget: train.steps
    assert got["recipe"]["cpu_s"] == pytest.approx(charged)
    assert got["rl_alone"]["steps"] == alone["summary"]["steps"]
    assert yaml.safe_load((folder / "pipeline.yaml").read_text())["stages"][1]["set"]["train.seed"] == 0
    assert (folder / "stages.png").is_file()
    table = table_markdown(result)
    assert "| arm (1 seeds) |" in table and table.count("\n| 0 |") == 1

"""How the R1 comparison (grpokit.demos.r1_compare) reads finished seed folders and sums them up: the recipe
scored by its final stage and charged the CPU seconds of reason + rejection + distill + final, RL alone by its
own stage, means and sample standard deviations by hand."""

import json

import pytest

from grpokit.demos.r1_compare import compare, table_markdown


def seed_folder(root, seed, final_acc, alone_acc, alone_steps):
    """A finished seed's stages.json (rows as grpokit.pipeline.report.stage_row writes them) and rl_alone's
    stage.json: reason 10 CPU s, rejection 5, distill 3, final 2 (the cold start's 100 is not charged)."""
    folder = root / f"seed-{seed}"
    (folder / "06-rl_alone").mkdir(parents=True)
    stages = [
        ("00-base", "model", 0.06, None, None),
        ("01-cold_start", "sft", 0.27, 100.0, 101.0),
        ("02-reason", "rl", 0.25, 10.0, 12.0),
        ("03-rejection", "sample", None, 5.0, 6.0),
        ("04-distill", "sft", 0.50, 3.0, 4.0),
        ("05-final", "rl", final_acc, 2.0, 3.0),
        ("06-rl_alone", "rl", alone_acc, 20.5, 26.0),
    ]
    rows = [
        {"stage": s, "kind": k, "accuracy": a, "format": None if a is None else 1.0, "work_cpu_s": c, "work_s": w,
         "note": ""}
        for s, k, a, c, w in stages
    ]  # fmt: skip
    (folder / "stages.json").write_text(json.dumps(rows))
    state = {"cpu_budget": {"seconds": 20.0}, "summary": {"steps": alone_steps}}
    (folder / "06-rl_alone" / "stage.json").write_text(json.dumps(state))
    return folder


def test_the_arms_and_their_spread_over_seeds(tmp_path):
    folders = [
        seed_folder(tmp_path, 0, 0.5, 0.55, 100),
        seed_folder(tmp_path, 1, 0.6, 0.45, 110),
        seed_folder(tmp_path, 2, 0.7, 0.65, 120),
    ]
    result = compare(folders, [0, 1, 2])
    s = result["summary"]
    # recipe 0.5, 0.6, 0.7: mean 0.6, deviations -0.1, 0, 0.1 -> sample std sqrt(0.02 / 2) = 0.1
    assert s["recipe"]["accuracy"]["mean"] == pytest.approx(0.6)
    assert s["recipe"]["accuracy"]["std"] == pytest.approx(0.1)
    # charged 10 + 5 + 3 + 2 = 20 CPU s, 12 + 6 + 4 + 3 = 25 wall s, the same in every seed: no spread
    assert s["recipe"]["cpu_s"] == {"mean": 20.0, "std": 0.0, "min": 20.0, "max": 20.0}
    assert s["recipe"]["wall_s"]["mean"] == 25.0
    # RL alone 0.55, 0.45, 0.65: mean 0.55, std 0.1; per seed minus the recipe: +0.05, -0.15, -0.05
    assert s["rl_alone"]["accuracy"]["mean"] == pytest.approx(0.55)
    assert s["accuracy_difference"]["mean"] == pytest.approx(-0.05)
    assert s["accuracy_difference"]["std"] == pytest.approx(0.1)
    assert (s["accuracy_difference"]["min"], s["accuracy_difference"]["max"]) == pytest.approx((-0.15, 0.05))
    assert s["rl_alone"]["steps"]["mean"] == 110 and s["rl_alone"]["cpu_s"]["mean"] == 20.5
    assert result["seeds"][1]["rl_alone"]["budget_cpu_s"] == 20.0
    assert list(s["stages"]) == ["base", "cold_start", "reason", "distill", "final", "rl_alone"]
    table = table_markdown(result)
    assert (
        "| RL alone | 55.0 ± 10.0% (45.0-65.0) | 100.0 ± 0.0% (100.0-100.0) | 20.5 ± 0.0 | 26.0 ± 0.0 | 110 ± 10 |"
        in table
    )
    assert "RL alone - recipe, accuracy, per seed: -5.0 ± 10.0 points (-15.0 to +5.0)." in table
    assert "| 1 | 6.0% | 27.0% | 25.0% | 50.0% | 60.0% | 45.0% | 20.0 | 20.5 (20.0) | 110 |" in table


def test_an_unfinished_seed_is_named(tmp_path):
    folder = seed_folder(tmp_path, 0, 0.5, 0.5, 100)
    rows = json.loads((folder / "stages.json").read_text())
    (folder / "stages.json").write_text(json.dumps(rows[:-1]))  # rl_alone not run yet
    with pytest.raises(
        SystemExit, match=r"seed-0/stages.json has no stage 'rl_alone': is the run finished\?"
    ):
        compare([folder], [0])

"""The R1 comparison at a tiny size, for real: the demo's own pipeline (grpokit.demos.r1.demo_pipeline) on a
tiny random model, every stage shrunk, two seeds run at once as grpokit pipeline processes. RL alone gets the
CPU seconds the recipe's four stages after the cold start recorded, and stops there by itself."""

import json

import pytest
import yaml
from tiny_model import save_tiny_model

from grpokit.demos.r1 import RECIPE_AFTER_COLD_START, chain, demo_pipeline
from grpokit.demos.r1_compare import compare, run_seeds, table_markdown

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(6)]


def shrink(pipeline: dict) -> dict:
    """The demo's pipeline at a tiny size: 2-step SFT and GRPO stages, 4 prompts sampled and every sample
    kept (a random model passes nothing), 4 held-out rows; RL alone bounded at 200 steps (its budget stops
    it first)."""
    for stage in pipeline["stages"]:
        s = stage["set"]
        if stage["kind"] == "sft":
            s.update({"train.steps": 2, "sft.batch_size": 4, "train.save_every": 0})
        elif stage["kind"] == "rl":
            s.update({"rollout.group_size": 2, "rollout.prompts_per_step": 2, "train.samples_every": 0})
            s.update(
                {"train.steps": 200 if stage["name"] == "rl_alone" else 2, "train.stop_after_flat_steps": 0}
            )
        else:
            s.update({"sample.limit": 4, "sample.n": 2, "keep.drop_truncated": False})
            s["rewards"] = [{**r, "min": None} for r in s["rewards"]]
    pipeline["eval"]["limit"] = 4
    return pipeline


@pytest.mark.slow  # 2 x 6 stage processes and 12 evaluations: a few minutes on a loaded 2-core machine
def test_two_seeds_of_the_demo_at_a_tiny_size(tmp_path):
    root = tmp_path / "files"
    paths = {"base": save_tiny_model(root / "model")}
    for name, rows in (("train", ROWS[:30]), ("eval", ROWS[30:])):
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    cold = [{"prompt": r["prompt"], "completion": chain(r["prompt"])} for r in ROWS[:8]]
    paths["cold_start"] = root / "cold_start.jsonl"
    paths["cold_start"].write_text("".join(json.dumps(r) + "\n" for r in cold))

    def write_pipeline(folder, seed):
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "pipeline.yaml"
        path.write_text(yaml.safe_dump(shrink(demo_pipeline(paths, seed=seed)), sort_keys=False))
        return path

    out = tmp_path / "compare"
    folders = run_seeds(out, [0, 1], jobs=2, write_pipeline=write_pipeline, log=lambda m: None)
    result = compare(folders, [0, 1])
    for seed, folder in zip((0, 1), folders):
        states = {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/stage.json")}
        used = [states[f"{i:02d}-{name}"] for i, name in enumerate(RECIPE_AFTER_COLD_START, start=2)]
        charged = sum(s["summary"].get("train_cpu_seconds", s["summary"].get("cpu_seconds")) for s in used)
        alone = states["06-rl_alone"]
        assert alone["cpu_budget"]["seconds"] == pytest.approx(charged, rel=1e-12) and charged > 0
        assert f"train.max_cpu_seconds={charged!r}" in alone["command"]
        assert alone["summary"]["budget_reached"].startswith(f"train.max_cpu_seconds={charged:g} reached")
        assert alone["summary"]["train_cpu_seconds"] >= charged and alone["summary"]["steps"] < 200
        assert states["02-reason"]["summary"]["steps"] == 2  # no budget: train.steps
        arms = result["seeds"][seed]
        assert arms["recipe"]["cpu_s"] == pytest.approx(charged)
        assert arms["rl_alone"]["steps"] == alone["summary"]["steps"]
        assert (folder / "stages.png").is_file()
    assert yaml.safe_load((folders[1] / "pipeline.yaml").read_text())["stages"][1]["set"]["train.seed"] == 1
    table = table_markdown(result)
    assert "| arm (2 seeds) |" in table and table.count("\n| 0 |") == table.count("\n| 1 |") == 1

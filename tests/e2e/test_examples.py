"""Every config in examples/ runs, from the repository's root as its header says: SFT, rejection sampling,
GRPO and a pipeline of the three on the demo's shipped model, as they are (they are sized for a CPU); the
tool and environment runs (written for Qwen2.5-0.5B-Instruct) on the tiny Qwen2 of the multi-turn tests,
for one step."""

import json

import pytest
from paths import REPO
from tool_model import tool_model

from grpokit.cli.main import main

EXAMPLES = REPO / "examples"


def test_every_example_config_loads_with_its_kind(monkeypatch):
    from grpokit.config.schema import load_config
    from grpokit.config.sft import load_sft_config
    from grpokit.pipeline.spec import check_stage_configs, load_pipeline
    from grpokit.trainers.sample import load_sample_config

    monkeypatch.chdir(REPO)
    kinds = {
        "sft-": load_sft_config,
        "sample-": load_sample_config,
        "pipeline-": lambda p: check_stage_configs(load_pipeline(p)),
    }
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert {f.name.split("-")[0] for f in files} >= {"sft", "sample", "pipeline", "tools", "environment", "grpo"}
    for f in files:
        load = next((fn for prefix, fn in kinds.items() if f.name.startswith(prefix)), load_config)
        load(f.relative_to(REPO))


@pytest.mark.slow
def test_sft_sample_and_grpo_examples_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(["sft", "examples/sft-addition.yaml", "--output-dir", str(tmp_path / "sft")]) == 0
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert summary["steps"] == 20 and (tmp_path / "sft" / "checkpoints").is_dir()
    assert main(["sample", "examples/sample-addition.yaml", "--output-dir", str(tmp_path / "sample")]) == 0
    kept = (tmp_path / "sample" / "samples.jsonl").read_text().splitlines()
    assert 0 < len(kept) <= 32  # at most one per prompt, and the demo model gets some right
    assert main(["train", "examples/grpo-addition.yaml", "train.steps=2", "--output-dir", str(tmp_path / "rl")]) == 0
    assert len((tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_pipeline_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "pipe"
    assert main(["pipeline", "examples/pipeline-addition.yaml", "--output-dir", str(out)]) == 0
    stages = ["01-rejection", "02-distill", "03-reason"]
    assert set(stages) <= {p.name for p in out.iterdir() if p.is_dir()}  # and 00-base, the base's evaluation
    for folder in stages:
        assert json.loads((out / folder / "stage.json").read_text())["status"] == "done"


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory):
    """The multi-turn tests' tiny Qwen2 (a chat template that renders tools and tool results), saved."""
    from grpokit.model.loading import save_local_tokenizer

    path = tmp_path_factory.mktemp("tiny_chat")
    model, tok = tool_model()
    model.save_pretrained(path)
    save_local_tokenizer(tok, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["tools-qwen2.5-0.5b.yaml", "environment-guess.yaml", "environment-tools.yaml", "environment-trl.yaml"]
)
def test_multi_turn_examples_run_one_step(name, tiny_chat_model, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    small = [
        f"model.name_or_path={tiny_chat_model}", "model.dtype=float32", "model.device=cpu", "train.steps=1",
        "rollout.group_size=2", "rollout.prompts_per_step=2", "rollout.max_new_tokens=8",
        "rollout.max_episode_tokens=48", "train.tensorboard=false",
    ]  # fmt: skip
    out = tmp_path / "run"
    assert main(["train", f"examples/{name}", *small, "--output-dir", str(out)]) == 0
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["step"] == 1 and "episode/turns_mean" in metrics
    if name == "environment-trl.yaml":  # the TRL environment's get_reward and the reward over its environments
        assert {"reward/Calculator/mean", "reward/used_the_tool/mean"} <= set(metrics)


def test_sample_names_a_missing_reward_column_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """math_accuracy reads `answer`: rows without it are refused before any model is read (here the model
    folder does not even exist, which the old order reported first; before that a missing column failed
    at the first scoring, after a batch had been generated)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+2="}\n{"prompt": "3+4="}\n')
    code = main([
        "sample", str(EXAMPLES / "sample-addition.yaml"), "data.train=prompts.jsonl",
        "model.name_or_path=no_such_model_folder", "--output-dir", str(tmp_path / "out"),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "answer" in err and "prompts.jsonl" in err and "no_such_model_folder" not in err, err


def test_sft_names_a_bad_row_before_the_weights_load(tmp_path, monkeypatch, capsys):
    """Every training row is tokenized with the model's tokenizer before its weights load: a row longer
    than data.max_length is named before load_model is called (the old order loaded the model first, minutes
    for a large one; the spy below stands for that load and fails if it is reached)."""
    import grpokit.trainers.sft as sft_trainer

    def load_reached(*args, **kwargs):
        raise AssertionError("the model was loaded before the rows were checked")

    monkeypatch.setattr(sft_trainer, "load_model", load_reached)
    monkeypatch.chdir(tmp_path)
    rows = ['{"prompt": "1+2=", "completion": "<answer>3</answer>"}', '{"prompt": "1+2=", "completion": "' + "9" * 80 + '"}']
    (tmp_path / "sft.jsonl").write_text("\n".join(rows) + "\n")
    from grpokit.demos.default import SHIPPED_DIR

    code = main([
        "sft", str(EXAMPLES / "sft-addition.yaml"), f"model.name_or_path={SHIPPED_DIR}", "data.train=sft.jsonl",
        "--output-dir", str(tmp_path / "out"),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "data.max_length" in err and "sft.jsonl" in err, err

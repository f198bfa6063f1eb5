"""End-to-end training on tiny real transformers: the loop, metrics, checkpoints, resume."""

import json

import pytest
import torch
from grpo_runs import ROWS, has_seven, make_cfg, make_trainer
from tiny_model import make_tiny_model
from transformers import AutoModelForCausalLM

from grpokit.core.errors import TrainingError
from grpokit.trainers.grpo import GRPOTrainer

STEP_FIELDS = [
    "reward/total/mean",
    "reward/has_seven/mean",
    "accuracy",
    "zero_variance_frac",
    "completion_len/mean",
    "completion_len/correct",
    "completion_len/incorrect",
    "truncated_frac",
    "kl",
    "clip_frac_low",
    "clip_frac_high",
    "entropy",
    "grad_norm",
    "lr",
    "time/generation",
    "time/scoring",
    "time/reference",
    "time/update",
    "tokens_per_s",
    "peak_memory_mb",
    "sampler_logprob_diff/mean",
    "sampler_logprob_diff/max",
]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_end_to_end_metrics_checkpoint_and_reload(tmp_path):
    trainer = make_trainer(tmp_path)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    summary = trainer.train()
    changed = [not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters())]
    assert all(changed), "every parameter should receive an update"

    run = tmp_path / "run"
    lines = read_jsonl(run / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3]
    for field in STEP_FIELDS:
        assert field in lines[-1], f"metrics.jsonl lacks {field}"
    assert lines[-1]["kl"] > 0  # the policy moved away from the beta=0.04 reference
    assert (run / "config.yaml").is_file() and (run / "curves.png").stat().st_size > 10_000
    assert (run / "tensorboard").is_dir() and list((run / "samples").glob("step_*.jsonl"))
    assert {"eval_accuracy_before", "eval_accuracy_after"} <= set(
        json.loads((run / "summary.json").read_text())
    )

    reloaded = AutoModelForCausalLM.from_pretrained(summary["checkpoint"])
    for (name, p), q in zip(trainer.model.named_parameters(), reloaded.parameters()):
        assert torch.equal(p, q), name


@pytest.mark.slow
def test_resume_reproduces_uninterrupted_run(tmp_path):
    keys = ["reward/total/mean", "loss", "kl", "grad_norm", "entropy", "clip_frac", "completion_len/mean"]
    straight = make_trainer(tmp_path / "a", "train.steps=4")
    straight.train()
    want = read_jsonl(tmp_path / "a" / "run" / "metrics.jsonl")[3]

    first = make_trainer(tmp_path / "b", "train.steps=3", "train.save_every=1")
    first.train()  # stops after step 3, checkpoint at step 3
    second = make_trainer(tmp_path / "b", "train.steps=4", resume=True)
    assert second.step == 3
    second.train()
    got = read_jsonl(tmp_path / "b" / "run" / "metrics.jsonl")
    assert [line["step"] for line in got] == [1, 2, 3, 4]
    for k in keys:
        assert got[3][k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k


def test_reward_rises_on_a_tiny_task(tmp_path):
    trainer = make_trainer(
        tmp_path,
        "train.steps=12",
        "train.samples_every=0",
        "rollout.prompts_per_step=8",
        "rollout.group_size=8",
        "optim.mini_batches=1",
        "optim.micro_batch_size=64",
        "optim.lr=1e-3",
        "algo.beta=0.0",
        "eval.enabled=false",
        "train.tensorboard=false",
    )
    trainer.train()
    lines = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    first = lines[0]["reward/total/mean"]  # sampled before any update: the random model's rate
    late = sum(line["reward/total/mean"] for line in lines[-5:]) / 5
    assert first < 0.5 and late > first + 0.3, (first, late)


@pytest.mark.parametrize("preset", ["dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp"])
def test_every_preset_trains(tmp_path, preset):
    trainer = make_trainer(
        tmp_path,
        f"algo.preset={preset}",
        "train.steps=1",
        "eval.enabled=false",
        "algo.max_sampling_rounds=20",
    )
    trainer.train()
    line = read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]
    if preset == "dapo":
        # the random model never ends within 6 tokens: overlong shaping scores every completion and
        # overlong filtering masks every one of them out of the loss, so no gradient flows
        assert line["truncated_frac"] == 1.0 and line["reward/overlong_penalty/mean"] < 0
        assert line["grad_norm"] == 0.0
    else:
        assert line["grad_norm"] > 0


def test_dynamic_sampling_gives_up_with_clear_error(tmp_path):
    from grpokit.core.errors import TrainingError

    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = make_cfg(
        tmp_path,
        "algo.preset=dapo",
        "algo.overlong_shaping=false",
        "algo.max_sampling_rounds=1",
        "eval.enabled=false",
    )
    constant = [("always_one", lambda prompts, completions, **kw: [1.0] * len(completions), 1.0)]
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=constant)
    with pytest.raises(TrainingError, match=r"dynamic sampling: after 2 sampling rounds only 0 of 4 groups"):
        trainer.train()


# ----------------------------------------------------------------------------- bad input


def run_cli(*args):
    from grpokit.cli.main import main

    return main(["train", *args])


def test_missing_data_file_names_it(tmp_path, capsys):
    from tiny_model import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "m")
    code = run_cli(
        f"model.name_or_path={model_dir}",
        f"data.train={tmp_path / 'nope.jsonl'}",
        f"train.output_dir={tmp_path / 'run'}",
    )
    assert code == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_missing_prompt_column_and_empty_dataset(tmp_path, capsys):
    from tiny_model import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "m")
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n')
    assert (
        run_cli(f"model.name_or_path={model_dir}", f"data.train={data}", f"train.output_dir={tmp_path / 'r'}")
        == 2
    )
    err = capsys.readouterr().err
    assert "d.jsonl" in err and "prompt" in err and "question" in err
    data.write_text("")
    assert (
        run_cli(f"model.name_or_path={model_dir}", f"data.train={data}", f"train.output_dir={tmp_path / 'r'}")
        == 2
    )
    assert "empty" in capsys.readouterr().err.lower()


def test_prompt_longer_than_limit_names_row(tmp_path):
    from grpokit.data.prompts import DataError

    model, tok = make_tiny_model("qwen2", seed=0)
    rows = [*ROWS[:3], {"prompt": "1+" * 40 + "1=", "answer": "41"}]
    cfg = make_cfg(tmp_path, "data.max_prompt_tokens=16")
    with pytest.raises(
        DataError, match=r"row index 3: the prompt is 82 tokens.*raise data.max_prompt_tokens"
    ):
        GRPOTrainer(
            cfg, model=model, tokenizer=tok, train_rows=rows, reward_functions=[("s", has_seven, 1.0)]
        )


def test_unknown_key_and_group_size_one_exit_cleanly(tmp_path, capsys):
    assert run_cli("rollout.group_sise=8", "model.name_or_path=x") == 2
    assert "Did you mean 'group_size'" in capsys.readouterr().err
    assert run_cli("rollout.group_size=1", "model.name_or_path=x") == 2
    assert "at least 2 completions" in capsys.readouterr().err


def test_broken_reward_functions_stop_the_run_with_the_reason(tmp_path):
    """A function failing on every row stops the run (TrainingError naming it, its error and the
    first failing row), whatever train.max_reward_failure_frac allows; it is never counted as 0."""

    def raises(prompts, completions, **kw):
        raise RuntimeError("verifier crashed")

    def wrong_length(prompts, completions, **kw):
        return [1.0]

    for broken, reason in (
        (raises, "raised RuntimeError: verifier crashed"),
        (wrong_length, "returned 1 values"),
    ):
        model, tok = make_tiny_model("qwen2", seed=0)
        cfg = make_cfg(
            tmp_path / broken.__name__,
            "train.steps=2",
            "eval.enabled=false",
            "train.max_reward_failure_frac=1",
        )
        funcs = [("has_seven", has_seven, 1.0), (broken.__name__, broken, 1.0)]
        trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=funcs)
        with pytest.raises(TrainingError) as e:
            trainer.train()
        assert (
            f"step 1: reward function {broken.__name__!r} failed on every one of the 16 completions"
            in str(e.value)
        )
        assert f"first failing row 0: {reason}" in str(e.value) and "has_seven" not in str(e.value)


def test_eval_command_scores_a_model_directory(tmp_path, capsys):
    """`grpokit eval MODEL_DIR DATA --reward file.py:fn` loads, generates, scores, prints JSON."""
    from tiny_model import save_tiny_model

    from grpokit.cli.main import main

    model_dir = save_tiny_model(tmp_path / "m")
    data = tmp_path / "held_out.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:5]))
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(
        "def first_half(prompts, completions, answer, **kw):\n"
        "    return [float(int(a) < 3) for a in answer]\n"
    )
    args = [str(model_dir), str(data), "--reward", f"{rewards}:first_half", "--template", "plain"]
    assert main(["eval", *args, "--max-new-tokens", "4", "--num-samples", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    # answers of ROWS[:5] are 0,1,2,3,4: three of five prompts score 1 whatever the completion
    assert result["num_examples"] == 5
    assert result["accuracy"] == pytest.approx(0.6) and result["mean_at_2"] == pytest.approx(0.6)


def test_lora_trains_the_adapter_only_and_uses_the_base_as_reference(tmp_path):
    trainer = make_trainer(tmp_path, "lora.enabled=true", "lora.r=4", "train.steps=2", "eval.enabled=false")
    assert trainer.ref_model is None  # no second copy: the reference is the adapter switched off
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    summary = trainer.train()
    params = dict(trainer.model.named_parameters())
    assert all(torch.equal(params[n], p) for n, p in base_before.items())
    assert any(not torch.equal(params[n], p) for n, p in lora_before.items())
    line = read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]
    assert line["kl"] > 0  # measured against the base model, which the adapter has moved away from
    from pathlib import Path

    assert (Path(summary["checkpoint"]) / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_micro_batch_split_and_length_sorting_leave_the_gradient_unchanged(tmp_path, agg):
    """One step with the whole batch in one micro-batch, and with micro-batches of 3 rows grouped by
    length: same rollout (same seed), same gradient, same loss."""
    from grpokit.rollout.batch import length_sorted

    lengths = torch.tensor([5, 2, 9, 2, 7])
    assert length_sorted(torch.tensor([4, 0, 1, 3]), lengths).tolist() == [1, 3, 0, 4]

    results = {}
    for micro in (16, 3):
        trainer = make_trainer(
            tmp_path / f"micro{micro}",
            f"optim.micro_batch_size={micro}",
            "optim.mini_batches=1",
            "rollout.max_new_tokens=10",
            "train.samples_every=0",
            f"algo.agg={agg}",
            eos_ids=[1, *range(30, 40)],  # frequent EOS ids: completions of many lengths
        )
        grads = []
        model = trainer.model
        trainer.learner.optimizer.register_step_pre_hook(
            lambda *_, g=grads, m=model: g.extend(p.grad.detach().clone() for p in m.parameters())
        )
        metrics = trainer.train_step()
        results[micro] = (grads, metrics)
    (g_one, m_one), (g_split, m_split) = results[16], results[3]
    assert len(g_one) == len(g_split) > 0
    assert m_one["completion_len/min"] < m_one["completion_len/max"]  # lengths really differ
    for a, b in zip(g_one, g_split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert m_one["loss"] == pytest.approx(m_split["loss"], rel=1e-5, abs=1e-7)

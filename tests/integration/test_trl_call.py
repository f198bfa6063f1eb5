"""TRL's GRPOTrainer call runs as written (issue 52; grpokit.compat.trl.call): TRL's quickstart with the import swapped,
args=GRPOConfig(...) with reward_weights, datasets, a pathlib.Path model and a reward model's folder in reward_funcs;
the same call with grpokit's own config when TRL is absent."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from tiny_model import make_tiny_tokenizer, save_tiny_model

datasets = pytest.importorskip(
    "datasets", reason="TRL's call takes datasets.Dataset: pip install 'grpokit[dev]'"
)

# TRL 1.16's quickstart, as its GRPOTrainer docstring and docs/source/quickstart.md give it
TRL_QUICKSTART = """
from trl import GRPOTrainer
from trl.rewards import accuracy_reward
from datasets import load_dataset

dataset = load_dataset("trl-lib/DeepMath-103K", split="train")

trainer = GRPOTrainer(
    model="Qwen/Qwen2.5-0.5B-Instruct",
    reward_funcs=accuracy_reward,
    train_dataset=dataset,
)
trainer.train()
"""

# DeepMath-103K's shape: a conversational prompt and a LaTeX solution
DEEPMATH_ROWS = [{"prompt": [{"role": "user", "content": "What is 1+2?"}], "solution": "$3$"}]


def save_brief_model(path: Path) -> Path:
    """A tiny qwen2 that ends its completions after ~10 tokens (TRL's default allows 512): its layers add nothing to
    the embeddings, which share a common part that the end-of-sequence row of the LM head reads."""
    from tiny_model import make_tiny_model

    model, tok = make_tiny_model("qwen2", seed=0, max_position_embeddings=1024)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.mul_(0.1).add_(1.0)
        model.lm_head.weight[tok.eos_token_id] = 0.15
    save_tiny_model(path, max_position_embeddings=1024)  # the tokenizer files as the tests' other models
    model.save_pretrained(path)
    return path


@pytest.mark.slow
def test_trls_quickstart_runs_unchanged_with_the_import_swapped(tmp_path, monkeypatch):
    """Only the import, the hub dataset (a local one of DeepMath's shape, built with datasets) and the hub model (a
    tiny local one) are swapped. With no args, TRL's GRPOConfig defaults: 8 completions of up to 512 tokens per
    prompt, one prompt a step, 3 epochs: 3 steps over the row, written to ./trainer_output."""
    pytest.importorskip(
        "trl", reason="the quickstart's reward is trl.rewards.accuracy_reward: pip install 'grpokit[trl]'"
    )
    model = save_brief_model(tmp_path / "model")
    script = (
        TRL_QUICKSTART.replace("from trl import GRPOTrainer", "from grpokit import GRPOTrainer")
        .replace('load_dataset("trl-lib/DeepMath-103K", split="train")', "Dataset.from_list(DEEPMATH_ROWS)")
        .replace('"Qwen/Qwen2.5-0.5B-Instruct"', repr(str(model)))
    )
    assert script.count("\n") == TRL_QUICKSTART.count("\n")  # line for line
    monkeypatch.chdir(tmp_path)
    scope = {"Dataset": datasets.Dataset, "DEEPMATH_ROWS": DEEPMATH_ROWS}
    exec(compile(script, "quickstart.py", "exec"), scope)  # noqa: S102 - TRL's own script, swapped as above
    trainer = scope["trainer"]
    cfg = trainer.cfg
    assert (cfg.rollout.group_size, cfg.rollout.prompts_per_step, cfg.rollout.max_new_tokens) == (8, 1, 512)
    assert (cfg.optim.adam_beta2, cfg.algo.std_eps, cfg.train.seed, cfg.train.num_train_epochs) == (
        0.999,
        1e-4,
        42,
        3.0,
    )
    assert trainer.reward_names == ["accuracy_reward"] and trainer.step == 3
    metrics = [
        json.loads(line) for line in (tmp_path / "trainer_output" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [m for m in metrics if "reward/accuracy_reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["rewards/accuracy_reward/mean"] == m["reward/accuracy_reward/mean"] for m in steps)


@pytest.fixture(scope="module")
def scorer(tmp_path_factory) -> Path:
    """A tiny sequence-classification reward model's folder (one score per text)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    path = tmp_path_factory.mktemp("rm") / "tiny-rm"
    tok = make_tiny_tokenizer(64)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=256, num_labels=1,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        LlamaForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    file = path / "tokenizer_config.json"
    file.write_text(
        json.dumps({**json.loads(file.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    return path


def has_seven(completions, **kwargs):
    return [float("7" in c) for c in completions]


ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def tiny_run(out, steps: int, *more: str):
    """grpokit's own Config of a tiny run into ``out``: 2 prompts x 2 completions of 4 tokens, ``steps`` steps."""
    from grpokit import load_config

    return load_config(None, [f"train.output_dir={out}", f"train.steps={steps}", "rollout.group_size=2",
                              "rollout.prompts_per_step=2", "rollout.max_new_tokens=4", "data.template=plain",
                              "train.report_to=none", "train.stop_after_flat_steps=0", *more])  # fmt: skip


@pytest.mark.slow
def test_args_grpoconfig_with_reward_weights_datasets_a_path_and_a_reward_model(tmp_path, scorer):
    """TRL's GRPOConfig converts (its learning rate, steps, group and batch reach the run); reward_weights weigh
    reward_funcs in order; a folder among them is a sequence-classification reward model; model a pathlib.Path."""
    trl = pytest.importorskip("trl", reason="args=GRPOConfig(...) needs TRL: pip install 'grpokit[trl]'")
    from grpokit import GRPOTrainer

    model = save_tiny_model(tmp_path / "model")
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, learning_rate=3e-6, max_steps=1, num_generations=4,
        per_device_train_batch_size=8, max_completion_length=8, reward_weights=[1.0, 0.5], report_to="none",
        save_strategy="no", gradient_checkpointing=False,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=Path(model), reward_funcs=[has_seven, str(scorer)], args=args,
        train_dataset=datasets.Dataset.from_list(ROWS), eval_dataset=datasets.Dataset.from_list(ROWS[:2]),
    )  # fmt: skip
    cfg = trainer.cfg
    assert (cfg.optim.lr, cfg.train.steps, cfg.rollout.group_size, cfg.rollout.prompts_per_step) == (
        3e-6,
        1,
        4,
        2,
    )
    assert cfg.model.name_or_path == str(model) and trainer.reward_weights == {
        "has_seven": 1.0,
        "tiny-rm": 0.5,
    }
    # neither has_seven nor the reward model says it is the verifier: no accuracy reward is guessed
    # (grpokit.rewards.which_accuracy, rule 5), so the held-out rows are not evaluated and the run says why
    assert len(trainer.train_rows) == 16 and trainer.accuracy_name is None and trainer.eval_rows == []
    assert "train.accuracy_reward" in trainer.accuracy_why
    trainer.train()
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    scored = [m for m in steps if "reward/tiny-rm/mean" in m]
    assert len(scored) == 1
    for m in scored:  # the total is the weighted sum: 1 x has_seven + 0.5 x the reward model
        total = m["reward/has_seven/mean"] + 0.5 * m["reward/tiny-rm/mean"]
        assert m["reward/total/mean"] == pytest.approx(total, abs=1e-5)


def test_the_same_call_with_grpokits_own_config(tmp_path):
    """No TRL needed: args= (or the first argument) is a grpokit Config, the rest is TRL's call."""
    from grpokit import GRPOTrainer

    model = save_tiny_model(tmp_path / "model")
    cfg = tiny_run(tmp_path / "out", 1)
    trainer = GRPOTrainer(
        model=str(model), reward_funcs=has_seven, args=cfg, train_dataset=datasets.Dataset.from_list(ROWS)
    )
    assert trainer.cfg.optim.adam_beta2 == 0.99 and trainer.reward_names == ["has_seven"]
    assert trainer.train()["steps"] == 1


def test_a_hub_id_in_reward_funcs_that_cannot_be_fetched_is_named(monkeypatch):
    """A reward named owner/name that is no grpokit reward and no local folder is a hub reward model (TRL's
    meaning); offline, the one line names it."""
    from grpokit.compat.trl.api import named_reward
    from grpokit.core.errors import ConfigError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ConfigError, match=r"reward_funcs\[1\]='nobody/no-such-rm' is neither a grpokit reward nor a local"
    ):
        named_reward("nobody/no-such-rm", 1)
    with pytest.raises(ConfigError, match="unknown reward"):
        named_reward("format_strikt", 0)  # no slash: a misspelt grpokit reward, not a hub id


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"reward_weights": [1.0]},
            r"GRPOTrainer\(reward_weights=...\) is not taken: reward weights are a GRPOConfig field",
        ),
        ({"optimizers": (None, None)}, r"optimizers=...\) is not taken: the optimizer is AdamW"),
        ({"train_rows": ROWS, "train_dataset": ROWS}, "both train_rows= and train_dataset="),
        ({"eval_dataset": {"a": ROWS, "b": ROWS}}, "eval_dataset: a dict of 2 datasets"),
        ({"train_dataset": "data.jsonl"}, "train_dataset: got the path 'data.jsonl'; give the rows"),
        (
            {"args": {"learning_rate": 1e-6, "reward_weights": [1.0, 2.0]}},
            "reward_weights has 2 values for 1 reward_funcs",
        ),
        ({"args": {"num_generations": "four"}}, "TRL num_generations='four': expected an integer"),
        ({"lerning_rate": 1e-6}, "unknown keyword lerning_rate="),
    ],
)
def test_what_the_trl_call_cannot_take_is_one_named_line(tmp_path, kwargs, message):
    from grpokit import GRPOTrainer
    from grpokit.core.errors import ConfigError

    kwargs = {"model": str(tmp_path), "reward_funcs": has_seven, **kwargs}
    with pytest.raises(ConfigError, match=message):
        GRPOTrainer(**kwargs)


def test_trls_own_script_ends_save_the_model_into_its_output_dir_beside_the_run(tmp_path, capsys):
    """TRL's trl/scripts/grpo.py ends ``trainer.accelerator.print("✅ Training completed.")`` then
    ``trainer.save_model(training_args.output_dir)``: both ran into AttributeError after a finished run (before
    this change). The folder it writes is the policy as trained, loadable by transformers, beside the run's own
    files, which stay."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from grpokit import GRPOTrainer

    model, out = save_tiny_model(tmp_path / "model"), tmp_path / "out"
    cfg = tiny_run(out, 2, "optim.lr=1e-2")
    trainer = GRPOTrainer(model=str(model), reward_funcs=has_seven, args=cfg, train_dataset=ROWS)
    trainer.train()
    capsys.readouterr()
    trainer.accelerator.print("✅ Training completed.")
    assert capsys.readouterr().out == "✅ Training completed.\n"
    acc = trainer.accelerator
    assert (acc.is_main_process, acc.process_index, acc.num_processes) == (True, 0, 1) and acc.device.type == "cpu"
    acc.wait_for_everyone()
    with pytest.raises(AttributeError, match="trainer.accelerator.gather: grpokit does not run on accelerate"):
        acc.gather()
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert trainer.save_model(str(out)) == out
    after = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert set(before) <= set(after)  # metrics.jsonl, config.yaml, checkpoints/...: all still there
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    loaded = AutoModelForCausalLM.from_pretrained(out)
    trained = trainer.model.state_dict()
    start = AutoModelForCausalLM.from_pretrained(model).state_dict()
    assert any(not torch.equal(start[k], trained[k]) for k in trained)  # it trained: the check can fail
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, trained[name]), name
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    assert tok("1+2=")["input_ids"] == trainer.tokenizer("1+2=")["input_ids"]
    # the default folder is train.output_dir, as TRL's save_model() with no argument is args.output_dir
    assert trainer.save_model() == out
    from grpokit.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"push_to_hub\(\): grpokit does not upload .* `hf upload REPO_ID DIR`"):
        trainer.push_to_hub(dataset_name="trl-lib/tldr")  # TRL's script, when args.push_to_hub


def test_save_model_of_a_lora_run_writes_its_adapter_and_refuses_nan(tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from grpokit import GRPOTrainer
    from grpokit.model.checkpoint import CheckpointError

    model, out = save_tiny_model(tmp_path / "model"), tmp_path / "out"
    cfg = tiny_run(out, 1, "lora.enabled=true", "lora.r=4", "optim.lr=5e-2")
    trainer = GRPOTrainer(model=str(model), reward_funcs=has_seven, args=cfg, train_dataset=ROWS)
    trainer.train()
    with torch.no_grad():  # lora_B starts at zero: give the adapter values a lost or misnamed tensor would show
        for i, (n, p) in enumerate(trainer.model.named_parameters()):
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    saved = trainer.save_model(tmp_path / "adapter")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in saved.iterdir()}
    assert not (saved / "model.safetensors").exists()
    again = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model), saved)
    ours = {k: v for k, v in trainer.model.state_dict().items() if "lora_" in k}
    theirs = again.state_dict()
    assert ours and all(torch.equal(v, theirs[k]) for k, v in ours.items())
    # a NaN weight is refused and the folder keeps what it held
    files = {p.name: p.read_bytes() for p in saved.iterdir()}
    name, param = next((n, p) for n, p in trainer.model.named_parameters() if p.requires_grad)
    with torch.no_grad():
        param.view(-1)[0] = float("nan")
    with pytest.raises(CheckpointError, match=f"refusing to save: parameter {re.escape(name)} holds NaN/inf"):
        trainer.save_model(saved)
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == files


def test_open_r1s_script_tail_runs_and_writes_what_transformers_trainer_writes(tmp_path, capsys):
    """open-r1's grpo.py after building the trainer, line for line (its dataset and hub calls aside): before this
    change train(resume_from_checkpoint=) was a TypeError, and .metrics, log_metrics, save_metrics, save_state
    and create_model_card AttributeErrors."""
    from grpokit import GRPOTrainer
    from grpokit.core.errors import ConfigError

    model, out = save_tiny_model(tmp_path / "model"), tmp_path / "out"
    trainer = GRPOTrainer(model=str(model), reward_funcs=has_seven, args=tiny_run(out, 2, "train.accuracy_reward=has_seven"),
                          train_dataset=ROWS, eval_dataset=ROWS[:2])  # fmt: skip
    with pytest.raises(ConfigError, match="grpokit resumes when the trainer is built, and it was built without resume"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoints" / "step_000001"))
    checkpoint = None
    train_result = trainer.train(resume_from_checkpoint=checkpoint)
    metrics = train_result.metrics
    metrics["train_samples"] = len(ROWS)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    trainer.save_model(str(out))
    kwargs = {"dataset_name": "local/sums", "tags": ["open-r1"]}
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(**kwargs)
        trainer.model.config.use_cache = True
        trainer.model.config.save_pretrained(str(out))
    metrics = trainer.evaluate()
    metrics["eval_samples"] = 2
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)

    summary = json.loads((out / "summary.json").read_text())
    assert dict(train_result) == summary  # the summary it always returned
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in steps if "loss" in m]
    assert train_result.global_step == 2 and len(losses) == 2
    assert train_result.training_loss == pytest.approx(sum(losses) / 2, rel=1e-6)
    saved = json.loads((out / "train_results.json").read_text())
    assert saved["train_runtime"] == summary["train_seconds"] and saved["train_samples"] == 16
    assert saved["epoch"] == pytest.approx(2 * 2 / 16) and saved["train_steps_per_second"] > 0
    assert saved["train_loss"] == pytest.approx(train_result.training_loss, rel=1e-6)
    everything = json.loads((out / "all_results.json").read_text())
    assert everything["train_samples"] == 16 and everything["eval_samples"] == 2 and "accuracy" in everything
    printed = capsys.readouterr().out
    assert "***** train metrics *****" in printed and "***** eval metrics *****" in printed
    assert any(line.split() == ["train_samples", "=", "16"] for line in printed.splitlines())
    state = json.loads((out / "trainer_state.json").read_text())
    assert (state["global_step"], state["max_steps"], len(state["log_history"])) == (2, 2, 2)
    assert [m["loss"] for m in state["log_history"]] == pytest.approx(losses, rel=1e-6)
    assert trainer.state.global_step == 2 and len(trainer.state.log_history) == 2
    card = (out / "README.md").read_text()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["base_model"] == str(model) and meta["datasets"] == ["local/sums"]
    assert set(meta["tags"]) == {"grpokit", "grpo", "open-r1"} and "(2 steps)" in card
    assert json.loads((out / "config.json").read_text())["use_cache"] is True
    # built with resume, the same call names what it resumed from and goes on
    more = tiny_run(out, 3, "train.accuracy_reward=has_seven")
    again = GRPOTrainer(model=str(model), reward_funcs=has_seven, args=more, train_dataset=ROWS, eval_dataset=ROWS[:2],
                        resume=True)  # fmt: skip
    assert again.train(resume_from_checkpoint=str(out / "checkpoints" / "step_000002")).global_step == 3
    # TRL's num_tokens: every step's prompt and completion tokens so far, on across the resume. Each of a step's
    # 4 rows has a 4-character prompt ("a+b=", one token a character here) and its completion's tokens
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    prompt_tokens = len(trainer.tokenizer("1+2=", add_special_tokens=False)["input_ids"])
    for m in steps:
        assert m["tokens/step"] == pytest.approx(4 * prompt_tokens + 4 * m["completion_len/mean"])
    assert [m["num_tokens"] for m in steps] == pytest.approx(list(itertools.accumulate(m["tokens/step"] for m in steps)))


def test_evaluate_answers_with_transformers_names_for_its_rows_or_an_eval_dataset(tmp_path, capsys):
    """``trainer.evaluate()`` as a TRL script calls it: grpokit's held-out metrics under their names and again as
    ``eval_<name>`` (greedy accuracy, not TRL's sampled eval_reward), with eval_runtime and epoch; an
    eval_dataset given to evaluate() is evaluated instead of the trainer's, with the prefix asked for; a
    TrainerCallback's on_evaluate gets the eval_ names at every evaluation of the run; bad rows are named."""
    from transformers import TrainerCallback

    from grpokit import GRPOTrainer
    from grpokit.core.errors import ConfigError
    from grpokit.data.prompts import DataError

    class Seen(TrainerCallback):
        def __init__(self):
            self.evaluations = []

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            self.evaluations.append((state.global_step, sorted(metrics)))

    seen = Seen()
    model, out = save_tiny_model(tmp_path / "model"), tmp_path / "out"
    trainer = GRPOTrainer(model=str(model), reward_funcs=has_seven, callbacks=[seen],
                          args=tiny_run(out, 1, "train.accuracy_reward=has_seven", "eval.every=1"),
                          train_dataset=ROWS, eval_dataset=ROWS[:3])  # fmt: skip
    trainer.train()
    assert [step for step, _ in seen.evaluations] == [0, 1]
    assert "eval_accuracy" in seen.evaluations[0][1] and "accuracy" not in seen.evaluations[0][1]
    metrics = trainer.evaluate()
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert metrics["eval_accuracy"] == metrics["accuracy"] == evals[-1]["accuracy"]  # greedy: the same answers
    assert metrics["eval_num_examples"] == 3.0 and metrics["eval_runtime"] > 0
    assert metrics["eval_samples_per_second"] == pytest.approx(3 / metrics["eval_runtime"])
    assert metrics["epoch"] == pytest.approx(1 * 2 / 16) and "eval_accuracy" not in evals[-1]
    given = trainer.evaluate(eval_dataset=datasets.Dataset.from_list(ROWS[5:12]), metric_key_prefix="test")
    assert given["test_num_examples"] == 7.0 and "eval_accuracy" not in given
    with pytest.raises(DataError, match="eval_dataset"):
        trainer.evaluate(eval_dataset=[{"question": "1+1="}])  # no prompt column
    def reward_len(completions, **kwargs):  # TRL's quickstart's shaping reward: no accuracy reward to evaluate with
        return [-abs(8 - len(c)) / 8 for c in completions]

    plain = GRPOTrainer(model=str(model), reward_funcs=reward_len, args=tiny_run(tmp_path / "plain", 1),
                        train_dataset=ROWS)  # fmt: skip
    assert plain.accuracy_fn is None
    with pytest.raises(ConfigError, match="train.accuracy_reward"):
        plain.evaluate(eval_dataset=ROWS[:2])
    capsys.readouterr()
    assert set(plain.evaluate()) == {"eval_runtime", "eval_samples_per_second", "epoch"}  # a script's closing call
    assert "evaluate(): nothing evaluated: " in capsys.readouterr().err
    no_rows = GRPOTrainer(model=str(model), reward_funcs=has_seven, train_dataset=ROWS,
                          args=tiny_run(tmp_path / "no_rows", 1, "train.accuracy_reward=has_seven"))  # fmt: skip
    with pytest.raises(ConfigError, match="evaluate\\(\\): there are no held-out rows; give eval_dataset"):
        no_rows.evaluate()


def test_each_epoch_checkpoints_and_evaluations_fall_where_a_pass_over_the_prompts_ends(tmp_path):
    """6 prompts, 2 a step, 2 epochs: a pass is 3 steps, the run 6; train.save_each_epoch checkpoints at steps 3
    and 6, eval.each_epoch evaluates there (and before training). TRL's save_strategy="epoch" maps to them."""
    from grpokit import GRPOTrainer

    out = tmp_path / "out"
    cfg = tiny_run(out, 1, "train.accuracy_reward=has_seven", "train.num_train_epochs=2", "train.save_each_epoch=true",
                   "eval.each_epoch=true", "train.keep_checkpoints=0")  # fmt: skip
    trainer = GRPOTrainer(cfg, model=str(save_tiny_model(tmp_path / "model")), reward_functions=[has_seven],
                          train_rows=ROWS[:6], eval_rows=ROWS[6:8])  # fmt: skip
    assert (trainer.cfg.train.steps, trainer.cfg.train.save_every, trainer.cfg.eval.every) == (6, 3, 3)
    trainer.train()
    saved = sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*"))
    evaluated = [json.loads(line)["step"] for line in (out / "eval.jsonl").read_text().splitlines()]
    assert (saved, evaluated) == ([3, 6], [0, 3, 6])


def digit_count(text: str) -> int:
    """How many digits a text holds.

    Args:
        text: the text to read
    """
    return sum(c.isdigit() for c in text)


def called_then_answered(prompts, completions, **kwargs):
    """1 for an episode in TRL's message lists that called a tool: an assistant turn, a tool message, an assistant
    turn after it (the reward runs in a worker process: what it sees comes back as its score)."""
    out = []
    for messages in completions:
        roles = [m["role"] for m in messages]
        out.append(float(roles[:1] == ["assistant"] and "tool" in roles and roles[-1] == "assistant"))
    return out


def test_trls_tools_keyword_runs_tool_episodes_bounded_as_trl_bounds_them(tmp_path):
    """TRL's agent call: GRPOTrainer(model, reward_funcs, train_dataset, tools=[fn, ...], args=GRPOConfig(...)). The
    functions become rollout.tools by the names they are found under; max_completion_length bounds a whole episode
    (rollout.max_episode_tokens) and max_tool_calling_iterations the rounds of calls (rollout.max_turns = rounds
    + 1). On the tools demo's warm-started model (it calls multiply in the hermes format), one step runs episodes
    that call the tool, and the reward sees TRL's message lists, tool messages included."""
    from grpokit import GRPOTrainer
    from grpokit.demos import tools as demo

    paths = demo.prepare(log=lambda *a: None)
    rows = [json.loads(line) for line in paths["train"].read_text().splitlines()[:4]]

    args = {"output_dir": str(tmp_path / "out"), "max_steps": 1, "num_generations": 4, "per_device_train_batch_size": 8,
            "max_completion_length": 40, "max_tool_calling_iterations": 2, "learning_rate": 1e-4, "report_to": "none",
            "save_strategy": "no", "gradient_checkpointing": False}  # fmt: skip
    trainer = GRPOTrainer(model=str(paths["model"]), reward_funcs=[demo.tool_answer, called_then_answered],
                          train_dataset=rows, args=args, tools=[demo.multiply])  # fmt: skip
    r = trainer.cfg.rollout
    assert r.tools == ["grpokit.demos.tools:multiply"]
    assert (r.max_turns, r.max_episode_tokens, r.max_new_tokens) == (3, 40, 40)
    trainer.train()
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps[0]["tools/calls_per_episode"] > 0 and steps[0]["reward/called_then_answered/mean"] > 0


def test_tools_that_cannot_be_loaded_by_name_are_refused_and_a_max_without_tools_is_said(tmp_path, capsys):
    from grpokit import GRPOTrainer
    from grpokit.compat.trl.call import tool_specs
    from grpokit.core.errors import ConfigError

    assert tool_specs([digit_count, "python", "tools.py:f"]) == [f"{__name__}:digit_count", "python", "tools.py:f"]
    model = str(save_tiny_model(tmp_path / "model"))
    with pytest.raises(ConfigError, match=r"tools\[1\]: \S*<lambda> cannot be found again by name"):
        GRPOTrainer(model=model, reward_funcs=has_seven, train_dataset=ROWS, tools=[digit_count, lambda text: 0],
                    args={"output_dir": str(tmp_path / "a"), "max_steps": 1, "max_completion_length": 16})  # fmt: skip
    GRPOTrainer(model=model, reward_funcs=has_seven, train_dataset=ROWS,
                args={"output_dir": str(tmp_path / "b"), "max_steps": 1, "max_completion_length": 16,
                      "max_tool_calling_iterations": 2})  # fmt: skip
    assert "max_tool_calling_iterations: no tools given to the trainer, so no effect" in capsys.readouterr().err


class Calculator:
    """A TRL environment (environment_factory): its public methods are tools, reset(**row), get_reward()."""

    def __init__(self):
        import threading

        self.lock = threading.Lock()  # cannot be pickled: left out of what reward functions get
        self.calls, self.products = 0, []

    def reset(self, **row):
        self.calls, self.products, self.answer = 0, [], row["answer"]
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        """
        self.calls += 1
        self.products.append(a * b)
        return a * b

    def get_reward(self) -> float:
        return float(str(self.answer) in map(str, self.products))


class Silent(Calculator):
    """A TRL environment that does not score its episodes (no get_reward)."""

    get_reward = None


def env_calls(environments, **kwargs):
    """TRL's reward over environments: the calls each episode's instance counted (its state at the end)."""
    assert all(not hasattr(env, "lock") and isinstance(env, Calculator) for env in environments)
    return [float(env.calls) for env in environments]


def test_trls_environment_factory_runs_episodes_whose_tools_act_on_their_own_instance(tmp_path):
    """TRL's environment_factory: each episode's instance is reset with its row, its methods are the tools (run on
    that instance: the calls it counts are the episode's), get_reward() is a reward named after the class, and
    reward functions read the episodes' environments (a copy of each instance at its end). On the tools demo's
    model, which calls multiply in the hermes format."""
    from grpokit import GRPOTrainer
    from grpokit.demos import tools as demo

    paths = demo.prepare(log=lambda *a: None)
    rows = [json.loads(line) for line in paths["train"].read_text().splitlines()[:4]]
    args = {"output_dir": str(tmp_path / "out"), "max_steps": 2, "num_generations": 4, "per_device_train_batch_size": 8,
            "max_completion_length": 40, "max_tool_calling_iterations": 1, "learning_rate": 1e-4, "report_to": "none",
            "save_strategy": "no", "gradient_checkpointing": False}  # fmt: skip
    trainer = GRPOTrainer(model=str(paths["model"]), reward_funcs=[demo.tool_answer, env_calls], train_dataset=rows,
                          args=args, environment_factory=Calculator)  # fmt: skip
    assert trainer.cfg.rollout.environment == f"trl:{__name__}:Calculator" and trainer.cfg.rollout.max_turns == 2
    trainer.train()
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    for m in steps:
        assert m["tools/calls_per_episode"] == pytest.approx(m["reward/env_calls/mean"])  # each its own instance
    assert sum(m["reward/Calculator/mean"] for m in steps) > 0  # get_reward: a product it computed was the answer
    assert sum(m["tools/calls_per_episode"] for m in steps) > 0


def test_environment_factory_errors_are_named(tmp_path):
    from grpokit import GRPOTrainer
    from grpokit.core.errors import ConfigError

    model = str(save_tiny_model(tmp_path / "model"))
    args = {"output_dir": str(tmp_path / "a"), "max_steps": 1, "max_completion_length": 16}
    with pytest.raises(ConfigError, match="tools= and environment_factory="):
        GRPOTrainer(model=model, reward_funcs=has_seven, train_dataset=ROWS, args=args, tools=[digit_count],
                    environment_factory=Calculator)  # fmt: skip

    class Nested(Calculator):
        pass

    with pytest.raises(ConfigError, match=r"environment_factory: \S*Nested cannot be found again by name"):
        GRPOTrainer(model=model, reward_funcs=has_seven, train_dataset=ROWS, args=args, environment_factory=Nested)
    # no reward_funcs: the environment's get_reward alone (TRL's rule), not grpokit's default math_accuracy
    from grpokit.demos import tools as demo

    paths = demo.prepare(log=lambda *a: None)  # a model whose chat template renders tools
    rows = [json.loads(line) for line in paths["train"].read_text().splitlines()[:4]]
    owned = GRPOTrainer(model=str(paths["model"]), train_dataset=rows, environment_factory=Calculator,
                        args=args | {"output_dir": str(tmp_path / "b"), "max_completion_length": 40})  # fmt: skip
    assert owned.reward_names == ["Calculator"] and owned.reward_weights == {"Calculator": 1.0}
    with pytest.raises(ConfigError, match="no reward: rollout.environment='trl:.*Silent' brings none"):
        GRPOTrainer(model=model, train_dataset=ROWS, args=args | {"output_dir": str(tmp_path / "c")},
                    environment_factory=Silent)  # fmt: skip

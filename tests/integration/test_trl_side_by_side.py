"""TRL's GRPOTrainer and grpokit side by side (issue 30): the same tiny model, data and TRL config; TRL
runs one optimizer step, and grpokit, given the config converted by grpokit.config.trl and TRL's own
completions, must give the same per-sequence advantages and the same loss gradient. One run per
loss_type, the scale_rewards modes spread over them, a reward that says None on some rows, and gradient
accumulation where TRL's normaliser allows it. Skipped without trl (CI installs it: .ci/run)."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("trl")

from tiny_model import make_tiny_model  # noqa: E402

from grpokit import GRPOTrainer  # noqa: E402
from grpokit.config.schema import config_from_dict  # noqa: E402
from grpokit.config.trl import from_trl  # noqa: E402
from grpokit.rollout.batch import ScoredBatch  # noqa: E402
from grpokit.rollout.generation import Rollout  # noqa: E402
from grpokit.train.advantages import batch_advantages  # noqa: E402

PROMPTS = ["1+2=", "3+4=", "5+5=", "9+1="]


def digits_reward(completions, **kwargs):
    """The share of digits in the completion; None (does not apply) for completions with no digit and
    an odd length, so that some rows are unscored."""
    out = []
    for c in completions:
        digits = sum(ch.isdigit() for ch in c)
        out.append(None if digits == 0 and len(c) % 2 else digits / max(len(c), 1))
    return out


def run_trl(tmp_path, trl_args: dict):
    """One TRL optimizer step; returns (its generation batch before the shuffle, its rewards, the grads)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig
    from trl import GRPOTrainer as TRLTrainer

    model, tok = make_tiny_model("qwen2", seed=0)
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, **trl_args,
    )  # fmt: skip
    captured: dict = {}

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kw):
            if "grads" not in captured:
                captured["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = TRLTrainer(
            model=model, reward_funcs=[digits_reward], args=args, processing_class=tok,
            train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]), callbacks=[Grads()],
        )  # fmt: skip
        generate = trainer._generate_and_score_completions

        def spy(batch):
            out = generate(batch)
            captured.setdefault("batch", {k: v.clone() if torch.is_tensor(v) else v for k, v in out.items()})
            captured.setdefault("prompts", [x["prompt"] for x in batch])
            return out

        trainer._generate_and_score_completions = spy
        trainer.train()
    return captured, tok


def grpokit_step(tmp_path, trl_args: dict, captured: dict, tok):
    """grpokit on TRL's completions: (advantages, gradient), nothing sampled."""
    values, _ = from_trl({**trl_args, "output_dir": str(tmp_path / "gk"), "report_to": "none"})
    values.setdefault("model", {})["device"] = "cpu"
    values["model"]["gradient_checkpointing"] = False
    values.setdefault("eval", {})["enabled"] = False
    cfg = config_from_dict(values)
    model, _ = make_tiny_model("qwen2", seed=0)
    rows = [{"prompt": p} for p in captured["prompts"]]
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=rows, reward_functions=[("digits_reward", digits_reward, 1.0)])
    b = captured["batch"]
    N = b["completion_ids"].shape[0]
    texts = tok.batch_decode(b["completion_ids"] * b["completion_mask"], skip_special_tokens=True)
    scores = digits_reward(texts)
    rollout = Rollout(
        prompt_ids=b["prompt_ids"], prompt_mask=b["prompt_mask"], completion_ids=b["completion_ids"],
        completion_mask=b["completion_mask"], logprobs=torch.zeros(b["completion_ids"].shape),
        truncated=b["completion_mask"].all(dim=1),
    )  # fmt: skip
    batch = ScoredBatch(
        rollout=rollout, rows=[{"prompt": p} for p in captured["prompts"]], texts=texts,
        rewards=torch.tensor([s or 0.0 for s in scores]), per_function={"digits_reward": scores}, reward_metrics={},
    )  # fmt: skip
    G = cfg.rollout.group_size
    device = trainer.learner.device
    advantages = batch_advantages(batch, trainer.algo, G, None, None, device=device, dist=trainer.dist)
    assert N == len(scores)
    grads: dict = {}

    def capture(*_):  # the first optimizer step's gradient, as the optimizer is given it
        if not grads:
            grads.update({n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()})

    trainer.learner.optimizer.register_step_pre_hook(capture)
    trainer.updater.update(batch.rollout, advantages)
    return advantages, grads, scores


CASES = [  # (loss_type, scale_rewards, per_device_train_batch_size, gradient_accumulation_steps)
    ("grpo", "group", 4, 2),
    ("dr_grpo", "none", 4, 2),
    ("dapo", "batch", 4, 2),
    ("bnpo", "group", 8, 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type,scale,per_device,accumulation", CASES)
def test_one_step_matches_trl(tmp_path, loss_type, scale, per_device, accumulation):
    trl_args = dict(
        num_generations=4, max_completion_length=8, per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=1e-3, loss_type=loss_type,
        scale_rewards=scale, beta=0.0, seed=0, max_grad_norm=0.0, gradient_checkpointing=False,
    )  # fmt: skip
    torch.manual_seed(0)
    captured, tok = run_trl(tmp_path, trl_args)
    advantages, grads, scores = grpokit_step(tmp_path, trl_args, captured, tok)
    assert any(s is None for s in scores) or loss_type != "grpo", "the data should give some unscored rows"
    torch.testing.assert_close(advantages.float(), captured["batch"]["advantages"].float(), rtol=1e-5, atol=1e-6)
    assert set(grads) == set(captured["grads"])
    for name, theirs in captured["grads"].items():
        torch.testing.assert_close(grads[name], theirs, rtol=2e-4, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")

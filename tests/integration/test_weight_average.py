"""The average of the policy's weights (train.ema_decay; grpokit.train.weight_average): the average a run keeps is the
formula over the policies it passed through, checkpointed in ema/ and evaluated beside the policy; off, the run is
unchanged; refusals. The policy taking its average (train.adopt_average): the rule, its scores against an independent
greedy decode, its schedule, what auto resolves to. (A resume takes both back bit for bit:
tests/integration/test_resume_matrix.py, cases ema and adopt.)"""

from __future__ import annotations

import json

import pytest
import torch
from grpo_runs import ROWS, has_seven
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.core.errors import ConfigError
from grpokit.model.checkpoint import load_weights_into
from grpokit.run.log import read_metrics
from grpokit.train import weight_average
from grpokit.train.weight_average import EMA_DIR, Adoption, WeightAverage, significant
from grpokit.trainers.grpo import GRPOTrainer

RUN = [
    "train.samples_every=0", "train.tensorboard=false", "rollout.group_size=4", "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=5", "optim.lr=3e-2", "data.template=plain", "model.device=cpu",
]  # fmt: skip


def trainer(out, *extra, eval_rows=None):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(None, [*RUN, f"train.output_dir={out}", *extra])
    return GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, eval_rows=eval_rows,
                       reward_functions=[("has_seven", has_seven, 1.0)])  # fmt: skip


def policy_at(folder) -> dict[str, torch.Tensor]:
    model = make_tiny_model("qwen2", seed=0)[0]
    load_weights_into(model, folder)
    return {n: p.detach() for n, p in model.named_parameters()}


def test_the_average_is_the_formula_over_the_policies_and_is_checkpointed(tmp_path):
    """decay 0.5 over 3 steps: ema = 0.5 theta_3 + 0.25 theta_2 + 0.125 theta_1 + 0.125 theta_0, from each step's
    checkpoint; step 3's ema/ folder holds it; the policy moved, so the comparison can fail."""
    run = trainer(tmp_path / "run", "train.steps=3", "train.save_every=1", "train.keep_checkpoints=3",
                  "train.ema_decay=0.5", "eval.enabled=false")  # fmt: skip
    theta0 = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    run.train()
    ckpt = tmp_path / "run" / "checkpoints"
    thetas = [theta0, *(policy_at(ckpt / f"step_{s:06d}") for s in (1, 2, 3))]
    saved = policy_at(ckpt / "step_000003" / EMA_DIR)
    for name, p in run.parts.policy.average.model.named_parameters():
        want = 0.5 * thetas[3][name] + 0.25 * thetas[2][name] + 0.125 * thetas[1][name] + 0.125 * thetas[0][name]
        torch.testing.assert_close(p, want, rtol=0, atol=1e-6, msg=name)
        assert torch.equal(saved[name], p), name
    assert max(float((thetas[3][n] - theta0[n]).abs().max()) for n in theta0) > 1e-2


def test_the_average_is_evaluated_beside_the_policy_and_leaves_the_run_as_it_was(tmp_path):
    """eval.jsonl gains ema/accuracy (and the rest, ema/-named) beside the policy's; the policy's numbers and
    weights are the run's without the average (the average changes no rollout and no update)."""
    rows = ROWS[:4]
    plain = trainer(tmp_path / "plain", "train.steps=2", "eval.num_samples=2", eval_rows=rows)
    plain.train()
    averaged = trainer(tmp_path / "ema", "train.steps=2", "eval.num_samples=2", "train.ema_decay=0.9", eval_rows=rows)
    averaged.train()
    lines = [json.loads(line) for line in (tmp_path / "ema" / "eval.jsonl").read_text().splitlines()]
    plain_lines = [json.loads(line) for line in (tmp_path / "plain" / "eval.jsonl").read_text().splitlines()]
    assert all("ema/accuracy" in line and "ema/greedy_score" in line for line in lines)
    for line, plain_line in zip(lines, plain_lines, strict=True):
        assert {k: v for k, v in line.items() if not k.startswith("ema/")} == plain_line
    assert lines[0]["ema/accuracy"] == lines[0]["accuracy"]  # before training the average is the policy
    for name, p in averaged.model.named_parameters():
        assert torch.equal(p, dict(plain.model.named_parameters())[name]), name


def test_what_cannot_be_done_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="train.ema_decay"):
        load_config(None, [*RUN, "train.ema_decay=1.0"])
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(torch.nn.Linear(2, 2), 0.0)


# ----------------------------------------------------------------------------- the policy taking its average


def test_the_policy_takes_the_average_when_its_gain_passes_the_test_and_keeps_its_frozen_weights():
    """Adoption.compare on 8 prompts: below, level, or ahead by 2 prompts won and 1 lost (mean gain 0.125 under 1.645
    standard errors, 0.373) -> nothing moves; ahead on 4 prompts and level on 4 (0.5 over 0.311) -> the policy's
    trained weights become the average's, its frozen ones stay. The two differ, so each check can fail."""
    policy = make_tiny_model("qwen2", seed=0)[0]
    frozen = "model.embed_tokens.weight"
    policy.get_parameter(frozen).requires_grad_(False)
    average = WeightAverage.build(policy, 0.5)
    with torch.no_grad():
        for p in average.model.parameters():
            p.add_(0.25)  # an average away from the policy, the frozen weight too
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    adoption = Adoption(every=1, row_ids=tuple(range(8)))
    policy_scores = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    for average_scores in ([0.0] * 8, policy_scores, [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]):
        scores = {id(average.model): average_scores, id(policy): policy_scores}
        got = adoption.compare(average, policy, lambda m, scores=scores: scores[id(m)])
        assert got["average/adopted"] == 0.0, average_scores
        assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())
    assert got == {"average/adopted": 0.0, "average/score": 0.625, "average/policy_score": 0.5}
    scores = {id(average.model): [1.0] * 8, id(policy): policy_scores}
    assert adoption.compare(average, policy, lambda m: scores[id(m)])["average/adopted"] == 1.0
    averaged = dict(average.model.named_parameters())
    for name, p in policy.named_parameters():
        want = before[name] if name == frozen else averaged[name]
        assert torch.equal(p, want), name
    assert not adoption.compare(average, policy, lambda m: scores[id(m)], agree=lambda mine: False)["average/adopted"]


def test_the_test_by_hand():
    """64 prompts: 3 won and none lost, mean 0.046875 > 1.645 x 0.21304 / 8 = 0.043807: significant; 2 won,
    0.03125 < 1.645 x 0.17537 / 8 = 0.036061: not; all level, or one prompt (no spread): not."""
    assert significant([1.0] * 3 + [0.0] * 61)
    assert not significant([1.0] * 2 + [0.0] * 62)
    assert not significant([0.0] * 64) and not significant([-1.0] * 3 + [0.0] * 61)
    assert significant([0.5] * 64)  # every prompt gains alike: no spread, any positive mean passes


def test_the_comparison_rows_and_schedule_are_fixed_by_the_seed():
    cfg = load_config(None, [*RUN, "train.adopt_every=3", "train.adopt_prompts=5"])
    one, two = Adoption.build(cfg.train, 36, seed=0), Adoption.build(cfg.train, 36, seed=0)
    assert one == two and len(set(one.row_ids)) == 5 and list(one.row_ids) == sorted(one.row_ids)
    assert Adoption.build(cfg.train, 36, seed=1).row_ids != one.row_ids
    assert Adoption.build(cfg.train, 3, seed=0).row_ids == (0, 1, 2)  # fewer rows than asked: all of them
    assert [s for s in range(10) if one.due(s)] == [3, 6, 9]


def greedy_has_seven(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int) -> float:
    """The mean has_seven of ``model``'s greedy completions, one prompt at a time by transformers' generate: an
    oracle apart from grpokit's engines."""
    model.eval()
    scores = []
    with torch.no_grad():
        for ids in prompt_ids:
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            scores += has_seven([""], [tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)])
    return sum(scores) / len(scores)


def test_a_run_compares_every_k_steps_with_the_scores_of_an_independent_greedy_decode(tmp_path, monkeypatch):
    """adopt_every=2 over 6 steps: average/* at steps 2, 4 and 6 only. Step 2's average/score is the has_seven (the
    run's accuracy reward) of the greedy completions of step 2's average (its checkpoint's ema/ folder, decoded by
    transformers' generate), and after a step that adopted, the checkpoint's policy is its average. The test of the
    gain is "any gain" here, so that a 6-step run on 12 prompts adopts at all (the test itself: test_the_test_by_hand)."""
    monkeypatch.setattr(weight_average, "significant", lambda gains: sum(gains) > 0)
    run = trainer(tmp_path / "run", "train.steps=6", "train.save_every=1", "train.keep_checkpoints=6",
                  "train.adopt_average=true", "train.adopt_every=2", "train.adopt_prompts=12", "train.ema_decay=0.5",
                  "eval.enabled=false")  # fmt: skip
    run.train()
    assert run.accuracy_name == "has_seven"
    lines = {m["step"]: m for m in read_metrics(tmp_path / "run" / "metrics.jsonl")}
    assert [s for s in sorted(lines) if "average/adopted" in lines[s]] == [2, 4, 6]
    ckpt = tmp_path / "run" / "checkpoints"
    prompt_ids = [run.sampler.encoded[i] for i in run.parts.policy.adoption.row_ids]
    model, tok = make_tiny_model("qwen2", seed=0)
    load_weights_into(model, ckpt / "step_000002" / EMA_DIR)
    want = greedy_has_seven(model, tok, prompt_ids, 5)
    assert lines[2]["average/score"] == pytest.approx(want, abs=1e-9)
    adopted = [s for s in (2, 4, 6) if lines[s]["average/adopted"] == 1.0]
    assert adopted, "no comparison adopted: the check below would test nothing"
    for s in adopted:
        policy, average = policy_at(ckpt / f"step_{s:06d}"), policy_at(ckpt / f"step_{s:06d}" / EMA_DIR)
        assert all(torch.equal(policy[n], average[n]) for n in policy), s


def test_auto_is_on_for_a_cpu_run_and_off_with_lora_or_trl_defaults_and_true_is_refused_where_it_cannot_work(tmp_path):
    on = trainer(tmp_path / "on", "train.steps=1")  # auto, a CPU run on one process
    assert on.parts.policy.adoption is not None and on.parts.policy.average.decay == 0.9  # ema_decay 0: d = 0.9
    decay = trainer(tmp_path / "d", "train.steps=1", "train.ema_decay=0.5").parts.policy.average.decay
    assert decay == 0.5
    assert trainer(tmp_path / "off", "train.steps=1", "train.adopt_average=false").parts.policy.average is None
    assert trainer(tmp_path / "lora", "train.steps=1", "lora.enabled=true", "lora.r=4").parts.policy.adoption is None
    assert load_config(None, [*RUN, "train.defaults=trl"]).train.adopt_average is False
    with pytest.raises(ConfigError, match="train.adopt_average=true does not work with an asynchronous run"):
        trainer(tmp_path / "async", "train.steps=1", "train.adopt_average=true", "rollout.max_staleness=1")
    with pytest.raises(ConfigError, match="train.adopt_average=true does not work with optim.offload_optimizer"):
        trainer(tmp_path / "offload", "train.steps=1", "train.adopt_average=true", "optim.offload_optimizer=true")
    assert trainer(tmp_path / "async_auto", "train.steps=1", "rollout.max_staleness=1").parts.policy.adoption is None
    with pytest.raises(ConfigError, match="train.adopt_average"):
        load_config(None, [*RUN, "train.adopt_average=sometimes"])


def test_comparisons_that_do_not_adopt_leave_the_run_as_the_run_without_them(tmp_path, monkeypatch):
    """A comparison after every step that never passes the test: the policy is the run's without an average, bit for
    bit (the average, its greedy decodes and their scoring change no rollout and no update)."""
    plain = trainer(tmp_path / "plain", "train.steps=4", "train.adopt_average=false", "eval.enabled=false")
    plain.train()
    monkeypatch.setattr(weight_average, "significant", lambda gains: False)
    kept = trainer(tmp_path / "kept", "train.steps=4", "train.adopt_average=true", "train.adopt_every=1",
                   "train.adopt_prompts=12", "eval.enabled=false")  # fmt: skip
    kept.train()
    lines = read_metrics(tmp_path / "kept" / "metrics.jsonl")
    assert [m["average/adopted"] for m in lines] == [0.0] * 4
    for name, p in kept.model.named_parameters():
        assert torch.equal(p, dict(plain.model.named_parameters())[name]), name

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
from grpokit.train.weight_average import EMA_DIR, Adoption, WeightAverage
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


def test_the_policy_takes_the_average_when_it_scores_at_least_as_well_and_keeps_its_frozen_weights():
    """Adoption.compare: average above the policy -> the policy's trained weights become the average's (its frozen ones
    stay, the same object); level or below -> nothing moves. The two differ, so each check can fail."""
    policy = make_tiny_model("qwen2", seed=0)[0]
    frozen = "model.embed_tokens.weight"
    policy.get_parameter(frozen).requires_grad_(False)
    average = WeightAverage.build(policy, 0.5)
    with torch.no_grad():
        for p in average.model.parameters():
            p.add_(0.25)  # an average away from the policy, the frozen weight too
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    adoption = Adoption(every=1, row_ids=(0,))
    scores = {id(average.model): 0.25, id(policy): 0.5}
    got = adoption.compare(average, policy, lambda m: scores[id(m)])
    assert got == {"average/adopted": 0.0, "average/score": 0.25, "average/policy_score": 0.5}
    scores[id(average.model)] = 0.5  # level: the policy stays (on a slow climb the two answer alike)
    assert adoption.compare(average, policy, lambda m: scores[id(m)])["average/adopted"] == 0.0
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())
    scores[id(average.model)] = 0.75
    assert adoption.compare(average, policy, lambda m: scores[id(m)])["average/adopted"] == 1.0
    averaged = dict(average.model.named_parameters())
    for name, p in policy.named_parameters():
        want = before[name] if name == frozen else averaged[name]
        assert torch.equal(p, want), name
    assert not adoption.compare(average, policy, lambda m: 0.0, agree=lambda mine: False)["average/adopted"]


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


def test_a_run_compares_every_k_steps_with_the_scores_of_an_independent_greedy_decode(tmp_path):
    """adopt_every=2 over 6 steps: average/* at steps 2, 4 and 6 only. Step 2's average/score is the has_seven (the
    run's accuracy reward) of the greedy completions of step 2's average (its checkpoint's ema/ folder, decoded by
    transformers' generate), and after a step that adopted, the checkpoint's policy is its average."""
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
    assert lines[2]["average/score"] == pytest.approx(want, abs=1e-6)  # float32 mean; a row is 1/12
    adopted = [s for s in (2, 4, 6) if lines[s]["average/adopted"] == 1.0]
    assert adopted, "no comparison adopted: the check below would test nothing"
    for s in adopted:
        policy, average = policy_at(ckpt / f"step_{s:06d}"), policy_at(ckpt / f"step_{s:06d}" / EMA_DIR)
        assert all(torch.equal(policy[n], average[n]) for n in policy), s


def test_it_is_off_by_default_and_refused_by_name_where_it_cannot_work(tmp_path):
    assert trainer(tmp_path / "off", "train.steps=1").parts.policy.average is None  # no copy of the weights
    on = trainer(tmp_path / "on", "train.steps=1", "train.adopt_average=true")
    assert on.parts.policy.adoption is not None and on.parts.policy.average.decay == 0.9  # ema_decay 0: d = 0.9
    assert trainer(tmp_path / "d", "train.steps=1", "train.adopt_average=true", "train.ema_decay=0.5").parts.policy.average.decay == 0.5
    with pytest.raises(ConfigError, match="train.adopt_average=true does not work with an asynchronous run"):
        trainer(tmp_path / "async", "train.steps=1", "train.adopt_average=true", "rollout.max_staleness=1")
    with pytest.raises(ConfigError, match="train.adopt_average=true does not work with optim.offload_optimizer"):
        trainer(tmp_path / "offload", "train.steps=1", "train.adopt_average=true", "optim.offload_optimizer=true")
    with pytest.raises(ConfigError, match="train.adopt_average"):
        load_config(None, [*RUN, "train.adopt_average=sometimes"])


def test_a_comparison_that_never_comes_leaves_the_run_as_the_run_without_it(tmp_path):
    """adopt_every past the run's steps: the policy is the run's without an average (the default), bit for bit (the
    average and its comparison rows change no rollout and no update)."""
    plain = trainer(tmp_path / "plain", "train.steps=3", "eval.enabled=false")
    plain.train()
    kept = trainer(tmp_path / "kept", "train.steps=3", "train.adopt_average=true", "train.adopt_every=4",
                   "eval.enabled=false")  # fmt: skip
    kept.train()
    assert kept.parts.policy.average is not None
    for name, p in kept.model.named_parameters():
        assert torch.equal(p, dict(plain.model.named_parameters())[name]), name

"""Process rewards: the step contract, characters -> tokens, the runner, and grpo_process in the trainer
on a tiny real model."""

import os

import pytest
import torch
from grpo_runs import ROWS, has_seven, make_cfg, spies
from tiny_model import make_tiny_model, make_tiny_tokenizer
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grpokit.algos.process import process_group_advantages
from grpokit.config.schema import ConfigError
from grpokit.core.errors import TrainingError
from grpokit.rewards import RewardRunner
from grpokit.rewards.process import check_char_steps, step_ends, token_step_ends
from grpokit.trainers.grpo import GRPOTrainer


def digit_steps(prompts, completions, **kw):
    """A step ends after each digit and scores digit / 9: ragged steps on a random model's outputs."""
    return [[(i + 1, int(ch) / 9) for i, ch in enumerate(c) if ch.isdigit()] for c in completions]


digit_steps.step_rewards = True


def word_tokenizer():
    """Multi-character tokens ("123", "abc", " ", "+"): step ends fall inside tokens."""
    words = ["<pad>", "<eos>", "12", "3", "123", "ab", "abc", "c", " ", "+", "=", "\n", "x"]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="x"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"123|12|3|abc|ab|c|\s|\+|=|x"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def test_step_ends_split_after_the_separator():
    assert step_ends("a\nb\n") == [2, 4]
    assert step_ends("a\nb") == [2, 3]
    assert step_ends("a\n\nb") == [3, 4]  # a blank step joins the one before
    assert step_ends("") == [] and step_ends("\n\n") == []
    assert step_ends("1+2=3; 3+4=7; <answer>7", "; ") == [7, 14, 23]


@pytest.mark.parametrize("make", [make_tiny_tokenizer, word_tokenizer], ids=["chars", "words"])
def test_character_ends_map_to_the_token_holding_the_last_character(make):
    tok = make()
    text = "123 abc+12\n3 abc 123"
    ids = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == text
    # brute force: the token t such that decode(ids[:t]) is shorter than e and decode(ids[:t+1]) is not
    lengths = [len(tok.decode(ids[:k], skip_special_tokens=True)) for k in range(len(ids) + 1)]
    for ends in ([1, 2, 3], [5, 6, 9, 20], [len(text)], [4, 11, 12, 17]):  # ragged steps, inside tokens too
        steps = [(e, float(e)) for e in ends]
        got = token_step_ends(tok, ids, text, steps)
        want = [
            (next(t for t in range(len(ids)) if lengths[t] < e <= lengths[t + 1]), float(e)) for e in ends
        ]
        assert got == want
    if make is word_tokenizer:  # "123" is one token: ends 1, 2, 3 all fall in token 0
        assert [t for t, _ in token_step_ends(tok, ids, text, [(1, 0.0), (2, 0.0), (3, 0.0)])] == [0, 0, 0]


@pytest.mark.parametrize(
    "steps, match",
    [
        ([(12, 1.0)], "step 0 ends at character 12, beyond the completion's 10 characters"),
        ([(3, 1.0), (3, 0.0)], "step 1 ends at character 3, not after the previous step's end"),
        ([(0, 1.0)], "step 0 ends at character 0"),
        ([(2.5, 1.0)], "not an integer"),
        ([(2, float("inf"))], "not a finite number"),
        (0.5, "returned float '0.5' for a completion"),
    ],
)
def test_step_lists_that_do_not_match_the_completion_are_refused(steps, match):
    with pytest.raises(ValueError, match=match):
        check_char_steps(steps, 10)


def test_the_runner_keeps_the_steps_and_scores_the_last_one():
    def bad_on_row_1(prompts, completions, **kw):
        return [[(len(c), 1.0)] if c != "xy" else [(9, 1.0)] for c in completions]

    bad_on_row_1.step_rewards = True

    def where(prompts, completions, **kw):
        return [float(os.getpid()) for _ in completions]

    where.in_process = True
    runner = RewardRunner(
        [("digit_steps", digit_steps, 2.0), ("bad", bad_on_row_1, 1.0), ("where", where, 0.0)], timeout_s=20
    )
    with runner:
        result = runner([None] * 3, ["a3b9", "xy", "7"])
    assert result.steps["digit_steps"] == [[(2, 3 / 9), (4, 1.0)], [], [(1, 7 / 9)]]
    assert result.per_function["digit_steps"] == [1.0, None, 7 / 9]  # the last step's score; no steps: None
    assert result.total[0] == pytest.approx(2.0 * 1.0 + 1.0)  # weights apply to the last step's score
    assert result.row_errors["bad"] == {1: "step 0 ends at character 9, beyond the completion's 2 characters"}
    assert result.per_function["where"] == [float(os.getpid())] * 3  # in_process: run in this process


def make_process_trainer(tmp_path, *extra, functions=(("digit_steps", digit_steps, 1.0),), eos_ids=None, **parts):
    """eos_ids: more ids that end a completion (completions of many lengths); parts: GRPOTrainer's."""
    model, tok = make_tiny_model("qwen2", seed=0)
    if eos_ids is not None:
        model.generation_config.eos_token_id = list(eos_ids)
    return GRPOTrainer(
        make_cfg(tmp_path, "algo.preset=grpo_process", "train.samples_every=0", *extra),
        model=model,
        tokenizer=tok,
        train_rows=ROWS,
        eval_rows=ROWS[:4],
        reward_functions=list(functions),
        **parts,
    )


def test_grpo_process_end_to_end_with_a_rule_based_step_reward_and_an_outcome_reward(tmp_path):
    seen = {}  # what the last step sampled and the update was given (grpo_runs.spies)
    trainer = make_process_trainer(
        tmp_path,
        "train.steps=2",
        "rollout.max_new_tokens=10",
        "eval.enabled=false",
        "train.accuracy_reward=digit_steps",  # two rewards, neither a known verifier: say which
        functions=[("digit_steps", digit_steps, 1.0), ("has_seven", has_seven, 0.5)],
        eos_ids=[1, *range(30, 36)],  # completions of many lengths
        **spies(seen),
    )
    for _ in range(2):
        metrics = trainer.train_step()
        trainer.step += 1
    assert metrics["reward/digit_steps/applicable"] > 0
    batch, adv = seen["batch"], seen["advantages"]
    mask = batch.rollout.completion_mask
    assert adv.shape == mask.shape
    want = process_group_advantages(batch.step_rewards, 4, mask)
    torch.testing.assert_close(adv.cpu(), want, rtol=0, atol=1e-6)
    tok = trainer.tokenizer
    n_steps = 0
    for ids, text, steps, seven in zip(
        batch.rollout.completion_token_ids(), batch.texts, batch.step_rewards, batch.per_function["has_seven"]
    ):
        digits = digit_steps(None, [text])[0]
        assert len(steps) == len(digits) + 1  # the outcome reward is one more step, at the last token
        assert steps[-1] == (len(ids) - 1, 0.5 * seven)
        for (t, score), (end, want_score) in zip(steps, digits):
            assert score == pytest.approx(want_score)
            assert len(tok.decode(ids[:t], skip_special_tokens=True)) < end
            assert tok.decode(ids[: t + 1], skip_special_tokens=True)[end - 1].isdigit()
        n_steps += len(digits)
    assert n_steps > 0 and adv[mask.bool()].abs().sum() > 0


def test_micro_batch_split_leaves_the_gradient_unchanged_with_process_advantages(tmp_path):
    results = {}
    for micro in (16, 1):  # all 16 rows in one micro-batch, and one row per micro-batch
        trainer = make_process_trainer(
            tmp_path / f"micro{micro}",
            f"optim.micro_batch_size={micro}",
            "optim.mini_batches=1",
            "rollout.max_new_tokens=10",
            eos_ids=[1, *range(30, 40)],
        )
        grads = []
        trainer.learner.optimizer.register_step_pre_hook(
            lambda *_, g=grads, m=trainer.model: g.extend(p.grad.detach().clone() for p in m.parameters())
        )
        results[micro] = (grads, trainer.train_step())
    (g_one, m_one), (g_split, m_split) = results[16], results[1]
    assert m_one["completion_len/min"] < m_one["completion_len/max"] and m_one["advantage/abs_mean"] > 0
    assert len(g_one) == len(g_split) > 0
    for a, b in zip(g_one, g_split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert m_one["loss"] == pytest.approx(m_split["loss"], rel=1e-5, abs=1e-7)


def test_grpo_process_without_a_process_reward_and_bad_step_lists_stop_with_the_reason(tmp_path):
    # refused when the trainer is built, before the model is used
    with pytest.raises(ConfigError, match=r"needs step rewards, and none of the rewards \['has_seven'\]"):
        make_process_trainer(tmp_path / "a", functions=[("has_seven", has_seven, 1.0)])

    def past_the_end(prompts, completions, **kw):
        return [[(len(c) + 1, 1.0)] for c in completions]

    past_the_end.step_rewards = True
    bad = make_process_trainer(tmp_path / "b", functions=[("past_the_end", past_the_end, 1.0)])
    with pytest.raises(TrainingError, match=r"'past_the_end' failed on every one .*step 0 ends at character"):
        bad.train_step()

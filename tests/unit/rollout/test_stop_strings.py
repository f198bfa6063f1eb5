"""Stop strings (rollout.stop; grpokit.rollout.engines.stop): where a completion ends by hand, the cut of a rollout,
the fast engine that stops drawing equal to the engine that draws on and is cut, a string of multi-byte characters
on a byte-level tokenizer, the settings and TRL's generation_kwargs."""

from __future__ import annotations

import pytest
import torch
from tiny_model import make_tiny_model, make_tiny_tokenizer

from grpokit.config.schema import load_config
from grpokit.config.trl import from_trl
from grpokit.core.errors import ConfigError
from grpokit.rollout.engines import SamplingParams
from grpokit.rollout.engines.base import Rollout
from grpokit.rollout.engines.fast.generator import FastGenerator
from grpokit.rollout.engines.hf import HFGenerator
from grpokit.rollout.engines.stop import StopStrings, cut_at_stop

TOK = make_tiny_tokenizer()


def ids_of(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def test_the_end_is_the_token_that_completes_the_string():
    """'12=3;4' on a character-level tokenizer with stop '=3': the first 4 tokens' text '12=3' holds it, the first 3
    do not; a second string that comes later does not move the end; a special token can be a stop string."""
    stop = StopStrings(("=3", "4"), TOK)
    ids = ids_of("12=3+4")
    assert len(ids) == 6 and stop.end(ids) == 4
    assert StopStrings(("9",), TOK).end(ids) is None
    special = ids_of("7") + [TOK.convert_tokens_to_ids("</answer>")] + ids_of("88")
    assert StopStrings(("</answer>",), TOK).end(special) == 2
    with pytest.raises(ValueError, match="non-empty"):
        StopStrings(("",), TOK)


def rollout_of(texts: list[str], truncated: list[bool], width: int = 8) -> Rollout:
    rows = [ids_of(t) for t in texts]
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    logprobs = -torch.arange(1, width + 1, dtype=torch.float32).repeat(len(rows), 1) * mask
    return Rollout(prompt_ids=torch.ones((len(rows), 1), dtype=torch.long), prompt_mask=torch.ones((len(rows), 1)),
                   completion_ids=ids, completion_mask=mask, logprobs=logprobs, truncated=torch.tensor(truncated))  # fmt: skip


def test_the_cut_keeps_the_stop_and_pads_the_rest():
    """Three rows, stop ')': '1)+2' (truncated, cut after ')': 2 tokens, no longer truncated), '33' (no stop: as it
    was, still truncated), '4+5)' (ends at its last token); the columns are as wide as the longest left (4)."""
    r = rollout_of(["1)+2", "33", "4+5)"], [True, True, False])
    cut = cut_at_stop(r, StopStrings((")",), TOK), pad_token_id=0)
    assert cut.completion_mask.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert cut.completion_ids[0].tolist() == ids_of("1)") + [0, 0]
    assert cut.logprobs[0].tolist() == [-1.0, -2.0, 0.0, 0.0]  # the kept tokens' log-probs as drawn
    assert cut.truncated.tolist() == [False, True, False]
    assert TOK.batch_decode(cut.completion_token_ids()) == ["1)", "33", "4+5)"]
    assert cut_at_stop(r, StopStrings(("#",), TOK), pad_token_id=0) is r  # nothing to cut: the same rollout


@pytest.mark.parametrize("greedy", [True, False])
def test_the_fast_engine_that_stops_draws_what_the_engine_that_draws_on_draws_then_cut(greedy):
    """The same seed with and without rollout.stop: the fast engine's rollout with the stop equals its rollout
    without it, cut (each row's draws depend on its own noise only); it stops drawing for the rows that hit it (fewer
    decode steps); every row that holds a stop string ends with it."""
    model, tok = make_tiny_model("qwen2", seed=0)
    # greedy: two strings; sampled: digits but 0 and signs, which every row draws early (no special token's text holds them)
    stop = StopStrings(("1", "g") if greedy else tuple("123456789+-*=()?.,#:!"), tok)
    params = SamplingParams(group_size=6, max_new_tokens=24, temperature=0.0 if greedy else 1.0, eos_token_ids=[1],
                            pad_token_id=0, seed=7)  # fmt: skip
    prompts = [ids_of("1+2="), ids_of("3+3=")]
    engine = FastGenerator()
    plain = engine.generate(model, prompts, params)
    plain_steps = engine.stats["decode_steps"]
    stopped = engine.generate(model, prompts, SamplingParams.of(params, stop_strings=stop))
    want = cut_at_stop(plain, stop, pad_token_id=0)
    for field in ("completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(stopped, field), getattr(want, field)), field
    # the log-probs to rounding: a row's logits may come from a batch of another size once finished rows are dropped
    torch.testing.assert_close(stopped.logprobs, want.logprobs, rtol=0, atol=1e-5)
    texts = tok.batch_decode(stopped.completion_token_ids(), skip_special_tokens=False)
    held = [t for t in texts if stop.holds(t)]
    assert held and all(t.endswith(stop.strings) for t in held), [t for t in texts if not t.endswith(stop.strings)]
    if not greedy:  # every sampled row drew one: the engine stopped when the last one did
        assert len(held) == len(texts) and engine.stats["decode_steps"] < plain_steps, engine.stats


def test_the_hf_engine_is_cut_as_well():
    """The hf engine draws on to an EOS or the limit; Engine.generate cuts its rollout the same way."""
    model, tok = make_tiny_model("qwen2", seed=0)
    stop = StopStrings(("1",), tok)
    params = SamplingParams(group_size=4, max_new_tokens=16, temperature=1.0, eos_token_ids=[1], pad_token_id=0,
                            seed=3)  # fmt: skip
    plain = HFGenerator().generate(model, [ids_of("1+2=")], params)
    stopped = HFGenerator().generate(model, [ids_of("1+2=")], SamplingParams.of(params, stop_strings=stop))
    want = cut_at_stop(plain, stop, pad_token_id=0)
    assert torch.equal(stopped.completion_mask, want.completion_mask)
    assert torch.equal(stopped.completion_ids, want.completion_ids)


def test_a_string_of_multi_byte_characters_on_a_byte_level_tokenizer():
    """A byte-level BPE without merges spends a token per byte: the stop '→' (3 bytes) in 'ab→c' ends at the token of
    its last byte (5 tokens), and the tail check over the window finds it in the last tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    byte_tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    ids = byte_tok("ab→c", add_special_tokens=False)["input_ids"]
    assert len(ids) == 6  # a, b, 3 bytes of the arrow, c
    stop = StopStrings(("→",), byte_tok)
    assert stop.end(ids) == 5
    assert stop.hit([ids[:5], ids[:4]]) == [True, False]
    assert stop.window >= 5


def test_settings_and_trls_generation_kwargs():
    """rollout.stop takes a list of non-empty strings, single-turn only; TRL's generation_kwargs stop (vLLM's) and
    stop_strings (transformers'), a string or a list, map to it."""
    assert load_config(None, ["rollout.stop=['</answer>']"]).rollout.stop == ["</answer>"]
    with pytest.raises(ConfigError, match="non-empty strings"):
        load_config(None, ["rollout.stop=['']"])
    with pytest.raises(ConfigError, match="multi-turn"):
        load_config(None, ["rollout.stop=['x']", "rollout.tools=[python]"])
    assert from_trl({"generation_kwargs": {"stop": "</answer>"}})[0]["rollout"]["stop"] == ["</answer>"]
    assert from_trl({"generation_kwargs": {"stop_strings": ["a", "b"]}})[0]["rollout"]["stop"] == ["a", "b"]
    with pytest.raises(ConfigError, match="include_stop_str_in_output"):
        from_trl({"generation_kwargs": {"stop": "x", "include_stop_str_in_output": True}})


DIGITS = set("123456789")


def digit_seen(prompts, completions, **kw):
    """Scores a completion holding a digit 1-9, and writes every completion it sees to $SEEN_FILE (reward functions
    run in worker processes)."""
    import json
    import os

    with open(os.environ["SEEN_FILE"], "a") as f:
        f.writelines(json.dumps(c) + "\n" for c in completions)
    return [float(bool(DIGITS & set(c))) for c in completions]


def test_a_training_run_and_its_evaluation_end_completions_at_the_stop(tmp_path, monkeypatch):
    """rollout.stop = the digits 1-9 in a GRPO run: every completion a reward function sees, in training and in the
    held-out evaluation, holds no such digit or ends at its first one."""
    import json

    from grpo_runs import ROWS

    from grpokit.trainers.grpo import GRPOTrainer

    monkeypatch.setenv("SEEN_FILE", str(tmp_path / "seen.jsonl"))
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(None, [
        f"train.output_dir={tmp_path / 'run'}", "train.steps=2", "rollout.group_size=4", "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=12", "data.template=plain", "model.device=cpu", f"rollout.stop={sorted(DIGITS)}",
        "eval.num_samples=2", "train.samples_every=0", "train.tensorboard=false",
    ])  # fmt: skip
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS[:24], eval_rows=ROWS[24:28],
                          reward_functions=[("digit_seen", digit_seen, 1.0)])  # fmt: skip
    trainer.train()
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    stopped = [c for c in seen if DIGITS & set(c)]
    assert len(stopped) > 10 and all(c[-1] in DIGITS and not DIGITS & set(c[:-1]) for c in stopped), stopped[:5]
    assert len(seen) >= 2 * 16 + 2 * 4 * 3  # two steps of 16; before and after, 4 prompts (greedy + 2 samples)


def test_the_vllm_engine_is_asked_to_stop_at_stop_strings_of_one_token():
    """vLLM runs without a tokenizer: a stop string that is one token ('</answer>', an added token; '7', a character)
    joins the EOS ids in its stop_token_ids; one of two tokens ('=3') is cut after the draw instead."""
    from grpokit.rollout.engines.vllm.generator import request_params

    stop = StopStrings(("</answer>", "=3", "7"), TOK)
    answer = TOK.convert_tokens_to_ids("</answer>")
    assert stop.token_ids == (answer, ids_of("7")[0])
    params = SamplingParams(group_size=2, max_new_tokens=8, temperature=1.0, eos_token_ids=[1], pad_token_id=0)
    assert request_params(params, seed=0)["stop_token_ids"] == [1]
    with_stop = SamplingParams.of(params, stop_strings=stop)
    assert request_params(with_stop, seed=0)["stop_token_ids"] == [1, answer, ids_of("7")[0]]

"""min_p and the repetition penalty (rollout.min_p, rollout.repetition_penalty) in the fast and hf engines: the
rules by hand and against transformers' processors, the engines drawing from the processed distribution, and
the log-probs they return being that distribution's (grpokit.rollout.engines.base's module docstring)."""

import math

import pytest
import torch
from sampling_oracle import processed_distribution, processed_logprobs, raw_logits
from tiny_model import ADDITION_ROWS, PAD_ID, SAMPLE_PROMPTS, make_tiny_model, small_trainer

from grpokit.data.templates import encode_prompts
from grpokit.rollout.engines.fast import FastGenerator
from grpokit.rollout.engines.fast.generator import (
    filter_logits,
    penalise_repeats,
    process_logits,
    sample_tokens,
    seen_tokens,
)
from grpokit.rollout.engines.hf import HFGenerator

PAD = PAD_ID


def test_penalty_and_min_p_by_hand_on_four_tokens():
    # logits 2, 1, -1, 0.5; tokens 0 and 2 seen; penalty 2: 2 / 2 = 1 and -1 * 2 = -2 -> 1, 1, -2, 0.5
    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5]])
    seen = torch.tensor([[True, False, True, False]])
    assert penalise_repeats(logits, seen, 2.0).tolist() == [[1.0, 1.0, -2.0, 0.5]]
    # min_p 0.5 at T = 1 keeps exp(z - 1) >= 0.5, i.e. z >= 1 - ln 2 = 0.307: tokens 0, 1, 3 (token 2 dropped)
    z = process_logits(logits, 1.0, min_p=0.5, repetition_penalty=2.0, seen=seen)
    assert torch.isinf(z).tolist() == [[False, False, True, False]]
    # kept: e^1, e^1, e^0.5 -> Z = 2 * 2.71828 + 1.64872 = 7.08528; p = 0.38366, 0.38366, 0, 0.23269
    want = torch.tensor([math.e, math.e, 0.0, math.exp(0.5)]) / (2 * math.e + math.exp(0.5))  # (4,)
    torch.testing.assert_close(want, torch.tensor([0.38366, 0.38366, 0.0, 0.23269]), rtol=0, atol=1e-5)
    torch.testing.assert_close(z.softmax(-1)[0], want, rtol=0, atol=1e-6)
    # without the penalty token 0 leads: e^2 / (e^2 + e^1 + e^0.5) (token 2: e^-1 / e^2 = 0.05 < 0.5, dropped)
    plain = process_logits(logits, 1.0, min_p=0.5)
    assert torch.isinf(plain).tolist() == [[False, True, True, True]]  # e^1 / e^2 = 0.37 < 0.5: only token 0
    # greedy: the penalty applies (argmax of 1, 1, -2, 0.5 is token 0 by first index), the filters do not
    greedy = process_logits(logits, 0.0, min_p=0.99, repetition_penalty=2.0, seen=seen)
    assert greedy.tolist() == [[1.0, 1.0, -2.0, 0.5]]

    # sampling follows it: 20000 Gumbel draws; the log-probs returned are log p of the processed distribution
    n = 20000
    noise = torch.empty(n, 4).exponential_(generator=torch.Generator().manual_seed(0))
    tokens, lps = sample_tokens(
        logits.expand(n, 4), 1.0, 0, 1.0, noise, min_p=0.5, repetition_penalty=2.0, seen=seen.expand(n, 4)
    )
    freq = torch.bincount(tokens, minlength=4) / n
    torch.testing.assert_close(freq, want, rtol=0, atol=0.015)  # 3 sigma of 0.38 at n = 20000 is 0.010
    torch.testing.assert_close(lps, want.log()[tokens], rtol=0, atol=1e-5)


def test_the_rules_are_transformers_processors():
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
    )

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(16, 64, generator=g) * 3  # (B, V)
    history = torch.randint(0, 64, (16, 12), generator=g)  # (B, T) prompt + completion so far
    seen = torch.zeros(16, 64, dtype=torch.bool).scatter_(1, history, True)
    for penalty in (1.3, 0.7):
        want = RepetitionPenaltyLogitsProcessor(penalty)(history, scores.clone())
        assert torch.equal(penalise_repeats(scores, seen, penalty), want)
    for min_p in (0.05, 0.3, 0.9):
        want = MinPLogitsWarper(min_p)(None, scores.clone())
        assert torch.equal(torch.isinf(filter_logits(scores, min_p=min_p)), torch.isinf(want)), min_p
    # the whole chain in transformers' order: penalty, temperature, top-k, min-p
    want = RepetitionPenaltyLogitsProcessor(1.2)(history, scores.clone())
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(10), MinPLogitsWarper(0.1)):
        want = warper(None, want)
    got = process_logits(scores, 0.7, top_k=10, min_p=0.1, repetition_penalty=1.2, seen=seen)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_seen_tokens_skip_the_left_padding():
    ids = torch.tensor([[0, 0, 5, 7], [3, 5, 5, 9]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    seen = seen_tokens(ids, mask, 10)
    assert seen.nonzero().tolist() == [[0, 5], [0, 7], [1, 3], [1, 5], [1, 9]]  # pad id 0 not seen in row 0


def model_of(seed: int):
    """A tiny random model: its logits spread over several nats (std about 3), so the penalty and min-p change
    the distribution visibly."""
    return make_tiny_model("qwen2", seed=seed)[0]


SAMPLING = dict(temperature=1.3, min_p=0.1, repetition_penalty=1.5)


@pytest.mark.parametrize("gen", [FastGenerator(), HFGenerator()], ids=["fast", "hf"])
def test_first_tokens_follow_the_processed_distribution_and_their_log_probs_are_its(gen):
    model = model_of(1)
    prompt = [2, 4, 11, 20, 12, 27, 5]
    n = 3000
    r = gen.generate(model, [prompt], group_size=n, max_new_tokens=1, eos_token_ids=[1], pad_token_id=PAD,
                     seed=0, **SAMPLING)  # fmt: skip
    first = raw_logits(model, r.select(torch.tensor([0])))[
        0, 0
    ].tolist()  # (V,) the prompt's next-token logits
    want = processed_distribution(first, set(prompt), **SAMPLING)
    raw = torch.tensor(first).div(SAMPLING["temperature"]).softmax(-1)  # (V,) unprocessed, at T
    probs = torch.zeros(64, dtype=torch.float64)
    probs[list(want)] = torch.tensor(list(want.values()), dtype=torch.float64)
    assert float((probs - raw).abs().max()) > 0.1  # the processing matters here: the test can tell them apart
    assert 3 <= len(want) < 40  # min-p dropped most tokens, kept several
    freq = torch.bincount(r.completion_ids[:, 0], minlength=64).double() / n
    assert set(r.completion_ids[:, 0].tolist()) <= set(want)  # nothing min-p dropped was drawn
    assert float((freq - probs).abs().max()) < 4 * math.sqrt(0.25 / n)  # 4 sigma at worst (p = 0.5)
    lp = r.logprobs[:, 0].double()
    torch.testing.assert_close(lp, probs.log()[r.completion_ids[:, 0]], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "gen",
    [FastGenerator(), FastGenerator(compact=False), HFGenerator()],
    ids=["fast", "fast-no-compaction", "hf"],
)
def test_every_tokens_log_prob_is_the_processed_distributions(gen):
    """The penalty sees the completion so far, not only the prompt: every position against the naive oracle."""
    model = model_of(2)
    kw = dict(group_size=4, max_new_tokens=10, eos_token_ids=[1, 36], pad_token_id=PAD, seed=5)
    r = gen.generate(model, SAMPLE_PROMPTS, **kw, **SAMPLING)
    mask = r.completion_mask.bool()
    assert mask.sum(-1).max() > 3 and not mask.all()  # long rows (the penalty's history grows) and early ends
    want = processed_logprobs(model, r, **SAMPLING)
    torch.testing.assert_close(r.logprobs.double()[mask], want[mask], rtol=0, atol=1e-5)
    greedy = gen.generate(
        model, SAMPLE_PROMPTS, **{**kw, "group_size": 1}, temperature=0.0, repetition_penalty=1.5
    )
    want = processed_logprobs(model, greedy, temperature=0.0, repetition_penalty=1.5)
    gmask = greedy.completion_mask.bool()
    torch.testing.assert_close(greedy.logprobs.double()[gmask], want[gmask], rtol=0, atol=1e-5)


def test_fast_and_hf_agree_greedily_under_the_penalty_and_it_changes_the_output():
    model = model_of(3)
    kw = dict(group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=[1], pad_token_id=PAD)
    fast = FastGenerator().generate(model, SAMPLE_PROMPTS, repetition_penalty=1.5, **kw)
    hf = HFGenerator().generate(model, SAMPLE_PROMPTS, repetition_penalty=1.5, **kw)
    assert torch.equal(fast.completion_ids, hf.completion_ids)
    torch.testing.assert_close(fast.logprobs, hf.logprobs, rtol=0, atol=1e-5)
    plain = FastGenerator().generate(model, SAMPLE_PROMPTS, **kw)
    assert not torch.equal(plain.completion_ids, fast.completion_ids)  # the penalty changed the greedy output


def test_bad_values_are_named():
    model, _ = make_tiny_model("qwen2")
    kw = dict(group_size=2, max_new_tokens=2, temperature=1.0, eos_token_ids=[1], pad_token_id=PAD)
    for gen in (FastGenerator(), HFGenerator()):
        with pytest.raises(ValueError, match=r"min_p must be in \[0, 1\] \(0 = off\), got 1.5"):
            gen.generate(model, SAMPLE_PROMPTS, min_p=1.5, **kw)
        with pytest.raises(ValueError, match=r"repetition_penalty must be > 0 \(1 = off\), got 0"):
            gen.generate(model, SAMPLE_PROMPTS, repetition_penalty=0, **kw)


@pytest.mark.slow
def test_a_runs_rollouts_and_evaluation_use_its_settings(tmp_path):
    """rollout.min_p / repetition_penalty reach the trainer's rollouts (every engine: the sampler passes them) and
    the penalty its evaluation (greedy decoding with it); the saved log-probs are the processed distribution's."""
    overrides = ["rollout.temperature=1.3", "rollout.min_p=0.1", "rollout.repetition_penalty=1.5"]
    for engine in ("fast", "hf"):
        t = small_trainer(tmp_path / engine, 1, *overrides, f"rollout.engine={engine}")
        r = t.sampler.rollout(SAMPLE_PROMPTS, seed=0)
        want = processed_logprobs(t.model, r, **SAMPLING)
        mask = r.completion_mask.bool()
        torch.testing.assert_close(r.logprobs.double()[mask], want[mask], rtol=0, atol=1e-5)
    examples: list[dict] = []
    t.eval_rows = ADDITION_ROWS[:3]
    t.held_out_metrics(examples)
    d = t.cfg.data
    (prompt,) = encode_prompts(
        [ADDITION_ROWS[0]["prompt"]], t.tokenizer, template=d.template, max_prompt_tokens=32
    )
    n = t.cfg.rollout.max_new_tokens  # SMALL_RUN's 4
    kw = dict(
        group_size=1, max_new_tokens=n, temperature=0.0, eos_token_ids=t.sampler.eos_ids, pad_token_id=PAD
    )
    penalised = HFGenerator().generate(t.model, [prompt], repetition_penalty=1.5, **kw).decode(t.tokenizer)[0]
    plain = HFGenerator().generate(t.model, [prompt], **kw).decode(t.tokenizer)[0]
    assert examples[0]["completion"] == penalised != plain

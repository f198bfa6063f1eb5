"""VLLMGenerator (grpokit.rollout.engines.vllm) on vLLM's CPU engine: group sampling into the same Rollout, the sampled
tokens' log-probs against the trainer's recomputation, weight pushes, the check that catches a push that did
not arrive, and the prefix cache reset. One engine for the module (starting one takes 10-45 s here); each test
brings its own model object, whose weights the first call pushes."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.sampling_params", reason="vLLM is not installed (tests/engine_vllm run in .venv-vllm, .ci/run)")

import torch  # noqa: E402
from sampling_oracle import processed_logprobs  # noqa: E402
from tiny_model import SAMPLE_PROMPTS  # noqa: E402
from vllm_models import settings, vllm_model  # noqa: E402

from grpokit.model.logprobs import completion_logprobs  # noqa: E402
from grpokit.rollout.engines.fast import FastGenerator  # noqa: E402
from grpokit.rollout.engines.hf import HFGenerator  # noqa: E402
from grpokit.rollout.engines.vllm import VLLMGenerator, WeightSyncError, trainer_weights  # noqa: E402

pytestmark = pytest.mark.slow
EOS = [1, 59]  # <eos>, and a character the random model writes often, so that completions end early too
LOGPROB_TOL = 1e-4  # float32 on both sides; measured 2e-6 here (the engine's kernels sum in another order)


@pytest.fixture(scope="module")
def generator():
    gen = VLLMGenerator(settings(), max_model_len=512, seed=0)
    yield gen
    gen.close()


def sample(gen, model, **kw):
    args = dict(group_size=4, max_new_tokens=12, temperature=1.0, eos_token_ids=EOS, pad_token_id=0, seed=3)
    return gen.generate(model, SAMPLE_PROMPTS, **{**args, **kw})


def trainer_logprobs(model, r, temperature):
    lp, _ = completion_logprobs(
        model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, temperature=temperature
    )
    return lp.detach()


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_group_logprobs_are_the_trainers_recomputation(generator, temperature):
    model, _ = vllm_model(seed=0)
    r = sample(generator, model, temperature=temperature)
    N = len(SAMPLE_PROMPTS) * 4
    assert r.completion_ids.shape[0] == N and r.prompt_ids.shape[0] == N
    # prompt-major: rows 4i..4i+3 are prompt i's, left-padded
    for i, p in enumerate(SAMPLE_PROMPTS):
        for row in range(4 * i, 4 * i + 4):
            assert r.prompt_ids[row][r.prompt_mask[row].bool()].tolist() == p
    # the mask runs up to and including the EOS; truncated exactly when no EOS ended the row
    for row in range(N):
        ids = r.completion_ids[row][r.completion_mask[row].bool()].tolist()
        assert ids and (ids[-1] in EOS) != bool(r.truncated[row])
        assert not any(t in EOS for t in ids[:-1])
    assert r.truncated.any() and not r.truncated.all()  # both kinds present: the checks above bite
    # G samples of a prompt differ (their own seeds), and so do prompts
    assert len({tuple(x) for x in r.completion_ids.tolist()}) > N // 2
    mask = r.completion_mask.bool()
    diff = (trainer_logprobs(model, r, temperature) - r.logprobs)[mask].abs()
    assert float(diff.max()) < LOGPROB_TOL
    assert (r.logprobs[~mask] == 0).all()


def test_a_seed_gives_the_same_rollout_and_another_seed_another(generator):
    model, _ = vllm_model(seed=0)
    a, b, c = sample(generator, model, seed=11), sample(generator, model, seed=11), sample(generator, model, seed=12)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_greedy_rollouts_match_hf_and_log_probs_are_at_temperature_one(generator):
    model, _ = vllm_model(seed=1)
    r = sample(generator, model, temperature=0.0, group_size=1)
    hf = HFGenerator().generate(
        model, SAMPLE_PROMPTS, group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS, pad_token_id=0
    )
    assert torch.equal(r.completion_ids, hf.completion_ids)
    diff = (trainer_logprobs(model, r, 1.0) - r.logprobs)[r.completion_mask.bool()].abs()
    assert float(diff.max()) < LOGPROB_TOL


def optimizer_step(model, lr=1e-2):
    """One AdamW step on a next-token loss: every weight moves (in place, as the trainer's optimizer does)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ids = torch.tensor([SAMPLE_PROMPTS[0]])
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    model.eval()


def test_after_an_optimizer_step_the_engine_samples_from_the_new_weights(generator):
    model, _ = vllm_model(seed=2)
    before = sample(generator, model, temperature=0.0, group_size=1)
    pushes = generator.pushes
    optimizer_step(model)
    after = sample(generator, model, temperature=0.0, group_size=1)
    assert generator.pushes == pushes + 1  # the changed weights were pushed, once
    hf = HFGenerator().generate(
        model, SAMPLE_PROMPTS, group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS, pad_token_id=0
    )
    assert torch.equal(after.completion_ids, hf.completion_ids)  # the trainer model's greedy output
    assert not torch.equal(before.completion_ids, after.completion_ids)  # the step changed it: the check bites
    diff = (trainer_logprobs(model, after, 1.0) - after.logprobs)[after.completion_mask.bool()].abs()
    assert float(diff.max()) < LOGPROB_TOL
    sample(generator, model, temperature=0.0, group_size=1)
    assert generator.pushes == pushes + 1  # unchanged weights are not pushed again


class SkippingPush(VLLMGenerator):
    """A sync that never arrives (the bug of TRL #5312): the transfer is skipped, the rest goes on."""

    def _reload(self, llm, weights):
        pass


def test_a_push_that_did_not_arrive_stops_with_a_named_error(generator):
    model, _ = vllm_model(seed=3)
    sample(generator, model, temperature=0.0, group_size=1)  # the engine holds this model's weights
    optimizer_step(model)
    generator.__class__ = SkippingPush
    try:
        with pytest.raises(WeightSyncError, match="is not the trainer's"):
            sample(generator, model, temperature=0.0, group_size=1)
    finally:
        generator.__class__ = VLLMGenerator
    sample(generator, model, temperature=0.0, group_size=1)  # a real push makes them equal again


def test_sync_every_lets_the_engine_lag_and_says_by_how_much(generator):
    model, _ = vllm_model(seed=4)
    generator.settings.sync_every = 2
    try:
        generator.sync(model, 0)
        first = sample(generator, model, temperature=0.0, group_size=1)  # step 0: pushed (a new model)
        optimizer_step(model)
        generator.sync(model, 1)  # one step after the push: the engine may lag
        assert generator.stats["weight_lag"] == 1
        lagging = sample(generator, model, temperature=0.0, group_size=1)
        assert torch.equal(lagging.completion_ids, first.completion_ids)  # sampled from the old weights
        generator.sync(model, 2)  # two steps: pushed
        assert generator.stats["weight_lag"] == 0
        fresh = sample(generator, model, temperature=0.0, group_size=1)
        assert not torch.equal(fresh.completion_ids, first.completion_ids)
    finally:
        generator.settings.sync_every = 1


class NoCacheReset(VLLMGenerator):
    """A push that leaves the prefix cache as it was."""

    def push(self, model):
        llm = self.engine_for(model)
        llm.reset_prefix_cache = lambda: True
        try:
            super().push(model)
        finally:
            del llm.reset_prefix_cache


def test_the_prefix_cache_is_reset_with_every_push(generator):
    """A prompt long enough to fill cached KV blocks (vLLM caches whole blocks only), seen before the push: with the cache
    kept, the next rollout reuses the old weights' keys and values and its log-probs are off; with it reset
    (every push does), they are the trainer's."""
    model, _ = vllm_model(seed=5)
    long_prompt = [[2] + [4 + (i * 7) % 50 for i in range(300)]]

    def rollout():
        return generator.generate(
            model, long_prompt, group_size=2, max_new_tokens=4, temperature=1.0, eos_token_ids=EOS,
            pad_token_id=0, seed=1,
        )  # fmt: skip

    def gap(r):
        return float((trainer_logprobs(model, r, 1.0) - r.logprobs)[r.completion_mask.bool()].abs().max())

    rollout()
    optimizer_step(model, lr=3e-2)
    generator.__class__ = NoCacheReset
    try:
        stale = rollout()
    finally:
        generator.__class__ = VLLMGenerator
    assert gap(stale) > 1e-2  # what a stale cache does: the check below bites
    rollout()
    optimizer_step(model, lr=3e-2)
    assert gap(rollout()) < LOGPROB_TOL


def test_lora_is_pushed_merged_and_the_engine_matches_the_adapter_model(generator):
    peft = pytest.importorskip("peft")
    base, _ = vllm_model(seed=6)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a trained adapter: B != 0, so it changes the outputs
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    state = trainer_weights(model)
    assert not any("lora" in k or "base_layer" in k for k in state)
    q = base.model.layers[0].self_attn.q_proj
    expected = q.base_layer.weight + q.get_delta_weight("default")
    assert torch.equal(state["model.layers.0.self_attn.q_proj.weight"], expected)
    r = sample(generator, model, temperature=0.0, group_size=1)
    hf = HFGenerator().generate(
        model, SAMPLE_PROMPTS, group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS, pad_token_id=0
    )
    assert torch.equal(r.completion_ids, hf.completion_ids)
    with model.disable_adapter():
        plain = HFGenerator().generate(
            model, SAMPLE_PROMPTS, group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS,
            pad_token_id=0,
        )  # fmt: skip
    assert not torch.equal(plain.completion_ids, hf.completion_ids)  # the adapter matters: the check bites
    diff = (trainer_logprobs(model, r, 1.0) - r.logprobs)[r.completion_mask.bool()].abs()
    assert float(diff.max()) < LOGPROB_TOL


@pytest.fixture(scope="module")
def tied_generator():
    """An engine of a model whose LM head is its embedding (tie_word_embeddings, as the demo's model)."""
    gen = VLLMGenerator(settings(), max_model_len=512, seed=0)
    yield gen
    gen.close()


def tied_model(seed):
    from tiny_model import make_tiny_model

    return make_tiny_model(
        "qwen2", seed=seed, hidden_size=64, num_heads=2, num_kv_heads=1, max_position_embeddings=512,
        tie_word_embeddings=True,
    )[0]  # fmt: skip


def test_a_tied_lm_head_follows_the_embedding_after_a_push(tied_generator):
    """vLLM's CPU engine keeps a packed GEMM copy of the LM head; tied to the embedding it gets no weights of
    its own in a reload, so without rebuilding it the head stays as loaded (0.8 nats off after one step)."""
    model = tied_model(seed=7)
    sample(tied_generator, model)
    optimizer_step(model, lr=3e-2)
    r = sample(tied_generator, model)
    diff = (trainer_logprobs(model, r, 1.0) - r.logprobs)[r.completion_mask.bool()].abs()
    assert float(diff.max()) < LOGPROB_TOL
    assert tied_generator.stats["probe_gap"] < 1e-3


def test_the_probe_stops_a_run_whose_engine_computes_with_a_stale_copy(tied_generator, monkeypatch):
    import grpokit.rollout.engines.vllm.local as engine_module

    model = tied_model(seed=8)
    sample(tied_generator, model)
    optimizer_step(model, lr=3e-2)
    monkeypatch.setattr(engine_module, "_refresh_tied_head", lambda m: False)  # the head's copy left as it was
    with pytest.raises(WeightSyncError, match="probe sequence are .* nats from the trainer's"):
        sample(tied_generator, model)
    monkeypatch.undo()
    sample(tied_generator, model)  # pushed again (the failed push was not recorded) and now right
    assert tied_generator.stats["probe_gap"] < 1e-3


PROCESSED = dict(temperature=1.3, min_p=0.1, repetition_penalty=1.5)
"""Sampling settings that change the distribution: the engine's log-probs are then of the processed one."""


def test_min_p_and_the_repetition_penalty_give_the_processed_distributions_log_probs(generator):
    """vLLM draws from the penalised, min-p-filtered distribution and returns its log-probs: the naive oracle's
    (tests/sampling_oracle.py), as the fast and hf engines do (tests/unit/rollout/test_sampling_settings.py)."""
    model, _ = vllm_model(seed=9)
    r = sample(generator, model, **PROCESSED)
    mask = r.completion_mask.bool()
    want = processed_logprobs(model, r, **PROCESSED)
    assert torch.isfinite(want[mask]).all()  # nothing min-p drops was drawn
    assert float((want - r.logprobs.double())[mask].abs().max()) < LOGPROB_TOL
    raw = trainer_logprobs(model, r, PROCESSED["temperature"])  # the trainer's: the raw model at T
    assert float((raw - r.logprobs)[mask].abs().max()) > 0.05  # they differ here: the oracle check bites


def test_greedy_under_the_repetition_penalty_is_the_fast_and_hf_engines(generator):
    model, _ = vllm_model(seed=10)
    r = sample(generator, model, temperature=0.0, group_size=1, repetition_penalty=1.5)
    kw = dict(group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS, pad_token_id=0)
    hf = HFGenerator().generate(model, SAMPLE_PROMPTS, repetition_penalty=1.5, **kw)
    fast = FastGenerator().generate(model, SAMPLE_PROMPTS, repetition_penalty=1.5, **kw)
    assert torch.equal(r.completion_ids, hf.completion_ids) and torch.equal(r.completion_ids, fast.completion_ids)
    want = processed_logprobs(model, r, temperature=0.0, repetition_penalty=1.5)
    assert float((want - r.logprobs.double())[r.completion_mask.bool()].abs().max()) < LOGPROB_TOL
    plain = sample(generator, model, temperature=0.0, group_size=1)
    assert not torch.equal(plain.completion_ids, r.completion_ids)  # the penalty changed the output


def test_a_push_that_leaves_the_prefix_cache_is_caught_by_the_probe(generator):
    """The probe's cache check (the greedy token after the whole probe sequence) reads the prefix cache: with a
    probe longer than a KV block (128 tokens on vLLM's CPU backend), a push that does not reset the cache stops
    with WeightSyncError. The probe's prompt log-probs alone never read the cache (vLLM computes them afresh):
    they agree, and only the second check names the cache."""
    model, _ = vllm_model(seed=11)
    long_prompt = [2] + [4 + (i * 7) % 50 for i in range(300)]  # 301 tokens: 2 full blocks of 128 cached

    def rollout():
        return generator.generate(
            model, [long_prompt], group_size=2, max_new_tokens=4, temperature=1.0, eos_token_ids=EOS,
            pad_token_id=0, seed=1,
        )  # fmt: skip

    saved = generator.probe_ids
    generator.probe_ids = long_prompt
    try:
        rollout()  # a new model: pushed and probed, the probe's blocks cached with these weights
        optimizer_step(model, lr=3e-2)
        generator.__class__ = NoCacheReset
        try:
            with pytest.raises(WeightSyncError, match="prefix cache holds KV blocks of older weights"):
                rollout()
        finally:
            generator.__class__ = VLLMGenerator
        rollout()  # pushed again, with the reset: the checks pass
        assert generator.stats["probe_gap"] < 1e-3
    finally:
        generator.probe_ids = saved


def test_a_stop_string_of_one_token_stops_the_engine_where_the_cut_would(generator):
    """rollout.stop with a one-token string (here the greedy draw's own third token): vLLM stops at it (stop_token_ids)
    and the rollout is the greedy draw without the stop, cut there (grpokit.rollout.engines.stop)."""
    from grpokit.rollout.engines.stop import StopStrings, cut_at_stop

    model, tok = vllm_model(seed=0)
    plain = sample(generator, model, temperature=0.0, group_size=1, max_new_tokens=12, eos_token_ids=[1])
    row = plain.completion_ids[0][plain.completion_mask[0].bool()].tolist()
    assert len(row) >= 4
    stop = StopStrings((tok.decode([row[2]]),), tok)
    assert stop.token_ids == (row[2],)  # one token: the engine is asked to stop at it
    stopped = sample(generator, model, temperature=0.0, group_size=1, max_new_tokens=12, eos_token_ids=[1],
                     stop_strings=stop)  # fmt: skip
    want = cut_at_stop(plain, stop, pad_token_id=0)
    assert torch.equal(stopped.completion_mask, want.completion_mask)
    assert torch.equal(stopped.completion_ids, want.completion_ids)
    assert torch.equal(stopped.truncated, want.truncated)
    assert int(stopped.completion_mask[0].sum()) <= 3

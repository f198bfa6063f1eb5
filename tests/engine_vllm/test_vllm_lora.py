"""The LoRA adapter pushed alone to vLLM's CPU engine (rollout.vllm.lora_push) against the merged push, and a weight
sync that hangs in this process stopped by rollout.vllm.sync_timeout_s. Two engines for the module, one started
with vLLM's LoRA (the adapter push) and one without (the merged push); each test brings its own models."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("vllm.sampling_params", reason="vLLM is not installed (tests/engine_vllm run in .venv-vllm, .ci/run)")
peft = pytest.importorskip("peft")

import torch  # noqa: E402
from test_vllm_generator import EOS, LOGPROB_TOL, optimizer_step, sample, trainer_logprobs  # noqa: E402
from tiny_model import SAMPLE_PROMPTS  # noqa: E402
from vllm_models import settings, vllm_model  # noqa: E402

from grpokit.rollout.engines.hf import HFGenerator  # noqa: E402
from grpokit.rollout.engines.vllm import VLLMGenerator, WeightSyncError, WeightSyncTimeout  # noqa: E402
from grpokit.rollout.engines.vllm.weights import trainer_weights, weight_bytes  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines():
    """(adapter, merged): generators pushing the adapter alone and the merged weights."""
    adapter = VLLMGenerator(settings(lora_push="adapter"), max_model_len=512, seed=0)
    merged = VLLMGenerator(settings(lora_push="merged"), max_model_len=512, seed=0)
    yield adapter, merged
    adapter.close()
    merged.close()


def lora_model(seed):
    """A tiny model with a trained-looking LoRA adapter on q and v (B != 0: it changes the outputs)."""
    base, _ = vllm_model(seed=seed)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    return model


def adapter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def greedy(gen, model):
    return sample(gen, model, temperature=0.0, group_size=1)


def test_the_adapter_push_gives_the_merged_pushs_rollouts_and_carries_the_adapter_alone(engines):
    adapter, merged = engines
    model = lora_model(seed=6)
    a, m = sample(adapter, model), sample(merged, model)  # 4 seeded samples of each prompt at T = 1
    assert adapter.adapter and not merged.adapter and adapter.llm.lora is not None
    mask = a.completion_mask.bool()
    assert torch.equal(a.completion_ids, m.completion_ids) and torch.equal(mask, m.completion_mask.bool())
    assert float((a.logprobs - m.logprobs)[mask].abs().max()) < LOGPROB_TOL  # measured ~2e-6 (float32)
    assert float((trainer_logprobs(model, a, 1.0) - a.logprobs)[mask].abs().max()) < LOGPROB_TOL
    # the first rollout pushed the adapter alone (the engine started from the base; the merged one from the model)
    assert adapter.stats["push_bytes"] == adapter_bytes(model) and adapter.stats["push_s"] > 0
    # a training step on the adapter: the adapter alone again, and the engine samples from it
    with model.disable_adapter():
        plain = HFGenerator().generate(
            model, SAMPLE_PROMPTS, group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS, pad_token_id=0
        )
    pushes = adapter.pushes
    optimizer_step(model, lr=3e-2)  # only the adapter trains (PEFT freezes the base)
    after = greedy(adapter, model)
    assert adapter.pushes == pushes + 1 and adapter.stats["push_bytes"] == adapter_bytes(model)
    hf = HFGenerator().generate(
        model, SAMPLE_PROMPTS, group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS, pad_token_id=0
    )
    assert torch.equal(after.completion_ids, hf.completion_ids)
    assert not torch.equal(plain.completion_ids, hf.completion_ids)  # the adapter changes the output: this bites
    merged_after = greedy(merged, model)
    assert torch.equal(after.completion_ids, merged_after.completion_ids)
    # what each push carried: the adapter's A and B, against every weight of the model
    assert merged.stats["push_bytes"] == weight_bytes(trainer_weights(model).items()) > 20 * adapter_bytes(model)
    assert merged.stats["push_s"] > 0
    mask = after.completion_mask.bool()
    assert float((after.logprobs - merged_after.logprobs)[mask].abs().max()) < LOGPROB_TOL


class SkippingAdapter(VLLMGenerator):
    """An adapter push that never arrives (verl #7495): the engine keeps the adapter before."""

    def _load_adapter(self, llm, adapter, config):
        pass


def test_an_adapter_push_that_did_not_arrive_is_caught_by_the_probe(engines):
    """The weight fingerprints cannot see an adapter (vLLM keeps no readable copy of the projections): the probe's
    log-probs, computed with the adapter the requests carry, do."""
    adapter, _ = engines
    model = lora_model(seed=7)  # another base: the push sends it, then the adapter
    greedy(adapter, model)
    optimizer_step(model, lr=3e-2)
    adapter.__class__ = SkippingAdapter
    try:
        with pytest.raises(WeightSyncError, match="probe sequence are .* nats from the trainer's"):
            greedy(adapter, model)
    finally:
        adapter.__class__ = VLLMGenerator
    greedy(adapter, model)  # pushed again (the failed push was not recorded) and now right
    assert adapter.stats["probe_gap"] < 1e-3


def test_a_push_that_hangs_in_this_process_stops_with_the_named_error_within_the_timeout(engines):
    _, merged = engines
    release, ended = threading.Event(), threading.Event()

    class HangingPush(VLLMGenerator):
        def _reload(self, llm, weights):  # a transfer that never returns, until the test lets it go
            release.wait(60)
            ended.set()
            raise RuntimeError("let go by the test")  # never touches the engine afterwards

    model, _ = vllm_model(seed=12)
    merged.settings.sync_timeout_s, merged.__class__ = 1.0, HangingPush
    try:
        with pytest.raises(WeightSyncTimeout, match=r"weight push \d+ to the vLLM engine \(in this process\) did not "
                                                     r"finish within 1 s"):  # fmt: skip
            greedy(merged, model)
    finally:
        release.set()
        ended.wait(60)
        merged.settings.sync_timeout_s, merged.__class__ = 300.0, VLLMGenerator
    assert ended.is_set()
    r = greedy(merged, model)  # nothing was recorded as pushed: this one pushes, and the engine is right
    assert float((trainer_logprobs(model, r, 1.0) - r.logprobs)[r.completion_mask.bool()].abs().max()) < LOGPROB_TOL

"""The engines' folder (grpokit.rollout.engines): the registry against the config's names, the capabilities the
rest of the library reads instead of names, the one sampling-parameters type, and the paths from before."""

from __future__ import annotations

import importlib

import pytest
import torch
from tiny_model import PAD_ID, SAMPLE_PROMPTS, make_tiny_model

from grpokit.config.schema import ENGINES, RolloutConfig, VLLMConfig
from grpokit.rollout.engines import ENGINE_CLASSES, Engine, SamplingParams, engine_class, make_generator
from grpokit.rollout.engines.fast import FastGenerator
from grpokit.rollout.engines.hf import HFGenerator


def test_the_registry_holds_the_configs_engine_names_each_class_under_its_own_name():
    assert tuple(ENGINE_CLASSES) == ENGINES
    for name in ENGINES:
        cls = engine_class(name)
        assert issubclass(cls, Engine) and cls.name == name
    with pytest.raises(ValueError, match=r"unknown rollout engine 'sglang'; choose one of \('fast', 'hf', 'vllm'\)"):
        engine_class("sglang")


def test_capabilities_say_what_only_vllm_does():
    """What used to be tested as rollout.engine == "vllm" in the trainer, the sampler process and the mismatch
    correction: the same answers, from the classes."""
    table = {name: (c.exact_logprobs, c.holds_weights, c.needs_fresh_process, c.takes_lora_adapters)
             for name, c in ((n, engine_class(n)) for n in ENGINES)}  # fmt: skip
    assert table == {
        "fast": (True, False, False, False),
        "hf": (True, False, False, False),
        "vllm": (False, True, True, True),
    }


def test_make_generator_reads_each_engines_own_settings():
    fast = make_generator(RolloutConfig(engine="fast", kv_cache="dynamic", cuda_graphs=False))
    assert isinstance(fast, FastGenerator) and (fast.kv_cache, fast.cuda_graphs) == ("dynamic", False)
    assert isinstance(make_generator("hf"), HFGenerator)
    vllm = engine_class("vllm").from_settings(RolloutConfig(engine="vllm", vllm=VLLMConfig(mode="server")), seed=5)
    assert vllm.settings.mode == "server" and vllm.seed == 5 and vllm.max_model_len is None  # a client: no vLLM


def test_sampling_params_check_every_knob_and_name_an_unknown_one():
    base = dict(group_size=2, max_new_tokens=4, temperature=1.0, eos_token_ids=[1], pad_token_id=0)
    for bad, message in [
        (dict(group_size=0), "group_size must be >= 1"),
        (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-1), "top_k must be >= 0"),
        (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
        (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
        (dict(eos_token_ids=[]), "eos_token_ids must name at least one token"),
    ]:
        with pytest.raises(ValueError, match=message):
            SamplingParams(**{**base, **bad})
    with pytest.raises(TypeError, match=r"unknown sampling parameter\(s\) \['typical_p'\]"):
        SamplingParams.of(**base, typical_p=0.9)
    params = SamplingParams(**base)
    assert params.eos_token_ids == (1,)  # a tuple: the params are frozen and hashable
    assert SamplingParams.of(params, temperature=0.0) == SamplingParams(**{**base, "temperature": 0.0})
    assert SamplingParams.of(params) is params


def test_from_settings_reads_the_sections_knobs_by_name():
    r = RolloutConfig(group_size=3, max_new_tokens=7, temperature=0.6, top_p=0.9, top_k=5, min_p=0.1,
                      repetition_penalty=1.2, ignore_eos=True)  # fmt: skip
    params = SamplingParams.from_settings(r, eos_token_ids=[1], pad_token_id=0, seed=4)
    assert params == SamplingParams(
        group_size=3, max_new_tokens=7, temperature=0.6, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.2,
        ignore_eos=True, eos_token_ids=(1,), pad_token_id=0, seed=4,
    )  # fmt: skip

    class SampleSection:  # grpokit sample's section names the group size n
        n, max_new_tokens, temperature = 5, 3, 1.0

    assert SamplingParams.from_settings(SampleSection(), eos_token_ids=[1], pad_token_id=0).group_size == 5


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_params_and_keywords_give_the_same_rollout(engine):
    model, _ = make_tiny_model("qwen2", seed=0)
    knobs = dict(group_size=2, max_new_tokens=6, temperature=0.9, top_k=20, eos_token_ids=[1], pad_token_id=PAD_ID,
                 seed=3)  # fmt: skip
    gen = make_generator(engine)
    a = gen.generate(model, SAMPLE_PROMPTS, SamplingParams(**knobs))
    b = gen.generate(model, SAMPLE_PROMPTS, **knobs)
    c = gen.generate(model, SAMPLE_PROMPTS, SamplingParams(**{**knobs, "seed": 0}), seed=3)  # keywords win
    for other in (b, c):
        assert torch.equal(a.completion_ids, other.completion_ids) and torch.equal(a.logprobs, other.logprobs)


OLD_PATHS = {
    "grpokit.rollout.generation": ["FastGenerator", "HFGenerator", "Rollout", "left_pad", "rollout_metrics"],
    "grpokit.rollout.decode": ["StaticCacheEngine", "make_engine"],
    "grpokit.rollout.vllm": ["VLLMGenerator", "WeightSyncError", "trainer_weights", "vllm_missing"],
    "grpokit.rollout.vllm_remote": ["ServerEngine", "VLLMServerError"],
    "grpokit.rollout.vllm_server": ["serve", "build_app"],
    "grpokit.rollout.vllm_collective": ["send", "receive"],
}


def test_the_paths_from_before_the_folder_keep_their_public_names_and_name_the_new_place_for_the_rest():
    from grpokit.rollout import engines

    for path, names in OLD_PATHS.items():
        module = importlib.import_module(path)
        for name in names:
            assert getattr(module, name) is not None
    assert importlib.import_module("grpokit.rollout.generation").FastGenerator is FastGenerator
    assert engines.make_generator is make_generator
    with pytest.raises(AttributeError, match=r"'_validate': its code moved to grpokit.rollout.engines"):
        getattr(importlib.import_module("grpokit.rollout.generation"), "_validate")  # noqa: B009


def test_completion_ids_and_texts_of_a_batch_equal_the_row_by_row_ones():
    """Rollout.completion_token_ids copies the batch to lists once and decode is one batch_decode call: the same
    ids and texts as one row at a time (the per-row tensor mask and tokenizer.decode they replaced), on a mask with
    holes (a multi-turn rollout's tool tokens) and EOS (skipped in the text), and on an empty batch."""
    from tiny_model import make_tiny_tokenizer

    from grpokit.rollout.engines.base import Rollout

    tokenizer = make_tiny_tokenizer()
    g = torch.Generator().manual_seed(0)
    N, Lc = 12, 9
    ids = torch.randint(4, 64, (N, Lc), generator=g)
    ids[:, 3] = tokenizer.eos_token_id  # a special token inside the rows: decode skips it
    mask = (torch.rand(N, Lc, generator=g) < 0.7).long()  # holes anywhere, some rows empty
    mask[0] = 0
    rollout = Rollout(
        prompt_ids=torch.zeros(N, 2, dtype=torch.long), prompt_mask=torch.ones(N, 2, dtype=torch.long),
        completion_ids=ids, completion_mask=mask, logprobs=torch.zeros(N, Lc), truncated=torch.zeros(N, dtype=torch.bool),
    )  # fmt: skip
    by_row = [row[keep.bool()].tolist() for row, keep in zip(ids, mask)]
    assert rollout.completion_token_ids() == by_row and by_row[0] == []
    assert any((m[1:] > m[:-1]).any() for m in mask)  # a hole before a kept token: not a prefix
    texts = [tokenizer.decode(r, skip_special_tokens=True) for r in by_row]
    assert rollout.decode(tokenizer) == texts == rollout.decode(tokenizer, by_row)
    assert any(texts) and all(isinstance(t, str) for t in texts)
    empty = rollout.select(torch.tensor([], dtype=torch.long))
    assert empty.completion_token_ids() == [] and empty.decode(tokenizer) == []

"""grpokit train with rollout.engine=vllm: a tiny GRPO run samples on the colocated vLLM engine, the weights
reach it after every step, and the mismatch metrics say the sampler and the trainer agree."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm.sampling_params", reason="vLLM is not installed (tests/engine_vllm run in .venv-vllm, .ci/run)")

from tiny_model import ADDITION_ROWS, SMALL_RUN  # noqa: E402
from vllm_models import vllm_model  # noqa: E402

from grpokit import GRPOTrainer, load_config  # noqa: E402
from grpokit.collect.sampler import Sampler  # noqa: E402
from grpokit.rollout.engines.vllm import VLLMGenerator, WeightSyncError  # noqa: E402
from grpokit.rollout.engines.vllm.weights import trainer_weights, weight_bytes  # noqa: E402

pytestmark = pytest.mark.slow


def spread(prompts, completions, **kw):
    """A reward with spread in every group of the random model: the completion's length."""
    return [float(len(c)) for c in completions]


def trainer(out, *overrides, sampler=Sampler):
    model, tok = vllm_model(seed=0)
    cfg = load_config(
        None,
        [f"train.output_dir={out}", "train.steps=3", *SMALL_RUN, "rollout.engine=vllm", "optim.lr=1e-3", *overrides],
    )
    return GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, reward_functions=[("spread", spread, 1.0)],
        sampler=sampler,
    )  # fmt: skip


def test_a_run_samples_on_vllm_with_the_trainers_weights_at_every_step(tmp_path):
    t = trainer(tmp_path / "run")
    assert isinstance(t.sampler.generator, VLLMGenerator)
    t.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3
    for m in lines:
        assert m["sampler_logprob_diff/max"] < 1e-4  # float32 engine and trainer: the same numbers
        assert 0 <= m["sampler_kl"] < 1e-8
        assert m["mismatch/weight_mean"] == pytest.approx(1.0, abs=1e-4)  # auto: token_truncate on vllm
        assert m["sampling/importance_sampling_ratio/mean"] == m["mismatch/weight_mean"]  # TRL's name beside
        assert m["rollout/weight_lag"] == 0
    assert t.sampler.generator.pushes == 2  # before the rollouts of steps 2 and 3
    every_weight = weight_bytes(trainer_weights(t.model).items())
    assert [m["rollout/push_bytes"] for m in lines] == [0, every_weight, every_weight]  # step 1: the start's weights
    assert lines[0]["rollout/push_s"] == 0 and all(m["rollout/push_s"] > 0 for m in lines[1:])


def test_sync_every_two_samples_one_step_behind_and_says_so(tmp_path):
    t = trainer(tmp_path / "run", "rollout.vllm.sync_every=2", "train.steps=4")
    t.train()
    lags = [json.loads(line)["rollout/weight_lag"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lags == [0, 1, 0, 1]
    assert t.sampler.generator.pushes == 1  # before step 3's rollout


class SkipsSecondPush(Sampler):
    """The sampler of a run whose weight sync silently stops working after the first push."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        gen = self.generator
        real = gen._reload
        gen._reload = lambda llm, weights: real(llm, weights) if gen.pushes < 1 else None


def test_a_run_whose_sync_stops_arriving_is_stopped_by_name(tmp_path):
    t = trainer(tmp_path / "run", sampler=SkipsSecondPush)
    with pytest.raises(WeightSyncError, match="is not the trainer's"):
        t.train()
    steps = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(steps) == 2  # steps 1 and 2 trained; step 3's rollout found the stale engine

"""rollout.max_staleness >= 1 with rollout.engine=vllm (colocated): the vLLM engine lives in the sampler process
(grpokit.collect.async_sampler), the trainer's pushes reach it, and each batch's log-probs are those of the policy
version that sampled it. (Server mode's refusal needs no vLLM: tests/unit/collect/test_async_sampler.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "vllm.sampling_params", reason="vLLM is not installed (tests/engine_vllm run in .venv-vllm, .ci/run)"
)

import torch  # noqa: E402
from tiny_model import ADDITION_ROWS, SMALL_RUN  # noqa: E402
from vllm_models import vllm_model  # noqa: E402

from grpokit import GRPOTrainer, load_config  # noqa: E402
from grpokit.train.update import PolicyUpdate  # noqa: E402


def spread(prompts, completions, **kw):
    """A reward with spread in every group of the random model: the completion's length (sent to the sampler
    process by name)."""
    return [float(len(c)) for c in completions]


class RecordingUpdate(PolicyUpdate):
    """Keeps each update's rollout (the sampler process's batch)."""

    seen: list = []

    def update(self, r, advantages, old_logprobs=None, ref_logprobs=None, **kwargs):
        self.seen.append(r)
        return super().update(r, advantages, old_logprobs, ref_logprobs, **kwargs)


def row_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """(len(completion),) log p(token | everything before) at temperature 1, one unpadded row: the oracle."""
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def weights(model) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@pytest.mark.slow
def test_the_engine_runs_in_the_sampler_process_and_samples_each_batch_with_its_version(tmp_path):
    """K = 1, 3 steps, evaluated before and after: the trainer's own engine never starts (the process's sampled
    every batch, and evaluation decodes with the fast engine: before, it started a second vLLM engine in the
    trainer's process); every batch is at most 1 step old, its log-probs are its version's weights' (float32 engine and oracle), and
    a batch of version >= 1 was sampled, so a push reached the engine in the process."""
    RecordingUpdate.seen = []
    versions = {}

    def keep(step, metrics, trainer):
        versions[step] = weights(trainer.model)

    model, tok = vllm_model(seed=0)
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}", "train.steps=3", *SMALL_RUN, "rollout.engine=vllm",
            "optim.lr=1e-2", "rollout.max_staleness=1", "eval.enabled=true", "train.accuracy_reward=spread",
            "eval.num_samples=1",
        ],
    )  # fmt: skip
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, eval_rows=ADDITION_ROWS[:4],
        reward_functions=[("spread", spread, 1.0)], updater=RecordingUpdate, callbacks=[keep],
    )  # fmt: skip
    versions[0] = weights(trainer.model)
    summary = trainer.train()
    assert "eval_accuracy_before" in summary and "eval_accuracy_after" in summary  # evaluated, twice
    history = trainer.log_history
    assert len(history) == 3 == len(RecordingUpdate.seen)
    assert trainer.sampler.generator.llm is None  # the trainer's engine never started
    assert any(m["async/version"] >= 1 for m in history)
    policy, _ = vllm_model(seed=0)
    for m, r in zip(history, RecordingUpdate.seen):
        version = int(m["async/version"])
        assert 0 <= (m["step"] - 1) - version <= 1
        assert m["rollout/weight_lag"] == 0  # the process's engine took every push before sampling
        policy.load_state_dict(versions[version])
        for i in range(r.completion_ids.shape[0]):
            prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
            completion = r.completion_ids[i][r.completion_mask[i].bool()].tolist()
            with torch.no_grad():
                own = row_logprobs(policy, prompt, completion)
            assert torch.allclose(r.logprobs[i, : len(completion)], own, atol=1e-4), (m["step"], i)

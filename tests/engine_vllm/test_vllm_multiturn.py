"""Multi-turn episodes with a tool on the vLLM engine: every turn goes in as token ids (the prompt and the
episode so far, tool results included) and comes out as token ids, never re-tokenised; the model's tokens
carry the engine's log-probs, which the trainer's recomputation over the whole episode matches."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm.sampling_params", reason="vLLM is not installed (tests/engine_vllm run in .venv-vllm, .ci/run)")

import torch  # noqa: E402
from tiny_model import ADDITION_ROWS, SMALL_RUN  # noqa: E402
from tool_model import TOOLS_TEMPLATE  # noqa: E402
from vllm_models import vllm_model  # noqa: E402

from grpokit import GRPOTrainer, load_config  # noqa: E402

pytestmark = pytest.mark.slow


def spread(prompts, completions, **kw):
    return [float(len(str(c))) for c in completions]


def test_tool_episodes_sample_on_vllm_with_the_trainers_log_probs(tmp_path):
    model, tok = vllm_model(seed=0)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] += 2.0  # turns end after a few tokens
    tok.chat_template = TOOLS_TEMPLATE  # names the tools and shows their results as user turns
    cfg = load_config(
        None,
        [f"train.output_dir={tmp_path / 'run'}", "train.steps=2", *SMALL_RUN, "data.template=chat",
         "rollout.engine=vllm", "rollout.max_new_tokens=8", "rollout.max_turns=3",
         "rollout.tools=[episode_parts:count_digits]", "rollout.tool_parser=episode_parts:digit_parser",
         "optim.lr=1e-3", "train.accuracy_reward=spread"],
    )  # fmt: skip
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, reward_functions=[("spread", spread, 1.0)]
    )
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(m["tools/calls"] for m in lines) > 0  # tool results went back into the episodes
    assert max(m["episode/turns_mean"] for m in lines) > 1
    for m in lines:
        assert m["sampler_logprob_diff/max"] < 1e-4  # the model's tokens: the engine's = the trainer's
    assert trainer.sampler.generator.pushes >= 1  # step 2's episodes ran on step 1's weights

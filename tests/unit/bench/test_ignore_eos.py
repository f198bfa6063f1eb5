"""rollout.ignore_eos (the bench's full-length completions) and the rollout/cuda_graphs metric: public
options the bench uses instead of writing trainer internals."""

from __future__ import annotations

import pytest
import torch
from tiny_model import PAD_ID, SAMPLE_PROMPTS, make_tiny_model

from grpokit.config.schema import load_config
from grpokit.rollout.generation import FastGenerator, HFGenerator
from grpokit.trainers.grpo import GRPOTrainer

# Ids 1..59 of the 64-token vocabulary all count as EOS: a sampled completion ends at its first token
# with probability about 59/64 per step unless EOS is ignored, so the two cases cannot look alike.
MANY_EOS = list(range(1, 60))
MAX_NEW = 7


@pytest.mark.parametrize("generator", [FastGenerator, HFGenerator], ids=["fast", "hf"])
def test_ignore_eos_runs_every_completion_to_max_new_tokens(generator):
    model, _ = make_tiny_model("qwen2", seed=0)
    kw = dict(
        group_size=3,
        max_new_tokens=MAX_NEW,
        temperature=1.0,
        eos_token_ids=MANY_EOS,
        pad_token_id=PAD_ID,
        seed=0,
    )
    normal = generator().generate(model, SAMPLE_PROMPTS, **kw)
    # without it, EOS ends completions early (the check that the test below can fail)
    assert normal.completion_lengths.float().mean() < MAX_NEW / 2
    assert (~normal.truncated).sum() >= 6  # of 12 rows

    out = generator().generate(model, SAMPLE_PROMPTS, **kw, ignore_eos=True)
    N = len(SAMPLE_PROMPTS) * 3
    assert out.completion_ids.shape == (N, MAX_NEW)
    assert out.completion_lengths.tolist() == [MAX_NEW] * N  # every token counts, EOS included
    assert out.truncated.all()  # none is marked as ended by EOS
    # EOS ids were drawn and kept as ordinary tokens, with their log-probs
    assert torch.isin(out.completion_ids, torch.tensor(MANY_EOS)).float().mean() > 0.5
    assert (out.logprobs < 0).all()


def _trainer(tmp_path, *extra):
    model, tok = make_tiny_model("qwen2", seed=0)
    model.generation_config.eos_token_id = MANY_EOS  # read by the trainer as its EOS ids
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path}",
            "train.steps=1",
            "train.samples_every=0",
            "train.tensorboard=false",
            "rollout.group_size=2",
            "rollout.prompts_per_step=2",
            f"rollout.max_new_tokens={MAX_NEW}",
            "data.template=plain",
            "model.device=cpu",
            "eval.enabled=false",
            *extra,
        ],
    )
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)]
    return GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=rows, reward_functions=[("len", _length_reward, 1.0)]
    )


def _length_reward(prompts, completions, completion_ids, **kw):
    return [float(len(ids)) for ids in completion_ids]


def test_trainer_rollout_honours_ignore_eos_and_reports_cuda_graphs(tmp_path):
    m = _trainer(tmp_path / "a").train_step()
    assert m["completion_len/mean"] < MAX_NEW / 2 and m["truncated_frac"] < 0.5
    m = _trainer(tmp_path / "b", "rollout.ignore_eos=true").train_step()
    assert m["completion_len/mean"] == MAX_NEW and m["truncated_frac"] == 1.0
    assert m["reward/len/mean"] == MAX_NEW  # the reward saw the full completions
    assert m["rollout/cuda_graphs"] == 0.0  # CPU: never graphs
    assert m["rollout/static_kv_cache"] in (0.0, 1.0)

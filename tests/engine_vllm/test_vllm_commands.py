"""grpokit sample and evaluation on the vLLM engine: greedy results equal the hf engine's on the same weights
(evaluation after training steps included: the engine gets the trained weights before it evaluates)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm.sampling_params", reason="vLLM is not installed (tests/engine_vllm run in .venv-vllm, .ci/run)")

from tiny_model import ADDITION_ROWS, SMALL_RUN, save_tiny_model  # noqa: E402
from vllm_models import vllm_model  # noqa: E402

from grpokit import GRPOTrainer, load_config  # noqa: E402
from grpokit.cli.main import main  # noqa: E402
from grpokit.rollout.engines.hf import HFGenerator  # noqa: E402
from grpokit.rollout.evaluate import evaluate  # noqa: E402

pytestmark = pytest.mark.slow
REWARDS = "def even_length(prompts, completions, **kw):\n    return [float(len(c) % 2 == 0) for c in completions]\n"


def candidates(out):
    return [json.loads(line) for p in sorted((out / "candidates").iterdir()) for line in p.read_text().splitlines()]


def test_grpokit_sample_on_vllm_gives_the_hf_engines_greedy_completions(tmp_path):
    model = save_tiny_model(
        tmp_path / "model", hidden_size=64, num_heads=2, num_kv_heads=1, max_position_embeddings=512
    )
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rewards.py").write_text(REWARDS)
    args = [
        f"model.name_or_path={model}", f"data.train={tmp_path / 'prompts.jsonl'}", "data.template=plain",
        f"rewards=[{{name: {tmp_path / 'rewards.py'}:even_length}}]", "sample.n=1", "sample.temperature=0",
        "sample.max_new_tokens=6", "keep.drop_truncated=false",
    ]  # fmt: skip
    texts = {}
    for engine in ("vllm", "hf"):
        out = tmp_path / engine
        assert main(["sample", *args, f"sample.engine={engine}", "--output-dir", str(out)]) in (0, 2)
        texts[engine] = [c["completion"] for c in candidates(out)]
    assert len(texts["vllm"]) == 9
    assert texts["vllm"] == texts["hf"]


def spread(prompts, completions, **kw):
    return [float(len(c)) for c in completions]


def test_evaluation_after_training_steps_runs_on_the_trained_weights(tmp_path):
    model, tok = vllm_model(seed=0)
    cfg = load_config(
        None,
        [f"train.output_dir={tmp_path / 'run'}", "train.steps=2", *SMALL_RUN, "rollout.engine=vllm", "optim.lr=1e-2",
         "eval.enabled=true", "eval.num_samples=2", "train.accuracy_reward=spread"],
    )  # fmt: skip
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, eval_rows=ADDITION_ROWS[:6],
        reward_functions=[("spread", spread, 1.0)],
    )  # fmt: skip
    trainer.train()
    examples_vllm, examples_hf = [], []
    on_vllm = trainer.held_out_metrics(examples_vllm)
    on_hf = evaluate(
        trainer.model, tok, ADDITION_ROWS[:6], accuracy_fn=spread, generator=HFGenerator(), data_cfg=cfg.data,
        eos_token_ids=trainer.sampler.eos_ids, num_samples=0, temperature=1.0,
        max_new_tokens=cfg.rollout.max_new_tokens, seed=0, examples=examples_hf,
    )  # fmt: skip
    assert on_vllm["greedy_score"] == on_hf["greedy_score"]
    assert examples_vllm[0]["completion"] == examples_hf[0]["completion"]

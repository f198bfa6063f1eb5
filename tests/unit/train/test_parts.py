"""The training parts alone, without the trainer (tiny real Qwen2, CPU): the policy update built from a Learner
and a resolved preset, with no sampler and no rewards, on a fixed hand-written batch; the Learner stepping a
supervised loss of its own (token cross-entropy over the batch's token count), as an SFT trainer would.
Each gradient is checked against a naive one-row-at-a-time oracle, and against a different micro-batch split."""

import torch
from tiny_model import make_tiny_model
from update_parts import (
    assert_same_gradient,
    fixed_rollout,
    grads_of_one_step,
    make_learner,
    row_logprobs,
)

from grpokit.config.schema import resolve_algo
from grpokit.train.update import PolicyUpdate


def test_policy_update_alone_on_a_fixed_batch_matches_a_naive_oracle():
    """GRPO without KL, one pass: ratio 1, so loss = -mean_i A_i (seq-mean-token-mean) and the gradient is
    that of -(1/N) sum_i A_i (1/|o_i|) sum_t log p_it. A = [1, -0.5, 0.25, 2]: loss -0.6875."""
    r, advantages = fixed_rollout(), torch.tensor([1.0, -0.5, 0.25, 2.0])
    grads = {}
    for micro in (1, 4):  # every row alone, all rows at once: the same gradient
        learner, cfg = make_learner("algo.preset=grpo", "algo.beta=0", f"optim.micro_batch_size={micro}")
        algo = resolve_algo(cfg)
        updater = PolicyUpdate(learner, algo, cfg.optim, temperature=cfg.rollout.temperature, seed=0)
        out = {}
        run = lambda out=out, updater=updater: out.update(metrics=updater.update(r, advantages)[0])  # noqa: E731
        grads[micro] = grads_of_one_step(learner, run)
        assert abs(out["metrics"]["loss"] - -0.6875) < 1e-6
        assert out["metrics"]["micro_batch_size"] == micro
    model, _ = make_tiny_model("qwen2", seed=0)  # the oracle: one row at a time, no padding
    loss = 0.0
    for i in range(4):
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
        completion = r.completion_ids[i][r.completion_mask[i].bool()].tolist()
        loss = (
            loss - advantages[i] * row_logprobs(model, prompt, completion, cfg.rollout.temperature).mean() / 4
        )
    loss.backward()
    assert_same_gradient(grads[1], model)
    assert_same_gradient(grads[4], model)


def test_learner_steps_a_supervised_loss_with_the_batch_token_count_as_normaliser():
    """SFT: loss = sum over every completion token of -log p / the batch's 10 tokens, whatever the split."""
    r = fixed_rollout()
    rows = [
        (
            r.prompt_ids[i][r.prompt_mask[i].bool()].tolist(),
            r.completion_ids[i][r.completion_mask[i].bool()].tolist(),
        )
        for i in range(4)
    ]
    n_tokens = sum(len(c) for _, c in rows)  # 4 + 2 + 3 + 1 = 10

    def token_nll(model, micro):  # (loss_sum, stats): the micro-batch's summed token cross-entropy
        total = sum(-row_logprobs(model, p, c, 1.0).sum() for p, c in micro)
        return total, {"rows": len(micro)}

    grads, norms = {}, {}
    for micro in (1, 3, 4):
        learner, _ = make_learner(f"optim.micro_batch_size={micro}")
        lengths = torch.tensor([len(p) + len(c) for p, c in rows])
        out = {}

        def step(learner=learner, lengths=lengths, out=out):
            split = lambda k: [rows[i : i + k] for i in range(0, len(rows), k)]  # noqa: E731
            out["norm"], out["stats"] = learner.step(lengths, split, token_nll, n_tokens)

        grads[micro] = grads_of_one_step(learner, step)
        norms[micro] = out["norm"]
        assert [s["rows"] for s in out["stats"]] == {1: [1, 1, 1, 1], 3: [3, 1], 4: [4]}[micro]
    model, _ = make_tiny_model("qwen2", seed=0)
    (sum(-row_logprobs(model, p, c, 1.0).sum() for p, c in rows) / n_tokens).backward()
    for micro in grads:
        assert norms[micro] is not None and abs(norms[micro] - norms[4]) < 1e-5 * norms[4]
        assert_same_gradient(grads[micro], model)

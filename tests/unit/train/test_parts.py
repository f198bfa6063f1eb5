"""The training parts alone, without the trainer (tiny real Qwen2, CPU): the policy update built from a Learner
and a resolved preset, with no sampler and no rewards, on a fixed hand-written batch; the Learner stepping a
supervised loss of its own (token cross-entropy over the batch's token count), as an SFT trainer would.
Each gradient is checked against a naive one-row-at-a-time oracle, and against a different micro-batch split."""

import torch
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config, resolve_algo
from grpokit.rollout.generation import Rollout
from grpokit.train.learner import Learner, load_model
from grpokit.train.update import PolicyUpdate

PAD = 0


def fixed_rollout() -> Rollout:
    """4 rows: prompts of 3, 2, 3, 1 tokens (left-padded), completions of 4, 2, 3, 1 tokens (right-padded)."""
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12], [13]]
    completions = [[20, 21, 22, 1], [23, 1], [24, 25, 26], [27]]
    Lp, Lc = 3, 4
    prompt_ids = torch.tensor([[PAD] * (Lp - len(p)) + p for p in prompts])  # (4, 3)
    prompt_mask = torch.tensor([[0] * (Lp - len(p)) + [1] * len(p) for p in prompts])
    completion_ids = torch.tensor([c + [PAD] * (Lc - len(c)) for c in completions])  # (4, 4)
    completion_mask = torch.tensor([[1] * len(c) + [0] * (Lc - len(c)) for c in completions])
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=torch.zeros(4, Lc),
        truncated=torch.tensor([False, False, True, False]),
    )


def row_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """(len(completion),) log p(completion token | everything before), one unpadded row: the oracle."""
    ids = torch.tensor([prompt + completion])  # (1, L)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature  # (Lc, V)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def grads_of_one_step(learner: Learner, run) -> dict[str, torch.Tensor]:
    """The gradient the learner's optimizer is handed in ``run()`` (after clipping; clipping is off here)."""
    seen: dict[str, torch.Tensor] = {}

    def grab(*_):
        if not seen:
            seen.update(
                {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}
            )

    learner.optimizer.register_step_pre_hook(grab)
    run()
    return seen


def assert_same_gradient(got: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Every parameter's gradient within 1e-5 of its largest entry (float32 sums in another order)."""
    for name, p in model.named_parameters():
        scale = float(p.grad.abs().max())
        assert float((got[name] - p.grad).abs().max()) <= 1e-5 * scale + 1e-8, name


def make_learner(*overrides: str) -> tuple[Learner, object]:
    cfg = load_config(None, ["model.device=cpu", "optim.max_grad_norm=0", *overrides])
    model, tok, precision, device = load_model(cfg, *make_tiny_model("qwen2", seed=0))
    return Learner(model, precision, device, cfg.optim, total_steps=10), cfg


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

"""Parts of the update tests: a fixed two-row batch, the naive log-probs of one row, one update step's gradients
and a learner on the tiny Qwen2 (tests/unit/train/test_parts.py, test_packing, test_entropy_bonus_update,
test_mismatch_in_runs, tests/unit/collect/test_async_sampler)."""


import torch
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.rollout.generation import Rollout
from grpokit.train.learner import Learner, load_model

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

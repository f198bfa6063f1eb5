"""A step's rollout batch: the scored samples (``ScoredBatch``), how sampling rounds join, the
metrics computed from them, and the stream of prompts they are drawn from."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch

from grpokit.compat.trl.names import trl_reward_spread
from grpokit.rollout.generation import Rollout
from grpokit.scoring.runner import RewardResult


@dataclass
class ScoredBatch:
    """One step's samples: rows are prompt-major, each group of G rows contiguous."""

    rollout: Rollout
    rows: list[dict]  # (N,) dataset row of each completion's prompt
    texts: list[str]  # (N,) decoded completions
    rewards: torch.Tensor  # (N,) weighted total reward
    per_function: dict[str, list]  # name -> (N,) values (None = not applicable)
    reward_metrics: dict[str, float]
    extra: dict[str, list] = dataclasses.field(default_factory=dict)  # log_extra column -> (N,) values
    step_rewards: list[list[tuple[int, float]]] | None = None  # (N,) [(t_end, score)]: process rewards
    # (N, Lc) the frozen reference's log-probs, when computed where the batch was made (an asynchronous run's
    # sampler process, grpokit.train.reference); None: the update computes them
    ref_logprobs: torch.Tensor | None = None

    @property
    def scored(self) -> torch.Tensor:
        """(N,) bool: False where no reward function gave a value (every one said None, "does not apply",
        or failed): such a completion stays out of its group's statistics and gets advantage 0 (TRL)."""
        return scored_rows(self.per_function, len(self.texts))

    def select_groups(self, groups: list[int], group_size: int) -> ScoredBatch:
        idx = [g * group_size + j for g in groups for j in range(group_size)]
        t = torch.tensor(idx, dtype=torch.long)
        return ScoredBatch(
            rollout=self.rollout.select(t),
            rows=[self.rows[i] for i in idx],
            texts=[self.texts[i] for i in idx],
            rewards=self.rewards[t],
            per_function={k: [v[i] for i in idx] for k, v in self.per_function.items()},
            reward_metrics=self.reward_metrics,
            extra={k: [v[i] for i in idx] for k, v in self.extra.items()},
            step_rewards=None if self.step_rewards is None else [self.step_rewards[i] for i in idx],
        )


    def across_ranks(self, ranks) -> ScoredBatch:
        """The step's batch as one process would see it, for its metrics and the reward-spread check: every
        rank's rows, texts, rewards, per-function values, step rewards and completion lengths, in rank order
        (prompt and token tensors are left out: zeros, the completion mask a prefix of each row's length);
        reward counters add up over ranks, means and stds are recomputed over the rows. ``ranks``:
        grpokit.train.distributed.Distributed (world, gather); alone, this batch itself."""
        if not ranks.active:
            return self
        r = self.rollout
        parts = ranks.gather(
            {
                "rows": self.rows,
                "texts": self.texts,
                "rewards": self.rewards.cpu(),
                "per_function": self.per_function,
                "reward_metrics": self.reward_metrics,
                "lengths": r.completion_mask.sum(1).cpu(),
                "truncated": r.truncated.cpu(),
                "step_rewards": self.step_rewards,
            }
        )
        lengths = torch.cat([p["lengths"] for p in parts])  # (N,)
        N, L = len(lengths), max(1, int(lengths.max()))
        mask = (torch.arange(L)[None, :] < lengths[:, None]).long()  # (N, L): the mask is a prefix
        zeros = torch.zeros(N, 1, dtype=torch.long)
        everyone = ScoredBatch(
            rollout=Rollout(
                prompt_ids=zeros,
                prompt_mask=zeros,
                completion_ids=torch.zeros(N, L, dtype=torch.long),
                completion_mask=mask,
                logprobs=torch.zeros(N, L),
                truncated=torch.cat([p["truncated"] for p in parts]),
            ),
            rows=[row for p in parts for row in p["rows"]],
            texts=[t for p in parts for t in p["texts"]],
            rewards=torch.cat([p["rewards"] for p in parts]),
            per_function={k: [v for p in parts for v in p["per_function"][k]] for k in self.per_function},
            reward_metrics={},
            step_rewards=None if self.step_rewards is None else [s for p in parts for s in p["step_rewards"]],
        )
        everyone.reward_metrics = batch_reward_metrics(everyone, [p["reward_metrics"] for p in parts])
        return everyone


def scored_rows(per_function: dict[str, list], n: int) -> torch.Tensor:
    """(n,) bool: True where at least one reward function gave a value (not None)."""
    per = list(per_function.values())
    return torch.tensor([any(v[i] is not None for v in per) for i in range(n)], dtype=torch.bool)


def concat_batches(batches: list[ScoredBatch], pad_token_id: int) -> ScoredBatch:
    """Stack batches whose prompts/completions may differ in padded length."""
    if len(batches) == 1:
        return batches[0]

    def cat(tensors: list[torch.Tensor], left: bool, value: float) -> torch.Tensor:
        width = max(t.shape[1] for t in tensors)
        out = []
        for t in tensors:
            pad = width - t.shape[1]
            out.append(torch.nn.functional.pad(t, (pad, 0) if left else (0, pad), value=value))
        return torch.cat(out)

    rs = [b.rollout for b in batches]
    rollout = Rollout(
        prompt_ids=cat([r.prompt_ids for r in rs], True, pad_token_id),
        prompt_mask=cat([r.prompt_mask for r in rs], True, 0),
        completion_ids=cat([r.completion_ids for r in rs], False, pad_token_id),
        completion_mask=cat([r.completion_mask for r in rs], False, 0),
        logprobs=cat([r.logprobs for r in rs], False, 0.0),
        truncated=torch.cat([r.truncated for r in rs]),
        context_mask=None
        if all(r.context_mask is None for r in rs)
        else cat([r.attention_mask for r in rs], False, 0),
    )
    names = batches[0].per_function.keys()
    return ScoredBatch(
        rollout=rollout,
        rows=[row for b in batches for row in b.rows],
        texts=[t for b in batches for t in b.texts],
        rewards=torch.cat([b.rewards for b in batches]),
        per_function={k: [v for b in batches for v in b.per_function[k]] for k in names},
        reward_metrics={},  # set by the caller from the kept rows (batch_reward_metrics)
        extra={
            k: [v for b in batches for v in b.extra.get(k, [None] * len(b.texts))]
            for k in dict.fromkeys(k for b in batches for k in b.extra)
        },
        step_rewards=[s for b in batches for s in b.step_rewards] if batches[0].step_rewards else None,
    )


def batch_reward_metrics(batch: ScoredBatch, rounds: list[dict[str, float]]) -> dict[str, float]:
    """reward/<name>/{mean,std,applicable} and reward/total/{mean,std} over the rows that are trained
    on (under dynamic sampling: the kept groups only), std with ddof 0 everywhere; the cost and failure
    counters (seconds, failed, timeouts...) summed over every sampling round ``rounds``, kept or not, and
    what reward functions logged themselves (log_metric) averaged over the rounds."""
    out: dict[str, float] = {}
    logged: dict[str, list[float]] = {}
    for metrics in rounds:
        for key, value in metrics.items():
            if key.endswith(tuple(f"/{c}" for c in RewardResult.COUNTERS)):
                out[key] = out.get(key, 0.0) + value  # counters and costs add up over rounds
            elif not key.endswith(("/mean", "/std", "/applicable")):
                logged.setdefault(key, []).append(value)  # a reward's own log_metric values: averaged
    out.update({key: sum(values) / len(values) for key, values in logged.items()})
    for name, values in batch.per_function.items():
        applicable = torch.tensor([v for v in values if v is not None], dtype=torch.float64)
        if applicable.numel():
            out[f"reward/{name}/mean"] = float(applicable.mean())
            out[f"reward/{name}/std"] = float(applicable.std(correction=0))
        out[f"reward/{name}/applicable"] = applicable.numel() / max(len(values), 1)
    total = batch.rewards.double()  # (N,) unscored rows left out below, as TRL's logged reward
    total = total[scored_rows(batch.per_function, total.shape[0])]
    if total.numel():
        out["reward/total/mean"] = float(total.mean())
        out["reward/total/std"] = float(total.std(correction=0))
    out.update(trl_reward_spread(batch.per_function, total.tolist()))  # TRL's unbiased stds, by TRL's names
    return out


ANSWER_FORMAT_HINT = (
    "math_accuracy reads \\boxed{...}, '#### 42' or 'the answer is 42'; a bare number scores 0"
)
"""Why a verifier may score every completion 0: said by the flat-rewards stop and the evaluation warning."""


def flat_groups(
    rewards: torch.Tensor,
    group_size: int,
    step_rewards: list[list[tuple[int, float]]] | None = None,
    scored: torch.Tensor | None = None,
) -> torch.Tensor:
    """(P,) True for each group of ``rewards`` (N,) (prompt-major, G contiguous) whose rewards all match
    (over its ``scored`` rows, (N,) bool, when given; fewer than two scored rows is flat too):
    its advantages are all 0, so it teaches nothing. With process rewards (``step_rewards``, per completion
    [(t_end, score)]) a group is flat only when every step score of its G completions matches too: equal
    outcomes reached by steps scored differently still get non-zero process advantages."""
    grouped = rewards.view(-1, group_size)  # (P, G)
    ok = torch.ones_like(grouped, dtype=torch.bool) if scored is None else scored.view(-1, group_size)
    high = torch.where(ok, grouped, -torch.inf).max(dim=1).values  # (P,)
    low = torch.where(ok, grouped, torch.inf).min(dim=1).values  # (P,)
    flat = (high == low) | (ok.sum(dim=1) <= 1)  # (P,)
    if step_rewards is not None:
        for g in range(flat.shape[0]):
            scores = {score for steps in step_rewards[g * group_size : (g + 1) * group_size] for _, score in steps}
            flat[g] = flat[g] and len(scores) <= 1
    return flat


def flat_rewards_message(batch: ScoredBatch, prompt_column: str, reward_names: list[str]) -> str:
    """The likely cause of a batch whose groups all have equal rewards, with one sample and its scores."""
    values = batch.rewards
    failed = [
        name for name in reward_names if batch.reward_metrics.get(f"reward/{name}/failed", 0) > 0
    ]
    if failed:
        cause = f"Reward function(s) {failed} failed (see the warnings above) and count as 0."
    elif bool((values == values[0]).all()):
        v = float(values[0])
        cause = f"Every completion scored {v:g}: the rewards are constant. "
        if v <= 0:
            cause += (
                f"Either the verifier cannot read the answers ({ANSWER_FORMAT_HINT}: set a template or "
                "system prompt that asks for that format, or a reward that reads yours), or the prompts "
                "are too hard for this model."
            )
        else:
            cause += "If that is the best score, the prompts are too easy for this model."
    else:
        cause = (
            "Each prompt's completions all score alike, though prompts differ: the reward depends on the "
            "prompt only, or sampling is too narrow (raise rollout.temperature, top_p, top_k)."
        )
    i = 0
    prompt = batch.rows[i][prompt_column]
    scores = ", ".join(f"{k}={v[i]}" for k, v in batch.per_function.items())
    return (
        f"{cause} Sample: prompt {str(prompt)[:200]!r} -> completion {batch.texts[i][:300]!r}, "
        f"scores: {scores}."
    )


class PromptStream:
    """Endless, seeded, reshuffled-each-pass stream of dataset rows; its position is resumable.

    With a ``selection`` (grpokit.rollout.selection.Selection, data.selection) each candidate row is asked
    ``selection.keeps(row, epoch, index)`` and skipped when it says no; the history and the rule travel in
    ``state()``, so a checkpoint resumes them exactly. A whole pass's worth of skips in a row (p^z tiny for
    every row) stops the skipping for the rest of that ``take``: the rows are taken as they come rather than
    scanned for ever."""

    def __init__(self, rows: list, seed: int, shuffle: bool, selection=None):
        self.rows, self.seed, self.shuffle = rows, seed, shuffle
        self.selection = selection
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def take(self, n: int) -> list:
        out = []
        skipped = 0
        while len(out) < n:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation()
            row = self.rows[self._order[self.index]]
            keep = (
                self.selection is None
                or skipped >= len(self.rows)
                or self.selection.keeps(row, self.epoch, self.index)
            )
            if not keep:
                skipped += 1  # skips in a row; past a pass's worth, no more for this take
            elif skipped < len(self.rows):
                skipped = 0
            if keep:
                out.append(row)
            self.index += 1
        return out

    def state(self) -> dict:
        out: dict = {"epoch": self.epoch, "index": self.index}
        if self.selection is not None:
            out["selection"] = self.selection.state()
        return out

    def load_state(self, state: dict) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation()
        if self.selection is not None and "selection" in state:
            self.selection.load_state(state["selection"])


def step_seed(seed: int, step: int, round_: int) -> int:
    """The sampling seed of a step's sampling round (round 0 also orders the update's mini-batches): a pure
    function of (train.seed, step, round), so a resumed run reproduces the same samples."""
    return (seed * 1_000_003 + step * 101 + round_) % 2**31


def length_sorted(index: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``index`` (M,) reordered by ``lengths[index]`` (stable), so that consecutive micro-batches hold
    rows of similar length and each, trimmed to its own longest row, carries little padding. The loss
    uses the whole mini-batch's normaliser, so grouping rows differently never changes the gradient."""
    return index[lengths[index].argsort(stable=True)]


def advantage_abs_mean(advantages: torch.Tensor, completion_mask: torch.Tensor, ranks=None) -> float:
    """mean |A| over the batch's completions, (N,) advantages, or over its generated tokens, (N, L) ones;
    with ``ranks`` (grpokit.train.distributed.Distributed) over every rank's (the sums gathered)."""
    per_token = advantages.dim() == 2
    gen = completion_mask.to(advantages.device).bool() if per_token else None  # (N, L)
    if ranks is None or not ranks.active:
        if per_token:
            return float(advantages[gen].abs().mean()) if gen.any() else 0.0
        return float(advantages.abs().mean())
    if per_token:
        local = (float(advantages[gen].abs().sum()), float(gen.sum()))
    else:
        local = (float(advantages.abs().sum()), float(advantages.numel()))
    parts = ranks.gather(local)
    abs_sum, count = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return float(torch.tensor(abs_sum / max(count, 1.0), dtype=torch.float32))  # float32, as one process


def step_metrics(
    batch: ScoredBatch, advantage_abs: float, update_metrics, sampling, accuracy_name: str | None
) -> dict[str, float]:
    """The step's metrics line: rewards, accuracy and lengths of ``batch`` (under torchrun every rank's:
    ``ScoredBatch.across_ranks``), the advantages' mean |A| (``advantage_abs_mean``), sampling and update.
    With no accuracy reward (``accuracy_name`` None: only format/length rewards) there is no accuracy and
    no length of the correct and incorrect completions."""
    r = batch.rollout
    lengths = r.completion_mask.sum(1).float()  # (N,)
    metrics: dict[str, float] = dict(batch.reward_metrics)
    metrics["completion_len/mean"] = float(lengths.mean())
    metrics["completion_len/min"] = float(lengths.min())
    metrics["completion_len/max"] = float(lengths.max())
    if accuracy_name is not None:
        acc_values = batch.per_function[accuracy_name]
        correct = torch.tensor([v is not None and v >= 1.0 - 1e-6 for v in acc_values])
        metrics["accuracy"] = float(correct.float().mean())
        metrics["completion_len/correct"] = float(lengths[correct].mean()) if correct.any() else float("nan")
        metrics["completion_len/incorrect"] = (
            float(lengths[~correct].mean()) if (~correct).any() else float("nan")
        )
    metrics["truncated_frac"] = float(r.truncated.float().mean())
    ended = lengths[~r.truncated.to(lengths.device)]  # completions that ended (EOS), as TRL's terminated ones
    ended = ended if ended.numel() else lengths.new_zeros(1)  # none ended: 0, as TRL logs it
    metrics["completion_len/ended_mean"] = float(ended.mean())
    metrics["completion_len/ended_min"] = float(ended.min())
    metrics["completion_len/ended_max"] = float(ended.max())
    metrics["tokens/step"] = float(r.prompt_mask.sum() + r.completion_mask.sum())  # TRL's num_tokens adds these up
    metrics["advantage/abs_mean"] = advantage_abs
    metrics.update(sampling)
    metrics.update(update_metrics)
    if "kl_mean" in metrics:
        metrics["kl"] = metrics.pop("kl_mean")
    return metrics

"""Sampling a step's batch: P prompts -> G completions each (the policy's rollout) -> rewards, with DAPO's
dynamic sampling and the check that the batch has any reward spread to learn from.

``SamplingMixin`` holds these GRPOTrainer methods; ``GRPOTrainer.train_step`` drives them."""

from __future__ import annotations

import sys
import time

import torch

from grpokit.batch import (
    ScoredBatch,
    batch_reward_metrics,
    concat_batches,
    flat_groups,
    flat_rewards_message,
)
from grpokit.data import reward_columns
from grpokit.errors import FlatRewardsError, TrainingError
from grpokit.generation import Rollout
from grpokit.rewards import TrainerState, as_completions
from grpokit.rewards.process import step_rewards_of


class SamplingMixin:
    """GRPOTrainer's rollout, scoring and dynamic sampling."""

    def sample_batch(self) -> tuple[ScoredBatch, dict[str, float], dict[str, float]]:
        """P groups of G scored completions. With DAPO's dynamic sampling, groups whose rewards
        all match are dropped and more prompts are sampled until P groups remain."""
        P, G = self.cfg.rollout.prompts_per_step // self.dist.world, self.cfg.rollout.group_size  # per rank
        timing = {"generation": 0.0, "scoring": 0.0}
        kept: list[ScoredBatch] = []
        round_metrics: list[dict[str, float]] = []
        discarded_rewards: list[torch.Tensor] = []
        n_kept, rounds, zero_var_groups, total_groups = 0, 0, 0, 0
        while True:
            row_ids = self.dist.my_share(self.stream.take(P * self.dist.world))  # whole groups per rank
            t = time.perf_counter()
            seed = self.dist.rank_seed(self._seed(rounds))  # torchrun: ranks draw independent samples
            rows = [self.train_rows[i] for i in row_ids]
            if self.episodes is not None:  # multi-turn (grpokit.episodes): episodes, scored whole
                model = self.dist.generation_model(self.model, self.step)
                self.model.eval()
                episodes = self.episodes.rollout(self.generator, model, self.tokenizer, rows, seed=seed, eos_token_ids=self.eos_ids)
            else:
                rollout = self.rollout([self.encoded[i] for i in row_ids], seed=seed)
            timing["generation"] += time.perf_counter() - t
            t = time.perf_counter()
            if self.episodes is not None:
                scored = self.episodes.score(episodes, rows, self.rewards, self.tokenizer, self._trainer_state(), self.step)
            else:
                scored = self.score(rollout, rows)
            timing["scoring"] += time.perf_counter() - t
            round_metrics.append(scored.reward_metrics)
            spread = scored.rewards.view(P, G)
            flat = flat_groups(scored.rewards, G, scored.step_rewards, scored.scored)  # (P,)
            zero_var_groups += int(flat.sum())
            total_groups += P
            if not self.algo.batch.dynamic_sampling:
                kept, n_kept = [scored], P
                break
            useful = [g for g in range(P) if not flat[g]][: P - n_kept]
            discarded_rewards += [spread[g] for g in range(P) if g not in useful]
            if useful:
                kept.append(scored.select_groups(useful, G))
                n_kept += len(useful)
            if self.dist.all_true(n_kept == P):
                break
            rounds += 1
            if rounds > self.algo.batch.max_sampling_rounds:
                raise TrainingError(
                    f"dynamic sampling: after {rounds} sampling rounds only {n_kept} of {P} groups had "
                    "rewards that differ (all others were all-correct or all-wrong). Raise "
                    "algo.max_sampling_rounds, use harder/easier prompts, or set algo.dynamic_sampling=false."
                )
        batch = concat_batches(kept, self.tokenizer.pad_token_id)
        batch.reward_metrics = batch_reward_metrics(batch, round_metrics)
        sampling = {
            "zero_variance_frac": zero_var_groups / total_groups,
            "sampling_rounds": float(rounds + 1),
        }
        if self.algo.batch.dynamic_sampling:
            sampling["dynamic_sampling/discarded_groups"] = float(len(discarded_rewards))
            if discarded_rewards:
                sampling["dynamic_sampling/discarded_reward_mean"] = float(torch.cat(discarded_rewards).mean())
        return batch, timing, sampling

    def _check_reward_spread(self, batch: ScoredBatch) -> None:
        """Warn at the first step in which no group has any reward spread (every advantage is 0, so the
        step teaches nothing) and stop after train.stop_after_flat_steps of them in a row."""
        batch = self.dist.global_view(batch)  # torchrun: every rank's groups, so all ranks decide alike
        best_before = self.best_reward
        self.best_reward = max(self.best_reward, float(batch.rewards.max()))
        if not bool(flat_groups(batch.rewards, self.cfg.rollout.group_size, batch.step_rewards, batch.scored).all()):
            self.flat_steps = 0
            self.had_spread = True
            return
        self.flat_steps += 1
        limit = self.cfg.train.stop_after_flat_steps
        message = flat_rewards_message(batch, self.cfg.data.prompt_column, self.reward_names)
        rewards = batch.rewards
        solved = self.had_spread and bool((rewards == rewards[0]).all()) and float(rewards[0]) >= best_before
        if limit and self.flat_steps >= limit and solved:
            # learnt, not stuck: every completion now earns the best reward the run has seen
            self.stopped_early = (
                f"stopped early at step {self.step + 1}: every completion scored {float(rewards[0]):g}, the "
                f"best reward of the run, for {self.flat_steps} steps in a row: the training prompts are "
                "solved and give no more signal (use harder prompts to go on; "
                "train.stop_after_flat_steps=0 trains on regardless)."
            )
        # PPO's advantages come from its critic and KL too, so they are not 0: but the rewards teach nothing
        no_signal = (
            "the rewards said nothing about the task (PPO's advantages came from its critic and KL alone)"
            if getattr(self, "critic", None) is not None
            else "every advantage was 0 and nothing was learnt"
        )
        if limit and self.flat_steps >= limit and not solved:
            raise FlatRewardsError(
                f"stopped at step {self.step + 1}: no group had any reward spread for {self.flat_steps} "
                f"steps in a row, so {no_signal}. {message} "
                "(train.stop_after_flat_steps=0 trains on regardless.)"
            )
        if self.flat_steps == 1:
            warning = (
                f"WARNING step {self.step + 1}: no group has any reward spread, so {no_signal}. "
                f"{message} "
                + (f"The run stops if this lasts {limit} steps (train.stop_after_flat_steps)." if limit else "")
            )
            self.log.print(warning) if self.log else print(warning, file=sys.stderr)

    def _seed(self, round_: int) -> int:
        # a pure function of (seed, step, round): resuming reproduces the same samples
        return (self.cfg.train.seed * 1_000_003 + self.step * 101 + round_) % 2**31

    @torch.no_grad()
    def rollout(
        self,
        prompt_ids: list[list[int]],
        *,
        seed: int,
        group_size: int | None = None,
        temperature=None,
        max_new_tokens=None,
    ) -> Rollout:
        r = self.cfg.rollout
        self.model.eval()
        out = self.generator.generate(
            self.dist.generation_model(self.model, self.step),
            prompt_ids,
            group_size=group_size or r.group_size,
            max_new_tokens=max_new_tokens or r.max_new_tokens,
            temperature=r.temperature if temperature is None else temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            eos_token_ids=self.eos_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            seed=seed,
            ignore_eos=r.ignore_eos,
        )
        return out

    def _trainer_state(self) -> TrainerState:
        P = self.cfg.rollout.prompts_per_step
        n = max(len(self.train_rows), 1)
        return TrainerState(
            global_step=self.step,
            max_steps=self.cfg.train.steps,
            epoch=self.step * P / n,
            num_train_epochs=self.cfg.train.steps * P / n,
            log_history=list(getattr(self, "log_history", [])),
        )

    def score(self, rollout: Rollout, rows: list[dict]) -> ScoredBatch:
        """Run the reward functions on each completion; the group's prompt row gives the columns."""
        G = rollout.completion_ids.shape[0] // len(rows)
        per_completion_rows = [row for row in rows for _ in range(G)]
        completion_ids = rollout.completion_token_ids()  # (N,) lists, EOS included, no padding
        texts = rollout.decode(self.tokenizer)  # (N,) what the reward functions read
        columns = reward_columns(per_completion_rows, self.cfg.data.prompt_column)
        columns["completion_ids"] = completion_ids
        columns["trainer_state"] = self._trainer_state()
        prompts = [row[self.cfg.data.prompt_column] for row in per_completion_rows]
        completions = as_completions(prompts, texts)  # TRL's shapes: messages for chat prompts, else text
        result = self.rewards(prompts, completions, columns)
        problem = result.failure(self.cfg.train.max_reward_failure_frac, prompts, completions)
        if problem:
            raise TrainingError(
                f"step {self.step + 1}: {problem}\nFix the reward function (or the data it reads). "
                f"train.max_reward_failure_frac={self.cfg.train.max_reward_failure_frac:g} is the share of "
                "a step's completions a function may fail on and still count 0 there."
            )
        return ScoredBatch(
            rollout=rollout,
            rows=per_completion_rows,
            texts=texts,
            rewards=torch.tensor(result.total, dtype=torch.float32),
            per_function=result.per_function,
            reward_metrics=result.metrics(),
            # log_extra columns with one value per completion (others cannot be lined up with rows)
            extra={k: v for k, v in result.extra.items() if len(v) == len(texts)},
            step_rewards=step_rewards_of(
                self.algo, self.rewards.functions, result, self.tokenizer, completion_ids, texts
            ),
        )

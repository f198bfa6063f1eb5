"""The Sampler: a step's batch, P prompts -> G completions each (the policy's rollout) -> rewards, with DAPO's
dynamic sampling, and the check that the batch has any reward spread to learn from.

Owns: the training prompts (rows, their token ids, the seeded ``stream`` over them, which checkpoints
save), the ``generator`` (grpokit.rollout.generation), the reward runner, and the spread check's memory
(``flat_steps``, ``had_spread``, ``best_reward``; checkpoints save it: ``spread_state``). Reads the policy
``model`` to sample from (never trains it) and ``dist`` to split prompts over ranks. Nothing here computes a
gradient.

    sampler = Sampler(cfg, algo, model, tokenizer, train_rows, rewards, reward_names, dist=dist)
    batch, timing, sampling = sampler.sample_batch(step, log_history)  # ScoredBatch, seconds, sampling metrics
    stop = sampler.check_spread(batch.across_ranks(dist), step)        # why to stop early (solved), or None
    rollout = sampler.rollout(prompt_ids, seed=s, step=step)           # the pieces, for other trainers
    batch = sampler.score(rollout, rows, step=step)

``log_history`` (the metrics of the steps logged so far) is what reward functions' trainer_state holds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from grpokit.config.schema import Config, DataConfig
from grpokit.core.errors import FlatRewardsError, RewardFunctionError, TrainingError
from grpokit.core.notices import Notices
from grpokit.data.prompts import reward_columns
from grpokit.data.templates import encode_prompts
from grpokit.model.loading import eos_token_ids
from grpokit.rewards import RewardRunner, TrainerState, as_completions
from grpokit.rewards.process import step_rewards_of
from grpokit.rollout.batch import (
    PromptStream,
    ScoredBatch,
    batch_reward_metrics,
    concat_batches,
    flat_groups,
    flat_rewards_message,
    step_seed,
)
from grpokit.rollout.engines import SamplingParams, make_generator
from grpokit.rollout.engines.stop import StopStrings
from grpokit.rollout.episodes import OVER_RANKS, EpisodeSampler
from grpokit.rollout.generation import Rollout
from grpokit.rollout.selection import selection_for
from grpokit.train.distributed import Distributed


def encode_rows(data: DataConfig, rows: list[dict], tokenizer) -> list[list[int]]:
    """Token ids of each row's prompt under data.template; a prompt over data.max_prompt_tokens is an error
    naming its row (grpokit.data.templates.encode_prompts)."""
    return encode_prompts(
        [row[data.prompt_column] for row in rows],
        tokenizer,
        template=data.template,
        system_prompt=data.system_prompt,
        max_prompt_tokens=data.max_prompt_tokens,
        source=data.train or None,
        chat_template_kwargs=data.chat_template_kwargs,
    )


class Sampler:
    """Rollout, scoring, dynamic sampling and the spread check (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        algo,
        model: torch.nn.Module,
        tokenizer,
        train_rows: list[dict],
        rewards: RewardRunner,
        reward_names: list[str],
        *,
        dist: Distributed | None = None,
        has_critic: bool = False,
        episodes: EpisodeSampler | None = None,
        encoded: list[list[int]] | None = None,
        say: Notices | None = None,
    ):
        self.cfg, self.algo, self.model, self.tokenizer = cfg, algo, model, tokenizer
        self.train_rows, self.rewards, self.reward_names = train_rows, rewards, reward_names
        self.dist = dist or Distributed()
        self.has_critic = has_critic
        self.episodes = episodes  # multi-turn rollouts (grpokit.rollout.episodes), or None
        self.say = say or Notices()
        self.eos_ids = eos_token_ids(tokenizer, model)
        self.stop_strings = StopStrings.of(cfg.rollout.stop, tokenizer)  # rollout.stop, or None
        # the prompts' token ids (given when already encoded, as the trainer does before the model loads)
        self.encoded = encoded if encoded is not None else encode_rows(cfg.data, train_rows, tokenizer)
        # data.selection: the per-prompt history and the skip rule (grpokit.rollout.selection), or None
        selection = selection_for(cfg, len(train_rows), reward_names, self.dist.world)
        self.stream = PromptStream(list(range(len(train_rows))), cfg.train.seed, cfg.data.shuffle, selection)
        self.generator = make_generator(  # rollout.engine (grpokit.rollout.engines)
            cfg.rollout, max_model_len=max_model_len(cfg), seed=cfg.train.seed, say=self.say
        )
        self.flat_steps = 0  # consecutive steps with no reward spread in any group
        self.had_spread, self.best_reward = False, float("-inf")  # for telling "solved" from "stuck"

    def sample_batch(
        self, step: int, log_history: Sequence[dict[str, float]] = ()
    ) -> tuple[ScoredBatch, dict[str, float], dict[str, float]]:
        """(batch, seconds by stage, sampling metrics): P groups of G scored completions (this rank's share)
        for the run's ``step``. With DAPO's dynamic sampling, groups whose rewards all match are dropped and
        more prompts are sampled until P groups remain. The sampling metrics are every rank's."""
        P, G = self.cfg.rollout.prompts_per_step // self.dist.world, self.cfg.rollout.group_size  # per rank
        timing = {"generation": 0.0, "scoring": 0.0}
        kept: list[ScoredBatch] = []
        round_metrics: list[dict[str, float]] = []
        discarded_rewards: list[torch.Tensor] = []
        n_kept, rounds, zero_var_groups, total_groups = 0, 0, 0, 0
        selection = self.stream.selection  # data.selection (grpokit.rollout.selection), or None
        if selection is not None:
            selection.begin_step()
            if notice := selection.dry_notice(step):  # the informative pool ran dry: said once
                self.say(notice)
        refill = self.algo.batch.dynamic_sampling or (selection is not None and selection.refills())
        flat_kept: list[ScoredBatch] = []  # selection: flat groups, trained only when a step cannot refill
        n, flat_trained = P, 0  # prompts this round (selection sizes the refills); flat groups trained
        while True:
            row_ids = self.dist.my_share(self.stream.take(n * self.dist.world))  # whole groups per rank
            t = time.perf_counter()
            # a pure function of (seed, step, round): resuming reproduces the same samples
            seed = self.dist.rank_seed(step_seed(self.cfg.train.seed, step, rounds))  # torchrun: per rank
            rows = [self.train_rows[i] for i in row_ids]
            if self.episodes is not None:  # multi-turn (grpokit.rollout.episodes): episodes, scored whole
                model = self.dist.generation_model(self.model, step)
                self.model.eval()
                episodes = self.episodes.rollout(
                    self.generator, model, self.tokenizer, rows, seed=seed, eos_token_ids=self.eos_ids
                )
            else:
                rollout = self.rollout([self.encoded[i] for i in row_ids], seed=seed, step=step)
            timing["generation"] += time.perf_counter() - t
            t = time.perf_counter()
            if self.episodes is not None:
                state = self._trainer_state(step, log_history)
                scored = self.episodes.score(episodes, rows, self.rewards, self.tokenizer, state, step)
            else:
                scored = self.score(rollout, rows, step=step, log_history=log_history)
            timing["scoring"] += time.perf_counter() - t
            round_metrics.append(scored.reward_metrics)
            spread = scored.rewards.view(n, G)
            flat = flat_groups(scored.rewards, G, scored.step_rewards, scored.scored)  # (n,)
            zero_var_groups += int(flat.sum())
            total_groups += n
            if selection is not None:  # each group's visit into its prompt's history
                selection.observe(row_ids, scored.rewards, flat, scored.per_function, step)
            if not refill:
                kept, n_kept = [scored], P
                break
            useful = [g for g in range(n) if not flat[g]][: P - n_kept]
            discarded_rewards += [spread[g] for g in range(n) if g not in useful]
            if useful:
                kept.append(scored.select_groups(useful, G))
                n_kept += len(useful)
            if selection is not None and flat.any():
                flat_kept.append(scored.select_groups([g for g in range(n) if flat[g]], G))
            if self.dist.all_true(n_kept == P):
                break
            rounds += 1
            if selection is not None:  # GRESO's adaptive batch: sized by the step's flat share so far
                n = selection.round_size(P - n_kept, zero_var_groups, total_groups, cap=P)
                if rounds > selection.settings.max_rounds:  # train on flat groups, said in the metrics
                    filler = concat_batches(flat_kept, self.tokenizer.pad_token_id)
                    kept.append(filler.select_groups(list(range(P - n_kept)), G))
                    flat_trained, rounds = P - n_kept, rounds - 1  # (the round past the bound is not taken)
                    break
            elif rounds > self.algo.batch.max_sampling_rounds:
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
        if selection is not None:  # selection/*, history/*: the share skipped, the rule, the history
            sampling.update(selection.end_step())
            sampling["selection/flat_trained"] = float(flat_trained)
        if self.algo.batch.dynamic_sampling:
            sampling["dynamic_sampling/discarded_groups"] = float(len(discarded_rewards))
            if discarded_rewards:
                sampling["dynamic_sampling/discarded_reward_mean"] = float(
                    torch.cat(discarded_rewards).mean()
                )
        return batch, timing, sampling_over_ranks(sampling, self.dist)

    def check_spread(self, batch: ScoredBatch, step: int) -> str | None:
        """Warn at the first step in which no group has any reward spread (every advantage is 0, so the
        step teaches nothing) and stop after train.stop_after_flat_steps of them in a row: FlatRewardsError
        when stuck, or the reason to stop early (returned) when every completion earns the run's best.
        ``batch``: the step's batch over every rank (``ScoredBatch.across_ranks``), so all ranks decide alike."""
        best_before = self.best_reward
        self.best_reward = max(self.best_reward, float(batch.rewards.max()))
        flat = flat_groups(batch.rewards, self.cfg.rollout.group_size, batch.step_rewards, batch.scored)
        if not bool(flat.all()):
            self.flat_steps = 0
            self.had_spread = True
            return None
        self.flat_steps += 1
        limit = self.cfg.train.stop_after_flat_steps
        message = flat_rewards_message(batch, self.cfg.data.prompt_column, self.reward_names)
        rewards = batch.rewards
        solved = self.had_spread and bool((rewards == rewards[0]).all()) and float(rewards[0]) >= best_before
        stopped_early = None
        if limit and self.flat_steps >= limit and solved:
            # learnt, not stuck: every completion now earns the best reward the run has seen
            stopped_early = (
                f"stopped early at step {step + 1}: every completion scored {float(rewards[0]):g}, the "
                f"best reward of the run, for {self.flat_steps} steps in a row: the training prompts are "
                "solved and give no more signal (use harder prompts to go on; "
                "train.stop_after_flat_steps=0 trains on regardless)."
            )
        # PPO's advantages come from its critic and KL too, so they are not 0: but the rewards teach nothing
        no_signal = (
            "the rewards said nothing about the task (PPO's advantages came from its critic and KL alone)"
            if self.has_critic
            else "every advantage was 0 and nothing was learnt"
        )
        if limit and self.flat_steps >= limit and not solved:
            raise FlatRewardsError(
                f"stopped at step {step + 1}: no group had any reward spread for {self.flat_steps} "
                f"steps in a row, so {no_signal}. {message} "
                "(train.stop_after_flat_steps=0 trains on regardless.)"
            )
        if self.flat_steps == 1:
            warning = (
                f"WARNING step {step + 1}: no group has any reward spread, so {no_signal}. "
                f"{message} "
                + (
                    f"The run stops if this lasts {limit} steps (train.stop_after_flat_steps)."
                    if limit
                    else ""
                )
            )
            self.say(warning)
        return stopped_early

    def spread_state(self) -> dict[str, float | int | bool]:
        """The spread check's memory (a checkpoint's trainer_state.pt["spread"]): flat steps in a row, whether
        any step had spread, the best reward so far."""
        return {"flat_steps": self.flat_steps, "had_spread": self.had_spread, "best_reward": self.best_reward}

    def load_spread_state(self, state: dict | None) -> None:
        """Go on from ``spread_state()`` (None: a checkpoint written before it was kept: as built)."""
        if state is not None:
            self.flat_steps, self.had_spread = int(state["flat_steps"]), bool(state["had_spread"])
            self.best_reward = float(state["best_reward"])

    @torch.no_grad()
    def rollout(
        self,
        prompt_ids: list[list[int]],
        *,
        seed: int,
        step: int = 0,
        group_size: int | None = None,
        temperature=None,
        max_new_tokens=None,
    ) -> Rollout:
        """G completions of each prompt (token ids), sampled from the policy as it is at ``step``."""
        r = self.cfg.rollout
        self.model.eval()
        model = self.dist.generation_model(self.model, step)
        sync = getattr(self.generator, "sync", None)
        if sync is not None:  # an engine holding a copy of the weights (vllm): pushed as rollout.vllm says
            sync(model, step)
        params = SamplingParams.from_settings(  # every rollout.* sampling knob, by its name
            r,
            group_size=group_size or r.group_size,
            max_new_tokens=max_new_tokens or r.max_new_tokens,
            temperature=r.temperature if temperature is None else temperature,
            eos_token_ids=self.eos_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            seed=seed,
            stop_strings=self.stop_strings,  # rollout.stop: each completion cut after the token that ends one
        )
        out = self.generator.generate(model, prompt_ids, params)
        return out

    @torch.no_grad()
    def greedy_reward(
        self, model: torch.nn.Module, generator, row_ids: Sequence[int], *, step: int,
        log_history: Sequence[dict[str, float]] = (), reward: str | None = None,
    ) -> list[float]:  # fmt: skip
        """The reward of ``model``'s greedy completion of each training row ``row_ids``, decoded by ``generator`` (the
        trainer's evaluation engine) as the held-out evaluation decodes: the function named ``reward``'s (a row it
        does not apply to scores 0), or without one the total (the run's weighted sum, as training scores).
        train.adopt_average's comparison (grpokit.train.weight_average.Adoption)."""
        r = self.cfg.rollout
        model.eval()
        params = SamplingParams(
            group_size=1, max_new_tokens=r.max_new_tokens, temperature=0.0, repetition_penalty=r.repetition_penalty,
            eos_token_ids=self.eos_ids, pad_token_id=self.tokenizer.pad_token_id, stop_strings=self.stop_strings,
            seed=self.cfg.train.seed,
        )  # fmt: skip
        out = generator.generate(model, [self.encoded[i] for i in row_ids], params)
        scored = self.score(out, [self.train_rows[i] for i in row_ids], step=step, log_history=log_history)
        if reward is not None:
            return [float(v) if v is not None else 0.0 for v in scored.per_function[reward]]
        return scored.rewards.tolist()

    def episode_metrics(self) -> dict[str, float]:
        """Multi-turn rollouts' metrics since the last call (episode/turns_mean, tools/calls...) over every
        rank (grpokit.rollout.episodes.OVER_RANKS), else {}."""
        if self.episodes is None:
            return {}
        metrics = self.episodes.take_metrics()
        reduced = self.dist.reduce({k: v for k, v in metrics.items() if k in OVER_RANKS}, OVER_RANKS)
        return {**metrics, **reduced}  # the same keys in the same order, the numbers every rank's

    def _trainer_state(self, step: int, log_history: Sequence[dict[str, float]]) -> TrainerState:
        P = self.cfg.rollout.prompts_per_step
        n = max(len(self.train_rows), 1)
        return TrainerState(
            global_step=step,
            max_steps=self.cfg.train.steps,
            epoch=step * P / n,
            num_train_epochs=self.cfg.train.steps * P / n,
            log_history=list(log_history),
        )

    def score(
        self, rollout: Rollout, rows: list[dict], *, step: int = 0, log_history: Sequence[dict[str, float]] = ()
    ) -> ScoredBatch:
        """Run the reward functions on each completion; the group's prompt row gives the columns."""
        G = rollout.completion_ids.shape[0] // len(rows)
        per_completion_rows = [row for row in rows for _ in range(G)]
        completion_ids = rollout.completion_token_ids()  # (N,) lists, EOS included, no padding
        texts = rollout.decode(self.tokenizer, completion_ids)  # (N,) what the reward functions read
        columns = reward_columns(per_completion_rows, self.cfg.data.prompt_column)
        columns["completion_ids"] = completion_ids
        columns["trainer_state"] = self._trainer_state(step, log_history)
        prompts = [row[self.cfg.data.prompt_column] for row in per_completion_rows]
        completions = as_completions(prompts, texts)  # TRL's shapes: messages for chat prompts, else text
        result = self.rewards(prompts, completions, columns)
        problem = result.failure(self.cfg.train.max_reward_failure_frac, prompts, completions)
        if problem:
            raise RewardFunctionError(  # the user's code: exit 3 (grpokit.core.errors)
                f"step {step + 1}: {problem}\nFix the reward function (or the data it reads). "
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


def max_model_len(cfg: Config) -> int:
    """Prompt plus completion tokens a rollout or evaluation of ``cfg`` can hold: what an engine that
    reserves its KV cache by length (vllm) is sized for."""
    r = cfg.rollout
    completion = max(r.max_new_tokens, cfg.eval.max_new_tokens or 0)
    if r.tools or r.environment:  # multi-turn: the whole episode after the prompt
        completion = max(completion, r.max_episode_tokens or r.max_turns * r.max_new_tokens)
    return cfg.data.max_prompt_tokens + completion


def sampling_over_ranks(sampling: dict[str, float], dist: Distributed) -> dict[str, float]:
    """A step's sampling metrics over every rank's share, as one process would report them:
    zero_variance_frac averaged (every rank samples as many groups), discarded groups summed, their mean
    reward weighted by each rank's count; sampling_rounds is the same on every rank (``all_true``)."""
    if not dist.active:
        return sampling
    everyone = dist.gather(sampling)
    merged = dict(sampling)
    merged["zero_variance_frac"] = sum(s["zero_variance_frac"] for s in everyone) / dist.world
    if "dynamic_sampling/discarded_groups" in sampling:
        counts = [s["dynamic_sampling/discarded_groups"] for s in everyone]
        merged["dynamic_sampling/discarded_groups"] = float(sum(counts))
        means = [(s["dynamic_sampling/discarded_reward_mean"], c) for s, c in zip(everyone, counts) if c]
        merged.pop("dynamic_sampling/discarded_reward_mean", None)
        if means:
            merged["dynamic_sampling/discarded_reward_mean"] = sum(m * c for m, c in means) / sum(counts)
    return merged

"""The parts of a GRPO run, built in three steps that each read on one screen, and handed out as they are: the
low-level API a loop of one's own is written with (docs/guides/own-loop.md), and what GRPOTrainer's loop runs.

    parts = build_parts(cfg, model=..., tokenizer=..., train_rows=..., reward_functions=[...])
      1. check_inputs      nothing loaded: the settings, the output folder, data, rewards, the model's config.json,
                           the prompts against its positions, the checkpoint to resume from (open_run first)
      2. load_policy       the model, its tokenizer and precision, the frozen reference and teacher, torchrun's wrap
      3. assemble          the batch source (grpokit.collect), the learner, the update, the critic, the watches;
                           a resume gives each its piece of the checkpoint once all are built

    got = parts.source.next_batch(step)                                   # sample and score
    old, ref, _ = parts.updater.rollout_logprobs(got.batch.rollout, got.batch.ref_logprobs)
    advantages = parts.advantages(got.batch, old, ref)                    # (N,) or (N, Lc)
    plan = parts.updater.prepare(got.batch.rollout, advantages, old, ref, step=step)
    for k in range(len(plan.mini_batches)):
        parts.updater.forward_backward(plan, k); parts.updater.optimizer_step(plan, k)
    parts.learner.scheduler.step(); parts.source.trained(parts.model, step + 1)
    parts.save(step + 1)                                                  # a checkpoint any grpokit run resumes
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from grpokit.collect.factory import SourcePlan, make_source, plan_source
from grpokit.collect.sampler import Sampler, encode_rows
from grpokit.collect.source import BatchSource
from grpokit.compat.trl.api import rewards_from
from grpokit.config.checks import check_vllm_installed
from grpokit.config.epochs import resolve_epochs
from grpokit.config.run_file import given_in_code
from grpokit.config.schema import Config, ConfigError, resolve_algo, validated
from grpokit.core.notices import Notices
from grpokit.data.prompts import check_reward_columns, load_train_eval
from grpokit.model.checkpoint import load_weights_into
from grpokit.model.loading import (
    check_tokenizer_fits,
    frozen_reference,
    load_tokenizer_checked,
    read_model_config,
)
from grpokit.model.precision import Precision
from grpokit.rewards import RewardRunner, resolve_reward, resolve_reward_specs
from grpokit.rewards.process import check_process_setup
from grpokit.rewards.which_accuracy import pick_accuracy_reward
from grpokit.rollout.batch import ScoredBatch
from grpokit.rollout.engines import engine_class
from grpokit.rollout.episodes import EpisodeSampler, environment_rewards, multi_turn, name_callables
from grpokit.run.log import reward_metric_names
from grpokit.run.preflight import check_context, check_positions
from grpokit.run.setup import open_run
from grpokit.run.state import RunState
from grpokit.train.advantages import batch_advantages
from grpokit.train.critic import Critic
from grpokit.train.distributed import Distributed
from grpokit.train.learner import Learner, load_model
from grpokit.train.mismatch import MismatchCorrection, MismatchGuard
from grpokit.train.reference import REFERENCE_DIR
from grpokit.train.teacher import Teacher, check_teacher_engine
from grpokit.train.update import PolicyUpdate
from grpokit.train.weight_average import ADOPTED_DECAY, EMA_DIR, Adoption, WeightAverage


def run_reward_functions(cfg: Config, algo, given: list[tuple[str, Any, float]] | None) -> tuple[list, dict[str, str]]:
    """(name, fn, weight) per reward: the given ones or cfg.rewards', those the environments bring (a verifiers
    rubric's functions: grpokit.rollout.episodes.environment_rewards), the overlong penalty when the preset
    (``algo``, resolved) shapes lengths, named by function in metrics ("my_rewards.py:brevity" logs
    reward/brevity/mean); and {name as given: name in metrics}."""
    functions = given if given is not None else resolve_reward_specs(cfg.rewards)  # problems name rewards[i]
    # the rewards environments bring (a verifiers rubric: each function with its weight)
    functions = [*functions, *environment_rewards(cfg.rollout, [name for name, _, _ in functions])]
    if not functions:  # an environment that was to bring its rewards brought none (a TRL one without get_reward)
        raise ConfigError(
            f"no reward: rollout.environment={cfg.rollout.environment!r} brings none (a TRL environment's get_reward) "
            "and none was given; give reward functions (TRL's reward_funcs) or define get_reward on the environment"
        )
    if algo.batch.overlong_shaping:
        r = cfg.rollout
        budget = r.max_new_tokens
        if multi_turn(r):  # the model's tokens of a whole episode against the episode's budget
            budget = r.max_episode_tokens or r.max_turns * r.max_new_tokens
        shaping = resolve_reward("overlong_penalty", max_len=budget, buffer_len=algo.batch.overlong_buffer)
        functions = [*functions, ("overlong_penalty", shaping, 1.0)]
    given_names = [name for name, _, _ in functions]
    renamed = dict(zip(given_names, reward_metric_names(given_names)))
    return [(renamed[name], fn, weight) for name, fn, weight in functions], renamed


def sampler_rewards(cfg: Config, algo, given: list[tuple[str, Any, float]] | None) -> list[tuple[str, Any, float]]:
    """The run's reward functions again, in an asynchronous run's sampler process (grpokit.collect.async_sampler):
    ``given`` (functions given in code, which reach it by name) or cfg.rewards resolved there, as in the trainer."""
    return run_reward_functions(cfg, algo, given)[0]


# ----------------------------------------------------------------------------- 1. checked before anything loads


@dataclass
class RunInputs:
    """What step 1 found, with nothing loaded: the rows, the reward functions and which one is the accuracy, the
    prompts' token ids, the multi-turn episodes' settings and how the batches will be made."""

    train_rows: list[dict]
    eval_rows: list[dict]  # [] without an accuracy reward: no evaluation
    reward_functions: list[tuple[str, Any, float]]  # (name in metrics, fn, weight)
    rewards: RewardRunner
    accuracy_name: str | None  # the reward whose 1 means correct, None: only format/length rewards
    accuracy_why: str
    accuracy_fn: Any
    episodes: EpisodeSampler | None  # multi-turn rollouts (rollout.tools / rollout.environment)
    encoded: list[list[int]]  # the training prompts' token ids
    plan: SourcePlan  # how the batches are made (grpokit.collect.factory)

    @property
    def reward_names(self) -> list[str]:
        return [name for name, _, _ in self.reward_functions]

    @property
    def reward_weights(self) -> dict[str, float]:
        return {name: float(weight) for name, _, weight in self.reward_functions}  # GDPO's weights


def check_inputs(
    cfg: Config, algo, run: RunState, *, model, tokenizer, train_rows, eval_rows, given_rewards,
    resume: bool | str | Path = False, allow_changed_config: bool = False,
) -> RunInputs:  # fmt: skip
    """Step 1 after ``open_run``: data and rewards (a bad reward fails in a second), then the model's config.json
    and tokenizer against the prompts and the checkpoint to resume from, all before any weight loads."""
    train_rows, eval_rows = load_train_eval(cfg.data, train_rows, eval_rows)
    resolve_epochs(cfg, len(train_rows), cfg.rollout.prompts_per_step)  # TRL's epochs: passes over the prompts
    functions, renamed = run_reward_functions(cfg, algo, given_rewards)
    check_reward_columns(train_rows, functions, cfg.data.train or "train_rows")  # e.g. the answers
    # grpo_process needs a reward that scores steps (or an environment's per-turn rewards)
    check_process_setup(algo, functions, turn_rewards=bool(cfg.rollout.environment))
    check_teacher_engine(cfg, algo.uses_teacher)  # a colocated vLLM teacher needs vLLM here
    # multi-turn rollouts (rollout.tools / rollout.environment): bad tools fail before the model loads
    episodes = EpisodeSampler(cfg, functions, algo) if multi_turn(cfg.rollout) else None
    rewards = RewardRunner(functions, timeout_s=cfg.train.reward_timeout_s)
    plan = plan_source(cfg, rewards, partial(sampler_rewards, cfg, algo, given_rewards))
    shaped = [n for n, _, _ in functions if n != "overlong_penalty" or not algo.batch.overlong_shaping]
    accuracy_name, accuracy_why = pick_accuracy_reward(shaped, cfg.train.accuracy_reward, renamed)
    accuracy_fn = dict((n, f) for n, f, _ in functions).get(accuracy_name)  # None: no evaluation
    if accuracy_fn is None:
        eval_rows = []
    if eval_rows and cfg.eval.enabled:  # held-out rows are scored by the accuracy reward
        check_reward_columns(eval_rows, [(accuracy_name, accuracy_fn, 1.0)], cfg.data.eval or "eval_rows")
    held_out = eval_rows if cfg.eval.enabled else []
    encoded = check_prompts_fit(cfg, train_rows, held_out, model, tokenizer)
    run.pick_checkpoint(resume, allow_changed_config)
    return RunInputs(
        train_rows, eval_rows, functions, rewards, accuracy_name, accuracy_why, accuracy_fn, episodes, encoded, plan
    )


def check_prompts_fit(cfg: Config, train_rows: list[dict], held_out: list[dict], model, tokenizer) -> list[list[int]]:
    """The training prompts' token ids, each checked against data.max_prompt_tokens, and every prompt plus its
    completion against the model's positions (its config.json: the given model's, or read without loading it)."""
    if model is None:
        model_config, source = read_model_config(cfg.model), cfg.model.name_or_path
        tokenizer = load_tokenizer_checked(cfg.model)
    else:
        given_config = getattr(model, "config", None)
        model_config, source = (given_config.to_dict() if given_config else None), "the given model"
    check_positions(cfg, model_config, source)
    encoded = encode_rows(cfg.data, train_rows, tokenizer)  # a prompt too long fails here
    eval_lengths = [len(ids) for ids in encode_rows(cfg.data, held_out, tokenizer)] if held_out else []
    check_context(cfg, [len(ids) for ids in encoded], eval_lengths, model_config, source)
    return encoded


# ----------------------------------------------------------------------------- 2. the policy loaded


@dataclass
class Policy:
    """Step 2's result: the model being trained and what is loaded beside it."""

    model: torch.nn.Module
    tokenizer: Any
    precision: Precision
    device: torch.device
    ref_model: torch.nn.Module | None  # the frozen reference (None: no KL, or LoRA's base with the adapter off)
    teacher: Teacher | None  # on-policy distillation's teacher
    average: WeightAverage | None = None  # train.ema_decay / adopt_average: the average of the policy's weights
    adoption: Adoption | None = None  # train.adopt_average: when the policy takes the average's weights, or None


def load_policy(
    cfg: Config, algo, inputs: RunInputs, run: RunState, dist: Distributed, model, tokenizer, *, resume=False
) -> Policy:
    """The model (given, or loaded as cfg.model says: precision, LoRA), its tokenizer checked against it, the
    reference for a KL in the loss or in the reward, the teacher, all wrapped for torchrun (FSDP2 / DDP)."""
    model, tokenizer, precision, device = load_model(cfg, model, tokenizer)
    run.check_resumable(model, auto=resume is True)  # weights of another architecture: skipped
    check_tokenizer_fits(model, tokenizer, "the tokenizer")
    # a reference for a KL in the loss or in the reward (with LoRA: the base, adapter disabled)
    ref_model = frozen_reference(model, cfg.lora.enabled) if algo.uses_reference else None
    if ref_model is not None and algo.kl.ref_sync_every and run.resume_from is not None:
        moved = Path(run.resume_from) / REFERENCE_DIR  # algo.ref_sync_every: the reference as the run had moved it
        if moved.is_dir():  # (a checkpoint of the run before the sync was set holds none: it never moved)
            load_weights_into(ref_model, moved)
    # on-policy distillation (algo.teacher_kl_coef > 0): a frozen teacher scores the student's tokens
    teacher = Teacher.build(cfg, algo, tokenizer, device, precision)
    average, adopting = None, adoption_on(cfg, inputs, dist, device)
    if cfg.train.ema_decay or adopting:  # the policy's weights averaged (taken back from the checkpoint on resume)
        if dist.active and dist.strategy == "fsdp":
            raise ConfigError(
                f"train.ema_decay={cfg.train.ema_decay:g} under train.distributed=fsdp: the average would be a whole "
                "copy of the weights on every rank; use train.distributed=ddp, or train.ema_decay=0."
            )
        average = WeightAverage.build(model, cfg.train.ema_decay or ADOPTED_DECAY, run.resume_from)
    adoption = Adoption.build(cfg.train, len(inputs.train_rows), cfg.train.seed) if adopting else None
    dist.wrap(model, ref_model, run.resume_from)  # torchrun: FSDP2 / DDP
    if inputs.episodes is not None:
        inputs.episodes.check_tokenizer(tokenizer)  # a template that cannot render tools or turns
    return Policy(model, tokenizer, precision, device, ref_model, teacher, average, adoption)


def adoption_on(cfg: Config, inputs: RunInputs, dist: Distributed, device: torch.device) -> bool:
    """train.adopt_average resolved (grpokit.train.weight_average.Adoption). true where it cannot work is refused by
    name; auto is on for a run on the CPU, on one process, single-turn, synchronous, without LoRA, optimizer offload
    or an engine holding its own weights (vLLM), where it was measured."""
    cannot = [why for applies, why in (
        (inputs.episodes is not None, "multi-turn episodes (rollout.tools / rollout.environment): the comparison "
                                      "decodes single completions"),
        (inputs.plan.off_policy, "an asynchronous run (rollout.max_staleness > 0): its rewards are scored in the "
                                 "sampler process"),
        (cfg.optim.offload_optimizer, "optim.offload_optimizer: the optimizer's own copy of the weights would "
                                      "overwrite the average's"),
        (dist.active and dist.strategy == "fsdp", "train.distributed=fsdp: the average would be a whole copy of the "
                                                  "weights on every rank"),
    ) if applies]  # fmt: skip
    setting = cfg.train.adopt_average
    if setting is True and cannot:
        raise ConfigError(f"train.adopt_average=true does not work with {cannot[0]}; set train.adopt_average=false")
    if setting != "auto":
        return bool(setting)
    return not cannot and device.type == "cpu" and not dist.active and not cfg.lora.enabled and not (
        engine_class(cfg.rollout.engine).holds_weights
    )


# ----------------------------------------------------------------------------- 3. the parts assembled


@dataclass
class GRPOParts:
    """A GRPO run's parts, each owning its state (the module docstring shows a step made of them). ``step``: the
    steps the policy has taken (a resumed run's from its checkpoint)."""

    cfg: Config
    algo: Any  # the resolved algorithm (grpokit.algos.AlgoSettings)
    dist: Distributed
    run: RunState  # the output folder, checkpoints, resume
    say: Notices  # the parts' messages
    inputs: RunInputs
    policy: Policy
    source: BatchSource  # how a step gets its batch (grpokit.collect)
    learner: Learner  # the policy's precision, optimizer, schedule, micro-batching
    updater: PolicyUpdate
    critic: Critic | None  # PPO's value model, or None
    mismatch: MismatchGuard  # the sampler/trainer KL watch
    step: int = 0
    restored: dict[str, Any] = field(default_factory=dict)  # the checkpoint's state a resume gave the parts

    @property
    def model(self) -> torch.nn.Module:
        """The policy being trained (under torchrun: this rank's FSDP shards, or its DDP replica)."""
        return self.learner.model

    @property
    def sampler(self) -> Sampler:
        return self.source.sampler

    def advantages(
        self, batch: ScoredBatch, old_logprobs, ref_logprobs, values=None, teacher_logprobs=None
    ) -> torch.Tensor:
        """(N,) or (N, Lc) advantages of ``batch`` by the algorithm's estimator (grpokit.train.advantages): the
        log-probs before the update, PPO's values, the teacher's log-probs of on-policy distillation."""
        return batch_advantages(
            batch, self.algo, self.cfg.rollout.group_size, old_logprobs, ref_logprobs, values,
            device=self.learner.device, dist=self.dist, reward_weights=self.inputs.reward_weights,
            teacher_logprobs=teacher_logprobs,
        )  # fmt: skip

    def state(self) -> dict[str, Any]:
        """Every part's own state, by its trainer_state.pt key; ``restore`` gives each its piece back (the two are
        the one path a checkpoint's state takes). The learner's (weights, optimizer wherever it lives,
        schedule, loss scale), the step, the clock and the RNG states are RunState.save's.

            stream, spread   the prompts' position, the spread check's memory (the batch source's; an
                             asynchronous one adds ``async``: its last push and batches in flight, every rank's)
            critic           PPO's critic's optimizer, schedule and scaler (its weights: the critic/ folder)
            entropy_control  the entropy bonus's adaptive coefficient
            mismatch         the sampler/trainer KL watch's run of steps above its limit"""
        return {
            **self.source.state(self.step),
            "critic": self.critic.state() if self.critic else None,
            "entropy_control": self.updater.entropy_state(),
            "mismatch": self.mismatch.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Every part takes its own piece of a checkpoint's trainer_state.pt (``state``; RunState's
        ``load_resume_state`` has checked the world size and restored the RNG and the clock), once every part
        is built, so that nothing built after it replaces what it restored. A piece a checkpoint of an
        older grpokit lacks leaves its part as built."""
        # the weights (under torchrun loaded before sharding, dist.wrap), optimizer (its offloaded copies synced)
        self.learner.load_state(state, weights_from=None if self.dist.active else self.run.resume_from)
        if self.critic is not None:
            self.critic.load(state, self.run.resume_from)  # PPO's critic/ folder and optimizer
        self.step = state["step"]
        said = self.source.load_state(state, self.model, self.step)
        self.updater.load_entropy_state(state.get("entropy_control"))  # the entropy bonus's adaptive coefficient
        self.mismatch.load_state(state.get("mismatch"))
        self.restored = state
        if said:
            self.say(said)

    def save(self) -> Path:
        """Checkpoint this step (grpokit.run.state): the policy, its optimizer and schedule, every part's own state
        (``state``); PPO's critic in its folder."""
        subfolders = self.critic.folders() if self.critic else {}
        if self.algo.kl.ref_sync_every and self.policy.ref_model is not None:  # the moved reference
            subfolders[REFERENCE_DIR] = self.policy.ref_model
        if self.policy.average is not None:  # train.ema_decay: the averaged weights
            subfolders[EMA_DIR] = self.policy.average.model
        return self.run.save(self.step, self.learner, self.policy.tokenizer, self.state(), subfolders)


def assemble(
    cfg: Config, algo, inputs: RunInputs, policy: Policy, run: RunState, dist: Distributed, say: Notices, *,
    sampler: type[Sampler] = Sampler, updater: type[PolicyUpdate] = PolicyUpdate, critic: type[Critic] = Critic,
) -> GRPOParts:  # fmt: skip
    """Step 3: the parts around the loaded policy. ``sampler``, ``updater``, ``critic``: the classes they are
    built from (a subclass swaps a stage, as tests do to see what a stage was given)."""
    plan = inputs.plan
    made = sampler(
        cfg, algo, policy.model, policy.tokenizer, inputs.train_rows, inputs.rewards, inputs.reward_names,
        dist=dist, has_critic=algo.uses_critic, episodes=inputs.episodes, encoded=inputs.encoded, say=say,
    )  # fmt: skip
    learner = Learner(
        policy.model, policy.precision, policy.device, cfg.optim, dist, total_steps=cfg.train.steps, say=say,
        make_room=made.generator.release,  # an OOM in the update first frees the KV cache
    )  # fmt: skip
    update = updater(
        learner, algo, cfg.optim, temperature=cfg.rollout.temperature, seed=cfg.train.seed, dist=dist,
        ref_model=policy.ref_model,
        correction=MismatchCorrection.from_settings(cfg.rollout, plan.max_age),  # rollout.mismatch_correction
        # rollout.async_ratio=behaviour: the ratio's denominator is the sampler's log-probs (stale samples' own)
        behaviour_ratio=plan.off_policy and cfg.rollout.async_ratio == "behaviour",
    )  # fmt: skip
    mismatch = MismatchGuard(cfg.rollout.max_sampler_kl, say, plan.max_age)  # rollout.max_sampler_kl
    value_model = critic.build(learner, cfg, algo, dist) if algo.uses_critic else None
    source = make_source(
        plan, cfg, algo, made, dist, learner.model, ref_model=policy.ref_model, precision=policy.precision,
        device=policy.device,
    )  # fmt: skip
    return GRPOParts(cfg, algo, dist, run, say, inputs, policy, source, learner, update, value_model, mismatch)


def build_parts(
    cfg: Config,
    *,
    model=None,
    tokenizer=None,
    train_rows: list[dict] | None = None,
    eval_rows: list[dict] | None = None,
    reward_functions: list[tuple[str, Any, float]] | None = None,
    resume: bool | str | Path = False,
    overwrite: bool = False,
    allow_changed_config: bool = False,
    say: Notices | None = None,
    sampler: type[Sampler] = Sampler,
    updater: type[PolicyUpdate] = PolicyUpdate,
    critic: type[Critic] = Critic,
) -> GRPOParts:
    """A GRPO run's parts from ``cfg`` and what is given in code (GRPOTrainer's arguments of the same names, in
    grpokit's forms: ``reward_functions`` as names, functions or (name, fn[, weight])), in the three steps of the module docstring; with ``resume``, each part restored from the
    checkpoint. Nothing is written to the output folder."""
    say = say if say is not None else Notices()
    reward_functions = rewards_from(reward_functions)  # names, functions or (name, fn[, weight]): (name, fn, weight)
    name_callables(cfg.rollout)  # rollout.tools given as functions (TRL's way) are kept by name
    validated(cfg)  # the CLI's checks, for a Config built in code too
    check_vllm_installed(cfg.rollout.engine, "rollout.engine", cfg.rollout.vllm.mode)  # not after the load
    algo = resolve_algo(cfg)
    if cfg.rollout.temperature <= 0:
        raise ConfigError("rollout.temperature must be > 0 for training (log-probs are taken at it)")
    recorded = given_in_code(  # for config.yaml: what the run was given in code (placeholders given again)
        cfg, model=model, tokenizer=tokenizer, train_rows=train_rows, eval_rows=eval_rows,
        reward_functions=reward_functions,
    )  # fmt: skip
    dist, run = open_run(cfg, resume=resume, overwrite=overwrite, resolved_algo=algo, given=recorded)
    inputs = check_inputs(
        cfg, algo, run, model=model, tokenizer=tokenizer, train_rows=train_rows, eval_rows=eval_rows,
        given_rewards=reward_functions, resume=resume, allow_changed_config=allow_changed_config,
    )  # fmt: skip
    policy = load_policy(cfg, algo, inputs, run, dist, model, tokenizer, resume=resume)
    parts = assemble(cfg, algo, inputs, policy, run, dist, say, sampler=sampler, updater=updater, critic=critic)
    if run.resume_from is not None:  # every part built: each takes its piece of the checkpoint
        parts.restore(run.load_resume_state())
    return parts

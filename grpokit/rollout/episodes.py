"""Multi-turn sampling for the trainer: when ``rollout.tools`` or ``rollout.environment`` is set, a step's
rollout is a batch of episodes (grpokit.rollout.multiturn) instead of single completions, scored whole.
(Over 500 lines: EpisodeSampler, the trainer's side of multi-turn rollouts, with the environment kinds it
loads, grpokit's, verifiers' and OpenEnv's, and the rewards they bring.)

    rollout:
      tools: [python, my_tools.py:multiply]    # and/or environment: my_env.py:Env (grpokit.rollout.envs protocol;
                                               # its class's `tools` are offered too), verifiers:ID, openenv:URL,
                                               # or {name: environment, ...}: each row's named by a column
      max_turns: 4                             # model turns per episode
      max_new_tokens: 128                      # per model turn
      max_episode_tokens: 0                    # everything after the prompt, tool tokens too (0: max_turns x max_new_tokens)
      episode_timeout_s: 60                    # an episode's tool calls / environment steps in all
      step_timeout_s: 300                      # a rollout's waiting on tools and environments in all
      env_timeout_s: 60                        # one reset or step of rollout.environment, in its own worker

What changes for the rest of the trainer: nothing but the Rollout it gets, whose ``completion_mask`` holds
the model's own tokens only (loss, KL, entropy, advantages, metrics) and ``context_mask`` every token
attended to. Group advantages are over whole episodes (one reward per episode); with ``grpo_process``
each turn the environment rewards is a step (grpokit.rollout.multiturn.episode_step_rewards), plus the reward
functions' total at the last model token.

An environment per row (TRL takes one environment per run; prime-rl's EnvGroup, SkyRL's env_class and verl's
agent_name take one per example): with ``rollout.environment`` a mapping {name: environment}, the column
``rollout.environment_column`` names each row's; each environment has its own workers, tools and chat
rendering of them, and the step's metrics say per environment how its episodes went (env/NAME/...). Every
active episode of every environment generates in the same batched call.

An environment may bring rewards of its own (a verifiers environment's rubric): its factory's ``rewards``,
[(name, weight)], are added to the run's reward functions (:func:`environment_rewards`), each reading its score
from the column ``env_scores`` (what the episode's ``finish()`` gave, grpokit.rollout.envs).

Reward functions get TRL's message-list convention: ``prompts[i]`` the first messages, ``completions[i]``
every message after them (assistant turns, tool results, environment replies), and the columns
``turn_rewards`` (per episode, per model turn: the environment's reward or None) and ``completion_ids``
(the model's own token ids), and ``env_scores`` (per episode: its environment's finish() scores, or None).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpokit.core.errors import ConfigError, EnvironmentFailedError, RewardFunctionError, TrainingError
from grpokit.core.user_code import describe, load_module, name_of
from grpokit.data.prompts import reward_columns
from grpokit.rewards.process import is_process_reward, reads_step_rewards
from grpokit.rollout.batch import ScoredBatch
from grpokit.rollout.engines.base import kept_ids
from grpokit.rollout.envs import (
    Environment,
    EnvironmentWithTools,
    EnvPool,
    EpisodeTools,
    ToolEnvironment,
)
from grpokit.rollout.multiturn import ChatDelta, EpisodeBatch, episode_step_rewards, run_episodes
from grpokit.rollout.tools import Tool, ToolDefinitionError, ToolRunner, get_parser, load_tools
from grpokit.rollout.tools.runner import stop_workers

SUMMED = (
    "tools/calls",
    "tools/errors",
    "tools/timeouts",
    "episodes/over_budget",
    "episodes/worker_lost",
    "episodes/failed",
    "time/turn_generation",
    "time/tools",
)
"""Episode metrics that add up over a step's sampling rounds; the others are averaged."""
OVER_RANKS = {
    "episode/turns_mean": "mean",  # per-episode means: every rank has as many episodes
    "episode/turns_max": "max",
    "episode/truncated_frac": "mean",
    "tools/calls_per_episode": "mean",
    "tools/calls": "sum",
    "tools/errors": "sum",
    "tools/timeouts": "sum",
    "episodes/over_budget": "sum",
    "episodes/worker_lost": "sum",
    "episodes/failed": "sum",
    "time/turn_generation": "max",  # the step waits for the slowest rank
    "time/tools": "max",
}
"""How each episode metric adds up over torchrun's ranks (grpokit.train.distributed.Distributed.reduce);
masked_token_frac stays each rank's own."""


def multi_turn(rollout_cfg) -> bool:
    """Whether the config asks for multi-turn rollouts (tools or an environment)."""
    return bool(rollout_cfg.tools or rollout_cfg.environment)


ENVIRONMENT_KINDS: dict[str, str] = {
    "verifiers": "grpokit.integrations.verifiers:environment_factory",
    "openenv": "grpokit.integrations.openenv:environment_factory",
    "trl": "grpokit.integrations.trl_environment:environment_factory",
}
"""Environments of other ecosystems, named 'KIND:target' in rollout.environment: KIND's loader, a
'module:function' that takes (target, the whole name, the rollout settings) and returns a factory of this
protocol. The adapters sit in the layer above (grpokit.integrations), so they are named here, as entry points
are, and imported only when a run names such an environment."""


def load_environment(spec: str, rollout_cfg=None) -> Callable[[], Environment]:
    """The factory named 'module:attr' or 'file.py:attr' (a class or a function with no arguments), or an
    environment of another ecosystem, 'KIND:target' (ENVIRONMENT_KINDS: verifiers:ID, openenv:URL), whose
    loader reads what it needs of ``rollout_cfg`` (rollout.*: verifiers' tool calls are read with
    rollout.tool_parser)."""
    kind, sep, target = spec.partition(":")
    if sep and kind in ENVIRONMENT_KINDS:
        module, _, loader = ENVIRONMENT_KINDS[kind].partition(":")
        try:
            load = getattr(importlib.import_module(module), loader)
        except ImportError as e:
            raise ConfigError(
                f"rollout.environment={spec!r} needs the package of {kind} environments ({e}); "
                f"pip install 'grpokit[{kind}]'"
            ) from e
        return load(target, spec, rollout_cfg)
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigError(
            f"rollout.environment={spec!r}: name a factory as 'package.module:Env' or 'file.py:Env', or "
            f"another ecosystem's environment as {' or '.join(k + ':...' for k in ENVIRONMENT_KINDS)}"
        )
    module = load_module(target, attr, f"rollout.environment={spec!r}", prefix="grpokit_user_env")
    try:
        factory = getattr(module, attr)
    except AttributeError as e:
        raise ConfigError(f"rollout.environment={spec!r}: loading it failed: {describe(e)}") from e
    if not callable(factory):
        raise ConfigError(
            f"rollout.environment={spec!r} is a {type(factory).__name__}, not a class or function"
        )
    return factory


def environment_specs(environment: str | dict | None) -> dict[str, str]:
    """{name: spec} of rollout.environment: one environment is named by its spec; a mapping's keys are the
    names its rows give. ConfigError for an empty mapping or a spec that is not a string."""
    if not environment:
        if isinstance(environment, dict):
            raise ConfigError("rollout.environment is an empty mapping; give {name: environment, ...}")
        return {}
    specs = environment if isinstance(environment, dict) else {environment: environment}
    for name, spec in specs.items():
        if not isinstance(name, str) or not isinstance(spec, str) or not spec:
            raise ConfigError(
                f"rollout.environment: {name!r}: {spec!r} is not 'name: environment' (two strings), e.g. "
                "{countdown: my_env.py:Countdown}"
            )
    return dict(specs)


def environment_tools(factory: Callable[[], Environment], spec: str, taken: set[str]) -> list[Tool]:
    """The tools an environment offers: its factory's ``tools`` attribute (a list of functions or names, as
    rollout.tools), loaded and checked as rollout.tools are (ToolDefinitionError naming the environment);
    none when it has no such attribute. A name in ``taken`` (rollout.tools') is refused."""
    offered = getattr(factory, "tools", None)
    if offered is None:
        return []
    where = f"rollout.environment={spec}: its tools"
    if isinstance(offered, (str, bytes)) or not isinstance(offered, (list, tuple)):
        raise ToolDefinitionError(
            f"{where} attribute is a {type(offered).__name__}; give a list of functions or names (as rollout.tools)"
        )
    tools = load_tools(list(offered), where)
    both = sorted(taken & {t.name for t in tools})
    if both:
        raise ToolDefinitionError(
            f"{where} and rollout.tools both have a tool named {both[0]!r}; tool names must be unique"
        )
    return tools


def shared_tool_names(factory: Callable[[], Environment], spec: str, tools: list[Tool]) -> set[str]:
    """The names in the factory's ``shared_tools`` attribute (tools whose state every episode shares: they
    run on the run's tool workers), each one of its ``tools``; ToolDefinitionError otherwise."""
    shared = getattr(factory, "shared_tools", None)
    if shared is None:
        return set()
    where = f"rollout.environment={spec}: its shared_tools"
    if isinstance(shared, (str, bytes)) or not isinstance(shared, (list, tuple, set, frozenset)):
        raise ToolDefinitionError(f"{where} attribute is a {type(shared).__name__}; give a list of tool names")
    names = {t.name for t in tools}
    for name in shared:
        if name not in names:
            raise ToolDefinitionError(f"{where} names {name!r}, which is not one of its tools {sorted(names)}")
    return set(shared)


class EnvironmentReward:
    """One reward an environment brings (its factory's ``rewards``): the score named ``score`` in each episode's
    ``env_scores`` column (what its environment's finish() gave); None (does not apply) where there is none (an
    episode whose worker a time budget stopped) and, with an environment per row, on the rows of the others
    (those whose ``column`` does not name ``environment``). A lookup: it runs in the scoring process."""

    in_process = True  # (grpokit.scoring.runner: no worker needed to read a column)

    def __init__(self, score: str, environment: str | None = None, column: str | None = None):
        self.score, self.environment, self.column = score, environment, column
        self.__name__ = score

    def __call__(self, prompts, completions, env_scores=None, **columns) -> list[float | None]:
        scores = env_scores if env_scores is not None else [None] * len(completions)
        mine = columns.get(self.column) if self.environment is not None else None
        out = []
        for k, given in enumerate(scores):
            if mine is not None and mine[k] != self.environment:
                out.append(None)
            else:
                out.append(given.get(self.score) if isinstance(given, dict) else None)
        return out

    def __repr__(self) -> str:
        return f"EnvironmentReward({self.score!r}, {self.environment!r}, {self.column!r})"


def environment_rewards(rollout_cfg, taken: list[str] = ()) -> list[tuple[str, EnvironmentReward, float]]:
    """(name, function, weight) for each reward the run's environments of other ecosystems bring: their
    factory's ``rewards`` [(score name, weight)] (a verifiers environment's rubric: each function with its
    weight), in order, weighted ones first. With an environment per row a reward is named NAME.SCORE (NAME: the
    environment's key in rollout.environment) and applies to its rows alone. ConfigError for a name already
    ``taken`` (the rewards given or configured)."""
    specs = environment_specs(rollout_cfg.environment)
    by_row = isinstance(rollout_cfg.environment, dict)
    out: list[tuple[str, EnvironmentReward, float]] = []
    for key, spec in specs.items():
        kind, sep, _ = spec.partition(":")
        if not sep or kind not in ENVIRONMENT_KINDS:
            continue  # grpokit's own environments: their rewards are the run's rewards
        offered = list(getattr(load_environment(spec, rollout_cfg), "rewards", None) or ())
        offered.sort(key=lambda pair: pair[1] == 0)  # metrics (weight 0) last: never picked as accuracy
        for score, weight in offered:
            name = f"{key}.{score}" if by_row else score
            if name in taken or any(name == n for n, _, _ in out):
                raise ConfigError(
                    f"rollout.environment={spec!r} brings a reward named {name!r}, and the run already has one "
                    "of that name; rename your reward (or the environment's function)"
                )
            fn = EnvironmentReward(score, key, rollout_cfg.environment_column) if by_row else EnvironmentReward(score)
            out.append((name, fn, float(weight)))
    return out


@dataclass
class LoadedEnvironment:
    """One environment of the run: its name (what rows and messages call it), its factory, the workers its
    episodes run in (one per episode), and the tools it offers (``own``: per episode; the rest on the run's
    runner) with the chat rendering that describes all the tools its episodes see."""

    name: str
    spec: str
    factory: Callable[[], Environment]
    pool: EnvPool
    tools: list[Tool]  # every tool its episodes may call: rollout.tools and its own (schemas told to the model)
    own: list[Tool] = field(default_factory=list)  # its tools that run per episode
    delta: ChatDelta | None = None


def environment_states(episodes) -> dict[str, list]:
    """{"environments": each episode's environment state (TRL's reward functions read the episodes' environments;
    grpokit.integrations.trl_environment), None where it has none} when any episode has one; else {}."""
    states = [ep.env_state for ep in episodes]
    return {"environments": states} if any(state is not None for state in states) else {}


def name_callables(rollout_cfg) -> None:
    """Python API (TRL's way): tool functions and an environment class put in the config themselves become
    their names, "module:qualname", which the config checks, saves and loads back (grpokit.core.user_code.name_of:
    the name must find the object again; one defined in the running script is found in __main__)."""

    def name(obj: object, where: str) -> object:
        if isinstance(obj, str) or not callable(obj):
            return obj
        return name_of(obj, where)

    if isinstance(rollout_cfg.tools, (list, tuple)):
        rollout_cfg.tools = [name(t, f"rollout.tools[{k}]") for k, t in enumerate(rollout_cfg.tools)]
    if isinstance(rollout_cfg.environment, dict):
        rollout_cfg.environment = {k: name(v, f"rollout.environment.{k}") for k, v in rollout_cfg.environment.items()}
    else:
        rollout_cfg.environment = name(rollout_cfg.environment, "rollout.environment")


class EpisodeSampler:
    """The trainer's multi-turn rollouts and their scoring. Owns the tool runner (its worker processes),
    the parser, the environment factory and the chat-template delta; built before the model loads, so a
    bad tool or environment fails at once."""

    def __init__(self, cfg, reward_functions: list[tuple[str, Callable, float]], algo):
        r = cfg.rollout
        for key in ("max_turns", "tool_workers", "max_tool_result_chars"):
            if getattr(r, key) < 1:
                raise ConfigError(f"rollout.{key}={getattr(r, key)} must be >= 1")
        if r.max_episode_tokens < 0:
            raise ConfigError("rollout.max_episode_tokens must be >= 0 (0: max_turns x max_new_tokens)")
        for key in (
            "tool_timeout_s",
            "env_timeout_s",
            "episode_timeout_s",
            "step_timeout_s",
            "tool_memory_mb",
        ):
            if not getattr(r, key) > 0:
                raise ConfigError(f"rollout.{key}={getattr(r, key)} must be > 0")
        if r.ignore_eos:
            raise ConfigError(
                "rollout.ignore_eos cannot end a model turn; turn it off for multi-turn rollouts"
            )
        process_fns = [name for name, fn, _ in reward_functions if is_process_reward(fn)]
        if process_fns:
            raise ConfigError(
                f"the process rewards {process_fns} score steps of one completion's text; in multi-turn rollouts "
                "the steps are the turns: return per-turn rewards from the environment (EnvStep.reward) instead"
            )
        self.cfg, self.algo, self.reward_functions = cfg, algo, reward_functions
        self.run_tools = load_tools(list(r.tools))  # ToolDefinitionError before the model loads
        self.parser = get_parser(r.tool_parser)
        self.by_row = isinstance(r.environment, dict)  # an environment per row, named by a column
        self.column = r.environment_column
        taken = {t.name for t in self.run_tools}
        tool_settings = dict(
            timeout_s=r.tool_timeout_s, max_result_chars=r.max_tool_result_chars, memory_mb=r.tool_memory_mb
        )
        self.tool_settings = tool_settings
        shared: list[Tool] = []
        self.envs: dict[str, LoadedEnvironment] = {}
        for name, spec in environment_specs(r.environment).items():
            factory = load_environment(spec, r)
            offered = environment_tools(factory, spec, taken)  # the environment's own tools
            shared_names = shared_tool_names(factory, spec, offered)
            for t in offered:
                if t.name in shared_names:
                    if any(s.name == t.name and s.fn is not t.fn for s in shared):
                        raise ToolDefinitionError(
                            f"rollout.environment={spec}: its shared tool {t.name!r} and another environment's "
                            "have the same name; shared tool names must be unique across the environments"
                        )
                    shared += [t] if all(s.fn is not t.fn for s in shared) else []
            # each episode's environment in its own killable worker, each reset/step within env_timeout_s
            self.envs[name] = LoadedEnvironment(
                name=spec if not self.by_row else f"{name} ({spec})",
                spec=spec,
                factory=factory,
                pool=EnvPool(factory, r.env_timeout_s),
                tools=self.run_tools + offered,
                own=[t for t in offered if t.name not in shared_names],
            )
        self.tools = self.run_tools + [  # every tool of the run, once
            t for env in self.envs.values() for t in env.tools if t not in self.run_tools
        ]
        runner_tools = self.run_tools + shared  # the run's runner: rollout.tools and the shared ones
        self.runner = ToolRunner(runner_tools, workers=r.tool_workers, **tool_settings) if runner_tools else None
        self.max_episode_tokens = r.max_episode_tokens or r.max_turns * r.max_new_tokens
        self.delta: ChatDelta | None = None  # tools alone (no environment): rollout.tools' rendering
        self._rounds: list[dict[str, float]] = []
        self._episode_tools: list[EpisodeTools] = []  # this rollout's per-episode tool runners

    @property
    def factory(self) -> Callable[[], Environment] | None:
        """The environment's factory when there is one environment (None: tools alone or one per row)."""
        return next(iter(self.envs.values())).factory if len(self.envs) == 1 and not self.by_row else None

    def row_environments(self, rows: list[dict]) -> list[LoadedEnvironment | None]:
        """Each row's environment (None: tools alone): the one environment, or the one its column names;
        TrainingError naming the row when the column is missing or names no environment."""
        if not self.envs:
            return [None] * len(rows)
        if not self.by_row:
            return [next(iter(self.envs.values()))] * len(rows)
        out = []
        for k, row in enumerate(rows):
            name = row.get(self.column) if isinstance(row, dict) else None
            if name not in self.envs:
                shown = "has no column " + repr(self.column) if name is None else f"names {str(name)[:80]!r}"
                raise TrainingError(
                    f"row {k} of the batch {shown}, which is not one of rollout.environment's names "
                    f"{sorted(self.envs)}; give each row its environment's name in the column "
                    f"{self.column!r} (rollout.environment_column)"
                )
            out.append(self.envs[name])
        return out

    def environments(self, rows: list[dict], group_size: int) -> list:
        """``group_size`` environments for each of ``rows``: the tool environment, or handles on workers that
        each make the row's environment afresh at reset (grpokit.rollout.envs.EnvPool), each wrapped to run
        the turn's tool calls first when tools are offered (grpokit.rollout.envs.EnvironmentWithTools; the
        environment's own tools on workers of the episode's own, ended by :meth:`end_episodes`)."""
        loaded = self.row_environments(rows)
        if not self.envs:
            return [
                ToolEnvironment(self.runner, self.parser, self.cfg.data.prompt_column, self.cfg.data.system_prompt)
                for _ in range(len(rows) * group_size)
            ]
        by_name = {env.name: env for env in loaded}
        handles = {  # each environment's handles, as many as its rows' episodes
            name: iter(env.pool.environments(group_size * sum(e.name == name for e in loaded)))
            for name, env in by_name.items()
        }
        out = []
        for env in loaded:
            for _ in range(group_size):
                handle = next(handles[env.name])
                if not env.tools:
                    out.append(handle)
                    continue
                tools = EpisodeTools(self.runner, env.own, self.tool_settings)
                self._episode_tools.append(tools)
                out.append(EnvironmentWithTools(handle, tools, self.parser, self.cfg.rollout.max_tool_result_chars))
        return out

    def end_episodes(self) -> None:
        """The rollout's episodes are over: every environment's ``close()`` and workers, and the episodes' own
        tool workers, killed with what they started (all keepers at once)."""
        episode_tools, self._episode_tools = self._episode_tools, []
        stop_workers([w for tools in episode_tools for w in tools.workers()])
        for tools in episode_tools:
            tools.close()
        for env in self.envs.values():
            env.pool.end_episodes()

    def episode_settings(self) -> dict:
        """run_episodes' budgets and limits from the config."""
        r = self.cfg.rollout
        return dict(
            episode_budget_s=r.episode_timeout_s,
            step_budget_s=r.step_timeout_s,
            max_message_chars=r.max_tool_result_chars,
        )

    def describe_prompts(self, n: int) -> str:
        """What the run does with its prompts, printed at start in place of data.template's line: episodes
        always go through the chat template (ChatDelta), strings as one user message."""
        offered = []
        if self.by_row:
            names = ", ".join(f"{name}: {env.spec}" for name, env in self.envs.items())
            offered.append(f"each row's environment (its column {self.column!r}) of {{{names}}}")
        elif self.envs:
            offered.append(f"the environment {next(iter(self.envs.values())).spec}")
        if self.tools:
            offered.append(f"the tools {[t.name for t in self.tools]}")
        return (
            f"multi-turn episodes: {n} prompt(s) through the tokenizer's chat template, a string as one user "
            f"message, with {' and '.join(offered)} (data.template does not apply)"
        )

    def check_tokenizer(self, tokenizer) -> None:
        """Builds the chat-template deltas (one per environment: the tools its episodes see): a template that
        cannot render the tools or turns is a ConfigError."""
        if self.delta is None or self.delta.tokenizer is not tokenizer:
            self.delta = ChatDelta(tokenizer, [t.schema for t in self.run_tools])
            for env in self.envs.values():  # its tools, and those it runs itself (verifiers' tool_defs)
                schemas = [t.schema for t in env.tools] + list(getattr(env.factory, "tool_schemas", None) or ())
                env.delta = ChatDelta(tokenizer, schemas)

    def _run(self, generator, model, tokenizer, rows: list[dict], **settings) -> EpisodeBatch:
        """run_episodes over ``rows`` with each row's environment, its chat rendering and its name; the
        episodes' workers ended afterwards, whatever happens."""
        self.check_tokenizer(tokenizer)
        loaded = self.row_environments(rows)
        try:
            envs = self.environments(rows, settings["group_size"])
            return run_episodes(
                generator, model, tokenizer, [env.delta if env else self.delta for env in loaded], envs, rows,
                env_name=[env.name if env else "tools" for env in loaded], **settings, **self.episode_settings(),
            )  # fmt: skip
        finally:
            self.end_episodes()

    def rollout(
        self, generator, model, tokenizer, rows: list[dict], *, seed: int, eos_token_ids: list[int]
    ) -> EpisodeBatch:
        """G episodes for each of ``rows`` (the per-rank share of the step's prompts)."""
        r = self.cfg.rollout
        batch = self._run(
            generator, model, tokenizer, rows,
            group_size=r.group_size, max_turns=r.max_turns, max_new_tokens=r.max_new_tokens,
            max_episode_tokens=self.max_episode_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
            min_p=r.min_p, repetition_penalty=r.repetition_penalty,
            eos_token_ids=eos_token_ids, pad_token_id=tokenizer.pad_token_id, seed=seed, threads=r.tool_workers,
        )  # fmt: skip
        self._rounds.append(batch.metrics)
        return batch

    def score(
        self, batch: EpisodeBatch, rows: list[dict], rewards, tokenizer, trainer_state, step: int
    ) -> ScoredBatch:
        """Reward functions over whole transcripts (see the module docstring) -> the step's ScoredBatch."""
        cfg = self.cfg
        episodes = batch.episodes
        per_episode_rows = [row for row in rows for _ in range(len(episodes) // len(rows))]
        columns = reward_columns(per_episode_rows, cfg.data.prompt_column)
        columns["completion_ids"] = batch.rollout.completion_token_ids()  # the model's own ids
        columns["turn_rewards"] = [list(ep.turn_rewards) for ep in episodes]
        columns["env_scores"] = [ep.env_scores for ep in episodes]
        columns.update(environment_states(episodes))
        columns["trainer_state"] = trainer_state
        prompts = [ep.messages[: ep.n_first] for ep in episodes]
        completions = [ep.completion for ep in episodes]
        env_problem = self.env_failure(episodes)
        if env_problem:  # the user's code: exit 3 (grpokit.core.errors)
            raise EnvironmentFailedError(f"step {step + 1}: {env_problem}")
        result = rewards(prompts, completions, columns)
        problem = result.failure(cfg.train.max_reward_failure_frac, prompts, completions)
        if problem:
            raise RewardFunctionError(
                f"step {step + 1}: {problem}\nFix the reward function (or the data it reads). "
                f"train.max_reward_failure_frac={cfg.train.max_reward_failure_frac:g} is the share of "
                "a step's completions a function may fail on and still count 0 there."
            )
        r = batch.rollout
        # what logs and sample files show: the whole transcript after the prompt, markers included
        texts = tokenizer.batch_decode(kept_ids(r.completion_ids, r.attention_mask), skip_special_tokens=False)
        step_rewards = None
        if reads_step_rewards(self.algo.advantage.estimator):
            outcome = result.total if any(w != 0 for _, _, w in self.reward_functions) else None
            step_rewards = episode_step_rewards(episodes, outcome)
        totals = [0.0 if ep.failed is not None else t for ep, t in zip(episodes, result.total)]
        if self.by_row:  # how each environment's episodes went, in the step's episode metrics
            batch.metrics.update(self.environment_metrics(per_episode_rows, episodes, totals))
        return ScoredBatch(
            rollout=r,
            rows=per_episode_rows,
            texts=texts,
            rewards=torch.tensor(totals, dtype=torch.float32),
            per_function=result.per_function,
            reward_metrics=result.metrics(),
            extra={k: v for k, v in result.extra.items() if len(v) == len(texts)},
            step_rewards=step_rewards,
        )

    def environment_metrics(self, rows: list[dict], episodes, totals: list[float]) -> dict[str, float]:
        """Per environment of the run (rows of one per row): env/NAME/episodes and env/NAME/failed (counts),
        env/NAME/reward_mean (its episodes' total reward) and env/NAME/turns_mean."""
        names = [env.name for env in self.row_environments(rows)]
        out = {}
        for key, env in self.envs.items():
            mine = [k for k, name in enumerate(names) if name == env.name]
            if not mine:
                continue
            out[f"env/{key}/episodes"] = float(len(mine))
            out[f"env/{key}/failed"] = float(sum(episodes[k].failed is not None for k in mine))
            out[f"env/{key}/reward_mean"] = sum(totals[k] for k in mine) / len(mine)
            out[f"env/{key}/turns_mean"] = sum(len(episodes[k].turn_ends) for k in mine) / len(mine)
        return out

    def env_failure(self, episodes) -> str | None:
        """Why the episodes whose environment failed must stop the run, or None: the reward functions' rule
        (train.max_reward_failure_frac): on every episode, or on more than that share of them. The others
        score 0 (every reward function's value is kept in the logs, the total is 0)."""
        failed = [ep.failed for ep in episodes if ep.failed is not None]
        frac = self.cfg.train.max_reward_failure_frac
        n = len(episodes)
        if not failed or (len(failed) < n and len(failed) / max(n, 1) <= frac):
            return None
        share = (
            f"every one of the {n}"
            if len(failed) == n
            else f"{len(failed)} of {n} (allowed: {frac:g} of them)"
        )
        return (
            f"the environment failed on {share} episodes; the first: {failed[0]}\nFix the environment "
            "(or raise rollout.env_timeout_s if it is only slow). train.max_reward_failure_frac="
            f"{frac:g} is the share of a step's episodes that may fail and still count 0 there."
        )

    def evaluate(
        self, generator, model, tokenizer, rows: list[dict], accuracy_fn, *, eos_token_ids: list[int],
        seed: int = 0, examples: list[dict] | None = None, batch_prompts: int = 64,
        progress: Callable[[str], None] | None = None,
    ) -> dict[str, float]:  # fmt: skip
        """Held-out greedy episodes (one per row) scored by ``accuracy_fn`` on the transcript: accuracy (share
        scoring 1), greedy_score, completion_len/mean (the model's tokens), turns and tool calls per episode.
        Sampled mean/pass/maj@k are single-turn only (grpokit.rollout.evaluate) and not computed here.
        ``progress`` (a line printer) gets grpokit.rollout.evaluate.EvalProgress lines as chunks finish."""
        from grpokit.rewards import RewardRunner, TrainerState
        from grpokit.rollout.evaluate import EvalProgress

        runner = RewardRunner([("accuracy", accuracy_fn, 1.0)])
        r = self.cfg.rollout
        scores, lengths, turns, calls = [], [], [], []
        shown = EvalProgress(progress, len(rows), unit="episodes") if progress is not None and rows else None
        for start in range(0, len(rows), batch_prompts):
            part = rows[start : start + batch_prompts]
            batch = self._run(
                generator, model, tokenizer, part,
                group_size=1, max_turns=r.max_turns, max_new_tokens=r.max_new_tokens,
                max_episode_tokens=self.max_episode_tokens, temperature=0.0, eos_token_ids=eos_token_ids,
                repetition_penalty=r.repetition_penalty,  # as evaluate(): the penalty, no filter
                pad_token_id=tokenizer.pad_token_id, seed=seed + start, threads=r.tool_workers,
            )  # fmt: skip
            failed = [ep.failed for ep in batch.episodes if ep.failed is not None]
            if failed and len(failed) == len(part):
                raise ValueError(f"evaluation: every episode's environment failed; the first: {failed[0]}")
            columns = reward_columns(part, self.cfg.data.prompt_column)
            columns["completion_ids"] = batch.rollout.completion_token_ids()
            columns["turn_rewards"] = [list(ep.turn_rewards) for ep in batch.episodes]
            columns["env_scores"] = [ep.env_scores for ep in batch.episodes]
            columns.update(environment_states(batch.episodes))
            columns["trainer_state"] = TrainerState()
            prompts = [ep.messages[: ep.n_first] for ep in batch.episodes]
            completions = [ep.completion for ep in batch.episodes]
            result = runner(prompts, completions, columns)
            problem = result.failure(1.0, prompts, completions)
            if problem:
                raise ValueError(f"evaluation: {problem}")
            values = [
                float(v) if v is not None and ep.failed is None else 0.0
                for v, ep in zip(result.per_function["accuracy"], batch.episodes)
            ]  # an episode whose environment failed scores 0
            if examples is not None and not examples:
                examples.append(
                    {
                        "prompt": part[0][self.cfg.data.prompt_column],
                        "completion": str(completions[0]),
                        "score": values[0],
                    }
                )
            scores += values
            lengths += batch.rollout.completion_lengths.tolist()
            turns += [len(ep.turn_ends) for ep in batch.episodes]
            calls += [ep.tool_calls for ep in batch.episodes]
            if shown is not None:
                shown("greedy", len(scores))
        runner.close()
        n = max(1, len(scores))
        per_env = {}
        if self.by_row:  # each environment's own held-out accuracy
            names = [env.name for env in self.row_environments(rows)]
            for key, env in self.envs.items():
                mine = [v for v, name in zip(scores, names) if name == env.name]
                if mine:
                    per_env[f"env/{key}/accuracy"] = sum(v >= 1.0 - 1e-6 for v in mine) / len(mine)
        return {
            **per_env,
            "accuracy": sum(s >= 1.0 - 1e-6 for s in scores) / n,
            "greedy_score": sum(scores) / n,
            "completion_len/mean": sum(lengths) / n,
            "num_examples": float(len(rows)),
            "episode/turns_mean": sum(turns) / n,
            "tools/calls_per_episode": sum(calls) / n,
        }

    def take_metrics(self) -> dict[str, float]:
        """The episode metrics of the rollouts since the last call: counts and seconds summed over the
        sampling rounds, the rest averaged (over the rounds that have them: an environment may be absent from
        a round)."""
        rounds, self._rounds = self._rounds, []
        out: dict[str, float] = {}
        for key in dict.fromkeys(k for m in rounds for k in m):
            values = [m[key] for m in rounds if key in m]
            summed = key in SUMMED or key.endswith(("/episodes", "/failed"))
            out[key] = sum(values) / (1 if summed else len(values))
        return out

    def close(self) -> None:
        self.end_episodes()
        if self.runner is not None:
            self.runner.close()
        for env in self.envs.values():
            env.pool.close()


__all__ = [
    "EnvironmentReward",
    "EpisodeSampler",
    "ToolDefinitionError",
    "environment_rewards",
    "load_environment",
    "multi_turn",
    "name_callables",
]

"""Per-prompt history and prompt selection (data.selection; ALGORITHMS.md section 14, issue 50).

A group whose G rewards all match has zero advantage under every group-relative estimator: it was generated,
scored and pushed through the update, and taught nothing. Whether a prompt gives such a *flat* group is
consistent over time (GRESO, arXiv 2506.02177): one that was all solved or all failed on its last visits is
likely to be so again. So the run keeps, per training row (its index in the training rows, stable over a
resume), what its visits gave, and skips such prompts before they are generated, revisiting them on a
schedule:

    PromptHistory   per row: visits, the run of consecutive flat visits z, the last visit's step, reward mean
                    and spread (population std), the pass rate of the last W visits (the accuracy reward's
                    share of completions scoring 1), how the last flat visit was flat (solved or failed)
    SkipRule        GRESO's probabilistic skip: a row whose last z >= 1 visits were flat is kept with
                    probability p^z (p = p_solved or p_failed by how it was flat), skipped otherwise; never
                    seen or informative last time: always kept. After each step p moves by explore_step
                    (down: skip more, up: skip less) so that the share of the step's generated groups that
                    were flat that way stays near target_flat / 2, within [explore_min, explore_max]
    Selection       both, with the draw: u(row's place in the stream) = a seeded uniform of (train.seed,
                    pass, position), so a resumed run skips exactly as the run it continues (no random state
                    to save); the step's counts for the metrics

Worked example (explore_start 0.5): a prompt all solved on its last 2 visits is kept with probability
0.5^2 = 0.25 when the stream reaches it; skipped, it comes back on the next pass over the data and is drawn
again. One solved on its last visit and informative before: 0.5. Informative last time: always generated.

A skipped prompt's place goes to the next one in the stream: a step still generates rollout.prompts_per_step
prompts, fewer of them flat. With data.selection.refill the Sampler (grpokit.collect.sampler) also drops the
groups that still come out flat and generates more prompts until the step has rollout.prompts_per_step
informative groups, each extra round sized by the share of flat groups seen so far (GRESO's adaptive batch).
Never a silent narrowing: the share skipped is in the metrics every step (selection/skipped_frac); a step that could not
fill in data.selection.max_rounds extra rounds trains on some flat groups and says so; and when every row's
last visit was flat (the informative pool ran dry) selection stops skipping and refilling, says so once, and
the flat batches then meet train.stop_after_flat_steps's stop (solved: stopped early; failed: an error).
Evaluation data is never selected from.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from grpokit.core.errors import ConfigError

SOLVED, FAILED, INFORMATIVE = 1, -1, 0
"""How a row's last visit went: flat at the top (every completion passed / the run's best reward), flat at
the bottom, or with a reward spread."""


@dataclass
class SelectionSettings:
    """data.selection's values the rule reads (grpokit.config.selection.SelectionConfig)."""

    explore_start: float = 0.5
    explore_min: float = 0.05
    explore_max: float = 0.95
    explore_step: float = 0.01
    target_flat: float = 0.25
    window: int = 4
    max_rounds: int = 4
    refill: bool = False

    @classmethod
    def of(cls, config) -> SelectionSettings:
        return cls(**{name: getattr(config, name) for name in cls.__dataclass_fields__})


class PromptHistory:
    """What each training row's visits gave (see the module docstring); rows by index, ``n`` of them.

    observe(ids, rewards (P, G), flat (P,), passed (P, G) bool or None, step): one visit per group.
    """

    def __init__(self, n: int, window: int = 4):
        self.n, self.window = n, window
        self.visits = [0] * n
        self.flat_run = [0] * n  # z: consecutive latest visits with no reward spread
        self.kind = [INFORMATIVE] * n  # the last visit: SOLVED, FAILED or INFORMATIVE
        self.last_step = [-1] * n  # the step of the last visit (-1: never visited)
        self.reward_mean = [math.nan] * n  # the last visit's
        self.reward_spread = [math.nan] * n  # the last visit's population std of the G rewards
        self.passes: list[list[float]] = [[] for _ in range(n)]  # pass rates of the last ``window`` visits
        self.skipped = [0] * n  # times the stream skipped it
        self.best_reward = -math.inf  # the run's best single reward: "solved" without an accuracy reward

    def observe(
        self,
        ids: list[int],
        rewards: torch.Tensor,
        flat: torch.Tensor,
        passed: torch.Tensor | None,
        step: int,
    ) -> list[int]:
        """Record one visit of each row ``ids[g]`` with its group's ``rewards[g]`` (P, G), ``flat[g]`` (P,)
        (grpokit.rollout.batch.flat_groups) and ``passed[g]`` (P, G) bool (None: no accuracy reward); returns
        each group's kind (SOLVED, FAILED, INFORMATIVE)."""
        r = rewards.double()  # (P, G)
        self.best_reward = max(self.best_reward, float(r.max()))
        kinds = []
        for g, row in enumerate(ids):
            rate = float(passed[g].double().mean()) if passed is not None else math.nan
            kind = INFORMATIVE
            if bool(flat[g]):
                if passed is not None and rate in (0.0, 1.0):
                    kind = SOLVED if rate == 1.0 else FAILED
                else:  # no accuracy: flat at the run's best reward is solved
                    kind = SOLVED if float(r[g].max()) >= self.best_reward else FAILED
            self.visits[row] += 1
            self.flat_run[row] = self.flat_run[row] + 1 if kind != INFORMATIVE else 0
            self.kind[row] = kind
            self.last_step[row] = step
            self.reward_mean[row] = float(r[g].mean())
            self.reward_spread[row] = float(r[g].std(correction=0))
            if passed is not None:
                self.passes[row] = [*self.passes[row], rate][-self.window :]
            kinds.append(kind)
        return kinds

    def pass_rate(self, row: int) -> float:
        """The mean pass rate of the row's last ``window`` visits (NaN: never visited, or no accuracy reward)."""
        values = self.passes[row]
        return sum(values) / len(values) if values else math.nan

    def seen(self) -> int:
        return sum(1 for v in self.visits if v)

    def dry(self) -> bool:
        """Every row visited, and every row's last visit flat: no prompt is known to teach anything."""
        return all(v > 0 and z > 0 for v, z in zip(self.visits, self.flat_run))

    def counts(self) -> dict[str, int]:
        seen = [i for i in range(self.n) if self.visits[i]]
        return {
            "seen": len(seen),
            "solved": sum(1 for i in seen if self.kind[i] == SOLVED),
            "failed": sum(1 for i in seen if self.kind[i] == FAILED),
        }

    def metrics(self) -> dict[str, float]:
        """history/*: shares of the training rows seen and whose last visit was all solved / all failed, and
        the mean recent pass rate over the rows seen (when there is an accuracy reward)."""
        c = self.counts()
        out = {
            "history/seen_frac": c["seen"] / max(self.n, 1),
            "history/solved_frac": c["solved"] / max(self.n, 1),
            "history/failed_frac": c["failed"] / max(self.n, 1),
        }
        rates = [self.pass_rate(i) for i in range(self.n) if self.passes[i]]
        if rates:
            out["history/pass_rate_mean"] = sum(rates) / len(rates)
        return out

    def rows(self) -> list[dict]:
        """Every row visited: its id and numbers (what the explorer shows)."""
        return [
            {
                "row": i,
                "visits": self.visits[i],
                "flat_run": self.flat_run[i],
                "kind": self.kind[i],
                "last_step": self.last_step[i],
                "reward_mean": self.reward_mean[i],
                "reward_spread": self.reward_spread[i],
                "pass_rate": self.pass_rate(i),
                "skipped": self.skipped[i],
            }  # fmt: skip
            for i in range(self.n)
            if self.visits[i] or self.skipped[i]
        ]

    _FIELDS = ("visits", "flat_run", "kind", "last_step", "reward_mean", "reward_spread", "passes", "skipped")

    def state(self) -> dict:
        """Everything, as plain lists (a checkpoint's trainer_state.pt: floats kept exactly)."""
        out = {
            name: [list(v) if isinstance(v, list) else v for v in getattr(self, name)]
            for name in self._FIELDS
        }
        return {**out, "n": self.n, "window": self.window, "best_reward": self.best_reward}

    def load_state(self, state: dict) -> None:
        if state["n"] != self.n:
            raise ConfigError(
                f"the checkpoint's prompt history is of {state['n']} training rows, this run has {self.n}: the "
                "training data changed; resume with the same data.train, or set data.selection.mode=off"
            )
        for name in self._FIELDS:
            setattr(self, name, [list(v) if isinstance(v, list) else v for v in state[name]])
        self.window, self.best_reward = state["window"], state["best_reward"]


@dataclass
class SkipRule:
    """GRESO's probabilistic skip (see the module docstring): exploration probabilities p_solved, p_failed."""

    settings: SelectionSettings
    p_solved: float = field(default=math.nan)
    p_failed: float = field(default=math.nan)

    def __post_init__(self):
        if math.isnan(self.p_solved):
            self.p_solved = self.settings.explore_start
        if math.isnan(self.p_failed):
            self.p_failed = self.settings.explore_start

    def keep_probability(self, history: PromptHistory, row: int) -> float:
        """p^z for a row whose last z >= 1 visits were flat (p by how the last one was), else 1."""
        z = history.flat_run[row]
        if z == 0:
            return 1.0
        p = self.p_solved if history.kind[row] == SOLVED else self.p_failed
        return p**z

    def adapt(self, solved: int, failed: int, generated: int) -> None:
        """After a step that generated ``generated`` groups, ``solved`` / ``failed`` of them flat that way: each
        p moves down by explore_step (skip more) when its share is above target_flat / 2, else up."""
        if generated == 0:
            return
        s = self.settings
        target = s.target_flat / 2

        def moved(p: float, share: float) -> float:
            p = p - s.explore_step if share > target else p + s.explore_step
            return min(max(p, s.explore_min), s.explore_max)

        self.p_solved = moved(self.p_solved, solved / generated)
        self.p_failed = moved(self.p_failed, failed / generated)


def draw(seed: int, epoch: int, index: int) -> float:
    """A uniform in [0, 1) for the stream's ``index``-th place of pass ``epoch``: the same in every run and
    process with this seed."""
    return random.Random((seed * 1_000_003 + epoch) * 1_000_003 + index).random()


class Selection:
    """The history, the skip rule and this step's counts (the stream asks ``keeps``; the Sampler ``observe``s).

    Per step: ``begin_step()``, then the stream's ``keeps(row, epoch, index)`` for every candidate, the
    Sampler's ``observe(...)`` for every generated group, and ``end_step()`` -> the step's metrics."""

    def __init__(self, n_rows: int, seed: int, settings: SelectionSettings, accuracy: str | None):
        self.settings, self.seed, self.accuracy = settings, seed, accuracy
        self.history = PromptHistory(n_rows, settings.window)
        self.rule = SkipRule(settings)
        self.dry_said = False  # the pool ran dry: said once, until a prompt shows spread again
        self.begin_step()

    def begin_step(self) -> None:
        self.considered = self.skipped = 0
        self.generated = self.solved = self.failed = 0
        self.dry_now = self.history.dry()  # no informative prompt known: no skip, no refill this step

    def keeps(self, row: int, epoch: int, index: int) -> bool:
        """Whether the stream's candidate ``row`` (at pass ``epoch``, place ``index``) is generated."""
        self.considered += 1
        if self.dry_now:
            return True
        if draw(self.seed, epoch, index) < self.rule.keep_probability(self.history, row):
            return True
        self.skipped += 1
        self.history.skipped[row] += 1
        return False

    def observe(
        self, ids: list[int], rewards: torch.Tensor, flat: torch.Tensor, per_function: dict, step: int
    ):
        """A round's groups: rows ``ids`` (P,), ``rewards`` (P*G,), ``flat`` (P,), the reward functions' values
        (the accuracy reward's give the pass rate)."""
        P = len(ids)
        grouped = rewards.view(P, -1)  # (P, G)
        passed = None
        if self.accuracy is not None and self.accuracy in per_function:
            values = per_function[self.accuracy]
            passed = torch.tensor([v is not None and v >= 1.0 - 1e-6 for v in values]).view(P, -1)
        kinds = self.history.observe(ids, grouped, flat, passed, step)
        self.generated += P
        self.solved += kinds.count(SOLVED)
        self.failed += kinds.count(FAILED)

    def refills(self) -> bool:
        return self.settings.refill and not self.dry_now

    def round_size(self, missing: int, flat_so_far: int, generated_so_far: int, cap: int) -> int:
        """Prompts to generate for ``missing`` informative groups, given the step's flat share so far (at most
        0.9 assumed): ceil(missing / (1 - share)), at most ``cap``."""
        share = min(flat_so_far / max(generated_so_far, 1), 0.9)
        return max(1, min(cap, math.ceil(missing / (1.0 - share))))

    def end_step(self) -> dict[str, float]:
        """The step's selection/* and history/* metrics; the rule adapts to the step's flat shares."""
        self.rule.adapt(self.solved, self.failed, self.generated)
        out = {
            "selection/skipped_frac": self.skipped / max(self.considered, 1),
            "selection/p_solved": self.rule.p_solved,
            "selection/p_failed": self.rule.p_failed,
            "selection/dry": float(self.dry_now),
            "selection/generated_groups": float(self.generated),
            **self.history.metrics(),
        }
        return out

    def dry_notice(self, step: int) -> str | None:
        """Once per dry spell: the message that the informative pool ran dry (None otherwise)."""
        if not self.dry_now:
            self.dry_said = False
            return None
        if self.dry_said:
            return None
        self.dry_said = True
        c = self.history.counts()
        return (
            f"WARNING step {step + 1}: prompt selection: the informative pool ran dry: the last visit of every one "
            f"of the {self.history.n} training prompts had no reward spread ({c['solved']} all solved, "
            f"{c['failed']} all failed), so none is skipped or refilled now and the steps train on flat groups "
            "until a prompt shows spread again (train.stop_after_flat_steps stops the run when none does; "
            "data.selection.mode=off turns selection off)."
        )

    def state(self) -> dict:
        return {
            "history": self.history.state(),
            "p_solved": self.rule.p_solved,
            "p_failed": self.rule.p_failed,
            "dry_said": self.dry_said,
        }

    def load_state(self, state: dict) -> None:
        self.history.load_state(state["history"])
        self.rule.p_solved, self.rule.p_failed = state["p_solved"], state["p_failed"]
        self.dry_said = state["dry_said"]
        self.begin_step()


def selection_for(cfg, n_rows: int, reward_names: list[str], world: int) -> Selection | None:
    """The run's Selection (data.selection.mode greso), or None (off). The pass rate reads the accuracy reward
    train.accuracy_reward names, or the one grpokit.rewards.which_accuracy picks."""
    chosen = cfg.data.selection
    if chosen.mode == "off":
        return None
    if world > 1:
        raise ConfigError(
            f"data.selection.mode={chosen.mode} under torchrun ({world} processes) is not done yet: each rank "
            "would keep its own history and the ranks' prompt streams would part; set data.selection.mode=off"
        )
    from grpokit.rewards.which_accuracy import pick_accuracy_reward

    try:
        accuracy, _ = pick_accuracy_reward(list(reward_names), cfg.train.accuracy_reward)
    except ConfigError:
        accuracy = None  # a config name the metric names differ from: no pass rate, the reward decides
    return Selection(n_rows, cfg.train.seed, SelectionSettings.of(chosen), accuracy)

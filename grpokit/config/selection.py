"""data.selection: which training prompts a step generates, from each prompt's history (issue 50; the rule is
grpokit.rollout.selection, its page docs/algorithms/selection.md). A section of the config tree
(grpokit.config.schema imports it from here)."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.config.declare import setting


@dataclass
class SelectionConfig:
    mode: str = setting(
        "off",
        """Prompt selection from each prompt's history (grpokit.rollout.selection; docs/algorithms/selection.md):
        off | greso (a prompt all solved or all failed on its last z visits is skipped before generation with
        probability 1 - p^z and revisited on a later pass; with data.selection.refill, flat groups that still
        come out are refilled too).""",
        choices=("off", "greso"),
    )
    refill: bool = setting(
        False,
        """Also drop the groups that still come out flat (equal rewards) and generate more prompts until the step
        has rollout.prompts_per_step informative groups (at most data.selection.max_rounds extra rounds). Off: the
        skipped prompts' places go to the next ones in the stream and every step generates prompts_per_step
        prompts, as without selection (refills cost up to 2x the generation where most groups are flat).""",
    )
    max_rounds: int = setting(
        4,
        """Extra generation rounds a step may take to refill; past them it trains on some flat groups and says
        so in the metrics (selection/flat_trained).""",
        range="[0, inf)",
        example=4,
    )
    explore_start: float = setting(
        0.5,
        "GRESO's exploration probability p at the start (the same for solved and failed prompts).",
        range="(0, 1]",
        example=0.5,
    )
    explore_min: float = setting(0.05, "Lower bound of p.", range="(0, 1]", example=0.05)
    explore_max: float = setting(0.95, "Upper bound of p.", range="(0, 1]", example=0.95)
    explore_step: float = setting(
        0.01,
        "How far p moves after each step toward the target share of flat groups.",
        range="[0, 1]",
        example=0.01,
    )
    target_flat: float = setting(
        0.25,
        """Share of a step's generated groups that may come out flat (half of it all solved, half all failed);
        p goes down (skip more) while a kind's share is above its half, up while below.""",
        range="[0, 1]",
        example=0.25,
    )
    window: int = setting(
        4,
        "Visits a prompt's recent pass rate is the mean of (history, metrics, explorer).",
        range="[1, inf)",
        example=4,
    )

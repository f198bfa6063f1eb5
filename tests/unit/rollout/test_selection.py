"""Per-prompt history and GRESO's skip (grpokit.rollout.selection), by hand, and the stream that asks it."""

import math
import random

import pytest
import torch

from grpokit.rollout.batch import PromptStream
from grpokit.rollout.selection import (
    FAILED,
    INFORMATIVE,
    SOLVED,
    PromptHistory,
    Selection,
    SelectionSettings,
    SkipRule,
)


def visit(history: PromptHistory, row: int, rewards: list[float], step: int) -> int:
    """One group of ``rewards`` for ``row`` (pass = reward 1), its kind."""
    r = torch.tensor([rewards])  # (1, G)
    flat = r.max(dim=1).values == r.min(dim=1).values  # (1,)
    return history.observe([row], r, flat, r >= 1.0, step)[0]


def test_history_by_hand():
    h = PromptHistory(3, window=2)
    assert visit(h, 1, [1, 1, 1, 1], step=0) == SOLVED
    assert (h.visits[1], h.flat_run[1], h.kind[1], h.reward_spread[1]) == (1, 1, SOLVED, 0.0)
    assert visit(h, 1, [1, 1, 1, 1], step=3) == SOLVED
    assert h.flat_run[1] == 2 and h.last_step[1] == 3
    # 0, 1, 0, 1: mean 0.5, population std 0.5, pass rate 0.5; the run of flat visits ends
    assert visit(h, 1, [0, 1, 0, 1], step=5) == INFORMATIVE
    assert (h.flat_run[1], h.reward_mean[1], h.reward_spread[1]) == (0, 0.5, 0.5)
    assert h.pass_rate(1) == pytest.approx((1.0 + 0.5) / 2)  # window 2: the last two visits, 1.0 and 0.5
    assert visit(h, 0, [0, 0, 0, 0], step=5) == FAILED
    assert math.isnan(h.pass_rate(2)) and h.visits[2] == 0
    assert h.metrics() == {
        "history/seen_frac": 2 / 3,
        "history/solved_frac": 0.0,
        "history/failed_frac": 1 / 3,
        "history/pass_rate_mean": (0.75 + 0.0) / 2,
    }
    assert not h.dry()
    visit(h, 2, [1, 1, 1, 1], step=6)
    visit(h, 1, [0, 0, 0, 0], step=6)
    assert h.dry()  # every row visited, each last visit flat


def test_history_without_an_accuracy_reward_calls_flat_at_the_best_reward_solved():
    h = PromptHistory(2)
    r = torch.tensor([[0.5, 0.5], [0.2, 0.2]])  # (2, 2): both flat; the run's best reward is 0.5
    assert h.observe([0, 1], r, torch.tensor([True, True]), None, step=0) == [SOLVED, FAILED]
    assert math.isnan(h.pass_rate(0))


def test_keep_probability_is_p_to_the_run_of_flat_visits():
    s = SelectionSettings(explore_start=0.5)
    rule = SkipRule(s, p_solved=0.5, p_failed=0.2)
    h = PromptHistory(3)
    visit(h, 0, [1, 1], 0)
    visit(h, 0, [1, 1], 1)  # solved twice: 0.5^2
    visit(h, 1, [0, 0], 0)  # failed once: 0.2
    assert rule.keep_probability(h, 0) == 0.25
    assert rule.keep_probability(h, 1) == 0.2
    assert rule.keep_probability(h, 2) == 1.0  # never seen
    visit(h, 0, [0, 1], 2)
    assert rule.keep_probability(h, 0) == 1.0  # informative last time


def test_the_exploration_probabilities_move_toward_the_target_flat_share():
    rule = SkipRule(
        SelectionSettings(explore_start=0.5, explore_step=0.1, target_flat=0.25, explore_min=0.35)
    )
    rule.adapt(
        solved=4, failed=0, generated=16
    )  # solved 0.25 > 0.125: skip more; failed 0 < 0.125: skip less
    assert (rule.p_solved, rule.p_failed) == pytest.approx((0.4, 0.6))
    rule.adapt(solved=4, failed=0, generated=16)
    rule.adapt(solved=4, failed=0, generated=16)
    assert rule.p_solved == pytest.approx(0.35)  # held at explore_min
    rule.adapt(solved=0, failed=0, generated=0)  # nothing generated: unchanged
    assert rule.p_solved == pytest.approx(0.35)


def uniform(seed: int, epoch: int, index: int) -> float:
    """The draw as the module docstring defines it: a seeded uniform of (seed, pass, place)."""
    return random.Random((seed * 1_000_003 + epoch) * 1_000_003 + index).random()


def test_a_prompt_with_a_known_pass_rate_is_skipped_and_revisited_as_the_rule_says():
    """Row 2 was all solved on its last 2 visits (pass rate 1): kept with probability 0.5^2 = 0.25 each time
    the stream reaches it, skipped otherwise, and reached again on the next pass. Rows never seen or with a
    spread are always kept."""
    selection = Selection(4, seed=7, settings=SelectionSettings(explore_start=0.5), accuracy=None)
    for step in range(2):
        visit(selection.history, 2, [1, 1, 1, 1], step)
    visit(selection.history, 1, [0, 1, 1, 1], 1)
    stream = PromptStream([0, 1, 2, 3], seed=7, shuffle=True, selection=selection)
    selection.begin_step()
    taken = stream.take(3 * 40)
    # the oracle: walk the same passes (the stream's seeded permutation) and apply p^z with the draw
    expected, kept_passes, skips, epoch = [], [], 0, 0
    while len(expected) < len(taken):
        order = list(range(4))
        random.Random(7 * 1_000_003 + epoch).shuffle(order)
        for index, row in enumerate(order):
            if len(expected) == len(taken):
                break
            if row != 2 or uniform(7, epoch, index) < 0.25:
                expected.append(row)
                kept_passes += [epoch] if row == 2 else []
            else:
                skips += 1
        epoch += 1
    assert taken == expected
    assert 0 < len(kept_passes) < epoch - 1  # revisited on some passes, skipped on others
    assert selection.history.skipped[2] == selection.skipped == skips
    assert selection.considered == len(taken) + skips
    assert selection.end_step()["selection/skipped_frac"] == selection.skipped / selection.considered


def test_a_dry_pool_skips_nothing_and_says_so_once():
    selection = Selection(2, seed=0, settings=SelectionSettings(), accuracy=None)
    visit(selection.history, 0, [1, 1], 0)
    visit(selection.history, 1, [1, 1], 0)
    selection.begin_step()
    assert selection.dry_now and not selection.refills()
    stream = PromptStream([0, 1], seed=0, shuffle=False, selection=selection)
    assert stream.take(6) == [0, 1, 0, 1, 0, 1] and selection.skipped == 0
    notice = selection.dry_notice(step=4)
    assert "step 5" in notice and "informative pool ran dry" in notice and "2 all solved" in notice
    assert selection.dry_notice(step=5) is None  # once per dry spell


def test_a_pass_of_skips_stops_the_skipping_for_the_rest_of_the_take():
    """Every row flat but one never seen: p at its floor skips nearly all; a take never scans more than one
    pass's worth of skips before it takes what comes."""
    settings = SelectionSettings(explore_start=0.05, explore_min=0.05)
    selection = Selection(50, seed=1, settings=settings, accuracy=None)
    for row in range(50):
        for step in range(6):
            visit(selection.history, row, [0, 0], step)  # failed 6 times: kept with 0.05^6
    selection.begin_step()
    stream = PromptStream(list(range(50)), seed=1, shuffle=True, selection=selection)
    assert selection.dry_now  # all visited and flat: no skipping at all
    selection.dry_now = False  # the guard itself: skipping forced on
    taken = stream.take(5)
    assert len(taken) == 5 and selection.skipped == 50


def test_state_round_trip_resumes_the_same_decisions():
    settings = SelectionSettings(explore_start=0.5)
    a = Selection(6, seed=3, settings=settings, accuracy=None)
    stream_a = PromptStream(list(range(6)), seed=3, shuffle=True, selection=a)
    rng = torch.Generator().manual_seed(0)
    for step in range(4):
        a.begin_step()
        ids = stream_a.take(3)
        rewards = torch.randint(0, 2, (3 * 4,), generator=rng).float()  # (P*G,)
        grouped = rewards.view(3, 4)
        flat = grouped.max(1).values == grouped.min(1).values
        a.observe(ids, rewards, flat, {}, step)
        a.end_step()
    saved = stream_a.state()
    b = Selection(6, seed=3, settings=settings, accuracy=None)
    stream_b = PromptStream(list(range(6)), seed=3, shuffle=True, selection=b)
    stream_b.load_state(saved)
    assert stream_b.state() == saved
    a.begin_step()
    b.begin_step()
    assert stream_a.take(12) == stream_b.take(12)
    assert stream_a.state() == stream_b.state()


def test_the_stream_off_is_the_plain_seeded_order():
    """With no selection the stream is the seeded reshuffle per pass it was, and its state the same two keys."""
    stream = PromptStream(list(range(5)), seed=11, shuffle=True)
    taken = stream.take(12)
    expected = []
    for epoch in range(3):
        order = list(range(5))
        random.Random(11 * 1_000_003 + epoch).shuffle(order)
        expected += order
    assert taken == expected[:12]
    assert stream.state() == {"epoch": 2, "index": 2}


def test_a_history_of_other_data_is_refused():
    h = PromptHistory(3)
    with pytest.raises(Exception, match="3 training rows, this run has 4"):
        PromptHistory(4).load_state(h.state())


def test_selection_under_torchrun_is_refused_by_name():
    from grpokit.config.schema import load_config
    from grpokit.rollout.selection import selection_for

    cfg = load_config(None, ["data.selection.mode=greso"])
    with pytest.raises(
        Exception, match="data.selection.mode=greso under torchrun \\(2 processes\\) is not done yet"
    ):
        selection_for(cfg, 10, ["math_accuracy"], world=2)
    chosen = selection_for(cfg, 10, ["math_accuracy"], world=1)
    assert chosen.accuracy == "math_accuracy" and chosen.history.n == 10 and not chosen.settings.refill
    assert (
        selection_for(load_config(None, []), 10, ["math_accuracy"], world=2) is None
    )  # off: nothing refused

"""The tool demo's numbers that docs/guides/multi-turn.md quotes come from `grpokit demo tools`: this reruns
the quoted command (on the warm-started model shipped with the package, so it takes a minute or two, not
the warm start's four) and fails when a quoted number no longer reproduces within the noise the page
states. The numbers and the noise are read from the page itself, so the page and this check cannot drift."""

import json
import re

import pytest
from paths import REPO

PAGE = REPO / "docs" / "guides" / "multi-turn.md"


def quoted() -> dict:
    """The page's quoted numbers (percentages as shares) and its stated noise."""
    text = PAGE.read_text()
    section = " ".join(text[text.index("## The tool-use demo") :].split())  # one space for every line break

    def find(pattern: str) -> tuple[float, ...]:
        m = re.search(pattern, section, re.S)
        assert m, f"{PAGE.name}: the tool demo's section no longer says {pattern!r}"
        return tuple(float(g) for g in m.groups())

    pct = r"([\d.]+)%"
    before = find(rf"\| after the warm start \| {pct} \(calls the tool in {pct}\) \| {pct} \|")
    after = find(rf"\| after 30 GRPO steps \(64 episodes each\) \| {pct} \(calls the tool in {pct}\) \| {pct} \(calls in {pct}\) \|")
    sampled = find(rf"Sampled accuracy during training: {pct} at step 1 \(the model calls in {pct} of episodes\),"
                   rf"\s+{pct} at step 10,\s+{pct} over the last 5 steps")  # fmt: skip
    number = r"(\d+(?:\.\d+)?(?:e-\d+)?)"
    (gap,) = find(rf"matched the sampler's within {number} at every step")
    held_out_noise, sampled_noise, gap_bound = find(
        rf"held-out accuracies and call shares are within {number} points.*?sampled ones within {number} points"
        rf".*?the log-prob gap below {number}"
    )
    return {
        "before": dict(zip(("tool", "called", "no_tool"), (v / 100 for v in before))),
        "after": dict(zip(("tool", "called", "no_tool", "no_tool_called"), (v / 100 for v in after))),
        "sampled": dict(zip(("step1", "step1_calls", "step10", "last5"), (v / 100 for v in sampled))),
        "gap": gap,
        "noise": {"held_out": held_out_noise / 100, "sampled": sampled_noise / 100, "gap": gap_bound},
    }


def test_the_page_states_every_number_and_its_noise():
    q = quoted()
    assert q["noise"]["held_out"] <= 0.05 and q["noise"]["sampled"] <= 0.1 and q["gap"] <= q["noise"]["gap"] <= 1e-3


@pytest.mark.slow
def test_the_quoted_tool_demo_numbers_reproduce(tmp_path, monkeypatch):
    from grpokit.cli.main import main

    q = quoted()
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))  # an empty cache: the shipped model, no warm start
    out = tmp_path / "demo_tools"
    assert main(["demo", "tools", "--output-dir", str(out), "train.tensorboard=false"]) == 0
    got = json.loads((out / "demo_results.json").read_text())
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    measured = {
        "before": {
            "tool": got["before"]["tool"]["accuracy"],
            "called": got["before"]["tool"]["called_tool"],
            "no_tool": got["before"]["no_tool"]["accuracy"],
        },
        "after": {
            "tool": got["after"]["tool"]["accuracy"],
            "called": got["after"]["tool"]["called_tool"],
            "no_tool": got["after"]["no_tool"]["accuracy"],
            "no_tool_called": got["after"]["no_tool"]["called_tool"],
        },
        "sampled": {
            "step1": steps[0]["accuracy"],
            "step1_calls": steps[0]["tools/calls_per_episode"],
            "step10": steps[9]["accuracy"],
            "last5": sum(s["accuracy"] for s in steps[-5:]) / 5,
        },
    }
    assert len(steps) == 30
    off = []
    for part, noise in (("before", "held_out"), ("after", "held_out"), ("sampled", "sampled")):
        for key, value in measured[part].items():
            if abs(value - q[part][key]) > q["noise"][noise] + 1e-9:
                off.append(f"{part}/{key}: measured {value:.1%}, the page quotes {q[part][key]:.1%}")
    gap = max(s["sampler_logprob_diff/max"] for s in steps)
    if gap > q["noise"]["gap"]:
        off.append(f"the log-prob gap reached {gap:.2g}, the page says below {q['noise']['gap']:g}")
    assert not off, "docs/guides/multi-turn.md's tool demo numbers no longer reproduce:\n" + "\n".join(off)

"""The parts of the multi-turn tests' episodes, one copy for every test that names them: a tool (count_digits), tool
parsers for the random tiny model (digit_parser, every_turn_calls), reward functions (used_tool, parity,
turns_reward), a 3-turn environment (Countdown), and ``segments``, which reads an episode's masks as runs.

Configs name them by module, "episode_parts:count_digits", and every process that runs them finds this module:
tests/ is on sys.path in the test process (pyproject's pytest pythonpath), in a spawned sampler process
(multiprocessing hands it the parent's sys.path), in a ``grpokit train`` subprocess the tests start with
PYTHONPATH=sys.path, and under torchrun (tests/torchrun.py puts tests/ on PYTHONPATH); .venv-vllm's pytest reads
the same pythonpath."""

from grpokit.rollout.envs import EnvStep
from grpokit.rollout.tools import ToolCall


def count_digits(text: str) -> int:
    """How many digits the text has.

    Args:
        text: any text
    """
    return sum(ch.isdigit() for ch in text)


def digit_parser(text: str) -> list[ToolCall]:
    """A turn with a digit calls count_digits on it (the random tiny model writes no JSON)."""
    return [ToolCall("count_digits", {"text": text})] if any(c.isdigit() for c in text) else []


def every_turn_calls(text: str) -> list[ToolCall]:
    """Every turn calls count_digits on its text (a turn cut at max_new_tokens calls nothing)."""
    return [ToolCall("count_digits", {"text": text})]


def used_tool(prompts, completions, **kw):
    """1 when the episode called a tool: its transcript (TRL's message lists) holds a tool message."""
    return [float(any(m["role"] == "tool" for m in c)) for c in completions]


def parity(prompts, completions, completion_ids, **kw):
    """1 when the model wrote an even number of tokens in all its turns: spread in most groups (for DAPO)."""
    return [float(len(ids) % 2 == 0) for ids in completion_ids]


def turns_reward(prompts, completions, turn_rewards, **kw):
    """The environment's per-turn rewards, summed: they reach reward functions as a column."""
    return [sum(r for r in rs if r is not None) for rs in turn_rewards]


class Countdown:
    """A game of 3 turns: each turn earns 1 when the model's text holds a digit."""

    def __init__(self):
        self.turn = 0

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.turn += 1
        reward = float(any(c.isdigit() for c in text))
        return EnvStep([{"role": "user", "content": f"turn {self.turn}"}], reward, done=self.turn >= 3)


def segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 list."""
    out, start = [], 0
    for t in range(1, len(mask) + 1):
        if t == len(mask) or mask[t] != mask[start]:
            out.append((mask[start], start, t))
            start = t
    return out

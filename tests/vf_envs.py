"""Local verifiers environments for the tests of grpokit.integrations.verifiers (issue 53 item 2), written as a
verifiers user writes them (a load_environment per environment; the classic API of verifiers 0.3): a
single-turn one whose rubric has two weighted functions, a tool one, and a multi-turn game with per-turn
rewards. Configs name them "verifiers:vf_envs:single_turn" (tests/ is on sys.path) or by this file's path."""

import verifiers as vf
from datasets import Dataset

QUESTIONS = [
    {"question": "2+3", "answer": "5"},
    {"question": "4+4", "answer": "8"},
    {"question": "1+6", "answer": "7"},
    {"question": "3+3", "answer": "6"},
]


def answer_text(completion) -> str:
    """The text of the model's last turn in a verifiers completion (message objects)."""
    for message in reversed(completion):
        if message.role == "assistant":
            return message.content or ""
    return ""


def correct_answer(completion, answer) -> float:
    """1 when the model's last turn holds the row's answer."""
    return float(answer in answer_text(completion))


def has_digit(completion) -> float:
    """1 when the model's last turn holds a digit."""
    return float(any(c.isdigit() for c in answer_text(completion)))


def single_turn(system_prompt: str = "Answer with a number.") -> vf.Environment:
    """One answer per row, scored by correct_answer (weight 1) and has_digit (weight 0.5)."""
    rubric = vf.Rubric(funcs=[correct_answer, has_digit], weights=[1.0, 0.5])
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(QUESTIONS),
        eval_dataset=Dataset.from_list(QUESTIONS[:2]),
        system_prompt=system_prompt,
        rubric=rubric,
    )


def count_digits(text: str) -> int:
    """How many digits the text has.

    Args:
        text: any text
    """
    return sum(ch.isdigit() for ch in text)


def used_tool(completion) -> float:
    """1 when the episode's transcript holds a tool result."""
    return float(any(m.role == "tool" for m in completion))


def tool_env(max_turns: int = 3) -> vf.Environment:
    """verifiers' ToolEnv with count_digits: a turn without a call ends it; used_tool (1) and has_digit (0.5)."""
    rubric = vf.Rubric(funcs=[used_tool, has_digit], weights=[1.0, 0.5])
    return vf.ToolEnv(
        tools=[count_digits], max_turns=max_turns, dataset=Dataset.from_list(QUESTIONS), rubric=rubric
    )


class Countdown(vf.MultiTurnEnv):
    """A game of 3 turns: the environment says 'turn k' after each; a turn earns 1 when it holds a digit (set
    on its trajectory step); the game's last word is its final_env_response."""

    async def env_response(self, messages, state, **kwargs):
        turn = len(state["trajectory"])
        if turn >= 3:
            state["final_env_response"] = [vf.UserMessage(content="game over")]
            return state["final_env_response"]
        return [vf.UserMessage(content=f"turn {turn}")]

    async def add_trajectory_step(self, state, trajectory_step):
        text = trajectory_step["completion"][-1].content or ""
        trajectory_step["reward"] = float(any(c.isdigit() for c in text))
        await super().add_trajectory_step(state, trajectory_step)


def turns_played(state) -> float:
    """How many model turns the game had."""
    return float(len(state["trajectory"]))


def game() -> vf.Environment:
    return Countdown(
        dataset=Dataset.from_list(QUESTIONS),
        rubric=vf.Rubric(funcs=[has_digit, turns_played], weights=[1.0, 0.0]),
        max_turns=5,
    )


def group_scored() -> vf.Environment:
    """A rubric function that scores the group together: refused by grpokit (each episode is scored alone)."""

    def best_of_group(completions, **kwargs) -> list[float]:
        return [1.0] * len(completions)

    return vf.SingleTurnEnv(dataset=Dataset.from_list(QUESTIONS), rubric=vf.Rubric(funcs=[best_of_group]))


def not_an_environment():
    return {"not": "an environment"}


class Forgetful(vf.MultiTurnEnv):
    """Asks each next turn with the first prompt alone (its get_prompt_messages drops the earlier turns)."""

    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content="again")]

    async def get_prompt_messages(self, state):
        return state["prompt"] if not state["trajectory"] else [*state["prompt"], vf.UserMessage(content="again")]


def forgetful() -> vf.Environment:
    return Forgetful(dataset=Dataset.from_list(QUESTIONS), rubric=vf.Rubric(funcs=[has_digit]), max_turns=3)

"""The environment of examples/environment-tools.yaml: a multiplication quiz that offers the model a tool.

The class's `tools` are described to the model by the chat template (as rollout.tools are) and each call
the model writes runs in grpokit's tool workers; then `step` sees the turn and the calls' results. A turn
with calls gets their results back (and nothing more from the quiz); a turn without one is an answer: the
right product ends the episode with reward 1, a wrong one gets a hint and one more try. `solved` is the
reward function: 1.0 when a turn was rewarded.
"""

import re

from grpokit.rollout.envs import EnvStep


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


class MultiplyQuiz:
    tools = [multiply]  # offered to the model; also "python" or "module:function" names, as rollout.tools

    def reset(self, row: dict) -> list[dict]:
        self.answer, self.tries = int(row["answer"]), 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str, tool_results: list[dict]) -> EnvStep:
        if tool_results:  # the model called the tool: it reads the results in its next turn
            return EnvStep()
        self.tries += 1
        numbers = re.findall(r"-?\d+", text.replace(",", ""))
        if numbers and int(numbers[-1]) == self.answer:
            return EnvStep(reward=1.0, done=True)
        if self.tries >= 2:
            return EnvStep(reward=0.0, done=True)
        return EnvStep([{"role": "user", "content": "That is not the product. Check it with the tool."}], reward=0.0)


def solved(prompts, completions, turn_rewards, **columns) -> list[float]:
    """1.0 for an episode in which the quiz rewarded a turn (the right product)."""
    return [float(any(r for r in rewards if r)) for rewards in turn_rewards]

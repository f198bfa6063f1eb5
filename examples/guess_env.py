"""The environment of examples/environment-guess.yaml: guess a number from 1 to 20 in a few turns.

reset(row) gives the row's prompt; step(text) reads the model's turn as a guess and answers "higher",
"lower" or ends the episode with reward 1 when the guess is the row's `secret`. `found` is the reward
function: 1.0 when a turn was rewarded (the number was found), else 0.0.
"""

import re

from grpokit.rollout.envs import EnvStep


class GuessNumber:
    def reset(self, row: dict) -> list[dict]:
        self.secret = int(row["secret"])
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str) -> EnvStep:
        numbers = re.findall(r"-?\d+", text)
        if not numbers:
            return EnvStep([{"role": "user", "content": "Answer with a number from 1 to 20."}], reward=0.0)
        guess = int(numbers[-1])
        if guess == self.secret:
            return EnvStep([], reward=1.0, done=True)
        hint = "higher" if guess < self.secret else "lower"
        return EnvStep([{"role": "user", "content": f"{guess} is wrong: {hint}."}], reward=0.0)


def found(prompts, completions, turn_rewards, **columns) -> list[float]:
    """1.0 for an episode in which the environment rewarded a turn (the number was found)."""
    return [float(any(r for r in rewards if r)) for rewards in turn_rewards]

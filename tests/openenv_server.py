"""An OpenEnv environment served on the loopback for the tests (python tests/openenv_server.py PORT): each
session's environment says "say a digit", rewards a turn holding a digit, ends after two steps. Its reset
takes a seed: seed 7 makes its steps raise (the server answers an error), seed 13 makes them hang."""

from __future__ import annotations

import sys
import time

from openenv.core.env_server import Action, Environment, Observation, State, create_app


class Say(Action):
    message: str


class Heard(Observation):
    text: str


class DigitGame(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.turns, self.seed = 0, None

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> Heard:
        self.turns, self.seed = 0, seed
        return Heard(text="say a digit", done=False, reward=None)

    def step(self, action: Say, timeout_s: float | None = None, **kwargs) -> Heard:
        if self.seed == 7:
            raise RuntimeError("the game broke")
        if self.seed == 13:
            time.sleep(60)
        self.turns += 1
        digit = any(c.isdigit() for c in action.message)
        return Heard(
            text=f"turn {self.turns}: {'a digit' if digit else 'no digit'}",
            done=self.turns >= 2,
            reward=float(digit),
        )

    @property
    def state(self) -> State:
        return State(step_count=self.turns)


app = create_app(DigitGame, Say, Heard, max_concurrent_envs=64)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")

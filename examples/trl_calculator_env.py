"""The environment of examples/environment-trl.yaml, written as TRL 1.16's environment_factory takes it: each
episode has its own instance, reset(**row) starts it, its public methods are the model's tools (run on that
instance), get_reward() scores the episode. The same class runs under grpokit with
`GRPOTrainer(..., environment_factory=Calculator)` in a TRL script, or as `rollout.environment:
trl:examples/trl_calculator_env.py:Calculator` in a config (grpokit.integrations.trl_environment)."""


class Calculator:
    def reset(self, **row) -> str | None:
        self.answer, self.products = int(row["answer"]), []
        return None  # a string here would be appended to the prompt's last message

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        """
        self.products.append(a * b)
        return a * b

    def get_reward(self) -> float:
        """1 when the episode computed the answer with the tool."""
        return float(self.answer in self.products)


def used_the_tool(environments, **kwargs) -> list[float]:
    """A TRL reward function over the episodes' environments (a copy of each instance at its end)."""
    return [float(bool(env.products)) for env in environments]

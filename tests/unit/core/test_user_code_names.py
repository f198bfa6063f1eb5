"""grpokit.core.user_code.name_of: a function or class given in code is kept by the name that finds it again, or
refused naming where it was given (rollout.tools put in a config as functions, TRL's tools= keyword)."""

from __future__ import annotations

import pytest

from grpokit.config.schema import load_config
from grpokit.core.user_code import UserCodeError, name_of
from grpokit.rollout.episodes import name_callables


def top_level(text: str) -> int:
    """A tool.

    Args:
        text: anything
    """
    return len(text)


class Game:
    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]


def test_top_level_functions_and_classes_are_named_and_others_refused_where_given():
    assert name_of(top_level, "x") == f"{__name__}:top_level" and name_of(Game, "x") == f"{__name__}:Game"
    assert name_of(len, "x") == "builtins:len"

    def nested(text: str) -> int:
        return 0

    for obj, shown in ((nested, "nested"), (lambda t: 0, "<lambda>"), (Game().reset, "Game.reset")):
        with pytest.raises(UserCodeError, match=rf"tools\[2\]: \S*{shown} cannot be found again by name"):
            name_of(obj, "tools[2]")
    cfg = load_config(None, [])
    cfg.rollout.tools = [top_level, "python"]
    cfg.rollout.environment = Game
    name_callables(cfg.rollout)
    assert (cfg.rollout.tools, cfg.rollout.environment) == ([f"{__name__}:top_level", "python"], f"{__name__}:Game")
    cfg.rollout.tools = ["python", nested]
    with pytest.raises(UserCodeError, match=r"rollout.tools\[1\]: \S*nested cannot be found"):
        name_callables(cfg.rollout)

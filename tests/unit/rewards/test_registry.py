"""Reward-name problems are config errors naming the `rewards[i]` entry and saying what to do."""

import pytest

from grpokit.config.schema import ConfigError, RewardSpec
from grpokit.rewards import (
    RewardConfigError,
    format_lenient,
    format_strict,
    math_accuracy,
    resolve_reward,
    resolve_reward_specs,
)

GOOD = "def fn(prompts, completions, **kw):\n    return [1.0] * len(completions)\n"


@pytest.fixture
def files(tmp_path, monkeypatch):
    """User reward files in the current directory, as a user's config would name them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.py").write_text(
        GOOD
        + "NUMBER = 3\n\ndef make(prefix='a'):\n    return lambda prompts, completions, **kw: [0.0] * len(completions)\n"
    )
    (tmp_path / "syntax.py").write_text("def fn(:\n")
    (tmp_path / "raises.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "folder.py").mkdir()
    return tmp_path


# name, kwargs, words the one-line message must hold
BAD = [
    (
        "math_acuracy",
        {},
        ["rewards[1].name='math_acuracy'", "unknown reward", "did you mean 'math_accuracy'"],
    ),
    ("nonsense", {}, ["rewards[1].name='nonsense'", "unknown reward", "module:function", "format_strict"]),
    ("good.py", {}, ["rewards[1].name='good.py'", "write 'good.py:function'"]),
    (
        "missing.py:fn",
        {},
        ["rewards[1].name='missing.py:fn'", "file missing.py not found", "existing .py file"],
    ),
    ("folder.py:fn", {}, ["file folder.py is a folder"]),
    (
        "syntax.py:fn",
        {},
        ["rewards[1].name='syntax.py:fn'", "running syntax.py failed: SyntaxError", "fix the file"],
    ),
    ("raises.py:fn", {}, ["running raises.py failed: ModuleNotFoundError", "no_such_dependency_xyz"]),
    ("no_such_module_xyz:fn", {}, ["importing module 'no_such_module_xyz' failed", "PYTHONPATH"]),
    (
        "good.py:nope",
        {},
        ["rewards[1].name='good.py:nope'", "has no attribute 'nope'", "it defines: fn, make"],
    ),
    ("good.py:NUMBER", {}, ["good.py's NUMBER is not a function (a int value)"]),
    ("grpokit.rewards.format:nope", {}, ["grpokit.rewards.format has no attribute 'nope'"]),
    (":fn", {}, ["one side of ':' is empty"]),
    (
        "overlong_penalty",
        {"max_len": 20, "bufer_len": 4},
        [
            "rewards[1].kwargs",
            "unknown parameter 'bufer_len'",
            "did you mean 'buffer_len'",
            "takes max_len, buffer_len",
        ],
    ),
    ("overlong_penalty", {"buffer_len": 4}, ["rewards[1].kwargs", "missing a required argument: 'max_len'"]),
    (
        "overlong_penalty",
        {"max_len": 10, "buffer_len": 20},
        ["rewards[1].kwargs", "overlong_penalty rejected them"],
    ),
    (
        "math_accuracy",
        {"answer_colum": "x"},
        ["unknown parameter 'answer_colum'", "did you mean 'answer_column'"],
    ),
    ("format_strict", {"strict": True}, ["rewards[1].kwargs", "format_strict takes no parameters"]),
    ("good.py:fn", {"x": 1}, ["good.py:fn is a reward function, not a factory", "remove them"]),
    ("good.py:make", {"prefx": "b"}, ["unknown parameter 'prefx'", "did you mean 'prefix'"]),
]


@pytest.mark.parametrize("name,kwargs,words", BAD, ids=[f"{b[0]}{sorted(b[1])}" for b in BAD])
def test_reward_problems_are_config_errors_naming_the_entry(files, name, kwargs, words):
    specs = [RewardSpec(name="format_lenient"), RewardSpec(name=name, kwargs=kwargs)]
    with pytest.raises(ConfigError) as info:
        resolve_reward_specs(specs)
    message = str(info.value)
    assert isinstance(info.value, RewardConfigError) and "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_resolve_reward_reports_the_same_problems_without_an_index(files):
    with pytest.raises(RewardConfigError, match=r"reward 'missing.py:fn': file missing.py not found"):
        resolve_reward("missing.py:fn")
    with pytest.raises(RewardConfigError, match=r"unknown parameter 'bufer_len'"):
        resolve_reward("overlong_penalty", max_len=20, bufer_len=4)


def test_entries_resolve_in_order_with_their_weights(files):
    specs = [
        RewardSpec(name="math_accuracy", weight=1.0),
        {"name": "format", "weight": 0.2},
        RewardSpec(name="good.py:make", weight=0.5, kwargs={"prefix": "b"}),
        RewardSpec(name="grpokit.rewards.format:format_lenient", weight=2),
    ]
    resolved = resolve_reward_specs(specs)
    assert [(n, w) for n, _, w in resolved] == [
        ("math_accuracy", 1.0),
        ("format", 0.2),
        ("good.py:make", 0.5),
        ("grpokit.rewards.format:format_lenient", 2.0),
    ]
    assert resolved[0][1] is math_accuracy and resolved[1][1] is format_strict
    assert resolved[3][1] is format_lenient
    assert resolved[2][1](None, ["x", "y"]) == [0.0, 0.0]


def test_repeated_entries_and_bad_weights_are_config_errors(files):
    with pytest.raises(
        RewardConfigError, match=r"rewards\[1\].name='format': the same reward as rewards\[0\]"
    ):
        resolve_reward_specs([RewardSpec(name="format"), RewardSpec(name="format")])
    with pytest.raises(RewardConfigError, match=r"rewards\[0\].weight=nan: expected a finite number"):
        resolve_reward_specs([RewardSpec(name="format", weight=float("nan"))])

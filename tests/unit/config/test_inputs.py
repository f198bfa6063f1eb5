"""Config input as written (grpokit.core.yaml_io) and one validation path for the CLI and the Python API."""

import dataclasses
from pathlib import Path

import pytest

from grpokit import GRPOTrainer
from grpokit.cli.main import main
from grpokit.config.schema import (
    AlgoConfig,
    Config,
    ConfigError,
    DataConfig,
    OptimConfig,
    RolloutConfig,
    TrainConfig,
    load_config,
    save_config,
    validated,
)


def test_paths_and_names_keep_the_text_as_written(tmp_path):
    (tmp_path / "cfg.yaml").write_text(
        "train:\n  output_dir: 1e3\n  steps: 010\ndata:\n  train: 007\n  system_prompt: 0x1F\n"
        "optim:\n  lr: 1e-6\n  warmup_steps: 0o10\nmodel:\n  name_or_path: 2.50\n"
    )
    cfg = load_config(tmp_path / "cfg.yaml")
    assert (cfg.train.output_dir, cfg.data.train, cfg.data.system_prompt) == ("1e3", "007", "0x1F")
    assert cfg.model.name_or_path == "2.50"
    # numbers stay numbers where a number is asked for (YAML 1.2: 010 is ten, 0o10 is eight)
    assert (cfg.train.steps, cfg.optim.lr, cfg.optim.warmup_steps) == (10, 1e-6, 8)
    assert type(cfg.train.steps) is int and type(cfg.optim.lr) is float
    over = load_config(None, ["train.output_dir=1e3", "data.train=007", "optim.lr=1e-6", "data.eval=.5"])
    assert (over.train.output_dir, over.data.train, over.optim.lr, over.data.eval) == ("1e3", "007", 1e-6, ".5")
    save_config(over, tmp_path / "saved.yaml")  # plain numbers again: the resolved config writes and reads back
    assert load_config(tmp_path / "saved.yaml").train.output_dir == "1e3"


def test_yes_no_on_off_are_text_not_booleans():
    cfg = load_config(None, ["data.system_prompt=no", "train.output_dir=on"])
    assert (cfg.data.system_prompt, cfg.train.output_dir) == ("no", "on")
    with pytest.raises(ConfigError, match="model.trust_remote_code: expected true or false, got 'yes'"):
        load_config(None, ["model.trust_remote_code=yes"])


@pytest.mark.parametrize(
    "text, words",
    [
        ("optim:\n  lr: 1e-6\n  lr: 2e-6\n", ["'lr'", "line 2 and line 3"]),
        ("optim:\n  lr: 1e-6\ntrain:\n  steps: 3\noptim:\n  epochs: 2\n", ["'optim'", "line 1 and line 5"]),
        ("rewards:\n  - name: math_accuracy\n    weight: 1\n    weight: 2\n", ["'weight'", "line 3 and line 4"]),
    ],
    ids=["key", "section", "in-a-list"],
)
def test_a_key_given_twice_is_refused_through_the_cli(tmp_path, capsys, text, words):
    (tmp_path / "cfg.yaml").write_text(text)
    assert main(["train", str(tmp_path / "cfg.yaml"), f"train.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "given twice" in err and "cfg.yaml" in err and "Traceback" not in err
    for word in words:
        assert word in err
    assert not (tmp_path / "run").exists()


def test_a_non_utf8_config_is_a_named_error(tmp_path, capsys):
    (tmp_path / "cfg.yaml").write_bytes(b"data:\n  system_prompt: caf\xe9\n")
    assert main(["train", str(tmp_path / "cfg.yaml")]) == 2
    err = capsys.readouterr().err
    assert "cfg.yaml is not UTF-8" in err and "line 2" in err and "iconv" in err


def with_(section: str, **changes) -> Config:
    cfg = Config()
    setattr(cfg, section, dataclasses.replace(getattr(cfg, section), **changes))
    return cfg


# Configs built in code, each wrong in one way: GRPOTrainer refuses them with the CLI's message,
# before anything loads (the model folder does not even exist).
API_CASES = [
    ("mini-batches-do-not-divide", with_("optim", mini_batches=3), "optim.mini_batches=3 must divide"),
    ("steps-as-text", with_("train", steps="10"), "train.steps: expected an integer, got '10'"),
    ("group-of-one", with_("rollout", group_size=1), "rollout.group_size=1"),
    ("lr-negative", with_("optim", lr=-1.0), "optim.lr=-1.0 is out of range"),
    ("preset-typo", with_("algo", preset="grop"), "algo.preset='grop'"),
    ("template-typo", with_("data", template="chatml"), "data.template='chatml'"),
    ("no-rewards", dataclasses.replace(Config(), rewards=[]), "at least one reward"),
    ("reward-as-text", dataclasses.replace(Config(), rewards=["math_accuracy"]), "rewards[0]: expected a mapping"),
    ("section-missing", dataclasses.replace(Config(), optim=None), "optim: expected a mapping"),
    ("unknown-report-to", with_("train", report_to="comet"), "comet"),
    ("bool-as-number", with_("model", trust_remote_code=1), "model.trust_remote_code: expected true or false"),
    ("top-p-zero", with_("rollout", top_p=0.0), "rollout.top_p=0.0"),
]


@pytest.mark.parametrize("cfg, words", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_the_api_validates_the_config_it_is_given(tmp_path, cfg, words):
    cfg.model.name_or_path = str(tmp_path / "no_model")
    cfg.train.output_dir = str(tmp_path / "run")
    with pytest.raises(ConfigError) as e:
        GRPOTrainer(cfg)
    assert words in str(e.value)
    assert not (tmp_path / "run").exists()


def test_a_config_built_in_code_with_paths_and_good_values_passes():
    cfg = Config(
        data=DataConfig(train=Path("data/train.jsonl")),
        train=TrainConfig(output_dir=Path("runs/x"), steps=3),
        rollout=RolloutConfig(group_size=4, prompts_per_step=2),
        optim=OptimConfig(mini_batches=2, lr=1e-5),
        algo=AlgoConfig(preset="dapo"),
    )
    checked = validated(cfg)
    assert (checked.train.output_dir, checked.data.train) == ("runs/x", "data/train.jsonl")
    with pytest.raises(ConfigError, match="expected a grpokit.config.schema.Config, got dict"):
        validated({"optim": {"lr": 1e-6}})

"""Config: YAML + dotted overrides, validation messages that name the key, preset resolution."""

import pytest

from grpokit.config.schema import ConfigError, load_config, parse_override, resolve_algo


def write(tmp_path, text):
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


def test_yaml_and_overrides_merge(tmp_path):
    p = write(tmp_path, "optim:\n  lr: 1e-6\nrollout:\n  group_size: 4\n")
    cfg = load_config(p, ["rollout.group_size=16", "algo.preset=dapo", "train.output_dir=/tmp/x"])
    assert cfg.optim.lr == 1e-6  # YAML 1.1 would read 1e-6 as a string; we read a float
    assert cfg.rollout.group_size == 16
    assert cfg.algo.preset == "dapo"
    assert cfg.train.output_dir == "/tmp/x"


def test_override_values_are_typed():
    assert parse_override("optim.lr=3e-4") == (["optim", "lr"], 3e-4)
    assert parse_override("algo.dynamic_sampling=true") == (["algo", "dynamic_sampling"], True)
    assert parse_override("lora.target_modules=[q_proj,v_proj]") == (
        ["lora", "target_modules"],
        ["q_proj", "v_proj"],
    )


def test_unknown_key_names_nearest(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.group_sise'.*'group_size'"):
        load_config(None, ["rollout.group_sise=8"])
    p = write(tmp_path, "optimm:\n  lr: 1\n")
    with pytest.raises(ConfigError, match=r"cfg.yaml.*unknown config key 'optimm'.*'optim'"):
        load_config(p)


def test_bad_values_rejected():
    with pytest.raises(ConfigError, match=r"rollout.group_size: expected an integer, got 'many'"):
        load_config(None, ["rollout.group_size=many"])
    with pytest.raises(ConfigError, match=r"algo.agg='token_mean'.*Did you mean 'token-mean'"):
        load_config(None, ["algo.agg=token_mean"])
    with pytest.raises(ConfigError, match=r"algo.preset='grop'.*'grpo'"):
        load_config(None, ["algo.preset=grop"])


def test_group_size_one_rejected():
    with pytest.raises(ConfigError, match=r"rollout.group_size=1: GRPO needs at least 2"):
        load_config(None, ["rollout.group_size=1"])


def test_mini_batches_must_divide_batch():
    with pytest.raises(ConfigError, match=r"optim.mini_batches=3 must divide the rollout batch"):
        load_config(None, ["rollout.prompts_per_step=4", "rollout.group_size=4", "optim.mini_batches=3"])


def test_preset_resolution_and_override():
    cfg = load_config(None, ["algo.preset=dapo", "rollout.max_new_tokens=100"])
    algo = resolve_algo(cfg)
    assert (algo.ratio.eps_low, algo.ratio.eps_high, algo.loss.agg, algo.kl.beta) == (
        0.2,
        0.28,
        "token-mean",
        0.0,
    )
    assert algo.batch.dynamic_sampling and algo.batch.overlong_shaping and algo.batch.mask_truncated
    assert algo.batch.overlong_buffer == 20  # DAPO's buffer is 0.2 of the length limit
    cfg = load_config(None, ["algo.preset=dapo", "algo.beta=0.01"])
    assert resolve_algo(cfg).kl.beta == 0.01
    cfg = load_config(None, ["algo.preset=dr_grpo", "rollout.max_new_tokens=123"])
    assert resolve_algo(cfg).loss.norm_len == 123  # Dr. GRPO's constant is the length limit by default


def test_missing_config_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/cfg.yaml")


def test_rewards_list(tmp_path):
    p = write(
        tmp_path,
        "rewards:\n  - name: math_accuracy\n    weight: 1.0\n  - name: format_strict\n    weight: 0.2\n",
    )
    cfg = load_config(p)
    assert [(r.name, r.weight) for r in cfg.rewards] == [("math_accuracy", 1.0), ("format_strict", 0.2)]
    p = write(tmp_path, "rewards:\n  - name: math_accuracy\n    wieght: 1.0\n")
    with pytest.raises(ConfigError, match=r"rewards\[0\].wieght.*'weight'"):
        load_config(p)



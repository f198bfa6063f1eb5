"""OUTPUT/config.yaml is the run (grpokit.config.run_file): grpokit train OUTPUT/config.yaml loads the same config and
trains the same weights; a run built in Python records its model, rows and reward functions, writes what a setting
can load again as that setting, and says (in the file, once on stdout) what cannot be, which a reload then refuses
by name until it is given again. At 37165e5 the file could not be loaded ("unknown config key 'resolved_algo'") and
a Python run recorded model.name_or_path: demo, data.train: '' and rewards: [math_accuracy]."""

import hashlib
import importlib.util
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tiny_model import ADDITION_ROWS, make_tiny_model, save_tiny_model

from grpokit import GRPOTrainer
from grpokit.cli.main import main
from grpokit.config.run_file import PLACEHOLDER, given_in_code
from grpokit.config.schema import ConfigError, config_to_dict, load_config, resolve_algo
from grpokit.rewards.format import format_lenient

TRAIN = ["data.template=plain", "rollout.max_new_tokens=4", "rollout.group_size=2", "rollout.prompts_per_step=2",
         "train.steps=1", "train.report_to=none", "train.tensorboard=false", "eval.enabled=false",
         "algo.eps_high=0.28"]  # fmt: skip


def _weights(run) -> dict[str, torch.Tensor]:
    (final,) = sorted((run / "checkpoints").glob("step_*"))[-1:]
    return load_file(final / "model.safetensors")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("runfile")
    model = save_tiny_model(w / "model")
    (w / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ADDITION_ROWS))
    (w / "lengths.py").write_text("def chars(completions, **kw):\n    return [float(sum(map(ord, c)) % 3) for c in completions]\n")
    return {"w": w, "m": model, "d": w / "data.jsonl", "r": f"rewards=[{{name: '{w / 'lengths.py'}:chars'}}]"}


def test_config_yaml_reloads_as_the_same_run_and_trains_the_same_weights(world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    given = [f"model.name_or_path={world['m']}", f"data.train={world['d']}", world["r"], *TRAIN]
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["train", *given, "--output-dir", str(first)]) == 0
    reloaded = load_config(first / "config.yaml")
    assert config_to_dict(reloaded) == config_to_dict(load_config(None, [*given, f"train.output_dir={first}"]))
    recorded = yaml.safe_load((first / "config.yaml").read_text())["resolved_algo"]
    assert recorded == resolve_algo(reloaded).flat() and recorded["eps_high"] == 0.28
    # the file unchanged, in another folder: the same run, bit for bit
    assert main(["train", str(first / "config.yaml"), "--output-dir", str(second)]) == 0
    ours, theirs = _weights(first), _weights(second)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert not all(torch.equal(ours[k], load_file(world["m"] / "model.safetensors")[k]) for k in ours)  # it trained


def test_a_config_yaml_whose_algorithm_resolves_otherwise_now_is_refused(world, tmp_path):
    """resolved_algo is checked against what the file's settings resolve to now (a preset changed since)."""
    values = {"model": {"name_or_path": str(world["m"])}, "algo": {"preset": "grpo"},
              "resolved_algo": {**resolve_algo(load_config(None, [])).flat(), "eps_high": 0.28}}  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(ConfigError, match=r"eps_high: 0.28 recorded, 0.2 now.*algo.eps_high=0.28"):
        load_config(path)
    with pytest.raises(ConfigError, match="eps_high: 0.28 recorded"):  # the file alone is checked, whatever follows
        load_config(path, ["algo.eps_high=0.28"])
    values["algo"]["eps_high"] = 0.28  # the file says it: consistent; an override then changes the run on purpose
    path.write_text(yaml.safe_dump(values))
    assert resolve_algo(load_config(path, ["algo.eps_high=0.3"])).ratio.eps_high == 0.3


def _file_reward(folder):
    """A reward function loaded from a file, as rewards: [file.py:function] loads one (module not importable)."""
    (folder / "my_rewards.py").write_text("def brevity(completions, **kw):\n    return [0.0 for _ in completions]\n")
    spec = importlib.util.spec_from_file_location("grpokit_user_my_rewards", folder / "my_rewards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import sys

    sys.modules[spec.name] = module
    return module.brevity


def test_a_run_built_in_python_records_what_it_was_given(world, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.chdir(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(world["m"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(world["m"])
    brevity = _file_reward(tmp_path)
    rewards = [("lenient", format_lenient, 0.5), ("brevity", brevity, 2.0),
               ("zero", lambda completions, **kw: [0.0] * len(completions), 1.0)]  # fmt: skip
    cfg = load_config(None, [*TRAIN, f"train.output_dir={tmp_path / 'run'}"])
    GRPOTrainer(cfg, model=model, tokenizer=tokenizer, train_rows=ADDITION_ROWS, reward_functions=rewards).train()
    out = capsys.readouterr().out
    text = (tmp_path / "run" / "config.yaml").read_text()
    values = yaml.safe_load(text)
    # the model came from a folder: that folder, its dtype and device
    assert values["model"]["name_or_path"] == str(world["m"])
    assert (values["model"]["dtype"], values["model"]["device"]) == ("float32", "cpu")
    record = values["given_in_code"]
    assert record["model"]["class"] == "transformers.models.qwen2.modeling_qwen2.Qwen2ForCausalLM"
    assert record["model"]["weights_from"] == str(world["m"])
    # the rows: count and sha256 over their JSON lines (sorted keys), by hand
    lines = "".join(json.dumps(r, sort_keys=True) + "\n" for r in ADDITION_ROWS)
    digest = hashlib.sha256(lines.encode()).hexdigest()
    assert record["train_rows"]["rows"] == len(ADDITION_ROWS) and record["train_rows"]["sha256"] == digest
    assert values["data"]["train"] == f"{PLACEHOLDER}: {len(ADDITION_ROWS)} rows, sha256 {digest}>"
    # each reward: its module, name and weight; a module's or a file's function by name, a lambda a placeholder
    assert [(r["name"], r["module"], r["function"], r["weight"]) for r in record["rewards"]] == [
        ("lenient", "grpokit.rewards.format", "format_lenient", 0.5),
        ("brevity", "grpokit_user_my_rewards", "brevity", 2.0),
        ("zero", __name__, "test_a_run_built_in_python_records_what_it_was_given.<locals>.<lambda>", 1.0),
    ]
    assert values["rewards"][:2] == [
        {"name": "grpokit.rewards.format:format_lenient", "weight": 0.5, "kwargs": {}},
        {"name": f"{tmp_path / 'my_rewards.py'}:brevity", "weight": 2.0, "kwargs": {}},
    ]
    assert values["rewards"][2]["name"].startswith(PLACEHOLDER) and values["rewards"][2]["weight"] == 1.0
    # what cannot be loaded again: in the file's first lines and once on stdout
    assert "NOT RELOADABLE" in text.split("model:")[0] and "rewards[2].name" in text.split("model:")[0]
    assert out.count("cannot load again") == 1 and "data.train" in out and "rewards[2].name" in out
    # the CLI refuses the placeholders by name; given again (in code here), the run builds
    path = tmp_path / "run" / "config.yaml"
    assert main(["train", str(path), "--output-dir", str(tmp_path / "again")]) == 2
    assert "data.train='<given in code: 16 rows" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"rewards\[2\].name=.*pass reward_functions="):
        GRPOTrainer(load_config(path, [f"train.output_dir={tmp_path / 'again'}"]), train_rows=ADDITION_ROWS)
    GRPOTrainer(load_config(path, [f"train.output_dir={tmp_path / 'again'}"]), train_rows=ADDITION_ROWS,
                reward_functions=rewards)  # fmt: skip


def test_a_model_built_in_code_is_a_placeholder_with_its_class():
    model, tokenizer = make_tiny_model("qwen2", seed=0)
    record = given_in_code(load_config(None, []), model=model, tokenizer=tokenizer)
    assert record["model"]["weights_from"].startswith("built in code")
    assert record["model"]["reloadable_as"] is None and record["model"]["not_reloadable"] == "built in code"

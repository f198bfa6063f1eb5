"""More bad inputs that used to end in a generic exit 1, most after the model had loaded: each is now one
named line with exit 2, found before any weight is read (model folder, tokenizer, device, seed,
prompt lengths against the model's positions, output folder, tracker login); and Ctrl-C at start-up."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_model import ADDITION_ROWS, make_tiny_model, save_tiny_model

from grpokit import GRPOTrainer, load_config
from grpokit.cli.main import main
from grpokit.config.schema import ConfigError

BASE = [
    "model.name_or_path={m}",
    "data.train={d}",
    "train.output_dir={out}",
    "data.template=plain",
    "rollout.max_new_tokens=6",
    "rollout.group_size=4",
    "rollout.prompts_per_step=2",
    "train.report_to=none",
]
LONG = "1+" * 125 + "1="  # 252 tokens: within data.max_prompt_tokens=512, not with 6 more in 256 positions

# (id, overrides, environment, words the one line must contain)
CASES = [
    ("device-gpu", ["model.device=gpu"], {}, ["model.device='gpu'", "cuda:N"]),
    ("seed-huge", ["train.seed=1180591620717411303424"], {}, ["train.seed=1180591620717411303424", "2**63"]),
    ("no-tokenizer-files", ["model.name_or_path={w}/no_tokenizer"], {}, ["no_tokenizer", "no tokenizer files"]),
    ("no-weights", ["model.name_or_path={w}/no_weights"], {}, ["no_weights", "no weights there"]),
    ("truncated-weights", ["model.name_or_path={w}/truncated"], {}, ["truncated", "model.safetensors", "truncated"]),
    ("missing-shard", ["model.name_or_path={w}/sharded"], {}, ["sharded", "model-00002-of-00002.safetensors"]),
    ("output-dangling-link", ["train.output_dir={w}/dangling"], {}, ["dangling", "symbolic link", "does not exist"]),
    ("wandb-no-login", ["train.report_to=wandb"], {"WANDB_API_KEY": None, "WANDB_MODE": None, "HOME": "{w}"},
     ["wandb", "WANDB_API_KEY", "WANDB_MODE=offline"]),
    ("prompt-beyond-positions", ["data.train={w}/long.jsonl"], {},
     ["long.jsonl", "row index 1 has 252 prompt tokens", "256 positions", "rollout.max_new_tokens="]),
    ("eval-prompt-beyond-positions", ["data.eval={w}/long.jsonl", "eval.max_new_tokens=10"], {},
     ["data.eval=", "row index 1", "eval.max_new_tokens=10"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("early")
    model = save_tiny_model(w / "model")
    rows = ADDITION_ROWS
    (w / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (w / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [rows[0], {"prompt": LONG, "answer": "2"}]))
    shutil.copytree(model, w / "no_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (w / "no_tokenizer" / name).unlink(missing_ok=True)
    shutil.copytree(model, w / "no_weights")
    (w / "no_weights" / "model.safetensors").unlink()
    shutil.copytree(model, w / "truncated")
    data = (w / "truncated" / "model.safetensors").read_bytes()
    (w / "truncated" / "model.safetensors").write_bytes(data[: len(data) // 2])
    shutil.copytree(model, w / "sharded")
    (w / "sharded" / "model.safetensors").rename(w / "sharded" / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (w / "sharded" / "model.safetensors.index.json").write_text(json.dumps(index))
    (w / "dangling").symlink_to(w / "nowhere")
    return {"m": str(model), "d": str(w / "good.jsonl"), "w": str(w)}


@pytest.mark.parametrize("args, env, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_named_error_before_the_model_loads(world, tmp_path, monkeypatch, capsys, args, env, words):
    if "train.report_to=wandb" in args:  # without the package the refusal is that one (the wandb extra's case)
        pytest.importorskip("wandb", reason="the login check needs the wandb extra: pip install 'grpokit[wandb]'")
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value.format(**world))
    monkeypatch.delenv("GRPOKIT_DEBUG", raising=False)
    fill = {**world, "out": str(tmp_path / "run")}
    code = main(["train", *[a.format(**fill) for a in BASE + args]])
    err = capsys.readouterr().err
    assert code == 2, err
    for word in words:
        assert word in err, (word, err)
    assert "Traceback" not in err and "Loading weights" not in err
    assert len([line for line in err.splitlines() if line.startswith("grpokit")]) == 1, err
    assert not (tmp_path / "run").exists()


def test_the_api_checks_prompt_lengths_against_a_given_model(tmp_path):
    model, tok = make_tiny_model("qwen2", seed=0)  # 256 positions
    cfg = load_config(None, [f"train.output_dir={tmp_path / 'run'}", "data.template=plain", "rollout.max_new_tokens=7"])
    rows = [{"prompt": "1+1="}, {"prompt": "2+2="}, {"prompt": LONG}]
    with pytest.raises(ConfigError, match=r"row index 2 has 252 prompt tokens, .* lower rollout.max_new_tokens to 4"):
        GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=rows, reward_functions=[("r", lambda **k: [], 1.0)])
    cfg.rollout.max_new_tokens = 4  # 252 + 4 = 256: fits exactly
    GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=rows, reward_functions=[("r", lambda **k: [], 1.0)])


def test_ctrl_c_while_starting_is_one_line_and_exit_130(world, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("GRPOKIT_DEBUG", None)
    argv = [a.format(**world, out=str(tmp_path / "run")) for a in BASE]
    proc = subprocess.Popen([sys.executable, "-m", "grpokit", "train", *argv], env=env, stderr=subprocess.PIPE, text=True)
    maps, deadline = Path(f"/proc/{proc.pid}/maps"), time.monotonic() + 60
    while "libtorch" not in maps.read_text() and time.monotonic() < deadline:  # torch is being imported
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and ("interrupted" in err or "SIGINT" in err), err

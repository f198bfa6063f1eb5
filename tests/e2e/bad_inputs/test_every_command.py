"""Bad model, device, file and flag inputs of every command (train, sft, sample, eval, view) that used to end in a
generic exit 1, a multi-line error or a silent exit 0: each is now one named line and exit 2, found before any
weight is read (config.json built by transformers, the model built on the meta device for the attention
implementation, the weights' shapes and the LoRA targets); the Python API raises the same ConfigError."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from tiny_model import ADDITION_ROWS, make_tiny_model, save_tiny_model

from grpokit import GRPOTrainer
from grpokit.cli.main import main
from grpokit.config.schema import Config, ConfigError, LoraConfig, ModelConfig
from grpokit.model.loading import prepare_policy

TRAIN = [
    "model.name_or_path={m}",
    "data.train={d}",
    "train.output_dir={out}",
    "data.template=plain",
    "rollout.max_new_tokens=4",
    "rollout.group_size=2",
    "rollout.prompts_per_step=2",
    "train.steps=1",
    "train.report_to=none",
]
SFT = ["model.name_or_path={m}", "data.train={s}", "train.output_dir={out}", "train.steps=1", "train.report_to=none"]
SAMPLE = ["model.name_or_path={m}", "data.train={d}", "output.dir={out}", "sample.n=2", "sample.max_new_tokens=2"]


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("exit2")
    model = save_tiny_model(w / "model")
    rows = ADDITION_ROWS
    (w / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft = [{"prompt": r["prompt"], "completion": r["answer"]} for r in rows]
    (w / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    (w / "a_file").write_text("not a folder\n")

    def copy(name, **changes):
        shutil.copytree(model, w / name)
        _edit_config(w / name, **changes)
        return w / name

    copy("unknown_type", model_type="nosuchmodel")
    copy("not_causal", model_type="t5")
    copy("field_type", num_hidden_layers="two")
    copy("wrong_shape", hidden_size=64)  # the weights were saved with 32
    (copy("not_a_mapping") / "config.json").write_text("[1, 2]")
    (w / "no_model_type").mkdir()
    shutil.copytree(model, w / "no_model_type", dirs_exist_ok=True)
    config = json.loads((w / "no_model_type" / "config.json").read_text())
    del config["model_type"]
    (w / "no_model_type" / "config.json").write_text(json.dumps(config))
    weights_dir = copy("weights_dir")
    (weights_dir / "model.safetensors").unlink()
    (weights_dir / "model.safetensors").mkdir()
    (w / "no_answer.jsonl").write_text('{"prompt": "1+1="}\n{"prompt": "2+2="}\n')
    os.mkfifo(w / "pipe.jsonl")  # reading it would block forever
    (w / "binary.yaml").write_bytes(b"\x00\x01\x02model:\n")
    (w / "tabs.yaml").write_text("optim:\n\tlr: 1e-6\n")
    return {"m": str(model), "d": str(w / "good.jsonl"), "s": str(w / "sft.jsonl"), "w": str(w)}


# (id, command and arguments, words the one line must contain); {out} is a fresh output path per case
CASES = [
    # the model folder: config.json must build a causal LM in transformers, the weights must fit it
    ("model-type-unknown", ["train", *TRAIN, "model.name_or_path={w}/unknown_type"],
     ["unknown_type", "config.json", "nosuchmodel"]),
    ("model-type-missing", ["train", *TRAIN, "model.name_or_path={w}/no_model_type"],
     ["no_model_type", "config.json", "model_type"]),
    ("config-not-a-mapping", ["train", *TRAIN, "model.name_or_path={w}/not_a_mapping"],
     ["not_a_mapping", "config.json"]),
    ("config-field-type", ["train", *TRAIN, "model.name_or_path={w}/field_type"],
     ["field_type", "config.json", "num_hidden_layers"]),
    ("model-not-causal", ["train", *TRAIN, "model.name_or_path={w}/not_causal"],
     ["not_causal", "model_type 't5'", "causal"]),
    ("weights-other-shape", ["train", *TRAIN, "model.name_or_path={w}/wrong_shape"],
     ["wrong_shape", "model.safetensors", "shape", "config.json"]),
    ("weights-not-a-file", ["train", *TRAIN, "model.name_or_path={w}/weights_dir"],
     ["weights_dir", "model.safetensors is not a file"]),
    ("model-is-a-file", ["train", *TRAIN, "model.name_or_path={w}/a_file"], ["a_file", "is a file, not a model folder"]),
    ("sft-model-type-unknown", ["sft", *SFT, "model.name_or_path={w}/unknown_type"],
     ["unknown_type", "config.json"]),
    # device and attention
    ("device-mps-absent", ["train", *TRAIN, "model.device=mps"], ["model.device='mps'", "no MPS device"]),
    ("attention-unknown", ["train", *TRAIN, "model.attn_implementation=bogus"],
     ["model.attn_implementation='bogus'", "sdpa or eager"]),
    ("attention-package-missing", ["train", *TRAIN, "model.attn_implementation=flash_attention_2"],
     ["model.attn_implementation='flash_attention_2'", "install"]),
    # LoRA targets
    ("lora-target-absent", ["train", *TRAIN, "lora.enabled=true", "lora.target_modules=[q_proj,nosuch_proj]"],
     ["lora.target_modules", "nosuch_proj", "'v_proj'"]),
    ("lora-targets-empty", ["train", *TRAIN, "lora.enabled=true", "lora.target_modules=[]"],
     ["lora.target_modules is empty"]),
    ("sft-lora-target-absent", ["sft", *SFT, "lora.enabled=true", "lora.target_modules=[zz]"],
     ["lora.target_modules", "'zz'"]),
    # config values that were never range-checked
    ("output-dir-empty", ["train", *TRAIN, "train.output_dir="], ["train.output_dir is empty", "current folder"]),
    ("sft-output-dir-empty", ["sft", *SFT, "train.output_dir="], ["train.output_dir is empty"]),
    ("output-dir-flag-empty", ["train", *TRAIN, "--output-dir="], ["train.output_dir is empty"]),
    ("sft-output-dir-flag-empty", ["sft", *SFT, "--output-dir="], ["train.output_dir is empty"]),
    ("sample-output-dir-flag-empty", ["sample", *SAMPLE, "--output-dir="], ["output.dir is empty"]),
    ("pipeline-output-dir-flag-empty", ["pipeline", "--demo", "--output-dir="], ["--output-dir is empty"]),
    ("max-turns-zero", ["train", *TRAIN, "rollout.max_turns=0"], ["rollout.max_turns=0", ">= 1"]),
    ("tool-workers-zero", ["train", *TRAIN, "rollout.tool_workers=0"], ["rollout.tool_workers=0", ">= 1"]),
    ("tool-timeout-zero", ["train", *TRAIN, "rollout.tool_timeout_s=0"], ["rollout.tool_timeout_s=0", "> 0"]),
    # data: what the rewards read is there before the model loads; a pipe is not read
    ("data-without-answers", ["train", *TRAIN, "data.train={w}/no_answer.jsonl"],
     ["no_answer.jsonl", "no column 'answer'", "reward 'math_accuracy'"]),
    ("answer-column-renamed", ["train", *TRAIN, "rewards=[{{name: math_accuracy, kwargs: {{answer_column: solution}}}}]"],
     ["good.jsonl", "no column 'solution'", "reward 'math_accuracy'"]),
    ("eval-data-without-answers", ["train", *TRAIN, "data.eval={w}/no_answer.jsonl"],
     ["no_answer.jsonl", "no column 'answer'"]),
    ("data-is-a-pipe", ["train", *TRAIN, "data.train={w}/pipe.jsonl"], ["pipe.jsonl", "not a regular file"]),
    # settings of a part that is off: refused, not ignored
    ("lora-setting-without-lora", ["train", *TRAIN, "lora.r=8"], ["lora.r=8", "lora.enabled=true"]),
    ("sft-lora-setting-without-lora", ["sft", *SFT, "lora.target_modules=[q_proj]"],
     ["lora.target_modules=['q_proj']", "lora.enabled=true"]),
    ("tool-parser-without-tools", ["train", *TRAIN, "rollout.tool_parser=mine:parse", "rollout.max_turns=2"],
     ["rollout.max_turns=2, rollout.tool_parser='mine:parse'", "rollout.tools or rollout.environment"]),
    ("kv-cache-with-hf-engine", ["train", *TRAIN, "rollout.engine=hf", "rollout.kv_cache=static"],
     ["rollout.kv_cache='static'", "rollout.engine=fast"]),
    # config files
    ("yaml-binary", ["train", "{w}/binary.yaml", *TRAIN], ["binary.yaml", "not valid YAML", "binary file"]),
    ("yaml-tab", ["train", "{w}/tabs.yaml", *TRAIN], ["tabs.yaml", "not valid YAML", "line 2, column 1"]),
    ("config-binary", ["config", "{w}/binary.yaml"], ["binary.yaml", "not valid YAML"]),
    # grpokit sample: model section, seed and output folder as grpokit train checks them
    ("sample-output-empty", ["sample", *SAMPLE, "output.dir="], ["output.dir is empty"]),
    ("sample-seed-negative", ["sample", *SAMPLE, "sample.seed=-1"], ["sample.seed=-1", "2**63"]),
    ("sample-device-name", ["sample", *SAMPLE, "model.device=gpu"], ["model.device='gpu'", "cuda:N"]),
    ("sample-dtype", ["sample", *SAMPLE, "model.dtype=float8"], ["model.dtype='float8'", "bfloat16"]),
    # grpokit eval: its flags by the config's rules, --max-new-tokens against the model's positions
    ("eval-dtype", ["eval", "{m}", "{d}", "--dtype", "float8"], ["--dtype 'float8'", "float32"]),
    ("eval-num-samples-zero", ["eval", "{m}", "{d}", "--num-samples", "0"], ["--num-samples 0", ">= 1"]),
    ("eval-beyond-positions", ["eval", "{m}", "{d}", "--max-new-tokens", "300", "--limit", "1", "--num-samples", "1"],
     ["--max-new-tokens 300", "256 positions"]),
    ("eval-model-type-unknown", ["eval", "{w}/unknown_type", "{d}", "--max-new-tokens", "4"], ["unknown_type", "config.json"]),
    # grpokit bench: where the result goes, before the bench runs
    ("bench-json-under-a-file", ["bench", "--shape", "tiny", "--steps", "1", "--json", "{w}/a_file/result.json"],
     ["--json", "a_file does not exist or is a file"]),
    # grpokit view: the page's path, before the runs are read
    ("view-out-under-a-file", ["view", "{w}", "--out", "{w}/a_file/view.html"], ["--out", "a_file is a file"]),
]  # fmt: skip


def _argv(args, world, out):
    return [a.format(**world, out=out) for a in args]


@pytest.mark.parametrize("args, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_named_error_and_exit_2(world, tmp_path, monkeypatch, capsys, args, words):
    if "flash_attention_2" in " ".join(args) and importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed: flash_attention_2 is usable here")
    if "model.device=mps" in args and torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")
    monkeypatch.delenv("GRPOKIT_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)  # an empty output folder would write here
    try:
        code = main(_argv(args, world, str(tmp_path / "run")))
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    for word in words:
        assert word in err, (word, err)
    assert "Traceback" not in err and "Loading weights" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("grpokit"), err  # one line, not transformers' report
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # nothing written, not even in the current folder


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: an index past the visible GPUs")
def test_a_gpu_index_past_the_visible_ones_is_named(world, tmp_path, capsys):
    index = torch.cuda.device_count()
    assert main(_argv(["train", *TRAIN, f"model.device=cuda:{index}"], world, str(tmp_path / "run"))) == 2
    err = capsys.readouterr().err
    assert f"model.device='cuda:{index}'" in err and "visible" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("case", ["model-type-unknown", "yaml-binary"])
def test_the_real_cli_exits_2_with_one_line(world, tmp_path, case):
    """The same through a real process: the exit status a shell sees, no traceback."""
    args, words = next(c[1:] for c in CASES if c[0] == case)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("GRPOKIT_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "grpokit", *_argv(args, world, str(tmp_path / "run"))],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and all(w in proc.stderr for w in words), proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr


def _api_config(tmp_path, **sections) -> Config:
    cfg = Config()
    cfg.train.output_dir = str(tmp_path / "run")
    cfg.data.template = "plain"
    cfg.rollout.max_new_tokens = 4
    for dotted, value in sections.items():
        section, key = dotted.split("__")
        setattr(getattr(cfg, section), key, value)
    return cfg


ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
REWARD = [("r", lambda completions, **k: [0.0] * len(completions), 1.0)]

# (id, config changes, words): the Python API raises the CLI's ConfigError, before any weight is read
API_CASES = [
    ("output-dir-empty", {"train__output_dir": ""}, "train.output_dir is empty"),
    ("max-turns-zero", {"rollout__max_turns": 0}, "rollout.max_turns=0"),
    ("model-type-unknown", {"model__name_or_path": "{w}/unknown_type"}, "config.json does not describe a model"),
    ("weights-other-shape", {"model__name_or_path": "{w}/wrong_shape"}, "the weights and config.json are of different"),
    ("attention-unknown", {"model__attn_implementation": "bogus"}, "model.attn_implementation='bogus'"),
    ("lora-target-absent", {"lora__enabled": True, "lora__target_modules": ["nosuch_proj"]}, "lora.target_modules"),
]


@pytest.mark.parametrize("changes, words", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_the_api_raises_the_named_error(world, tmp_path, monkeypatch, changes, words):
    monkeypatch.chdir(tmp_path)
    changes = {"model__name_or_path": world["m"], **changes}
    changes = {k: v.format(**world) if isinstance(v, str) else v for k, v in changes.items()}
    with pytest.raises(ConfigError) as e:
        GRPOTrainer(_api_config(tmp_path, **changes), train_rows=ROWS, reward_functions=REWARD)
    assert words in str(e.value)
    assert os.listdir(tmp_path) == []


def test_lora_targets_of_a_model_given_in_code_are_checked(tmp_path):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = _api_config(tmp_path, lora__enabled=True, lora__target_modules=["q_proj", "qkv"])
    with pytest.raises(ConfigError, match=r"lora.target_modules: \['qkv'\] match no module .* 'k_proj'"):
        GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=REWARD)


def test_lora_all_linear_wraps_every_linear_layer_but_the_head():
    """lora.target_modules=[all-linear] is PEFT's 'all-linear' (it takes it as the whole value only)."""
    model, _ = make_tiny_model("qwen2", seed=0)
    wrapped = prepare_policy(model, ModelConfig(), LoraConfig(enabled=True, target_modules=["all-linear"]))
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in wrapped.named_parameters() if ".lora_A" in n}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def _sft_config(world, tmp_path, **changes):
    from grpokit.config.sft import SFTConfig

    cfg = SFTConfig()
    cfg.model.name_or_path, cfg.data.train = world["m"], world["s"]
    cfg.train.output_dir, cfg.train.steps, cfg.train.report_to = str(tmp_path / "run"), 1, "none"
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        setattr(getattr(cfg, section), key, value)
    return cfg


# (id, the call, words): arguments of the Python API of the wrong kind or value, each a named error
# (ConfigError or DataError, both exit 2 from the CLI) instead of TypeError/KeyError/AttributeError later
API_ARGUMENTS = [
    ("cfg-int", lambda w, t, m, tok: GRPOTrainer(3), "must be a grpokit Config (load_config builds one) or TRL's GRPOConfig (or its to_dict()), got int"),
    ("cfg-sft-to-grpo", lambda w, t, m, tok: GRPOTrainer(_sft_config(w, t)), "an SFTConfig goes to"),
    ("cfg-grpo-to-sft", lambda w, t, m, tok: _sft_trainer(Config()), "a grpokit.config.schema.Config goes to GRPOTrainer"),
    ("sft-lr-negative", lambda w, t, m, tok: _sft_trainer(_sft_config(w, t, optim__lr=-1.0)), "optim.lr=-1.0"),
    ("sft-steps-as-text", lambda w, t, m, tok: _sft_trainer(_sft_config(w, t, train__steps="3")),
     "train.steps: expected an integer, got '3'"),
    ("sft-batch-zero", lambda w, t, m, tok: _sft_trainer(_sft_config(w, t, sft__batch_size=0)), "sft.batch_size=0"),
    ("sft-output-empty", lambda w, t, m, tok: _sft_trainer(_sft_config(w, t, train__output_dir="")),
     "train.output_dir is empty"),
    ("rows-text", lambda w, t, m, tok: _grpo(t, m, tok, train_rows="1+1="), "train_rows: expected a non-empty list of rows"),
    ("rows-empty", lambda w, t, m, tok: _grpo(t, m, tok, train_rows=[]), "train_rows: expected a non-empty list of rows (dicts with a 'prompt' field), got []"),
    ("rows-not-dicts", lambda w, t, m, tok: _grpo(t, m, tok, train_rows=["1+1="]),
     "train_rows, row index 0: expected an object with a 'prompt' field"),
    ("rows-no-prompt", lambda w, t, m, tok: _grpo(t, m, tok, train_rows=[{"q": "1+1="}]),
     "train_rows: no prompt column 'prompt'"),
    ("eval-rows-not-dicts", lambda w, t, m, tok: _grpo(t, m, tok, eval_rows=[1]), "eval_rows, row index 0"),
    ("rewards-not-a-list", lambda w, t, m, tok: _grpo(t, m, tok, reward_functions=3), "reward_functions: got int"),
    ("rewards-empty", lambda w, t, m, tok: _grpo(t, m, tok, reward_functions=[]), "reward_functions is empty"),
    ("reward-weight-text", lambda w, t, m, tok: _grpo(t, m, tok, reward_functions=[("r", REWARD[0][1], "x")]),
     "reward_functions[0] ('r'): weight 'x' is not a finite number"),
    ("reward-weight-nan", lambda w, t, m, tok: _grpo(t, m, tok, reward_functions=[("r", REWARD[0][1], float("nan"))]),
     "weight nan is not a finite number"),
    ("model-not-a-model", lambda w, t, m, tok: _grpo(t, 3, tok), "model: got int"),
    ("tokenizer-text", lambda w, t, m, tok: _grpo(t, m, "my-tokenizer"), "tokenizer: got str"),
]  # fmt: skip


def _sft_trainer(cfg):
    from grpokit.trainers.sft import SFTTrainer

    return SFTTrainer(cfg)


def _grpo(tmp_path, model, tok, **given):
    kwargs = {"train_rows": ROWS, "reward_functions": REWARD, **given}
    return GRPOTrainer(_api_config(tmp_path), model=model, tokenizer=tok, **kwargs)


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_model("qwen2", seed=0)


@pytest.mark.parametrize("call, words", [c[1:] for c in API_ARGUMENTS], ids=[c[0] for c in API_ARGUMENTS])
def test_api_arguments_of_the_wrong_kind_are_named_errors(world, tmp_path, tiny, call, words):
    from grpokit.data.prompts import DataError

    with pytest.raises((ConfigError, DataError)) as e:
        call(world, tmp_path, *tiny)
    assert words in str(e.value)
    assert not (tmp_path / "run").exists()

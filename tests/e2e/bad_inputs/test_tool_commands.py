"""Bad inputs of grpokit bench (and its --plan), vllm-serve and launch, and settings that would do nothing
(optim.offload_reference without a reference, an adaptive entropy coefficient starting outside its range): each
one named line and exit 2 before any work starts, nothing written. Every case here printed negative GiB and
"fits: yes", planned "in nan GiB", ran on a model other than the one named, ended in the generic catch-all line
or a traceback, or was accepted and did nothing, at 37165e5."""

import importlib.util
import json
import os

import pytest
import torch
from tiny_model import ADDITION_ROWS, make_tiny_model, save_tiny_model

from grpokit import GRPOTrainer
from grpokit.cli.main import main
from grpokit.config.schema import Config, ConfigError, load_config
from grpokit.config.sft import SFTConfig

PLAN_DIMS = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4}  # fmt: skip
TRAIN = ["model.name_or_path={m}", "data.train={d}", "train.output_dir={out}", "data.template=plain",
         "rollout.max_new_tokens=4", "rollout.group_size=2", "rollout.prompts_per_step=2", "train.steps=1",
         "train.report_to=none"]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("inputs")
    model = save_tiny_model(w / "model")
    (w / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ADDITION_ROWS))
    sft = [{"prompt": r["prompt"], "completion": r["answer"]} for r in ADDITION_ROWS]
    (w / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    for name, changes in {
        "ok": {},
        "negative": {"hidden_size": -64},
        "text": {"hidden_size": "64"},
        "zero_layers": {"num_hidden_layers": 0},
        "bool_heads": {"num_attention_heads": True},
        "uneven": {"hidden_size": 66},
        "kv_uneven": {"num_key_value_heads": 3},
    }.items():
        (w / f"{name}.json").write_text(json.dumps({**PLAN_DIMS, **changes}))
    (w / "no_vocab.json").write_text(json.dumps({k: v for k, v in PLAN_DIMS.items() if k != "vocab_size"}))
    return {"m": str(model), "d": str(w / "good.jsonl"), "s": str(w / "sft.jsonl"), "w": str(w)}


PLAN = ["bench", "--plan", "{w}/ok.json", "--memory-gib", "16"]
CASES = [
    # grpokit bench --plan: the model's dimensions and the memory, before anything is predicted
    ("plan-negative-hidden", ["bench", "--plan", "{w}/negative.json", "--memory-gib", "16"],
     ["negative.json", "hidden_size is -64, not a whole number >= 1"]),
    ("plan-text-dimension", ["bench", "--plan", "{w}/text.json", "--memory-gib", "16"],
     ["text.json", "hidden_size is '64'"]),
    ("plan-zero-layers", ["bench", "--plan", "{w}/zero_layers.json", "--memory-gib", "16"], ["num_hidden_layers is 0"]),
    ("plan-bool-heads", ["bench", "--plan", "{w}/bool_heads.json", "--memory-gib", "16"], ["num_attention_heads is True"]),
    ("plan-heads-uneven", ["bench", "--plan", "{w}/uneven.json", "--memory-gib", "16"],
     ["hidden_size 66 is not a multiple of num_attention_heads 4"]),
    ("plan-kv-heads-uneven", ["bench", "--plan", "{w}/kv_uneven.json", "--memory-gib", "16"],
     ["num_key_value_heads 3 does not divide num_attention_heads 4"]),
    ("plan-field-missing", ["bench", "--plan", "{w}/no_vocab.json", "--memory-gib", "16"], ["no field 'vocab_size'"]),
    ("plan-memory-nan", ["bench", "--plan", "{w}/ok.json", "--memory-gib", "nan"], ["--memory-gib nan", "> 0"]),
    ("plan-memory-inf", ["bench", "--plan", "{w}/ok.json", "--memory-gib", "inf"], ["--memory-gib inf"]),
    ("plan-memory-negative", ["bench", "--plan", "{w}/ok.json", "--memory-gib", "-4"], ["--memory-gib -4"]),
    ("plan-ignores-model-dir", [*PLAN, "--model-dir", "{w}/nowhere"], ["--model-dir is not read by --plan"]),
    ("plan-ignores-steps", [*PLAN, "--steps", "3"], ["--steps is not read by --plan"]),
    ("plan-ignores-cap", [*PLAN, "--memory-cap-gib", "8"], ["--memory-cap-gib is not read by --plan"]),
    # grpokit bench: numbers, the model folder, options another mode reads, the --set overrides
    ("bench-cap-negative", ["bench", "--shape", "tiny", "--memory-cap-gib", "-3"], ["--memory-cap-gib -3", "> 0"]),
    ("bench-cap-nan", ["bench", "--shape", "tiny", "--memory-cap-gib", "nan"], ["--memory-cap-gib nan"]),
    ("bench-beta-negative", ["bench", "--shape", "tiny", "--beta", "-0.1"], ["--beta -0.1", ">= 0"]),
    ("bench-model-dir-missing", ["bench", "--shape", "tiny", "--model-dir", "{w}/nowhere"],
     ["--model-dir", "nowhere: no such folder"]),
    ("bench-engines-model-dir-missing", ["bench", "--shape", "tiny", "--engine", "hf,fast", "--model-dir", "{w}/nowhere"],
     ["--model-dir", "nowhere: no such folder"]),
    ("bench-model-dir-no-config", ["bench", "--shape", "tiny", "--model-dir", "{w}"], ["no config.json there"]),
    ("memory-ignores-model-dir", ["bench", "--memory", "--model-dir", "{m}"], ["--model-dir is not read by --memory"]),
    ("memory-ignores-model-size", ["bench", "--memory", "--model-size", "tiny"], ["--model-size is not read by --memory"]),
    ("sft-ignores-set", ["bench", "--mode", "sft", "--shape", "tiny", "--set", "optim.lr=1e-5"],
     ["--set is not read by --mode sft"]),
    ("trl-python-without-compare", ["bench", "--shape", "tiny", "--trl-python", "/usr/bin/python3"],
     ["--trl-python is read only with --compare trl"]),
    ("two-benches", ["bench", "--learn", "--async"], ["--learn and --async choose different benches"]),
    ("async-target-above-one", ["bench", "--async", "--target", "2"], ["--target 2", "[0, 1]"]),
    ("async-latency-nan", ["bench", "--async", "--reward-latency", "nan"], ["--reward-latency nan"]),
    ("bench-set-unknown-key", ["bench", "--shape", "tiny", "--model-size", "tiny", "--set", "algo.nope=1"],
     ["algo.nope"]),
    ("bench-cache-dir-a-file", ["bench", "--shape", "tiny", "--model-size", "tiny", "--cache-dir", "{d}"],
     ["--cache-dir", "is a file"]),
    ("bench-device-absent", ["bench", "--shape", "tiny", "--model-size", "tiny", "--device", "cuda"],
     ["model.device='cuda'", "no CUDA GPU"]),
    ("bench-engine-absent", ["bench", "--shape", "tiny", "--model-size", "tiny", "--engine", "vllm"],
     ["rollout.engine=vllm needs vLLM"]),
    ("bench-cap-on-cpu", ["bench", "--shape", "tiny", "--model-size", "tiny", "--device", "cpu", "--memory-cap-gib", "4"],
     ["--memory-cap-gib 4: a memory cap needs a CUDA device"]),
    ("learn-trl-set-form", ["bench", "--learn", "--trl-set", "adam_beta2"], ["--trl-set 'adam_beta2'", "FIELD=VALUE"]),
    ("learn-set-form", ["bench", "--learn", "--set", "optim.lr"], ["--set: override 'optim.lr'"]),
    ("async-set-unknown", ["bench", "--async", "--set", "optim.nope=1"], ["--set: unknown config key 'optim.nope'"]),
    ("memory-set-range", ["bench", "--memory", "--set", "optim.lr=-1"], ["--set: optim.lr=-1.0 is out of range"]),
    # grpokit vllm-serve: options, and the model's positions, before vLLM is looked for
    ("serve-beyond-positions", ["vllm-serve", "--model", "{m}", "--max-model-len", "100000"],
     ["--max-model-len 100000 is beyond the 256 positions", "config.json"]),
    ("serve-length-zero", ["vllm-serve", "--model", "{m}", "--max-model-len", "0"], ["--max-model-len 0", ">= 1"]),
    ("serve-port", ["vllm-serve", "--model", "{m}", "--port", "70000"], ["--port 70000"]),
    ("serve-gpu-share", ["vllm-serve", "--model", "{m}", "--gpu-memory-utilization", "1.5"],
     ["--gpu-memory-utilization 1.5", "(0, 1]"]),
    ("serve-kv-cache", ["vllm-serve", "--model", "{m}", "--cpu-kv-cache-gib", "0"], ["--cpu-kv-cache-gib 0"]),
    ("serve-threads", ["vllm-serve", "--model", "{m}", "--threads", "0"], ["--threads 0"]),
    ("serve-not-a-model", ["vllm-serve", "--model", "{w}"], ["no config.json there"]),
    # grpokit launch: torchrun's options that torch's agent would assert with a traceback, or refuse once started
    ("launch-no-process", ["launch", "--nproc_per_node=0", "train"], ["--nproc_per_node=0 starts no process"]),
    ("launch-negative-processes", ["launch", "--nproc-per-node=-2", "train"], ["--nproc_per_node=-2 starts no process"]),
    ("launch-port", ["launch", "--nproc_per_node=1", "--master_port=99999", "train"], ["--master_port=99999 is not a port"]),
    ("launch-endpoint-port", ["launch", "--nproc_per_node=1", "--rdzv-endpoint=a:b:c", "train"],
     ["--rdzv_endpoint=a:b:c", "port number"]),
    ("launch-monitor-interval", ["launch", "--nproc_per_node=1", "--monitor-interval=-1", "train"],
     ["--monitor_interval=-1", "> 0"]),
    # settings that would do nothing: refused by name
    ("offload-reference-beta-0", ["train", *TRAIN, "optim.offload_reference=true", "algo.beta=0"],
     ["optim.offload_reference=true", "no reference model", "algo.beta=0"]),
    ("sft-offload-reference", ["sft", "model.name_or_path={m}", "data.train={s}", "train.output_dir={out}",
                               "optim.offload_reference=true"], ["optim.offload_reference=true", "grpokit sft"]),
    ("entropy-start-above-max", ["train", *TRAIN, "algo.adaptive_entropy=true", "algo.entropy_coef=0.5",
                                 "algo.entropy_coef_max=0.1"], ["algo.entropy_coef=0.5 is above algo.entropy_coef_max=0.1"]),
    ("entropy-start-below-min", ["train", *TRAIN, "algo.adaptive_entropy=true", "algo.entropy_coef=0.001",
                                 "algo.entropy_coef_min=0.01"], ["algo.entropy_coef=0.001 is below algo.entropy_coef_min=0.01"]),
]  # fmt: skip


@pytest.mark.parametrize("args, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_named_line_and_exit_2(world, tmp_path, monkeypatch, capsys, args, words):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    if "vllm" in args and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    monkeypatch.delenv("GRPOKIT_DEBUG", raising=False)
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))  # no random model is built either
    monkeypatch.chdir(tmp_path)
    argv = [a.format(**world, out=str(tmp_path / "run")) for a in args]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, err
    for word in words:
        assert word.format(**world) in err, (word, err)
    assert "Traceback" not in err and "with --debug for the traceback" not in err, err  # not the catch-all line
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("grpokit"), err
    assert "RESULT" not in captured.out
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # nothing written, no model built


# the same rules on the Python path: a Config built in code, given to the trainer
API_CASES = [
    ("offload-reference-beta-0", {"optim__offload_reference": True, "algo__beta": 0.0}, "no reference model"),
    ("entropy-start-above-max",
     {"algo__adaptive_entropy": True, "algo__entropy_coef": 0.5, "algo__entropy_coef_max": 0.1},
     "algo.entropy_coef=0.5 is above algo.entropy_coef_max=0.1"),
]  # fmt: skip


@pytest.mark.parametrize("changes, words", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_the_python_path_refuses_them_too(tmp_path, changes, words):
    cfg = Config()
    cfg.train.output_dir = str(tmp_path / "run")
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        setattr(getattr(cfg, section), key, value)
    model, tok = make_tiny_model("qwen2", seed=0)
    reward = [("r", lambda completions, **k: [0.0] * len(completions), 1.0)]
    with pytest.raises(ConfigError, match=words):
        GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, reward_functions=reward)
    assert not (tmp_path / "run").exists()


def test_sft_in_python_refuses_a_reference_offload(world, tmp_path):
    from grpokit.trainers.sft import SFTTrainer

    cfg = SFTConfig()
    cfg.model.name_or_path, cfg.data.train, cfg.train.output_dir = world["m"], world["s"], str(tmp_path / "run")
    cfg.optim.offload_reference = True
    with pytest.raises(ConfigError, match="grpokit sft keeps no reference model"):
        SFTTrainer(cfg)


def test_what_still_runs():
    """The rules' other side: a reference to offload (beta > 0, or a KL in the reward alone), an adaptive start
    at either end of its range."""
    from grpokit.config.checks import check_settings_in_use

    for kl in (["algo.beta=0.04"], ["algo.beta=0", "algo.kl_reward_coef=0.1"]):
        check_settings_in_use(load_config(None, ["optim.offload_reference=true", *kl]))
    for start in ("0.01", "0.1"):
        load_config(None, ["algo.adaptive_entropy=true", f"algo.entropy_coef={start}",
                           "algo.entropy_coef_min=0.01", "algo.entropy_coef_max=0.1"])  # fmt: skip


def test_launch_options_left_at_torchs_defaults_pass_the_checks():
    """No --master_port, --rdzv_endpoint or --monitor_interval given: torch's defaults (None, '', 0.1) pass
    (the --master_port check of 564c526 compared None with 0 and broke every launch without it)."""
    from grpokit.cli.launch import parse_options

    args = parse_options(["--nproc_per_node=2"], ["train", "cfg.yaml"])
    assert (args.nproc_per_node, args.master_port) == ("2", None)
    assert parse_options(["--nproc_per_node=1", "--master_port=29511", "--rdzv_endpoint=localhost:29400"], ["sft"])

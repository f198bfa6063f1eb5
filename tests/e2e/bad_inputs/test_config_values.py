"""Bad inputs through the CLI: each is a one-line error naming its cause, exit code 2, no traceback,
and no model weights loaded (every case here fails before that: config, output folder, data,
rewards, the model's config.json or the hub are checked first)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from tiny_model import save_tiny_model

from grpokit.cli.main import main

# (id, arguments after `grpokit train`, environment, exit code, words the message must contain)
# {m} tiny model folder, {d} good data, {w} scratch folder, {out} a fresh output folder per case
BASE = [
    "model.name_or_path={m}",
    "data.train={d}",
    "train.output_dir={out}",
    "data.template=plain",
    "data.max_prompt_tokens=32",
    "rollout.max_new_tokens=6",
    "rollout.group_size=4",
    "rollout.prompts_per_step=2",
]
CASES = [
    # config values: range, type, choice, combination
    ("steps-zero", ["train.steps=0"], {}, 2, ["train.steps=0", ">= 1", "e.g. train.steps="]),
    ("steps-negative", ["train.steps=-5"], {}, 2, ["train.steps=-5", ">= 1"]),
    ("lr-negative", ["optim.lr=-1"], {}, 2, ["optim.lr=-1", "> 0", "e.g. optim.lr=1e-6"]),
    ("lr-zero", ["optim.lr=0"], {}, 2, ["optim.lr=0", "> 0"]),
    ("lr-nan", ["optim.lr=nan"], {}, 2, ["optim.lr=nan"]),
    ("lr-huge", ["optim.lr=5"], {}, 2, ["optim.lr=5", "<= 1"]),
    ("top-k-negative", ["rollout.top_k=-3"], {}, 2, ["rollout.top_k=-3", ">= 0", "0 = off"]),
    ("save-every-negative", ["train.save_every=-1"], {}, 2, ["train.save_every=-1", ">= 0"]),
    ("keep-negative", ["train.keep_checkpoints=-1"], {}, 2, ["train.keep_checkpoints=-1", "keep all"]),
    ("top-p-above-one", ["rollout.top_p=1.5"], {}, 2, ["rollout.top_p=1.5", "<= 1"]),
    ("temperature-zero", ["rollout.temperature=0"], {}, 2, ["rollout.temperature=0", "> 0"]),
    ("group-of-one", ["rollout.group_size=1"], {}, 2, ["rollout.group_size=1", "at least 2"]),
    ("group-not-int", ["rollout.group_size=many"], {}, 2, ["rollout.group_size", "expected an integer"]),
    ("max-new-zero", ["rollout.max_new_tokens=0"], {}, 2, ["rollout.max_new_tokens=0", ">= 1"]),
    ("beta2-one", ["optim.adam_beta2=1"], {}, 2, ["optim.adam_beta2=1", "< 1"]),
    ("mini-batches-divide", ["optim.mini_batches=3"], {}, 2, ["optim.mini_batches=3", "must divide"]),
    ("micro-batch-zero", ["optim.micro_batch_size=0"], {}, 2, ["optim.micro_batch_size"]),
    ("preset-typo", ["algo.preset=grop"], {}, 2, ["algo.preset='grop'", "grpo"]),
    ("agg-typo", ["algo.agg=token_mean"], {}, 2, ["algo.agg", "token-mean"]),
    ("dual-clip-below-one", ["algo.dual_clip=0.5"], {}, 2, ["algo.dual_clip=0.5", "> 1"]),
    ("beta-negative", ["algo.beta=-0.1"], {}, 2, ["algo.beta=-0.1", ">= 0"]),
    ("lora-dropout-one", ["lora.dropout=1"], {}, 2, ["lora.dropout=1", "< 1"]),
    ("eval-samples-zero", ["eval.num_samples=0"], {}, 2, ["eval.num_samples=0", ">= 1"]),
    ("reward-timeout-zero", ["train.reward_timeout_s=0"], {}, 2, ["train.reward_timeout_s=0", "> 0"]),
    ("dtype-choice", ["model.dtype=float64"], {}, 2, ["model.dtype='float64'", "not one of"]),
    ("engine-choice", ["rollout.engine=sglang"], {}, 2, ["rollout.engine='sglang'", "not one of"]),
    ("unknown-key", ["rollout.group_sise=8"], {}, 2, ["unknown config key", "group_size"]),
    ("section-not-mapping", ["optim=3"], {}, 2, ["optim", "expected a mapping"]),
    # config files
    ("config-file-missing", ["{w}/nope.yaml"], {}, 2, ["nope.yaml", "does not exist"]),
    ("config-not-yaml", ["{w}/bad.yaml"], {}, 2, ["bad.yaml", "not valid YAML"]),
    ("config-top-level-list", ["{w}/list.yaml"], {}, 2, ["list.yaml", "top level must be a mapping"]),
    ("config-unknown-section", ["{w}/typo.yaml"], {}, 2, ["typo.yaml", "unknown config key 'optimm'"]),
    ("reward-weight-nan", ["{w}/nan_weight.yaml"], {}, 2, ["rewards[0].weight=nan", "finite"]),
    # command line
    ("unknown-option", ["--bogus"], {}, 2, ["unrecognized arguments", "--bogus"]),
    ("resume-and-overwrite", ["--resume", "--overwrite"], {}, 2, ["--resume", "--overwrite", "give one"]),
    # output folder
    ("output-is-a-file", ["train.output_dir={w}/a_file"], {}, 2, ["a_file", "is a file"]),
    ("output-under-a-file", ["train.output_dir={w}/a_file/run"], {}, 2, ["a_file", "is a file"]),
    ("output-holds-a-run", ["train.output_dir={w}/old_run"], {}, 2, ["already holds a run", "--resume", "--overwrite"]),
    ("resume-nothing", ["--resume"], {}, 2, ["--resume", "no checkpoint"]),
    ("resume-from-missing", ["--resume-from", "step_000009"], {}, 2, ["step_000009", "no such checkpoint"]),
    # data
    ("data-missing", ["data.train={w}/nope.jsonl"], {}, 2, ["nope.jsonl", "no such file"]),
    ("data-not-utf8", ["data.train={w}/latin1.jsonl"], {}, 2, ["latin1.jsonl", "not UTF-8", "line 2", "iconv"]),
    ("data-empty", ["data.train={w}/empty.jsonl"], {}, 2, ["empty.jsonl", "empty"]),
    ("data-no-prompt-column", ["data.train={w}/question.jsonl"], {}, 2, ["question.jsonl", "'prompt'", "question"]),
    ("data-bad-json-line", ["data.train={w}/broken.jsonl"], {}, 2, ["broken.jsonl", "line 2"]),
    ("data-unknown-format", ["data.train={w}/prompts.txt"], {}, 2, ["prompts.txt", "unknown data format"]),
    ("data-train-unset", ["data.train="], {}, 2, ["data.train is empty"]),
    ("data-eval-missing", ["data.eval={w}/held_out.jsonl"], {}, 2, ["held_out.jsonl", "no such file"]),
    ("accuracy-reward-unknown", ["train.accuracy_reward=nope"], {}, 2, ["train.accuracy_reward='nope'"]),
    # model: folder, config.json, hub, positions
    ("model-folder-missing", ["model.name_or_path={w}/no_model"], {}, 2, ["no_model", "no such folder"]),
    ("model-without-config", ["model.name_or_path={w}/not_a_model"], {}, 2, ["not_a_model", "no config.json"]),
    ("model-config-broken", ["model.name_or_path={w}/broken_model"], {}, 2, ["broken_model", "not valid JSON"]),
    ("model-demo-name", ["model.name_or_path=demo"], {}, 2, ["'demo'", "grpokit demo"]),
    ("hub-offline-not-cached", ["model.name_or_path=someone/no-such-model"], {"HF_HUB_OFFLINE": "1"}, 2,
     ["someone/no-such-model", "HF_HUB_OFFLINE", "local copy"]),
    ("hub-unreachable", ["model.name_or_path=someone/no-such-model"], {"HF_ENDPOINT": "http://127.0.0.1:9"}, 2,
     ["someone/no-such-model", "cannot be reached", "HF_HUB_OFFLINE", "local copy"]),
    ("max-new-beyond-positions", ["rollout.max_new_tokens=300"], {}, 2,
     ["rollout.max_new_tokens=300", "256 positions", "max_position_embeddings"]),
    ("eval-max-new-beyond-positions", ["eval.max_new_tokens=256"], {}, 2, ["eval.max_new_tokens=256", "positions"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("bad_inputs")
    model = save_tiny_model(w / "model")
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (w / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (w / "latin1.jsonl").write_bytes(b'{"prompt": "1+1="}\n{"prompt": "caf\xe9 2+2="}\n')
    (w / "empty.jsonl").write_text("")
    (w / "question.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n')
    (w / "broken.jsonl").write_text('{"prompt": "1+1="}\n{"prompt": "2+2=\n')
    (w / "prompts.txt").write_text("1+1=\n")
    (w / "a_file").write_text("not a folder\n")
    (w / "not_a_model").mkdir()
    (w / "broken_model").mkdir()
    (w / "broken_model" / "config.json").write_text("{not json")
    (w / "bad.yaml").write_text("optim: [unclosed\n")
    (w / "list.yaml").write_text("- 1\n- 2\n")
    (w / "typo.yaml").write_text("optimm:\n  lr: 1e-6\n")
    (w / "nan_weight.yaml").write_text("rewards:\n  - name: math_accuracy\n    weight: .nan\n")
    old = w / "old_run"
    (old / "checkpoints").mkdir(parents=True)
    (old / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    return {"m": str(model), "d": str(w / "good.jsonl"), "w": str(w)}


@pytest.mark.parametrize("args, env, code, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_named_error(world, tmp_path, monkeypatch, capsys, args, env, code, words):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GRPOKIT_DEBUG", raising=False)
    fill = {**world, "out": str(tmp_path / "run")}
    argv = [a.format(**fill) for a in args]
    if argv[0].endswith(".yaml"):  # a config file comes first, then the overrides
        argv = argv[:1] + [a.format(**fill) for a in BASE] + argv[1:]
    else:
        argv = [a.format(**fill) for a in BASE] + argv
    try:
        got = main(["train", *argv])
    except SystemExit as e:  # argparse's own usage errors
        got = e.code
    err = capsys.readouterr().err
    assert got == code, err
    for word in words:
        assert word.lower() in err.lower(), (word, err)
    assert "Traceback" not in err
    assert "Loading weights" not in err  # failed before any weight was read
    lines = [line for line in err.splitlines() if line.startswith("grpokit")]
    assert len(lines) == 1, err  # one line says it all
    assert not (tmp_path / "run").exists()  # a run that fails to start writes nothing


def test_table_is_large_enough():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def test_debug_shows_the_traceback(world, tmp_path, monkeypatch, capsys):
    argv = [a.format(**world, out=str(tmp_path / "run")) for a in BASE]
    assert main(["train", *argv, "train.steps=0", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "train.steps=0" in err
    monkeypatch.setenv("GRPOKIT_DEBUG", "1")
    assert main(["train", *argv, "optim.lr=-1"]) == 2
    assert "Traceback" in capsys.readouterr().err


class _NoSuchRepo(BaseHTTPRequestHandler):
    """A hub that answers every request as the real one does for an unknown repository."""

    def _not_found(self):
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = _not_found

    def log_message(self, *args):
        pass


def test_hub_id_that_does_not_exist_fails_before_loading(world, tmp_path, monkeypatch, capsys):
    server = HTTPServer(("127.0.0.1", 0), _NoSuchRepo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    argv = [a.format(**world, out=str(tmp_path / "run")) for a in BASE]
    try:
        assert main(["train", *argv, "model.name_or_path=someone/no-such-model"]) == 2
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert "someone/no-such-model" in err and "no such model on the hub" in err and "Traceback" not in err

"""Running code under torchrun from a test: a free port, ``launch`` (2 real ranks on the CPU, gloo), and the
config of a run of tool episodes that several torchrun tests share."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from paths import REPO, TESTS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    args: list[str],
    nproc: int,
    timeout: float = 240,
    module: bool = False,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node=nproc ...`` (or plain python for nproc=0), with the
    repository and tests/ on PYTHONPATH (a config may name tests/'s modules, e.g. "episode_parts:parity").
    check: the run must exit 0 (False: the caller reads how it ended)."""
    pythonpath = os.pathsep.join(str(p) for p in (REPO, TESTS))
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    runner = [sys.executable]
    if nproc:
        runner += ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}"]
    if module:
        runner.append("-m")
    proc = subprocess.run([*runner, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 or not check, proc.stderr[-4000:]
    return proc


def tool_episode_config(folder: Path, rows: list[dict], **sections: dict) -> Path:
    """``folder``/cfg.yaml, a ``grpokit train`` config of tool episodes for 2 ranks (3 steps, DDP), with the tool
    model (tests/tool_model.py) saved in ``folder``/model and ``rows``' prompts and answers: 2 prompts x 4 episodes
    a step of up to 3 turns of 6 tokens, each turn calls count_digits, the reward is parity (tests/episode_parts.py).
    ``sections``: more settings merged into a section, e.g. ``rollout={"max_staleness": 1}``."""
    from tool_model import tool_model

    model, tok = tool_model()
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    data = folder / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n" for r in rows))
    settings = {
        "model": {"name_or_path": str(folder / "model"), "device": "cpu"},
        "data": {"train": str(data)},
        "rollout": {
            "group_size": 4, "prompts_per_step": 2, "max_new_tokens": 6, "max_turns": 3,
            "tool_parser": "episode_parts:every_turn_calls", "tools": ["episode_parts:count_digits"],
        },
        "optim": {"lr": 3e-3, "micro_batch_size": 2},
        "rewards": [{"name": "episode_parts:parity"}],
        "eval": {"enabled": False},
        "train": {"steps": 3, "tensorboard": False, "samples_every": 0, "stop_after_flat_steps": 0, "distributed": "ddp"},
    }  # fmt: skip
    for section, values in sections.items():
        settings.setdefault(section, {}).update(values)
    cfg = folder / "cfg.yaml"
    cfg.write_text(json.dumps(settings))  # JSON is YAML
    return cfg

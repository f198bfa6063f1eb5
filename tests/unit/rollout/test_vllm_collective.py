"""The collective weight transfer's channel (grpokit.rollout.engines.vllm.collective) where vLLM is not installed: two
real processes over loopback, the trainer's side here broadcasting with gloo, the server's side a subprocess
receiving (what grpokit vllm-serve runs before vLLM's reload_weights; the whole path is tested with a real
server in tests/engine_vllm/test_vllm_server.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
from torch.distributed import PrefixStore, TCPStore

from grpokit.config.schema import ConfigError, load_config
from grpokit.rollout.engines.vllm.collective import SOURCE, describe, make_group, new_group_name, send

RECEIVER = """
import json, os, sys
from datetime import timedelta

import torch
from torch.distributed import PrefixStore, TCPStore

from grpokit.rollout.engines.vllm.collective import RECEIVER, make_group, receive

port, name, announced, out = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
store = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False)
group = make_group(PrefixStore(name, store), RECEIVER, "gloo", peer="127.0.0.1", timeout_s=60)
torch.save(dict(receive(group, announced, torch.device("cpu"))), out)
# done: leave without the interpreter's teardown, in which gloo's and the store's C++ threads end in no fixed order
# while the sender still holds its end (it aborted once in CI, "terminate called without an active exception",
# after the tensors were saved); what arrived is checked from the file
os._exit(0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_tensors_of_every_dtype_and_shape_arrive_equal_over_gloo(tmp_path):
    g = torch.Generator().manual_seed(0)
    weights = [
        ("model.embed_tokens.weight", torch.randn(7, 5, generator=g)),
        ("model.norm.weight", torch.randn(5, generator=g).to(torch.bfloat16)),  # gloo has no bf16 sum: bytes it is
        ("scale", torch.tensor(3.5, dtype=torch.float16)),  # 0-d
        ("index", torch.arange(6).reshape(2, 3)),
        ("transposed", torch.randn(4, 3, generator=g).t()),  # not contiguous
    ]
    port, name = free_port(), new_group_name()
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, str(port), name, json.dumps(describe(weights)), str(tmp_path / "got.pt")]
    )
    try:
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        group = make_group(PrefixStore(name, store), SOURCE, "gloo", peer="127.0.0.1", timeout_s=60)
        send(group, weights, torch.device("cpu"))
        assert receiver.wait(timeout=60) == 0
    finally:
        receiver.kill()
    got = torch.load(tmp_path / "got.pt")
    assert list(got) == [n for n, _ in weights]  # in the announced order
    for n, t in weights:
        assert got[n].dtype == t.dtype and got[n].shape == t.shape and torch.equal(got[n], t), n
    assert describe(weights)[1] == ["model.norm.weight", "bfloat16", [5]]


def test_the_transfer_settings_belong_to_server_mode():
    from grpokit.config.checks import check_settings_in_use

    server = ["rollout.engine=vllm", "rollout.vllm.mode=server"]
    cfg = load_config(None, [*server, "rollout.vllm.weight_transfer=collective", "rollout.vllm.collective_port=6000"])
    check_settings_in_use(cfg)
    assert (cfg.rollout.vllm.weight_transfer, cfg.rollout.vllm.collective_port) == ("collective", 6000)
    assert load_config(None, server).rollout.vllm.weight_transfer == "http"  # the safe default
    with pytest.raises(ConfigError, match="rollout.vllm.weight_transfer='nccl' is not"):
        load_config(None, [*server, "rollout.vllm.weight_transfer=nccl"])
    with pytest.raises(ConfigError, match=r"rollout.vllm.weight_transfer='collective': taken only with rollout.vllm.mode=server"):
        check_settings_in_use(load_config(None, ["rollout.engine=vllm", "rollout.vllm.weight_transfer=collective"]))

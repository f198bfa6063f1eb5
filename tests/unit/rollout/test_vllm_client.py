"""The server mode's client (grpokit.rollout.engines.vllm.remote) where vLLM is not installed: it needs none. The
settings of each mode, the wire format of the weights and of the weight check, and the named error when no
server answers. The server itself is tested in tests/engine_vllm/test_vllm_server.py (it needs vLLM)."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from tiny_model import SAMPLE_PROMPTS, make_tiny_model

from grpokit.config.checks import check_settings_in_use, check_vllm_installed
from grpokit.config.schema import ConfigError, VLLMConfig, load_config
from grpokit.rollout.engines.vllm import VLLMGenerator, VLLMServerError, vllm_missing
from grpokit.rollout.engines.vllm.remote import (
    pack_fingerprints,
    pack_weights,
    unpack_fingerprints,
    unpack_weights,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_vllm_mode_takes_only_its_own_settings():
    server = ["rollout.engine=vllm", "rollout.vllm.mode=server"]
    check_settings_in_use(load_config(None, [*server, "rollout.vllm.server_url=http://10.0.0.2:8000"]))
    with pytest.raises(ConfigError, match=r"rollout.vllm.server_url='http://h:1': taken only with rollout.vllm.mode=server"):
        check_settings_in_use(load_config(None, ["rollout.engine=vllm", "rollout.vllm.server_url=http://h:1"]))
    with pytest.raises(ConfigError, match=r"rollout.vllm.cpu_kv_cache_gib=4: taken only with rollout.vllm.mode=colocate"):
        check_settings_in_use(load_config(None, [*server, "rollout.vllm.cpu_kv_cache_gib=4"]))
    with pytest.raises(ConfigError, match="rollout.vllm.mode='spmd' is not"):
        load_config(None, ["rollout.engine=vllm", "rollout.vllm.mode=spmd"])


def test_the_server_modes_client_needs_no_vllm_installed():
    check_vllm_installed("vllm", "rollout.engine", "server")  # the server has vLLM, the trainer need not
    VLLMGenerator(VLLMConfig(mode="server"), max_model_len=None)  # no engine until the first rollout


def test_weights_go_as_safetensors_bytes_and_come_back_equal_by_name():
    embed = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    weights = [("model.embed_tokens.weight", embed), ("lm_head.weight", embed), ("norm.weight", torch.tensor([0.5, -2.0]))]
    back = dict(unpack_weights(pack_weights(weights)))  # the tied pair shares storage: sent as two tensors
    assert sorted(back) == sorted(name for name, _ in weights)
    for name, tensor in weights:
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)


def test_fingerprints_keep_the_full_shape_beside_their_values():
    values = torch.tensor([1.0, 0.25, -3.0])
    back = unpack_fingerprints(pack_fingerprints({"model.norm.weight": ((64,), values), "e": ((5, 7), values[:2])}))
    assert back["model.norm.weight"][0] == (64,) and torch.equal(back["model.norm.weight"][1], values)
    assert back["e"][0] == (5, 7) and torch.equal(back["e"][1], values[:2])


def test_no_server_at_the_url_is_a_named_error_after_the_timeout():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gen = VLLMGenerator(VLLMConfig(mode="server", server_url=url, server_timeout_s=1.0), max_model_len=None)
    model, _ = make_tiny_model("qwen2", seed=0)
    started = time.monotonic()
    with pytest.raises(VLLMServerError, match=rf"no vLLM server answered at {url}/health within 1 s.*grpokit vllm-serve"):
        gen.generate(
            model, SAMPLE_PROMPTS, group_size=2, max_new_tokens=4, temperature=1.0, eos_token_ids=[1], pad_token_id=0
        )
    assert 1.0 <= time.monotonic() - started < 10


@pytest.mark.slow
@pytest.mark.skipif(vllm_missing() is None, reason="vLLM is installed here (the server starts: tests/engine_vllm)")
def test_grpokit_vllm_serve_without_vllm_says_how_to_install_it(tmp_path):
    import subprocess
    import sys

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 64}')  # a model folder: vLLM is what is missing
    done = subprocess.run(
        [sys.executable, "-m", "grpokit", "vllm-serve", "--model", str(tmp_path)], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "grpokit vllm-serve needs vLLM" in done.stderr and "pip install vllm" in done.stderr

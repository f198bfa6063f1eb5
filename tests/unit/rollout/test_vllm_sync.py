"""The vLLM engine's weight syncs where vLLM is not installed: a push to a server that does not answer stops with
WeightSyncTimeout within rollout.vllm.sync_timeout_s (over HTTP and over the collective channel), and what a LoRA
run pushes (the adapter alone where vLLM's LoRA takes it, else the merged weights). The engine side of both is
tested with vLLM in tests/engine_vllm (test_vllm_generator.py)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from tiny_model import SAMPLE_PROMPTS, make_tiny_model

from grpokit.config.schema import ConfigError, VLLMConfig
from grpokit.rollout.engines.vllm import VLLMGenerator, WeightSyncTimeout
from grpokit.rollout.engines.vllm.errors import within
from grpokit.rollout.engines.vllm.remote import metadata_of, pack_weights
from grpokit.rollout.engines.vllm.weights import (
    adapter_problem,
    adapter_weights,
    base_version,
    base_weights,
    lora_rank,
    version_of,
    weight_bytes,
)

peft = pytest.importorskip("peft")

HANG_S = 30.0
"""How long the hanging server holds a POST before failing it: a client without the timeout gets its
VLLMServerError then, not WeightSyncTimeout (so the tests fail, rather than hang, without it)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hanging_server():
    """(url, posts) of a real HTTP server on the loopback that answers its health check like grpokit vllm-serve
    and then never answers a POST (a weight push, the collective channel's opening) for HANG_S seconds."""
    release = threading.Event()
    posts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            info = {"model": "m", "dtype": "float32", "max_model_len": 512, "pid": 0, "device": "cpu",
                    "max_lora_rank": 0}  # fmt: skip
            self._answer(200, info)

        def do_POST(self):
            posts.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            release.wait(HANG_S)
            self._answer(500, {"error": "held, then failed"})

        def _answer(self, code, payload):
            body = json.dumps(payload).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up (its timeout) and closed the socket
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", posts
    release.set()
    server.shutdown()
    server.server_close()


def rollout(gen, model):
    return gen.generate(
        model, SAMPLE_PROMPTS, group_size=2, max_new_tokens=4, temperature=1.0, eos_token_ids=[1], pad_token_id=0
    )


@pytest.mark.parametrize("transfer", ["http", "collective"])
def test_a_push_to_a_server_that_does_not_answer_stops_with_the_named_error_within_the_timeout(
    hanging_server, transfer
):
    url, posts = hanging_server
    settings = VLLMConfig(mode="server", server_url=url, sync_timeout_s=1.0, server_timeout_s=2.0,
                          weight_transfer=transfer, collective_port=free_port())  # fmt: skip
    gen = VLLMGenerator(settings, max_model_len=None)
    model, _ = make_tiny_model("qwen2", seed=0)
    started = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match=r"within 1 s \(rollout.vllm.sync_timeout_s\)"):
        rollout(gen, model)  # the first rollout pushes the trainer's weights to the server
    waited = time.monotonic() - started
    assert posts[-1] == ("/weights" if transfer == "http" else "/collective/open")  # it did reach the server
    assert 1.0 <= waited < HANG_S  # not before the timeout; well before the server let go (the old client waited)
    assert gen.pushes == 0 and gen.pushed is None  # nothing recorded as pushed: a next call would push again
    # the abandoned push ends on its own (the store's connect gives up after server_timeout_s, then the POST's
    # thread is let go): wait for it here, so its warnings land in this test, not in whichever test runs next
    for thread in threading.enumerate():
        if thread.name == "grpokit-weight-sync":
            thread.join(timeout=15)
            assert not thread.is_alive(), "the abandoned weight push never ended"


def test_within_returns_raises_or_times_out():
    assert within(5, "a quick push", lambda: 7) == 7
    with pytest.raises(KeyError, match="its own error"):
        within(5, "a failing push", lambda: {}["its own error"])
    hold = threading.Event()
    with pytest.raises(WeightSyncTimeout, match=r"a stuck push did not finish within 0.2 s"):
        within(0.2, "a stuck push", lambda: hold.wait(HANG_S))
    hold.set()


def lora_model(**changes):
    base, _ = make_tiny_model("qwen2", seed=0)
    config = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], **changes}
    return peft.get_peft_model(base, peft.LoraConfig(**config))


def test_what_vllms_lora_cannot_apply_falls_back_to_the_merged_push_with_the_reason():
    assert adapter_problem(lora_model()) is None
    assert lora_rank(lora_model()) == 8  # the smallest max_lora_rank vLLM accepts at or above 4
    plain, _ = make_tiny_model("qwen2", seed=0)
    for model, reason in [
        (plain, "the policy has no PEFT LoRA adapter"),
        (lora_model(use_dora=True), "use_dora=True"),
        (lora_model(modules_to_save=["lm_head"]), "modules_to_save"),
        (lora_model(target_modules=["q_proj", "embed_tokens"]), "targets ['embed_tokens']"),
        (lora_model(bias="lora_only"), "bias='lora_only'"),
    ]:
        assert reason in adapter_problem(model) or pytest.fail(adapter_problem(model))
    notices = []
    auto = VLLMGenerator(VLLMConfig(mode="server"), max_model_len=None, say=notices.append)
    assert auto._pushes_adapter(lora_model(), server_rank=8)
    assert not auto._pushes_adapter(lora_model(), server_rank=0) and "up to rank 0" in notices[-1]
    assert not auto._pushes_adapter(lora_model(use_dora=True), server_rank=8) and "use_dora" in notices[-1]
    assert not auto._pushes_adapter(plain, server_rank=8) and len(notices) == 2  # no LoRA: nothing to say
    merged = VLLMGenerator(VLLMConfig(mode="server", lora_push="merged"), max_model_len=None)
    assert not merged._pushes_adapter(lora_model(), server_rank=8)
    adapter = VLLMGenerator(VLLMConfig(mode="server", lora_push="adapter"), max_model_len=None)
    with pytest.raises(ConfigError, match="rollout.vllm.lora_push=adapter: the policy has no PEFT LoRA adapter"):
        adapter._pushes_adapter(plain, server_rank=8)


def test_the_adapter_push_carries_the_adapter_alone_by_peft_names_and_the_base_unmerged():
    model = lora_model()
    adapter, config = adapter_weights(model)
    names = [name for name, _ in adapter]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names  # PEFT's saved names
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert weight_bytes(adapter) == sum(p.numel() * p.element_size() for p in trained.values())
    assert config["r"] == 4 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    json.loads(json.dumps(config))  # adapter_config.json as vLLM reads it
    blob = pack_weights(adapter, metadata={"adapter_config": json.dumps(config)})  # what a server receives
    assert json.loads(metadata_of(blob)["adapter_config"]) == config
    with torch.no_grad():
        for p in trained.values():
            p.normal_(0, 0.5)  # a trained adapter: merging it would change the q and v projections
    base = base_weights(model)
    q = model.get_base_model().model.layers[0].self_attn.q_proj
    assert torch.equal(base["model.layers.0.self_attn.q_proj.weight"], q.base_layer.weight)  # unmerged
    assert not any("lora" in name for name in base)


def test_vllm_serve_takes_the_lora_ranks_vllm_accepts():
    import argparse

    from grpokit.cli.main import build_parser
    from grpokit.rollout.engines.vllm.weights import LORA_RANKS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flag = next(a for a in sub.choices["vllm-serve"]._actions if a.dest == "max_lora_rank")
    assert tuple(flag.choices) == (0, *LORA_RANKS) and flag.default == 0  # 0: the server takes no adapter


def test_lora_push_without_lora_is_refused_as_a_setting_that_would_be_ignored():
    from grpokit.config.checks import check_settings_in_use
    from grpokit.config.schema import load_config

    vllm = ["rollout.engine=vllm", "rollout.vllm.lora_push=merged"]
    with pytest.raises(ConfigError, match=r"rollout.vllm.lora_push='merged': taken only with lora.enabled=true"):
        check_settings_in_use(load_config(None, vllm))
    check_settings_in_use(load_config(None, [*vllm, "lora.enabled=true"]))


def test_a_new_model_never_passes_for_a_freed_one_at_the_same_address():
    """CPython gives a freed object's id to the next one made: a version keyed by id(model) made a new model with
    untouched weights equal to a freed one the engine held, and the generator skipped its push (tests/engine_vllm's
    sync_every test sampled the previous test's weights in CI at 5beab9e-661eea3). Made until an address is reused."""
    seen: dict[int, tuple] = {}
    reused = 0
    for _ in range(200):
        model = torch.nn.Linear(3, 3)
        if id(model) in seen:
            reused += 1
            assert version_of(model) != seen[id(model)][0] and base_version(model) != seen[id(model)][1]
        seen[id(model)] = (version_of(model), base_version(model))
        del model
    assert reused, "no address was reused in 200 models: the test tested nothing"
    kept = torch.nn.Linear(3, 3)
    before = version_of(kept)
    assert version_of(kept) == before  # the same object keeps its number
    with torch.no_grad():
        kept.weight.add_(1.0)
    assert version_of(kept)[0] == before[0] and version_of(kept)[1] > before[1]

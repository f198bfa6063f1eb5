"""Server mode (rollout.vllm.mode=server) over loopback: a real ``grpokit vllm-serve`` subprocess on a free
port, the trainer's VLLMGenerator reaching it over HTTP (grpokit.rollout.engines.vllm.remote). The rollouts are the
colocated engine's (token ids and log-probs, one seeded request per completion), the weights are pushed
after each step and checked, a push that does not arrive and a server that dies are named errors.

One server for the module (starting one takes 20-60 s here); it starts from its own --model folder, and each
test's model differs from it: the generator's first call pushes that model's weights. The last test kills it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("vllm.sampling_params", reason="vLLM is not installed (tests/engine_vllm run in .venv-vllm, .ci/run)")

import torch  # noqa: E402
from sampling_oracle import processed_logprobs  # noqa: E402
from test_vllm_generator import EOS, LOGPROB_TOL, PROCESSED, optimizer_step, sample, trainer_logprobs  # noqa: E402
from test_vllm_training import spread  # noqa: E402
from tiny_model import ADDITION_ROWS, SAMPLE_PROMPTS, SMALL_RUN  # noqa: E402
from vllm_models import settings, vllm_model  # noqa: E402

from grpokit import GRPOTrainer, load_config  # noqa: E402
from grpokit.rollout.engines.hf import HFGenerator  # noqa: E402
from grpokit.rollout.engines.vllm import VLLMGenerator, VLLMServerError, WeightSyncError  # noqa: E402

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(url, process) of a grpokit vllm-serve of a tiny model (seed 100: no test's model), its output in a file."""
    folder = tmp_path_factory.mktemp("served")
    model, _ = vllm_model(seed=100)
    model.save_pretrained(folder / "model")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = open(folder / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit", "vllm-serve", "--model", str(folder / "model"), "--port", str(port),
         "--dtype", "float32", "--max-model-len", "512", "--threads", "1", "--max-lora-rank", "8"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    yield f"http://127.0.0.1:{port}", proc
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture(scope="module")
def generator(server):
    url, proc = server
    gen = VLLMGenerator(settings(mode="server", server_url=url, server_timeout_s=300), max_model_len=512, seed=0)
    yield gen
    gen.close()


def test_group_sampling_through_the_server_gives_the_trainers_log_probs(generator):
    model, _ = vllm_model(seed=0)
    r = sample(generator, model)  # the first call: health check, then this model's weights pushed and checked
    assert generator.pushes == 1 and generator.llm.info["dtype"] == "float32"
    N = len(SAMPLE_PROMPTS) * 4
    assert r.completion_ids.shape[0] == N
    assert len({tuple(x) for x in r.completion_ids.tolist()}) > N // 2  # each completion its own seed
    mask = r.completion_mask.bool()
    assert float((trainer_logprobs(model, r, 1.0) - r.logprobs)[mask].abs().max()) < LOGPROB_TOL
    again = sample(generator, model)
    assert torch.equal(r.completion_ids, again.completion_ids)  # seeded requests: the same rollout


def test_after_an_optimizer_step_the_servers_greedy_output_is_the_trainer_models(generator):
    model, _ = vllm_model(seed=2)
    before = sample(generator, model, temperature=0.0, group_size=1)
    pushes = generator.pushes
    optimizer_step(model)
    after = sample(generator, model, temperature=0.0, group_size=1)
    assert generator.pushes == pushes + 1
    hf = HFGenerator().generate(
        model, SAMPLE_PROMPTS, group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS, pad_token_id=0
    )
    assert torch.equal(after.completion_ids, hf.completion_ids)
    assert not torch.equal(before.completion_ids, after.completion_ids)  # the step changed it: the check bites
    assert generator.stats["probe_gap"] < 1e-3


class SkippingPush(VLLMGenerator):
    """A push whose transfer never reaches the server; the cache reset and the checks still run."""

    def _reload(self, llm, weights):
        pass


def test_a_push_that_did_not_reach_the_server_stops_with_a_named_error(generator):
    model, _ = vllm_model(seed=3)
    sample(generator, model, temperature=0.0, group_size=1)
    optimizer_step(model)
    generator.__class__ = SkippingPush
    try:
        with pytest.raises(WeightSyncError, match="is not the trainer's"):
            sample(generator, model, temperature=0.0, group_size=1)
    finally:
        generator.__class__ = VLLMGenerator
    sample(generator, model, temperature=0.0, group_size=1)  # a real push makes them equal again


def test_the_runs_sampling_settings_reach_the_server(generator):
    """min_p and the repetition penalty travel with each request: the server's log-probs are the processed
    distribution's (tests/sampling_oracle.py), as the colocated engine's."""
    model, _ = vllm_model(seed=5)
    r = sample(generator, model, **PROCESSED)
    mask = r.completion_mask.bool()
    want = processed_logprobs(model, r, **PROCESSED)
    assert float((want - r.logprobs.double())[mask].abs().max()) < LOGPROB_TOL


@pytest.fixture(scope="module")
def collective(server):
    """A client of the module's server whose pushes go over a gloo group (rollout.vllm.weight_transfer=collective)."""
    url, _ = server
    gen = VLLMGenerator(
        settings(mode="server", server_url=url, server_timeout_s=300, weight_transfer="collective",
                 collective_port=free_port()),
        max_model_len=512, seed=0,
    )  # fmt: skip
    yield gen
    gen.close()


def test_the_collective_transfer_gives_the_server_the_trainers_weights(collective):
    model, _ = vllm_model(seed=6)
    r = sample(collective, model)  # the first push opens the group, then broadcasts; the checks pass
    assert collective.pushes == 1 and collective.llm.group is not None
    mask = r.completion_mask.bool()
    assert float((trainer_logprobs(model, r, 1.0) - r.logprobs)[mask].abs().max()) < LOGPROB_TOL
    before = sample(collective, model, temperature=0.0, group_size=1)
    optimizer_step(model)
    after = sample(collective, model, temperature=0.0, group_size=1)  # pushed over the same group
    assert collective.pushes == 2
    hf = HFGenerator().generate(
        model, SAMPLE_PROMPTS, group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS, pad_token_id=0
    )
    assert torch.equal(after.completion_ids, hf.completion_ids)
    assert not torch.equal(before.completion_ids, after.completion_ids)
    assert collective.stats["probe_gap"] < 1e-3


def test_a_collective_push_that_did_not_arrive_stops_with_a_named_error(collective):
    model, _ = vllm_model(seed=7)
    sample(collective, model, temperature=0.0, group_size=1)
    optimizer_step(model)
    collective.__class__ = SkippingPush
    try:
        with pytest.raises(WeightSyncError, match="is not the trainer's"):
            sample(collective, model, temperature=0.0, group_size=1)
    finally:
        collective.__class__ = VLLMGenerator
    sample(collective, model, temperature=0.0, group_size=1)


def trainer(out, url, steps, *overrides, **kwargs):
    model, tok = vllm_model(seed=0)
    cfg = load_config(
        None,
        [f"train.output_dir={out}", f"train.steps={steps}", *SMALL_RUN, "rollout.engine=vllm", "optim.lr=1e-3",
         "rollout.vllm.mode=server", f"rollout.vllm.server_url={url}", "train.save_every=1", *overrides],
    )  # fmt: skip
    return GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, reward_functions=[("spread", spread, 1.0)], **kwargs
    )


@pytest.mark.parametrize("transfer", ["http", "collective"])
def test_grpokit_train_runs_two_steps_through_the_server_and_resumes(server, tmp_path, transfer):
    """With the collective transfer the resumed run's new client opens a group of its own, which replaces the
    first run's at the server."""
    url, _ = server
    how = [f"rollout.vllm.weight_transfer={transfer}", f"rollout.vllm.collective_port={free_port()}"]
    t = trainer(tmp_path / "run", url, 2, *(how if transfer == "collective" else []))
    t.train()
    assert t.sampler.generator.pushes == 2  # at the connection, and before step 2's rollout
    t.sampler.generator.close()
    resumed = trainer(tmp_path / "run", url, 3, *(how if transfer == "collective" else []), resume=True)  # a new client: it pushes the checkpoint's weights
    resumed.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        assert m["sampler_logprob_diff/max"] < 1e-4  # the server sampled with the trainer's weights
        assert m["rollout/weight_lag"] == 0
    assert resumed.sampler.generator.stats["probe_gap"] < 1e-3
    assert (resumed.sampler.generator.llm.group is not None) == (transfer == "collective")


def test_a_lora_run_pushes_the_base_then_the_adapter_alone_to_a_server_that_takes_adapters(generator):
    """The server was started with --max-lora-rank 8: the first push of a LoRA policy sends the base (the server
    holds its own --model), then each push the adapter alone, over HTTP; the rollouts are the trainer's."""
    from test_vllm_lora import adapter_bytes, lora_model

    from grpokit.rollout.engines.vllm.weights import base_weights, weight_bytes

    url = generator.llm.url
    gen = VLLMGenerator(settings(mode="server", server_url=url), max_model_len=512, seed=0)
    model = lora_model(seed=9)
    r = sample(gen, model)
    assert gen.adapter and gen.llm.max_lora_rank == 8
    assert gen.stats["push_bytes"] == weight_bytes(base_weights(model).items()) + adapter_bytes(model)
    mask = r.completion_mask.bool()
    assert float((trainer_logprobs(model, r, 1.0) - r.logprobs)[mask].abs().max()) < LOGPROB_TOL
    optimizer_step(model, lr=3e-2)
    after = sample(gen, model, temperature=0.0, group_size=1)
    assert gen.stats["push_bytes"] == adapter_bytes(model)  # the base unchanged: the adapter alone
    hf = HFGenerator().generate(
        model, SAMPLE_PROMPTS, group_size=1, max_new_tokens=12, temperature=0.0, eos_token_ids=EOS, pad_token_id=0
    )
    assert torch.equal(after.completion_ids, hf.completion_ids)
    assert gen.stats["probe_gap"] < 1e-3
    gen.close()


def test_a_call_the_server_fails_brings_its_message_back(generator):
    """A prompt longer than the server's --max-model-len (512): vLLM refuses it there, the client names it."""
    model, _ = vllm_model(seed=0)
    with pytest.raises(VLLMServerError, match=r"failed a rollout \(HTTP 500\): \w+Error: .*512"):
        generator.generate(
            model, [[2] + [5] * 600], group_size=1, max_new_tokens=4, temperature=1.0, eos_token_ids=EOS,
            pad_token_id=0,
        )  # fmt: skip
    sample(generator, model, temperature=0.0, group_size=1)  # the server goes on answering


def test_a_server_that_dies_mid_run_is_a_named_error(server, generator):
    """Last in the module: it kills the module's server. Over HTTP and over a collective group alike."""
    url, proc = server
    model, _ = vllm_model(seed=4)
    sample(generator, model, temperature=0.0, group_size=1)
    grouped = VLLMGenerator(
        settings(mode="server", server_url=url, weight_transfer="collective", collective_port=free_port()),
        max_model_len=512, seed=0,
    )  # fmt: skip
    grouped_model, _ = vllm_model(seed=8)
    sample(grouped, grouped_model, temperature=0.0, group_size=1)  # its group is open
    proc.kill()
    proc.wait()
    for gen, m in ((generator, model), (grouped, grouped_model)):
        optimizer_step(m)
        started = time.monotonic()
        with pytest.raises(VLLMServerError, match=rf"the vLLM server at {url} stopped answering during a weight push"):
            sample(gen, m, temperature=0.0, group_size=1)
        assert time.monotonic() - started < 10  # at once, not after a timeout

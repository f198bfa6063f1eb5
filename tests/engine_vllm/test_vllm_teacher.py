"""On-policy distillation with a teacher served by vLLM (teacher.engine=vllm; grpokit.rollout.engines.vllm.teacher):
its log-probs of the student's completions are the local teacher's (transformers, the reference's pass) at the
sampling temperature, colocated and from a vLLM server; a run distils with it as with the local one; a server's
other tokenizer, another model and a server that dies are named errors."""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("vllm.sampling_params", reason="vLLM is not installed (tests/engine_vllm run in .venv-vllm, .ci/run)")

import torch  # noqa: E402
from test_vllm_generator import EOS, LOGPROB_TOL  # noqa: E402
from tiny_model import (  # noqa: E402
    ADDITION_ROWS,
    SAMPLE_PROMPTS,
    SMALL_RUN,
    SPECIALS,
    make_tiny_tokenizer,
    save_tiny_model,
)
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from vllm_models import vllm_model  # noqa: E402

from grpokit import GRPOTrainer, load_config  # noqa: E402
from grpokit.core.errors import ConfigError  # noqa: E402
from grpokit.rollout.engines.hf import HFGenerator  # noqa: E402
from grpokit.rollout.engines.vllm.teacher import TeacherServerError  # noqa: E402

pytestmark = pytest.mark.slow
DISTIL = ["algo.advantage=none", "algo.teacher_kl_coef=1.0", "algo.beta=0", "algo.agg=token-mean"]
SHAPE = dict(hidden_size=64, num_heads=2, num_kv_heads=1, max_position_embeddings=512)  # vllm_models.vllm_model's


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """Another random model of vllm_model's shape (head_dim 32), with the student's tokenizer."""
    return save_tiny_model(tmp_path_factory.mktemp("teacher") / "model", seed=1, **SHAPE)


def flat(completions, **kw):
    return [0.0] * len(completions)


def trainer(out, teacher, *overrides, steps=1, tokenizer=None):
    model, tok = vllm_model(seed=0)
    teacher_key = [] if teacher is None else [f"teacher.name_or_path={teacher}"]
    cfg = load_config(
        None,
        [
            f"train.output_dir={out}", f"train.steps={steps}", *SMALL_RUN, "rollout.group_size=4",
            "rollout.prompts_per_step=4", "optim.lr=1e-2", *teacher_key, *DISTIL, *overrides,
        ],
    )  # fmt: skip
    tok = tokenizer or tok
    return GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, reward_functions=[("flat", flat, 1.0)])


def swapped_tokenizer():
    """The student's tokenizer with the ids of "a" and "b" swapped: as many tokens, another vocabulary."""
    tok = make_tiny_tokenizer()
    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), pad_token="<pad>", eos_token="<eos>",
        bos_token="<bos>", unk_token="<unk>", additional_special_tokens=SPECIALS[4:],
        padding_side="left",
    )  # fmt: skip


def release(*trainers):
    """Stop the trainers' vLLM engines (1 GiB of KV cache each on the CPU)."""
    for t in trainers:
        if t.teacher is not None and t.teacher.model is None:
            t.teacher.log_pass.scorer.close()
        t.sampler.generator.close()
    gc.collect()


def student_rollout(temperature):
    """The student's completions of SAMPLE_PROMPTS (left-padded prompts of 2-10 tokens, completions of 1-12 tokens
    ending at EOS or not), sampled by transformers."""
    model, _ = vllm_model(seed=0)
    r = HFGenerator().generate(
        model, SAMPLE_PROMPTS, group_size=4, max_new_tokens=12, temperature=temperature, eos_token_ids=EOS,
        pad_token_id=0, seed=5,
    )  # fmt: skip
    assert r.completion_mask.sum(-1).unique().numel() > 1  # rows of several lengths: the padding is exercised
    return r


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_colocated_vllm_teachers_logprobs_are_the_local_teachers(tmp_path, teacher_dir, temperature):
    r = student_rollout(temperature)
    T = f"rollout.temperature={temperature}"
    local, served = trainer(tmp_path / "a", teacher_dir, T), trainer(tmp_path / "b", teacher_dir, T, "teacher.engine=vllm")
    assert served.teacher.model is None and "vLLM, in this process" in served.teacher.source
    want = local.teacher.logprobs(local.model, r)  # (N, Lc) transformers at T
    got = served.teacher.logprobs(served.model, r)
    mask = r.completion_mask.bool()
    assert float((got - want)[mask].abs().max()) < LOGPROB_TOL  # measured 4e-6
    assert (got[~mask] == 0).all()
    if temperature != 1.0:  # vLLM's prompt log-probs at T = 1 (the scale not set) are far from them
        raw = trainer(tmp_path / "c", teacher_dir, "teacher.engine=vllm")  # rollout.temperature=1: no scale
        at_one = raw.teacher.logprobs(raw.model, r)
        assert float((at_one - want)[mask].abs().max()) > 0.1
        release(raw)
    release(local, served)


def kl_log(out) -> list[float]:
    return [json.loads(line)["teacher/kl"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def reverse_kl(student, teacher, tok, temperature: float, n: int = 16) -> float:
    """The exact per-token reverse KL(pi_s || pi_T) at the temperature, summed over the vocabulary, along ``n`` of the
    student's own 4-token samples of every training prompt (fixed seed): what distillation lowers, without the
    sampled estimate's noise."""
    student.eval()
    total, count = 0.0, 0
    rng = torch.Generator().manual_seed(123)
    for row in ADDITION_ROWS:
        ids = torch.tensor([tok(row["prompt"])["input_ids"]] * n)  # (n, L)
        with torch.no_grad():
            for _ in range(4):
                ls = (student(ids).logits[:, -1].float() / temperature).log_softmax(-1)  # (n, V)
                lt = (teacher(ids).logits[:, -1].float() / temperature).log_softmax(-1)
                total, count = total + float((ls.exp() * (ls - lt)).sum()), count + n
                ids = torch.cat([ids, torch.multinomial(ls.exp(), 1, generator=rng)], 1)
    return total / count


def test_a_run_with_a_colocated_vllm_teacher_and_vllm_rollouts_distils_as_the_local_one(tmp_path, teacher_dir):
    """Two engines in the trainer's process (the student's rollouts, the teacher's scores) at T = 0.8: the reverse KL
    to the teacher falls as test_distillation's local run's does, and the first step's logged teacher/kl is the
    local teacher's on the same samples."""
    run = ["rollout.engine=vllm", "rollout.temperature=0.8", "rollout.group_size=8", "rollout.prompts_per_step=8",
           "optim.lr=1e-3"]  # fmt: skip
    t = trainer(tmp_path / "vllm", teacher_dir, *run, "teacher.engine=vllm", steps=20)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    before = reverse_kl(t.model, teacher, t.tokenizer, 0.8)
    t.train()
    after = reverse_kl(t.model, teacher, t.tokenizer, 0.8)
    release(t)
    local = trainer(tmp_path / "local", teacher_dir, *run, steps=1)
    local.train()
    release(local)
    logged, first = kl_log(tmp_path / "vllm"), kl_log(tmp_path / "local")
    assert len(logged) == 20 and logged[0] == pytest.approx(first[0], abs=1e-4)  # one rollout, scored by either
    assert after < 0.8 * before, (before, after)  # measured: 11.1 -> 6.2 nats (local teacher, fast engine: 11.1 -> 8.1)
    assert sum(logged[-3:]) < 0.8 * sum(logged[:3]), logged  # the sampled estimate: 32.4 -> 18.1


# ----------------------------------------------------------------------------- a vLLM server of the teacher


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def teacher_server(teacher_dir, tmp_path_factory):
    """(url, process) of vLLM's own OpenAI-compatible server of the teacher (what `vllm serve` starts)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's own default
    log = open(tmp_path_factory.mktemp("server") / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(teacher_dir), "--port", str(port),
         "--host", "127.0.0.1", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager"],
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


def test_a_teacher_server_scores_as_the_local_teacher_and_its_failures_are_named(tmp_path, teacher_dir, teacher_server):
    url, proc = teacher_server
    server = ["teacher.engine=vllm", "teacher.vllm.mode=server", f"teacher.vllm.server_url={url}",
              "teacher.vllm.server_timeout_s=300", "teacher.vllm.request_timeout_s=60"]  # fmt: skip
    served = trainer(tmp_path / "a", teacher_dir, *server)  # waits for the server's health check
    assert url in served.teacher.source and str(teacher_dir) in served.teacher.source
    local = trainer(tmp_path / "b", teacher_dir)
    r = student_rollout(1.0)
    want, got = local.teacher.logprobs(local.model, r), served.teacher.logprobs(served.model, r)
    mask = r.completion_mask.bool()
    assert float((got - want)[mask].abs().max()) < LOGPROB_TOL  # measured 4e-6
    assert (got[~mask] == 0).all()
    release(local, served)
    # the server's model is another than the one named; the student's tokenizer another than the server's
    with pytest.raises(ConfigError, match=r"teacher.name_or_path='other': the vLLM server at .* serves \["):
        trainer(tmp_path / "c", "other", *server)
    with pytest.raises(ConfigError, match=r"the served teacher's tokenizer differs from the student's"):
        trainer(tmp_path / "d", None, *server, tokenizer=swapped_tokenizer())
    model, _ = vllm_model(seed=0)
    model.resize_token_embeddings(70)  # the student's tokenizer has 6 ids more (unused fillers) than the server's
    cfg = load_config(None, [f"train.output_dir={tmp_path / 'e'}", "train.steps=1", *SMALL_RUN, *DISTIL, *server])
    with pytest.raises(ConfigError, match=r"cannot score the student's last token id 69 .*out of vocabulary"):
        GRPOTrainer(cfg, model=model, tokenizer=make_tiny_tokenizer(70), train_rows=ADDITION_ROWS, reward_functions=[flat])
    # the server dies mid-run: the next scoring is a named error, not a hang
    scorer = trainer(tmp_path / "f", None, *server).teacher
    proc.terminate()
    proc.wait(timeout=60)
    with pytest.raises(TeacherServerError, match=r"stopped answering during scoring 16 sequences"):
        scorer.logprobs(None, r)

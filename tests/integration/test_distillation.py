"""On-policy distillation (issue 53 item 5): a teacher's log-probs of the student's own samples as a dense advantage
train a tiny real student toward the teacher: the exact reverse KL to it, over the whole next-token distribution
after every training prompt, falls; with a LoRA student too; and a teacher that cannot be read is refused. A teacher
served by vLLM: its settings' rules, its pass's layout and a server that does not answer (here, without vLLM)."""

from __future__ import annotations

import importlib.util
import json
import socket

import pytest
import torch
from tiny_model import ADDITION_ROWS, SMALL_RUN, make_tiny_model, make_tiny_tokenizer, save_tiny_model

from grpokit import GRPOTrainer, load_config
from grpokit.core.errors import ConfigError
from grpokit.rollout.engines.base import Rollout
from grpokit.rollout.engines.vllm.teacher import ServedScorer, TeacherServerError, TeacherTimeout
from grpokit.train.teacher import VLLMTeacherPass

DISTIL = ["algo.advantage=none", "algo.teacher_kl_coef=1.0", "algo.beta=0", "algo.agg=token-mean"]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return save_tiny_model(
        tmp_path_factory.mktemp("teacher"), seed=1
    )  # another random model, far from the student


def flat(completions, **kw):
    """A flat reward: the advantage is the teacher's alone, and flat rewards do not stop a distillation run."""
    return [0.0] * len(completions)


def trainer(out, teacher, *overrides, steps=20):
    model, tok = make_tiny_model("qwen2", seed=0)
    teacher_key = [] if teacher is None else [f"teacher.name_or_path={teacher}"]
    cfg = load_config(
        None,
        [
            f"train.output_dir={out}", f"train.steps={steps}", *SMALL_RUN, "rollout.group_size=4",
            "rollout.prompts_per_step=4", "optim.lr=1e-2", *teacher_key, *DISTIL, *overrides,
        ],
    )  # fmt: skip
    rewards = [("flat", flat, 1.0)]
    return GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, reward_functions=rewards)


def reverse_kl(student, teacher, tok) -> float:
    """Mean over the training prompts of KL(pi_s || pi_T) of the first completion token, summed over the
    vocabulary (exact, no sampling)."""
    student.eval()
    total = 0.0
    for row in ADDITION_ROWS:
        ids = torch.tensor([tok(row["prompt"])["input_ids"]])
        with torch.no_grad():
            ls = student(ids).logits[0, -1].float().log_softmax(-1)
            lt = teacher(ids).logits[0, -1].float().log_softmax(-1)
        total += float((ls.exp() * (ls - lt)).sum())
    return total / len(ADDITION_ROWS)


def distil_and_measure(tmp_path, teacher_dir, *overrides):
    t = trainer(tmp_path / "run", teacher_dir, *overrides)
    teacher, tok = t.teacher.model, t.tokenizer
    before = reverse_kl(t.model, teacher, tok)
    t.train()
    after = reverse_kl(t.model, teacher, tok)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return before, after, [line["teacher/kl"] for line in lines if "teacher/kl" in line], t


def test_distillation_lowers_the_reverse_kl_to_the_teacher(tmp_path, teacher_dir):
    before, after, logged, _ = distil_and_measure(tmp_path, teacher_dir)
    assert after < 0.6 * before, (before, after)  # measured: 3.18 -> 1.10 nats (2.14 after 16 steps)
    assert len(logged) == 20 and sum(logged[-3:]) < 0.6 * sum(logged[:3])  # the sampled estimate: 13.1 -> 5.6


def test_a_lora_student_is_distilled_too(tmp_path, teacher_dir):
    lora = ["lora.enabled=true", "lora.r=8", "optim.lr=2e-2"]
    before, after, _, t = distil_and_measure(tmp_path, teacher_dir, *lora)
    assert after < 0.7 * before, (before, after)  # measured: 3.18 -> 1.48 nats
    trained = {n for n, p in t.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)


def test_a_teacher_that_cannot_be_read_is_refused(tmp_path, teacher_dir):
    with pytest.raises(
        ConfigError, match=r"algo.teacher_kl_coef=1 needs a teacher: set teacher.name_or_path"
    ):
        trainer(tmp_path / "a", None)
    with pytest.raises(ConfigError, match=r"teacher.name_or_path=.*set algo.teacher_kl_coef > 0"):
        trainer(tmp_path / "b", teacher_dir, "algo.advantage=group_std", "algo.teacher_kl_coef=0")
    with pytest.raises(ConfigError, match=r"teacher.dtype='bfloat16': the teacher is read only"):
        trainer(
            tmp_path / "b2",
            None,
            "algo.advantage=group_std",
            "algo.teacher_kl_coef=0",
            "teacher.dtype=bfloat16",
        )
    other = tmp_path / "other"  # the same model with another tokenizer's vocabulary
    save_tiny_model(other, seed=1)
    make_tiny_tokenizer(vocab_size=70).save_pretrained(other)  # 6 fillers more: 70 ids against 64
    with pytest.raises(ConfigError, match=r"the teacher's tokenizer differs from the student's"):
        trainer(tmp_path / "c", other)


# ----------------------------------------------------------------------------- a teacher served by vLLM (teacher.engine=vllm)
# Its log-probs against the local teacher's, colocated and from a server, and a run with it: tests/engine_vllm/
# test_vllm_teacher.py (vLLM's own environment). Here: the settings' rules, the layout of its pass, and a server that
# does not answer, none of which needs vLLM.

SERVED = ["teacher.engine=vllm", "teacher.vllm.mode=server", "teacher.vllm.server_url=http://127.0.0.1:9"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.advantage=group_std", "algo.teacher_kl_coef=0", "teacher.engine=vllm"], r"teacher.engine='vllm': the teacher is read only by on-policy distillation"),
        (["algo.advantage=group_std", "algo.teacher_kl_coef=0", "teacher.vllm.request_timeout_s=5"], r"teacher.vllm.request_timeout_s=5.0: the teacher is read only"),
        ([*DISTIL, "teacher.engine=vllm"], r"algo.teacher_kl_coef=1 needs a teacher: set teacher.name_or_path .* or score on a vLLM server"),
        ([*DISTIL, "teacher.name_or_path=t", "teacher.vllm.mode=server"], r"teacher.vllm.mode='server': taken only with teacher.engine=vllm"),
        ([*DISTIL, "teacher.name_or_path=t", "teacher.engine=vllm", "teacher.vllm.server_url=http://a:1"], r"teacher.vllm.server_url='http://a:1': taken only with teacher.vllm.mode=server"),
        ([*DISTIL, *SERVED, "teacher.vllm.cpu_kv_cache_gib=2"], r"teacher.vllm.cpu_kv_cache_gib=2: taken only with teacher.vllm.mode=colocate"),
        ([*DISTIL, *SERVED, "teacher.dtype=bfloat16"], r"teacher.dtype='bfloat16': a teacher server computes in its own dtype"),
        ([*DISTIL, *SERVED[:2]], r"teacher.vllm.mode=server needs teacher.vllm.server_url"),
        ([*DISTIL, *SERVED, "rollout.temperature=0.7"], r"teacher.vllm.mode=server with rollout.temperature=0.7: .* prompt log-probs are at temperature 1"),
    ],
)  # fmt: skip
def test_a_vllm_teachers_settings_are_checked_when_the_config_loads(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
    load_config(None, [*DISTIL, *SERVED])  # a server teacher needs no teacher.name_or_path, at T = 1
    load_config(None, [*DISTIL, "teacher.name_or_path=t", "teacher.engine=vllm", "rollout.temperature=0.7"])


def test_a_colocated_vllm_teacher_without_vllm_is_refused_by_name(tmp_path, teacher_dir):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: tests/engine_vllm/test_vllm_teacher.py starts its engine")
    with pytest.raises(ConfigError, match=r"teacher.engine=vllm \(teacher.vllm.mode=colocate\) needs vLLM.*pip install"):
        trainer(tmp_path / "run", teacher_dir, "teacher.engine=vllm")


def test_a_colocated_vllm_teacher_without_vllm_is_refused_before_the_student_loads(tmp_path, teacher_dir):
    """The student here is a folder whose weights file is not one: were the check after the student's load (as it
    was), that load would fail first; the vLLM line comes before any weight is read."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: tests/engine_vllm/test_vllm_teacher.py starts its engine")
    student = save_tiny_model(tmp_path / "student")
    (student / "model.safetensors").write_bytes(b"not a safetensors file")
    cfg = load_config(None, [f"train.output_dir={tmp_path / 'run'}", "train.steps=1", *SMALL_RUN,
                             f"teacher.name_or_path={teacher_dir}", *DISTIL, "teacher.engine=vllm"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"teacher.engine=vllm \(teacher.vllm.mode=colocate\) needs vLLM"):
        GRPOTrainer(cfg, model=str(student), train_rows=ADDITION_ROWS, reward_functions=[("flat", flat, 1.0)])


class SequenceByScorer:
    """A naive-loop oracle of a vLLM scorer: each sequence alone through the teacher, log_softmax(logits / T) of its
    tokens from ``start`` on (what vLLM's prompt log-probs are with the engine's logits divided by T)."""

    def __init__(self, model, temperature):
        self.model, self.temperature = model, temperature

    def logprobs(self, sequences):
        out = []
        for ids, start in sequences:
            with torch.no_grad():
                logits = self.model(torch.tensor([ids])).logits[0].float() / self.temperature  # (L, V)
            logp = logits.log_softmax(-1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]  # (L-1,)
            out.append(logp[start - 1 :].tolist())
        return out


def test_the_vllm_pass_scores_each_rows_real_tokens_as_the_local_pass(tmp_path, teacher_dir):
    """VLLMTeacherPass's layout (left-padded prompts, right-padded completions, a multi-turn row's tool tokens attended
    but not trained) over a per-sequence oracle scorer gives the local teacher's batched pass at T = 0.7."""
    t = trainer(tmp_path / "run", teacher_dir, "rollout.temperature=0.7")
    prompts = torch.tensor([[0, 0, 2, 11, 20], [2, 12, 21, 13, 22]])  # (2, 5) the first left-padded
    prompt_mask = (prompts != 0).long()
    completion = torch.tensor([[14, 15, 1, 0, 0, 0], [16, 30, 31, 17, 1, 0]])  # (2, 6)
    context = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]])  # every real token after the prompt
    model_tokens = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 0, 0, 1, 1, 0]])  # row 2: 30, 31 are a tool's
    r = Rollout(prompts, prompt_mask, completion, model_tokens, torch.zeros(2, 6), torch.zeros(2, dtype=torch.bool),
                context_mask=context)  # fmt: skip
    want = t.teacher.logprobs(t.model, r)  # (2, 6) the local pass, batched
    got = VLLMTeacherPass(SequenceByScorer(t.teacher.model, 0.7), "oracle").logprobs(t.model, r)
    mask = model_tokens.bool()
    assert float((got - want)[mask].abs().max()) < 1e-5
    assert (got[~mask] == 0).all() and (got[mask] != 0).all()


def test_a_teacher_server_that_does_not_answer_is_a_named_error(tmp_path, teacher_dir):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    nowhere = [*SERVED[:2], f"teacher.vllm.server_url={url}", "teacher.vllm.server_timeout_s=1"]
    with pytest.raises(TeacherServerError, match=rf"no vLLM server answered at {url}/health within 1 s .*vllm serve"):
        trainer(tmp_path / "run", None, *nowhere)
    with socket.create_server(("127.0.0.1", 0)) as hung:  # listens, never answers (the kernel takes the connection)
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        with pytest.raises(TeacherServerError, match=rf"no vLLM server answered at {url}/health within 1 s \(last: no answer"):
            ServedScorer(url, server_timeout_s=1).connect()
        with pytest.raises(TeacherTimeout, match=r"did not answer scoring 1 sequences within 1 s \(teacher.vllm.request_timeout_s\)"):
            ServedScorer(url, request_timeout_s=1).logprobs([([2, 11, 20], 1)])

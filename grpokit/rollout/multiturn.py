"""Multi-turn rollouts: the model acts over several turns, a tool or an environment answers in between,
and only the model's own tokens are trained (ReTool arXiv 2504.11536, ToRL, RAGEN arXiv 2504.20073).

Each step the episodes' environments are reset from their dataset rows (grpokit.rollout.envs); then, turn after
turn, every active episode generates together in one batched call of the trainer's generator (either
grpokit.rollout.generation engine; the first turn shares each prompt's prefill over its G episodes), the
environments answer in parallel threads, and what they answer is appended. An episode ends when the
environment says done (for tools: a turn with no call), at ``max_turns``, or when the next turn would not
fit the total token budget ``max_episode_tokens`` (the last two set the truncation flag; so does a turn
cut at ``max_new_tokens`` without its EOS).

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

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from grpokit.core.errors import ConfigError, TrainingError
from grpokit.rollout.envs import Environment, EnvStep
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
    of the next assistant turn; found by rendering a fixed conversation with and without them."""

    def __init__(self, tokenizer, tools: list[dict] | None = None):
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
        self.cache: dict[tuple, list[int]] = {}

    def _render(self, messages: list[dict], generation_prompt: bool, with_tools: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools if with_tools else None,
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The first messages rendered with the tools and the opening of the model's turn."""
        if messages[-1]["role"] == "assistant":
            text = self.tokenizer.apply_chat_template(
                messages, tools=self.tools, tokenize=False, continue_final_message=True
            )
        else:
            text = self._render(messages, True)
        return self._encode(text)

    def observation_ids(self, messages: list[dict], eos_text: str) -> list[int]:
        """Ids appended after a model turn that ended with the token ``eos_text``."""
        key = (eos_text, tuple((m.get("role"), m.get("name"), str(m.get("content"))) for m in messages))
        if key not in self.cache:
            try:
                text = self._render(self.base + messages, True)
            except Exception as e:
                roles = sorted({str(m.get("role")) for m in messages})
                raise TrainingError(
                    f"the chat template cannot render the environment's messages (roles {roles}): "
                    f"{type(e).__name__}: {e}; use a template that knows these roles"
                ) from e
            if not text.startswith(self.base_text):
                raise TrainingError(
                    "the chat template renders earlier turns differently once new messages follow them, so the "
                    "ids already generated would not match what the model is trained on; use a template whose "
                    "rendering of a conversation is a prefix of the rendering of its continuation"
                )
            tail = (
                self.closing[len(eos_text) :]
                if eos_text and self.closing.startswith(eos_text)
                else self.closing
            )
            if len(self.cache) > 4096:
                self.cache.clear()
            self.cache[key] = self._encode(tail + text[len(self.base_text) :])
        return self.cache[key]


def _turn_seed(seed: int | None, turn: int) -> int | None:
    return None if seed is None else (seed * 1_000_003 + 7919 * turn) % 2**31


def run_episodes(
    generator,
    model: torch.nn.Module,
    tokenizer,
    delta: ChatDelta,
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
    eos_token_ids: list[int],
    pad_token_id: int,
    seed: int | None = None,
    threads: int = 4,
) -> EpisodeBatch:
    """G episodes for each of the P ``rows`` (``envs``: P * G fresh environments, prompt-major).

    max_new_tokens caps one model turn; max_episode_tokens caps everything after the first prompt (the
    model's tokens and the environment's). Returns the batch with its metrics."""
    G, P = group_size, len(rows)
    N = P * G
    if len(envs) != N:
        raise ValueError(f"{len(envs)} environments for {P} prompts x {G} episodes")
    if max_turns < 1 or max_episode_tokens < 1:
        raise ValueError("max_turns and max_episode_tokens must be >= 1")
    eos = set(eos_token_ids)
    episodes = []
    for i, env in enumerate(envs):
        first = env.reset(rows[i // G])
        episodes.append(Episode(messages=list(first), n_first=len(first)))
    prompts = [delta.prompt_ids(ep.messages) for ep in episodes]
    for i in range(N):
        if prompts[i] != prompts[(i // G) * G]:
            raise TrainingError(
                f"the environment's reset gave different first messages for the {G} episodes of row {i // G}; "
                "reset(row) must depend on the row only (draw randomness from the row, e.g. a seed column)"
            )
    comp: list[list[int]] = [[] for _ in range(N)]  # completion-side ids: model's and environment's
    is_model: list[list[int]] = [[] for _ in range(N)]
    lps: list[list[float]] = [[] for _ in range(N)]
    active = list(range(N))
    t_generation = t_env = 0.0
    pool = ThreadPoolExecutor(max_workers=max(1, threads))
    try:
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
                eos_token_ids=eos_token_ids,
                pad_token_id=pad_token_id,
                seed=_turn_seed(seed, turn),
            )
            if turn == 0:  # every episode is active: each prompt prefilled once for its G episodes
                out = generator.generate(model, [prompts[g * G] for g in range(P)], group_size=G, **common)
            else:
                out = generator.generate(
                    model, [prompts[i] + comp[i] for i in active], group_size=1, **common
                )
            t_generation += time.perf_counter() - t0
            gen_ids = out.completion_token_ids()  # (B,) lists, EOS included
            gen_lps = out.logprobs.float().cpu()  # (B, Lc)
            stepping: list[tuple[int, str]] = []
            for k, i in enumerate(active):
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
                    stepping.append((i, text))
                else:  # cut at max_new_tokens or by the budget: the turn is unfinished
                    ep.truncated = True
            t0 = time.perf_counter()
            answers: list[EnvStep] = list(pool.map(lambda job: envs[job[0]].step(job[1]), stepping))
            t_env += time.perf_counter() - t0
            next_active = []
            for (i, _), step in zip(stepping, answers):
                ep = episodes[i]
                ep.turn_rewards[-1] = step.reward
                ep.tool_calls += step.tool_calls
                ep.tool_errors += step.tool_errors
                ep.tool_timeouts += step.tool_timeouts
                if step.done or not step.messages:
                    ep.messages += step.messages  # a last word the model never reads: the transcript keeps it
                    continue
                if turn == max_turns - 1:
                    ep.truncated = True  # it would go on: cut by max_turns
                    continue
                obs = delta.observation_ids(step.messages, tokenizer.decode(comp[i][-1:]))
                if len(comp[i]) + len(obs) >= max_episode_tokens:  # not even one more model token fits
                    ep.truncated = True
                    continue
                comp[i] += obs
                is_model[i] += [0] * len(obs)
                lps[i] += [0.0] * len(obs)
                ep.messages += step.messages
                next_active.append(i)
            active = next_active
    finally:
        pool.shutdown(wait=True)
    rollout = _as_rollout(prompts, comp, is_model, lps, episodes, pad_token_id)
    return EpisodeBatch(rollout, episodes, episode_metrics(episodes, rollout, t_generation, t_env))


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
    """turns per episode, tool calls / errors / timeouts (per episode and in all), the share of the
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

"""The rollout section of the config tree (``rollout.*``, ``rollout.vllm.*``): how completions are sampled, by
which engine, and how asynchronous rollouts and the sampler/trainer mismatch are handled. Part of the one tree of
grpokit.config.schema (which names every section); each setting declared once (grpokit.config.declare)."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.config.checks import check_auto_bool
from grpokit.config.declare import setting
from grpokit.core.errors import ConfigError


def check_stop_strings(value, key: str) -> None:
    """rollout.stop: a list of non-empty strings."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) and s for s in value):
        raise ConfigError(f"{key}={value!r}: expected a list of non-empty strings, e.g. {key}=['</answer>']")

ENGINES = ("fast", "hf", "vllm")
"""rollout.engine: the engines of grpokit.rollout.engines (its ENGINE_CLASSES, held equal to this by a test)."""
VLLM_MODES = ("colocate", "server")
"""rollout.vllm.mode: the ways grpokit.rollout.engines.vllm runs the engine."""
WEIGHT_TRANSFERS = ("http", "collective")
"""rollout.vllm.weight_transfer: how a push reaches a server (grpokit.rollout.engines.vllm.remote, collective)."""
LORA_PUSHES = ("auto", "adapter", "merged")
"""rollout.vllm.lora_push: what grpokit.rollout.engines.vllm pushes for a LoRA policy."""
MISMATCH_CORRECTIONS = ("auto", "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""rollout.mismatch_correction: auto, and grpokit.algos.mismatch.IS_MODES."""
KV_CACHES = ("auto", "static", "dynamic")
"""rollout.kv_cache: the fast engine's KV cache (grpokit.rollout.engines.fast.decode)."""


@dataclass
class VLLMConfig:
    mode: str = setting(
        "colocate",
        """colocate: the engine in the trainer's process, beside the model it copies | server: a grpokit
        vllm-serve process at rollout.vllm.server_url (other GPUs, another node), weights pushed over HTTP or a
        process group (rollout.vllm.weight_transfer).""",
        choices=VLLM_MODES,
    )
    server_url: str = setting(
        "http://127.0.0.1:8000",
        "Server mode: the address of the grpokit vllm-serve process (its --host and --port).",
    )
    server_timeout_s: float = setting(
        240.0,
        "Server mode: seconds to wait for the server's health check at the start (it may still be loading).",
        range="(0, inf)",
        example=240,
    )
    weight_transfer: str = setting(
        "http",
        """Server mode: how a push reaches the server. http: one safetensors file in a POST (works anywhere;
        through CPU memory and the socket). collective: each tensor broadcast over a torch.distributed group of
        the trainer and the server, announced over HTTP: NCCL, GPU to GPU, when both are on CUDA (the fastest);
        gloo otherwise. The weight check runs after either.""",
        choices=WEIGHT_TRANSFERS,
    )
    collective_port: int = setting(
        51216,
        """Server mode with weight_transfer=collective: the port on the server's host where the two processes meet
        (a TCPStore the server hosts; TRL's vllm_group_port).""",
        range="[1, 65535]",
        example=51216,
    )
    sync_every: int = setting(
        1,
        """Push the trainer's weights to the engine before a training rollout when this many steps passed since
        the last push; > 1 samples off-policy (up to sync_every - 1 steps behind: rollout/weight_lag).
        Evaluation and grpokit sample always push changed weights.""",
        range="[1, inf)",
        example=1,
    )
    check_weights: bool = setting(
        True,
        """After each push, compare the engine's readable weights (embedding, norms, LM head) with the trainer's
        and its log-probs of a probe sequence with the trainer's; a difference stops the run (WeightSyncError).""",
    )
    lora_push: str = setting(
        "auto",
        """With lora.enabled, what a push sends. adapter: the adapter alone (its A and B matrices), which the engine
        applies with vLLM's LoRA support (it starts with enable_lora; a server needs grpokit vllm-serve
        --max-lora-rank); merged: the base weights with the adapter merged in (W + B A alpha / r), every weight;
        auto: the adapter where the engine takes it (targets, rank and features vLLM's LoRA supports), else merged,
        with a notice saying why.""",
        choices=LORA_PUSHES,
    )
    sync_timeout_s: float = setting(
        300.0,
        """Seconds a weight sync may take (the transfer, in-process, over HTTP or over the collective group, and the
        engine's cache reset); past them the run stops with WeightSyncTimeout instead of hanging.""",
        range="(0, inf)",
        example=300,
    )
    cpu_kv_cache_gib: int = setting(
        1,
        "CPU engine: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE unless set; vLLM's default takes most of the RAM).",
        range="[1, inf)",
        example=1,
    )
    gpu_memory_utilization: float = setting(
        0.3,
        "GPU engine: share of the GPU's memory vLLM may take (weights and KV cache); the trainer needs the rest.",
        range="(0, 1]",
        example=0.3,
    )
    sleep: bool = setting(
        False,
        """GPU engine: sleep between rollouts (level 1: weights offloaded to CPU, KV cache freed), so the update
        has that memory; woken for the next rollout. Not supported by vLLM on CPU (ignored there).""",
    )
    enforce_eager: bool | None = setting(
        None,
        "No torch.compile / CUDA graphs in the engine (null: true on CPU, where compiling takes minutes, else false).",
    )
    max_model_len: int | None = setting(
        None,
        "Prompt plus completion tokens the engine accepts (null: data.max_prompt_tokens + the completion budget).",
        range="[1, inf)",
        example=2048,
    )


@dataclass
class RolloutConfig:
    group_size: int = setting(8, "G: completions sampled per prompt.", allowed=">= 2 (GRPO compares them)")
    prompts_per_step: int = setting(
        8,
        "Prompts per optimizer rollout; the batch holds prompts_per_step * group_size completions.",
        range="[1, inf)",
        example=8,
    )
    max_new_tokens: int = setting(
        256,
        "Length limit of a completion; longer ones are truncated (and flagged).",
        range="[1, inf)",
        example=256,
    )
    temperature: float = setting(
        1.0,
        "Sampling temperature; log-probs are computed at this temperature.",
        range="(0, inf)",
        example=1.0,
        meaning="log-probs are taken at it",
    )
    top_p: float = setting(1.0, "Nucleus sampling threshold.", range="(0, 1]", example=1.0, meaning="1 = off")
    top_k: int = setting(0, "Top-k sampling (0 = off).", range="[0, inf)", example=50, meaning="0 = off")
    min_p: float = setting(
        0.0,
        """Min-p sampling: drop the tokens less likely than min_p times the most likely one (after top_k and
        top_p). The sampler's log-probs are then of the filtered distribution, which sampler_kl and
        rollout.mismatch_correction see as a gap to the trainer's (docs/guides/vllm.md#sampling-settings).""",
        range="[0, 1]",
        example=0.05,
        meaning="0 = off",
    )
    repetition_penalty: float = setting(
        1.0,
        """Repetition penalty (transformers' and vLLM's rule): the logit of a token already in the prompt or the
        completion so far is divided by it when positive, multiplied by it when negative. Evaluation decodes with
        it too, greedy included. The sampler's log-probs are of the penalised distribution (as min_p).""",
        range="(0, inf)",
        example=1.1,
        meaning="1 = off",
    )
    engine: str = setting(
        "fast",
        "fast (shared-prefix KV cache decode loop) | hf (transformers generate) | vllm (a vLLM engine, rollout.vllm).",
        choices=ENGINES,
    )
    vllm: VLLMConfig = setting(VLLMConfig(), "The vLLM engine (rollout.engine=vllm; docs/guides/vllm.md).")
    mismatch_correction: str = setting(
        "auto",
        """Importance weights pi_trainer / pi_sampler on each token's policy-gradient term, for the gap between
        the engine's log-probs and the trainer's (grpokit.algos.mismatch; TRL's vllm_importance_sampling_mode):
        token_truncate | token_mask | sequence_truncate | sequence_mask | none; auto: token_truncate with
        rollout.engine=vllm or rollout.max_staleness >= 1 (stale samples), none otherwise.""",
        choices=MISMATCH_CORRECTIONS,
    )
    mismatch_cap: float | None = setting(
        2.0,
        "Upper bound C of those weights: truncate caps them at C, mask zeroes the tokens above C (TRL's _clip_max).",
        range="(0, inf)",
        example=2.0,
        meaning="null = no upper bound",
    )
    mismatch_floor: float | None = setting(
        None,
        "Lower bound of those weights: truncate raises them to it, mask zeroes the tokens below (TRL's _clip_min).",
        range="[0, inf)",
        example=0.5,
        meaning="null = no lower bound",
    )
    max_sampler_kl: float = setting(
        0.01,
        """KL(sampler || trainer) per token (sampler_kl, k3) above which a run is warned, and stopped after 3
        steps above it in a row, each higher than the last (the gap growing until collapse).""",
        range="[0, inf)",
        example=0.01,
        meaning="0 = never warn or stop",
    )
    max_staleness: int = setting(
        0,
        """Asynchronous rollouts (docs/guides/async.md): K >= 1 generates and scores the next batches in a sampler
        process while the trainer updates; a batch more than K policy versions (steps) old is dropped. 0: the
        synchronous loop, sampling then training. CPU only for now.""",
        range="[0, inf)",
        example=1,
        meaning="0 = synchronous",
    )
    sync_every: int = setting(
        1,
        """With rollout.max_staleness >= 1: push the trainer's weights to the sampler process every this many
        steps (> 1 lets batches grow older than K, which are then dropped). rollout.vllm.sync_every is the
        vLLM engine's own.""",
        range="[1, inf)",
        example=1,
    )
    async_ratio: str = setting(
        "proximal",
        """With rollout.max_staleness >= 1, the policy ratio's denominator: proximal (the trainer's policy before
        the update; the importance weights of rollout.mismatch_correction, auto token_truncate, correct for the
        older sampler: decoupled PPO, AReaL) | behaviour (the sampler's log-probs, so the clip or the dppo_* trust
        region bounds the distance to the policy that sampled; TRL's AsyncGRPO, prime-rl; auto correction none).""",
        choices=("proximal", "behaviour"),
    )
    sampler_timeout_s: float = setting(
        60.0,
        """With rollout.max_staleness >= 1: seconds the sampler process may go without a heartbeat (it beats every
        second from a thread of its own) while the trainer waits on it; then the run stops with
        SamplerStalledError and a checkpoint (a stopped, frozen or hung process). Its first beat gets 600 s at
        least (a spawned process imports torch first).""",
        range="(0, inf)",
        example=60.0,
    )
    kv_cache: str = setting(
        "auto",
        "fast engine's cache: auto (static where the model supports it) | static | dynamic.",
        choices=KV_CACHES,
    )
    cuda_graphs: bool = setting(
        True, "fast engine with the static cache on CUDA: record each decode step once, then replay it."
    )
    compile: bool | str = setting(
        "auto",
        """fast engine with the static cache: the decode step's elementwise work (RMSNorms with their residual adds,
        RoPE, the SwiGLU gate) through torch.compile, one fused kernel each instead of ~30 per layer
        (grpokit.model.fused_layers); the first rollout compiles (seconds to a minute). auto: on a GPU with
        rollout.cuda_graphs (on an H200 generation took 0.71x the time: docs/benchmarks.md), not on a CPU.""",
        check=check_auto_bool,
        allowed="true, false or auto",
    )
    ignore_eos: bool = setting(
        False,
        "Training rollouts: an EOS sampled ends nothing; every completion runs to max_new_tokens (benchmarks).",
    )
    stop: list[str] = setting(
        [],
        """Stop strings: a completion ends at the token whose text completes one of them, kept with it (as an EOS;
        transformers' stop_strings, TRL generation_kwargs stop), in training rollouts and evaluation alike.
        Single-turn rollouts (grpokit.rollout.engines.stop).""",
        example=["</answer>"],
        check=check_stop_strings,
    )
    tools: list[str] = setting(
        [],
        """Multi-turn rollouts with tools (grpokit.rollout.episodes): python (the sandboxed interpreter),
        package.module:function or file.py:function, each a typed function with a docstring; results reach the
        model as tool messages.""",
    )
    environment: str | dict[str, str] | None = setting(
        None,
        """Multi-turn rollouts in an environment (grpokit.rollout.envs): a factory as package.module:Env or
        file.py:Env, a verifiers environment (verifiers:ENV_ID, an installed one, or verifiers:my_env.py; its
        rubric's functions become rewards), or an OpenEnv server (openenv:URL, or package.module:Env for an
        OpenEnvironment subclass). The tools its class lists in `tools` (functions or names) are offered beside
        rollout.tools. A mapping {name: environment} gives each row the one its rollout.environment_column
        names (docs/guides/environments.md).""",
    )
    environment_column: str = setting(
        "environment",
        "With rollout.environment a mapping: the data column naming each row's environment (its key).",
    )
    tool_parser: str = setting(
        "hermes",
        "How tool calls are read from a model turn: hermes (<tool_call>{json}</tool_call>) or package.module:function.",
    )
    max_turns: int = setting(
        4,
        "Multi-turn: model turns per episode at most (max_new_tokens caps each turn).",
        range="[1, inf)",
        example=4,
    )
    max_episode_tokens: int = setting(
        0,
        "Multi-turn: tokens after the prompt per episode, the model's and the tools' (0: max_turns x max_new_tokens).",
        range="[0, inf)",
        example=1024,
        meaning="0 = max_turns x max_new_tokens",
    )
    tool_timeout_s: float = setting(
        10.0,
        "Multi-turn: wall-clock budget of one tool call; past it the worker is killed and the model reads an error.",
        range="(0, inf)",
        example=10,
    )
    tool_workers: int = setting(
        2, "Multi-turn: tool calls (and environment steps) run at the same time.", range="[1, inf)", example=2
    )
    max_tool_result_chars: int = setting(
        2000,
        "Multi-turn: a tool result (or an environment's message) longer than this is cut, with a note saying so.",
        range="[1, inf)",
        example=2000,
    )
    env_timeout_s: float = setting(
        60.0,
        """Multi-turn: wall-clock budget of one reset or step of rollout.environment (each episode's environment
        runs in its own worker); past it the worker is killed and that episode fails (episodes/failed).""",
        range="(0, inf)",
        example=60,
    )
    episode_timeout_s: float = setting(
        60.0,
        """Multi-turn: seconds one episode's tool calls and environment steps may take in all; the call running
        when it is spent is stopped, and the episode ends there (truncated, episodes/over_budget) and is scored
        on its transcript so far.""",
        range="(0, inf)",
        example=60,
    )
    step_timeout_s: float = setting(
        300.0,
        """Multi-turn: seconds a rollout (a step's sampling round) may wait on tools and environments in all;
        when spent, the calls running are stopped and every episode still going ends (episodes/over_budget).""",
        range="(0, inf)",
        example=300,
    )
    tool_memory_mb: float = setting(
        2048.0,
        """Multi-turn: a tool worker's address space is capped at this many MiB above its start (a call past it
        gets MemoryError), and a worker whose resident memory grew by more than half of it (a leaking tool) is
        replaced after its call.""",
        range="(0, inf)",
        example=2048,
    )

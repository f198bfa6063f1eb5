"""One typed config tree for a run: YAML file + dotted command-line overrides.

    grpokit train cfg.yaml algo.preset=dapo rollout.group_size=16 optim.lr=1e-6

The same dotted names work in YAML and on the command line. Unknown keys and badly typed
values are rejected with a message naming the key and the nearest valid one. Algorithm
knobs left at ``None`` are filled from the chosen preset (``grpokit.algos.PRESETS``).

Each setting is declared once, in its field (grpokit.config.declare): default, description, range or
choices; the checks, ``grpokit config`` and the reference page (grpokit.config.reference) read it.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpokit.config.checks import (
    REPORT_TO,
    build_config,
    check_config,
    check_device,
    check_micro_batch_size,
    check_output_path,
    check_preset,
    check_seed,
    check_trackers,
)
from grpokit.config.declare import algo_knob, setting
from grpokit.config.run_file import check_resolved_algo, split_records, write_run_file
from grpokit.core.errors import ConfigError
from grpokit.core.yaml_io import parse_value, read_yaml_file

if TYPE_CHECKING:
    from grpokit.algos import AlgoSettings

# The names a setting may take where the code that acts on each name sits above the config layer (which
# imports only grpokit.core and grpokit.algos): the config holds the list, and tests/unit/config/
# test_declare.py holds it equal to the registry it names.
DTYPES = ("auto", "float32", "bfloat16", "float16")
"""model.dtype: the dtypes a model loads in (grpokit.model.loading.DTYPES, and auto)."""
TEMPLATE_NAMES = ("auto", "chat", "plain", "r1_zero")
"""data.template: grpokit.data.templates.TEMPLATE_NAMES."""
ENGINES = ("fast", "hf", "vllm")
"""rollout.engine: the engines of grpokit.rollout.engines (its ENGINE_CLASSES, held equal to this by a test)."""
VLLM_MODES = ("colocate", "server")
"""rollout.vllm.mode: the ways grpokit.rollout.engines.vllm runs the engine."""
WEIGHT_TRANSFERS = ("http", "collective")
LORA_PUSHES = ("auto", "adapter", "merged")
"""rollout.vllm.lora_push: what grpokit.rollout.engines.vllm pushes for a LoRA policy."""
"""rollout.vllm.weight_transfer: how a push reaches a server (grpokit.rollout.engines.vllm.remote, collective)."""
MISMATCH_CORRECTIONS = ("auto", "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""rollout.mismatch_correction: auto, and grpokit.algos.mismatch.IS_MODES."""
KV_CACHES = ("auto", "static", "dynamic")
"""rollout.kv_cache: the fast engine's KV cache (grpokit.rollout.engines.fast.decode)."""
SCHEDULES = ("constant", "cosine", "linear")
"""optim.schedule: grpokit.train.schedules.SCHEDULES."""
PRECISION_MODES = ("auto", "fp32", "bf16_mixed", "fp16_mixed", "bf16_kahan", "bf16_pure")
"""optim.precision: grpokit.model.precision.PRECISION_CHOICES."""
STRATEGIES = ("auto", "fsdp", "ddp")
"""train.distributed: grpokit.train.distributed.STRATEGIES."""


def _preset_names() -> tuple[str, ...]:
    from grpokit.algos import PRESETS  # lazy: grpokit.algos imports torch

    return tuple(PRESETS)


@dataclass
class ModelConfig:
    name_or_path: str = setting(
        "demo", 'Hugging Face model directory or hub id; "demo" builds the embedded tiny model.'
    )
    dtype: str = setting(
        "auto", "auto | float32 | bfloat16 | float16 (auto: bfloat16 on GPU, float32 on CPU).", choices=DTYPES
    )
    trust_remote_code: bool = setting(
        False, "Run code shipped with the model (off unless you trust the source)."
    )
    gradient_checkpointing: bool = setting(
        False, "Recompute activations in the backward pass to save memory."
    )
    device: str = setting(
        "auto", "auto | cpu | cuda | cuda:N.", check=check_device, allowed="auto, cpu, cuda, cuda:N or mps"
    )
    attn_implementation: str | None = setting(
        None, "Passed to from_pretrained (e.g. sdpa, eager, flash_attention_2)."
    )


@dataclass
class LoraConfig:
    enabled: bool = setting(
        False, "Train a LoRA adapter (PEFT) instead of all weights; the reference is the base model."
    )
    r: int = setting(16, "Adapter rank.", range="[1, inf)", example=16)
    alpha: int = setting(32, "LoRA scaling numerator (scale = alpha / r).", range="(0, inf)", example=32)
    dropout: float = setting(0.0, "Dropout on the adapter input.", range="[0, 1)", example=0.05)
    target_modules: list[str] = setting(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "Module names the adapter wraps."
    )


@dataclass
class SelectionConfig:
    mode: str = setting(
        "off",
        """Prompt selection from each prompt's history (grpokit.rollout.selection; docs/algorithms/selection.md):
        off | greso (a prompt all solved or all failed on its last z visits is skipped before generation with
        probability 1 - p^z and revisited on a later pass; flat groups that still come out are refilled).""",
        choices=("off", "greso"),
    )
    refill: bool = setting(
        False,
        """Also drop the groups that still come out flat (equal rewards) and generate more prompts until the step
        has rollout.prompts_per_step informative groups (at most data.selection.max_rounds extra rounds). Off: the
        skipped prompts' places go to the next ones in the stream and every step generates prompts_per_step
        prompts, as without selection (refills cost up to 2x the generation where most groups are flat).""",
    )
    max_rounds: int = setting(
        4,
        """Extra generation rounds a step may take to refill; past them it trains on some flat groups and says
        so in the metrics (selection/flat_trained).""",
        range="[0, inf)",
        example=4,
    )
    explore_start: float = setting(
        0.5,
        "GRESO's exploration probability p at the start (the same for solved and failed prompts).",
        range="(0, 1]",
        example=0.5,
    )
    explore_min: float = setting(0.05, "Lower bound of p.", range="(0, 1]", example=0.05)
    explore_max: float = setting(0.95, "Upper bound of p.", range="(0, 1]", example=0.95)
    explore_step: float = setting(
        0.01,
        "How far p moves after each step toward the target share of flat groups.",
        range="[0, 1]",
        example=0.01,
    )
    target_flat: float = setting(
        0.25,
        """Share of a step's generated groups that may come out flat (half of it all solved, half all failed);
        p goes down (skip more) while a kind's share is above its half, up while below.""",
        range="[0, 1]",
        example=0.25,
    )
    window: int = setting(
        4,
        "Visits a prompt's recent pass rate is the mean of (history, metrics, explorer).",
        range="[1, inf)",
        example=4,
    )


@dataclass
class DataConfig:
    train: str = setting(
        "",
        """Training prompts: JSONL, JSON, CSV, Parquet, a save_to_disk folder, a hub-layout folder, a glob
        (data/train-*.parquet) or a hub id (openai/gsm8k; the last three through datasets.load_dataset); or
        another ecosystem's data: reasoning_gym:TASK?size=.., verifiers:ENV_ID (a verifiers environment's dataset).""",
    )
    eval: str | None = setting(None, "Held-out prompts for evaluation (same formats).")
    config: str | None = setting(
        None,
        """Configuration (subset) of a dataset read through datasets.load_dataset, e.g. main for openai/gsm8k
        (also used for data.eval when it names the same dataset).""",
    )
    split: str | None = setting(
        None, "Split of data.train to read (default: train, or the only split there is)."
    )
    eval_split: str | None = setting(
        None, "Split of data.eval to read (default: test, or the only split there is)."
    )
    prompt_column: str = setting("prompt", "Column holding the prompt: plain text or chat messages.")
    template: str = setting(
        "auto",
        "Prompt template: auto (TRL's: chat for message lists, strings as they are) | chat | plain | r1_zero.",
        choices=TEMPLATE_NAMES,
    )
    chat_template_kwargs: dict[str, Any] = setting(
        {},
        """Extra arguments of the tokenizer's apply_chat_template (TRL's chat_template_kwargs), e.g.
        {enable_thinking: false}.""",
    )
    system_prompt: str | None = setting(None, "System message prepended for chat templates.")
    max_prompt_tokens: int = setting(
        512, "Prompts longer than this are rejected with the row named.", range="[1, inf)", example=512
    )
    shuffle: bool = setting(True, "Shuffle the training prompts each pass (seeded).")
    eval_limit: int | None = setting(
        None, "Evaluate on at most this many held-out rows.", range="[1, inf)", example=200
    )
    selection: SelectionConfig = setting(
        SelectionConfig(), "Which training prompts a step generates, from each prompt's history (issue 50)."
    )


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
    ignore_eos: bool = setting(
        False,
        "Training rollouts: an EOS sampled ends nothing; every completion runs to max_new_tokens (benchmarks).",
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


@dataclass
class AlgoConfig:
    """The algorithm: a preset, and knobs that override it when set. Each knob is a setting of
    grpokit.algos.AlgoSettings under its flat name, declared there (grpokit.algos.settings.KNOBS) with its
    description, choices and range; None takes the preset's value."""

    preset: str = setting(
        "grpo",
        "Named algorithm from grpokit.algos.PRESETS; the knobs below override it when set.",
        choices=_preset_names,
        check=check_preset,
    )
    advantage: str | None = algo_knob("advantage")
    teacher_kl_coef: float | None = algo_knob("teacher_kl_coef")
    std_ddof: int | None = algo_knob("std_ddof")
    std_eps: float | None = algo_knob("std_eps")
    reward_aggregation: str | None = algo_knob("reward_aggregation")
    surrogate: str | None = algo_knob("surrogate")
    eps_low: float | None = algo_knob("eps_low")
    eps_high: float | None = algo_knob("eps_high")
    sapo_tau_pos: float | None = algo_knob("sapo_tau_pos")
    sapo_tau_neg: float | None = algo_knob("sapo_tau_neg")
    is_cap: float | None = algo_knob("is_cap")
    vespo_k_pos: float | None = algo_knob("vespo_k_pos")
    vespo_lambda_pos: float | None = algo_knob("vespo_lambda_pos")
    vespo_k_neg: float | None = algo_knob("vespo_k_neg")
    vespo_lambda_neg: float | None = algo_knob("vespo_lambda_neg")
    off_policy_mask: float | None = algo_knob("off_policy_mask")
    top_entropy_quantile: float | None = algo_knob("top_entropy_quantile")
    cov_penalty: str | None = algo_knob("cov_penalty")
    cov_ratio: float | None = algo_knob("cov_ratio")
    kl_cov_coef: float | None = algo_knob("kl_cov_coef")
    clip_cov_lb: float | None = algo_knob("clip_cov_lb")
    clip_cov_ub: float | None = algo_knob("clip_cov_ub")
    entropy_coef: float | None = algo_knob("entropy_coef")
    adaptive_entropy: bool | None = algo_knob("adaptive_entropy")
    entropy_target: float | None = algo_knob("entropy_target")
    entropy_coef_delta: float | None = algo_knob("entropy_coef_delta")
    entropy_coef_min: float | None = algo_knob("entropy_coef_min")
    entropy_coef_max: float | None = algo_knob("entropy_coef_max")
    ratio_level: str | None = algo_knob("ratio_level")
    loss: str | None = algo_knob("loss")
    agg: str | None = algo_knob("agg")
    beta: float | None = algo_knob("beta")
    kl_kind: str | None = algo_knob("kl_kind")
    kl_reward_coef: float | None = algo_knob("kl_reward_coef")
    kl_is_correction: bool | None = algo_knob("kl_is_correction")
    norm_len: int | None = algo_knob("norm_len")
    dual_clip: float | None = algo_knob("dual_clip")
    dynamic_sampling: bool | None = algo_knob("dynamic_sampling")
    max_sampling_rounds: int | None = algo_knob("max_sampling_rounds")
    overlong_shaping: bool | None = algo_knob("overlong_shaping")
    overlong_buffer: int | None = algo_knob("overlong_buffer")
    mask_truncated: bool | None = algo_knob("mask_truncated")
    gamma: float | None = algo_knob("gamma")
    lam: float | None = algo_knob("lam")


@dataclass
class TeacherConfig:
    """On-policy distillation's teacher (grpokit.train.teacher): read with algo.teacher_kl_coef > 0."""

    name_or_path: str | None = setting(
        None,
        """The teacher model (TRL teacher_model_name_or_path): a folder of a causal LM, or a model id the hub cache
        holds, that shares the student's tokenizer. Frozen, in eval mode, it scores every token the student
        samples; w (log pi_teacher - log pi_student) is the token's advantage (algo.teacher_kl_coef = w). None:
        no teacher.""",
    )
    dtype: str = setting(
        "auto",
        "The teacher's weights (TRL teacher_model_init_kwargs' dtype): auto (the policy's) | float32 | bfloat16 | "
        "float16.",
        choices=DTYPES,
    )


@dataclass
class CriticConfig:
    path: str | None = setting(
        None,
        """Critic weights (an AutoModelForTokenClassification folder, num_labels=1, or a causal LM whose backbone
        is used); None: a copy of the policy's backbone with a zero-initialised value head. Needs a critic-based
        estimator (algo.preset=ppo or algo.advantage=gae); otherwise every critic.* setting must stay default.""",
    )
    lr: float = setting(
        1e-5,
        "AdamW learning rate of the critic (follows optim.warmup_steps / optim.schedule like the policy's).",
        range="(0, 1]",
        example="1e-5",
    )
    value_coef: float = setting(
        0.1,
        "Coefficient of the value loss (TRL's vf_coef); with AdamW it matters through optim.max_grad_norm.",
        range="(0, inf)",
        example=0.1,
    )
    cliprange_value: float | None = setting(
        0.2,
        "Value clipping c: V within V_old +- c in the clipped value loss (null = unclipped squared error).",
        range="(0, inf)",
        example=0.2,
        meaning="null = no value clipping",
    )
    warmup_steps: int = setting(
        0,
        "For the first this many steps only the critic is updated; the policy's weights stay as they are.",
        range="[0, inf)",
        example=5,
        meaning="0 = the policy trains from the first step",
    )


@dataclass
class OptimConfig:
    lr: float = setting(1e-6, "AdamW learning rate.", range="(0, 1]", example="1e-6")
    weight_decay: float = setting(0.0, "AdamW weight decay.", range="[0, inf)", example=0.01)
    adam_beta1: float = setting(0.9, "AdamW beta1.", range="[0, 1)", example=0.9)
    adam_beta2: float = setting(0.99, "AdamW beta2.", range="[0, 1)", example=0.99)
    adam_epsilon: float = setting(1e-8, "AdamW epsilon (TRL's adam_epsilon).", range="(0, 1)", example="1e-8")
    warmup_steps: int = setting(
        0,
        "Linear warm-up, in training steps (rollouts; grpokit.train.schedules).",
        range="[0, inf)",
        example=10,
    )
    warmup_ratio: float = setting(
        0.0,
        "Warm-up as a share of train.steps, ceil(ratio * steps) (TRL's warmup_ratio); overrides warmup_steps.",
        range="[0, 1]",
        example=0.1,
        meaning="0 = use optim.warmup_steps",
    )
    schedule: str = setting(
        "constant",
        "constant | cosine | linear (transformers' linear decay to 0, TRL's default), after warm-up.",
        choices=SCHEDULES,
    )
    max_grad_norm: float = setting(
        1.0,
        "Gradient clipping by global norm (0 = off).",
        range="[0, inf)",
        example=1.0,
        meaning="0 = no clipping",
    )
    epochs: int = setting(1, "mu: passes over each rollout batch.", range="[1, inf)", example=1)
    mini_batches: int = setting(
        1,
        "Optimizer steps per pass over a rollout batch.",
        range="[1, inf)",
        example=1,
        allowed=">= 1, dividing rollout.prompts_per_step * rollout.group_size",
    )
    micro_batch_size: int | str = setting(
        "auto",
        """Completions per forward/backward (gradient accumulation fills the mini-batch). auto: on CUDA the
        whole mini-batch, halved after an out-of-memory error; on CPU as many as fit 4096 tokens.""",
        check=check_micro_batch_size,
        allowed="auto or an integer >= 1",
    )
    logprob_chunk_size: int = setting(
        1024, "Rows of hidden states projected to the vocabulary at a time.", range="[1, inf)", example=1024
    )
    packing: bool = setting(
        False,
        """Padding-free micro-batches in the update and every log-prob pass (policy, old policy, reference,
        critic): a micro-batch's rows laid end to end, positions restarting at each, attention kept inside
        each row, at most optim.micro_batch_tokens real tokens a micro-batch (optim.micro_batch_size is not
        read). The same gradient as padded; the model's attention must read packed position_ids (checked
        when the trainer is built). grpokit sft: the same as sft.packing.""",
    )
    micro_batch_tokens: int | str = setting(
        "auto",
        """Under optim.packing: real tokens (prompt + completion) per micro-batch; a longer row goes alone.
        auto: on CUDA the whole mini-batch, halved after an out-of-memory error; elsewhere 4096.""",
        check=check_micro_batch_size,
        allowed="auto or an integer >= 1",
    )
    offload_optimizer: bool = setting(
        False,
        """AdamW's states and its copy of the weights in CPU memory, stepped there: the GPU keeps weights and
        gradients only (grpokit.model.offload). Not with fp16_mixed.""",
    )
    offload_reference: bool = setting(
        False, "The frozen reference model kept in CPU memory, moved to the GPU for its log-prob pass only."
    )
    offload_activations: bool = setting(
        False,
        """Tensors the backward pass needs (with model.gradient_checkpointing: each layer's input) kept in
        CPU memory until then.""",
    )
    precision: str = setting(
        "auto",
        """auto | fp32 | bf16_mixed | fp16_mixed | bf16_kahan | bf16_pure: how weights are stored, computed
        with and updated (grpokit.model.precision). auto follows model.dtype: float32 -> fp32 (16 bytes/param),
        bfloat16 -> bf16_kahan (10 bytes/param), float16 -> fp16_mixed (16, loss scaling). bf16_mixed is
        TRL's bf16=True (float32 master weights, 16). bf16_pure (8) drops most updates at lr 1e-6: explicit only.""",
        choices=PRECISION_MODES,
    )


@dataclass
class RewardSpec:
    name: str = setting("math_accuracy", "Built-in name, module:function, or path/to/file.py:function.")
    weight: float = setting(
        1.0, "Weight of this function in the total reward.", range="(-inf, inf)", example=1.0
    )
    kwargs: dict[str, Any] = setting(
        {}, "Arguments for a built-in factory (e.g. max_len for overlong_penalty)."
    )


@dataclass
class EvalConfig:
    every: int = setting(
        0,
        "Evaluate every this many training steps, i.e. rollouts, not optimizer steps (0 = only before and after training).",
        range="[0, inf)",
        example=50,
        meaning="0 = only before and after training",
    )
    num_samples: int = setting(4, "k of the sampled mean@k.", range="[1, inf)", example=4)
    temperature: float = setting(1.0, "Temperature of the sampled evaluation.", range="[0, inf)", example=1.0)
    max_new_tokens: int | None = setting(
        None, "Defaults to rollout.max_new_tokens.", range="[1, inf)", example=256
    )
    enabled: bool = setting(True, "Evaluate before and after training when held-out data exists.")


@dataclass
class TrainConfig:
    steps: int = setting(
        100,
        "Training steps, each one rollout (optim.mini_batches x optim.epochs optimizer steps).",
        range="[1, inf)",
        example=200,
    )
    num_train_epochs: float | None = setting(
        None,
        """Passes over the training prompts (TRL's num_train_epochs); when set, train.steps becomes
        ceil(num_train_epochs * prompts / rollout.prompts_per_step).""",
        range="(0, inf)",
        example=3,
        meaning="null = train.steps",
    )
    max_cpu_seconds: float | None = setting(
        None,
        """Stop once the training steps have used this many CPU seconds (this process and its children: reward
        workers; grpokit.core.clock), at the end of the step that reaches it, as a finished run with a checkpoint;
        summary.json records train_cpu_seconds and budget_reached. CPU seconds, not the wall clock: the same work
        takes about the same CPU time on a busy machine (a GPU's time is not in it: a budget for CPU runs). A resumed
        run goes on from the seconds its checkpoint recorded, so the budget is spent once however often the run is
        stopped and resumed (a kill's lost steps, redone, count once).""",
        range="(0, inf)",
        example=120,
        meaning="null = train.steps alone",
    )
    seed: int = setting(
        0, "Seed of data order, sampling and initialisation.", check=check_seed, allowed=">= 0 and < 2**63"
    )
    output_dir: str = setting(
        "runs/grpokit",
        "Where metrics, checkpoints, samples and plots go.",
        check=check_output_path,
        allowed="a folder (not empty)",
    )
    save_every: int = setting(
        0,
        "Checkpoint every this many training steps, i.e. rollouts, not optimizer steps (0 = only at the end).",
        range="[0, inf)",
        example=50,
        meaning="0 = only at the end",
    )
    keep_checkpoints: int = setting(
        2,
        "How many step checkpoints to keep (0 = keep all); every step_N folder in the run counts.",
        range="[0, inf)",
        example=2,
        meaning="0 = keep all",
    )
    samples_every: int = setting(
        10,
        "Save sample completions every this many steps (0 = never).",
        range="[0, inf)",
        example=10,
        meaning="0 = never",
    )
    tensorboard: bool = setting(
        True, "Write TensorBoard scalars (false drops tensorboard from train.report_to)."
    )
    report_to: list[str] | str = setting(
        "tensorboard",
        """Experiment trackers: tensorboard | wandb | mlflow | none, or a list ([tensorboard, wandb]); wandb and
        mlflow are extras (pip install 'grpokit[wandb]', 'grpokit[mlflow]'), configured by their own env vars.""",
        choices=tuple(REPORT_TO),
        check=check_trackers,
    )
    accuracy_reward: str | None = setting(
        None,
        """Reward whose value 1 means correct: accuracy, eval pass@1 / maj@k, the flat-reward check. Unset: the one
        verifier among the rewards (math_accuracy, code_tests, a function named *accuracy* or
        *correct*), else the only reward that is not a format/length one (the run says which); several
        verifiers are refused until one is named; otherwise none, never a guess: no accuracy metric, said when the
        run starts (grpokit.rewards.which_accuracy).""",
    )
    reward_timeout_s: float = setting(
        120.0,
        "A reward function taking longer is reported and counted as failed.",
        range="(0, inf)",
        example=120,
    )
    max_reward_failure_frac: float = setting(
        0.0,
        """Share of a step's completions on which one reward function may fail (raise, return a value that
        is not a number or None, NaN or inf, time out as a whole, kill its worker) and still only score 0
        there; more stops the run with the reason and the first failing row. 0 = strict: any failure stops
        the run. A function that fails on every completion of a step always stops it. Failures are counted
        in reward/<name>/failed_rows; per-completion timeouts (math_accuracy) score 0 and are not failures,
        unless every completion of the step timed out.""",
        range="[0, 1]",
        example=0.05,
        meaning="0 = any failure stops the run",
    )
    stop_after_flat_steps: int = setting(
        5,
        """Stop (with the likely cause) after this many consecutive steps in which no group has any reward
        spread: every advantage is 0 and nothing is learnt. A warning comes at the first such step. 0 = never.""",
        range="[0, inf)",
        example=5,
        meaning="0 = never stop",
    )
    distributed: str = setting(
        "auto",
        "Under torchrun (WORLD_SIZE > 1): fsdp (shard with FSDP2) | ddp | auto (ddp with LoRA, else fsdp).",
        choices=STRATEGIES,
    )
    plots: bool = setting(
        True,
        """Draw curves.png when the run ends (matplotlib: a few seconds, counted in summary.json's
        seconds_after_steps); false leaves it out, and grpokit.run.plots.plot_training_curves draws it later from
        metrics.jsonl.""",
    )
    defaults: str = setting(
        "grpokit",
        """grpokit | trl: trl lays TRL GRPOConfig's defaults under this config wherever a setting is left unset or at
        grpokit's default (optim.adam_beta2 0.999, algo.std_eps 1e-4, algo.beta 0 and token-mean unless algo.preset
        is chosen, train.stop_after_flat_steps 0, optim.schedule linear, rollout.max_new_tokens 512, train.seed 42,
        model.gradient_checkpointing, 3 epochs unless train.steps is set; grpokit.config.trl.with_trl_defaults). The
        list and why grpokit's differ: docs/guides/from-trl.md.""",
        choices=("grpokit", "trl"),
    )


@dataclass
class Config:
    """The config tree of ``grpokit train``."""

    model: ModelConfig = setting(ModelConfig(), "The policy model and how it loads.")
    lora: LoraConfig = setting(LoraConfig(), "A LoRA adapter instead of full fine-tuning.")
    data: DataConfig = setting(DataConfig(), "The training and held-out prompts, and how they are rendered.")
    rollout: RolloutConfig = setting(RolloutConfig(), "Sampling the completions of a training step.")
    algo: AlgoConfig = setting(AlgoConfig(), "The algorithm: a preset and the knobs that override it.")
    critic: CriticConfig = setting(
        CriticConfig(), "The value model of the critic-based estimators (PPO's GAE)."
    )
    teacher: TeacherConfig = setting(
        TeacherConfig(), "On-policy distillation's teacher (with algo.teacher_kl_coef > 0)."
    )
    optim: OptimConfig = setting(OptimConfig(), "The optimizer, its schedule, batching and precision.")
    rewards: list[RewardSpec] = setting([RewardSpec()], "The reward functions, summed with their weights.")
    eval: EvalConfig = setting(EvalConfig(), "Evaluation on the held-out prompts.")
    train: TrainConfig = setting(TrainConfig(), "The run: steps, checkpoints, logging, reward failures.")


def config_from_dict(values: dict[str, Any]) -> Config:
    """Build and validate a Config from a nested mapping (as read from YAML)."""
    if not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(values).__name__}")
    if isinstance(values.get("train"), dict) and values["train"].get("defaults") == "trl":
        from grpokit.config.trl import with_trl_defaults

        values = with_trl_defaults(values, config_to_dict(Config()))  # TRL's defaults under the given values
    cfg = build_config(Config, values)
    check_config(cfg)
    return cfg


def validated(cfg: Config) -> Config:
    """The one validation path of the CLI and the Python API: a Config built in code (``GRPOTrainer(cfg)``)
    is rebuilt from its values with the same type checks, ranges and rules as a YAML file's. Returns the
    rebuilt copy; raises ConfigError naming the key."""
    if not isinstance(cfg, Config):
        raise ConfigError(
            f"expected a grpokit.config.schema.Config, got {type(cfg).__name__} (load_config builds one)"
        )
    return config_from_dict(config_to_dict(cfg))


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML: numbers, bools, lists, null; numbers keep
    their text for keys that hold text, see grpokit.core.yaml_io)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value (e.g. optim.lr=1e-6)")
    key, raw = text.split("=", 1)
    return key.strip().split("."), parse_value(raw, f"override {text!r}")


def apply_overrides(values: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Lay ``section.key=value`` overrides over nested ``values`` (in place; also returned)."""
    for text in overrides:
        keys, value = parse_override(text)
        node = values
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: '{k}' is not a section")
        node[keys[-1]] = value
    return values


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *, build=None
) -> Config:
    """Read a YAML file (optional), apply dotted overrides, validate, return the Config. ``build``: another
    config tree's builder (grpokit.config.sft.sft_config_from_dict) instead of config_from_dict."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        values = read_yaml_file(p) or {}  # refuses a missing or non-UTF-8 file, bad YAML, a key given twice
        if not isinstance(values, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections (model:, data:, ...)")
        values, records = split_records(values)  # an OUTPUT/config.yaml's records of the run (run_file)
        values = _from_trl_if_flat(values, p) if build is None else values
        if build is None and "resolved_algo" in records:  # the file alone, before overrides change it on purpose
            _check_recorded_algo(copy.deepcopy(values), records["resolved_algo"], p)
    apply_overrides(values, overrides)
    try:
        return (build or config_from_dict)(values)
    except ConfigError as e:
        where = f"{path}: " if path is not None else ""
        raise ConfigError(f"{where}{e}") from None


def _check_recorded_algo(values: dict[str, Any], recorded: Any, path: Path) -> None:
    """An OUTPUT/config.yaml's settings still resolve to the algorithm it records (run_file.check_resolved_algo);
    a file that does not load alone is left to the real load to report."""
    try:
        now = resolve_algo(config_from_dict(values)).flat()
    except ConfigError:
        return
    check_resolved_algo(recorded, now, str(path))


def _from_trl_if_flat(values: dict[str, Any], path: Path) -> dict[str, Any]:
    """A flat TRL GRPOConfig file is converted (grpokit.config.trl), its notes printed once."""
    import sys

    from grpokit.config.trl import from_trl, looks_like_trl

    if not looks_like_trl(values):
        return values
    try:
        converted, notes = from_trl(values)
    except ConfigError as e:
        raise ConfigError(f"{path} (a TRL GRPOConfig): {e}") from None
    print(
        f"grpokit: {path} holds TRL GRPOConfig fields; converted (grpokit config --from-trl {path} shows the "
        "result):\n" + "\n".join(f"  - {n}" for n in notes),
        file=sys.stderr,
    )
    return converted


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path, resolved_algo: Any = None, given: dict[str, Any] | None = None) -> list[str]:
    """Write OUTPUT/config.yaml (grpokit.config.run_file): the config, `resolved_algo` (an AlgoSettings) by its flat
    names, and `given` (run_file.given_in_code: what the run was given in code). Returns the parts the file cannot
    load again (said in it and once on stdout)."""
    flat = resolved_algo.flat() if hasattr(resolved_algo, "flat") else resolved_algo
    command = "grpokit sft" if hasattr(cfg, "sft") else "grpokit train"  # an SFTConfig has its sft section
    return write_run_file(path, dataclasses.asdict(cfg), flat, given, command)


def resolve_algo(cfg: Config) -> AlgoSettings:
    """The preset's AlgoSettings with every explicitly set ``algo.*`` knob laid over it, and the
    length-relative settings turned into tokens (norm_len, overlong_buffer) from rollout.max_new_tokens."""
    from grpokit.algos import KNOBS, PRESETS, get_advantage, get_loss

    overrides = {key: getattr(cfg.algo, key) for key in KNOBS}
    try:
        settings = PRESETS[cfg.algo.preset].override(**overrides)
        get_advantage(settings.advantage.estimator)  # a 'module:function' of your own is imported now
        get_loss(settings.loss.name)
        max_len = cfg.rollout.max_new_tokens
        norm_len = settings.loss.norm_len
        buffer = settings.batch.overlong_buffer
        return settings.override(
            norm_len=max_len if norm_len in (None, "max_completion_length") else norm_len,
            overlong_buffer=max(1, int(max_len * (buffer or 0.25)))
            if not isinstance(buffer, int)
            else buffer,
        )
    except ValueError as e:
        raise ConfigError(f"algo: {e}") from e

"""The sections of the config tree that say how the policy learns: ``algo.*`` (the preset and its knobs),
``teacher.*`` (on-policy distillation), ``critic.*`` (PPO's value model) and ``optim.*`` (optimizer, precision,
micro-batching, memory). Part of the one tree of grpokit.config.schema; each setting declared once
(grpokit.config.declare)."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.config.checks import check_auto_bool, check_micro_batch_size, check_preset
from grpokit.config.declare import algo_knob, setting

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""model.dtype: the dtypes a model loads in (grpokit.model.loading.DTYPES, and auto)."""
SCHEDULES = ("constant", "cosine", "linear")
"""optim.schedule: grpokit.train.schedules.SCHEDULES."""
PRECISION_MODES = ("auto", "fp32", "bf16_mixed", "fp16_mixed", "bf16_kahan", "bf16_pure")
"""optim.precision: grpokit.model.precision.PRECISION_CHOICES."""


def _preset_names() -> tuple[str, ...]:
    from grpokit.algos import PRESETS  # lazy: grpokit.algos imports torch

    return tuple(PRESETS)


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
    ref_sync_every: int | None = algo_knob("ref_sync_every")
    ref_sync_alpha: float | None = algo_knob("ref_sync_alpha")
    norm_len: int | None = algo_knob("norm_len")
    dual_clip: float | None = algo_knob("dual_clip")
    dynamic_sampling: bool | None = algo_knob("dynamic_sampling")
    max_sampling_rounds: int | None = algo_knob("max_sampling_rounds")
    overlong_shaping: bool | None = algo_knob("overlong_shaping")
    overlong_buffer: int | None = algo_knob("overlong_buffer")
    mask_truncated: bool | None = algo_knob("mask_truncated")
    gamma: float | None = algo_knob("gamma")
    lam: float | None = algo_knob("lam")


TEACHER_ENGINES = ("local", "vllm")
"""teacher.engine: where the teacher's pass runs (grpokit.train.teacher)."""
TEACHER_VLLM_MODES = ("colocate", "server")
"""teacher.vllm.mode: a vLLM engine of the teacher in the trainer's process, or a vLLM server started apart."""


@dataclass
class TeacherVLLMConfig:
    """A teacher served by vLLM (teacher.engine=vllm; grpokit.rollout.engines.vllm.teacher)."""

    mode: str = setting(
        "colocate",
        """colocate: a vLLM engine of teacher.name_or_path in the trainer's process (beside the rollout engine,
        if that is vLLM too) | server: a vLLM OpenAI-compatible server started apart (vllm serve TEACHER) at
        teacher.vllm.server_url (TRL's vllm_mode).""",
        choices=TEACHER_VLLM_MODES,
    )
    server_url: str | None = setting(
        None,
        """Server mode: the address of the teacher's vLLM server (TRL teacher_model_server_url), e.g.
        http://127.0.0.1:8001; its /v1/completions scores the student's tokens (prompt_logprobs).""",
    )
    server_timeout_s: float = setting(
        240.0,
        "Server mode: seconds to wait for the server's health check at the start (it may still be loading).",
        range="(0, inf)",
        example=240,
    )
    request_timeout_s: float = setting(
        600.0,
        """Server mode: seconds one scoring request may go unanswered (TRL's request_timeout); past them the run
        stops with TeacherTimeout instead of hanging.""",
        range="(0, inf)",
        example=600,
    )
    gpu_memory_utilization: float = setting(
        0.3,
        """Colocated on a GPU: share of the GPU's memory the teacher's engine may take (its weights and KV cache),
        beside the trainer and a vLLM rollout engine's own share.""",
        range="(0, 1]",
        example=0.3,
    )
    cpu_kv_cache_gib: int = setting(
        1,
        "Colocated on a CPU: GiB of the teacher engine's KV cache (VLLM_CPU_KVCACHE_SPACE unless already set).",
        range="[1, inf)",
        example=1,
    )


@dataclass
class TeacherConfig:
    """On-policy distillation's teacher (grpokit.train.teacher): read with algo.teacher_kl_coef > 0."""

    name_or_path: str | None = setting(
        None,
        """The teacher model (TRL teacher_model_name_or_path): a folder of a causal LM, or a model id the hub cache
        holds, that shares the student's tokenizer. Frozen, in eval mode, it scores every token the student
        samples; w (log pi_teacher - log pi_student) is the token's advantage (algo.teacher_kl_coef = w). None:
        no teacher; with teacher.vllm.mode=server, the server's own model.""",
    )
    dtype: str = setting(
        "auto",
        "The teacher's weights (TRL teacher_model_init_kwargs' dtype): auto (the policy's) | float32 | bfloat16 | "
        "float16.",
        choices=DTYPES,
    )
    engine: str = setting(
        "local",
        """Where the teacher's pass runs. local: the model loaded with transformers in the trainer, its pass the
        reference's | vllm: a vLLM engine's prompt log-probs of the student's prompt and completion
        (teacher.vllm.*), colocated or on a server.""",
        choices=TEACHER_ENGINES,
    )
    vllm: TeacherVLLMConfig = setting(
        TeacherVLLMConfig(), "A teacher served by vLLM (teacher.engine=vllm; docs/algorithms/distillation.md)."
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
    shared_prefix: bool | str = setting(
        "auto",
        """Run each group's prompt through the model once in the update and the log-prob passes, its completions
        on that prompt's KV cache (grpokit.model.shared_prefix): the same log-probs and gradient up to float
        rounding, for G times fewer prompt tokens. auto: on a CPU, not on a GPU (on an H200 the padded forward
        was 1.35x faster in the reference pass and 1.55x in the update: docs/benchmarks.md). Applies to
        single-turn batches, not packed, on one process, under a model whose transformers KV cache is the plain
        dynamic one (checked once against the padded forward); in the update under model.gradient_checkpointing,
        to the Llama family (Llama, Qwen2, Qwen3, Mistral without a sliding window), whose layers grpokit then
        runs itself, each checkpointed. Elsewhere the padded forward runs.""",
        check=check_auto_bool,
        allowed="true, false or auto",
    )
    fused_logprobs: bool = setting(
        False,
        """Each LM-head chunk's log-softmax at the completion tokens, its entropy and its backward as a few kernels
        compiled by torch.compile (grpokit.model.fused_logprobs) instead of ~15 float32 passes over the
        vocabulary: the same values up to float rounding. In the update and every log-prob pass; not with a
        logit softcap or the entropy bonus (those chunks run as before). The first passes compile.""",
    )
    skip_flat_rows: bool = setting(
        True,
        """Leave the completions whose advantage is exactly 0 (a group whose rewards all match) out of the update's
        forward and backward passes when the loss gives them no gradient: a built-in loss and surrogate, no KL
        term in the loss (algo.beta 0), no entropy bonus, no KL-Cov penalty, one process (not under torchrun), and
        not at a step whose tokens are saved for the explorer. The same loss and gradient up to float rounding
        (every surrogate is a multiple of A), at the cost of the rows trained; the update's per-token metrics
        (pg_loss, clip_frac, ratio_*, kl, entropy, sampler_*) are then over the rows it ran, and
        update/skipped_rows says the share left out.""",
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

"""One typed config tree for a run: YAML file + dotted command-line overrides.

    grpokit train cfg.yaml algo.preset=dapo rollout.group_size=16 optim.lr=1e-6

The same dotted names work in YAML and on the command line. Unknown keys and badly typed
values are rejected with a message naming the key and the nearest valid one. Algorithm
knobs left at ``None`` are filled from the chosen preset (``grpokit.algos.PRESETS``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from grpokit.config.checks import KV_CACHES, build_config, check_config  # noqa: F401 (KV_CACHES re-exported)
from grpokit.core.errors import ConfigError
from grpokit.core.yaml_io import parse_value, read_yaml_file

if TYPE_CHECKING:
    from grpokit.algos import AlgoSettings


@dataclass
class ModelConfig:
    name_or_path: str = "demo"
    """Hugging Face model directory or hub id; "demo" builds the embedded tiny model."""
    dtype: str = "auto"
    """auto | float32 | bfloat16 | float16 (auto: bfloat16 on GPU, float32 on CPU)."""
    trust_remote_code: bool = False
    """Run code shipped with the model (off unless you trust the source)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    attn_implementation: str | None = None
    """Passed to from_pretrained (e.g. sdpa, eager, flash_attention_2)."""


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train a LoRA adapter (PEFT) instead of all weights; the reference is the base model."""
    r: int = 16
    """Adapter rank."""
    alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names the adapter wraps."""


@dataclass
class DataConfig:
    train: str = ""
    """Training prompts: JSONL, JSON, CSV, Parquet, a save_to_disk folder, a hub-layout folder, a glob
    (data/train-*.parquet) or a hub id (openai/gsm8k; the last three through datasets.load_dataset)."""
    eval: str | None = None
    """Held-out prompts for evaluation (same formats)."""
    config: str | None = None
    """Configuration (subset) of a dataset read through datasets.load_dataset, e.g. main for openai/gsm8k
    (also used for data.eval when it names the same dataset)."""
    split: str | None = None
    """Split of data.train to read (default: train, or the only split there is)."""
    eval_split: str | None = None
    """Split of data.eval to read (default: test, or the only split there is)."""
    prompt_column: str = "prompt"
    """Column holding the prompt: plain text or chat messages."""
    template: str = "auto"
    """Prompt template: auto (TRL's: chat for message lists, strings as they are) | chat | plain | r1_zero."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra arguments of the tokenizer's apply_chat_template (TRL's chat_template_kwargs), e.g.
    {enable_thinking: false}."""
    system_prompt: str | None = None
    """System message prepended for chat templates."""
    max_prompt_tokens: int = 512
    """Prompts longer than this are rejected with the row named."""
    shuffle: bool = True
    """Shuffle the training prompts each pass (seeded)."""
    eval_limit: int | None = None
    """Evaluate on at most this many held-out rows."""


@dataclass
class RolloutConfig:
    group_size: int = 8
    """G: completions sampled per prompt."""
    prompts_per_step: int = 8
    """Prompts per optimizer rollout; the batch holds prompts_per_step * group_size completions."""
    max_new_tokens: int = 256
    """Length limit of a completion; longer ones are truncated (and flagged)."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed at this temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    engine: str = "fast"
    """fast (shared-prefix KV cache decode loop) | hf (transformers generate)."""
    kv_cache: str = "auto"
    """fast engine's cache: auto (static where the model supports it) | static | dynamic."""
    cuda_graphs: bool = True
    """fast engine with the static cache on CUDA: record each decode step once, then replay it."""
    ignore_eos: bool = False
    """Training rollouts: an EOS sampled ends nothing; every completion runs to max_new_tokens (benchmarks)."""
    tools: list[str] = field(default_factory=list)
    """Multi-turn rollouts with tools (grpokit.rollout.episodes): python (the sandboxed interpreter), package.module:function
    or file.py:function, each a typed function with a docstring; results reach the model as tool messages."""
    environment: str | None = None
    """Multi-turn rollouts in an environment (grpokit.rollout.envs): a factory as package.module:Env or file.py:Env."""
    tool_parser: str = "hermes"
    """How tool calls are read from a model turn: hermes (<tool_call>{json}</tool_call>) or package.module:function."""
    max_turns: int = 4
    """Multi-turn: model turns per episode at most (max_new_tokens caps each turn)."""
    max_episode_tokens: int = 0
    """Multi-turn: tokens after the prompt per episode, the model's and the tools' (0: max_turns x max_new_tokens)."""
    tool_timeout_s: float = 10.0
    """Multi-turn: wall-clock budget of one tool call; past it the worker is killed and the model reads an error."""
    tool_workers: int = 2
    """Multi-turn: tool calls (and environment steps) run at the same time."""
    max_tool_result_chars: int = 2000
    """Multi-turn: a tool result longer than this is cut, with a note saying so."""


@dataclass
class AlgoConfig:
    preset: str = "grpo"
    """Named algorithm from grpokit.algos.PRESETS; the knobs below override it when set. Each knob is a
    setting of grpokit.algos.AlgoSettings under its flat name (KNOBS), which holds its choices and range."""
    advantage: str | None = None
    """An estimator of grpokit.algos.ADVANTAGES (group_std, group_centre, leave_one_out, token_whiten, ...)
    or your own as package.module:function."""
    std_ddof: int | None = None
    """Degrees of freedom of the group std (1 = unbiased, as TRL/verl)."""
    std_eps: float | None = None
    """Added to the std before dividing (preset: 1e-6; TRL: 1e-4)."""
    eps_low: float | None = None
    """Lower clip range: ratio >= 1 - eps_low."""
    eps_high: float | None = None
    """Upper clip range: ratio <= 1 + eps_high (DAPO clip-higher)."""
    ratio_level: str | None = None
    """token | sequence (GSPO) | sequence_token (GSPO-token)."""
    loss: str | None = None
    """Policy loss of grpokit.algos.LOSSES (clipped) or your own as package.module:function."""
    agg: str | None = None
    """seq-mean-token-mean | token-mean | seq-sum-norm."""
    beta: float | None = None
    """KL coefficient to the frozen reference (0 = no reference model)."""
    kl_kind: str | None = None
    """k1 | k2 | k3 (of the KL loss, and of the logged kl metric)."""
    kl_reward_coef: float | None = None
    """KL in the reward: -kl_reward_coef * k1 on every token's reward, as PPO/REINFORCE++ (0 = none)."""
    norm_len: int | None = None
    """Constant length normaliser of seq-sum-norm (default: rollout.max_new_tokens)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (None = off)."""
    dynamic_sampling: bool | None = None
    """DAPO: drop zero-variance groups and sample more prompts to refill the batch."""
    max_sampling_rounds: int | None = None
    """Extra sampling rounds dynamic sampling may take before giving up with an error (preset: 4)."""
    overlong_shaping: bool | None = None
    """DAPO: soft length penalty in the last overlong_buffer tokens."""
    overlong_buffer: int | None = None
    """L_cache of DAPO's overlong shaping, in tokens (default: a quarter of max_new_tokens)."""
    mask_truncated: bool | None = None
    """DAPO overlong filtering: no loss on truncated completions."""
    gamma: float | None = None
    """GAE discount of the critic-based estimators (gae; preset ppo: 1.0)."""
    lam: float | None = None
    """GAE lambda of the critic-based estimators (gae; preset ppo: 0.95)."""


@dataclass
class CriticConfig:
    path: str | None = None
    """Critic weights (an AutoModelForTokenClassification folder, num_labels=1, or a causal LM whose backbone
    is used); None: a copy of the policy's backbone with a zero-initialised value head. Needs a critic-based
    estimator (algo.preset=ppo or algo.advantage=gae); otherwise every critic.* setting must stay default."""
    lr: float = 1e-5
    """AdamW learning rate of the critic (follows optim.warmup_steps / optim.schedule like the policy's)."""
    value_coef: float = 0.1
    """Coefficient of the value loss (TRL's vf_coef); with AdamW it matters through optim.max_grad_norm."""
    cliprange_value: float | None = 0.2
    """Value clipping c: V within V_old +- c in the clipped value loss (null = unclipped squared error)."""
    warmup_steps: int = 0
    """For the first this many steps only the critic is updated; the policy's weights stay as they are."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.99
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon (TRL's adam_epsilon)."""
    warmup_steps: int = 0
    """Linear warm-up, in training steps (rollouts; grpokit.train.schedules)."""
    warmup_ratio: float = 0.0
    """Warm-up as a share of train.steps, ceil(ratio * steps) (TRL's warmup_ratio); overrides warmup_steps."""
    schedule: str = "constant"
    """constant | cosine | linear (transformers' linear decay to 0, TRL's default), after warm-up."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    epochs: int = 1
    """mu: passes over each rollout batch."""
    mini_batches: int = 1
    """Optimizer steps per pass over a rollout batch."""
    micro_batch_size: int | str = "auto"
    """Completions per forward/backward (gradient accumulation fills the mini-batch). auto: on CUDA the
    whole mini-batch, halved after an out-of-memory error; on CPU as many as fit 4096 tokens."""
    logprob_chunk_size: int = 1024
    """Rows of hidden states projected to the vocabulary at a time."""
    precision: str = "auto"
    """auto | fp32 | bf16_mixed | fp16_mixed | bf16_kahan | bf16_pure: how weights are stored, computed
    with and updated (grpokit.model.precision). auto follows model.dtype: float32 -> fp32 (16 bytes/param),
    bfloat16 -> bf16_kahan (10 bytes/param), float16 -> fp16_mixed (16, loss scaling). bf16_mixed is
    TRL's bf16=True (float32 master weights, 16). bf16_pure (8) drops most updates at lr 1e-6: explicit only."""


@dataclass
class RewardSpec:
    name: str = "math_accuracy"
    """Built-in name, module:function, or path/to/file.py:function."""
    weight: float = 1.0
    """Weight of this function in the total reward."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments for a built-in factory (e.g. max_len for overlong_penalty)."""


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate every this many training steps, i.e. rollouts, not optimizer steps (0 = only before and after training)."""
    num_samples: int = 4
    """k of the sampled mean@k."""
    temperature: float = 1.0
    """Temperature of the sampled evaluation."""
    max_new_tokens: int | None = None
    """Defaults to rollout.max_new_tokens."""
    enabled: bool = True
    """Evaluate before and after training when held-out data exists."""


@dataclass
class TrainConfig:
    steps: int = 100
    """Training steps, each one rollout (optim.mini_batches x optim.epochs optimizer steps)."""
    num_train_epochs: float | None = None
    """Passes over the training prompts (TRL's num_train_epochs); when set, train.steps becomes
    ceil(num_train_epochs * prompts / rollout.prompts_per_step)."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    output_dir: str = "runs/grpokit"
    """Where metrics, checkpoints, samples and plots go."""
    save_every: int = 0
    """Checkpoint every this many training steps, i.e. rollouts, not optimizer steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """How many step checkpoints to keep (0 = keep all); every step_N folder in the run counts."""
    samples_every: int = 10
    """Save sample completions every this many steps (0 = never)."""
    tensorboard: bool = True
    """Write TensorBoard scalars (false drops tensorboard from train.report_to)."""
    report_to: list[str] | str = "tensorboard"
    """Experiment trackers: tensorboard | wandb | mlflow | none, or a list ([tensorboard, wandb]); wandb and
    mlflow are extras (pip install 'grpokit[wandb]', 'grpokit[mlflow]'), configured by their own env vars."""
    accuracy_reward: str | None = None
    """Reward whose value 1 means correct: accuracy, eval pass@1 / maj@k, the flat-reward check. Unset: the one
    verifier among the rewards (math_accuracy, code_tests, a function named *accuracy* or
    *correct*), else the first reward that is not a format/length one (the run says which), else an
    error asking for it (grpokit.rewards.which_accuracy)."""
    reward_timeout_s: float = 120.0
    """A reward function taking longer is reported and counted as failed."""
    max_reward_failure_frac: float = 0.0
    """Share of a step's completions on which one reward function may fail (raise, return a value that
    is not a number or None, NaN or inf, time out as a whole, kill its worker) and still only score 0
    there; more stops the run with the reason and the first failing row. 0 = strict: any failure stops
    the run. A function that fails on every completion of a step always stops it. Failures are counted
    in reward/<name>/failed_rows; per-completion timeouts (math_accuracy) score 0 and are not failures,
    unless every completion of the step timed out."""
    stop_after_flat_steps: int = 5
    """Stop (with the likely cause) after this many consecutive steps in which no group has any reward
    spread: every advantage is 0 and nothing is learnt. A warning comes at the first such step. 0 = never."""
    distributed: str = "auto"
    """Under torchrun (WORLD_SIZE > 1): fsdp (shard with FSDP2) | ddp | auto (ddp with LoRA, else fsdp)."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rewards: list[RewardSpec] = field(default_factory=lambda: [RewardSpec()])
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def config_from_dict(values: dict[str, Any]) -> Config:
    """Build and validate a Config from a nested mapping (as read from YAML)."""
    if not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(values).__name__}")
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
        values = _from_trl_if_flat(values, p) if build is None else values
    apply_overrides(values, overrides)
    try:
        return (build or config_from_dict)(values)
    except ConfigError as e:
        where = f"{path}: " if path is not None else ""
        raise ConfigError(f"{where}{e}") from None


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
    print(f"grpokit: {path} holds TRL GRPOConfig fields; converted (grpokit config --from-trl {path} shows the "
          "result):\n" + "\n".join(f"  - {n}" for n in notes), file=sys.stderr)
    return converted


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path, resolved_algo: Any = None) -> None:
    """Write the config as YAML; `resolved_algo` (an AlgoSettings) is recorded by its flat names."""
    data = config_to_dict(cfg)
    if resolved_algo is not None:
        data["resolved_algo"] = resolved_algo.flat() if hasattr(resolved_algo, "flat") else resolved_algo
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


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

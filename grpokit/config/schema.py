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
    check_auto_bool,
    check_config,
    check_device,
    check_output_path,
    check_seed,
    check_trackers,
)
from grpokit.config.declare import setting
from grpokit.config.run_file import check_resolved_algo, split_records, write_run_file
from grpokit.core.errors import ConfigError
from grpokit.core.yaml_io import parse_value, read_yaml_file

if TYPE_CHECKING:
    from grpokit.algos import AlgoSettings

# the sections in modules of their own, named here too: grpokit.config.schema is where the whole tree is imported from
from grpokit.config.rollout import ENGINES as ENGINES
from grpokit.config.rollout import KV_CACHES as KV_CACHES
from grpokit.config.rollout import LORA_PUSHES as LORA_PUSHES
from grpokit.config.rollout import MISMATCH_CORRECTIONS as MISMATCH_CORRECTIONS
from grpokit.config.rollout import VLLM_MODES as VLLM_MODES
from grpokit.config.rollout import WEIGHT_TRANSFERS as WEIGHT_TRANSFERS
from grpokit.config.rollout import RolloutConfig as RolloutConfig
from grpokit.config.rollout import VLLMConfig as VLLMConfig
from grpokit.config.selection import SelectionConfig as SelectionConfig
from grpokit.config.training import DTYPES as DTYPES
from grpokit.config.training import PRECISION_MODES as PRECISION_MODES
from grpokit.config.training import SCHEDULES as SCHEDULES
from grpokit.config.training import AlgoConfig as AlgoConfig
from grpokit.config.training import CriticConfig as CriticConfig
from grpokit.config.training import OptimConfig as OptimConfig
from grpokit.config.training import TeacherConfig as TeacherConfig

# The names a setting may take where the code that acts on each name sits above the config layer (which
# imports only grpokit.core and grpokit.algos): the config holds the list, and tests/unit/config/
# test_declare.py holds it equal to the registry it names.
TEMPLATE_NAMES = ("auto", "chat", "plain", "r1_zero")
"""data.template: grpokit.data.templates.TEMPLATE_NAMES."""
STRATEGIES = ("auto", "fsdp", "ddp")
"""train.distributed: grpokit.train.distributed.STRATEGIES."""




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
    compile: bool = setting(
        False,
        """The decoder layers' RMSNorms and SwiGLU gates through torch.compile in every forward (the update, the
        log-prob passes, the decode), one fused kernel each with its backward (grpokit.model.fused_layers): Llama,
        Qwen2, Qwen3 and Mistral modules; others run as they are. Not under fsdp. The first forwards compile.""",
    )
    disable_dropout: bool = setting(
        False,
        """Set every torch.nn.Dropout of the trained model to p=0 (TRL's disable_dropout; LoRA's dropout included):
        the update then computes the log-probs the sampler sampled with. Most LMs have no dropout (Qwen2, Llama);
        GPT-2 and its kin do.""",
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
    each_epoch: bool = setting(
        False,
        """Also evaluate at the end of each pass over the training rows (TRL's eval_strategy="epoch"): eval.every
        becomes ceil(rows / rows per step) when the trainer is built; eval.every must then be 0.""",
    )


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
    save_each_epoch: bool = setting(
        False,
        """Checkpoint at the end of each pass over the training rows (TRL's save_strategy="epoch"): train.save_every
        becomes ceil(rows / rows per step) when the trainer is built; train.save_every must then be 0.""",
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
    ema_decay: float = setting(
        0.0,
        """Keep an exponential moving average of the policy's weights, theta_ema <- d theta_ema + (1 - d) theta after
        every step (grpokit.train.weight_average; OpenRLHF's --enable_ema): evaluated beside the policy (ema/accuracy,
        ...) and saved in every checkpoint's ema/ folder (a Hugging Face model). Rollouts and updates are the
        policy's, unchanged. It smooths a policy that swings around a plateau and lags about 1 / (1 - d) steps
        behind one that climbs; one more copy of the weights in memory. Not under train.distributed=fsdp.""",
        range="[0, 1)",
        example=0.9,
        meaning="0 = off",
    )
    adopt_average: bool | str = setting(
        "auto",
        """Every train.adopt_every steps the policy takes the weights of its average (train.ema_decay's, or d = 0.9
        when that is 0) when the average's greedy completions of train.adopt_prompts training prompts score higher
        than the policy's beyond the comparison's noise (a one-sided paired test at 5%), by the accuracy reward (the
        run's weighted reward without one; grpokit.train.weight_average.Adoption). A policy swinging around a
        plateau (a learning rate too high for it) is brought back to its average's middle; one that climbs keeps its
        weights. auto: on for a run on the CPU, on one process, single-turn, synchronous, without LoRA, optimizer
        offload or the vllm engine (measured there: docs/algorithms/average.md), off elsewhere; off under
        train.defaults=trl and in a converted TRL config. Costs one more copy of the weights and, every
        train.adopt_every steps, two greedy decodes of train.adopt_prompts prompts scored by the reward functions.""",
        check=check_auto_bool,
        allowed="true, false or auto",
    )
    adopt_every: int = setting(
        10,
        "Steps between train.adopt_average's comparisons (after steps k, 2k, ...).",
        range="[1, inf)",
        example=10,
    )
    adopt_prompts: int = setting(
        64,
        """Training prompts train.adopt_average compares the policy and its average on: the same rows at every
        comparison, drawn once with train.seed (all of them when there are fewer).""",
        range="[1, inf)",
        example=64,
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
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *, build=None, convert=None
) -> Config:
    """Read a YAML file (optional), apply dotted overrides, validate, return the Config. ``build``: another
    config tree's builder (grpokit.config.sft.sft_config_from_dict) instead of config_from_dict; ``convert(values,
    path)``: its conversion of a flat TRL file (the RL tree's: a GRPOConfig file, _from_trl_if_flat)."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        values = read_yaml_file(p) or {}  # refuses a missing or non-UTF-8 file, bad YAML, a key given twice
        if not isinstance(values, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections (model:, data:, ...)")
        values, records = split_records(values)  # an OUTPUT/config.yaml's records of the run (run_file)
        values = _from_trl_if_flat(values, p) if build is None else convert(values, p) if convert else values
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
    from grpokit.config.trl import from_trl, looks_like_trl
    from grpokit.config.trl_fields import converted_if_flat

    return converted_if_flat(values, path, looks_like_trl, from_trl, "GRPOConfig", f"grpokit config --from-trl {path}")


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

"""Command line: ``grpokit train | demo | eval | sample | pipeline``.
(Over 500 lines: the parser of every command beside the small commands it dispatches to; the larger commands
live in grpokit.cli's other modules.)

grpokit train                                   # the embedded demo (no download)
grpokit train cfg.yaml algo.preset=dapo rollout.group_size=16
grpokit train --config cfg.yaml optim.lr=1e-6    # --config PATH works as well as the positional path
grpokit train cfg.yaml --resume                 # continue the run in train.output_dir
grpokit config [cfg.yaml] [overrides]           # every key, its value (default) and what it does, as YAML
grpokit train cfg.yaml --overwrite              # replace the run in train.output_dir
grpokit eval MODEL_DIR DATA.jsonl --reward math_accuracy
grpokit eval MODEL_DIR openai/gsm8k --data-config main --prompt-column question   # its test split
grpokit launch --nproc_per_node=2 train cfg.yaml  # torchrun, with the ranks' exit codes (grpokit.cli.launch)

Exit codes by kind (``EXIT_CODES``; grpokit.core.errors.exit_code maps an error to its kind; the table of
docs/exit-codes.md and ``grpokit --help``). Errors are one line naming their class; --debug (or
GRPOKIT_DEBUG=1) adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import typing
from pathlib import Path

# shared with the other commands' modules (grpokit.pipeline.run, grpokit.trainers.sample), which sit below this one
from grpokit.cli.args import config_args as _config_args
from grpokit.cli.args import debug_on as _debug
from grpokit.cli.args import fail as _fail
from grpokit.config.declare import field_docs
from grpokit.core.errors import EXIT_USAGE

EXIT_CODES = (
    (0, "done (a run that stopped early as finished too: solved prompts, train.max_cpu_seconds)"),
    (1, "the run failed: TrainingError (no reward spread, a growing sampler KL, out of memory), or an unexpected "
        "error (--debug shows its traceback)"),
    (2, "usage or config error: ConfigError, DataError (a bad value, data, model path, output folder, checkpoint "
        "to resume from), found before the model loads where it can be"),
    (3, "the user's code failed while the run ran it: UserCodeFailedError (RewardFunctionError: a reward function "
        "raising or timing out on too many completions; EnvironmentFailedError: a multi-turn environment, by the "
        "same rule; CallbackError), with a checkpoint"),
    (4, "an engine or the sampler process failed: EngineError (SamplerDiedError, SamplerStalledError; a vLLM "
        "server down or dying), with a checkpoint"),
    (5, "disk full or another I/O error: RunIOError, OSError (writing a checkpoint, the log, the output folder)"),
    (130, "stopped by SIGINT after saving a checkpoint (143: SIGTERM; 128 + the signal, as shells report it), "
          "sent to any process of the run: the trainer, the sampler process, a tool or environment worker, a rank"),
)  # fmt: skip
"""Every exit code of ``grpokit train | sft | demo`` and what it means (docs/exit-codes.md shows the same table)."""


def exit_codes_table() -> str:
    """EXIT_CODES as the Markdown table of docs/exit-codes.md (put there at build time by docs/hooks/reference.py)."""
    return "\n".join(["| exit code | meaning |", "|---|---|", *(f"| {code} | {text} |" for code, text in EXIT_CODES)])


def _print_table(before: float | None, after: float | None) -> None:
    """The demo's result on stdout (progress and notices go to stderr), never cut in a log file."""
    from rich.table import Table

    from grpokit.run.log import result_console

    table = Table()
    for column in ("held-out accuracy", "before", "after", "change"):
        table.add_column(column)
    if before is not None and after is not None:
        table.add_row("greedy pass@1", f"{before:.1%}", f"{after:.1%}", _points(after - before))
    result_console().print(table)


def _points(difference: float) -> str:
    """A change of accuracy in percentage points (0.050 -> 0.955: "+90.5 points", not "+90.5%")."""
    return f"{difference * 100:+.1f} points"


def _print_tool_table(results: dict) -> None:
    """The tool demo's result: held-out accuracy with and without the tool, before and after, on stdout."""
    from rich.table import Table

    from grpokit.run.log import result_console

    table = Table(title="held-out accuracy (greedy, whole episodes)")
    for column in ("", "before", "after", "change", "called the tool (before -> after)"):
        table.add_column(column)
    for key, label in (("tool", "with the tool"), ("no_tool", "without it")):
        b, a = results["before"][key], results["after"][key]
        table.add_row(
            label, f"{b['accuracy']:.1%}", f"{a['accuracy']:.1%}", _points(a["accuracy"] - b["accuracy"]),
            f"{b['called_tool']:.0%} -> {a['called_tool']:.0%}",
        )  # fmt: skip
    result_console().print(table)


DEMOS = {
    "addition": "two-number addition scored by math_accuracy, GRPO (the default; runs/demo)",
    "steps": "three-number addition in steps, each step scored: GRPO process supervision (runs/demo_steps)",
    "tools": "4-digit multiplication with a multiply tool: multi-turn GRPO (runs/demo_tools)",
    "r1": "the four stages of DeepSeek-R1 and RL alone beside them: a pipeline (runs/r1-demo)",
}


def cmd_demo(args: argparse.Namespace) -> int:
    """grpokit demo [NAME] [key=value ...]: one of DEMOS (default addition), in --output-dir by the
    run-folder rules of grpokit train (refused when it holds a run, unless --resume or --overwrite)."""
    name = "addition"
    if args.overrides and "=" not in args.overrides[0]:
        name = args.overrides.pop(0)
    if name not in DEMOS:
        return _fail(args, f"demo: there is no demo {name!r}; the demos: {', '.join(DEMOS)}", 2)
    if args.print_model_path:
        print(demo_model_path(name))
        return 0
    _one_thread_for_tiny_models()
    if name in ("addition", "steps"):
        if name == "steps":
            args.overrides.insert(0, "data.train=demo_steps")
        return cmd_train(args)
    if name == "r1":
        if args.overrides:
            return _fail(args, "demo r1: takes no overrides (its stages are in OUTPUT/pipeline.yaml)", 2)
        from grpokit.cli.pipeline import cmd_pipeline

        ns = argparse.Namespace(**{**vars(args), "demo": True, "file": None, "check": False, "rerun_changed": False})
        return cmd_pipeline(ns)
    from grpokit.config.schema import ConfigError
    from grpokit.core.errors import TrainingError
    from grpokit.data.prompts import DataError
    from grpokit.demos.tools import run_demo

    overrides = list(args.overrides)
    if args.output_dir is not None:
        overrides.append(f"train.output_dir={args.output_dir}")
    try:
        results = run_demo(
            overrides, resume=args.resume, overwrite=args.overwrite, log=lambda m: print(m, file=sys.stderr)
        )
    except (ConfigError, DataError) as e:
        return _fail(args, f"demo tools: {e}", EXIT_USAGE)
    except TrainingError as e:  # by kind (EXIT_CODES)
        line, code = error_line(e)
        return _fail(args, f"demo tools: {line}", code)
    _print_tool_table(results)
    print(f"done: training {results['train_seconds']:.0f}s, results {results['output_dir']}/demo_results.json")
    return 0


def demo_model_path(name: str) -> Path:
    """Where a demo's warm-started model is: the package's own for addition and tools (r1's base starts from
    addition's), the cache for the others (built first when it is not there; minutes, with progress on stderr)."""
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if name in ("addition", "r1"):
        from grpokit.demos.default import prepare_demo

        if name == "r1":
            from grpokit.demos.r1 import prepare_r1_demo

            return prepare_r1_demo(log=log)["base"]
        return prepare_demo(log=log)["model"]
    if name == "steps":
        from grpokit.demos.steps import prepare

        return prepare(log=log)["model"]
    from grpokit.demos.tools import prepare as prepare_tools

    return prepare_tools(log=log)["model"]


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _one_thread_for_tiny_models() -> None:
    """The demos' models have 0.3M parameters: one torch thread runs them fastest, and does not slow to a
    crawl when the other cores are busy (two threads on a busy 2-core machine: 10-100x slower steps).
    OMP_NUM_THREADS, when set, is the user's choice and is kept."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    torch.set_num_threads(1)


def cmd_train(args: argparse.Namespace) -> int:
    from grpokit.config.schema import ConfigError, load_config

    try:
        config_path, overrides = _config_args(args)
    except ConfigError as e:
        return _fail(args, f"config error: {e}", 2)
    if args.output_dir is not None:  # "" too: refused by the empty-folder rule, not ignored
        overrides.append(f"train.output_dir={args.output_dir}")
    demo = config_path is None and (
        args.demo or not any(o.startswith("model.name_or_path=") for o in overrides)
    )
    if getattr(args, "print_config", False):
        try:
            cfg = _demo_config(overrides, build=False) if demo else load_config(config_path, overrides)
        except ConfigError as e:
            return _fail(args, f"config error: {e}", 2)
        print(describe_config(cfg), end="")
        return 0
    try:
        if demo:
            _one_thread_for_tiny_models()
            from grpokit.run.preflight import check_output_dir

            # a folder that holds a run is refused before a variant's warm start (minutes), not after
            planned = _demo_config(overrides, build=False)
            check_output_dir(Path(planned.train.output_dir), resume=bool(args.resume or args.resume_from),
                             overwrite=args.overwrite)  # fmt: skip
            cfg = _demo_config(overrides)
        else:
            cfg = load_config(config_path, overrides)
    except ConfigError as e:
        return _fail(args, f"config error: {e}", 2)
    if not demo and config_path is None and not cfg.data.train and (problem := _model_without_data(overrides)):
        return _fail(args, f"config error: {problem}", 2)  # before: 'data.train is empty', the model unnamed
    return _run(cfg, args)


def _model_without_data(overrides: list[str]) -> str | None:
    """`grpokit train model.name_or_path=X` with no config and no data.train: the demo's data goes with the demo's
    model only, so say that, with the model's path when it is a local one that does not exist (issue 52)."""
    if any(o.startswith("data.train=") for o in overrides):
        return None
    model = [o.split("=", 1)[1] for o in overrides if o.startswith("model.name_or_path=")][-1]
    local = model.startswith(("/", "./", "../", "~"))
    missing = f"; and model.name_or_path={model} does not exist" if local and not Path(model).expanduser().exists() else ""
    return (
        f"model.name_or_path={model} without a config file is not the demo (its addition data goes with its own model "
        "only), so there are no prompts: give data.train=FILE (JSONL, JSON, CSV, Parquet, a save_to_disk folder or a hub "
        f"dataset id; data.eval=FILE for held-out accuracy), or a config file (grpokit config > cfg.yaml){missing}"
    )


def describe_config(cfg) -> str:
    """The config as YAML that loads back (``grpokit config > cfg.yaml``), each key with its description
    (its declaration's, grpokit.config.declare) as a comment. Given the defaults, it documents every key."""
    import dataclasses

    import yaml

    def value_text(value) -> str:
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
        return text.removesuffix("\n...").removesuffix("...").strip()

    def fields(obj, indent: str, first_prefix: str | None = None) -> list[str]:
        docs = field_docs(type(obj))
        out = []
        for i, f in enumerate(dataclasses.fields(obj)):
            lead = first_prefix if (first_prefix is not None and i == 0) else indent
            doc = docs.get(f.name, "")
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):  # a section inside a section: rollout.vllm
                out.append(f"{lead}{f.name}:" + (f"  # {doc}" if doc else ""))
                out += fields(value, indent + "  ")
                continue
            out.append(f"{lead}{f.name}: {value_text(value)}" + (f"  # {doc}" if doc else ""))
        return out

    lines = []
    for section in dataclasses.fields(cfg):
        value = getattr(cfg, section.name)
        lines.append(f"{section.name}:")
        if isinstance(value, list):  # rewards: a list of RewardSpec
            for item in value:
                lines += fields(item, "    ", first_prefix="  - ")
        else:
            lines += fields(value, "  ")
    return "\n".join(lines) + "\n"


def cmd_config(args: argparse.Namespace) -> int:
    from grpokit.config.schema import ConfigError, apply_overrides, load_config

    try:
        if getattr(args, "from_trl", None):  # grpokit.config.trl: TRL's fields mapped, the rest refused
            from grpokit.config.schema import config_from_dict, read_yaml_file
            from grpokit.config.sft import sft_config_from_dict
            from grpokit.config.trl import from_trl, grpokit_yaml
            from grpokit.config.trl_sft import from_trl_sft, is_sft_file

            given = read_yaml_file(Path(args.from_trl)) or {}
            sft = is_sft_file(given)  # an SFTConfig's file: converted for grpokit sft
            values, notes = (from_trl_sft if sft else from_trl)(given)
            (sft_config_from_dict if sft else config_from_dict)(apply_overrides(values, list(args.overrides)))
            print(grpokit_yaml(values, notes, args.from_trl, "SFTConfig" if sft else "GRPOConfig"), end="")
            return 0
        config_path, overrides = _config_args(args)
        print(describe_config(load_config(config_path, overrides)), end="")
    except ConfigError as e:
        return _fail(args, f"config error: {e}", 2)
    return 0


def _demo_config(overrides: list[str], build: bool = True):
    """The embedded default: build (or reuse) the warm-started tiny model, then GRPO on it. The
    overrides are checked first: building the model takes minutes the first time. build=False: the
    config with placeholders for the demo's model and data paths, nothing built."""
    from grpokit.config.schema import apply_overrides, config_from_dict
    from grpokit.demos.default import cache_root
    from grpokit.demos.variants import demo_variant, prepare_variant, variant_overrides
    from grpokit.train.distributed import node_lock

    variant, overrides = demo_variant(overrides)  # data.train=demo_steps: the process-reward variant
    placeholders = {name: Path(f"<demo {name}>") for name in ("model", "train", "eval")}
    checked = config_from_dict(apply_overrides(variant_overrides(placeholders, variant), overrides))
    if not build:
        return checked
    with node_lock(cache_root() / "demo.lock"):  # torchrun: one rank builds the warm start, the rest reuse it
        values = variant_overrides(prepare_variant(variant, log=lambda m: print(m, file=sys.stderr)), variant)
    return config_from_dict(apply_overrides(values, overrides))


def cmd_sft(args: argparse.Namespace) -> int:
    """grpokit sft CONFIG.yaml [key=value ...]: supervised fine-tuning (grpokit.trainers.sft), run as grpokit train."""
    from grpokit.config.schema import ConfigError
    from grpokit.config.sft import load_sft_config

    try:
        config_path, overrides = _config_args(args)
        if args.output_dir is not None:
            overrides.append(f"train.output_dir={args.output_dir}")
        cfg = load_sft_config(config_path, overrides)
    except ConfigError as e:
        return _fail(args, f"config error: {e}", 2)
    if getattr(args, "print_config", False):
        print(describe_config(cfg), end="")
        return 0
    from grpokit.trainers.sft import SFTTrainer

    return _run(cfg, args, SFTTrainer)


def _run(cfg, args: argparse.Namespace, trainer_cls=None) -> int:
    from grpokit.config.schema import ConfigError
    from grpokit.data.prompts import DataError
    from grpokit.trainers.grpo import GRPOTrainer

    start = time.perf_counter()
    try:
        trainer = (trainer_cls or GRPOTrainer)(
            cfg,
            resume=args.resume_from or args.resume,
            overwrite=args.overwrite,
            allow_changed_config=args.allow_changed_config,
        )
        summary = trainer.train()
    except (ConfigError, DataError) as e:  # their messages say which key, row or file
        return _fail(args, str(e), EXIT_USAGE)
    except Exception as e:  # by kind: the class named, its exit code (EXIT_CODES)
        line, code = error_line(e, Path(cfg.train.output_dir))
        if line is None:
            raise  # unforeseen: main()'s one line, exit 1
        return _fail(args, line, code)
    if int(os.environ.get("RANK", "0")) > 0:
        return 0  # under torchrun rank 0 alone reports
    if summary.get("stopped_by"):
        name = summary["stopped_by"]
        saved = (
            f"checkpoint {summary['checkpoint']}"
            if summary["checkpoint"]
            else "no step finished, nothing saved"
        )
        print(
            f"grpokit: stopped by {name} after step {summary['steps']}/{cfg.train.steps} ({saved}); "
            "continue with --resume",
            file=sys.stderr,
        )
        return 128 + signal.Signals[name].value
    if summary.get("eval_accuracy_after") is not None:
        _print_table(summary.get("eval_accuracy_before"), summary.get("eval_accuracy_after"))
    out = Path(cfg.train.output_dir)
    curves = f", curves {out / 'curves.png'}" if (out / "curves.png").is_file() else ""
    print(
        f"done in {time.perf_counter() - start:.0f}s: metrics {out / 'metrics.jsonl'}{curves}, "
        f"model {summary['checkpoint']}",
        flush=True,
    )  # a result: stdout, with the table (progress and notices are on stderr)
    return 0


def error_line(error: BaseException, folder: Path | None = None) -> tuple[str | None, int]:
    """(the one line a run's ``error`` is reported with, "Class: message" with the class EXIT_CODES names; its
    exit code) by kind (grpokit.core.errors.exit_code): I/O as RunIOError (a full disk with the free space,
    ``folder``'s when the path is not known), grpokit's own kinds by their class; (None, 1) for anything
    else (a bug: main() reports it with its traceback on request)."""
    from grpokit.core.errors import EXIT_IO, RunIOError, TrainingError, exit_code
    from grpokit.core.files import disk_full_message, no_space
    from grpokit.model.checkpoint import CheckpointError

    if isinstance(error, RunIOError):  # a checkpoint that could not be written: its message names the cause
        return f"RunIOError: {error}", EXIT_IO
    if no_space(error):  # anywhere (the lock, config.yaml, the logs): with the free space
        return f"RunIOError: {disk_full_message(error, folder=folder)}", EXIT_IO
    if isinstance(error, OSError):
        return f"RunIOError: {type(error).__name__}: {error}", EXIT_IO
    if isinstance(error, (TrainingError, CheckpointError)):
        return f"{type(error).__name__}: {error}", exit_code(error)
    return None, exit_code(error)


def cmd_eval(args: argparse.Namespace) -> int:
    from grpokit.config.schema import ConfigError, DataConfig, LoraConfig, ModelConfig
    from grpokit.data.prompts import DataError, load_prompts
    from grpokit.model.loading import load_policy
    from grpokit.rewards import resolve_reward
    from grpokit.rollout.evaluate import evaluate
    from grpokit.rollout.generation import FastGenerator

    try:
        _check_eval_args(args)  # flags and the model's positions, before anything loads
        model, tokenizer, _ = load_policy(
            ModelConfig(name_or_path=args.model, dtype=args.dtype), LoraConfig()
        )
        data_cfg = DataConfig(
            train=args.data,
            template=args.template,
            prompt_column=args.prompt_column,
            max_prompt_tokens=args.max_prompt_tokens,
        )
        rows = load_prompts(
            args.data,
            prompt_column=args.prompt_column,
            limit=args.limit,
            split=args.split,
            config=args.data_config,
            default_split="test",
        )
        eos = [tokenizer.eos_token_id]
        result = evaluate(
            model,
            tokenizer,
            rows,
            accuracy_fn=resolve_reward(args.reward),
            generator=FastGenerator(),
            data_cfg=data_cfg,
            eos_token_ids=eos,
            num_samples=args.num_samples,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            progress=lambda line: print(line, file=sys.stderr, flush=True),  # the result alone on stdout
        )
    except (ConfigError, DataError, ValueError) as e:
        return _fail(args, f"eval: {e}", 2)
    print(json.dumps(result, indent=2))
    return 0


# grpokit eval's flags and the config keys whose rules they follow (their messages are given with the flags)
EVAL_FLAGS = {
    "model.dtype": "--dtype",
    "eval.num_samples": "--num-samples",
    "eval.temperature": "--temperature",
    "eval.max_new_tokens": "--max-new-tokens",
    "rollout.max_new_tokens": "--max-new-tokens",
    "data.template": "--template",
    "data.max_prompt_tokens": "--max-prompt-tokens",
    "data.eval_limit": "--limit",
}


def _check_eval_args(args: argparse.Namespace) -> None:
    """grpokit eval's flags by the config's rules (ranges, choices), and --max-new-tokens against the model's
    positions (read from config.json): a ConfigError naming the flag, before the model loads."""
    from grpokit.config.schema import ConfigError, config_from_dict
    from grpokit.model.loading import read_model_config
    from grpokit.run.preflight import check_positions

    values = {
        "model": {"name_or_path": args.model, "dtype": args.dtype},
        "data": {"template": args.template, "max_prompt_tokens": args.max_prompt_tokens, "eval_limit": args.limit},
        "eval": {"num_samples": args.num_samples, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens},
        "rollout": {"max_new_tokens": args.max_new_tokens},
    }
    try:
        cfg = config_from_dict(values)
        check_positions(cfg, read_model_config(cfg.model), args.model)
    except ConfigError as e:
        message = str(e)
        for key, flag in EVAL_FLAGS.items():
            message = message.replace(f"{key}=", f"{flag} ").replace(key, flag)
        raise ConfigError(message) from None


def setting_doc(key: str) -> str:
    """A ``grpokit train`` setting's description, for the help of a flag that sets it (its declaration's;
    argparse reads % as a format)."""
    from grpokit.config.schema import Config

    section, name = key.split(".")
    cls = typing.get_type_hints(Config)[section]
    return field_docs(cls)[name].replace("``", "").replace("%", "%%")  # no RST markup in a terminal


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grpokit",
        description="GRPO-family RL fine-tuning with verifiable rewards",
        epilog="exit codes (docs/exit-codes.md):\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks (also GRPOKIT_DEBUG=1)")
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's default must not undo `grpokit --debug train`
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    run = argparse.ArgumentParser(add_help=False, parents=[common])
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint in train.output_dir (damaged ones are skipped)",
    )
    run.add_argument(
        "--resume-from", metavar="CHECKPOINT", help="continue from exactly this checkpoint (step_N or a path)"
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in train.output_dir (deleted when training starts)",
    )
    run.add_argument(
        "--allow-changed-config",
        action="store_true",
        help="resume even though settings that change the run's meaning (lr, data, rewards, ...) differ from the checkpoint's",
    )
    run.add_argument("--output-dir", help="shorthand for train.output_dir=...")
    sub = p.add_subparsers(dest="command")

    keys_help = "every key with its default and what it does: grpokit config"
    train = sub.add_parser(
        "train", help="train (no arguments: the embedded demo)", parents=[run], epilog=keys_help
    )
    train.add_argument("overrides", nargs="*", help="[CONFIG.yaml] then section.key=value overrides")
    train.add_argument("--config", metavar="PATH", help="the YAML config (or give it as the first argument)")
    train.add_argument("--demo", action="store_true", help="run the embedded demo with these overrides")
    train.add_argument(
        "--print-config", action="store_true", help="print the resolved config with each key's doc, and exit"
    )
    train.set_defaults(func=cmd_train)

    sft = sub.add_parser(
        "sft", help="supervised fine-tuning on messages / prompt+completion / text rows", parents=[run],
        epilog="every key with its default and what it does: grpokit sft --print-config (the guide: docs/guides/sft.md)",
    )
    sft.add_argument("overrides", nargs="*", help="[CONFIG.yaml] then section.key=value overrides")
    sft.add_argument("--config", metavar="PATH", help="the YAML config (or give it as the first argument)")
    sft.add_argument(
        "--print-config", action="store_true", help="print the resolved config with each key's doc, and exit"
    )
    sft.set_defaults(func=cmd_sft)

    config = sub.add_parser(
        "config",
        help="print every config key with its value (default), as YAML with a one-line doc per key",
        parents=[common],
    )
    config.add_argument("overrides", nargs="*", help="[CONFIG.yaml] then section.key=value overrides")
    config.add_argument("--config", metavar="PATH", help="the YAML config (or give it as the first argument)")
    config.add_argument(
        "--from-trl", metavar="FILE", help="convert a TRL GRPOConfig YAML (flat keys; an SFTConfig's: for grpokit sft) to a grpokit config and print it"
    )
    config.set_defaults(func=cmd_config)

    demo = sub.add_parser(
        "demo",
        help="the embedded demos, no download, CPU: addition (default), steps, tools, r1",
        parents=[run],
        description="Tiny models built locally that learn on the CPU in minutes: "
        + "; ".join(f"{k}: {v}" for k, v in DEMOS.items()),
        epilog="e.g. grpokit demo tools --output-dir runs/tools; grpokit demo --print-model-path",
    )
    demo.add_argument("overrides", nargs="*", help="[NAME] then section.key=value overrides")
    demo.add_argument(
        "--print-model-path", action="store_true", help="print the folder of the demo's warm-started model, and exit"
    )
    demo.set_defaults(func=cmd_demo, demo=True)

    ev = sub.add_parser("eval", help="held-out accuracy of a model directory on a dataset", parents=[common])
    ev.add_argument("model")
    ev.add_argument("data")
    ev.add_argument("--reward", default="math_accuracy", help="reward whose value 1 means correct")
    ev.add_argument("--template", default="auto", help=setting_doc("data.template"))
    ev.add_argument("--prompt-column", default="prompt", help=setting_doc("data.prompt_column"))
    ev.add_argument("--max-prompt-tokens", type=int, default=1024, help=setting_doc("data.max_prompt_tokens"))
    ev.add_argument("--max-new-tokens", type=int, default=256, help=setting_doc("rollout.max_new_tokens"))
    ev.add_argument("--num-samples", type=int, default=4, help=setting_doc("eval.num_samples"))
    ev.add_argument("--temperature", type=float, default=1.0, help=setting_doc("eval.temperature"))
    ev.add_argument("--limit", type=int, help=setting_doc("data.eval_limit"))
    ev.add_argument(
        "--split", help="split of DATA to evaluate on (default: test, or the only split there is)"
    )
    ev.add_argument("--data-config", help="subset of a hub dataset (data.config), e.g. main for openai/gsm8k")
    ev.add_argument("--dtype", default="auto", help=setting_doc("model.dtype"))
    ev.set_defaults(func=cmd_eval)

    from grpokit.bench import add_bench_parser
    from grpokit.cli.pipeline import add_pipeline_parser
    from grpokit.cli.sample import add_sample_parser

    add_bench_parser(sub)
    add_sample_parser(sub, [common])
    from grpokit.cli.vllm_serve import add_vllm_serve_parser

    add_vllm_serve_parser(sub, [common])
    add_pipeline_parser(sub, [common])
    from grpokit.view.cli import add_view_parser

    add_view_parser(sub)
    sub.add_parser(  # listed for --help; the arguments go to grpokit.cli.launch unparsed (see _main)
        "launch",
        help="torchrun with grpokit's exit codes: grpokit launch --nproc_per_node=2 train cfg.yaml",
        add_help=False,
    )
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command's own handling starts (imports, parsing)
        if os.environ.get("GRPOKIT_DEBUG", "") not in ("", "0") or "--debug" in (argv or sys.argv):
            raise
        print("grpokit: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not _stderr_is_tty():  # Hugging Face's loading bars redraw with \r: noise in a log file
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if not argv:
        argv = ["train"]
    if argv[0] == "launch":  # torchrun's own options follow: argparse must not read them
        from grpokit.cli.launch import main as launch

        return launch(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        args, extra = parser.parse_known_args(["train", *argv])
    # overrides may follow options (`train cfg.yaml --resume optim.lr=1e-6`), which argparse leaves over
    if extra and hasattr(args, "overrides") and not any(e.startswith("-") for e in extra):
        args.overrides, extra = [*args.overrides, *extra], []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if _debug(args):
            raise
        print("grpokit: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # anything unforeseen: one line, the traceback only on request
        if _debug(args):
            raise
        line, code = error_line(e)
        if line is not None:  # a kind of grpokit's own (a full disk: named as such, with its free space)
            print(f"grpokit: {line}", file=sys.stderr)
            return code
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(
            f"grpokit: error: {type(e).__name__}: {first} (run again with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def program() -> None:
    """The ``grpokit`` command (console script, ``python -m grpokit``): main() on sys.argv, and the process
    ends with its code (grpokit.cli.exit.exit_program: a torchrun rank leaves without the interpreter's
    teardown)."""
    from grpokit.cli.exit import exit_program

    exit_program(main())


if __name__ == "__main__":
    program()

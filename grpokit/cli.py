"""Command line: ``grpokit train | demo | eval``.

grpokit train                                   # the embedded demo (no download)
grpokit train cfg.yaml algo.preset=dapo rollout.group_size=16
grpokit train cfg.yaml --resume                 # continue the run in train.output_dir
grpokit eval MODEL_DIR DATA.jsonl --reward math_accuracy
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _print_table(before: float | None, after: float | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out accuracy (greedy pass@1)")
    table.add_column("before")
    table.add_column("after")
    table.add_column("change")
    if before is not None and after is not None:
        table.add_row(f"{before:.1%}", f"{after:.1%}", f"{after - before:+.1%}")
    Console(stderr=True).print(table)


def cmd_train(args: argparse.Namespace) -> int:
    from grpokit.config import ConfigError, load_config

    overrides = list(args.overrides)
    config_path = None
    if overrides and "=" not in overrides[0]:
        config_path = overrides.pop(0)
    if args.output_dir:
        overrides.append(f"train.output_dir={args.output_dir}")
    try:
        if config_path is None and (
            args.demo or not any(o.startswith("model.name_or_path=") for o in overrides)
        ):
            cfg = _demo_config(overrides)
        else:
            cfg = load_config(config_path, overrides)
    except ConfigError as e:
        print(f"grpokit: config error: {e}", file=sys.stderr)
        return 2
    return _run(cfg, resume=args.resume)


def _demo_config(overrides: list[str]):
    """The embedded default: build (or reuse) the warm-started tiny model, then GRPO on it."""
    from grpokit.config import apply_overrides, config_from_dict
    from grpokit.demo import demo_overrides, prepare_demo

    values = demo_overrides(prepare_demo(log=lambda m: print(m, file=sys.stderr)))
    return config_from_dict(apply_overrides(values, overrides))


def _run(cfg, *, resume: bool) -> int:
    from grpokit.config import ConfigError
    from grpokit.data import DataError
    from grpokit.trainer import GRPOTrainer, TrainingError

    start = time.perf_counter()
    try:
        trainer = GRPOTrainer(cfg, resume=resume)
        summary = trainer.train()
    except (ConfigError, DataError, TrainingError) as e:
        print(f"grpokit: {e}", file=sys.stderr)
        return 2
    _print_table(summary.get("eval_accuracy_before"), summary.get("eval_accuracy_after"))
    out = Path(cfg.train.output_dir)
    print(
        f"done in {time.perf_counter() - start:.0f}s: metrics {out / 'metrics.jsonl'}, curves {out / 'curves.png'}, "
        f"model {summary['checkpoint']}",
        file=sys.stderr,
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from grpokit.config import ConfigError, DataConfig, LoraConfig, ModelConfig
    from grpokit.data import DataError, load_prompts
    from grpokit.evaluate import evaluate
    from grpokit.generation import FastGenerator
    from grpokit.loading import load_policy
    from grpokit.rewards import resolve_reward

    try:
        model, tokenizer, _ = load_policy(
            ModelConfig(name_or_path=args.model, dtype=args.dtype), LoraConfig()
        )
        data_cfg = DataConfig(
            train=args.data,
            template=args.template,
            prompt_column=args.prompt_column,
            max_prompt_tokens=args.max_prompt_tokens,
        )
        rows = load_prompts(args.data, prompt_column=args.prompt_column, limit=args.limit)
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
        )
    except (ConfigError, DataError, ValueError) as e:
        print(f"grpokit eval: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grpokit", description="GRPO-family RL fine-tuning with verifiable rewards"
    )
    sub = p.add_subparsers(dest="command")

    train = sub.add_parser("train", help="train (no arguments: the embedded demo)")
    train.add_argument("overrides", nargs="*", help="[CONFIG.yaml] then section.key=value overrides")
    train.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in train.output_dir"
    )
    train.add_argument("--output-dir", help="shorthand for train.output_dir=...")
    train.add_argument("--demo", action="store_true", help="run the embedded demo with these overrides")
    train.set_defaults(func=cmd_train)

    demo = sub.add_parser("demo", help="the embedded demo: a tiny model learns arithmetic on the CPU")
    demo.add_argument("overrides", nargs="*", help="section.key=value overrides")
    demo.add_argument("--output-dir", help="shorthand for train.output_dir=...")
    demo.add_argument("--resume", action="store_true")
    demo.set_defaults(func=cmd_train, demo=True)

    ev = sub.add_parser("eval", help="held-out accuracy of a model directory on a dataset")
    ev.add_argument("model")
    ev.add_argument("data")
    ev.add_argument("--reward", default="math_accuracy", help="reward whose value 1 means correct")
    ev.add_argument("--template", default="auto")
    ev.add_argument("--prompt-column", default="prompt")
    ev.add_argument("--max-prompt-tokens", type=int, default=1024)
    ev.add_argument("--max-new-tokens", type=int, default=256)
    ev.add_argument("--num-samples", type=int, default=4)
    ev.add_argument("--temperature", type=float, default=1.0)
    ev.add_argument("--limit", type=int)
    ev.add_argument("--dtype", default="auto")
    ev.set_defaults(func=cmd_eval)

    from grpokit.bench import add_bench_parser

    add_bench_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        argv = ["train"]
    args = build_parser().parse_args(argv)
    if args.command is None:
        args = build_parser().parse_args(["train", *argv])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

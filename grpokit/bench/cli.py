"""``grpokit bench`` / ``python -m grpokit.bench``: the command line of the training bench."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpokit.bench.inputs import bad_numbers, bad_overrides, unused_flags
from grpokit.bench.model import build_random_model
from grpokit.bench.report import print_algos_table, print_table
from grpokit.bench.run import bench_overrides, compare_algos, run_bench
from grpokit.bench.shapes import BENCH_SHAPES, MODEL_SHAPES, BenchError, cache_root
from grpokit.bench.trl import check_trl, compare, run_trl
from grpokit.config.checks import check_vllm_installed
from grpokit.config.schema import DTYPES, ENGINES, KV_CACHES, PRECISION_MODES, load_config
from grpokit.model.loading import pick_device


def cmd_bench(args: argparse.Namespace) -> int:
    def fail(message: str, code: int = 2) -> int:
        print(f"grpokit bench: {message}", file=sys.stderr)
        return code

    problem = unused_flags(args, _bench_parser()._actions) or bad_numbers(args) or bad_overrides(args)
    if problem:
        return fail(problem)
    if args.steps is not None and args.steps < 1:
        return fail(f"--steps must be >= 1, got {args.steps}")
    if args.json and (Path(args.json).is_dir() or not Path(args.json).parent.is_dir()):  # not after the bench ran
        where = "is a folder" if Path(args.json).is_dir() else f"its folder {Path(args.json).parent} does not exist or is a file"
        return fail(f"--json {args.json}: {where}; give a file path in an existing folder")
    if args.learn:
        return _cmd_learn(args, fail)
    if args.async_runs:
        return _cmd_async(args, fail)
    args.steps = 4 if args.steps is None else args.steps
    if args.plan:
        return _cmd_plan(args, fail)
    if args.memory:
        return _cmd_memory(args, fail)
    if args.mode == "sft":
        return _cmd_sft_bench(args, fail)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    problem = _check_algos(algos, args.compare)
    if problem:
        return fail(problem)
    engines = [e.strip() for e in args.engine.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        return fail(f"--engine {args.engine}: {bad or 'none given'} not among {', '.join(ENGINES)}")
    if len(engines) > 1 and (len(algos) > 1 or args.compare):
        return fail("--engine with several engines compares engines: use one --algos preset and no --compare")
    if len(engines) > 1:
        return _cmd_engines(args, engines, algos[0], fail)
    try:
        if args.compare == "trl":
            check_trl(args.trl_python)  # before spending minutes on our side
            if args.trl_script is not None and not Path(args.trl_script).is_file():
                return fail(f"--trl-script {args.trl_script}: no such file")
        common = dict(
            gradient_checkpointing=args.gradient_checkpointing,
            dtype=args.dtype,
            precision=args.precision,
            engine=args.engine,
            kv_cache=args.kv_cache,
            cuda_graphs=args.cuda_graphs,
            device=args.device,
        )
        for algo in algos:  # the settings and --set of each run, its device and engine, before a model is built
            cfg = load_config(None, [*bench_overrides(BENCH_SHAPES[args.shape], args.steps, algo=algo, beta=args.beta,
                                                      full_length=True, seed=0, **common), *args.set])  # fmt: skip
            device = pick_device(cfg.model.device)  # a GPU this machine lacks
            if args.memory_cap_gib is not None and device.type != "cuda":
                return fail(f"--memory-cap-gib {args.memory_cap_gib:g}: a memory cap needs a CUDA device, this run "
                            f"is on {device}")  # fmt: skip
            check_vllm_installed(cfg.rollout.engine, "rollout.engine", cfg.rollout.vllm.mode)
        if args.model_dir:  # checked by bad_numbers
            model_dir = Path(args.model_dir)
        else:
            size = args.model_size or ("tiny" if args.shape == "tiny" else "0.5b")
            print(f"grpokit bench: random {size} model in {args.cache_dir or cache_root()}", file=sys.stderr)
            model_dir = build_random_model(size, args.cache_dir)
        # One step of the tiny model first: the first run in a process would otherwise also count the
        # process's one-time costs (modules imported, thread pools, library workspaces) as its memory.
        run_bench(build_random_model("tiny", args.cache_dir), "tiny", steps=1, algo=algos[0], **common)
        results = {}
        for algo in algos:
            if len(algos) > 1:
                print(f"grpokit bench: algo.preset={algo}", file=sys.stderr)
            several = args.output_dir and len(algos) > 1
            out_dir = Path(args.output_dir) / algo if several else args.output_dir
            results[algo] = run_bench(
                model_dir,
                args.shape,
                steps=args.steps,
                algo=algo,
                beta=args.beta,
                output_dir=out_dir,
                overrides=args.set,
                memory_cap_gib=args.memory_cap_gib,
                **common,
            )
        if args.compare == "trl":
            print("grpokit bench: running TRL's GRPOTrainer on the same shape (subprocess)", file=sys.stderr)
            ours = results["grpo"]
            trl = run_trl(
                model_dir,
                args.shape,
                steps=args.steps,
                beta=ours["beta"],
                script=args.trl_script,
                python=args.trl_python,
            )
            ours["compare"] = compare(ours, trl)
    except BenchError as e:
        return fail(str(e))
    except ValueError as e:
        return fail(str(e))
    if len(algos) == 1:
        result = results[algos[0]]
        print_table(result)
    else:
        ratios = compare_algos(results)
        result = {"system": "grpokit", "algos": results, "ratios": ratios}
        for r in results.values():
            print_table(r)
        print_algos_table(results, ratios)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _cmd_learn(args: argparse.Namespace, fail) -> int:
    """--learn: held-out accuracy per step and per training second, grpokit beside TRL's GRPOTrainer on the
    demo's addition task, several seeds (grpokit.bench.learn); a table, a plot, RESULT."""
    from grpokit.bench.learn import FULL, QUICK, run_learn
    from grpokit.bench.learn_report import plot_learn, print_learn_table
    from grpokit.bench.learn_tasks import task_for

    base = QUICK if args.quick else FULL
    seeds = base["seeds"] if args.seeds is None else args.seeds
    steps = base["steps"] if args.steps is None else args.steps
    every = base["eval_every"] if args.eval_every is None else args.eval_every
    if seeds < 1 or every < 1:
        return fail(f"--learn: --seeds and --eval-every must be >= 1, got {seeds} and {every}")
    every = min(every, steps)
    out_dir = Path(args.output_dir or ".")
    if not out_dir.is_dir():
        return fail(f"--output-dir {out_dir}: no such folder (the plot learn.png is written there)")
    try:
        check_trl(args.trl_python)
        arms = tuple(a.strip() for a in args.arms.split(",")) if args.arms else ("grpokit", "selection", "trl")
        result = run_learn(
            seeds=seeds, steps=steps, eval_every=every, grpokit_set=args.set, trl_set=args.trl_set,
            task=task_for(args.task, args.train_size, args.lr), frameworks=arms,
        )  # fmt: skip
    except BenchError as e:
        return fail(str(e), code=1)
    print_learn_table(result)
    plot = "learn.png" if args.task == "sum" else f"learn-{args.task}.png"  # one per task in one folder
    result["plot"] = str(plot_learn(result, out_dir / plot))
    print(f"plot: {result['plot']}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _cmd_async(args: argparse.Namespace, fail) -> int:
    """--async: the demo synchronous and with rollout.max_staleness = K, one run after the other, held-out accuracy
    against training seconds (grpokit.bench.async_runs); a table, async.png in --output-dir, RESULT."""
    from grpokit.bench.async_runs import plot_async, print_async_table, run_async

    steps = 40 if args.steps is None else args.steps
    every = min(5 if args.eval_every is None else args.eval_every, steps)
    seeds = 1 if args.seeds is None else args.seeds
    try:
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        return fail(f"--ks {args.ks}: give comma-separated integers, e.g. 0,1,2")
    if not ks or ks[0] != 0 or len(set(ks)) != len(ks) or min(ks) < 0:
        return fail(f"--ks {args.ks}: give distinct K >= 0, starting with 0 (the synchronous baseline)")
    if every < 1 or seeds < 1 or args.reward_latency < 0:
        return fail(
            f"--async: --eval-every and --seeds must be >= 1 and --reward-latency >= 0, got {every}, {seeds} and "
            f"{args.reward_latency:g}"
        )
    out_dir = Path(args.output_dir or "runs/async_bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = run_async(
            ks, steps=steps, eval_every=every, seeds=list(range(seeds)), out_dir=out_dir,
            latency=args.reward_latency, target=args.target, overrides=args.set,
        )  # fmt: skip
    except BenchError as e:
        return fail(str(e), code=1)
    print_async_table(result)
    result["plot"] = str(plot_async(result, out_dir / "async.png"))
    print(f"plot: {result['plot']}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _cmd_plan(args: argparse.Namespace, fail) -> int:
    """--plan MODEL_CONFIG --memory-gib N: which settings fit, by role (grpokit.bench.plan), on --shape."""
    from grpokit.bench.plan import ModelDims, plan, print_plan

    if args.memory_gib is None:
        return fail("--plan needs --memory-gib N (> 0), the GPU's memory in GiB, e.g. --memory-gib 16")
    try:
        dims = ModelDims.from_file(args.plan)
    except ValueError as e:
        return fail(str(e))
    shape = BENCH_SHAPES[args.shape]
    lengths = [shape.prompt_len + shape.completion_len] * shape.completions
    rows = plan(dims, args.memory_gib, lengths)
    print_plan(dims, args.memory_gib, rows, args.shape)
    result = {"system": "grpokit", "kind": "plan", "memory_gib": args.memory_gib, "shape": args.shape}
    result["rows"] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _cmd_memory(args: argparse.Namespace, fail) -> int:
    """--memory: the update's peak by role, padded vs packed, on a long-tailed batch, with --compare trl
    TRL's GRPOTrainer on the same batch beside them (grpokit.bench.update_memory)."""
    from grpokit.bench.update_memory import VARIANTS, measure, print_memory_table

    trl = args.compare == "trl"
    if trl and (args.trl_python or args.trl_script):
        flag = "--trl-python" if args.trl_python else "--trl-script"
        return fail(f"--memory --compare trl runs TRL in this Python with grpokit's meter: drop {flag}")
    try:
        if trl:
            check_trl()  # before spending minutes on our side
        beta = 0.04 if args.beta is None else args.beta
        result = measure(
            list(VARIANTS),
            steps=max(args.steps, 2),
            beta=beta,
            overrides=args.set,
            trl=trl,
            batch=args.batch or "short-8",
        )
    except BenchError as e:
        return fail(str(e))
    except RuntimeError as e:
        return fail(str(e), code=1)
    print_memory_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _cmd_engines(args: argparse.Namespace, engines: list[str], algo: str, fail) -> int:
    """--engine hf,fast,vllm: the same model, shape and preset on each engine in turn; a table side by side."""
    from grpokit.bench.report import print_engines_table

    try:
        size = args.model_size or ("tiny" if args.shape == "tiny" else "0.5b")
        model_dir = Path(args.model_dir) if args.model_dir else build_random_model(size, args.cache_dir)
        common = dict(
            gradient_checkpointing=args.gradient_checkpointing, dtype=args.dtype, precision=args.precision,
            kv_cache=args.kv_cache, cuda_graphs=args.cuda_graphs, device=args.device,
        )  # fmt: skip
        # the process's one-time costs on a tiny model first (the fast engine: vllm needs head_dim >= 32)
        run_bench(build_random_model("tiny", args.cache_dir), "tiny", steps=1, algo=algo, engine="fast", **common)
        results = {}
        for engine in engines:
            print(f"grpokit bench: rollout.engine={engine}", file=sys.stderr)
            out_dir = Path(args.output_dir) / engine if args.output_dir else None
            results[engine] = run_bench(
                model_dir, args.shape, steps=args.steps, algo=algo, beta=args.beta, output_dir=out_dir,
                overrides=args.set, memory_cap_gib=args.memory_cap_gib, engine=engine, **common,
            )  # fmt: skip
    except (BenchError, ValueError) as e:
        return fail(str(e))
    result = {"system": "grpokit", "engines": results}
    print_engines_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _cmd_sft_bench(args: argparse.Namespace, fail) -> int:
    """--mode sft: grpokit's SFTTrainer (and with --compare trl TRL's SFTTrainer) on an SFT shape."""
    from grpokit.bench.sft import SFT_SHAPES, compare_sft, print_sft_table, run_sft_bench, run_trl_sft

    shape = args.shape
    if shape not in SFT_SHAPES:
        return fail(f"--mode sft: --shape {shape} is not an SFT shape; choose one of {', '.join(SFT_SHAPES)}")
    try:
        if args.compare == "trl":
            check_trl(args.trl_python)
        if args.model_dir:  # checked by bad_numbers
            model_dir = Path(args.model_dir)
        else:
            size = args.model_size or ("tiny" if shape == "tiny" else "0.5b")
            model_dir = build_random_model(size, args.cache_dir)
        common = dict(packing=args.packing, gradient_checkpointing=args.gradient_checkpointing)
        run_sft_bench(build_random_model("tiny", args.cache_dir), "tiny", steps=1)  # one-time process costs
        result = run_sft_bench(
            model_dir, shape, steps=args.steps, dtype=args.dtype, precision=args.precision, device=args.device, **common
        )
        if args.compare == "trl":
            print("grpokit bench: running TRL's SFTTrainer on the same rows (subprocess)", file=sys.stderr)
            trl = run_trl_sft(model_dir, shape, steps=args.steps, python=args.trl_python, **common)
            result["compare"] = compare_sft(result, trl)
    except (BenchError, ValueError) as e:
        return fail(str(e))
    print_sft_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _bench_parser() -> argparse.ArgumentParser:
    """``grpokit bench``'s options alone (their names and defaults)."""
    parser = argparse.ArgumentParser(prog="grpokit bench")
    add_bench_options(parser)
    return parser


def _check_algos(algos: list[str], compare_with: str | None) -> str | None:
    """Why the --algos list cannot run, or None."""
    from grpokit.algos import PRESETS

    if not algos:
        return "--algos needs at least one preset name, e.g. --algos grpo,ppo"
    unknown = [a for a in algos if a not in PRESETS]
    if unknown:
        return f"--algos: unknown preset(s) {', '.join(unknown)}; choose from {', '.join(PRESETS)}"
    if len(set(algos)) != len(algos):
        return f"--algos names a preset twice: {','.join(algos)}"
    if compare_with == "trl" and "grpo" not in algos:
        return "--compare trl compares TRL's GRPOTrainer with the grpo preset: include grpo in --algos"
    return None


def add_bench_parser(subparsers) -> None:
    """Register ``grpokit bench`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "bench",
        help="seconds per training step and memory by role on a fixed shape (beside TRL, or per algorithm)",
        description=(
            "Time GRPO training steps of a randomly initialised Qwen2 model on a fixed shape "
            f"({', '.join(f'{k}: {v.prompts}x{v.group_size}, prompt {v.prompt_len}, completion {v.completion_len}' for k, v in BENCH_SHAPES.items())}). "
            "Completions always run to the full length. Prints a table, each phase (generation, reference, update) "
            "against its bound on the device it ran on (bytes over bandwidth, FLOP over peak; grpokit.bench.roofline) "
            "and one 'RESULT {json}' line. An option the chosen bench (--plan, --memory, --learn, --async, --mode sft "
            "or the step bench) does not read is refused by name."
        ),
    )
    add_bench_options(p)
    p.set_defaults(func=cmd_bench)


def add_bench_options(p: argparse.ArgumentParser) -> None:
    """Every option of ``grpokit bench`` on ``p``."""
    # here, not at the top: ``python -m grpokit.bench.update_memory`` imports this package first, and a module
    # imported before runpy runs it as __main__ is run twice (a RuntimeWarning in every variant's process)
    from grpokit.bench.update_memory import BATCHES

    p.add_argument(
        "--mode",
        choices=["grpo", "sft"],
        default="grpo",
        help="grpo: RL steps (rollout + update); sft: supervised fine-tuning steps (grpokit.bench.sft)",
    )
    p.add_argument("--shape", choices=list(BENCH_SHAPES), default="standard")
    p.add_argument("--packing", action="store_true", help="--mode sft: padding-free packing on both sides")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--model-size",
        choices=list(MODEL_SHAPES),
        help="random model to build/reuse (default: tiny for --shape tiny, else 0.5b)",
    )
    which.add_argument(
        "--model-dir",
        help="a model directory with a word-level w0 w1 ... tokenizer (e.g. from make_model.py)",
    )
    p.add_argument(
        "--steps",
        type=int,
        help="steps to run; the median is over steps 2..N (default 4; --learn: 60, --quick 20; --async: 40)",
    )
    p.add_argument(
        "--learn",
        action="store_true",
        help="held-out accuracy per step and per training second, grpokit beside TRL's GRPOTrainer on the demo's "
        "addition task from its shipped warm start, each run in its own one-thread process, a seed's two runs "
        "side by side; a table, the settings that differ and learn.png in --output-dir (grpokit.bench.learn)",
    )
    p.add_argument(
        "--async",
        dest="async_runs",
        action="store_true",
        help="wall-clock to the same held-out accuracy: the demo trained synchronously and with asynchronous "
        "rollouts (rollout.max_staleness = each of --ks), one run after the other, each its own process; a "
        "table and async.png in --output-dir (default runs/async_bench; grpokit.bench.async_runs)",
    )
    p.add_argument("--ks", default="0,1,2", help="--async: rollout.max_staleness values, 0 (synchronous) first")
    p.add_argument(
        "--reward-latency",
        type=float,
        default=0.0,
        help="--async: seconds the demo's reward waits a call (a remote verifier; no CPU used)",
    )
    p.add_argument("--target", type=float, help="--async: held-out accuracy to reach (default: K=0's final)")
    p.add_argument("--seeds", type=int, help="--learn, --async: seeds 0..N-1 (default 3, --async 1; --quick 1)")
    p.add_argument(
        "--eval-every", type=int, help="--learn, --async: steps between evaluations (default 10, --async 5; --quick 5)"
    )
    p.add_argument("--quick", action="store_true", help="--learn: 1 seed x 20 steps, a smoke run")
    p.add_argument(
        "--task", default="sum", help="--learn: sum | twin (two rewards) | tools (multi-turn, a tool; no TRL arm) | mixed"
    )
    p.add_argument("--train-size", type=int, help="--learn: the first N training prompts (default: all)")
    p.add_argument(
        "--lr", type=float, help="--learn: the learning rate of both frameworks (default: the task's, 1e-4; tools 3e-4)"
    )
    p.add_argument(
        "--arms", help="--learn: comma-separated, of grpokit, selection, no_adoption, trl (default grpokit,selection,trl)"
    )
    p.add_argument(
        "--trl-set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="--learn: a TRL GRPOConfig field of the TRL runs (repeatable), e.g. --trl-set adam_beta2=0.99",
    )
    p.add_argument(
        "--compare", choices=["trl"], help="also run TRL's GRPOTrainer on the same model and shape"
    )
    p.add_argument(
        "--trl-script",
        help="TRL script printing 'RESULT {json}' (default: shared/bench/trl_bench.py if found, else built in)",
    )
    p.add_argument("--trl-python", help="Python interpreter for the TRL run (default: this one)")
    p.add_argument("--json", help="also write the result to this JSON file")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument(
        "--precision",
        choices=PRECISION_MODES,
        default="auto",
        help="optim.precision (grpokit.model.precision); bf16_mixed is what TRL's bf16=True does",
    )
    p.add_argument(
        "--engine",
        default="fast",
        help=f"rollout engine ({', '.join(ENGINES)}), or several comma-separated (hf,fast,vllm): each runs the "
        "same model and shape in turn, side by side in one table (vllm needs vLLM installed)",
    )
    p.add_argument("--kv-cache", choices=KV_CACHES, default="auto", help="fast engine's KV cache")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--algos",
        default="grpo",
        help="comma list of algo presets to run on the same model and shape, e.g. grpo,ppo: step time, "
        "peak memory and memory by role for each, and the ratios to the first (default grpo)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override applied after the bench's own (repeatable), e.g. --set lora.enabled=true",
    )
    p.add_argument(
        "--memory-cap-gib",
        type=float,
        help="cap this process's CUDA memory at this many GiB (torch.cuda.set_per_process_memory_fraction), "
        "as a smaller card would; the grpokit runs only, not TRL's",
    )
    p.add_argument("--beta", type=float, help="algo.beta of every run (default: each preset's; grpo 0.04)")
    p.add_argument(
        "--memory",
        action="store_true",
        help="the GRPO update's peak memory by role and time, padded vs packed (and with --compare trl TRL's "
        "GRPOTrainer), on a long-tailed batch with a few-layer Qwen2.5-shaped model and the real vocabulary, "
        "each in its own process (grpokit.bench.update_memory)",
    )
    p.add_argument(
        "--batch",
        choices=list(BATCHES),
        help="--memory: the rows' lengths (grpokit.bench.update_memory.BATCHES; default short-8: 8 rows, one "
        "completion of 256 tokens, seven of 4-24; long-tail-16: 16 rows, prompts of 16-64 tokens, 7/8 of the "
        "completions 8-64 tokens and 1/8 512-1024)",
    )
    p.add_argument(
        "--plan",
        metavar="MODEL_CONFIG",
        help="a model's config.json (or its folder): predict which settings fit --memory-gib GiB, by role, on "
        "--shape (grpokit.bench.plan); nothing is run",
    )
    p.add_argument("--memory-gib", type=float, help="--plan: the GPU's memory in GiB, e.g. 16")
    p.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    p.add_argument(
        "--cache-dir", help="where random models are built and kept (default $GRPOKIT_CACHE/bench)"
    )
    p.add_argument("--output-dir", help="trainer output directory (default: a temporary one)")


def main(argv: list[str] | None = None) -> int:
    """``python -m grpokit.bench ARGS`` is ``grpokit bench ARGS``."""
    parser = argparse.ArgumentParser(prog="grpokit")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)

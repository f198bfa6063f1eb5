"""Training step time: seconds per step and memory by role, on fixed shapes, beside TRL or per algorithm.

    grpokit bench --shape standard --model-size 0.5b --compare trl
    grpokit bench --shape long --model-size 0.5b --compare trl --json long.json
    grpokit bench --shape tiny --model-size tiny --steps 3          # CPU smoke run
    grpokit bench --shape standard --model-size 0.5b --algos grpo,ppo   # memory by role, GRPO/PPO ratios
    grpokit bench --learn                   # held-out accuracy per step and per second beside TRL (learn.py)
    grpokit bench --memory --compare trl    # the update's peak by role: padded, packed, TRL (update_memory.py)
    grpokit bench --async                   # the demo synchronous and with rollout.max_staleness 1, 2 (async_runs.py)

One step is what TRL's ``GRPOTrainer`` does per optimizer step: generate P*G completions, score them,
compute the reference log-probs (beta > 0), then one pass of gradient-accumulated updates over all of
them (one optimizer step). The reported s/step is the median of steps 2..N (step 1 warms up kernels
and allocators), each timed on the wall clock with ``torch.cuda.synchronize()`` on both ends.

The model is randomly initialised (``build_random_model``): speed and memory do not depend on the
weights. A random model almost never emits EOS (probability about 1/vocab per token), so in TRL its
completions run to the full length. We make that exact rather than likely with the public option
``rollout.ignore_eos=true`` (an EOS drawn ends nothing), so every completion is exactly
``completion_len`` tokens and both sides do the same amount of work. Prompts are random words of the word-level
tokenizer, exactly ``prompt_len`` tokens each (checked); the reward is a seeded random 0/1.

Precision (``--precision``, grpokit.model.precision): on a GPU grpokit's default is ``bf16_kahan`` (bfloat16
weights and gradients, AdamW states in bfloat16 plus a Kahan compensation buffer: 10 bytes/param);
float32 on CPU. TRL (1.16) loads a model given by path in float32 unless ``model_init_kwargs["dtype"]``
says otherwise, and ``bf16=True`` runs it under bfloat16 autocast: float32 weights, gradients and AdamW
states (16 bytes/param), which is grpokit's ``--precision bf16_mixed``. Report both: the defaults side
by side, and the same numerics side by side. ``--dtype float32`` gives float32 everything.

Peak memory: ``peak_memory_gib`` is the trainer's own ``peak_memory_mb`` metric
(``torch.cuda.max_memory_allocated``, model, reference and optimizer included, as in the TRL anchor;
on CPU the process's peak RSS). ``memory`` is the peak's increase over the memory in use before the
trainer was built, split by role: policy weights, gradients, optimizer state, reference model, critic
weights, gradients and optimizer state (PPO), and activations/other (``grpokit.bench.memory``).
Whether the decode replayed CUDA graphs is the trainer's ``rollout/cuda_graphs`` step metric.

Modules: ``shapes`` (model and step shapes), ``model`` (the random model, prompts, reward), ``run``
(timing a trainer run), ``memory`` (memory by role), ``update_memory`` (``--memory``: the update alone,
padded, packed and TRL's), ``plan`` (``--plan``), ``roofline`` (each phase's bound on the device: bytes over
bandwidth for decoding, FLOP over peak for the reference pass and the update; the result's ``bounds``), ``profile``
(scripts/profile_step.py's phases: top kernels and the gaps between them), ``trl`` (TRL's
side), ``report`` (the tables), ``learn`` (learning beside TRL: ``--learn``), ``async_runs`` (asynchronous
rollouts against the synchronous loop: ``--async``), ``inputs`` (what the command line is given, checked before anything runs), ``curves`` (a run's accuracy against training seconds, read
from its output folder), ``cli`` (``grpokit bench``).
"""

from grpokit.bench.cli import add_bench_parser, cmd_bench, main
from grpokit.bench.memory import ROLES, PeakMeter, memory_report, role_bytes
from grpokit.bench.model import build_random_model, random_prompts, random_reward
from grpokit.bench.report import print_algos_table, print_table
from grpokit.bench.roofline import decode_roofline
from grpokit.bench.run import compare_algos, run_bench
from grpokit.bench.shapes import (
    BENCH_SHAPES,
    H100_SXM_BF16_FLOPS,
    H100_SXM_MEM_BW,
    MAX_WORD,
    MODEL_SHAPES,
    TIME_KEYS,
    BenchError,
    BenchShape,
    cache_root,
)
from grpokit.bench.trl import TRL_SCRIPT, check_trl, compare, find_trl_script, parse_result_line, run_trl

__all__ = [
    "BENCH_SHAPES",
    "H100_SXM_BF16_FLOPS",
    "H100_SXM_MEM_BW",
    "MAX_WORD",
    "MODEL_SHAPES",
    "ROLES",
    "TIME_KEYS",
    "TRL_SCRIPT",
    "BenchError",
    "BenchShape",
    "PeakMeter",
    "add_bench_parser",
    "build_random_model",
    "cache_root",
    "check_trl",
    "cmd_bench",
    "compare",
    "compare_algos",
    "decode_roofline",
    "find_trl_script",
    "main",
    "memory_report",
    "parse_result_line",
    "print_algos_table",
    "print_table",
    "random_prompts",
    "random_reward",
    "role_bytes",
    "run_bench",
    "run_trl",
]

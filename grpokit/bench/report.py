"""The bench's tables: one run (beside TRL's when compared), and several algorithms side by side with
their memory by role."""

from __future__ import annotations

import shutil
import sys
from typing import Any

from grpokit.bench.memory import ROLES
from grpokit.bench.shapes import TIME_KEYS


def _fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}{unit}"


def print_table(result: dict[str, Any], file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    med = result["median"]
    cmp = result.get("compare")
    trl = cmp["trl"] if cmp else None
    caption = (
        f"{result['completions_per_step']} completions/step, prompt {result['prompt_len']}, completion "
        f"{result['completion_len']} tokens; {result['n_params'] / 1e6:.1f}M params, "
        f"precision {result.get('precision', '?')} ({result['dtype']} weights, "
        f"{result.get('bytes_per_param', '?')} bytes/param for weights+grads+AdamW), "
        f"{result['device']}; decode: {result.get('decode_engine', '?')} KV cache"
        f"{' + CUDA graphs' if result.get('cuda_graphs_used') else ''}"
        f"{' + compiled layers' if result.get('compiled_decode') else ''}"
        f"{'; the prompt shared in the passes' if result.get('shared_prompt') else ''}"
        f"{'; fused log-softmax' if result.get('fused_logprobs') else ''}"
        f"; median of steps 2..{result['steps']}"
        + (f"; memory: {memory['peak_kind']}, gradients computed" if (memory := result.get("memory")) else "")
    )
    table = Table(
        title=f"grpokit bench: {result.get('algo', 'grpo')}, shape {result['shape']}", caption=caption
    )
    table.add_column("")
    table.add_column("grpokit", justify="right")
    if trl:
        table.add_column(f"TRL {trl.get('trl_version', '')}", justify="right")
        table.add_column("grpokit / TRL", justify="right")
    rows = [("s/step", med["step_s"], trl and trl.get("median_step_s"), cmp and cmp["step_s_ratio"])]
    for k in TIME_KEYS + ("other",):
        rows.append((f"  {k} s", med[f"{k}_s"], None, None))
    rows.append(("completion tokens/s", med["tokens_per_s"], None, None))
    rows.append(("  during generation", med["generation_tokens_per_s"], None, None))
    peak = result["peak_memory_gib"]
    rows.append(
        (
            f"peak memory GiB ({result['peak_memory_kind']})",
            peak,
            trl and trl.get("peak_alloc_gib"),
            cmp and cmp["peak_memory_ratio"],
        )
    )
    memory = result.get("memory")
    if memory:
        rows.append(("memory GiB: peak increase, by role", memory["peak_bytes"] / 2**30, None, None))
        for role, size in memory["roles"].items():
            if size:
                rows.append((f"  {role.replace('_', ' ')}", size / 2**30, None, None))
        rows.append(("  activations/other", memory["activations_other_bytes"] / 2**30, None, None))
        for role, size in memory.get("offloaded_to_cpu", {}).items():  # optim.offload_*: not in the peak
            rows.append((f"  (in CPU memory) {role.replace('_', ' ')}", size / 2**30, None, None))
    roof = result["roofline_h100"]
    rows.append(("H100 decode bound s", roof["seconds"], None, None))
    oom = bool(trl and trl.get("out_of_memory"))
    for name, ours, theirs, ratio in rows:
        cells = [name, _fmt(ours)]
        if trl:
            headline = name == "s/step" or name.startswith("peak")
            shown = "out of memory" if oom and headline else _fmt(theirs)
            cells += [shown, _fmt(ratio, "x")]
        table.add_row(*cells)
    Console(file=file or sys.stdout, width=max(100, shutil.get_terminal_size().columns)).print(table)
    if result.get("bounds"):
        print_bounds_table(result["bounds"], file=file)


def print_bounds_table(bounds: dict[str, Any], file=None) -> None:
    """Each phase's median seconds, its bound on the device (grpokit.bench.roofline.phase_bounds) and the ratio."""
    from rich.console import Console
    from rich.table import Table

    device = bounds["device"]
    caption = (
        f"{device['device']}, {device['dtype']}: {device['mem_bw_bytes_s'] / 1e9:.4g} GB/s, "
        f"{device['peak_flops'] / 1e12:.4g} TFLOP/s ({device['source']})"
    )
    table = Table(title="each phase against its bound on this device", caption=caption)
    for column in ("phase", "measured s", "bound s", "measured / bound", "bound from"):
        table.add_column(column, justify="left" if column in ("phase", "bound from") else "right")
    for name, phase in bounds["phases"].items():
        work = f"{phase['bytes']:.3g} B" if "bytes" in phase else f"{phase['flops']:.3g} FLOP"
        table.add_row(name, _fmt(phase["measured_s"]), _fmt(phase["bound_s"]), _fmt(phase["ratio"], "x"),
                      f"{work}: {phase['basis']}")  # fmt: skip
    Console(file=file or sys.stdout, width=max(100, shutil.get_terminal_size().columns)).print(table)


def print_engines_table(results: dict[str, dict[str, Any]], file=None) -> None:
    """Step time, its generation and update parts and completion tokens/s for each rollout engine, medians."""
    from rich.console import Console
    from rich.table import Table

    first = next(iter(results.values()))
    caption = (
        f"shape {first['shape']}: {first['completions_per_step']} completions/step, prompt {first['prompt_len']}, "
        f"completion {first['completion_len']} tokens; {first['n_params'] / 1e6:.1f}M params, precision "
        f"{first['precision']}, {first['device']}; median of steps 2..{first['steps']}"
    )
    table = Table(title="grpokit bench: rollout engines", caption=caption)
    table.add_column("")
    for name in results:
        table.add_column(name, justify="right")
    meds = [r["median"] for r in results.values()]
    table.add_row("s/step", *[_fmt(m["step_s"]) for m in meds])
    for k in TIME_KEYS:
        table.add_row(f"  {k} s", *[_fmt(m[f"{k}_s"]) for m in meds])
    table.add_row("completion tokens/s", *[_fmt(m["tokens_per_s"]) for m in meds])
    table.add_row("  during generation", *[_fmt(m["generation_tokens_per_s"]) for m in meds])
    Console(file=file or sys.stdout, width=max(100, shutil.get_terminal_size().columns)).print(table)


def print_algos_table(results: dict[str, dict[str, Any]], ratios: dict[str, dict], file=None) -> None:
    """Step time, measured peak and memory by role (GiB) for each algorithm, and the ratios to the first."""
    from rich.console import Console
    from rich.table import Table

    first = next(iter(results.values()))
    caption = (
        f"shape {first['shape']}: {first['completions_per_step']} completions/step, prompt {first['prompt_len']}, "
        f"completion {first['completion_len']} tokens; {first['n_params'] / 1e6:.1f}M params, precision "
        f"{first['precision']}, {first['device']}; peak = {first['memory']['peak_kind']}; "
        "gradients computed from the trainable parameters"
    )
    table = Table(title="grpokit bench: algorithms", caption=caption)
    table.add_column("")
    for name in results:
        table.add_column(name, justify="right")
    for pair in ratios:
        table.add_column(pair, justify="right")
    gib = 2**30

    def row(label: str, values: list[float | None], ratio_key: str | None = None) -> None:
        cells = [_fmt(v) for v in values]
        cells += [_fmt(r.get(ratio_key), "x") if ratio_key else "" for r in ratios.values()]
        table.add_row(label, *cells)

    row("s/step", [r["median_step_s"] for r in results.values()], "step_s")
    row("peak memory GiB", [r["memory"]["peak_bytes"] / gib for r in results.values()], "peak_memory")
    for role in ROLES:
        values = [r["memory"]["roles"][role] / gib for r in results.values()]
        if any(values):
            row(f"  {role.replace('_', ' ')}", values)
    row("  activations/other", [r["memory"]["activations_other_bytes"] / gib for r in results.values()])
    Console(file=file or sys.stdout, width=max(100, shutil.get_terminal_size().columns)).print(table)

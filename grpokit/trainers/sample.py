"""Rejection sampling (``grpokit sample``): N completions per prompt from a model, every configured reward
scored, the passing ones kept as SFT data (DeepSeek-R1's stage 3, arXiv 2501.12948 sec. 2.3.3).

    grpokit sample CONFIG.yaml [key=value ...] [--output-dir DIR] [--resume] [--overwrite]

The model is any checkpoint (the RL stage's, or a teacher's for distillation). For each prompt of
``data.train``, ``sample.n`` completions at ``sample.temperature`` (batched: ``sample.batch_prompts``
prompts per generation call, through the trainer's generators), scored by every entry of ``rewards``
with the trainer's RewardRunner. A completion *passes* when

    it ended with EOS (``keep.drop_truncated``), has some text (``keep.drop_empty``) and, for every
    reward with a threshold ``min``,
    its value is >= min, or None (the reward does not apply to it; a *failed* row does not pass).

Of one prompt's passing completions, ``keep.dedupe`` drops repeats of the same text (stripped),
``keep.prefer_shortest`` orders them by token count (ties: sample order; against overthinking), and
``keep.max_per_prompt`` keeps the first ones. Worked example, n = 4, rewards accuracy (min 1) and
format (min 1), max_per_prompt 1, prefer_shortest: scores (1,1) 9 tokens, (1,0), (0,1), (1,1) 5 tokens
-> two pass (pass rate 0.5), the 5-token one is kept.

Outputs in the output folder:
- ``samples.jsonl`` (or ``.parquet``, ``output.format``): SFT-ready rows in TRL's prompt + completion form
  (a chat prompt gets ``[{"role": "assistant", "content": ...}]`` as completion), the source row's other
  columns, and provenance: ``source_model``, ``scores`` {reward: value}, ``completion_tokens``,
  ``prompt_index``, ``sample_index``, ``pass_rate``.
- ``pass_rates.jsonl``: every source row with ``pass_rate``, ``passed``, ``samples``, ``kept`` and
  ``mean_scores``: loadable as prompts, so difficulty filtering can read it.
- ``candidates/NNNNNNNN.jsonl``: every completion of a batch of prompts with its scores, written atomically
  as the batch finishes; ``--resume`` skips the batches already there (each batch has its own seed, so a
  resumed run samples what an unbroken one would). The selection is redone from them at the end, so
  ``keep.*`` and the thresholds may change on resume; the model, data, sampling and rewards may not.
- ``summary.json`` (``output``: the samples file; ``checkpoint``: the source model, for pipelines; ``seconds``
  and ``cpu_seconds``: the sampling's, every leg's when resumed), ``config.yaml``.
- ``sampling_seconds.json``: the wall and CPU seconds up to the last batch saved, which a resumed run goes on
  from (so a pipeline's ``cpu_budget_of`` counts a resumed sample stage once, whole).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from grpokit.config.checks import build_config
from grpokit.config.sample import FORMATS, KeepConfig, SampleConfig, check_sample_config
from grpokit.config.schema import apply_overrides
from grpokit.core.clock import TrainingClock
from grpokit.core.errors import ConfigError
from grpokit.core.files import replace_whole

PROVENANCE = ("source_model", "scores", "completion_tokens", "prompt_index", "sample_index", "pass_rate")
"""Columns every kept row gets (a source column of the same name is refused)."""


SECONDS_FILE = "sampling_seconds.json"
"""The seconds up to the last batch saved: {"seconds", "cpu_seconds"} (a resumed run continues them)."""

FREE_TO_CHANGE = ("keep.", "output.", "rewards.min")
"""Settings a resumed run may change: the selection is redone from the saved candidates."""


def load_sample_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> SampleConfig:
    """Read a YAML file (optional), lay the dotted overrides over it, check every key and value."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            values = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from e
        if not isinstance(values, dict):
            raise ConfigError(
                f"{p}: the top level must be a mapping of sections (model:, data:, sample:, ...)"
            )
    apply_overrides(values, overrides)
    try:
        cfg = build_config(SampleConfig, values)
        check_sample_config(cfg)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path is not None else str(e)) from None
    return cfg


# ----------------------------------------------------------------------------- selection (pure)


def passes(candidate: dict, thresholds: dict[str, float | None], keep: KeepConfig) -> bool:
    """Whether one scored completion passes: EOS reached and some text (as ``keep`` asks), every threshold
    met; a None score (not applicable) passes, a failed one (named in ``candidate["failed"]``) does not."""
    if keep.drop_truncated and candidate["truncated"]:
        return False
    if keep.drop_empty and not _text(candidate["completion"]).strip():
        return False
    failed = set(candidate.get("failed", ()))
    for name, low in thresholds.items():
        if name in failed:
            return False
        value = candidate["scores"].get(name)
        if low is not None and value is not None and value < low:
            return False
    return True


def select(
    candidates: list[dict], thresholds: dict[str, float | None], keep: KeepConfig
) -> tuple[list[dict], dict[int, dict]]:
    """The kept candidates and per-prompt statistics of one prompt's or many prompts' candidates.

    candidates: dicts with prompt_index, sample_index, completion (text), completion_tokens, truncated,
    scores {reward: value | None}, failed [rewards]. Returns (kept, {prompt_index: {samples, passed,
    pass_rate, kept}}); kept is in prompt order, within a prompt in the order chosen (module docstring)."""
    by_prompt: dict[int, list[dict]] = {}
    for c in candidates:
        by_prompt.setdefault(c["prompt_index"], []).append(c)
    kept: list[dict] = []
    stats: dict[int, dict] = {}
    for index in sorted(by_prompt):
        group = sorted(by_prompt[index], key=lambda c: c["sample_index"])
        passing = [c for c in group if passes(c, thresholds, keep)]
        chosen = passing
        if keep.dedupe:
            seen: set[str] = set()
            chosen = []
            for c in passing:
                text = _text(c["completion"]).strip()
                if text not in seen:
                    seen.add(text)
                    chosen.append(c)
        if keep.prefer_shortest:
            chosen = sorted(chosen, key=lambda c: (c["completion_tokens"], c["sample_index"]))
        if keep.max_per_prompt:
            chosen = chosen[: keep.max_per_prompt]
        kept += chosen
        stats[index] = {
            "samples": len(group),
            "passed": len(passing),
            "pass_rate": len(passing) / len(group),
            "kept": len(chosen),
        }
    return kept, stats


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # [{"role": "assistant", "content": ...}]
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


# ----------------------------------------------------------------------------- the run


def score_names(cfg: SampleConfig) -> list[str]:
    """The rewards' names in ``scores`` (as the trainer logs them: "my_rewards.py:brevity" is "brevity")."""
    from grpokit.run.log import reward_metric_names

    return reward_metric_names([spec.name for spec in cfg.rewards])


class SampleError(ValueError):
    """A problem with the run's inputs or its output folder (exit code 2)."""


def run_sample(
    cfg: SampleConfig, *, resume: bool = False, overwrite: bool = False, log=None
) -> dict[str, Any]:
    """Sample, score and select as the module docstring says; returns the summary (also summary.json)."""
    from grpokit.data.prompts import load_prompts
    from grpokit.rewards import resolve_reward_specs

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(cfg.output.dir)
    _check_output(out, cfg, resume=resume, overwrite=overwrite)
    rows = load_prompts(
        cfg.data.train,
        prompt_column=cfg.data.prompt_column,
        split=cfg.data.split,
        config=cfg.data.config,
        limit=cfg.sample.limit,
    )
    clash = [name for name in PROVENANCE if any(name in row for row in rows)]
    if clash:
        raise SampleError(
            f"{cfg.data.train}: column {clash[0]!r} is one the samples file writes itself ({', '.join(PROVENANCE)}); "
            "rename it in the data."
        )
    reward_functions = resolve_reward_specs(cfg.rewards)  # before the model loads: a bad reward fails at once
    reward_functions = [(name, fn, w) for name, (_, fn, w) in zip(score_names(cfg), reward_functions)]
    from grpokit.config.schema import LoraConfig
    from grpokit.data.prompts import check_reward_columns
    from grpokit.data.templates import encode_prompts
    from grpokit.model.loading import load_policy, read_model_config

    # the columns the rewards read (math_accuracy's answer) and the model's folder, before it loads: a
    # missing column failed at the first scoring, after a batch had been generated
    check_reward_columns(rows, reward_functions, str(cfg.data.train))
    read_model_config(cfg.model)
    # the seconds of the sampling (the model's load included), going on from a resumed run's last batch saved
    clock = TrainingClock()
    if resume and (out / SECONDS_FILE).is_file():
        kept = json.loads((out / SECONDS_FILE).read_text())
        clock.carry({"train_cpu_seconds": kept["cpu_seconds"], "train_seconds": kept["seconds"]})
    clock.start()

    model, tokenizer, _ = load_policy(cfg.model, LoraConfig())
    model.eval()
    encoded = encode_prompts(
        [row[cfg.data.prompt_column] for row in rows],
        tokenizer,
        template=cfg.data.template,
        system_prompt=cfg.data.system_prompt,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        source=cfg.data.train,
    )
    if overwrite:  # the run's own files only: a pipeline keeps its stage.json in the same folder
        shutil.rmtree(out / "candidates", ignore_errors=True)
        for name in ("config.yaml", "summary.json", "pass_rates.jsonl", SECONDS_FILE, *(f"samples.{f}" for f in FORMATS)):
            (out / name).unlink(missing_ok=True)
    (out / "candidates").mkdir(parents=True, exist_ok=True)
    _write_config(cfg, out / "config.yaml")
    from grpokit.rewards import RewardRunner

    with RewardRunner(reward_functions, timeout_s=cfg.output.reward_timeout_s) as runner:
        candidates = _sample_all(cfg, model, tokenizer, rows, encoded, runner, out, log, clock)
    thresholds = dict(zip(score_names(cfg), (spec.min for spec in cfg.rewards)))
    kept, stats = select(candidates, thresholds, cfg.keep)
    summary = _write_outputs(cfg, out, rows, candidates, kept, stats)
    clock.stop()  # this process and its reward workers (grpokit.core.clock), every leg's
    summary["seconds"], summary["cpu_seconds"] = clock.wall(), clock.cpu()
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(
        f"sample: kept {summary['rows']} rows from {summary['candidates']} completions of {summary['prompts']} "
        f"prompts (pass rate {summary['pass_rate_mean']:.1%}, {summary['prompts_with_a_pass']} prompts with "
        f"one passing) -> {summary['output']}"
    )
    if not kept:
        raise NothingKept(_why_nothing_kept(candidates, thresholds, cfg.keep, out))
    return summary


class NothingKept(SampleError):
    """Every completion failed the thresholds or the keep rules: the samples file is empty (exit code 2)."""


def _why_nothing_kept(
    candidates: list[dict], thresholds: dict[str, float | None], keep: KeepConfig, out: Path
) -> str:
    """One line: how many candidates each rule refused, and what to change."""
    reasons = []
    if keep.drop_truncated:
        reasons.append(f"{sum(bool(c.get('truncated')) for c in candidates)} truncated (keep.drop_truncated)")
    if keep.drop_empty:
        reasons.append(
            f"{sum(not _text(c['completion']).strip() for c in candidates)} empty (keep.drop_empty)"
        )
    for name, low in thresholds.items():
        if low is not None:
            below = sum(
                name in c.get("failed", ())
                or (c["scores"].get(name) is not None and c["scores"].get(name) < low)
                for c in candidates
            )
            reasons.append(f"{below} below {name} min {low:g}")
    return (
        f"sample: no completion was kept: of {len(candidates)} completions, {', '.join(reasons) or 'none passed'}; "
        f"the candidates and pass rates are in {out}; lower a reward's min, sample more (sample.n, "
        "sample.max_new_tokens) or use a stronger model"
    )


def _sample_all(cfg, model, tokenizer, rows, encoded, runner, out: Path, log, clock: TrainingClock) -> list[dict]:
    """Every candidate, batch by batch; batches already in out/candidates are read back, not redone. After each
    batch saved, ``clock``'s seconds go to out/SECONDS_FILE."""
    from grpokit.data.prompts import reward_columns
    from grpokit.model.loading import eos_token_ids
    from grpokit.rewards import TrainerState, as_completions
    from grpokit.rollout.engines import SamplingParams, make_generator
    from grpokit.rollout.engines.stop import StopStrings
    from grpokit.run.state import StopOnSignals

    s = cfg.sample
    # vllm: an engine of the model's weights, sized for the longest prompt and completion
    generator = make_generator(s.engine, max_model_len=cfg.data.max_prompt_tokens + s.max_new_tokens, seed=s.seed)
    eos = eos_token_ids(tokenizer, model)
    names = score_names(cfg)
    thresholds = dict(zip(names, (spec.min for spec in cfg.rewards)))
    candidates: list[dict] = []
    done_prompts, started, sampled_here = 0, time.perf_counter(), 0
    stop_strings = StopStrings.of(s.stop, tokenizer)  # sample.stop, or None
    with StopOnSignals() as stop:
        for first in range(0, len(rows), s.batch_prompts):
            path = out / "candidates" / f"{first:08d}.jsonl"
            chunk = list(range(first, min(first + s.batch_prompts, len(rows))))
            if path.is_file():
                candidates += [json.loads(line) for line in path.read_text().splitlines()]
                done_prompts += len(chunk)
                continue
            if stop.signal_name:
                raise Stopped(stop.signal_name, done_prompts, len(rows))
            # every sample.* sampling knob by its name (sample.n is the group size)
            params = SamplingParams.from_settings(
                s, eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id, seed=s.seed + first, stop_strings=stop_strings
            )
            rollout = generator.generate(model, [encoded[i] for i in chunk], params)
            expanded = [rows[i] for i in chunk for _ in range(s.n)]  # (P * n,), prompt-major
            prompts = [row[cfg.data.prompt_column] for row in expanded]
            completion_ids = rollout.completion_token_ids()
            texts = rollout.decode(tokenizer, completion_ids)
            completions = as_completions(prompts, texts)
            columns = reward_columns(expanded, cfg.data.prompt_column)
            columns["completion_ids"] = completion_ids
            columns["trainer_state"] = TrainerState()
            result = runner(prompts, completions, columns)
            problem = result.failure(cfg.output.max_reward_failure_frac, prompts, completions)
            if problem:
                raise SampleError(f"sample: {problem}")
            lengths = rollout.completion_lengths.tolist()
            batch = []
            for k, text in enumerate(texts):
                batch.append(
                    {
                        "prompt_index": chunk[k // s.n],
                        "sample_index": k % s.n,
                        "completion": text,
                        "completion_tokens": int(lengths[k]),
                        "truncated": bool(rollout.truncated[k]),
                        "scores": {name: result.per_function[name][k] for name in names},
                        "failed": [name for name in names if k in result.row_errors.get(name, {})],
                    }
                )
            replace_whole(path, "".join(json.dumps(c) + "\n" for c in batch))  # a batch whole or not at all
            seconds = {"seconds": clock.wall(), "cpu_seconds": clock.cpu()}  # what a resumed run goes on from
            replace_whole(out / SECONDS_FILE, json.dumps(seconds))
            candidates += batch
            done_prompts += len(chunk)
            sampled_here += len(chunk)
            rate = sampled_here / max(time.perf_counter() - started, 1e-9)
            passing = sum(passes(c, thresholds, cfg.keep) for c in candidates)
            eta = (len(rows) - done_prompts) / rate if rate > 0 else 0.0
            log(
                f"sample: {done_prompts}/{len(rows)} prompts  {len(candidates)} completions  "
                f"passing {passing / max(len(candidates), 1):.1%}  {rate:.1f} prompts/s  eta {eta:.0f}s"
            )
    return candidates


class Stopped(Exception):
    def __init__(self, signal_name: str, done: int, total: int):
        super().__init__(f"stopped by {signal_name} after {done}/{total} prompts; continue with --resume")
        self.signal_name = signal_name


def _write_outputs(cfg, out: Path, rows, candidates, kept, stats) -> dict[str, Any]:
    source = cfg.model.name_or_path
    column = cfg.data.prompt_column
    records = []
    for c in kept:
        row = rows[c["prompt_index"]]
        prompt = row[column]
        completion = c["completion"]
        if isinstance(prompt, list):  # conversational prompt-completion, as TRL's SFT reads it
            completion = [{"role": "assistant", "content": completion}]
        rest = {k: v for k, v in row.items() if k not in (column, "prompt", "completion")}
        records.append(
            {
                "prompt": prompt,
                "completion": completion,
                **rest,
                "source_model": source,
                "scores": c["scores"],
                "completion_tokens": c["completion_tokens"],
                "prompt_index": c["prompt_index"],
                "sample_index": c["sample_index"],
                "pass_rate": stats[c["prompt_index"]]["pass_rate"],
            }
        )
    names = score_names(cfg)
    by_prompt: dict[int, list[dict]] = {}
    for c in candidates:
        by_prompt.setdefault(c["prompt_index"], []).append(c)
    rates = []
    for index, row in enumerate(rows):
        group = by_prompt.get(index, [])
        mean_scores = {
            name: _mean([c["scores"][name] for c in group if c["scores"].get(name) is not None])
            for name in names
        }
        rates.append({**row, **stats[index], "mean_scores": mean_scores})
    samples_path = out / f"samples.{cfg.output.format}"
    for stale in FORMATS:
        (out / f"samples.{stale}").unlink(missing_ok=True)
    _write_rows(records, samples_path)
    _write_rows(rates, out / "pass_rates.jsonl")
    n_prompts = len(rows)
    return {
        "output": str(samples_path),
        "pass_rates": str(out / "pass_rates.jsonl"),
        "checkpoint": source,
        "source_model": source,
        "rows": len(records),
        "prompts": n_prompts,
        "candidates": len(candidates),
        "passed": sum(st["passed"] for st in stats.values()),
        "pass_rate_mean": sum(st["pass_rate"] for st in stats.values()) / max(n_prompts, 1),
        "prompts_with_a_pass": sum(st["passed"] > 0 for st in stats.values()),
        "mean_completion_tokens": _mean([r["completion_tokens"] for r in records]),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _write_rows(records: list[dict], path: Path) -> None:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        buffer = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(records), buffer)
        replace_whole(path, buffer.getvalue().to_pybytes())
    else:
        replace_whole(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def _write_config(cfg: SampleConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))


def _changed(old: dict, new: SampleConfig) -> list[str]:
    """Settings of the run in the folder (old, as saved) that differ from new, FREE_TO_CHANGE aside."""
    now = dataclasses.asdict(new)
    diffs = []
    for section, values in now.items():
        before = old.get(section)
        if section == "rewards":
            strip = [{k: v for k, v in r.items() if k != "min"} for r in values]
            was = [{k: v for k, v in r.items() if k != "min"} for r in (before or [])]
            if strip != was:
                diffs.append(f"rewards: {was} -> {strip}")
            continue
        if any(f"{section}.".startswith(free) for free in FREE_TO_CHANGE):
            continue
        for key, value in values.items():
            if (before or {}).get(key) != value:
                diffs.append(f"{section}.{key}: {(before or {}).get(key)!r} -> {value!r}")
    return diffs


def _check_output(out: Path, cfg: SampleConfig, *, resume: bool, overwrite: bool) -> None:
    key = f"--output-dir {out}"
    if resume and overwrite:
        raise SampleError(
            "--resume continues the run in the output folder and --overwrite replaces it: give one."
        )
    if out.exists() and not out.is_dir():
        raise SampleError(f"{key} is a file, not a folder; choose another path.")
    holds = (out / "config.yaml").is_file() or (out / "candidates").is_dir()
    if holds and not resume and not overwrite:
        raise SampleError(
            f"{key} already holds a sampling run: continue it with --resume, replace it with --overwrite, "
            f"or choose another folder (e.g. {out}-2)."
        )
    if resume and holds and (out / "config.yaml").is_file():
        old = yaml.safe_load((out / "config.yaml").read_text()) or {}
        diffs = _changed(old, cfg)
        if diffs:
            raise SampleError(
                f"--resume: settings differ from the run in {out} ({'; '.join(diffs)}); set them back, or start "
                "again with --overwrite."
            )

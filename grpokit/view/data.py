"""What the run explorer shows, read from a run's folder: ``metrics.jsonl``, ``eval.jsonl`` and the saved
rollouts (``grpokit.rollout.record``), turned into one JSON-able dict per run.

Every number the page shows is computed here, with grpokit's own maths (``grpokit.algos``): the page's
JavaScript only formats and colours. Per sampled step and group: the rewards, their mean and std, the
advantages the update used, and the objective worked through (ratios, clipped tokens, KL, the entropy bonus,
the group's loss).
Per token: eleven float32 quantities, packed little-endian and base64-encoded (``TOKEN_FIELDS``), so a token
costs 44 bytes + its id, about 64 bytes of page.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpokit.algos.token_terms import MASK_BITS, aggregate, token_terms
from grpokit.rollout.record import read_rollouts, rollout_files

TOKEN_FIELDS = (
    "logprobs", "old_logprobs", "ref_logprobs", "entropy", "advantages", "ratio", "adv_x_ratio",
    "clip", "kl", "loss", "step_rewards",
)  # fmt: skip
"""The per-token arrays of a step, in this order; NaN where a quantity does not exist (no reference...)."""

ADVANTAGE_FORMULAS = {
    "group_std": "A_i = (r_i - mean) / (std + eps)",
    "group_centre": "A_i = r_i - mean",
    "leave_one_out": "A_i = G/(G-1) (r_i - mean)",
}
"""Estimators whose advantage the page recomputes from the group's rewards alone (others: shown as saved)."""


class RunReadError(ValueError):
    """A folder that is not a run, or a run file that cannot be read: the message names it."""


def read_run(run_dir: str | Path, *, max_groups: int | None = None) -> dict[str, Any]:
    """The page's data for one run folder; ``max_groups`` caps the groups kept per sampled step."""
    folder = Path(run_dir)
    metrics_path = folder / "metrics.jsonl"
    if not metrics_path.is_file():
        raise RunReadError(
            f"{folder}: no metrics.jsonl, so not a grpokit run folder (give the train.output_dir of a run)"
        )
    warnings: list[str] = []  # what was left out; the page and the command show them, nothing is refused
    metrics = _read_jsonl(metrics_path, warnings)
    evals = _read_jsonl(folder / "eval.jsonl", warnings) if (folder / "eval.jsonl").is_file() else []
    vocab: dict[int, str] = {}
    steps = []
    for path in rollout_files(folder):
        try:
            steps.append(step_view(path, vocab, max_groups=max_groups))
        except (ValueError, OSError, KeyError) as e:  # a damaged file (pyarrow's errors are ValueErrors)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            warnings.append(f"{path}: cannot be read ({first}); its step is left out")
    return {
        "name": folder.resolve().name,
        "path": str(folder.resolve()),
        "metrics": _columns(metrics),
        "eval": _columns(evals),
        "steps": steps,
        "vocab": {str(k): v for k, v in vocab.items()},
        "history": prompt_history(folder, warnings),
        "warnings": warnings,
    }


def prompt_history(folder: Path, warnings: list[str]) -> dict[str, Any] | None:
    """The per-prompt history of the run's newest checkpoint (data.selection, grpokit.rollout.selection): its step
    and every training row visited or skipped, with its numbers; None without one (selection off, no checkpoint)."""
    from grpokit.model.checkpoint import STATE_FILE, list_checkpoints
    from grpokit.rollout.selection import PromptHistory

    saved = list_checkpoints(folder / "checkpoints")
    if not saved:
        return None
    try:
        state = torch.load(saved[-1] / STATE_FILE, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # noqa: BLE001 - a damaged checkpoint: said, the rest of the page stands
        warnings.append(f"{saved[-1] / STATE_FILE}: cannot be read ({type(e).__name__}); no prompt history shown")
        return None
    selection = (state.get("stream") or {}).get("selection")
    if selection is None:
        return None
    history = PromptHistory(selection["history"]["n"])
    history.load_state(selection["history"])
    return {
        "step": int(state["step"]), "rows": history.rows(), "n": history.n, "counts": history.counts(),
        "p_solved": selection["p_solved"], "p_failed": selection["p_failed"],
    }  # fmt: skip


def _read_jsonl(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """The records of a metrics file; a line that does not parse (or is not an object with an integer
    step) is left out with a warning naming its line, so one bad line does not hide the run."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            warnings.append(f"{path} line {number} does not parse ({e.msg}); left out")
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            warnings.append(f"{path} line {number} is not a step's record (no integer \"step\"); left out")
            continue
        records.append(record)
    return records


def step_view(path: Path, vocab: dict[int, str], *, max_groups: int | None = None) -> dict[str, Any]:
    """One saved step: rows (texts, rewards, advantages), groups (stats and the worked objective) and the
    packed per-token arrays. Adds the step's token texts to ``vocab``."""
    table, meta = read_rollouts(path)
    G = int(meta["group_size"])
    if max_groups is not None:
        table = table.slice(0, max_groups * G)
    cols = table.to_pydict()
    N = table.num_rows
    # tokens per row: the model's, and in multi-turn rows the tools' too (loss_mask 0 there); "length"
    # counts the model's only
    widths = [len(ids) for ids in cols["token_ids"]]
    T = max(widths, default=1)
    mask = torch.zeros(N, T)  # (N, T) the row's saved tokens

    def padded(key: str, default: float = float("nan")) -> torch.Tensor:
        out = torch.full((N, T), default)
        for i, values in enumerate(cols[key]):
            if values is not None:
                out[i, : len(values)] = torch.tensor([math.nan if v is None else v for v in values])
        return out  # (N, T)

    for i, n in enumerate(widths):
        mask[i, :n] = 1
    logp, old, adv = padded("logprobs", 0.0), padded("old_logprobs", 0.0), padded("advantages", 0.0)
    has_ref = any(v is not None for v in cols["ref_logprobs"])
    ref = padded("ref_logprobs", 0.0) if has_ref else None
    loss_mask = padded("loss_mask", 0.0) * mask  # (N, T)
    kw = meta["loss_kwargs"]
    inputs = _mask_inputs(kw, meta["algo"], cols, padded)
    terms = token_terms(logp, old, adv, mask, ref_logprobs=ref, **inputs)
    alpha = _bonus_coefs(cols, meta["algo"], N)  # (N,) the entropy bonus's alpha per row, or None
    # the tokens the bonus acts on: the trained ones less what top_entropy_quantile's mask left out
    bonus_mask = loss_mask.bool() & inputs.get("entropy_mask", True)  # (N, T)
    entropy = padded("entropy")  # (N, T)
    bonus = None if alpha is None else torch.where(bonus_mask, alpha[:, None] * entropy, 0.0)  # (N, T)
    per_token = {
        "logprobs": logp, "old_logprobs": old,
        "ref_logprobs": ref if ref is not None else torch.full((N, T), math.nan),
        "entropy": entropy, "advantages": adv, "ratio": terms["ratio"],
        "adv_x_ratio": adv * terms["ratio"], "clip": padded("clip", 0.0), "kl": terms["kl"],
        "loss": terms["loss"], "step_rewards": padded("step_rewards"), "pg": terms["pg"],
        "bonus": bonus, "bonus_entropy": torch.where(bonus_mask, entropy, 0.0), "bonus_mask": bonus_mask.float(),
        "bonus_coef": alpha,
    }  # fmt: skip
    for ids, texts in zip(cols["token_ids"], cols["tokens"]):
        vocab.update(zip(ids, texts))
    reward_names = meta["reward_names"]
    truth = cols.get("ground_truth") or [None] * N  # files written before it was recorded have none
    rows = {
        "group": cols["group"], "index": cols["index"], "prompt": cols["prompt"], "ground_truth": truth,
        "completion": cols["completion"], "reward": cols["reward"], "advantage": cols["advantage"],
        "length": cols["length"], "truncated": cols["truncated"],
        "rewards": {name: cols[f"reward/{name}"] for name in reward_names},
    }  # fmt: skip
    groups = [_group_view(g, G, cols, per_token, loss_mask, meta, reward_names) for g in range(N // G)]
    return {
        "step": int(meta["step"]),
        "group_size": G,
        "algo": meta["algo"],
        # the run had an entropy bonus whose alpha this file does not hold (written before it was recorded, adaptive)
        "bonus_unknown": alpha is None and _bonus_on(meta["algo"]),
        "reward_names": reward_names,
        "ground_truth_column": meta.get("ground_truth_column"),
        "rows": rows,
        "groups": groups,
        "totals": _step_totals(per_token, loss_mask, kw, cols["reward"]),
        "tokens": _pack(cols["token_ids"], widths, per_token, loss_mask),
    }


def _mask_inputs(kw: dict[str, Any], algo: dict[str, Any], cols: dict[str, list], padded) -> dict[str, Any]:
    """The loss's keywords with what its masks were chosen from, read back from the saved columns (record.py:
    "masks", "sample_logprobs"), so the page's per-token terms are those the loss trained on. A file written
    before those columns existed shows the terms without the masks."""
    kw = dict(kw)
    saved = "masks" in cols
    bits = padded("masks", 0.0).long() if saved else None  # (N, T)
    if kw.get("off_policy_mask") is not None:
        if "sample_logprobs" in cols and any(v is not None for v in cols["sample_logprobs"]):
            kw["sample_logprobs"] = padded("sample_logprobs")
        else:
            kw["off_policy_mask"] = None
    if kw.get("cov_penalty", "none") != "none":
        if saved:
            kw["cov_mask"] = (bits & (MASK_BITS["clip_cov"] | MASK_BITS["kl_cov"])) != 0
        else:
            kw["cov_penalty"] = "none"
    if saved and float(algo.get("top_entropy_quantile", 1.0)) < 1:
        kw["entropy_mask"] = (bits & MASK_BITS["entropy"]) == 0
    return kw


def _bonus_on(algo: dict[str, Any]) -> bool:
    """The run's loss had the entropy bonus (algo.entropy_coef != 0 or algo.adaptive_entropy)."""
    return float(algo.get("entropy_coef") or 0.0) != 0 or bool(algo.get("adaptive_entropy"))


def _bonus_coefs(cols: dict[str, list], algo: dict[str, Any], n: int) -> torch.Tensor | None:
    """(n,) the entropy bonus's alpha each row was trained with (record.py's "entropy_coef"), None without the
    bonus. A file written before that column gets algo.entropy_coef when it was constant; adaptive: None."""
    saved = cols.get("entropy_coef")
    if saved is not None:
        if all(a is None for a in saved):
            return None
        return torch.tensor([0.0 if a is None else a for a in saved])  # (n,)
    if _bonus_on(algo) and not algo.get("adaptive_entropy"):
        return torch.full((n,), float(algo["entropy_coef"]))
    return None


def _group_view(g, G, cols, per_token, loss_mask, meta, reward_names) -> dict[str, Any]:
    """A group's statistics and its objective worked through, each value computed from the saved data."""
    algo, kw = meta["algo"], meta["loss_kwargs"]
    sl = slice(g * G, (g + 1) * G)
    r = torch.tensor(cols["reward"][sl], dtype=torch.float64)  # (G,)
    ddof = int(algo.get("std_ddof", 1))
    mean = float(r.mean())
    std = float(r.std(correction=ddof)) if G > ddof else 0.0
    m = loss_mask[sl]  # (G, T)
    tokens = m.sum(1).clamp(min=1)  # (G,)

    def token_mean(t: torch.Tensor) -> list[float]:
        return (torch.where(m.bool(), t[sl], 0).sum(1) / tokens).tolist()  # (G,)

    estimator = algo.get("advantage")
    recomputed = None
    if estimator in ADVANTAGE_FORMULAS and algo.get("kl_reward_coef", 0) == 0:
        centred = (r - r.mean()) if float(r.max() - r.min()) != 0 else torch.zeros_like(r)
        if estimator == "group_std":
            recomputed = (centred / (std + float(algo.get("std_eps", 1e-6)))).tolist()
        elif estimator == "group_centre":
            recomputed = centred.tolist()
        else:
            recomputed = (centred * G / (G - 1)).tolist()
    loss = None
    if kw["agg"] != "seq-sum-norm" or kw.get("norm_len"):
        loss = float(aggregate(per_token["loss"][sl], m, **kw))
    bonus = _bonus_terms(per_token, sl)
    if loss is not None and bonus["bonus"] is not None:
        loss -= bonus["bonus"]  # the loss the update minimised: L = aggregate - alpha H-bar
    nones = sum(any(cols[f"reward/{n}"][i] is None for n in reward_names) for i in range(sl.start, sl.stop))
    return {
        "group": g,
        "prompt": cols["prompt"][sl.start],
        "ground_truth": (cols.get("ground_truth") or [None] * (sl.stop))[sl.start],  # the group's row's
        "mean": mean,
        "std": std,
        "std_ddof": ddof,
        "flat": bool(float(r.max() - r.min()) == 0),
        "truncated": int(sum(cols["truncated"][sl])),
        "failed": int(nones),
        "advantage_formula": ADVANTAGE_FORMULAS.get(estimator, f"estimator {estimator} (saved values)"),
        "advantages_recomputed": recomputed,
        "ratio_mean": token_mean(per_token["ratio"]),
        "ratio_min": [float(x) for x in torch.where(m.bool(), per_token["ratio"][sl], math.inf).amin(1)],
        "ratio_max": [float(x) for x in torch.where(m.bool(), per_token["ratio"][sl], -math.inf).amax(1)],
        "clipped": (per_token["clip"][sl].abs() * m).sum(1).int().tolist(),
        "tokens": m.sum(1).int().tolist(),
        "pg_mean": token_mean(per_token["pg"]),
        "kl_mean": token_mean(per_token["kl"]) if not torch.isnan(per_token["kl"][sl]).all() else None,
        "loss_mean": token_mean(per_token["loss"]),
        **bonus,
        "loss": loss,
    }


def _bonus_terms(per_token: dict[str, torch.Tensor | None], rows: slice) -> dict[str, Any]:
    """The entropy bonus of ``rows``, as the loss adds it: bonus = sum alpha_i m' H / sum m' over the tokens m' it
    acts on (a token mean, whatever algo.agg), with bonus_entropy the token mean of H and bonus_coef the rows'
    distinct alphas; each None without the bonus (bonus 0 when no token is trained)."""
    if per_token["bonus"] is None:
        return {"bonus": None, "bonus_entropy": None, "bonus_coef": None}
    n = float(per_token["bonus_mask"][rows].sum())
    coefs = sorted({float(a) for a in per_token["bonus_coef"][rows]})
    if n == 0:  # no token to act on: the loss gains nothing (the update's normaliser is at least 1)
        return {"bonus": 0.0, "bonus_entropy": None, "bonus_coef": coefs}
    return {
        "bonus": float(per_token["bonus"][rows].sum()) / n,
        "bonus_entropy": float(per_token["bonus_entropy"][rows].sum()) / n,
        "bonus_coef": coefs,
    }


def _step_totals(per_token, loss_mask, kw, rewards) -> dict[str, float | None]:
    """The step's numbers recomputed from the saved tokens, to set beside metrics.jsonl's: the loss (every
    group's loss averaged, less the entropy bonus: equal to the logged loss when mini-batches hold whole,
    equal-sized groups, and with the bonus one mini-batch a step, or mini-batches of alike token counts: the
    bonus is a token mean per mini-batch), the entropy the bonus acted on (its token mean), the clip fraction
    and KL over loss tokens, and the mean total reward."""
    m = loss_mask.bool()
    n = max(int(m.sum()), 1)
    loss = None
    if kw["agg"] != "seq-sum-norm" or kw.get("norm_len"):
        loss = float(aggregate(per_token["loss"], loss_mask, **kw))
    bonus = _bonus_terms(per_token, slice(None))
    if loss is not None and bonus["bonus"] is not None:
        loss -= bonus["bonus"]
    kl = per_token["kl"][m]
    return {
        "loss": loss,
        "entropy_bonus": bonus["bonus_entropy"],
        "clip_frac": float(per_token["clip"][m].abs().sum()) / n,
        "kl": None if torch.isnan(kl).all() else float(kl.sum()) / n,
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
    }


def _pack(token_ids, lengths, per_token, loss_mask) -> dict[str, Any]:
    """The step's tokens, rows concatenated: ids (int32) and each TOKEN_FIELDS array and the loss mask
    (float32), base64 of their little-endian bytes; ``offsets`` (N+1,) where each row starts."""
    offsets = np.cumsum([0, *lengths]).tolist()
    ids = np.concatenate([np.asarray(row, dtype="<i4") for row in token_ids]) if token_ids else np.zeros(0, "<i4")

    def flat(t: torch.Tensor) -> str:
        values = np.concatenate([t[i, :n].numpy() for i, n in enumerate(lengths)]).astype("<f4")
        return base64.b64encode(values.tobytes()).decode()

    fields = {key: flat(per_token[key]) for key in TOKEN_FIELDS}
    fields["loss_mask"] = flat(loss_mask)
    return {"offsets": offsets, "ids": base64.b64encode(ids.tobytes()).decode(), "fields": fields}


def _columns(records: list[dict[str, Any]]) -> dict[str, Any]:
    """metrics.jsonl lines -> {"step": [...], "cols": {key: [...]}}; a step logged twice (resumed run) keeps
    its last line; numbers rounded to 6 significant digits (the page's precision), null for NaN/missing."""
    by_step: dict[int, dict[str, Any]] = {}
    for record in records:
        if isinstance(record.get("step"), int):
            by_step[record["step"]] = record
    steps = sorted(by_step)
    keys = sorted({k for r in by_step.values() for k, v in r.items() if k != "step" and _is_number(v)})
    cols = {k: [_round(by_step[s].get(k)) for s in steps] for k in keys}
    return {"step": steps, "cols": cols}


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) or v is None


def _round(v: Any) -> float | None:
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        return None
    return float(f"{v:.6g}")

"""What the trainer keeps of a sampled step (every ``train.samples_every`` steps) for ``grpokit view``:
every completion of the step's groups, its rewards and advantage, and per token the numbers the loss
used. The update fills a ``TokenRecorder`` as its micro-batches go by; ``write_rollouts`` then writes

    OUTPUT/rollouts/step_000010.parquet     one row per completion, prompt-major (group g = rows g*G..g*G+G-1)

  column             type                 what
  step, group, index int32                the step (1 = after the first update), the group, the row in it
  prompt, completion string               the prompt as the dataset gives it (JSON for message lists), the text
  ground_truth       string, null         the row's ground truth: the accuracy reward's column (its ``columns``),
                                          else the first of GROUND_TRUTH_COLUMNS the rows have (JSON when not
                                          a string); null where the row has none
  reward             float64              the weighted total the advantages came from
  reward/<name>      float64, null        each reward function's value (null: not applicable or failed)
  advantage          float32              the completion's advantage (per-token estimators: the token mean)
  entropy_coef       float32, null        alpha of the entropy bonus the row was trained with (algo.entropy_coef,
                                          adaptive: its optimizer step's); null without the bonus
  length, truncated  int32, bool          generated tokens (EOS included); cut at rollout.max_new_tokens
  token_ids, tokens  list<int32>, list<string>   each token and its text decoded alone
  logprobs           list<float32>        log pi_theta(token) in the update's forward pass that trained the row
                                          (the last one when optim.epochs > 1)
  old_logprobs       list<float32>        the ratio's denominator as the loss saw it (= logprobs with one pass)
  ref_logprobs       list<float32>, null  the reference's, when the algorithm has a reference
  entropy            list<float32>        the policy's entropy at each position (same pass)
  advantages         list<float32>        per token (a per-sequence advantage repeated)
  loss_mask          list<int8>           1 where the loss trains (0: DAPO-masked truncation, tool tokens)
  clip               list<int8>           -1 / +1 clipped below / above, 0 not (grpokit.algos.token_terms)
  masks              list<int8>           the loss's masks that acted on the token, bits of token_terms.MASK_BITS
                                          (1 trust region, 2 off-policy, 4 entropy, 8 Clip-Cov out; 16 KL-Cov)
  sample_logprobs    list<float32>, null  the sampler's log-probs, kept when the off-policy mask reads them
  step_rewards       list<float32>, null  process rewards: the score of the step each token belongs to
  extra              string               the reward functions' log_extra values of the row, as JSON

The file's metadata key ``grpokit`` holds JSON: step, group_size, reward_names, ground_truth_column (the
column the ground truth came from, null when none), the algorithm's loss settings
(``AlgoSettings.loss_kwargs()``) and all its settings (``AlgoSettings.flat()``). Token-level columns hold only the
generated tokens (no padding). Written with zstd, disk use per sampled step is at most about 40 bytes per
generated token (float32 numbers barely compress) plus about 60 bytes and the texts per completion: 11 kB
for a demo step (128 completions, 590 tokens); by that bound a step of 512 completions of 1000 tokens takes about 20 MB
(tests/unit/rollout/test_record.py and tests/unit/view/test_page.py pin the bound). Under torchrun rank 0 saves its own share of the groups. ``sample_rows`` gives the same rows as plain dicts
(TRL's ``log_completions``: every completion with its advantage) for ``samples/`` and the W&B table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpokit.algos.token_terms import token_terms

if TYPE_CHECKING:  # pyarrow is imported where files are written or read: not on `import grpokit.trainers.grpo`
    import pyarrow as pa

ROLLOUTS_DIR = "rollouts"
GROUND_TRUTH_COLUMNS = ("answer", "solution", "ground_truth", "reference", "target", "label")
"""Where a row's ground truth is looked for when the accuracy reward names no column (TRL's datasets:
"solution"; grpokit's math_accuracy: "answer")."""


class TokenRecorder:
    """Per-token numbers of a batch of N rows (width Lc) as the loss saw them; rows never reached stay NaN.

    ``add`` is called by the update once per micro-batch, after the loss: ``rows`` (n,) are the batch rows
    of the micro-batch, the tensors (n, L) with L <= Lc (the micro-batch's own trimmed width)."""

    FIELDS = ("logprobs", "old_logprobs", "ref_logprobs", "entropy", "advantages", "loss_mask", "sample_logprobs")
    MASKS = ("entropy_mask", "cov_mask")  # the tokens the loss's masks chose (grpokit.train.update.chosen_tokens)

    def __init__(self, n_rows: int, width: int) -> None:
        self.values = {k: torch.full((n_rows, width), float("nan")) for k in self.FIELDS}  # each (N, Lc)
        self.has_ref = False
        self.masks: dict[str, torch.Tensor] = {}  # each (N, Lc) bool, only those the loss was given
        self.entropy_coef = torch.full((n_rows,), float("nan"))  # (N,) the bonus's alpha per row; NaN: no bonus

    def add(
        self,
        rows: torch.Tensor,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        entropy: torch.Tensor | None = None,
        sample_logprobs: torch.Tensor | None = None,
        entropy_coef: float | torch.Tensor | None = None,
        **masks: torch.Tensor,
    ) -> None:
        """Store micro-batch ``rows`` (n,): (n, L) tensors; advantages (n,) or (n, L); ``entropy_coef``: the entropy
        bonus's alpha in the loss (None: no bonus); ``masks``: the (n, L) bool entropy_mask / cov_mask the loss was
        given."""
        rows = rows.cpu()
        if entropy_coef is not None:
            self.entropy_coef[rows] = float(entropy_coef)
        width = logprobs.shape[1]
        adv = advantages.detach().float().cpu()
        adv = adv.unsqueeze(-1).expand(-1, width) if adv.dim() == 1 else adv  # (n, L)
        given = {
            "logprobs": logprobs,
            "old_logprobs": old_logprobs,
            "ref_logprobs": ref_logprobs,
            "entropy": entropy,
            "advantages": adv,
            "loss_mask": loss_mask,
            "sample_logprobs": sample_logprobs,
        }
        for key, value in given.items():
            if value is not None:
                self.values[key][rows, :width] = value.detach().float().cpu()
        self.has_ref = self.has_ref or ref_logprobs is not None
        for key, value in masks.items():
            if key not in self.MASKS:
                raise ValueError(f"TokenRecorder.add: unknown mask {key!r}; known: {', '.join(self.MASKS)}")
            if key not in self.masks:
                self.masks[key] = torch.zeros(self.values["logprobs"].shape, dtype=torch.bool)
            self.masks[key][rows, :width] = value.detach().bool().cpu()

    def mask_inputs(self, loss_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The masks' inputs the loss was given, as keywords of token_terms: the sampler's log-probs when the
        off-policy mask is on, and the recorded entropy_mask / cov_mask."""
        out: dict[str, torch.Tensor] = dict(self.masks)
        if loss_kwargs.get("off_policy_mask") is not None:
            out["sample_logprobs"] = self.values["sample_logprobs"]  # NaN (not scored): kept, as in the loss
        return out


def write_rollouts(
    folder: str | Path,
    step: int,
    batch: Any,
    recorder: TokenRecorder,
    *,
    advantages: torch.Tensor,
    group_size: int,
    prompt_column: str,
    tokenizer: Any,
    algo: Any,
    ground_truth_column: str | None = None,
) -> Path:
    """Write ``folder/rollouts/step_{step:06d}.parquet`` (columns in the module docstring) from the step's
    ScoredBatch ``batch``, the ``recorder`` the update filled, the step's ``advantages`` (N,) or (N, Lc) and
    the run's AlgoSettings ``algo``; ``ground_truth_column``: the column holding each row's ground truth (the
    accuracy reward's), None to look for one of GROUND_TRUTH_COLUMNS."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    loss_kwargs = algo.loss_kwargs()
    r = batch.rollout
    lengths = r.attention_mask.sum(1).long()  # (N,) tokens after the prompt (multi-turn: the tools' too)
    v = recorder.values
    ref = v["ref_logprobs"] if recorder.has_ref else None
    mask_inputs = recorder.mask_inputs(loss_kwargs)  # what the loss's masks were chosen from
    terms = token_terms(
        v["logprobs"].nan_to_num(), v["old_logprobs"].nan_to_num(), v["advantages"].nan_to_num(),
        r.completion_mask, ref_logprobs=None if ref is None else ref.nan_to_num(), **loss_kwargs, **mask_inputs,
    )  # each (N, Lc)
    ids = r.completion_ids.long()  # (N, Lc)
    vocab = _token_texts(tokenizer, ids[r.attention_mask.bool()].unique().tolist())
    adv = advantages.detach().float().cpu()
    gen = r.completion_mask.float()  # (N, Lc)
    seq_adv = adv if adv.dim() == 1 else (adv * gen).sum(1) / gen.sum(1).clamp(min=1)  # (N,)
    N = ids.shape[0]

    def cut(t: torch.Tensor, dtype: str) -> list:
        return [t[i, : lengths[i]].numpy().astype(dtype).tolist() for i in range(N)]

    columns: dict[str, Any] = {
        "step": pa.array([step] * N, pa.int32()),
        "group": pa.array([i // group_size for i in range(N)], pa.int32()),
        "index": pa.array([i % group_size for i in range(N)], pa.int32()),
        "prompt": [_text(row[prompt_column]) for row in batch.rows],
        "completion": list(batch.texts),
    }
    truth = find_ground_truth_column(batch.rows, prompt_column, ground_truth_column)
    columns["ground_truth"] = pa.array(
        [None if truth is None or row.get(truth) is None else _text(row[truth]) for row in batch.rows], pa.string()
    )
    columns["reward"] = pa.array(batch.rewards.double().tolist(), pa.float64())
    for name, values in batch.per_function.items():
        columns[f"reward/{name}"] = pa.array([None if x is None else float(x) for x in values], pa.float64())
    alpha = recorder.entropy_coef.tolist()  # (N,) NaN where no bonus
    columns.update(
        advantage=pa.array(seq_adv.tolist(), pa.float32()),
        entropy_coef=pa.array([None if a != a else a for a in alpha], pa.float32()),
        length=pa.array(r.completion_mask.sum(1).tolist(), pa.int32()),  # the model's tokens
        truncated=pa.array(r.truncated.bool().tolist(), pa.bool_()),
        token_ids=pa.array(cut(ids, "int32"), pa.list_(pa.int32())),
        tokens=pa.array([[vocab[t] for t in row] for row in cut(ids, "int64")], pa.list_(pa.string())),
    )
    for key in ("logprobs", "old_logprobs", "entropy", "advantages"):
        columns[key] = pa.array(cut(v[key], "float32"), pa.list_(pa.float32()))
    columns["ref_logprobs"] = pa.array(
        cut(ref, "float32") if ref is not None else [None] * N, pa.list_(pa.float32())
    )
    columns["loss_mask"] = pa.array(cut(v["loss_mask"].nan_to_num(), "int8"), pa.list_(pa.int8()))
    columns["clip"] = pa.array(cut(terms["clip"], "int8"), pa.list_(pa.int8()))
    columns["masks"] = pa.array(cut(terms["masks"], "int8"), pa.list_(pa.int8()))
    columns["sample_logprobs"] = pa.array(
        cut(v["sample_logprobs"], "float32") if "sample_logprobs" in mask_inputs else [None] * N,
        pa.list_(pa.float32()),
    )
    columns["step_rewards"] = pa.array(
        _step_reward_tokens(batch.step_rewards, lengths.tolist()), pa.list_(pa.float32())
    )
    columns["extra"] = [
        json.dumps({k: vals[i] for k, vals in batch.extra.items()}, default=str) for i in range(N)
    ]
    meta = {
        "step": step,
        "group_size": group_size,
        "reward_names": list(batch.per_function),
        "ground_truth_column": truth,
        "loss_kwargs": loss_kwargs,
        "algo": algo.flat(),
    }
    table = pa.table(columns).replace_schema_metadata({"grpokit": json.dumps(meta)})
    out = Path(folder) / ROLLOUTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"step_{step:06d}.parquet"
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(path)  # a crash mid-write leaves no half file under the real name
    return path


def read_rollouts(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """(table, metadata) of one file written by ``write_rollouts``. Raises ValueError naming the file when
    it is not one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise ValueError(f"{path}: not a readable rollouts file ({e}); delete it or re-run the step") from e
    raw = (table.schema.metadata or {}).get(b"grpokit")
    if raw is None:
        raise ValueError(f"{path}: a parquet file without grpokit's metadata: not written by write_rollouts")
    return table, json.loads(raw)


def rollout_files(run_dir: str | Path) -> list[Path]:
    """The run's saved steps, in step order."""
    return sorted((Path(run_dir) / ROLLOUTS_DIR).glob("step_*.parquet"))


def sample_rows(batch: Any, advantages: torch.Tensor, group_size: int, prompt_column: str) -> list[dict]:
    """Every completion of ``batch`` with its rewards and advantage, as TRL's ``log_completions`` writes
    them (prompt, completion, each reward, advantage), plus group, length and log_extra columns."""
    adv = advantages.detach().float().cpu()
    if adv.dim() == 2:
        gen = batch.rollout.completion_mask.float()  # (N, Lc)
        adv = (adv * gen).sum(1) / gen.sum(1).clamp(min=1)  # (N,) the token mean
    lengths = batch.rollout.completion_mask.sum(1).tolist()
    return [
        {
            "group": i // group_size,
            "prompt": _text(batch.rows[i][prompt_column]),
            "completion": batch.texts[i],
            "reward": float(batch.rewards[i]),
            **{f"reward/{k}": v[i] for k, v in batch.per_function.items()},
            "advantage": float(adv[i]),
            "length": int(lengths[i]),
            **{k: v[i] for k, v in batch.extra.items()},
        }
        for i in range(len(batch.texts))
    ]


def find_ground_truth_column(rows: list, prompt_column: str, named: str | None = None) -> str | None:
    """The column of ``rows`` holding the ground truth: ``named`` (the accuracy reward's column) when a row has
    it, else the first of GROUND_TRUTH_COLUMNS some row has, else None (the prompt column never)."""
    present = {key for row in rows for key in row if key != prompt_column}
    for name in (named, *GROUND_TRUTH_COLUMNS):
        if name is not None and name in present:
            return name
    return None


def _text(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, default=str)


def _token_texts(tokenizer: Any, ids: list[int]) -> dict[int, str]:
    """{id: its text decoded alone} (one batch_decode for the step's distinct ids)."""
    if tokenizer is None:
        return {i: f"<{i}>" for i in ids}
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    return dict(zip(ids, texts))


def _step_reward_tokens(steps: list | None, lengths: list[int]) -> list[list[float] | None]:
    """Per token, the score of the process-reward step it belongs to: steps [(t_end, score)] with t_end the
    0-based index of the step's last token, ascending (grpokit.algos.process); tokens after the last step
    get NaN."""
    if steps is None:
        return [None] * len(lengths)
    out = []
    for row, n in zip(steps, lengths):
        values, start = [float("nan")] * n, 0
        for t_end, score in row:
            for t in range(start, min(int(t_end) + 1, n)):
                values[t] = float(score)
            start = max(start, int(t_end) + 1)
        out.append(values)
    return out

"""Prompt datasets from local files, local folders in hub layout and the Hugging Face hub.
(Over 500 lines: every file format's reader with the checks and messages they share: a row's problem named by
its file, row and column.)

A dataset is a list of rows (dicts). Each row has a prompt column holding either a non-empty
string or a list of chat messages ``[{"role": "user", "content": "..."}]`` (TRL's
"conversational" format). Every other column is kept as is and reaches reward functions by
name, e.g. an ``answer`` column for a math verifier.

Formats, picked by extension or by folder contents:

    .jsonl / .ndjson     one JSON object per line (blank lines skipped)
    .json                a list of objects; ``{"data": [...]}``; ``{split: [...], ...}``;
                         ``{column: [values], ...}``; or JSON Lines saved as .json
    .csv / .tsv          header row, then one row per prompt; every value is a string
    .parquet / .pq       read with pyarrow
    .arrow               one Arrow IPC file (stream or file format)
    folder               written by ``datasets``' ``save_to_disk``: a Dataset (state.json plus
                         data-XXXXX-of-NNNNN.arrow) or a DatasetDict (dataset_dict.json plus one
                         such folder per split)

save_to_disk folders are read with pyarrow whether or not ``datasets`` is installed: the shards
are plain Arrow IPC streams listed in state.json, and one code path gives the same rows either
way (``save_to_disk`` flattens any ``select``/``shuffle`` indices before writing).

Everything else goes through ``datasets.load_dataset`` (``pip install 'grpokit[datasets]'``):

    openai/gsm8k         a hub id (``config`` picks the subset, e.g. "main"; ``split`` the split)
    folder in hub layout a folder of data files that is not a save_to_disk folder, e.g.
                         data/train-00000-of-00001.parquet + data/test-....parquet, or
                         train.jsonl + test.jsonl (split names come from the file names)
    data/train-*.jsonl   a glob: the matching files, read by the builder their extension names

Why the single-file readers above stay rather than going through ``load_dataset`` too: they are
needed, not faster. ``datasets`` is an optional extra and the core install must read a JSONL file;
and they name the line of a malformed JSON Lines row and the byte of a non-UTF-8 one, where
``load_dataset`` reports an Arrow parse error without either. Speed does not decide it (7,473
GSM8K-sized JSONL rows on 2 CPU cores: 0.06 s here; 0.2 s through ``load_dataset`` the first time,
0.015 s from its Arrow cache, plus 1.7 s to import ``datasets``).

Errors are ``DataError`` and name the file, the row (``line N`` counted from 1 for JSON Lines,
``row index N`` counted from 0 otherwise) and what to change.
"""

from __future__ import annotations

import csv
import difflib
import glob
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grpokit.config.schema import ConfigError, DataConfig
from grpokit.core import hub

Prompt = str | list[dict[str, Any]]

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")

SUPPORTED_FORMATS = (
    "JSON Lines (.jsonl, .ndjson), JSON (.json), CSV (.csv, .tsv), Parquet (.parquet, .pq), "
    "Arrow (.arrow), or a folder written by datasets' save_to_disk"
)

# Column names that often hold the prompt, offered when `prompt_column` is missing and difflib
# finds nothing close ("prompt" and "question" share too few letters).
_PROMPT_LIKE_COLUMNS = ("prompt", "messages", "question", "problem", "query", "instruction", "input")

SOURCE_KINDS: dict[str, str] = {
    "reasoning_gym": "grpokit.integrations.reasoning_gym:load_rows",
    "verifiers": "grpokit.integrations.verifiers:load_rows",
}
"""Data of other ecosystems, named 'KIND:target' in data.train / data.eval (reasoning_gym:basic_arithmetic?size=500,
verifiers:my_env.py: a verifiers environment's dataset):
KIND's loader, a 'module:function' taking (target, the whole name, prompt_column, limit) and returning rows. The
loaders sit above this layer (grpokit.integrations), so they are named here, as entry points are, and imported
only when a run names such data."""

# (where, row): `where` is the human-readable position used in error messages.
_Located = list[tuple[str, Any]]


class DataError(ValueError):
    """A dataset that cannot be used as is; the message names the file, the row and the fix."""


def load_prompts(
    path: str | Path,
    *,
    prompt_column: str | None = "prompt",
    split: str | None = None,
    limit: int | None = None,
    config: str | None = None,
    default_split: str = "train",
) -> list[dict[str, Any]]:
    """Load and check a prompt dataset.

    Args:
        path: a data file, a ``save_to_disk`` folder, a folder in hub layout, a glob of data
            files or a hub id (formats in the module docstring).
        prompt_column: the column holding each row's prompt (string or chat messages); None: rows are
            only checked to be objects (SFT rows, whose columns grpokit.data.sft checks).
        split: the split to read from a source with splits: a DatasetDict folder, a
            ``{split: [...]}`` JSON file, a hub-layout folder or a hub dataset (default
            ``default_split``, or the only split there is). A single-table source has no
            splits and accepts only None or "train", the name ``datasets`` gives a lone file.
        limit: keep only the first ``limit`` rows; only those rows are checked.
        config: the configuration (subset) of a hub dataset, e.g. "main" for openai/gsm8k;
            only for sources read through ``datasets.load_dataset``.
        default_split: the split taken when ``split`` is None and there are several
            (evaluation passes "test").

    Returns:
        The rows as dicts, every column kept, in file order.

    Example: a JSONL file with the two lines
        {"prompt": "What is 2 + 2?", "answer": "4"}
        {"prompt": [{"role": "user", "content": "What is 3 + 3?"}], "answer": "6"}
    loads as two dicts with keys "prompt" and "answer".
    """
    source = Path(path)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    kind, sep, target = str(path).partition(":")
    if sep and kind in SOURCE_KINDS:  # another ecosystem's data (SOURCE_KINDS)
        import importlib

        module, _, loader = SOURCE_KINDS[kind].partition(":")
        rows = getattr(importlib.import_module(module), loader)(target, str(path), prompt_column, limit)
        _check_rows(_located(rows), prompt_column, str(path))
        return rows
    through_datasets = _needs_load_dataset(str(path), source)
    if not source.exists() and not through_datasets:
        raise DataError(f"{source}: no such file or folder (looked in {source.resolve()}); check the path.")
    if source.exists() and not (source.is_file() or source.is_dir()):  # a FIFO or a device blocks or never ends
        raise DataError(f"{source}: not a regular file or folder (a pipe or a device?); save the rows to a file.")
    if config is not None and not through_datasets:
        raise DataError(
            f"{source}: data.config={config!r} names a subset of a dataset read with datasets.load_dataset "
            "(a hub id, a hub-layout folder or a glob); a local file has none, so drop data.config."
        )

    try:
        if through_datasets:
            rows = _read_with_datasets(str(path), config, split, default_split)
        else:
            rows = _read(source, split, default_split)
    except UnicodeDecodeError:
        raise DataError(_not_utf8(source)) from None
    if not rows:
        raise DataError(f"{source}: the dataset is empty (no rows); point the path at a file with prompts.")
    if limit is not None:
        rows = rows[:limit]
    _check_rows(rows, prompt_column, source)
    return [row for _, row in rows]


def load_train_eval(
    data_cfg: DataConfig, train_rows: list[dict] | None, eval_rows: list[dict] | None
) -> tuple[list[dict], list[dict]]:
    """The training rows and the held-out rows (none without data.eval) of ``data_cfg``; rows given are checked."""
    for name, given in (("train_rows", train_rows), ("eval_rows", eval_rows)):
        if given is not None:
            check_given_rows(given, name, data_cfg.prompt_column)
    if train_rows is None:
        if not data_cfg.train:
            raise ConfigError(
                "data.train is empty: give a JSONL/JSON/CSV/Parquet file or a save_to_disk folder"
            )
        train_rows = load_prompts(
            data_cfg.train, prompt_column=data_cfg.prompt_column, split=data_cfg.split, config=data_cfg.config
        )
    if eval_rows is None and data_cfg.eval:
        eval_rows = load_prompts(
            data_cfg.eval,
            prompt_column=data_cfg.prompt_column,
            limit=data_cfg.eval_limit,
            split=data_cfg.eval_split,
            default_split="test",
            config=data_cfg.config if data_cfg.eval == data_cfg.train else None,
        )
    return train_rows, eval_rows or []


def check_reward_columns(rows: Sequence[Mapping[str, Any]], reward_functions: Iterable, source: str) -> None:
    """The columns each reward reads (its ``columns``: math_accuracy's answers, code_tests' tests) in every row."""
    for name, fn, _ in reward_functions:
        require_columns(rows, getattr(fn, "columns", ()), source, needed_by=f"reward {name!r}")


def check_given_rows(rows: Any, name: str, prompt_column: str | None) -> None:
    """Rows given in code (train_rows=...): a non-empty list of dicts with the prompt; else DataError naming it."""
    if isinstance(rows, (str, bytes, Mapping)) or not hasattr(rows, "__len__") or not rows:
        raise DataError(f"{name}: expected a non-empty list of rows (dicts with a {prompt_column!r} field), got {_short(rows)}")
    _check_rows(_located(list(rows)), prompt_column, name)


def reward_columns(rows: Sequence[Mapping[str, Any]], prompt_column: str) -> dict[str, list[Any]]:
    """Every column but the prompt, as lists aligned with ``rows`` (the keyword arguments of
    TRL-style reward functions); a row lacking a column gives None there."""
    names = dict.fromkeys(key for row in rows for key in row if key != prompt_column)
    return {name: [row.get(name) for row in rows] for name in names}


def require_columns(
    rows: Sequence[Mapping[str, Any]],
    columns: Iterable[str],
    source: str | Path,
    *,
    needed_by: str | None = None,
) -> None:
    """Raise DataError unless every row has every one of ``columns``.

    ``source`` names the dataset in the message; ``needed_by`` (e.g. "reward 'accuracy'") says
    who asked for the column. Rows are counted from 0 (``row index N``).
    """
    present = _columns(rows)
    reason = f" (needed by {needed_by})" if needed_by else ""
    for column in columns:
        if column not in present:
            raise DataError(
                f"{source}: no column {column!r}{reason}; columns present: {present}."
                f"{_did_you_mean(column, present)} Add the column to the dataset or rename it."
            )
        for index, row in enumerate(rows):
            if column not in row:
                raise DataError(
                    f"{source}, row index {index}: no {column!r} field{reason}; this row has "
                    f"{list(row)}. Add the field to every row or drop this row."
                )


def prompt_problem(prompt: Any) -> str | None:
    """Why ``prompt`` is not a usable prompt, or None when it is.

    A usable prompt is a non-empty string, or a non-empty list of messages, each a dict with a
    ``role`` in MESSAGE_ROLES and a string ``content``.
    """
    if isinstance(prompt, str):
        return None if prompt.strip() else "is an empty string; give a non-empty prompt or drop the row"
    if isinstance(prompt, dict) and "role" in prompt:
        return "is a single message; wrap it in a list: [{'role': ..., 'content': ...}]"
    if isinstance(prompt, list):
        if not prompt:
            return "is an empty list of messages; give at least one {'role': 'user', 'content': ...}"
        for i, message in enumerate(prompt):
            if not isinstance(message, dict):
                return f"message {i} is a {type(message).__name__}, not a dict with 'role' and 'content'"
            role = message.get("role")
            if role not in MESSAGE_ROLES:
                return f"message {i} has role {role!r}; use one of {list(MESSAGE_ROLES)}"
            content = message.get("content")
            if content is None:
                return f"message {i} (role {role!r}) has no 'content'; give each message its text"
            if not isinstance(content, str):
                return (
                    f"message {i} (role {role!r}) has content of type {type(content).__name__}; "
                    "content must be a string"
                )
        return None
    return (
        "must be a non-empty string or a list of chat messages [{'role': 'user', 'content': ...}], "
        f"got {type(prompt).__name__}: {_short(prompt)}"
    )


def _not_utf8(source: Path) -> str:
    """The message for a text file that is not UTF-8: where the first bad byte is, and the fix."""
    data = source.read_bytes()
    try:
        data.decode("utf-8")
        where = ""
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        where = f" (line {line}, byte {e.start}: {data[e.start : e.start + 1]!r})"
    return (
        f"{source}: not UTF-8 text{where}; re-save it as UTF-8, "
        f"e.g. iconv -f latin1 -t utf-8 {source.name} > fixed{source.suffix}"
    )


# ---------------------------------------------------------------------------------------------
# Reading: each reader returns [(where, row), ...] in file order.


def _read(source: Path, split: str | None, default_split: str = "train") -> _Located:
    if source.is_dir():
        return _read_saved_dataset(source, split, default_split)
    suffix = source.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        rows = _read_jsonl(source)
    elif suffix == ".json":
        return _read_json(source, split, default_split)
    elif suffix in (".csv", ".tsv"):
        rows = _read_csv(source, delimiter="\t" if suffix == ".tsv" else ",")
    elif suffix in (".parquet", ".pq"):
        rows = _read_parquet(source)
    elif suffix == ".arrow":
        rows = _located(_read_arrow(source))
    else:
        raise DataError(
            f"{source}: unknown data format {suffix or '(no extension)'!r}; use {SUPPORTED_FORMATS}."
        )
    _check_single_table_split(source, split)
    return rows


def _read_jsonl(source: Path) -> _Located:
    rows = []
    with source.open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((f"line {line_number}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{source}, line {line_number}: not valid JSON ({e.msg} at column {e.colno}); "
                    "each line must be one complete JSON object."
                ) from None
    return rows


def _read_json(source: Path, split: str | None, default_split: str = "train") -> _Located:
    text = source.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON Lines saved as .json, which `datasets` also accepts
            rows = _read_jsonl(source)
            _check_single_table_split(source, split)
            return rows
        raise DataError(
            f"{source}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); fix the file "
            "or save it as JSON Lines (.jsonl)."
        ) from None

    if isinstance(data, list) or data == {}:
        _check_single_table_split(source, split)
        return _located(data or [])
    if not isinstance(data, dict):
        raise DataError(f"{source}: expected a JSON list of objects, got a {type(data).__name__}.")

    values = list(data.values())
    if values and all(isinstance(v, list) for v in values):
        is_split = [all(isinstance(row, dict) for row in v) for v in values]
        if not all(is_split):  # {column: [values]}: column-oriented, as pandas' to_json(orient="list")
            lengths = {k: len(v) for k, v in data.items()}
            if len(set(lengths.values())) != 1:
                raise DataError(
                    f"{source}: columns have different lengths {lengths}; give every column one value per row."
                )
            _check_single_table_split(source, split)
            return _located([dict(zip(data, values_of_row)) for values_of_row in zip(*values)])
    splits = {
        k: v for k, v in data.items() if isinstance(v, list) and all(isinstance(row, dict) for row in v)
    }
    if not splits:
        raise DataError(
            f"{source}: found a JSON object with keys {list(data)} but no list of rows; expected a list "
            'of objects, {"data": [...]}, {"train": [...], "test": [...]} or {column: [values]}.'
        )
    return _located(splits[_pick_split(source, list(splits), split, default_split)])


def _read_csv(source: Path, delimiter: str) -> _Located:
    rows = []
    # utf-8-sig drops the byte-order mark that spreadsheet programs write.
    with source.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        for index, row in enumerate(reader):
            where = f"row index {index} (line {reader.line_num})"
            if None in row:
                raise DataError(
                    f"{source}, {where}: more fields than the {len(reader.fieldnames)} header columns "
                    f"{reader.fieldnames}; quote values that contain {delimiter!r}."
                )
            rows.append((where, row))
    return rows


def _read_parquet(source: Path) -> _Located:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(source)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise DataError(f"{source}: cannot read as Parquet ({e}).") from e
    return _located(table.to_pylist())


def _read_arrow(source: Path) -> list[dict[str, Any]]:
    import pyarrow as pa

    try:
        with pa.ipc.open_stream(source) as reader:  # what save_to_disk writes
            return reader.read_all().to_pylist()
    except pa.ArrowInvalid:
        pass
    try:
        with pa.ipc.open_file(source) as reader:
            return reader.read_all().to_pylist()
    except pa.ArrowInvalid as e:
        raise DataError(f"{source}: cannot read as Arrow IPC, stream or file format ({e}).") from e


def _read_saved_dataset(folder: Path, split: str | None, default_split: str = "train") -> _Located:
    dict_file = folder / "dataset_dict.json"
    if dict_file.is_file():  # DatasetDict: one Dataset folder per split
        splits = json.loads(dict_file.read_text(encoding="utf-8"))["splits"]
        folder = folder / _pick_split(folder, splits, split, default_split)
        split = None
    state_file = folder / "state.json"
    if not state_file.is_file():
        raise DataError(
            f"{folder}: a folder, but not one written by datasets' save_to_disk (no state.json or "
            f"dataset_dict.json) nor one in hub layout (no data files in it); point the "
            f"path at a data file: {SUPPORTED_FORMATS}."
        )
    state = json.loads(state_file.read_text(encoding="utf-8"))
    if split is not None and split not in ("train", state.get("_split")):
        raise DataError(
            f"{folder}: a single Dataset (split {state.get('_split')!r}), not a DatasetDict, so it has "
            f"no split {split!r}; drop `split` or point the path at the folder for that split."
        )
    shards = [folder / entry["filename"] for entry in state.get("_data_files", [])]
    if not shards:
        shards = sorted(folder.glob("data-*.arrow"))
    rows: list[dict[str, Any]] = []
    for shard in shards:
        rows.extend(_read_arrow(shard))
    return _located(rows)


def _pick_split(source: Path | str, splits: list[str], split: str | None, default: str = "train") -> str:
    if split is None:
        if default in splits:
            return default
        if len(splits) == 1:
            return splits[0]
        raise DataError(f"{source}: has splits {splits} and none is {default!r}; pick one with `split`.")
    if split not in splits:
        raise DataError(f"{source}: no split {split!r}; splits found: {splits}.")
    return split


# Extensions of the files `load_dataset` reads from a folder in hub layout, and the builder for each.
_BUILDERS = {
    ".jsonl": "json", ".ndjson": "json", ".json": "json", ".csv": "csv", ".tsv": "csv",
    ".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow",
}  # fmt: skip


def _needs_load_dataset(text: str, source: Path) -> bool:
    """True for what only ``datasets.load_dataset`` reads: a glob, a hub-layout folder (data files but
    no save_to_disk state), or a hub id (``name`` or ``owner/name``, not a local path, no extension)."""
    if any(ch in text for ch in "*?["):
        return True
    if source.is_dir():
        saved = (source / "state.json").is_file() or (source / "dataset_dict.json").is_file()
        return not saved and any(_data_files_in(source))
    if source.exists():
        return False
    parts = text.split("/")
    return (
        len(parts) <= 2
        and all(parts)
        and not text.startswith((".", "~"))
        and source.suffix.lower() not in _BUILDERS
        and source.suffix.lower() not in (".txt", ".yaml", ".yml")
    )


def _data_files_in(folder: Path) -> Iterable[Path]:
    """Data files anywhere under ``folder`` (a hub repository may keep them in data/ or per config)."""
    for p in folder.rglob("*"):
        relative = p.relative_to(folder).parts
        if (
            p.suffix.lower() in _BUILDERS
            and not any(part.startswith(".") for part in relative)
            and p.is_file()
        ):
            yield p


def _read_with_datasets(name: str, config: str | None, split: str | None, default_split: str) -> _Located:
    """Rows of one split through ``datasets.load_dataset``; its errors become DataErrors naming the source."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{name}: reading a hub id, a hub-layout folder or a glob needs the datasets package; "
            "pip install 'grpokit[datasets]' (or point data.train at a single data file)."
        ) from None
    no_hub = False  # a hub id whose hub did not answer the probe (offline mode is then on)
    if any(ch in name for ch in "*?["):
        if config is not None:
            raise DataError(
                f"{name}: data.config={config!r} applies to hub datasets, not to a glob; drop it."
            )
        builder = _BUILDERS.get(Path(name).suffix.lower())
        if builder is None:
            raise DataError(
                f"{name}: a glob must end in a data file extension ({', '.join(_BUILDERS)}), "
                "e.g. data/train-*.parquet."
            )
        if not glob.glob(name, recursive=True):
            raise DataError(f"{name}: no file matches this pattern; check the path and the pattern.")
        kwargs = {"path": builder, "data_files": name}
        if Path(name).suffix.lower() == ".tsv":
            kwargs["delimiter"] = "\t"
    else:
        kwargs = {"path": name, "name": config}
        if not Path(name).exists():  # without a hub datasets retries ~30 s; offline it reads its cache at once
            no_hub = hub.go_offline_if_unreachable(f"dataset {name}")
    try:
        loaded = datasets.load_dataset(**kwargs)
    except (FileNotFoundError, ConnectionError) as e:
        if Path(name).exists():
            raise DataError(f"{name}: datasets.load_dataset failed: {_first_line(e)}") from None
        why = (
            f"the hub ({hub.endpoint()}) gave no answer within {hub.PROBE_TIMEOUT_S:.0f} s and the datasets "
            "cache holds no copy; check the path, or load it once where there is network (it is then cached)"
            if no_hub
            else "check the path, or the hub id and the network (offline, HF_HUB_OFFLINE=1 reads only the "
            "cache of the datasets loaded before)"
        )
        raise DataError(
            f"{name}: not a local file or folder (looked in {Path(name).resolve()}), and not a hub dataset "
            f"that could be loaded ({_first_line(e)}); {why}."
        ) from None
    except (ValueError, OSError) as e:
        what = f" (config {config!r})" if config else ""
        raise DataError(f"{name}{what}: datasets.load_dataset failed: {_first_line(e)}") from None
    except datasets.exceptions.DatasetsError as e:  # a file it cannot parse: the reason is the cause
        cause = e.__cause__ or e.__context__
        reason = _first_line(cause) if cause is not None else _first_line(e)
        raise DataError(
            f"{name}: datasets.load_dataset cannot read a file in it ({reason}); fix that file (pointing "
            "data.train at the file itself gives grpokit's reader, which names the line)."
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded[_pick_split(name, list(loaded), split, default_split)]
    elif split not in (None, "train"):
        _check_single_table_split(Path(name), split)
    return _located(loaded.to_list())


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def _check_single_table_split(source: Path, split: str | None) -> None:
    if split not in (None, "train"):
        raise DataError(
            f"{source}: a single table has no split {split!r}; drop `split` or point the path at "
            "the file that holds that split."
        )


def _located(rows: list[Any]) -> _Located:
    return [(f"row index {index}", row) for index, row in enumerate(rows)]


# ---------------------------------------------------------------------------------------------
# Checking.


def _check_rows(rows: _Located, prompt_column: str | None, source: Path | str) -> None:
    for where, row in rows:
        if not isinstance(row, dict):
            what = f"an object with a {prompt_column!r} field" if prompt_column else "an object (a row)"
            raise DataError(f"{source}, {where}: expected {what}, got a {type(row).__name__}: {_short(row)}.")
    if prompt_column is None:
        return
    columns = _columns([row for _, row in rows])
    if prompt_column not in columns:
        raise DataError(
            f"{source}: no prompt column {prompt_column!r}; columns found: {columns}."
            f"{_did_you_mean(prompt_column, columns)} Set prompt_column to the column that holds "
            "the prompts, or rename it."
        )
    for where, row in rows:
        if prompt_column not in row:
            raise DataError(
                f"{source}, {where}: no {prompt_column!r} field (this row has {list(row)}); give "
                "every row a prompt or drop this row."
            )
        problem = prompt_problem(row[prompt_column])
        if problem is not None:
            raise DataError(f"{source}, {where}: {prompt_column!r} {problem}.")


def _columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every key seen in any row, in order of first appearance."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def _did_you_mean(column: str, columns: list[str]) -> str:
    close = difflib.get_close_matches(column, columns, n=1, cutoff=0.6)
    if not close and column == "prompt":
        close = [c for c in _PROMPT_LIKE_COLUMNS if c in columns][:1]
    return f" Did you mean {close[0]!r}?" if close else ""


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."

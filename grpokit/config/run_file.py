"""OUTPUT/config.yaml: the run, written so that ``grpokit train OUTPUT/config.yaml`` trains the same thing again.

Written when a run starts (grpokit.run.state.RunState.start): every section of the config tree, then two records
that are not settings and that load_config reads back:

    resolved_algo   every algorithm setting after the preset and the algo.* knobs (AlgoSettings.flat()); loading
                    the file checks that its settings still resolve to these (a grpokit whose preset changed would
                    train another algorithm from the same file: refused, naming the settings that moved)
    given_in_code   what a run built in Python was given instead of settings (GRPOTrainer(cfg, model=...,
                    train_rows=..., reward_functions=...)): the model's class, where its weights came from and
                    their dtype; the rows' type, count and sha256 (sha256_rows); each reward function's module,
                    name and weight; and for each, the setting that loads it again, or why none can

A part given in code that a setting can name again is written as that setting: a model loaded from a folder or a
hub id (its name_or_path; with model.dtype and model.device left at auto, its dtype and device), a reward
function importable as module:function or file.py:function. One that cannot (a model built in code, rows given
as a list, a lambda, a function of the running script) is written as a placeholder, ``<given in code: ...>``,
which a trainer refuses unless the part is given again, in code or by its setting (check_given_again). The
file's first lines say which parts those are, and so does one line on stdout when the run starts.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from grpokit.core.errors import ConfigError

PLACEHOLDER = "<given in code"
"""How a part given in code that no setting can load again is written in config.yaml: ``<given in code: ...>``."""
RECORDS = ("resolved_algo", "given_in_code")
"""config.yaml's top-level entries that are records of the run, not settings (load_config reads them back)."""
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def sha256_rows(rows: list[Any]) -> str:
    """sha256 over the rows, each as one line of JSON with sorted keys (values JSON cannot hold by their repr)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=repr, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def given_in_code(
    cfg: Any,
    *,
    model: Any = None,
    tokenizer: Any = None,
    train_rows: Any = None,
    eval_rows: Any = None,
    reward_functions: list[tuple[str, Any, float]] | None = None,
) -> dict[str, Any] | None:
    """The record of what a trainer was given in code (None when nothing was), after checking that every part a
    loaded config.yaml holds as a placeholder is given again (check_given_again)."""
    check_given_again(cfg, model=model, train_rows=train_rows, eval_rows=eval_rows, rewards=reward_functions)
    record: dict[str, Any] = {}
    if model is not None:
        record["model"] = model_record(model, tokenizer)
    for key, rows in (("train_rows", train_rows), ("eval_rows", eval_rows)):
        if rows is not None:
            record[key] = rows_record(rows)
    if reward_functions is not None:
        try:
            entries = [(name, fn, weight) for name, fn, weight in reward_functions]
        except (TypeError, ValueError):  # not (name, function, weight) entries: the trainer refuses them by name
            entries = []
        record["rewards"] = [reward_record(name, fn, weight) for name, fn, weight in entries]
    return record or None


def model_record(model: Any, tokenizer: Any = None) -> dict[str, Any]:
    """A given model: its class, where its weights came from (its name_or_path: a folder or a hub id, or built in
    code), its dtype and device, and the model.name_or_path that loads it again (None: none can)."""
    cls = type(model)
    source = str(getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "") or "")
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    out: dict[str, Any] = {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "weights_from": source or "built in code (the model has no name_or_path)",
        "dtype": str(first.dtype).removeprefix("torch.") if first is not None else None,
        "device": str(first.device) if first is not None else None,
    }
    path = Path(source) if source else None
    if path is not None and path.exists():
        reload = source if (path / "config.json").is_file() else None
        why = None if reload else f"{source} holds no config.json"
    elif source and HUB_ID.match(source):
        reload, why = source, None  # a hub id: the hub's weights of now, not necessarily those of the run
    else:
        reload, why = None, ("a folder that no longer exists" if source else "built in code")
    out["reloadable_as"] = reload and f"model.name_or_path={reload}"
    if why:
        out["not_reloadable"] = why
    out["note"] = "weights changed in memory after loading are not known to this file"
    tok_source = getattr(tokenizer, "name_or_path", None) if tokenizer is not None else None
    if tokenizer is not None:
        out["tokenizer"] = f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__} from {tok_source or 'code'}"
        if reload and tok_source != source:
            out["note"] += f"; model.name_or_path loads the tokenizer of {source}, this run's came from {tok_source}"
    return out


def rows_record(rows: Any) -> dict[str, Any]:
    """Given rows: their type, count and sha256 (sha256_rows); a datasets.Dataset's name, config and split too."""
    kind = type(rows)
    out: dict[str, Any] = {"source": f"{kind.__module__}.{kind.__qualname__} given in code"}
    if isinstance(rows, (str, bytes, Mapping)) or not hasattr(rows, "__len__"):
        return out  # not rows: the trainer refuses them by name
    listed = list(rows)
    out.update(rows=len(listed), sha256=sha256_rows(listed))
    info = getattr(rows, "info", None)
    for key, value in (("dataset", getattr(info, "dataset_name", None)), ("config", getattr(info, "config_name", None)),
                       ("split", getattr(rows, "split", None))):  # fmt: skip
        if value:
            out[key] = str(value)
    out["not_reloadable"] = "rows given in code; give them again (train_rows=) or name a file (data.train=)"
    return out


def reward_record(name: str, fn: Any, weight: float) -> dict[str, Any]:
    """A given reward function: its module, name and weight, and the rewards entry that loads it again (a
    function importable from its module or its file), or why none can."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None)
    out: dict[str, Any] = {"name": str(name), "module": module, "function": qualname or type(fn).__qualname__,
                           "weight": float(weight) if isinstance(weight, (int, float)) else repr(weight)}  # fmt: skip
    spec, why = importable_spec(fn, module, qualname)
    if spec:
        out["reloadable_as"] = spec
    else:
        out["not_reloadable"] = why
    return out


def importable_spec(fn: Any, module: str, qualname: str | None) -> tuple[str | None, str | None]:
    """('module:function' or 'path/file.py:function', None) when that names ``fn`` itself, else (None, why)."""
    if qualname is None:
        return None, f"a callable {type(fn).__qualname__} object, not a function"
    if module == "__main__":
        return None, "a function of the running script (__main__); move it to a module to name it"
    if "<" in qualname and module.startswith("grpokit."):
        return None, ("a function grpokit built (a builtin reward given by name in code, or made with parameters); "
                      "name it in rewards (e.g. name: math_accuracy, with its kwargs)")  # fmt: skip
    if "<" in qualname:
        return None, "a lambda or a function defined inside another"
    loaded = sys.modules.get(module)
    target: Any = loaded
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if loaded is None or target is not fn:
        return None, f"{module}:{qualname} does not name this function"
    if importable_by_name(module):
        return f"{module}:{qualname}", None
    file = getattr(loaded, "__file__", None)
    if file and Path(file).is_file():
        return f"{file}:{qualname}", None  # a module loaded from its file (a rewards entry's file.py:function)
    return None, f"module {module} cannot be imported again"


def importable_by_name(module: str) -> bool:
    """A fresh interpreter can import ``module`` by its name: its top-level package is built in or found on
    sys.path (not only in sys.modules, where a module loaded from a file by path sits under a made-up name)."""
    top = module.split(".", 1)[0]
    if top in sys.builtin_module_names:
        return True
    try:
        return importlib.machinery.PathFinder.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def check_given_again(cfg: Any, *, model: Any, train_rows: Any, eval_rows: Any, rewards: Any) -> None:
    """A config loaded from a config.yaml whose run was given parts in code holds placeholders for them: each must
    be given again, in code or by its setting, else ConfigError naming the setting and what to do."""
    wanted = [
        ("model.name_or_path", cfg.model.name_or_path, model, "model=", "a model folder or hub id"),
        ("data.train", cfg.data.train, train_rows, "train_rows=", "a data file"),
        ("data.eval", cfg.data.eval, eval_rows, "eval_rows=", "a data file, or null for no held-out rows"),
    ]
    wanted += [(f"rewards[{i}].name", spec.name, rewards, "reward_functions=", "module:function or file.py:function")
               for i, spec in enumerate(getattr(cfg, "rewards", []))]  # fmt: skip
    for key, value, given, keyword, what in wanted:
        if isinstance(value, str) and value.startswith(PLACEHOLDER) and given is None:
            raise ConfigError(
                f"{key}={value!r}: the run this config comes from was given it in code, which config.yaml cannot "
                f"load again; set {key} to {what}, or pass {keyword} in Python"
            )


def run_file_values(cfg_values: dict[str, Any], resolved_algo: dict[str, Any] | None,
                    given: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """(config.yaml's mapping, the parts it cannot load again): ``cfg_values`` (the config as a dict) with each
    part given in code written as the setting that loads it again or as a placeholder, then the records."""
    values = json.loads(json.dumps(cfg_values, default=str))  # a copy
    missing: list[str] = []
    given = given or {}
    model = given.get("model")
    if model:
        if model.get("reloadable_as"):
            values["model"]["name_or_path"] = model["reloadable_as"].split("=", 1)[1]
            auto = values["model"].get("dtype") == "auto" and values.get("optim", {}).get("precision") == "auto"
            if auto and model.get("dtype"):  # the given model's dtype chose the precision: the same on reload
                values["model"]["dtype"] = model["dtype"]
            if values["model"].get("device") == "auto" and model.get("device"):
                values["model"]["device"] = model["device"]
        else:
            values["model"]["name_or_path"] = f"{PLACEHOLDER}: {model['class']}, {model['not_reloadable']}>"
            missing.append(f"model.name_or_path (the model: {model['class']}, {model['not_reloadable']})")
    for key, setting in (("train_rows", "train"), ("eval_rows", "eval")):
        rows = given.get(key)
        if rows:
            values["data"][setting] = f"{PLACEHOLDER}: {rows.get('rows', '?')} rows, sha256 {rows.get('sha256', '?')}>"
            missing.append(f"data.{setting} ({key}: {rows.get('rows', '?')} rows given in code)")
    rewards = given.get("rewards")
    if rewards is not None:
        values["rewards"] = []
        for i, r in enumerate(rewards):
            name = r.get("reloadable_as") or f"{PLACEHOLDER}: {r['module']}.{r['function']}>"
            values["rewards"].append({"name": name, "weight": r["weight"], "kwargs": {}})
            if not r.get("reloadable_as"):
                missing.append(f"rewards[{i}].name ({r['module']}.{r['function']}: {r['not_reloadable']})")
    if resolved_algo is not None:
        values["resolved_algo"] = resolved_algo
    if given:
        values["given_in_code"] = given
    return values, missing


def write_run_file(path: str | Path, cfg_values: dict[str, Any], resolved_algo: dict[str, Any] | None = None,
                   given: dict[str, Any] | None = None, command: str = "grpokit train") -> list[str]:  # fmt: skip
    """Write config.yaml (run_file_values) with a header saying how to train the run again (``command``) and which
    parts the file cannot give back; those parts are also said once on stdout. Returns them."""
    values, missing = run_file_values(cfg_values, resolved_algo, given)
    header = [f"# This run (grpokit.config.run_file): {command} THIS_FILE --output-dir NEW trains it again; "
              "--resume continues it."]
    if missing:
        header.append("# NOT RELOADABLE AS IT STANDS: these were given in code and are placeholders here; set them:")
        header += [f"#   {m}" for m in missing]
    text = "\n".join(header) + "\n" + yaml.safe_dump(values, sort_keys=False, allow_unicode=True)
    Path(path).write_text(text)
    if missing:
        print(f"grpokit: {path} records this run; given in code, it cannot load again: {'; '.join(missing)}",
              flush=True)  # fmt: skip
    return missing


def split_records(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the settings, the records of RECORDS) of a config file's mapping."""
    records = {key: values[key] for key in RECORDS if key in values}
    return {k: v for k, v in values.items() if k not in RECORDS}, records


def check_resolved_algo(recorded: Any, now: dict[str, Any], where: str) -> None:
    """A config.yaml's resolved_algo against what its settings resolve to now: ConfigError naming each setting
    that moved (recorded -> now) and how to train the recorded algorithm."""
    if not isinstance(recorded, dict):
        raise ConfigError(f"{where}: resolved_algo must be a mapping of algorithm settings (as config.yaml writes it)")
    now = yaml.safe_load(yaml.safe_dump(now))  # the same types a YAML round trip gives
    moved = [key for key in sorted(set(recorded) | set(now)) if recorded.get(key) != now.get(key)]
    if moved:
        shown = ", ".join(f"{k}: {recorded.get(k)!r} recorded, {now.get(k)!r} now" for k in moved[:6])
        more = f" and {len(moved) - 6} more" if len(moved) > 6 else ""
        fix = " ".join(f"algo.{k}={recorded.get(k)}" for k in moved[:6] if k in recorded)
        raise ConfigError(
            f"{where}: its settings resolve to another algorithm than the run it records ({shown}{more}); this "
            f"grpokit's presets differ. Set the recorded values ({fix}) to train the same thing, or delete "
            "resolved_algo from the file to train with this version's"
        )

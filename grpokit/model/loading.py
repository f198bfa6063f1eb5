"""Load the policy (and, when beta > 0, a frozen reference) the way Hugging Face users expect."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import torch

from grpokit.config.schema import ConfigError, LoraConfig, ModelConfig
from grpokit.core import hub
from grpokit.model.checks import (
    check_device,
    check_lora_targets,
    check_weight_shapes,
    meta_model,
    model_config_object,
)
from grpokit.model.fused_layers import fuse_modules

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(name)  # a GPU index or an MPS device this machine lacks: a ConfigError
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


GENERIC_FAST_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")
"""tokenizer_class values of a plain tokenizers-library tokenizer (transformers 5 saves the second)."""


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False):
    """AutoTokenizer, except for local directories whose tokenizer_config names the generic fast class
    (``PreTrainedTokenizerFast``, or ``TokenizersBackend`` as transformers 5 writes it): those are loaded
    as exactly that class. AutoTokenizer would build the architecture's own class instead (a Qwen2
    directory gets ``Qwen2Tokenizer``), whose pre-tokenizer and added tokens differ from the saved ones."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config_path = Path(name_or_path) / "tokenizer_config.json"
    if config_path.is_file():
        declared = json.loads(config_path.read_text()).get("tokenizer_class")
        if declared in GENERIC_FAST_TOKENIZERS:
            tok = PreTrainedTokenizerFast.from_pretrained(name_or_path)
            return _ensure_pad(tok)
    tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    return _ensure_pad(tok)


TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model"
)  # fmt: skip
"""Files one of which a model folder's tokenizer is built from."""


def load_tokenizer_checked(model_cfg: ModelConfig):
    """The model's tokenizer, loaded before the model (to measure the prompts); a folder without tokenizer
    files, one that fails to load, or a vocabulary of fewer than two tokens is a ConfigError."""
    path = model_cfg.name_or_path
    key = f"model.name_or_path={path!r}"
    local = Path(path).expanduser()
    if local.is_dir() and not any((local / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"{key}: no tokenizer files there ({', '.join(TOKENIZER_FILES[:3])}, ...); copy in the tokenizer the "
            "model was trained with (tokenizer.save_pretrained(folder))."
        )
    try:
        tokenizer = load_tokenizer(path, trust_remote_code=model_cfg.trust_remote_code)
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}") from None
    except Exception as e:  # noqa: BLE001 - transformers and tokenizers raise many types here
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise ConfigError(f"{key}: its tokenizer does not load ({type(e).__name__}: {first}).") from None
    if len(tokenizer) < 2:
        raise ConfigError(
            f"{key}: its tokenizer has {len(tokenizer)} token(s); the tokenizer files are incomplete or damaged."
        )
    return tokenizer


def check_tokenizer_fits(model, tokenizer, where: str) -> None:
    """Refuse a tokenizer that can produce ids the model has no embedding row for."""
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        added = {t: i for t, i in tokenizer.get_added_vocab().items() if i >= rows}
        raise ConfigError(
            f"{where}: the tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} rows"
            f"{f' (ids beyond it: {added})' if added else ''}. Use the tokenizer the model was trained "
            "with, or resize the embeddings (model.resize_token_embeddings) before training."
        )


def eos_token_ids(tokenizer, model) -> list[int]:
    """The ids that end a completion: the tokenizer's eos token and the model's generation_config ones."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    for e in eos if isinstance(eos, list) else [eos]:
        if e is not None:
            ids.add(int(e))
    if not ids:
        raise ConfigError("the tokenizer has no eos token: completions could never end")
    return sorted(ids)


def save_local_tokenizer(tokenizer, directory: str | Path) -> None:
    """save_pretrained, then pin tokenizer_class to PreTrainedTokenizerFast so that
    load_tokenizer (and AutoTokenizer on non-Qwen2 architectures) rebuilds this exact tokenizer."""
    tokenizer.save_pretrained(directory)
    path = Path(directory) / "tokenizer_config.json"
    data = json.loads(path.read_text())
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(data, indent=2))


def _ensure_pad(tok):
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ConfigError(
                "the tokenizer defines neither a pad nor an eos token; set one in tokenizer_config.json"
            )
        tok.pad_token = tok.eos_token
    return tok


"""How long to wait for the Hugging Face hub to answer before calling it unreachable."""
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def read_model_config(model_cfg: ModelConfig) -> dict:
    """The model's config.json as a dict, read without loading any weight, after checking that the model
    can be had: a local folder must hold config.json; a hub id is read from the local Hugging Face cache,
    else needs a hub that answers within hub.PROBE_TIMEOUT_S (config.json alone is fetched then).
    With a cached copy and no hub, HF_HUB_OFFLINE is switched on so that loading does not wait for it."""
    path = model_cfg.name_or_path
    key = f"model.name_or_path={path!r}"
    if not path:
        raise ConfigError(
            "model.name_or_path is empty: give a model folder or hub id (e.g. model.name_or_path=Qwen/Qwen2.5-0.5B)"
        )
    if path == "demo" and not Path(path).exists():
        raise ConfigError(
            "model.name_or_path='demo' names the embedded demo: run `grpokit demo`, or give a model folder "
            "or hub id (e.g. model.name_or_path=Qwen/Qwen2.5-0.5B)."
        )
    local = Path(path).expanduser()
    if local.exists() or path.startswith(("/", ".", "~")) or not _HUB_ID.match(path):
        if local.is_file():
            raise ConfigError(
                f"{key} is a file, not a model folder; give the folder that holds config.json and the weights "
                f"(e.g. model.name_or_path={local.parent})."
            )
        if not local.is_dir():
            raise ConfigError(
                f"{key}: no such folder (looked in {local.resolve()}); give a model folder with config.json "
                "or a hub id (e.g. model.name_or_path=Qwen/Qwen2.5-0.5B)."
            )
        config_file = local / "config.json"
        if not config_file.is_file():
            raise ConfigError(f"{key}: no config.json there; is it a Hugging Face model directory?")
        config = _read_json(config_file, key)
        check_weight_files(local, key)
        model_config_object(local, key, trust_remote_code=model_cfg.trust_remote_code)  # builds in transformers
        return config
    cached = _cached_config(path)
    local_copy = (
        f"Point model.name_or_path at a local copy (a folder with config.json), e.g. "
        f"model.name_or_path=/models/{path.split('/')[-1]} (download it where there is network: "
        f"huggingface-cli download {path} --local-dir /models/{path.split('/')[-1]})"
    )
    if hub.offline():
        if cached is None:
            raise ConfigError(
                f"{key} is not a local folder and HF_HUB_OFFLINE is set, but it is not in the Hugging Face "
                f"cache. {local_copy}."
            )
        return _checked_hub_config(cached, model_cfg, key)
    endpoint = hub.endpoint()
    if not hub.reachable(endpoint):
        if cached is None:
            raise ConfigError(
                f"{key} is not a local folder and the Hugging Face hub ({endpoint}) cannot be reached "
                f"(no answer within {hub.PROBE_TIMEOUT_S:.0f} s). {local_copy}, or, with a copy in the "
                "Hugging Face cache, set HF_HUB_OFFLINE=1."
            )
        hub.go_offline()
        print(
            f"grpokit: the hub is unreachable; using the cached copy of {path} (HF_HUB_OFFLINE=1)",
            file=sys.stderr,
        )
        return _checked_hub_config(cached, model_cfg, key)
    return _checked_hub_config(cached or _download_config(path, key), model_cfg, key)


def _checked_hub_config(path: str, model_cfg: ModelConfig, key: str) -> dict:
    """A hub model's config.json (from the cache or just downloaded), checked as a local folder's is (not
    with trust_remote_code: the model's code files are not downloaded yet)."""
    config = _read_json(path, key)
    if not model_cfg.trust_remote_code:
        model_config_object(Path(path).parent, key, trust_remote_code=False)
    return config


def check_weight_files(folder: Path, key: str) -> None:
    """A local model folder holds its weights: safetensors files whose headers parse and whose sizes
    match them (no tensor is read), or PyTorch .bin files; an index's shards all present."""
    from grpokit.model.checkpoint import safetensors_problem

    if (folder / "adapter_config.json").is_file():
        return  # a PEFT adapter folder: its base model is checked when it loads
    for index in sorted(folder.glob("*.index.json")):
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (ValueError, UnicodeDecodeError, AttributeError):
            raise ConfigError(f"{key}: {index.name} is not valid JSON; the model folder is damaged.") from None
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            raise ConfigError(
                f"{key}: {index.name} lists {len(missing)} weight file(s) that are not there "
                f"({', '.join(missing[:3])}); the download is incomplete: fetch the missing files."
            )
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not any(folder.glob("*.bin")):
        raise ConfigError(
            f"{key}: no weights there (model.safetensors or pytorch_model.bin); the download is incomplete or "
            "this is not a model folder."
        )
    for f in weights:
        if not f.is_file():
            raise ConfigError(f"{key}: {f.name} is not a file; the model folder is damaged: fetch it again.")
        problem = safetensors_problem(f)
        if problem:
            raise ConfigError(f"{key}: {f.name}: {problem}; download it again.")


def _download_config(repo_id: str, key: str) -> str:
    """config.json alone from the hub (a few KB): a wrong id or a gated model fails here, before the
    weights download, and the model's positions can be checked."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        endpoint = os.environ.get("HF_ENDPOINT")  # read now, like the probe (the library reads it at import)
        return hf_hub_download(repo_id, "config.json", endpoint=endpoint, etag_timeout=hub.PROBE_TIMEOUT_S)
    except GatedRepoError:
        raise ConfigError(
            f"{key} is gated on the hub: accept its terms there and log in (HF_TOKEN)."
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"{key}: no such model on the hub (or private: log in with HF_TOKEN); check the id, "
            "e.g. model.name_or_path=Qwen/Qwen2.5-0.5B."
        ) from None
    except (HfHubHTTPError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{key}: could not read config.json from the hub ({first}).") from None


def _read_json(path: str | Path, key: str) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{key}: {path} is not valid JSON ({e}); the model folder is damaged.") from None


def _cached_config(repo_id: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return found if isinstance(found, str) else None


def load_policy(model_cfg: ModelConfig, lora_cfg: LoraConfig, weight_dtype: torch.dtype | None = None):
    """-> (model, tokenizer, device). The model is on ``device`` in ``weight_dtype`` (default: from
    model.dtype; the trainer passes its precision mode's weight dtype); LoRA-wrapped when asked."""
    from transformers import AutoModelForCausalLM

    path = model_cfg.name_or_path
    read_model_config(model_cfg)  # a missing folder, a bad config.json or an unreachable hub fails here, in seconds
    device = pick_device(model_cfg.device)
    check_model_builds(model_cfg, lora_cfg)  # attention, weight shapes, LoRA targets: before any weight is read
    tokenizer = load_tokenizer_checked(model_cfg)
    dtype = weight_dtype or pick_dtype(model_cfg.dtype, device)
    kwargs = {"dtype": dtype, "trust_remote_code": model_cfg.trust_remote_code}
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device)
    check_tokenizer_fits(model, tokenizer, f"model.name_or_path={path!r}")
    model = prepare_policy(model, model_cfg, lora_cfg)
    return model, tokenizer, device


def check_model_builds(model_cfg: ModelConfig, lora_cfg: LoraConfig) -> None:
    """The model built on the meta device from its config.json (grpokit.model.checks): the attention
    implementation, a local folder's weight shapes and the LoRA target modules checked before loading.
    Skipped with trust_remote_code (the model's own code may not build on the meta device)."""
    if model_cfg.trust_remote_code:
        return
    from transformers import AutoConfig

    key = f"model.name_or_path={model_cfg.name_or_path!r}"
    model = meta_model(AutoConfig.from_pretrained(model_cfg.name_or_path), model_cfg)
    local = Path(model_cfg.name_or_path).expanduser()
    if local.is_dir() and getattr(model.config, "quantization_config", None) is None:  # packed weights differ
        check_weight_shapes(local, model, key)
    check_lora_targets(model, lora_cfg, model_cfg.name_or_path)


def prepare_policy(model, model_cfg: ModelConfig, lora_cfg: LoraConfig):
    """Gradient checkpointing, model.compile's fused norms and MLPs, LoRA when enabled."""
    if model_cfg.compile:
        fuse_modules(model, compiled=True)
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora_cfg.enabled:
            model.enable_input_require_grads()
    check_lora_targets(model, lora_cfg)  # a model given in code: checked here
    if lora_cfg.enabled:
        try:
            from peft import LoraConfig as PeftLoraConfig
            from peft import get_peft_model
        except ImportError as e:
            raise ConfigError("lora.enabled=true needs PEFT: pip install 'grpokit[peft]'") from e
        peft_cfg = PeftLoraConfig(
            r=lora_cfg.r,
            lora_alpha=lora_cfg.alpha,
            lora_dropout=lora_cfg.dropout,
            # PEFT takes 'all-linear' as the whole value only, not as a list entry
            target_modules="all-linear" if list(lora_cfg.target_modules) == ["all-linear"] else list(lora_cfg.target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, peft_cfg)
    return model


def frozen_reference(model, lora_enabled: bool):
    """The reference policy for the KL term. With LoRA it is the base model with the adapter
    disabled (returns None: no second copy); otherwise a frozen copy of the initial weights."""
    if lora_enabled:
        return None
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return ref

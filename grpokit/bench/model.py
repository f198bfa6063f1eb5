"""The bench's random model (a Qwen2 of a named size with a word-level tokenizer), its random prompts
of an exact token length, and its seeded random reward."""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path

from grpokit.bench.shapes import MAX_WORD, MODEL_FORMAT, MODEL_SHAPES, SPECIAL_TOKENS, cache_root


def _build_tokenizer(vocab_size: int):
    """Word-level tokenizer: <pad> <eos> <bos> then words w0, w1, ...; whitespace-split, no network."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIAL_TOKENS + [f"w{k}" for k in range(vocab_size - len(SPECIAL_TOKENS))]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return tok


def build_random_model(shape: str, out_dir: str | Path | None = None, *, seed: int = 0) -> Path:
    """A randomly initialised Qwen2 model of ``shape`` ("tiny", "0.5b", "1.5b") and its word-level
    tokenizer, saved (float32) under ``out_dir`` (default ``cache_root()``) and reused on later calls.

    Returns the model directory. ``tokenizer_config.json`` names ``PreTrainedTokenizerFast`` so that
    ``grpokit.model.loading.load_tokenizer`` (and the TRL script) load this tokenizer rather than the Qwen2
    byte-level class transformers 5 would substitute.
    """
    if shape not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; choose one of {list(MODEL_SHAPES)}")
    root = Path(out_dir) if out_dir is not None else cache_root()
    final = root / f"random-qwen2-{shape}-seed{seed}-v{MODEL_FORMAT}"
    if (final / "COMPLETE").is_file():
        return final
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpokit.model.loading import save_local_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".building-{shape}-", dir=root))
    try:
        dims = MODEL_SHAPES[shape]
        tok = _build_tokenizer(dims["vocab_size"])
        save_local_tokenizer(tok, work)
        config = Qwen2Config(
            **dims,
            tie_word_embeddings=True,
            max_position_embeddings=4096,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config).to(torch.float32)
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.bos_token_id = tok.bos_token_id
        model.save_pretrained(work)
        n_params = sum(p.numel() for p in model.parameters())
        (work / "COMPLETE").write_text(json.dumps({"shape": shape, "seed": seed, "n_params": n_params}))
        del model
        if final.exists():  # an incomplete earlier attempt
            shutil.rmtree(final)
        work.rename(final)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return final


def random_prompts(n: int, prompt_len: int, n_words: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    hi = min(MAX_WORD, n_words)
    if hi <= 5:
        raise ValueError(f"the tokenizer has only {n_words} words; the bench needs more than 5")
    return [{"prompt": " ".join(f"w{rng.randrange(5, hi)}" for _ in range(prompt_len))} for _ in range(n)]


def random_reward(seed: int = 0):
    """A seeded random 0/1 reward with TRL's signature (the same for every call pattern)."""
    rng = random.Random(seed)

    def random_01(prompts, completions, **columns) -> list[float]:
        return [float(rng.random() < 0.5) for _ in completions]

    return random_01


def n_words(tokenizer) -> int:
    return sum(1 for w in tokenizer.get_vocab() if w[:1] == "w" and w[1:].isdigit())

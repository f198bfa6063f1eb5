"""Tiny random causal LMs and a matching word-level tokenizer for tests.

No network, no model hub: everything is built from configs in memory. The model is a 2-layer
Qwen2 (or Llama) in float32 with a vocabulary of ``vocab_size`` entries; the tokenizer is a
character-level ``PreTrainedTokenizerFast`` (digits, operators, lower-case letters, space, newline, and
single-token specials such as <eos> and the chat markers), so ``"1+2"`` is three tokens.

    model, tok = make_tiny_model("qwen2", seed=0)
    ids = tok("what is 1+2?")["input_ids"]
    path = save_tiny_model(tmp_path)          # AutoModelForCausalLM / AutoTokenizer load it back
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
PAD_ID = 0
# Token-id prompts of different lengths (left padding differs per row), shared by the generation tests.
SAMPLE_PROMPTS = [[2, 4, 11, 20, 12, 27, 5], [2, 30, 31], [2, 4, 50, 51, 52, 53, 54, 55, 10, 5], [7, 8]]
SPECIALS = [PAD, EOS, BOS, UNK, "<|user|>", "<|assistant|>", "<think>", "</think>", "<answer>", "</answer>"]
# One token per character, written in the byte-level alphabet ("Ġ" is the space, "Ċ" the newline).
CHARS = list("0123456789+-*/=()?.,#:!<>") + ["Ġ", "Ċ"] + list("abcdefghijklmnopqrstuvwxyz")
# Qwen2Tokenizer's pre-tokenizer split; mirroring it lets AutoTokenizer (which forces Qwen2Tokenizer on
# a qwen2 directory in transformers 5) rebuild exactly this tokenizer from the saved vocabulary.
PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}{% else %}<|assistant|>{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tiny_tokenizer(vocab_size: int = 64) -> PreTrainedTokenizerFast:
    """A character-level byte-level BPE tokenizer (no merges); ids 0..3 are <pad>, <eos>, <bos>, <unk>.

    Every character of ``CHARS`` is one token ("1 + 2" is ``1 Ġ + Ġ 2``: five tokens); characters
    outside it are dropped. The ten specials (chat markers, <think>, <answer> ...) are single tokens.
    Entries beyond ``CHARS`` up to ``vocab_size`` are unused fillers ``<w0>, <w1>, ...``.
    """
    words = SPECIALS + CHARS
    if vocab_size < len(words):
        raise ValueError(f"vocab_size must be at least {len(words)}")
    words += [f"<w{i}>" for i in range(vocab_size - len(words))]
    vocab = {w: i for i, w in enumerate(words)}
    backend = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        additional_special_tokens=SPECIALS[4:],
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_tiny_model(
    arch: str = "qwen2",
    seed: int = 0,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    max_position_embeddings: int = 256,
    tie_word_embeddings: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A random ``arch`` ("qwen2", "llama" or "qwen3") causal LM in float32, eval mode, and its tokenizer.

    The weights depend only on ``seed`` (the global RNG state is saved and restored).
    """
    tok = make_tiny_tokenizer(vocab_size)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        torch_dtype="float32",
    )
    if arch == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif arch == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen3":
        config, cls = Qwen3Config(**common, head_dim=hidden_size // num_heads), Qwen3ForCausalLM
    else:
        raise ValueError(f"unknown arch {arch!r}; use 'qwen2', 'llama' or 'qwen3'")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config).to(torch.float32)
        # HF's default init (std 0.02) gives near-uniform next-token distributions; a larger lm_head
        # makes greedy decoding and sampling less degenerate, which is what generation tests want.
        with torch.no_grad():
            if not tie_word_embeddings:
                model.lm_head.weight.normal_(0.0, 0.5)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    model.eval()
    return model, tok


def save_tiny_model(path: str | Path, arch: str = "qwen2", seed: int = 0, **kwargs) -> Path:
    """Write a tiny model and its tokenizer to ``path`` (created if needed); return ``path``.

    ``tokenizer_class`` is set to ``PreTrainedTokenizerFast``. With transformers 5, AutoTokenizer on a qwen2
    directory still builds ``Qwen2Tokenizer`` from the saved vocabulary; the tokenizer is designed so that
    this rebuild encodes and decodes exactly as the original (checked in tests/unit/model/test_tiny_models.py).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model, tok = make_tiny_model(arch, seed=seed, **kwargs)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    cfg_file = path / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_file.write_text(json.dumps(cfg, indent=2))
    return path


ADDITION_ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
"""16 two-number additions: the rows of the small trainer tests."""
SMALL_RUN = [
    "train.report_to=none",
    "rollout.group_size=2",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=4",
    "data.template=plain",
    "data.max_prompt_tokens=32",
    "model.device=cpu",
    "eval.enabled=false",
    "train.stop_after_flat_steps=0",
    "train.samples_every=0",
]
"""Overrides of a small, quick CPU run: 2 prompts x 2 completions of 4 tokens, nothing extra written."""


def has_seven(prompts, completions, **kw):
    """A reward with spread on ADDITION_ROWS: 1 when the completion holds a 7."""
    return [float("7" in c) for c in completions]


def small_trainer(out: Path, steps: int, *overrides: str, **kwargs):
    """A GRPOTrainer of a tiny qwen2 on ADDITION_ROWS with SMALL_RUN and has_seven, writing to ``out``."""
    from grpokit import GRPOTrainer, load_config

    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(None, [f"train.output_dir={out}", f"train.steps={steps}", *overrides, *SMALL_RUN])
    return GRPOTrainer(
        cfg,
        model=model,
        tokenizer=tok,
        train_rows=ADDITION_ROWS,
        reward_functions=[("has_seven", has_seven, 1.0)],
        **kwargs,
    )


def write_sft_run(folder: Path, rows: list[dict], *, batch_size: int, lr: float, steps: int, save_every: int = 0) -> Path:
    """A `grpokit sft` config in ``folder`` (made with a tiny model and ``rows`` as train.jsonl) for CPU runs
    of ``steps`` steps, checkpoints every ``save_every`` (0: at the end only); returns the YAML's path."""
    model = save_tiny_model(folder / "model")
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = folder / "sft.yaml"
    cfg.write_text(
        f"model: {{name_or_path: {model}, device: cpu}}\n"
        f"data: {{train: {data}, template: plain, max_length: 64}}\n"
        f"sft: {{batch_size: {batch_size}}}\noptim: {{lr: {lr}, micro_batch_size: 1}}\n"
        f"train: {{steps: {steps}, save_every: {save_every}, tensorboard: false}}\n"
    )
    return cfg

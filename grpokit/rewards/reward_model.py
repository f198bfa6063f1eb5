"""Learned rewards: an outcome reward model (`reward_model`) and a process reward model
(`process_reward_model`), both built in and named in the config by kind, with the model's folder
as a parameter:

    rewards:
      - name: reward_model               # AutoModelForSequenceClassification, num_labels = 1
        kwargs: {path: models/my-rm, batch_size: 16}
        weight: 0.5
      - name: math_accuracy              # combinable with verifiers, by weight
      - name: process_reward_model       # a PRM: scores each step (grpokit.rewards.process)
        kwargs: {path: models/my-prm, step_separator: "\\n"}

(A folder named directly as a reward is refused with a message pointing at these entries: a metric
key must not hold a path.) Each model is loaded once, when the reward entry is resolved (before the
policy loads), with its own tokenizer, in its own dtype (dtype "auto": as saved), on `device`
("auto": the GPU when there is one, as the policy's model.device=auto), frozen, in eval mode; it
scores the batch's (prompt, completion) pairs `batch_size` at a time under torch.inference_mode.
The functions are marked `in_process = True`: the RewardRunner calls them in the trainer's own
process (a GPU model cannot run in a forked worker, and it would load again there), with no time limit.

Input text: for a prompt given as chat messages, and a tokenizer with a chat template, the
conversation prompt + [assistant: completion] through the reward model's own template (the PRM: the
prompt with the generation prompt, then the completion); otherwise prompt + completion as plain text.
The messages' and the completion's text is data (grpokit.core.chat_text): chat markers typed in a
completion ("<|im_end|><|im_start|>user ...") are tokenized as characters, never as turn boundaries.

Padding rule: rows are padded on the right with the tokenizer's pad token; a tokenizer without one
takes the model config's pad_token_id; with neither the entry is refused (a classifier finds the last
token of a padded row by its pad id; guessing EOS would read the score one token early when the text
ends with EOS).

The process reward model, Math-Shepherd style (arXiv 2312.08935): the completion is split into steps
after each `step_separator` (`grpokit.rewards.process.step_ends`); `step_tag`, when given (e.g. " ки"),
is appended to each step's text in the model's input. Each step's score is read at the token holding
the step's last character (the tag's when there is one):
  - a token-classification model: softmax(logits)[positive_label] (sigmoid of the logit if num_labels 1);
  - a causal LM: P(good_token) over {good_token, bad_token} from that position's next-token logits
    (Math-Shepherd: "+" / "-").
It returns [(char_end, score)] per completion (a step's char_end in the completion's own text).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from grpokit.core.chat_text import encode_pieces, encode_pieces_with_offsets, render_pieces
from grpokit.rewards.process import step_ends
from grpokit.scoring.completions import is_conversational, to_text

SEQUENCE, TOKEN, CAUSAL = "ForSequenceClassification", "ForTokenClassification", "ForCausalLM"


def _load(path: str, kinds: tuple[str, ...], what: str, device: str, dtype: str):
    """(model, tokenizer, kind) from `path`, refusing a model of another kind or a tokenizer without a pad."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from grpokit.model.loading import pick_device

    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"{path} is not a model folder (no config.json there); give the folder of a {what}")
    config = AutoConfig.from_pretrained(folder)
    archs = list(getattr(config, "architectures", None) or [])
    kind = next((k for k in kinds if any(a.endswith(k) for a in archs)), None)
    if kind is None:
        raise ValueError(
            f"{path} holds a {archs[0] if archs else 'model of unknown architecture'} (config.json "
            f"architectures); a {what} is needed (an architecture ending in {' or '.join(kinds)})"
        )
    if kind == SEQUENCE and config.num_labels != 1:
        raise ValueError(
            f"{path}: a reward model gives one score per text (num_labels = 1); this one has "
            f"num_labels = {config.num_labels}"
        )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        if config.pad_token_id is None:
            raise ValueError(
                f"{path}: its tokenizer has no pad token and its config.json no pad_token_id, so padded rows "
                "cannot be scored; set a pad token that never appears in text (tokenizer.pad_token = ..., "
                "config.pad_token_id = its id) and save the folder again"
            )
        tokenizer.pad_token_id = config.pad_token_id
    config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"
    if kind != SEQUENCE and not tokenizer.is_fast:
        raise ValueError(f"{path}: a process reward model needs a fast tokenizer (character offsets)")
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    cls = {
        SEQUENCE: AutoModelForSequenceClassification,
        TOKEN: AutoModelForTokenClassification,
        CAUSAL: AutoModelForCausalLM,
    }[kind]
    model = cls.from_pretrained(folder, config=config, dtype=dtype)
    model.to(pick_device(device)).eval().requires_grad_(False)
    return model, tokenizer, kind


def _right_padded(rows: list[list[int]], pad_id: int):
    """(input_ids, attention_mask), each (B, T), the rows padded on the right with ``pad_id``."""
    import torch

    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[b, : len(r)] = 1
    return ids, mask


def _batches(n: int, size: int):
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def make_reward_model(
    path: str, batch_size: int = 8, max_length: int | None = None, device: str = "auto", dtype: str = "auto"
) -> Callable:
    """The outcome reward of the sequence-classification model in `path` (see the module docstring).
    max_length: longer inputs lose their beginning (the score is read at the end); None = the
    tokenizer's model_max_length when it is set sensibly, else no limit."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: expected a positive integer, e.g. 8")
    model, tokenizer, _ = _load(path, (SEQUENCE,), "sequence-classification reward model", device, dtype)
    tokenizer.truncation_side = "left"
    limit = max_length or (tokenizer.model_max_length if tokenizer.model_max_length < 1_000_000 else None)
    device_ = next(model.parameters()).device

    def ids_of(prompt, completion) -> list[int]:
        """The model's input ids: the template's markers as special tokens, every text as plain text."""
        answer = to_text(completion)
        if is_conversational(prompt) and tokenizer.chat_template:
            messages = [*prompt, {"role": "assistant", "content": answer}]
            ids = encode_pieces(tokenizer, render_pieces(tokenizer, messages))
        else:
            ids, _ = encode_pieces_with_offsets(
                tokenizer, [(to_text(prompt) + answer, True)], add_special_tokens=True
            )
        return ids[-limit:] if limit else ids  # longer inputs lose their beginning

    def reward_model(prompts, completions, **kwargs) -> list[float]:
        import torch  # here, not at the top: grpokit.rewards imports without torch (the sandbox)

        encoded = [ids_of(p, c) for p, c in zip(prompts, completions)]
        scores: list[float] = []
        for rows in _batches(len(encoded), batch_size):
            input_ids, mask = _right_padded([encoded[i] for i in rows], tokenizer.pad_token_id)
            with torch.inference_mode():
                logits = model(input_ids=input_ids.to(device_), attention_mask=mask.to(device_)).logits
            scores += logits[:, 0].float().tolist()  # (B,)
        return scores

    reward_model.in_process = True
    reward_model.model, reward_model.tokenizer = model, tokenizer
    return reward_model


def make_process_reward_model(
    path: str,
    step_separator: str = "\n",
    step_tag: str | None = None,
    good_token: str = "+",
    bad_token: str = "-",
    positive_label: int = 1,
    batch_size: int = 8,
    device: str = "auto",
    dtype: str = "auto",
) -> Callable:
    """The process reward of the token-classification model or causal LM in `path` (module docstring)."""
    if not step_separator:
        raise ValueError("step_separator must not be empty, e.g. '\\n'")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: expected a positive integer, e.g. 8")
    model, tokenizer, kind = _load(
        path, (TOKEN, CAUSAL), "process reward model (token classification or causal LM)", device, dtype
    )
    device_ = next(model.parameters()).device
    if kind == CAUSAL:
        pair = []
        for name, token in (("good_token", good_token), ("bad_token", bad_token)):
            ids = tokenizer(token, add_special_tokens=False).input_ids
            if len(ids) != 1:
                raise ValueError(
                    f"{name}={token!r} is {len(ids)} tokens in {path}'s tokenizer; it must be one"
                )
            pair += ids
    elif model.config.num_labels > 1 and not 0 <= positive_label < model.config.num_labels:
        raise ValueError(f"positive_label={positive_label} but {path} has {model.config.num_labels} labels")

    def encode(prompt, completion) -> tuple[list[int], list[tuple[int, int]], list[int], list[int]]:
        """(input ids, their character offsets, each step's end offset in the input text, each step's
        char_end in the completion); the texts as data, the template's markers and the step tag not."""
        answer = to_text(completion)
        if is_conversational(prompt) and tokenizer.chat_template:
            pieces = render_pieces(tokenizer, list(prompt), add_generation_prompt=True)
        else:
            pieces = [(to_text(prompt), True)]
        length = sum(len(text) for text, _ in pieces)
        ends, at, start = [], [], 0
        for end in step_ends(answer, step_separator):
            pieces += [(answer[start:end], True), (step_tag or "", False)]
            length += end - start + len(step_tag or "")
            at.append(length)
            ends.append(end)
            start = end
        ids, offsets = encode_pieces_with_offsets(tokenizer, pieces, add_special_tokens=True)
        return ids, offsets, at, ends

    def process_reward_model(prompts, completions, **kwargs) -> list[list[tuple[int, float]]]:
        import torch  # here, not at the top: grpokit.rewards imports without torch (the sandbox)

        encoded = [encode(p, c) for p, c in zip(prompts, completions)]
        out: list[list[tuple[int, float]]] = []
        for rows in _batches(len(encoded), batch_size):
            input_ids, mask = _right_padded([encoded[i][0] for i in rows], tokenizer.pad_token_id)
            offsets = [encoded[i][1] for i in rows]  # (B, T_b, 2)
            with torch.inference_mode():
                logits = model(input_ids=input_ids.to(device_), attention_mask=mask.to(device_)).logits
            if kind == CAUSAL:
                probs = logits[..., pair].float().softmax(-1)[..., 0]  # (B, T) P(good)
            elif logits.shape[-1] == 1:
                probs = logits[..., 0].float().sigmoid()  # (B, T)
            else:
                probs = logits.float().softmax(-1)[..., positive_label]  # (B, T)
            for b, i in enumerate(rows):
                _, _, at, ends = encoded[i]
                spans = offsets[b]
                steps = []
                for position, end in zip(at, ends):
                    # the token holding character position-1 of the input: the step's last character
                    t = next((t for t, (s, e) in enumerate(spans) if s < position <= e), None)
                    if t is None:
                        raise ValueError(f"no token of the PRM input holds the end of the step at {end}")
                    steps.append((end, float(probs[b, t])))
                out.append(steps)
        return out

    process_reward_model.in_process = True
    process_reward_model.step_rewards = True
    process_reward_model.model, process_reward_model.tokenizer = model, tokenizer
    return process_reward_model


make_reward_model._grpokit_factory = True
make_process_reward_model._grpokit_factory = True

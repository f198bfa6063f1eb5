"""The SFT trainer (grpokit.trainers.sft) on tiny real transformers: its gradient against a naive full-logits oracle
(whatever the micro-batch split, packed or padded), exact resume, held-out loss and accuracy, the CLI."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from tiny_model import make_tiny_model, save_tiny_model

from grpokit.config.sft import load_sft_config
from grpokit.data.sft import collate
from grpokit.model.logprobs import token_logprobs
from grpokit.trainers.sft import SFTTrainer

ROWS = [
    {"prompt": f"{a}+{b}=", "completion": str(a + b), "answer": str(a + b)}
    for a, b in [(1, 2), (3, 4), (5, 5), (9, 8), (2, 7), (6, 1), (4, 4), (8, 3)]
]
CHAT_ROWS = [
    {"messages": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}]},
    {"messages": [{"role": "user", "content": "e"}, {"role": "assistant", "content": "f"},
                  {"role": "user", "content": "gh"}, {"role": "assistant", "content": "ijk"}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "yz"}]},
]  # fmt: skip


def trainer(tmp_path, *overrides, rows=ROWS, eval_rows=None, name="run", **kwargs):
    cfg = load_sft_config(
        None,
        [
            f"train.output_dir={tmp_path / name}",
            "train.steps=2",
            "train.tensorboard=false",
            "sft.batch_size=8",
            "optim.lr=1e-2",
            "data.template=plain",
            *overrides,
        ],
    )
    model, tok = make_tiny_model("qwen2", seed=0)
    return SFTTrainer(cfg, model=model, tokenizer=tok, train_rows=rows, eval_rows=eval_rows or [], **kwargs)


def first_step_gradient(t: SFTTrainer) -> dict[str, torch.Tensor]:
    """The gradient the trainer's first optimizer step applies (read just before it is applied)."""
    grads: dict[str, torch.Tensor] = {}
    apply = t.learner.clip_and_step

    def spy(finite, step=0, label="update"):
        if not grads:
            grads.update({n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None})
        return apply(finite, step, label)

    t.learner.clip_and_step = spy
    t.train_step()
    return grads


def oracle_gradient(t: SFTTrainer, indices: list[int]) -> dict[str, torch.Tensor]:
    """Naive: the full logits of the whole padded batch, log_softmax, the mean NLL of the masked tokens."""
    model, _ = make_tiny_model("qwen2", seed=0)
    model.train()
    batch = collate([t.examples[i] for i in indices], 0, packing=False)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (N, L, V)
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["loss_mask"][:, 1:].float()  # (N, L-1): token t+1 predicted at t
    (-(logp * mask).sum() / mask.sum()).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_token_logprobs_match_full_logits_padded_and_packed():
    model, _ = make_tiny_model("qwen2", seed=1)
    a, b = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[10, 11, 12]])
    ma, mb = torch.tensor([[0, 1, 0, 1, 1]]), torch.tensor([[0, 0, 1]])

    def naive(ids, mask):
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        return logp[mask[0, 1:].bool()]

    expected = torch.cat([naive(a, ma), naive(b, mb)])  # 3 + 1 trained tokens
    padded = token_logprobs(
        model,
        torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]]),
        torch.tensor([[0, 1, 0, 1, 1], [0, 0, 1, 0, 0]]),
        attention_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        chunk_size=2,
    )
    packed = token_logprobs(
        model, torch.cat([a, b], 1), torch.cat([ma, mb], 1), position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    )
    torch.testing.assert_close(padded, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "rows, overrides",
    [(ROWS, ["optim.micro_batch_size=1"]), (ROWS, ["optim.micro_batch_size=3", "sft.packing=true"]),
     (CHAT_ROWS, ["optim.micro_batch_size=auto"]), (CHAT_ROWS, ["optim.micro_batch_size=2"]),
     (CHAT_ROWS, ["sft.packing=true"])],
    ids=["plain-micro1", "plain-packed-micro3", "chat-auto", "chat-micro2", "chat-packed"],
)  # fmt: skip
def test_gradient_is_the_whole_batch_mean_nll_whatever_the_split(tmp_path, overrides, rows):
    t = trainer(tmp_path, *overrides, f"sft.batch_size={len(rows)}", "data.shuffle=false", "data.template=auto", rows=rows)
    got = first_step_gradient(t)
    want = oracle_gradient(t, list(range(len(rows))))
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=2e-6, rtol=1e-4, msg=name)


def test_sigterm_stops_with_a_checkpoint_and_resume_continues_bit_exactly(tmp_path):
    straight = trainer(tmp_path, "train.steps=4", "sft.batch_size=3", name="straight")
    straight.train()

    def sigterm_at_step_2(step, metrics, t):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    first = trainer(tmp_path, "train.steps=4", "sft.batch_size=3", name="legs", callbacks=[sigterm_at_step_2])
    stopped = first.train()
    assert stopped["stopped_by"] == "SIGTERM" and stopped["steps"] == 2
    assert stopped["checkpoint"].endswith("step_000002") and not (tmp_path / "legs" / "summary.json").exists()
    second = trainer(tmp_path, "train.steps=4", "sft.batch_size=3", name="legs", resume=True)
    assert second.step == 2 and second.stream.state() == first.stream.state()
    assert second.train()["steps"] == 4
    for (name, p), q in zip(straight.model.named_parameters(), second.model.parameters()):
        assert torch.equal(p, q), name
    assert straight.stream.state() == second.stream.state()
    lines = lambda run: [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert [x["step"] for x in lines("legs")] == [1, 2, 3, 4]
    for a, b in zip(lines("straight"), lines("legs")):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]


def test_lora_run_ends_in_a_plain_model_folder_with_the_adapter_merged(tmp_path):
    t = trainer(tmp_path, "lora.enabled=true", "lora.target_modules=[q_proj,v_proj]", "train.steps=1", "sft.batch_size=4")
    summary = t.train()
    assert summary["adapter_checkpoint"].endswith("step_000001") and summary["checkpoint"] == str(tmp_path / "run" / "model")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(summary["checkpoint"])  # config.json, no adapter
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    t.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, t.model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(merged(ids).logits, make_tiny_model("qwen2", seed=0)[0](ids).logits)  # it trained


def test_held_out_loss_is_the_mean_nll_of_the_trained_tokens(tmp_path):
    t = trainer(tmp_path, rows=ROWS, eval_rows=ROWS[:5])
    model, _ = make_tiny_model("qwen2", seed=0)
    batch = collate(t.eval_examples, 0, packing=False)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["loss_mask"][:, 1:].float()
    result = t.eval_loss()
    assert result["tokens"] == mask.sum() == 7 + 5  # the completions 3, 7, 10, 17, 9: 7 digits, and 5 EOS
    assert result["loss"] == pytest.approx(float(-(logp * mask).sum() / mask.sum()), rel=1e-5)


def test_cli_runs_writes_the_contract_and_accuracy_matches_grpokit_eval(tmp_path, capsys):
    from grpokit.cli.main import main

    model_dir = save_tiny_model(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"model: {{name_or_path: {model_dir}}}\n"
        f"data: {{train: {data}, eval: {data}, template: plain, max_length: 64}}\n"
        "sft: {batch_size: 4}\noptim: {lr: 1.0e-2}\ntrain: {steps: 3, tensorboard: false}\n"
        "rewards: [{name: math_accuracy}]\neval: {num_samples: 1, max_new_tokens: 4}\n"
    )
    reward = tmp_path / "digits.py"  # a verifier whose score varies with what the tiny model writes
    reward.write_text("def leading_digit(prompts, completions, **kw):\n    return [float(c[:1].isdigit()) for c in completions]\n")
    config.write_text(config.read_text().replace("{name: math_accuracy}", f"{{name: '{reward}:leading_digit'}}"))
    out = tmp_path / "out"
    assert main(["sft", str(config), "--output-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and (out / "config.yaml").is_file() and (out / "metrics.jsonl").is_file()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(summary["checkpoint"])  # a Hugging Face model folder
    capsys.readouterr()
    args = ["eval", summary["checkpoint"], str(data), "--template", "plain", "--max-new-tokens", "4", "--num-samples", "1"]
    assert main([*args, "--reward", f"{reward}:leading_digit"]) == 0
    reported = json.loads(capsys.readouterr().out)
    assert summary["eval_accuracy_before"] < summary["eval_after"]["accuracy"] == reported["accuracy"]
    assert summary["eval_after"]["greedy_score"] == reported["greedy_score"]
    # a second run into the same folder is a usage error before the model loads; so is a bad row
    assert main(["sft", str(config), "--output-dir", str(out)]) == 2
    data.write_text(json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    assert main(["sft", str(config), "--output-dir", str(tmp_path / "bad")]) == 2
    assert "train.jsonl, row index 1: no 'completion' field" in capsys.readouterr().err


def test_a_callback_that_raises_stops_the_run_with_a_checkpoint(tmp_path):
    from grpokit.core.errors import TrainingError

    def give_up(step, metrics, t):
        if step == 1:
            raise RuntimeError(f"loss {metrics['loss']:.1f} too high")

    t = trainer(tmp_path, "train.steps=3", "sft.batch_size=2", callbacks=[give_up])
    with pytest.raises(TrainingError, match=r"callback .*give_up stopped the run at step 1: RuntimeError: loss .* too high"):
        t.train()
    assert (tmp_path / "run" / "checkpoints" / "step_000001" / "trainer_state.pt").is_file()


def test_overwrite_replaces_the_run_once_the_new_one_has_a_step(tmp_path):
    from grpokit.config.schema import ConfigError

    trainer(tmp_path, "train.steps=2", "sft.batch_size=2").train()
    with pytest.raises(ConfigError, match="already holds a run"):
        trainer(tmp_path, "train.steps=1", "sft.batch_size=2")
    trainer(tmp_path, "train.steps=1", "sft.batch_size=2", overwrite=True).train()
    run = tmp_path / "run"
    assert not (run / ".replaced").exists() and len((run / "metrics.jsonl").read_text().splitlines()) == 1
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]

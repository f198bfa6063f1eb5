"""TRL's SFTTrainer call runs as written (grpokit.compat.trl.sft_call, grpokit.config.trl_sft): TRL's quickstart with
the import swapped, one step beside TRL's own SFTTrainer (the same loss and the same weights after it), the
SFTConfig fields mapped and refused by name, formatting_func, and sft.loss_on=trl (TRL's default loss tokens)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from tiny_model import make_tiny_model, save_tiny_model

from grpokit.config.sft import SFTDataConfig
from grpokit.core.errors import ConfigError
from grpokit.data.sft import encode_example

datasets = pytest.importorskip(
    "datasets", reason="TRL's call takes datasets.Dataset: pip install 'grpokit[dev]'"
)

ADDITIONS = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(4) for b in range(2)]
CONVERSATIONS = [
    {
        "messages": [
            {"role": "user", "content": r["prompt"]},
            {"role": "assistant", "content": r["completion"]},
        ]
    }
    for r in ADDITIONS
]


def trl_sft_args(out, **kw):
    """A trl.SFTConfig for one CPU step over the 8 rows at once (TRL's bf16 default needs a GPU)."""
    trl = pytest.importorskip("trl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trl.SFTConfig(
            output_dir=str(out), max_steps=1, per_device_train_batch_size=8, learning_rate=1e-2, logging_steps=1,
            report_to="none", use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, **kw,
        )  # fmt: skip


def test_trls_sft_quickstart_runs_unchanged_with_the_import_swapped(tmp_path, monkeypatch):
    """TRL's quickstart: SFTTrainer(model=..., train_dataset=...).train() with no args: TRL's SFTConfig defaults
    (3 epochs of batches of 8, lr 2e-5, AdamW beta2 0.999, the linear schedule, seed 42, trainer_output/)."""
    from transformers import AutoModelForCausalLM

    from grpokit.trainers.sft import SFTTrainer

    model_dir = save_tiny_model(tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    trainer = SFTTrainer(model=str(model_dir), train_dataset=datasets.Dataset.from_list(ADDITIONS))
    result = trainer.train()
    c = trainer.cfg
    assert (c.optim.lr, c.optim.adam_beta2, c.optim.schedule, c.train.seed) == (2e-5, 0.999, "linear", 42)
    assert (c.sft.batch_size, c.sft.loss_on, c.data.max_length, c.data.truncate) == (8, "trl", 1024, True)
    assert result.global_step == 3 and trainer.state.epoch == 3.0  # 3 epochs x 8 rows / 8 a step
    assert (tmp_path / "trainer_output" / "summary.json").is_file()
    saved = trainer.save_model()
    reloaded = AutoModelForCausalLM.from_pretrained(saved)
    for name, weight in trainer.model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], weight)


@pytest.mark.parametrize("rows", [ADDITIONS, CONVERSATIONS], ids=["prompt_completion", "messages"])
def test_one_step_is_trls_sfttrainers_step(tmp_path, rows):
    """The same args and dataset to TRL's SFTTrainer and to grpokit's: the same first loss and the same weights
    after the step (lr 1e-2 moves them by 1e-2; they agree to 1e-5). Prompt/completion rows train on the
    completion and its EOS, conversations on every token (TRL's default; sft.loss_on=trl)."""
    trl = pytest.importorskip("trl")
    from transformers import AutoTokenizer

    from grpokit.trainers.sft import SFTTrainer

    model_dir = save_tiny_model(tmp_path / "model")
    dataset = datasets.Dataset.from_list(rows)
    theirs = trl.SFTTrainer(model=str(model_dir), args=trl_sft_args(tmp_path / "trl"), train_dataset=dataset,
                            processing_class=AutoTokenizer.from_pretrained(model_dir))  # fmt: skip
    theirs.train()
    ours = SFTTrainer(model=str(model_dir), args=trl_sft_args(tmp_path / "ours"), train_dataset=dataset)
    ours.train()
    assert ours.log_history[0]["loss"] == pytest.approx(theirs.state.log_history[0]["loss"], rel=1e-5)
    for key in ("num_tokens", "learning_rate"):  # TRL's names, TRL's numbers
        assert ours.log_history[0][key] == pytest.approx(theirs.state.log_history[0][key], rel=1e-6), key
    assert ours.log_history[0]["entropy"] == pytest.approx(theirs.state.log_history[0]["entropy"], rel=1e-5)
    before = make_tiny_model("qwen2", seed=0)[0].state_dict()
    for name, weight in theirs.model.state_dict().items():
        assert float((weight - before[name]).abs().max()) > 1e-3  # the step moved it: the comparison can fail
        torch.testing.assert_close(ours.model.state_dict()[name].float(), weight.float(), rtol=0, atol=1e-5)


def test_token_accuracy_and_entropy_are_trls_at_every_step(tmp_path):
    """TRL's ``mean_token_accuracy`` and ``entropy`` (the step's trained tokens, as the model scored them before the
    step's update) equal TRL SFTTrainer's at each of 5 steps over the 8 rows, and evaluate()'s ``eval_`` ones after;
    the random model hits no token at first and some later, so the accuracy comparison can fail."""
    trl = pytest.importorskip("trl")
    from transformers import AutoTokenizer

    from grpokit.trainers.sft import SFTTrainer

    model_dir = save_tiny_model(tmp_path / "model")
    dataset = datasets.Dataset.from_list(CONVERSATIONS)
    args = {"max_steps": 5, "learning_rate": 3e-2}  # each step all 8 rows: the same batches on both sides
    theirs = trl.SFTTrainer(model=str(model_dir), args=dataclasses.replace(trl_sft_args(tmp_path / "trl"), **args),
                            train_dataset=dataset, eval_dataset=dataset,
                            processing_class=AutoTokenizer.from_pretrained(model_dir))  # fmt: skip
    theirs.train()
    trl_eval = theirs.evaluate()
    ours = SFTTrainer(model=str(model_dir), args=dataclasses.replace(trl_sft_args(tmp_path / "ours"), **args),
                      train_dataset=dataset, eval_dataset=dataset)  # fmt: skip
    ours.train()
    trl_steps = [e for e in theirs.state.log_history if "mean_token_accuracy" in e]
    assert len(ours.log_history) == len(trl_steps) == 5
    for step, (mine, trls) in enumerate(zip(ours.log_history, trl_steps, strict=True)):
        for key in ("mean_token_accuracy", "entropy"):
            assert mine[key] == pytest.approx(trls[key], rel=1e-4, abs=1e-6), (step, key)
    accuracies = [e["mean_token_accuracy"] for e in ours.log_history]
    assert accuracies[0] < max(accuracies) < 1, accuracies
    ours_eval = ours.evaluate()
    for key in ("eval_loss", "eval_mean_token_accuracy", "eval_entropy"):
        assert ours_eval[key] == pytest.approx(trl_eval[key], rel=1e-4), key


def test_sftconfig_fields_map_and_the_defaults_table_is_trls():
    trl = pytest.importorskip("trl")
    from grpokit.config.trl_fields import _default
    from grpokit.config.trl_sft import SFT_DEFAULTS, from_trl_sft

    declared = {f.name: _default(f) for f in dataclasses.fields(trl.SFTConfig)}
    assert {k: declared[k] for k in SFT_DEFAULTS if k != "output_dir"} == {
        k: v for k, v in SFT_DEFAULTS.items() if k != "output_dir"
    }  # output_dir: declared None, "trainer_output" after __post_init__ (what SFT_DEFAULTS holds)
    values, notes = from_trl_sft(
        trl_sft_args("out", gradient_accumulation_steps=2, per_device_eval_batch_size=2, max_length=64, packing=True,
                     assistant_only_loss=True, dataset_text_field="body", warmup_steps=3, weight_decay=0.1,
                     save_steps=4, save_total_limit=2, eval_strategy="steps", eval_steps=5, seed=7)
    )  # fmt: skip
    assert values["sft"] == {"batch_size": 16, "loss_on": "auto", "packing": True}
    assert values["data"] == {"max_length": 64, "truncate": True, "text_column": "body"}
    o = values["optim"]
    assert (o["lr"], o["micro_batch_size"], o["warmup_steps"], o["weight_decay"], o["schedule"]) == (
        1e-2,
        8,
        3,
        0.1,
        "linear",
    )
    t = values["train"]
    assert (t["steps"], t["seed"], t["save_every"], t["keep_checkpoints"], values["eval"]["every"]) == (
        1,
        7,
        0,
        2,
        5,
    )
    assert any("sft.batch_size=16" in n for n in notes)
    assert from_trl_sft({"completion_only_loss": False})[0]["sft"]["loss_on"] == "all"


def test_the_batch_counts_every_process_under_torchrun(monkeypatch):
    """TRL's optimizer step is per_device_train_batch_size x accumulation x processes; sft.batch_size counts all of
    them (WORLD_SIZE, as torchrun sets it), micro-batches stay per device."""
    from grpokit.config.trl_sft import from_trl_sft

    monkeypatch.setenv("WORLD_SIZE", "4")
    values, _ = from_trl_sft({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3})
    assert (values["sft"]["batch_size"], values["optim"]["micro_batch_size"]) == (24, 2)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"loss_type": "dft"}, "TRL loss_type='dft' is not supported"),
        ({"truncation_mode": "keep_end"}, "truncation_mode='keep_end'"),
        ({"packing": True, "packing_strategy": "wrapped"}, "packing_strategy='wrapped'"),
        ({"completion_only_loss": False, "assistant_only_loss": True}, "has no grpokit setting"),
        ({"eos_token": "<|im_end|>"}, "TRL eos_token='<|im_end|>' is not supported"),
        ({"max_length": 0}, "TRL max_length=0: must be at least 1"),
        ({"num_generations": 8}, "have no grpokit equivalent (known: every mapped SFTConfig field"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(fields, message):
    from grpokit.config.trl_sft import from_trl_sft

    with pytest.raises(ConfigError) as error:
        from_trl_sft(fields)
    assert message in str(error.value)


def test_trainer_keywords_it_cannot_honour_are_refused_and_formatting_func_makes_text_rows(tmp_path):
    from grpokit.trainers.sft import SFTTrainer

    model_dir = str(save_tiny_model(tmp_path / "model"))
    dataset = datasets.Dataset.from_list(ADDITIONS)
    with pytest.raises(ConfigError, match=r"SFTTrainer\(data_collator=...\) is not taken"):
        SFTTrainer(model=model_dir, train_dataset=dataset, data_collator=object())
    with pytest.raises(ConfigError, match="unknown keyword train_datset=; did you mean train_dataset="):
        SFTTrainer(model=model_dir, train_datset=dataset)
    from grpokit.trainers.grpo import GRPOTrainer

    with pytest.raises(ConfigError, match="GRPOTrainer got TRL's SFTConfig; give a trl.GRPOConfig"):
        GRPOTrainer(model=model_dir, args=type("SFTConfig", (), {"to_dict": dict})())
    with pytest.raises(ConfigError, match="got TRL's GRPOConfig"):
        SFTTrainer(model=model_dir, train_dataset=dataset, args=type("GRPOConfig", (), {"to_dict": dict})())
    with pytest.raises(ConfigError, match=r"train_dataset, row index 0: formatting_func returned int"):
        SFTTrainer(model=model_dir, train_dataset=dataset, formatting_func=lambda row: 3)
    trainer = SFTTrainer(
        model_dir, args={"output_dir": str(tmp_path / "run"), "max_steps": 1, "report_to": "none"},
        train_dataset=dataset, formatting_func=lambda row: f"Q: {row['prompt']} A: {row['completion']}",
    )  # fmt: skip
    assert trainer.train_rows[0] == {"text": "Q: 0+0= A: 0"}
    assert all(e.num_loss_tokens == len(e.input_ids) - 1 for e in trainer.examples)  # text rows: every token


def test_loss_on_trl_is_the_completion_of_prompt_completion_rows_and_every_token_of_a_conversation():
    _, tok = make_tiny_model("qwen2", seed=0)
    data = SFTDataConfig(template="plain")
    masks = {
        (fmt, on): encode_example(row, fmt, tok, data, on).loss_mask
        for fmt, row in (("prompt_completion", ADDITIONS[5]), ("messages", CONVERSATIONS[5]))
        for on in ("auto", "all", "trl")
    }
    assert (
        masks["prompt_completion", "trl"]
        == masks["prompt_completion", "auto"]
        != masks["prompt_completion", "all"]
    )
    assert masks["messages", "trl"] == masks["messages", "all"] != masks["messages", "auto"]
    assert masks["messages", "all"] == [0] + [1] * (len(masks["messages", "all"]) - 1)


def test_a_flat_trl_sftconfig_file_trains_from_the_cli(tmp_path, capsys):
    """`grpokit sft trl_sft.yaml`: a TRL SFTConfig file (with TRL scripts' model_name_or_path / dataset_name) is
    converted, its notes printed; the run trains with TRL's settings, and a field grpokit cannot honour is a usage
    error naming the file and the field."""
    import json

    from grpokit.cli.main import main
    from grpokit.config.sft import load_sft_config

    model_dir = save_tiny_model(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ADDITIONS))
    config = tmp_path / "trl_sft.yaml"
    config.write_text(
        f"model_name_or_path: {model_dir}\ndataset_name: {data}\nlearning_rate: 1.0e-2\nmax_steps: 2\n"
        "per_device_train_batch_size: 4\nmax_length: 64\nreport_to: none\ngradient_checkpointing: false\n"
    )
    cfg = load_sft_config(config, ["train.tensorboard=false"])
    assert (cfg.model.name_or_path, cfg.data.train, cfg.optim.lr, cfg.optim.adam_beta2) == (
        str(model_dir),
        str(data),
        1e-2,
        0.999,
    )
    assert (cfg.sft.batch_size, cfg.sft.loss_on, cfg.train.steps, cfg.train.seed) == (4, "trl", 2, 42)
    out = tmp_path / "out"
    assert main(["sft", str(config), "--output-dir", str(out)]) == 0
    assert "holds TRL SFTConfig fields; converted" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    # grpokit config --from-trl prints the SFT config it becomes, which grpokit sft loads back
    assert main(["config", "--from-trl", str(config)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"# converted from TRL's SFTConfig in {config} (grpokit.config.trl_sft)")
    converted = tmp_path / "converted.yaml"
    converted.write_text(printed)
    again = load_sft_config(converted, ["train.tensorboard=false"])
    assert (again.data.max_length, again.sft.batch_size, again.optim.lr) == (64, 4, 1e-2)
    config.write_text(config.read_text() + "loss_type: dft\n")
    assert main(["sft", str(config), "--output-dir", str(tmp_path / "bad")]) == 2
    assert f"{config} (a TRL SFTConfig): TRL loss_type='dft' is not supported" in capsys.readouterr().err


def test_a_peft_config_trains_a_lora_adapter_and_callbacks_get_trls_events(tmp_path):
    """peft_config and a transformers.TrainerCallback, as GRPOTrainer takes them: the run trains a LoRA adapter
    (the base weights untouched), ends in a merged model folder, and the callback sees each step's loss."""
    peft = pytest.importorskip("peft")
    from transformers import TrainerCallback

    from grpokit.trainers.sft import SFTTrainer

    class Losses(TrainerCallback):
        def __init__(self):
            self.seen = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.seen.append((state.global_step, logs["loss"]))

    losses = Losses()
    model_dir = str(save_tiny_model(tmp_path / "model"))
    trainer = SFTTrainer(
        model_dir, args={"output_dir": str(tmp_path / "run"), "max_steps": 2, "learning_rate": 1e-2, "report_to": "none"},
        train_dataset=datasets.Dataset.from_list(ADDITIONS), callbacks=[losses],
        peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )  # fmt: skip
    assert (trainer.cfg.lora.enabled, trainer.cfg.lora.r, trainer.cfg.lora.alpha) == (True, 4, 8)
    summary = trainer.train()
    assert [step for step, _ in losses.seen] == [1, 2] and all(loss > 0 for _, loss in losses.seen)
    base = make_tiny_model("qwen2", seed=0)[0].state_dict()
    trained = {
        k.replace("base_model.model.", "").replace(".base_layer", ""): v
        for k, v in trainer.model.state_dict().items()
    }
    torch.testing.assert_close(
        trained["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(summary["checkpoint"]).state_dict()
    assert (
        float(
            (
                merged["model.layers.0.self_attn.q_proj.weight"]
                - base["model.layers.0.self_attn.q_proj.weight"]
            )
            .abs()
            .max()
        )
        > 0
    )


def test_a_loaded_model_with_processing_class_and_an_eval_dataset_evaluated_every_eval_steps(tmp_path):
    """TRL's other common form: a loaded model, its tokenizer as processing_class, an eval_dataset and
    eval_strategy="steps": the held-out loss is logged every eval_steps and equals eval_loss() at the end."""
    import json

    from grpokit.trainers.sft import SFTTrainer

    model, tok = make_tiny_model("qwen2", seed=0)
    trainer = SFTTrainer(
        model=model, processing_class=tok,
        args={"output_dir": str(tmp_path / "run"), "max_steps": 4, "learning_rate": 1e-2, "report_to": "none",
              "eval_strategy": "steps", "eval_steps": 2, "per_device_train_batch_size": 4},
        train_dataset=datasets.Dataset.from_list(ADDITIONS), eval_dataset=datasets.Dataset.from_list(ADDITIONS[:3]),
    )  # fmt: skip
    assert (trainer.cfg.eval.every, trainer.cfg.sft.batch_size, trainer.model is model) == (2, 4, True)
    trainer.train()
    evals = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert evals[-1]["loss"] == pytest.approx(trainer.eval_loss()["loss"], rel=1e-6)
    assert evals[-1]["loss"] < evals[0]["loss"]  # lr 1e-2 on the same rows: the held-out loss falls


@pytest.mark.parametrize("rows", [ADDITIONS, CONVERSATIONS], ids=["prompt_completion", "messages"])
def test_evaluate_returns_trls_eval_loss_for_its_rows_and_for_an_eval_dataset(tmp_path, rows):
    """``trainer.evaluate()`` as a TRL script reads it: ``eval_loss`` is TRL's SFTTrainer.evaluate()'s on the same
    model and rows (5 rows, one TRL evaluation batch of 8: its batch mean is the token mean), for the trainer's
    eval_dataset and for one given to evaluate(); grpokit's own names stay beside them. (TRL's evaluations run
    first: building a second TrainingArguments resets accelerate's state, which TRL's evaluate() reads.)"""
    trl = pytest.importorskip("trl")
    from transformers import AutoTokenizer

    from grpokit.trainers.sft import SFTTrainer

    model_dir = save_tiny_model(tmp_path / "model")
    held_out, other = datasets.Dataset.from_list(rows[:5]), datasets.Dataset.from_list(rows[5:])
    train = datasets.Dataset.from_list(rows)
    theirs = trl.SFTTrainer(model=str(model_dir), args=trl_sft_args(tmp_path / "trl"), train_dataset=train,
                            eval_dataset=held_out, processing_class=AutoTokenizer.from_pretrained(model_dir))  # fmt: skip
    trl_held_out, trl_other = theirs.evaluate(), theirs.evaluate(eval_dataset=other)["eval_loss"]
    ours = SFTTrainer(model=str(model_dir), args=trl_sft_args(tmp_path / "ours"), train_dataset=train,
                      eval_dataset=held_out)  # fmt: skip
    metrics = ours.evaluate()
    for key in ("eval_loss", "eval_mean_token_accuracy", "eval_entropy"):
        assert metrics[key] == pytest.approx(trl_held_out[key], rel=1e-5), key
    assert metrics["eval_loss"] == metrics["loss"] and metrics["eval_perplexity"] == metrics["perplexity"]
    assert metrics["eval_runtime"] > 0 and metrics["eval_samples_per_second"] == pytest.approx(5 / metrics["eval_runtime"])
    assert metrics["epoch"] == 0.0
    given = ours.evaluate(eval_dataset=other, metric_key_prefix="test")
    assert given["test_loss"] == pytest.approx(trl_other, rel=1e-5)
    assert given["test_loss"] != pytest.approx(metrics["eval_loss"], rel=1e-3)  # another set: another loss
    assert given["test_tokens"] < metrics["eval_tokens"] and "eval_loss" not in given


def test_evaluate_formats_an_eval_dataset_with_formatting_func_and_callbacks_see_eval_loss(tmp_path):
    """A TrainerCallback's on_evaluate gets transformers' names (``eval_loss``, as EarlyStoppingCallback reads them)
    at every evaluation of the run, and evaluate(eval_dataset=...) formats its rows with the trainer's
    formatting_func, as the training rows were."""
    from transformers import TrainerCallback

    from grpokit.trainers.sft import SFTTrainer

    class Seen(TrainerCallback):
        def __init__(self):
            self.evaluations = []

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            self.evaluations.append((state.global_step, metrics["eval_loss"]))

    seen = Seen()
    raw = [{"question": r["prompt"], "answer": r["completion"]} for r in ADDITIONS]
    trainer = SFTTrainer(
        str(save_tiny_model(tmp_path / "model")), callbacks=[seen],
        args={"output_dir": str(tmp_path / "run"), "max_steps": 2, "learning_rate": 1e-2, "report_to": "none",
              "eval_strategy": "steps", "eval_steps": 1},
        train_dataset=datasets.Dataset.from_list(raw), eval_dataset=datasets.Dataset.from_list(raw[:4]),
        formatting_func=lambda row: f"{row['question']}{row['answer']}",
    )  # fmt: skip
    trainer.train()
    assert [step for step, _ in seen.evaluations] == [0, 1, 2]
    assert seen.evaluations[-1][1] == pytest.approx(trainer.evaluate()["eval_loss"], rel=1e-6)
    assert trainer.evaluate(eval_dataset=raw[:4])["eval_loss"] == pytest.approx(seen.evaluations[-1][1], rel=1e-6)
    with pytest.raises(KeyError, match="question"):
        trainer.evaluate(eval_dataset=[{"text": "1+1=2"}])  # formatted like the training rows, or not at all
    bare = SFTTrainer(str(tmp_path / "model"), args={"output_dir": str(tmp_path / "bare"), "max_steps": 1,
                                                     "report_to": "none"}, train_dataset=ADDITIONS)  # fmt: skip
    from grpokit.core.errors import ConfigError

    with pytest.raises(ConfigError, match="there are no held-out rows; give eval_dataset"):
        bare.evaluate()  # TRL refuses too ("evaluation requires an eval_dataset"); a loss of 0 would mislead
    assert bare.evaluate(eval_dataset=ADDITIONS[:2])["eval_tokens"] > 0


def test_epoch_strategies_save_and_evaluate_where_trls_own_run_does(tmp_path):
    """save_strategy="epoch" and eval_strategy="epoch" over 8 rows in batches of 3 for 2 epochs: TRL's own run
    saves checkpoint-3 and checkpoint-6 and evaluates at steps 3 and 6; grpokit's saves and evaluates at the same
    steps (and, as always, before training). Before, save_strategy="epoch" saved only the last step."""
    import json

    trl = pytest.importorskip("trl")
    from transformers import AutoTokenizer

    from grpokit.trainers.sft import SFTTrainer

    model_dir = save_tiny_model(tmp_path / "model")
    dataset, held_out = datasets.Dataset.from_list(ADDITIONS), datasets.Dataset.from_list(ADDITIONS[:2])

    def args(out):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return trl.SFTConfig(
                output_dir=str(out), num_train_epochs=2, per_device_train_batch_size=3, save_strategy="epoch",
                eval_strategy="epoch", report_to="none", use_cpu=True, bf16=False, disable_tqdm=True,
            )  # fmt: skip

    theirs = trl.SFTTrainer(model=str(model_dir), args=args(tmp_path / "trl"), train_dataset=dataset,
                            eval_dataset=held_out, processing_class=AutoTokenizer.from_pretrained(model_dir))  # fmt: skip
    theirs.train()
    trl_saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "trl").glob("checkpoint-*"))
    trl_evaluated = [e["step"] for e in theirs.state.log_history if "eval_loss" in e]
    assert (trl_saved, trl_evaluated) == ([3, 6], [3, 6])
    ours = SFTTrainer(model=str(model_dir), args=args(tmp_path / "ours"), train_dataset=dataset, eval_dataset=held_out)
    assert (ours.cfg.train.steps, ours.cfg.train.save_every, ours.cfg.eval.every) == (6, 3, 3)
    ours.train()
    saved = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "ours" / "checkpoints").glob("step_*"))
    evaluated = [json.loads(line)["step"] for line in (tmp_path / "ours" / "eval.jsonl").read_text().splitlines()]
    assert saved == trl_saved and evaluated == [0, *trl_evaluated]


def test_max_length_none_cuts_nothing_and_steps_as_trls_sfttrainer(tmp_path):
    """TRL's max_length=None (no limit): data.max_length null, nothing cut (every example ends in its EOS); one step
    beside TRL's own SFTTrainer gives the same loss (before, max_length=None was refused)."""
    trl = pytest.importorskip("trl")
    from transformers import AutoTokenizer

    from grpokit.config.trl_sft import from_trl_sft
    from grpokit.trainers.sft import SFTTrainer

    values, notes = from_trl_sft({"max_length": None})
    assert values["data"]["max_length"] is None and values["data"]["truncate"] is False
    assert any("max_length=None" in n for n in notes)
    rows = [{"prompt": f"{a}+{b}=" * 6, "completion": str(a + b) * 4} for a in range(4) for b in range(2)]
    model_dir = save_tiny_model(tmp_path / "model")
    dataset = datasets.Dataset.from_list(rows)
    theirs = trl.SFTTrainer(model=str(model_dir), args=trl_sft_args(tmp_path / "trl", max_length=None),
                            train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(model_dir))  # fmt: skip
    theirs.train()
    ours = SFTTrainer(model=str(model_dir), args=trl_sft_args(tmp_path / "ours", max_length=None), train_dataset=dataset)
    eos = ours.tokenizer.eos_token_id
    assert ours.cfg.data.max_length is None and all(e.input_ids[-1] == eos for e in ours.examples)  # none cut
    ours.train()
    assert ours.log_history[0]["loss"] == pytest.approx(theirs.state.log_history[0]["loss"], rel=1e-5)

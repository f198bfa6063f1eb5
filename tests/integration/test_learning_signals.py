"""A run that cannot learn says so (issue: no silent failure), and a checkpoint keeps the tokenizer the
run was given, exactly."""

import json

import pytest
import torch
from tiny_model import make_tiny_model
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from grpokit.config.schema import ConfigError, load_config
from grpokit.core.errors import TrainingError
from grpokit.model.loading import check_tokenizer_fits, load_tokenizer
from grpokit.rewards import resolve_reward
from grpokit.trainers.grpo import GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(6)]


def make_trainer(tmp_path, reward, *extra, model=None, tok=None, eval_rows=None):
    if model is None:
        model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=6",
            "train.samples_every=0",
            "train.tensorboard=false",
            "train.stop_after_flat_steps=3",
            "rollout.group_size=4",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "data.template=plain",
            "model.device=cpu",
            "eval.num_samples=2",
            f"eval.enabled={'true' if eval_rows else 'false'}",
            *extra,
        ],
    )
    return GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, eval_rows=eval_rows, reward_functions=[reward]
    )


def test_constant_reward_run_warns_then_stops_with_the_cause(tmp_path, capfd):
    # The random tiny model never writes \boxed{}: the built-in verifier scores every completion 0.
    reward = ("math_accuracy", resolve_reward("math_accuracy"), 1.0)
    trainer = make_trainer(tmp_path, reward)
    with pytest.raises(TrainingError) as err:
        trainer.train()
    message = str(err.value)
    assert "stopped at step 3" in message and "no group had any reward spread for 3 steps" in message
    assert "Every completion scored 0" in message and "cannot read the answers" in message
    assert "\\boxed{...}" in message and "Sample: prompt" in message and "scores: math_accuracy=0.0" in message
    assert "train.stop_after_flat_steps=0" in message
    assert trainer.step == 2  # the third flat step stops before its (useless) update
    assert "WARNING step 1: no group has any reward spread" in capfd.readouterr().err


def test_prompt_only_reward_names_that_cause(tmp_path):
    def by_prompt(prompts, completions, **kw):
        return [float(len(p) % 2) for p in prompts]  # same for a whole group, differs between prompts

    rows_differ = [{"prompt": p, "answer": "0"} for p in ["1+2=", "10+2="] * 18]
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.stop_after_flat_steps=1",
            "train.tensorboard=false",
            "rollout.group_size=2",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=3",
            "data.template=plain",
            "data.shuffle=false",
            "model.device=cpu",
            "eval.enabled=false",
        ],
    )
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=rows_differ, reward_functions=[("by_prompt", by_prompt, 1.0)]
    )
    with pytest.raises(TrainingError, match="depends on the prompt only"):
        trainer.train_step()


def test_flat_steps_counter_resets_and_zero_disables_the_stop(tmp_path):
    calls = []

    def flat_then_spread(prompts, completions, **kw):
        calls.append(1)
        if len(calls) % 2:  # odd steps flat, even steps with a spread: never 2 flat steps in a row
            return [0.0] * len(completions)
        return [float(i % 2) for i in range(len(completions))]

    trainer = make_trainer(tmp_path / "a", ("alt", flat_then_spread, 1.0), "train.stop_after_flat_steps=2")
    for _ in range(5):
        trainer.train_step()
    assert trainer.step == 5

    def zero(prompts, completions, **kw):
        return [0.0] * len(completions)

    trainer = make_trainer(tmp_path / "b", ("zero", zero, 1.0), "train.stop_after_flat_steps=0")
    for _ in range(5):
        trainer.train_step()
    assert trainer.step == 5 and trainer.sampler.flat_steps == 5


def test_eval_scoring_zero_before_training_warns(tmp_path, capfd):
    reward = ("math_accuracy", resolve_reward("math_accuracy"), 1.0)
    trainer = make_trainer(tmp_path, reward, "train.stop_after_flat_steps=1", eval_rows=ROWS[:3])
    with pytest.raises(TrainingError):
        trainer.train()
    err = capfd.readouterr().err
    assert "WARNING evaluation before training: every held-out row scored 0 with 'math_accuracy'" in err
    assert "Sample: '0+0=' ->" in err


def char_tokenizer() -> PreTrainedTokenizerFast:
    """15 tokens: <pad> <eos> <unk> and 0-9 + =; any other character maps to <unk> (id 2)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate("0123456789+=")}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def test_checkpoint_keeps_the_given_tokenizer_exactly(tmp_path):
    """transformers 5 saves this tokenizer as 'TokenizersBackend'; AutoTokenizer on a qwen2 folder
    would rebuild it as Qwen2Tokenizer, which drops unknown characters instead of mapping them to <unk>."""
    tok = char_tokenizer()
    model_dir = tmp_path / "model"
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, eos_token_id=1, pad_token_id=0,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    probe = "12a+3="
    assert tok(probe).input_ids == [4, 5, 2, 13, 6, 14]

    given = load_tokenizer(str(model_dir))
    assert given(probe).input_ids == [4, 5, 2, 13, 6, 14] and len(given) == 15

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}", "train.steps=1", "train.tensorboard=false",
            "train.stop_after_flat_steps=0", "rollout.group_size=2", "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=3", "data.template=plain", "model.device=cpu", "eval.enabled=false",
        ],
    )
    cfg.model.name_or_path, cfg.data.train = str(model_dir), str(data)

    def zero(prompts, completions, **kw):
        return [0.0] * len(completions)

    summary = GRPOTrainer(cfg, reward_functions=[("zero", zero, 1.0)]).train()
    reloaded = load_tokenizer(summary["checkpoint"])
    assert type(reloaded) is type(given)
    assert reloaded.get_vocab() == given.get_vocab() and len(reloaded) == 15
    assert reloaded.special_tokens_map == given.special_tokens_map
    assert reloaded(probe).input_ids == [4, 5, 2, 13, 6, 14]
    assert reloaded.decode([4, 5, 13, 6]) == "12+3"


def test_tokenizer_larger_than_the_embedding_is_refused():
    model, tok = make_tiny_model("qwen2", seed=0, vocab_size=64)
    tok.add_tokens(["<extra>"])  # id 64: no embedding row
    with pytest.raises(ConfigError, match=r"65 tokens but the model's embedding has 64 rows.*<extra>"):
        check_tokenizer_fits(model, tok, "the tokenizer")


def test_flat_groups_counts_step_scores_under_process_rewards():
    from grpokit.rollout.batch import flat_groups

    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])  # two groups of G=2, each with equal outcomes
    assert flat_groups(rewards, 2).tolist() == [True, True]
    # group 0: the same final score, reached by steps scored 1, 0 vs 1, 1 -> process advantages differ
    # group 1: every step of both completions scored 0 -> still flat
    steps = [[(2, 1.0), (5, 0.0)], [(1, 1.0), (4, 1.0)], [(3, 0.0)], [(2, 0.0), (6, 0.0)]]
    assert flat_groups(rewards, 2, steps).tolist() == [False, True]
    # an outcome spread stays a spread whatever the steps say
    assert flat_groups(torch.tensor([1.0, 0.0]), 2, [[(1, 0.0)], [(1, 0.0)]]).tolist() == [False]


def test_flat_rewards_under_ppo_say_the_rewards_carry_no_signal(tmp_path, capfd):
    # PPO's critic and KL make advantages non-zero even when the verifier scores everything alike: the
    # stop still comes (the task teaches nothing), and the message does not claim every advantage was 0
    reward = ("math_accuracy", resolve_reward("math_accuracy"), 1.0)
    trainer = make_trainer(tmp_path, reward, "algo.preset=ppo")
    with pytest.raises(TrainingError) as err:
        trainer.train()
    assert "no group had any reward spread for 3 steps" in str(err.value)
    assert "PPO's advantages came from its critic and KL alone" in str(err.value)
    assert "every advantage was 0" not in str(err.value) + capfd.readouterr().err

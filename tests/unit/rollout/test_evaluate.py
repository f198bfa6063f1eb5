"""maj@k: the answer each completion votes for, the vote, and the metric through `grpokit eval`."""

import json
from fractions import Fraction

import pytest

from grpokit.rewards import math_accuracy
from grpokit.rollout.evaluate import final_answer, majority_vote


def test_final_answer_reads_the_verifiers_answer_and_merges_equal_numbers():
    assert final_answer("so it is \\boxed{0.5}") == Fraction(1, 2)
    assert final_answer("... #### 1/2") == Fraction(1, 2)
    assert final_answer("<answer>\\frac{1}{2}</answer>") == Fraction(1, 2)
    assert final_answer("The answer is x + 1.") == "x + 1"
    assert final_answer("\\boxed{3} or maybe \\boxed{4}") == (Fraction(3), Fraction(4))
    assert final_answer("\\boxed{3} so \\boxed{3}") == Fraction(3)


@pytest.mark.parametrize(
    "completion",
    ["I think it is 12", "", "<answer>12", "<think>\\boxed{12}", "```\\boxed{12}```"],
    ids=["no-marker", "empty", "unclosed-tag", "only-in-reasoning", "only-in-code"],
)
def test_no_extractable_answer_does_not_vote(completion):
    assert final_answer(completion) is None


def test_majority_vote_by_hand():
    # votes {12: 2, 13: 1}, one abstains: 12 wins and scores 1
    assert majority_vote([12, 13, 12, None], [1.0, 0.0, 1.0, 0.0]) == 1.0
    # the wrong answer has the majority: 0, though one completion was right (pass@k would be 1)
    assert majority_vote([13, 13, 12], [0.0, 0.0, 1.0]) == 0.0
    # a 1-1 tie goes to the answer given first
    assert majority_vote([13, 12], [0.0, 1.0]) == 0.0
    assert majority_vote([12, 13], [1.0, 0.0]) == 1.0
    # nobody votes: not solved
    assert majority_vote([None, None], [0.0, 0.0]) == 0.0


def test_maj_at_4_with_the_math_verifier_on_hand_made_completions():
    """Two prompts, gold 12 and 7, four completions each, scored by the real math_accuracy."""
    groups = [
        ("12", ["so \\boxed{12}", "#### 12", "the answer is 13", "no idea"]),  # 12 wins (2 vs 1): solved
        ("7", ["#### 8", "\\boxed{8}", "#### 7", "\\boxed{7.5}"]),  # 8 wins (2 vs 1 vs 1): not solved
    ]
    solved = []
    for gold, completions in groups:
        scores = math_accuracy([""] * 4, completions, answer=[gold] * 4)
        assert scores == ([1.0, 1.0, 0.0, 0.0] if gold == "12" else [0.0, 0.0, 1.0, 0.0])
        solved.append(majority_vote([final_answer(c) for c in completions], scores) == 1.0)
    assert solved == [True, False]  # maj@4 = 1/2, while pass@4 = 2/2 and mean@4 = 3/8


def test_eval_command_reports_maj_at_k_on_the_test_split_of_a_hub_layout_folder(tmp_path, capsys):
    pytest.importorskip("datasets")
    from tiny_model import save_tiny_model

    from grpokit.cli.main import main

    model_dir = save_tiny_model(tmp_path / "m")
    data = tmp_path / "held_out"  # train.jsonl and test.jsonl: splits named by file, read by load_dataset
    data.mkdir()
    for split, n in (("train", 5), ("test", 3)):
        rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(n)]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [str(model_dir), str(data), "--template", "plain", "--max-new-tokens", "4", "--num-samples", "3"]
    assert main(["eval", *args]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_examples"] == 3  # the test split by default
    assert 0.0 <= result["maj_at_3"] <= result["pass_at_3"]
    assert 0.0 <= result["maj_at_3/no_answer"] <= 1.0


# ------------------------------------------------------------------ progress lines while it runs


def test_eval_progress_prints_the_last_chunk_of_a_phase_always_and_the_others_at_most_every_every_s():
    from grpokit.rollout.evaluate import EvalProgress

    lines = []
    every = EvalProgress(lines.append, 5, every_s=0.0)
    for done in (2, 4, 5):
        every("greedy", done)
    assert [line.split(" (")[0] for line in lines] == [
        "eval: greedy 2/5 prompts",
        "eval: greedy 4/5 prompts",
        "eval: greedy 5/5 prompts",
    ]
    lines.clear()
    rare = EvalProgress(lines.append, 5, unit="episodes", every_s=1e9)
    for done in (2, 4, 5):
        rare("greedy", done)
    rare("4 samples each", 5)
    assert [line.split(" (")[0] for line in lines] == [
        "eval: greedy 5/5 episodes",
        "eval: 4 samples each 5/5 episodes",
    ]
    assert all(line.endswith(" s)") for line in lines)


def test_evaluate_reports_progress_of_both_phases_to_the_printer_it_is_given():
    from tiny_model import make_tiny_model

    from grpokit.config.schema import DataConfig
    from grpokit.rollout.engines.fast import FastGenerator
    from grpokit.rollout.evaluate import evaluate

    model, tok = make_tiny_model("qwen2", seed=0)
    rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(3)]
    lines = []
    evaluate(model, tok, rows, accuracy_fn=math_accuracy, generator=FastGenerator(),
             data_cfg=DataConfig(template="plain"), eos_token_ids=[tok.eos_token_id], num_samples=2,
             max_new_tokens=3, batch_prompts=2, progress=lines.append)  # fmt: skip
    phases = [line.split(" (")[0] for line in lines]
    # chunks of 2 and 1 prompts; the first chunk's line only when 10 s had passed (a loaded machine)
    assert phases[-1] == "eval: 2 samples each 3/3 prompts"
    assert "eval: greedy 3/3 prompts" in phases
    assert set(phases) <= {f"eval: {p} {n}/3 prompts" for p in ("greedy", "2 samples each") for n in (2, 3)}


@pytest.mark.slow
def test_eval_command_prints_progress_on_stderr_and_only_the_result_on_stdout(tmp_path, capsys):
    from tiny_model import save_tiny_model

    from grpokit.cli.main import main

    model_dir = save_tiny_model(tmp_path / "m")
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "answer": str(a + 1)}) + "\n" for a in range(3)))
    args = [str(model_dir), str(data), "--template", "plain", "--max-new-tokens", "3", "--num-samples", "2"]
    assert main(["eval", *args]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_examples"] == 3  # stdout is the result alone
    shown = [line.split(" (")[0] for line in captured.err.splitlines() if line.startswith("eval: ")]
    assert shown == ["eval: greedy 3/3 prompts", "eval: 2 samples each 3/3 prompts"]

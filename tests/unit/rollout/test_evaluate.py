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

"""Faults of the commands that must end as a named one-line error or cleanly (issue 37): nothing kept by
`grpokit sample`, chat and plain rows mixed in one SFT file, a pipeline whose stage.json says more than
its folder holds, bad `grpokit launch` options."""

import json

import pytest
from tiny_model import save_tiny_model

from grpokit.cli.main import main


@pytest.mark.slow
def test_sample_that_keeps_nothing_exits_non_zero_naming_why(tmp_path, capsys):
    """Thresholds no completion meets: exit 2 and one line saying how many each rule refused and what to
    change (before: exit 0 and an empty samples file)."""
    model = save_tiny_model(tmp_path / "model")
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{a}+1="}) + "\n" for a in range(3))
    )
    (tmp_path / "rewards.py").write_text(
        "def never(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    args = [
        f"model.name_or_path={model}",
        f"data.train={tmp_path / 'prompts.jsonl'}",
        "data.template=plain",
        f"rewards=[{{name: {tmp_path / 'rewards.py'}:never, min: 1.0}}]",
        "sample.n=2",
        "sample.max_new_tokens=3",
        "keep.drop_truncated=false",
        "keep.drop_empty=false",
    ]
    assert main(["sample", *args, "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "no completion was kept: of 6 completions, 6 below never min 1" in err
    assert "Traceback" not in err
    assert (tmp_path / "run" / "pass_rates.jsonl").is_file()  # what there is to look at stays


@pytest.mark.slow
def test_sft_refuses_a_file_mixing_chat_and_plain_rows(tmp_path, capsys):
    """One plain prompt/completion row, then one whose prompt is chat messages: exit 2 naming the row
    (before: trained on both renderings silently)."""
    model = save_tiny_model(tmp_path / "model")
    rows = [
        {"prompt": "1+1=", "completion": "2"},
        {"prompt": "2+2=", "completion": "4"},
        {"prompt": [{"role": "user", "content": "3+3="}], "completion": "6"},
    ]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(
        [
            "sft",
            f"model.name_or_path={model}",
            f"data.train={tmp_path / 'sft.jsonl'}",
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "sft.jsonl, row index 2: a chat (prompt or completion given as messages) row" in err
    assert "row index 0 is plain text" in err and "Traceback" not in err

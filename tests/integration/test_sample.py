"""Rejection sampling (`grpokit sample`): exactly the completions the rewards pass are kept (a hand-scored
fixture through the real verifiers), the output loads as SFT data, and a killed run resumes to the same
result."""

import json

import pytest
from tiny_model import save_tiny_model

from grpokit.cli.main import main
from grpokit.rewards import RewardRunner, format_lenient, make_language_consistency, math_accuracy
from grpokit.trainers.sample import KeepConfig, load_sample_config, select

# Two prompts, five completions each, scored by hand (acc = math_accuracy vs the answer, fmt =
# format_lenient, lang = share of Latin words in <think> (without one: in the whole text, tags included),
# None without letters; tokens given):
#  p  s  completion                                              acc fmt lang  tokens trunc  passes
#  0  0  <think>2+3</think><answer>5</answer>                     1   1   None  12     no     yes
#  0  1  <answer>5</answer>                                       1   0   1     5      no     no (fmt)
#  0  2  <think>two plus three</think><answer>6</answer>          0   1   1     20     no     no (acc)
#  0  3  <think>2+3</think><answer>5</answer>   (= sample 0)      1   1   None  12     no     yes (dup)
#  0  4  <think>5</think><answer>5</answer>                       1   1   None  8      no     yes
#  1  0  <think>4+4</think><answer>8</answer>                     1   1   None  12     yes    no (trunc)
#  1  1  <think>четыре plus четыре</think> <answer>8</answer>     1   1   1/3   14     no     no (lang)
#  1  2  <answer>8</answer>                                       1   0   1     5      no     no (fmt)
#  1  3  <think>x</think><answer>9</answer>                       0   1   1     8      no     no (acc)
#  1  4  <think>4+4</think><answer>8</answer>                     1   1   None  12     no     yes
# pass rates 3/5 and 1/5.
FIXTURE = [
    (0, "<think>2+3</think><answer>5</answer>", 12, False),
    (0, "<answer>5</answer>", 5, False),
    (0, "<think>two plus three</think><answer>6</answer>", 20, False),
    (0, "<think>2+3</think><answer>5</answer>", 12, False),
    (0, "<think>5</think><answer>5</answer>", 8, False),
    (1, "<think>4+4</think><answer>8</answer>", 12, True),
    (1, "<think>четыре plus четыре</think> <answer>8</answer>", 14, False),
    (1, "<answer>8</answer>", 5, False),
    (1, "<think>x</think><answer>9</answer>", 8, False),
    (1, "<think>4+4</think><answer>8</answer>", 12, False),
]
ANSWERS = ["5", "8"]
THRESHOLDS = {"acc": 1.0, "fmt": 1.0, "lang": 0.5}


@pytest.fixture(scope="module")
def scored():
    """The fixture's candidates scored by the real verifiers through the RewardRunner."""
    completions = [text for _, text, _, _ in FIXTURE]
    answers = [ANSWERS[p] for p, _, _, _ in FIXTURE]
    functions = [
        ("acc", math_accuracy, 1.0),
        ("fmt", format_lenient, 0.0),
        ("lang", make_language_consistency("en"), 0.0),
    ]
    with RewardRunner(functions, isolation="thread") as runner:
        result = runner(["q"] * len(FIXTURE), completions, {"answer": answers})
    by_hand = {
        "acc": [1, 1, 0, 1, 1, 1, 1, 1, 0, 1],
        "fmt": [1, 0, 1, 1, 1, 1, 1, 0, 1, 1],
        "lang": [None, None, 1, None, None, None, 1 / 3, None, 1, None],  # no reasoning written: None
    }
    for name, values in by_hand.items():
        assert result.per_function[name] == pytest.approx(values), name
    return [
        {
            "prompt_index": p,
            "sample_index": i % 5,
            "completion": text,
            "completion_tokens": tokens,
            "truncated": truncated,
            "scores": {name: result.per_function[name][i] for name in by_hand},
            "failed": [],
        }
        for i, (p, text, tokens, truncated) in enumerate(FIXTURE)
    ]


def kept_ids(kept):
    return [(c["prompt_index"], c["sample_index"]) for c in kept]


def test_keeps_exactly_the_passing_rows(scored):
    kept, stats = select(scored, THRESHOLDS, KeepConfig(max_per_prompt=2, prefer_shortest=True))
    # prompt 0: 0, 3, 4 pass; 3 repeats 0; shortest first: 4 (8 tokens), 0 (12). Prompt 1: only 4.
    assert kept_ids(kept) == [(0, 4), (0, 0), (1, 4)]
    assert stats[0] == {"samples": 5, "passed": 3, "pass_rate": 0.6, "kept": 2}
    assert stats[1] == {"samples": 5, "passed": 1, "pass_rate": 0.2, "kept": 1}


@pytest.mark.parametrize(
    ("keep", "expected"),
    [
        (KeepConfig(max_per_prompt=1, prefer_shortest=False), [(0, 0), (1, 4)]),  # first sampled
        (KeepConfig(max_per_prompt=0, dedupe=False), [(0, 4), (0, 0), (0, 3), (1, 4)]),  # tie: sample order
        (
            KeepConfig(max_per_prompt=0, drop_truncated=False),
            [(0, 4), (0, 0), (1, 0)],
        ),  # 1/0 passes, 1/4 its repeat
    ],
)
def test_keep_options(scored, keep, expected):
    assert kept_ids(select(scored, THRESHOLDS, keep)[0]) == expected


def test_a_reward_without_threshold_filters_nothing_and_failed_rows_never_pass(scored):
    no_language = {**THRESHOLDS, "lang": None}
    assert kept_ids(select(scored, no_language, KeepConfig(max_per_prompt=0))[0]) == [
        (0, 4),
        (0, 0),
        (1, 4),
        (1, 1),
    ]
    failed = [dict(c, failed=["fmt"]) if c["sample_index"] == 4 else c for c in scored]
    assert kept_ids(select(failed, THRESHOLDS, KeepConfig(max_per_prompt=0))[0]) == [(0, 0)]


def test_bad_settings_are_one_line_errors():
    from grpokit.core.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"unknown config key 'keep.max_per_promt'. Did you mean 'max_per_prompt'"
    ):
        load_sample_config(None, ["data.train=x.jsonl", "keep.max_per_promt=2"])
    with pytest.raises(ConfigError, match=r"sample.temperature=0 .* sample.n=4"):
        load_sample_config(None, ["data.train=x.jsonl", "sample.temperature=0", "sample.n=4"])


# ----------------------------------------------------------------------------- the command, end to end

REWARDS = (
    "def even_length(prompts, completions, **kw):\n"
    "    texts = [c if isinstance(c, str) else c[0]['content'] for c in completions]\n"
    "    return [float(len(t) % 2 == 0) for t in texts]\n"
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sample")
    model = save_tiny_model(root / "model")
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "rewards.py").write_text(REWARDS)
    args = [
        f"model.name_or_path={model}",
        f"data.train={root / 'prompts.jsonl'}",
        "data.template=plain",
        f"rewards=[{{name: {root / 'rewards.py'}:even_length}}]",
        "sample.n=6",
        "sample.max_new_tokens=5",
        "sample.batch_prompts=4",
        "keep.drop_truncated=false",
        "keep.max_per_prompt=2",
    ]
    return root, rows, args


def test_sample_command_output_is_sft_data_and_resumes_to_the_same_result(setup, capsys):
    root, rows, args = setup
    out = root / "run"
    assert main(["sample", *args, "--output-dir", str(out)]) == 0
    kept = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    candidates = [
        json.loads(line)
        for p in sorted((out / "candidates").iterdir())
        for line in p.read_text().splitlines()
    ]
    assert len(candidates) == 9 * 6 and len(list((out / "candidates").iterdir())) == 3
    # naive oracle: per prompt the distinct passing texts, shortest first, at most 2
    expected = []
    for i in range(9):
        passing = sorted(
            (c["completion_tokens"], c["sample_index"], c["completion"])
            for c in candidates
            if c["prompt_index"] == i and len(c["completion"]) % 2 == 0 and c["completion"].strip()
        )
        texts = []
        for _, s, text in passing:
            if text.strip() not in [t.strip() for _, t in texts]:
                texts.append((s, text))
        expected += [(i, s, text) for s, text in texts[:2]]
    assert [(r["prompt_index"], r["sample_index"], r["completion"]) for r in kept] == expected
    assert kept, "the fixture should keep some rows"
    for r in kept:
        assert (
            r["prompt"] == rows[r["prompt_index"]]["prompt"]
            and r["answer"] == rows[r["prompt_index"]]["answer"]
        )
        assert r["scores"] == {"even_length": 1.0} and r["source_model"].endswith("model")
    rates = [json.loads(line) for line in (out / "pass_rates.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rates] == [r["prompt"] for r in rows]
    assert (
        rates[0]["pass_rate"]
        == sum(len(c["completion"]) % 2 == 0 and c["completion"].strip() != "" for c in candidates[:6]) / 6
    )
    # SFT-ready: grpokit sft's own loader reads the rows as prompt + completion and trains on each
    from grpokit.config.sft import load_sft_config
    from grpokit.data.sft import detect_format, encode_examples, load_sft_rows
    from grpokit.model.loading import load_tokenizer

    sft = load_sft_config(None, [f"data.train={out / 'samples.jsonl'}", "data.template=plain"])
    loaded, _ = load_sft_rows(sft.data)
    assert detect_format(loaded, sft.data, "samples") == "prompt_completion"
    tokenizer = load_tokenizer(str(root / "model"))
    examples = encode_examples(loaded, tokenizer, sft.data, sft.sft.loss_on, "samples")
    assert len(examples) == len(kept) and all(e.num_loss_tokens > 0 for e in examples)

    # a run killed after its first batch: the resumed run samples only the rest, with the same result
    first = (out / "candidates" / "00000000.jsonl").read_text()
    for name in ("00000004.jsonl", "00000008.jsonl"):
        (out / "candidates" / name).unlink()
    (out / "summary.json").unlink()
    (out / "samples.jsonl").unlink()
    capsys.readouterr()
    assert main(["sample", *args, "--output-dir", str(out)]) == 2
    assert "already holds a sampling run" in capsys.readouterr().err
    assert main(["sample", *args, "sample.n=3", "--output-dir", str(out), "--resume"]) == 2
    assert "sample.n: 6 -> 3" in capsys.readouterr().err
    assert main(["sample", *args, "keep.max_per_prompt=2", "--output-dir", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "sample: 8/9 prompts" in err and "sample: 4/9" not in err  # batch 0 read back, not redone
    assert (out / "candidates" / "00000000.jsonl").read_text() == first
    again = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["prompt_index"], r["completion"]) for r in again] == [
        (r["prompt_index"], r["completion"]) for r in kept
    ]


def test_a_resumed_run_counts_the_seconds_of_every_leg(setup):
    """The seconds up to the last batch saved are kept (sampling_seconds.json) and a resumed run goes on from them,
    so a pipeline's cpu_budget_of counts a resumed sample stage whole (before: its last leg only)."""
    root, _, args = setup
    out = root / "legs"
    assert main(["sample", *args, "--output-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    kept = json.loads((out / "sampling_seconds.json").read_text())  # after the last batch: before selecting
    assert 0 < kept["cpu_seconds"] <= summary["cpu_seconds"] and 0 < kept["seconds"] <= summary["seconds"]
    # killed after its first batch, having spent (say) 50 CPU s and 100 s on it: the resumed run adds its own
    for name in ("00000004.jsonl", "00000008.jsonl", "../summary.json", "../samples.jsonl"):
        (out / "candidates" / name).unlink()
    (out / "sampling_seconds.json").write_text(json.dumps({"seconds": 100.0, "cpu_seconds": 50.0}))
    assert main(["sample", *args, "--output-dir", str(out), "--resume"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert 50.0 < again["cpu_seconds"] < 50.0 + 5 * summary["cpu_seconds"]  # this leg: two batches of three
    assert 100.0 < again["seconds"]


def test_parquet_output_and_chat_prompts(setup, tmp_path):
    root, _, args = setup
    chat = [{"prompt": [{"role": "user", "content": f"{a}+1="}], "answer": str(a + 1)} for a in range(2)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    out = tmp_path / "run"
    extra = [f"data.train={tmp_path / 'chat.jsonl'}", "data.template=chat", "output.format=parquet"]
    assert main(["sample", *args, *extra, "keep.max_per_prompt=0", "--output-dir", str(out)]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(out / "samples.parquet").to_pylist()
    assert table and all(r["completion"][0]["role"] == "assistant" for r in table)
    assert all(r["prompt"][0]["role"] == "user" for r in table)


def test_the_sampling_settings_reach_the_engine(setup, tmp_path):
    """sample.repetition_penalty (rollout.repetition_penalty's rule, tests/unit/rollout/test_sampling_settings.py)
    is the engine's: the greedy candidates with it are not those without, and sample.min_p's range is checked."""
    _, _, args = setup
    common = [*args, "sample.n=1", "sample.temperature=0", "sample.max_new_tokens=8", "keep.max_per_prompt=0"]
    texts = {}
    for name, extra in (("plain", []), ("penalised", ["sample.repetition_penalty=1.5"])):
        out = tmp_path / name
        assert main(["sample", *common, *extra, "--output-dir", str(out)]) == 0
        lines = [line for f in sorted((out / "candidates").iterdir()) for line in f.read_text().splitlines()]
        texts[name] = [json.loads(line)["completion"] for line in lines]
    assert len(texts["plain"]) == 9 and texts["plain"] != texts["penalised"]
    assert main(["sample", *common, "sample.min_p=1.5", "--output-dir", str(tmp_path / "bad")]) == 2


def test_sample_stop_ends_each_candidate_at_its_first_stop_string(setup, tmp_path):
    """sample.stop (rollout.stop's rule): every candidate that holds a digit ends at its first one; without the
    setting some hold one before their end, so the comparison can fail."""
    _, _, args = setup
    common = [*args, "sample.max_new_tokens=12", "keep.max_per_prompt=0"]
    digits = set("123456789")
    found = {}
    for name, extra in (("plain", []), ("stopped", [f"sample.stop={sorted(digits)}"])):
        out = tmp_path / name
        assert main(["sample", *common, *extra, "--output-dir", str(out)]) == 0
        lines = [line for f in sorted((out / "candidates").iterdir()) for line in f.read_text().splitlines()]
        found[name] = [json.loads(line)["completion"] for line in lines]
    held = [c for c in found["stopped"] if digits & set(c)]
    assert held and all(c[-1] in digits and not digits & set(c[:-1]) for c in held), held[:5]
    assert any(digits & set(c[:-1]) for c in found["plain"])

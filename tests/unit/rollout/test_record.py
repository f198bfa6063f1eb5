"""The rollouts a sampled step saves (grpokit.rollout.record): shapes, and that every saved number is the one
the update used (a spy loss sees the update's own tensors), bounded disk use, and the samples/ rows."""

import glob
import json

import pyarrow.parquet as pq
import pytest
from grpo_runs import recording_trainer

from grpokit.algos import policy_loss, register_loss
from grpokit.rollout.record import read_rollouts, rollout_files

SEEN: list[dict] = []  # what the spy loss was given, one entry per micro-batch call


def spy_loss(logprobs, old_logprobs, advantages, completion_mask, **kw):
    SEEN.append(
        {
            "logprobs": logprobs.detach().clone(),
            "old": old_logprobs.detach().clone(),
            "adv": advantages.detach().clone(),
            "mask": completion_mask.detach().clone(),
        }
    )
    return policy_loss(logprobs, old_logprobs, advantages, completion_mask, **kw)


register_loss("view_spy", spy_loss)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rec")
    trainer = recording_trainer(tmp / "run", "algo.loss=view_spy")
    SEEN.clear()
    trainer.train()
    return tmp / "run", list(SEEN), trainer


@pytest.mark.slow
def test_shapes_and_metadata(run):
    folder, _, trainer = run
    files = rollout_files(folder)
    assert [f.name for f in files] == ["step_000002.parquet"]  # samples_every=2 of 2 steps
    table, meta = read_rollouts(files[0])
    assert meta["step"] == 2 and meta["group_size"] == 4 and meta["reward_names"] == ["has_seven"]
    assert meta["loss_kwargs"]["beta"] == 0.04 and meta["algo"]["advantage"] == "group_std"
    t = table.to_pydict()
    assert table.num_rows == 16 and t["group"] == [i // 4 for i in range(16)] and t["index"] == [i % 4 for i in range(16)]
    for i in range(16):
        n = t["length"][i]
        for key in ("token_ids", "tokens", "logprobs", "old_logprobs", "ref_logprobs", "entropy", "advantages", "loss_mask", "clip"):
            assert len(t[key][i]) == n, key
        assert "".join(t["tokens"][i]).startswith(t["completion"][i][:1])  # texts decoded alone, joined back
        assert t["step_rewards"][i] is None  # outcome rewards only
        assert all(-1 <= c <= 1 for c in t["clip"][i])
    assert t["reward/has_seven"] == t["reward"]  # one reward of weight 1


@pytest.mark.slow
def test_each_row_records_its_ground_truth(run):
    """has_seven names no column, so the ground truth is the rows' "answer": the sum the prompt asks for."""
    folder, _, _ = run
    table, meta = read_rollouts(rollout_files(folder)[0])
    t = table.to_pydict()
    assert meta["ground_truth_column"] == "answer"
    want = [str(sum(int(x) for x in p.rstrip("=").split("+"))) for p in t["prompt"]]  # "2+3=" -> "5"
    assert t["ground_truth"] == want


def test_the_ground_truth_column_is_the_accuracy_rewards_else_a_known_name():
    from grpokit.rollout.record import find_ground_truth_column

    rows = [{"prompt": "q", "solution": "1", "answer": "2"}, {"prompt": "r", "tests": ["assert f()"]}]
    assert find_ground_truth_column(rows, "prompt", "tests") == "tests"  # code_tests' column
    assert find_ground_truth_column(rows, "prompt") == "answer"  # grpokit's name before TRL's "solution"
    assert find_ground_truth_column(rows, "prompt", "missing") == "answer"
    assert find_ground_truth_column([{"answer": "a question"}], "answer") is None  # never the prompt
    assert find_ground_truth_column([{"prompt": "q", "other": 1}], "prompt") is None


def test_saved_numbers_are_the_ones_the_update_used(run):
    """Each saved row's log-probs, old log-probs and advantages equal, bit for bit, a row the loss was given
    in the second step's update; the advantages also equal GRPO's formula by a naive loop over the group."""
    folder, seen, _ = run
    t = read_rollouts(rollout_files(folder)[0])[0].to_pydict()
    last_step = seen[len(seen) // 2 :]  # two steps, the same number of micro-batches each
    given = {}
    for call in last_step:
        for j in range(call["logprobs"].shape[0]):
            n = int(call["mask"][j].sum())
            adv = call["adv"][j]
            given[tuple(call["logprobs"][j, :n].tolist())] = (call["old"][j, :n].tolist(), float(adv))
    assert len(given) == 16
    for i in range(16):
        old, adv = given[tuple(t["logprobs"][i])]
        assert t["old_logprobs"][i] == old
        assert t["advantages"][i] == [adv] * t["length"][i] and t["advantage"][i] == adv
    # second mini-batch: the policy moved after the first, so old != new somewhere
    assert any(t["old_logprobs"][i] != t["logprobs"][i] for i in range(16))
    for g in range(4):
        r = t["reward"][4 * g : 4 * g + 4]
        mean = sum(r) / 4
        std = (sum((x - mean) ** 2 for x in r) / 3) ** 0.5
        want = [0.0] * 4 if max(r) == min(r) else [(x - mean) / (std + 1e-6) for x in r]
        assert t["advantage"][4 * g : 4 * g + 4] == pytest.approx(want, abs=1e-6)


def test_saved_tokens_give_back_the_logged_loss_clip_and_kl(run):
    """From the saved tokens alone (grpokit.view.data): the loss, clip fraction and KL metrics.jsonl logged."""
    from grpokit.view.data import step_view

    folder, _, _ = run
    logged = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    totals = step_view(rollout_files(folder)[0], {})["totals"]
    assert totals["loss"] == pytest.approx(logged["loss"], rel=1e-5, abs=1e-8)
    assert totals["clip_frac"] == pytest.approx(logged["clip_frac"], abs=1e-7)
    assert totals["kl"] == pytest.approx(logged["kl"], rel=1e-5)
    assert totals["reward_mean"] == pytest.approx(logged["reward/total/mean"], abs=1e-7)


def test_samples_hold_every_completion_with_its_advantage(run):
    folder, _, _ = run
    rows = [json.loads(line) for line in (folder / "samples" / "step_000002.jsonl").read_text().splitlines()]
    t = read_rollouts(rollout_files(folder)[0])[0].to_pydict()
    assert len(rows) == 16  # every completion of every group, not the first of each
    assert [r["advantage"] for r in rows] == pytest.approx(t["advantage"])
    assert [r["completion"] for r in rows] == t["completion"] and [r["group"] for r in rows] == t["group"]


def test_disk_use_per_sampled_step_is_bounded(run):
    """The bound the module docstring states: about 20-30 bytes per generated token plus texts."""
    folder, _, _ = run
    path = rollout_files(folder)[0]
    tokens = sum(pq.read_table(path, columns=["length"]).column("length").to_pylist())
    assert path.stat().st_size < 8_000 + 40 * tokens + 200 * 16


def test_not_a_rollouts_file_is_named(tmp_path):
    bad = tmp_path / "step_000001.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ValueError, match="step_000001.parquet: not a readable rollouts file"):
        read_rollouts(bad)
    pq.write_table(__import__("pyarrow").table({"a": [1]}), tmp_path / "plain.parquet")
    with pytest.raises(ValueError, match="without grpokit's metadata"):
        read_rollouts(tmp_path / "plain.parquet")


@pytest.mark.slow
def test_samples_go_to_wandb_as_a_table(tmp_path, monkeypatch):
    """report_to wandb: a step's samples become a W&B table "completions" (TRL's key), every row and column."""
    pytest.importorskip("wandb")
    from grpokit.run.log import RunLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = [
        {"group": 0, "prompt": "1+1=", "completion": "2", "reward": 1.0, "reward/acc": 1.0, "advantage": 0.7},
        {"group": 0, "prompt": "1+1=", "completion": "3", "reward": 0.0, "reward/acc": None, "advantage": -0.7},
    ]
    with RunLogger(tmp_path, total_steps=1, console=False, report_to=["wandb"]) as log:
        log.log_samples(1, rows)
    (table,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "media" / "table" / "completions_*.table.json"))
    saved = json.loads(open(table).read())
    assert saved["columns"] == list(rows[0])
    assert saved["data"] == [list(r.values()) for r in rows]


def test_step_rewards_per_token():
    """Process rewards: steps [(t_end, score)], t_end the step's last token; tokens after the last step NaN."""
    from grpokit.rollout.record import _step_reward_tokens

    (row,) = _step_reward_tokens([[(1, 0.5), (3, 1.0)]], [5])
    assert row[:4] == [0.5, 0.5, 1.0, 1.0] and row[4] != row[4]
    assert _step_reward_tokens(None, [3, 4]) == [None, None]

"""grpokit bench --memory --batch NAME: the named batches' lengths, the rollout built from them, the padded
micro-batch the plan predicts for prompts of different lengths, and the option on the command line."""

import argparse

import pytest
import torch

from grpokit import bench
from grpokit.bench.plan import Settings, largest_micro_batch
from grpokit.bench.update_memory import BATCHES, LongTail, long_tailed_rollout, variant_settings


def test_short_8_is_the_batch_of_before():
    """The default batch is unchanged: 8 prompts of 16 tokens, one completion of 256, seven of 4-24."""
    tail = BATCHES["short-8"]
    assert tail == LongTail()
    lengths = tail.lengths()
    assert sorted(lengths)[-1] == 256 and all(4 <= n <= 24 for n in sorted(lengths)[:-1])
    assert lengths == SHORT_8 and tail.prompt_lengths() == [16] * 8
    assert variant_settings("padded", tail) == ["optim.micro_batch_size=8"]


SHORT_8 = [16, 16, 19, 17, 256, 5, 12, 20]  # LongTail().lengths() before --batch existed (commit fe64fc4)


def test_long_tail_16_is_long_tailed_and_fixed():
    tail = BATCHES["long-tail-16"]
    completions, prompts = tail.lengths(), tail.prompt_lengths()
    assert len(completions) == len(prompts) == 16
    assert sum(512 <= n <= 1024 for n in completions) == 2  # 1/8 long
    assert sum(8 <= n <= 64 for n in completions) == 14  # 7/8 short
    assert all(16 <= n <= 64 for n in prompts)
    assert completions == tail.lengths() and prompts == tail.prompt_lengths()  # a fixed seed
    assert variant_settings("padded", tail) == ["optim.micro_batch_size=16"]
    assert variant_settings("packed", tail) == ["optim.packing=true", "optim.micro_batch_tokens=4096"]


def test_the_rollout_left_pads_prompts_and_right_pads_completions():
    tail = LongTail(
        rows=3, prompt_min=2, prompt_len=5, short_min=1, short_max=3, long_rows=1, long_min=6, long_len=8
    )
    r = long_tailed_rollout(tail, vocab=50)
    prompts, completions = tail.prompt_lengths(), tail.lengths()
    assert r.prompt_mask.sum(1).tolist() == prompts and r.completion_mask.sum(1).tolist() == completions
    assert r.prompt_ids.shape == (3, max(prompts)) and r.completion_ids.shape == (3, max(completions))
    for i, (p, c) in enumerate(zip(prompts, completions)):
        assert r.prompt_mask[i, max(prompts) - p :].all() and not r.prompt_mask[i, : max(prompts) - p].any()
        assert bool((r.prompt_ids[i, : max(prompts) - p] == 0).all()) and bool(
            (r.prompt_ids[i, max(prompts) - p :] >= 3).all()
        )
        assert bool((r.completion_ids[i, c:] == 0).all()) and bool((r.completion_ids[i, :c] >= 3).all())
    assert torch.equal(r.row_lengths, torch.tensor([p + c for p, c in zip(prompts, completions)]))


def test_a_padded_micro_batch_is_its_longest_prompt_plus_its_longest_completion():
    """Rows (prompt, completion): (10, 2), (2, 9), (4, 4) -> totals 12, 11, 8; padded in one micro-batch the
    prompts pad to 10 and the completions to 9: 3 x 19 = 57 positions (the longest row alone says 3 x 12)."""
    prompts, completions = [10, 2, 4], [2, 9, 4]
    totals = [p + c for p, c in zip(prompts, completions)]
    assert largest_micro_batch(totals, Settings(), prompts) == 3 * 19
    assert largest_micro_batch(totals, Settings()) == 3 * 12
    # 2 rows a micro-batch, sorted by total: [(4, 4), (2, 9)] -> 2 x (4 + 9) = 26, [(10, 2)] -> 12
    assert largest_micro_batch(totals, Settings(micro_batch_rows=2), prompts) == 26
    # packed: the real tokens, prompts or not
    assert largest_micro_batch(totals, Settings(packing=True), prompts) == 31


def test_memory_batch_option_names_the_batches_and_needs_memory(capsys):
    parser = argparse.ArgumentParser(prog="grpokit")
    bench.add_bench_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["bench", "--memory"]).batch is None  # short-8
    assert parser.parse_args(["bench", "--memory", "--batch", "long-tail-16"]).batch == "long-tail-16"
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--memory", "--batch", "long-tail-64"])
    assert "invalid choice: 'long-tail-64'" in capsys.readouterr().err
    args = parser.parse_args(["bench", "--batch", "long-tail-16"])  # without --memory it would do nothing
    assert args.func(args) == 2
    assert "--batch is not read by the GRPO step bench (the default), only by --memory" in capsys.readouterr().err

"""Padding-free packing (grpokit.data.packing): the pieces by hand, then packed == padded for every pass
that uses it: the policy's log-probs and entropy (single- and multi-turn masks), the critic's values, the
GRPO-family update's gradient for every loss mode, and SFT's step, with and without LoRA. Tiny real Qwen2 /
Llama on the CPU; padded and packed run the same float32 arithmetic in another order, hence the 1e-5s."""

import pytest
import torch
from ragged_batch import ragged_batch
from tiny_model import make_tiny_model
from update_parts import grads_of_one_step

from grpokit.config.schema import load_config, resolve_algo
from grpokit.data.packing import cut_to_count, pack_masked, pack_sequences, token_budget_batches
from grpokit.model.logprobs import check_packed_attention, completion_logprobs
from grpokit.rollout.generation import Rollout
from grpokit.train.learner import AUTO_MICRO_TOKENS, Learner, MicroBatchSize, load_model
from grpokit.train.update import PolicyUpdate

PAD = 0
CPU = torch.device("cpu")


def make_learner(*overrides: str) -> tuple[Learner, object]:
    cfg = load_config(None, ["model.device=cpu", "optim.max_grad_norm=0", *overrides])
    model, tok, precision, device = load_model(cfg, *make_tiny_model("qwen2", seed=0))
    return Learner(model, precision, device, cfg.optim, total_steps=10), cfg


def assert_close_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Every gradient within 1e-5 of its largest entry (float32 sums in another order)."""
    assert set(got) == set(want) and want
    for name, grad in want.items():
        assert float((got[name] - grad).abs().max()) <= 1e-5 * float(grad.abs().max()) + 1e-8, name


def test_token_budget_batches_by_hand():
    lengths = torch.tensor([2, 3, 4, 9, 1])
    # rows 0, 1, 2, 3 in that order, budget 6: 2 + 3 fit, 4 alone (5 + 4 > 6), 9 alone (longer than the budget)
    assert [m.tolist() for m in token_budget_batches(torch.tensor([0, 1, 2, 3]), lengths, 6)] == [
        [0, 1],
        [2],
        [3],
    ]
    # length-sorted order 4, 0, 1, 2, 3 with budget 10: 1 + 2 + 3 + 4 = 10, then 9
    assert [m.tolist() for m in token_budget_batches(torch.tensor([4, 0, 1, 2, 3]), lengths, 10)] == [
        [4, 0, 1, 2],
        [3],
    ]
    assert token_budget_batches(torch.tensor([], dtype=torch.long), lengths, 4) == []
    with pytest.raises(ValueError, match=">= 1"):
        token_budget_batches(torch.tensor([0]), lengths, 0)


def test_cut_to_count_by_hand():
    lengths = torch.tensor([2, 3, 4, 9, 1, 1])
    micros = [torch.tensor([0, 1, 2]), torch.tensor([3])]  # 9 and 9 tokens; [3] is one row and cannot be cut
    # [0, 1, 2] cut where its 9 tokens divide most evenly: after 2 + 3 = 5 (|5 - 4.5| < |2 - 4.5|)
    assert [m.tolist() for m in cut_to_count(micros, lengths, 3)] == [[0, 1], [2], [3]]
    assert [m.tolist() for m in cut_to_count(micros, lengths, 4)] == [[0], [1], [2], [3]]
    assert cut_to_count(micros, lengths, 2) == micros  # already as many: unchanged
    # the fullest cuttable one goes first: [4, 5] holds 2 tokens, [0, 1] 5
    two = [torch.tensor([4, 5]), torch.tensor([0, 1])]
    assert [m.tolist() for m in cut_to_count(two, lengths, 3)] == [[4, 5], [0], [1]]
    with pytest.raises(ValueError, match="cannot cut 4 rows into 5 micro-batches"):
        cut_to_count(micros, lengths, 5)


def test_pack_sequences_and_pack_masked_by_hand():
    ids, pos = pack_sequences([[7, 8, 9], [4, 5]])
    assert ids.tolist() == [[7, 8, 9, 4, 5]] and pos.tolist() == [[0, 1, 2, 0, 1]]
    ids, pos, where = pack_masked(torch.tensor([[0, 7, 8], [4, 5, 0]]), torch.tensor([[0, 1, 1], [1, 1, 0]]))
    assert ids.tolist() == [[7, 8, 4, 5]] and pos.tolist() == [[0, 1, 0, 1]]
    assert where.tolist() == [[-1, 0, 1], [2, 3, -1]]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("multi_turn", [False, True])
def test_packed_logprobs_entropy_and_gradient_equal_padded(arch, multi_turn):
    model, _ = make_tiny_model(arch, seed=0)
    p_ids, p_mask, c_ids, c_mask, context = ragged_batch(multi_turn=multi_turn)
    out = {}
    for packed in (False, True):
        model.zero_grad()
        lp, ent = completion_logprobs(
            model,
            p_ids,
            p_mask,
            c_ids,
            c_mask,
            temperature=0.7,
            chunk_size=5,
            with_entropy=True,
            context_mask=context,
            packed=packed,
        )  # (4, 9) each
        (
            lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)
        ).sum().backward()  # every token weighs differently
        out[packed] = (lp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()})
    (lp0, ent0, g0), (lp1, ent1, g1) = out[False], out[True]
    assert bool((lp0 != 0).sum() == c_mask.sum()) and bool((lp1[c_mask == 0] == 0).all())
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=2e-5)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=2e-5)
    assert_close_grads(g1, g0)


def test_packed_rows_do_not_see_each_other():
    """Row 0's log-probs packed beside another row are its log-probs alone: attention stays in the row."""
    model, _ = make_tiny_model("qwen2", seed=0)
    p_ids, p_mask, c_ids, c_mask, _ = ragged_batch()
    together, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, packed=True)  # (4, 9)
    alone, _ = completion_logprobs(model, p_ids[:1], p_mask[:1], c_ids[:1], c_mask[:1], packed=True)  # (1, 9)
    torch.testing.assert_close(together[:1], alone, rtol=0, atol=2e-6)
    assert check_packed_attention(model, CPU)


def test_a_gap_inside_a_row_is_refused_when_packing():
    model, _ = make_tiny_model("qwen2", seed=0)
    p_ids, p_mask, c_ids, c_mask, _ = ragged_batch()
    context = c_mask.clone()
    context[1, 2] = 0  # an unattended token inside row 1, followed by a scored one
    with pytest.raises(ValueError, match="gap inside a row"):
        completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, context_mask=context, packed=True)


def test_micro_batch_size_limits_and_splits_in_tokens():
    lengths = torch.tensor([3, 8, 2, 5])
    order = torch.tensor([2, 0, 3, 1])  # length-sorted
    micro = MicroBatchSize("auto", CPU, _NoRanks(), tokens=10)
    assert micro.packed and micro.limit(lengths) == 10
    assert [m.tolist() for m in micro.split(order, lengths, 10)] == [[2, 0, 3], [1]]  # 2 + 3 + 5, then 8
    assert MicroBatchSize("auto", CPU, _NoRanks(), tokens="auto").limit(lengths) == AUTO_MICRO_TOKENS
    # on CUDA, auto starts from the whole batch's 18 tokens (a device object only: nothing is allocated)
    assert MicroBatchSize("auto", torch.device("cuda"), _NoRanks(), tokens="auto").limit(lengths) == 18
    padded = MicroBatchSize(3, CPU, _NoRanks())
    assert not padded.packed and [m.tolist() for m in padded.split(order, lengths, 3)] == [[2, 0, 3], [1]]


class _NoRanks:
    """grpokit.train.distributed.Distributed's answers in one process."""

    active = False

    def max_int(self, value: int) -> int:
        return value


class _RankBeside:
    """Distributed's answers on rank 0 of two, the other rank holding ``other``: max_int is the all-reduce max."""

    active = True

    def __init__(self, other: int):
        self.other = other

    def max_int(self, value: int) -> int:
        return max(value, self.other)


def test_packed_micro_batches_under_torchrun_stay_by_tokens_and_take_the_largest_count():
    lengths = torch.tensor([3, 8, 2, 5, 4])
    order = torch.tensor([2, 0, 4, 3, 1])  # length-sorted: 2, 3, 4, 5, 8 tokens
    alone = MicroBatchSize("auto", CPU, _NoRanks(), tokens=10)
    assert [m.tolist() for m in alone.split(order, lengths, 10)] == [[2, 0, 4], [3], [1]]  # 9, 5, 8 tokens
    # the other rank packed 4 micro-batches: this one cuts its fullest (9 tokens: 2 + 3 | 4) to run as many
    beside = MicroBatchSize("auto", CPU, _RankBeside(4), tokens=10)
    assert beside.limit(lengths) == 10  # a token budget, not rows
    assert [m.tolist() for m in beside.split(order, lengths, 10)] == [[2, 0], [4], [3], [1]]
    # the other rank packed fewer: this rank's own count stands
    fewer = MicroBatchSize("auto", CPU, _RankBeside(1), tokens=10)
    assert [m.tolist() for m in fewer.split(order, lengths, 10)] == [[2, 0, 4], [3], [1]]


def _update_grads(overrides: list[str], r: Rollout, advantages: torch.Tensor, lora: bool = False):
    """(gradient handed to the first optimizer step, metrics) of one PolicyUpdate.update."""
    torch.manual_seed(0)  # LoRA's A matrices: the same random start in every run
    learner, cfg = make_learner(*overrides, *(["lora.enabled=true", "lora.r=4"] if lora else []))
    if lora:  # B = 0 at the start: moved, so the policy differs from the reference and A gets a gradient
        with torch.no_grad():
            for name, p in learner.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.1)
    algo = resolve_algo(cfg)
    ref = None
    if algo.uses_reference and not lora:
        ref, _ = make_tiny_model("qwen2", seed=1)  # a reference that differs from the policy: the KL is not 0
    updater = PolicyUpdate(learner, algo, cfg.optim, temperature=0.9, seed=0, ref_model=ref)
    out = {}
    grads = grads_of_one_step(learner, lambda: out.update(metrics=updater.update(r, advantages)[0]))
    return grads, out["metrics"], learner


def _long_tailed_rollout(n: int = 8, seed: int = 0) -> Rollout:
    """n rows, prompts of 1-4 tokens, completions mostly 1-3 tokens and one of 12 (the long tail)."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(1, 5, (n,), generator=g).tolist()
    c_len = [*torch.randint(1, 4, (n - 1,), generator=g).tolist(), 12]
    Lp, Lc = max(p_len), max(c_len)
    pm = torch.tensor([[0] * (Lp - k) + [1] * k for k in p_len])
    cm = torch.tensor([[1] * k + [0] * (Lc - k) for k in c_len])
    return Rollout(
        prompt_ids=torch.randint(3, 64, (n, Lp), generator=g) * pm,
        prompt_mask=pm,
        completion_ids=torch.randint(3, 64, (n, Lc), generator=g) * cm,
        completion_mask=cm,
        logprobs=torch.zeros(n, Lc),
        truncated=torch.zeros(n, dtype=torch.bool),
    )


LOSS_MODES = [
    ["algo.preset=grpo", "algo.beta=0.04"],  # seq-mean-token-mean, k3 KL in the loss (a reference pass)
    ["algo.preset=dr_grpo"],  # seq-mean-token-sum-norm
    ["algo.preset=dapo"],  # token-mean, asymmetric clipping
    ["algo.preset=gspo"],  # sequence-level ratio
    ["algo.preset=grpo", "optim.epochs=2", "optim.mini_batches=2"],  # old log-probs pass, shuffled minis
]


@pytest.mark.parametrize("mode", LOSS_MODES, ids=lambda m: " ".join(m))
def test_packed_update_gives_the_padded_gradient_for_every_loss_mode(mode):
    """Packed micro-batches of at most 7 tokens vs all rows in one padded micro-batch and vs one row at a
    time: the same gradient and loss (the mini-batch's normaliser never depends on the split)."""
    r = _long_tailed_rollout()
    advantages = torch.linspace(-1.4, 2.1, 8)  # none 0: every row runs (optim.skip_flat_rows), the budget cuts all
    runs = {
        "padded": _update_grads([*mode, "optim.micro_batch_size=8"], r, advantages),
        "padded rows of 1": _update_grads([*mode, "optim.micro_batch_size=1"], r, advantages),
        "packed 7 tokens": _update_grads(
            [*mode, "optim.packing=true", "optim.micro_batch_tokens=7"], r, advantages
        ),
    }
    for label in ("padded rows of 1", "packed 7 tokens"):
        assert_close_grads(runs[label][0], runs["padded"][0])
        assert runs[label][1]["loss"] == pytest.approx(runs["padded"][1]["loss"], rel=1e-5, abs=1e-7), label
    packed = runs["packed 7 tokens"][1]
    assert 1 < packed["micro_batch_size"] < 8  # rows of a micro-batch: several, not all (the budget cut them)
    if "algo.beta=0.04" in mode:  # the reference pass, packed too
        assert packed["kl_mean"] > 0 and packed["kl_mean"] == pytest.approx(
            runs["padded"][1]["kl_mean"], rel=1e-4
        )


@pytest.mark.slow
def test_packed_update_gives_the_padded_gradient_with_lora():
    pytest.importorskip("peft")
    r, advantages = _long_tailed_rollout(), torch.linspace(-1.5, 2.0, 8)
    grads_padded, m_padded, _ = _update_grads(
        ["algo.preset=grpo", "algo.beta=0.04", "optim.micro_batch_size=8"], r, advantages, True
    )
    grads_packed, m_packed, _ = _update_grads(
        ["algo.preset=grpo", "algo.beta=0.04", "optim.packing=true", "optim.micro_batch_tokens=7"],
        r,
        advantages,
        True,
    )
    assert all("lora_" in n for n in grads_padded)
    assert_close_grads(grads_packed, grads_padded)
    assert m_packed["loss"] == pytest.approx(m_padded["loss"], rel=1e-5, abs=1e-7)
    assert m_packed["kl_mean"] > 0 and m_packed["kl_mean"] == pytest.approx(
        m_padded["kl_mean"], rel=1e-4
    )  # adapter off


def test_packed_critic_values_and_value_gradient_equal_padded():
    from grpokit.train.critic import build_critic, completion_values

    cfg = load_config(None, ["model.device=cpu"])
    policy, _ = make_tiny_model("qwen2", seed=0)
    critic = build_critic(policy, cfg, torch.float32, CPU)
    with torch.no_grad():
        critic.score.weight.normal_(0.0, 0.5)  # not the zero head: the backbone gets a gradient too
    p_ids, p_mask, c_ids, c_mask, context = ragged_batch(multi_turn=True)
    out = {}
    for packed in (False, True):
        critic.zero_grad()
        v = completion_values(critic, p_ids, p_mask, c_ids, c_mask, context, packed=packed)  # (4, 9)
        ((v - 0.3) ** 2).sum().backward()
        out[packed] = (v.detach(), {n: p.grad.clone() for n, p in critic.named_parameters()})
    assert bool((out[True][0][c_mask == 0] == 0).all()) and bool((out[False][0][c_mask == 1] != 0).all())
    torch.testing.assert_close(out[True][0], out[False][0], rtol=0, atol=2e-5)
    assert_close_grads(out[True][1], out[False][1])


def test_sft_learner_step_packed_by_tokens_equals_padded():
    """The Learner's supervised step (SFT's path): examples packed into micro-batches of at most 9 tokens
    through learner.micro.split and data.sft.collate give the padded step's gradient."""
    from grpokit.data.sft import SFTExample, collate
    from grpokit.model.logprobs import token_logprobs

    g = torch.Generator().manual_seed(0)
    examples = []
    for length in (3, 7, 2, 5, 4):
        ids = torch.randint(3, 64, (length,), generator=g).tolist()
        examples.append(SFTExample(ids, [0] + [1] * (length - 1)))
    lengths = torch.tensor([len(e.input_ids) for e in examples])
    n_tokens = sum(e.num_loss_tokens for e in examples)

    def nll(model, batch):
        lp = token_logprobs(
            model,
            batch["input_ids"],
            batch["loss_mask"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            chunk_size=4,
        )
        return -lp.sum(), {
            "rows": int(batch["input_ids"].shape[0]),
            "width": int(batch["input_ids"].shape[1]),
        }

    grads, stats = {}, {}
    for label, extra in (
        ("padded", ["optim.micro_batch_size=5"]),
        ("packed", ["optim.micro_batch_tokens=9"]),
    ):
        cfg = load_config(None, ["model.device=cpu", "optim.max_grad_norm=0", *extra])
        model, _, precision, device = load_model(cfg, *make_tiny_model("qwen2", seed=0))
        learner = Learner(model, precision, device, cfg.optim, total_steps=10, packing=label == "packed")
        order = lengths.argsort(stable=True)

        def split(limit, learner=learner, order=order, packing=label == "packed"):
            return [
                collate([examples[i] for i in m.tolist()], PAD, packing)
                for m in learner.micro.split(order, lengths, limit)
            ]

        out = {}
        grads[label] = grads_of_one_step(
            learner,
            lambda learner=learner, split=split, out=out: out.update(
                r=learner.step(lengths, split, nll, n_tokens)
            ),
        )
        stats[label] = out["r"][1]
    # lengths sorted 2, 3, 4, 5, 7; budget 9: 2 + 3 + 4, then 5, then 7 (5 + 7 > 9), each one packed row
    assert [(s["rows"], s["width"]) for s in stats["packed"]] == [(1, 9), (1, 5), (1, 7)]
    assert [(s["rows"], s["width"]) for s in stats["padded"]] == [(5, 7)]
    assert_close_grads(grads["packed"], grads["padded"])


def test_auto_token_budget_halves_after_an_out_of_memory_error_and_stops_at_the_longest_row():
    """On CUDA (a device object only: nothing is allocated) auto starts from the batch's 40 tokens, halves
    to 20, then to the longest row (12) at least, and says so; a budget that still fails is an error."""
    from grpokit.core.errors import TrainingError
    from grpokit.train.distributed import Distributed

    lengths = torch.tensor([12, 8, 6, 4, 10])  # 40 tokens
    notes, tried, dropped = [], [], []

    def fn(limit: int) -> int:
        tried.append(limit)
        if limit > 12:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return len(micro.split(lengths.argsort(stable=True), lengths, limit))

    micro = MicroBatchSize("auto", torch.device("cuda"), Distributed(), notes.append, tokens="auto")
    assert micro.run(fn, lengths, on_oom=lambda: dropped.append(1)) == 4  # 4+6, 8, 10, 12
    assert tried == [40, 20, 12] and micro.cap == 12 and len(dropped) == 2
    assert micro.last == 2  # the most rows a micro-batch held
    assert notes == [
        "out of GPU memory at 40 tokens per micro-batch: retrying with 20 (auto)",
        "out of GPU memory at 20 tokens per micro-batch: retrying with 12 (auto)",
    ]

    def never(limit: int) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    with pytest.raises(TrainingError, match="micro-batches of 12 tokens.*optim.micro_batch_tokens"):
        micro.run(never, lengths, on_oom=lambda: None)


# The whole PPO step's tolerance, relative to each gradient's largest entry. Each entry is a float32 sum over the
# step's <= 160 completion tokens: two summation orders can differ by up to 2 * 160 * 2**-24 = 1.9e-5 of the sum
# of its terms' magnitudes, and here that sum exceeds the tensor's largest entry, because the whitened GAE
# advantages have both signs and their terms cancel (an entry of 2.4e-3 came out 9.5e-8 apart: 600 of its own
# ulps). 1e-4 allows terms summing to 5x the largest entry. Measured on this test's batch: 1.5e-5 at
# OMP_NUM_THREADS=2 and 5.9e-6 at 1 (the old bound, 1e-5, passed or not by the thread count). Packed rows that see
# the wrong positions move every gradient by 6e-3 to 1e0 of its largest entry: far above 1e-4.
PPO_STEP_RTOL = 1e-4


@pytest.mark.slow
def test_a_ppo_trainer_step_packed_gives_the_padded_gradients(tmp_path):
    """The whole trainer (sampling, reference, critic values, GAE, both updates): packed by 24 tokens vs
    padded rows of 16, the same rollouts, the same policy and critic gradients (within PPO_STEP_RTOL)."""
    from grpo_runs import make_trainer

    results = {}
    for label, extra in (
        ("padded", ["optim.micro_batch_size=16"]),
        ("packed", ["optim.packing=true", "optim.micro_batch_tokens=24"]),
    ):
        trainer = make_trainer(
            tmp_path / label,
            "algo.preset=ppo",
            "algo.beta=0.04",
            "rollout.max_new_tokens=10",
            "train.samples_every=0",
            *extra,
            eos_ids=[1, *range(30, 40)],  # completions of many lengths
        )
        with torch.no_grad():
            trainer.critic.model.score.weight.normal_(0.0, 0.5)  # the backbone gets a gradient too
        grads = {"policy": [], "critic": []}
        for part, learner in (("policy", trainer.learner), ("critic", trainer.critic.learner)):
            learner.optimizer.register_step_pre_hook(
                lambda *_, g=grads[part], m=learner.model: g.extend(
                    p.grad.detach().clone() for p in m.parameters() if p.grad is not None
                )
            )
        results[label] = (grads, trainer.train_step())
    (g0, m0), (g1, m1) = results["padded"], results["packed"]
    assert m0["completion_len/min"] < m0["completion_len/max"]  # ragged rows
    assert m1["micro_batch_size"] < 16  # the budget cut the batch into several packed micro-batches
    for part in ("policy", "critic"):
        assert len(g0[part]) == len(g1[part]) > 0
        for a, b in zip(g0[part], g1[part]):
            assert float((a - b).abs().max()) <= PPO_STEP_RTOL * float(a.abs().max()) + 1e-8, part
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-5, abs=1e-7)
    assert m1["critic/value_loss"] == pytest.approx(m0["critic/value_loss"], rel=1e-5)


def test_a_token_budget_without_packing_is_refused_not_ignored():
    from grpokit.config.checks import check_settings_in_use
    from grpokit.config.sft import load_sft_config
    from grpokit.core.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"optim.micro_batch_tokens=2048: taken only with optim.packing=true"
    ):
        check_settings_in_use(load_config(None, ["optim.micro_batch_tokens=2048"]))
    check_settings_in_use(load_config(None, ["optim.micro_batch_tokens=2048", "optim.packing=true"]))
    check_settings_in_use(load_sft_config(None, ["optim.micro_batch_tokens=2048", "sft.packing=true"]))
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        check_settings_in_use(load_sft_config(None, ["optim.micro_batch_tokens=2048"]))

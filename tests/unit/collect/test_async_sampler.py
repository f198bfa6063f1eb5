"""Asynchronous rollouts (rollout.max_staleness, grpokit.collect.async_sampler) in tiny real runs: K = 0 is the
synchronous run bit for bit; with K >= 1 no trained batch is older than K, each batch's sampler log-probs are
those of the weights that made it and are what the importance weights divide by; a killed sampler process
stops the run with a checkpoint; the settings it cannot run with are refused."""

from __future__ import annotations

import copy
import math
import os
import pickle
import signal
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from episode_parts import count_digits, turns_reward, used_tool
from grpo_runs import ROWS, has_seven, make_cfg, make_trainer
from tiny_model import make_tiny_model
from tool_model import tool_model
from update_parts import fixed_rollout, grads_of_one_step, make_learner, row_logprobs

from grpokit.collect.async_sampler import SamplerDiedError
from grpokit.collect.source import SyncSource
from grpokit.collect.transport import _shared_payload, trainable_parameters
from grpokit.config.schema import ConfigError, load_config, resolve_algo
from grpokit.core.errors import RewardFunctionError
from grpokit.train.mismatch import MismatchCorrection, MismatchError, MismatchGuard
from grpokit.train.update import PolicyUpdate
from grpokit.train.update_stats import UpdateStats
from grpokit.trainers.grpo import GRPOTrainer

VARYING = ("time/", "step_time", "tokens_per_s", "peak_memory_mb")  # wall-clock numbers (and reward/*/seconds): the rest
# must match exactly


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.state_dict().items()}


@pytest.mark.slow
def test_max_staleness_0_is_the_synchronous_run_bit_for_bit(tmp_path):
    runs = []
    for name, extra in (("default", ()), ("k0", ("rollout.max_staleness=0",))):
        trainer = make_trainer(tmp_path / name, *extra)
        assert type(trainer.source) is SyncSource  # the synchronous code path: no process, no queue
        trainer.train()
        lines = [
            {k: v for k, v in m.items() if not k.startswith(VARYING) and not k.endswith("/seconds")}
            for m in trainer.log_history
        ]
        runs.append((lines, weights(trainer.model)))
    (lines_a, weights_a), (lines_b, weights_b) = runs
    assert lines_a == lines_b and len(lines_a) == 3
    assert not any(k.startswith("async/") for k in lines_a[0])
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name


def slow_reward(prompts, completions, **kw):
    """has_seven, slowly (it runs in the sampler process): the trainer waits for every batch."""
    time.sleep(0.3)
    return has_seven(prompts, completions)


class RecordingUpdate(PolicyUpdate):
    """Keeps each update's rollout and what the importance weights were computed from."""

    seen: list[dict] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        inner, seen = self.correction, self.seen

        class Recording:
            def weights(self, old, sampled, mask):
                seen[-1]["sampled"].append(sampled.detach().clone())
                return inner.weights(old, sampled, mask)

        self.correction = Recording()

    def update(self, r, advantages, old_logprobs=None, ref_logprobs=None, **kwargs):
        self.seen.append({"rollout": r, "sampled": []})
        return super().update(r, advantages, old_logprobs, ref_logprobs, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_no_batch_older_than_k_is_trained_and_each_ratio_uses_the_log_probs_of_its_version(start, tmp_path, monkeypatch):
    """K = 1 with weights pushed every 3 steps: batches can be 2 steps old (the sampler holds version 0 until
    step 3), so some are dropped; the sampler is slow (its reward sleeps). Every batch trained is at most 1
    step old; its log-probs are its version's (the weights after that many steps), not the trainer's."""
    monkeypatch.setenv("GRPOKIT_SAMPLER_START", start)  # fork: a CPU run's default (start_method)
    RecordingUpdate.seen = []
    versions = {0: None}  # version -> the weights after that many steps

    def keep(step, metrics, trainer):
        versions[step] = weights(trainer.model)

    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = make_cfg(tmp_path, "rollout.max_staleness=1", "rollout.sync_every=3", "train.steps=6", "train.samples_every=0")
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, eval_rows=ROWS[:8],
        reward_functions=[("has_seven", slow_reward, 1.0)], updater=RecordingUpdate, callbacks=[keep],
    )  # fmt: skip
    versions[0] = weights(trainer.model)
    assert trainer.source.process.start_method == start
    trainer.train()
    history = trainer.log_history
    assert len(history) == 6 == len(RecordingUpdate.seen)
    trained = []
    for m in history:
        step = m["step"] - 1  # the trainer's version when it took the batch
        version = int(m["async/version"])
        assert 0 <= step - version <= 1 and m["async/staleness_max"] == step - version
        trained.append(step - version)
    assert 1 in trained  # overlap happened: some batch was made while the previous one trained
    # pushes at steps 3 and 6 only: the batches of steps 2 and 5 would be made with versions 0 and 3 (2 old):
    # each is dropped and the newest weights pushed at once
    assert sum(m["async/dropped"] for m in history) >= 16 and trainer.source.process.dropped_total >= 16
    model, _ = make_tiny_model("qwen2", seed=0)
    for m, seen in zip(history, RecordingUpdate.seen):
        version, step, r = int(m["async/version"]), m["step"] - 1, seen["rollout"]
        i = 0
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
        completion = r.completion_ids[i][r.completion_mask[i].bool()].tolist()
        sampled = r.logprobs[i, : len(completion)]
        with torch.no_grad():
            model.load_state_dict(versions[version])
            own = row_logprobs(model, prompt, completion, 1.0)
            model.load_state_dict(versions[step])
            current = row_logprobs(model, prompt, completion, 1.0)
        assert torch.allclose(sampled, own, atol=1e-4), (m["step"], sampled, own)
        if version != step:  # the trainer's weights had moved on: the sampler's are not its own
            assert (sampled - current).abs().max() > 1e-3
        # the importance weights (token_truncate, auto with K >= 1) divided by exactly the batch's log-probs, each
        # row once (one pass, two mini-batches); padding holds 0
        given = torch.cat([s.flatten() for s in seen["sampled"]])
        given = given[given != 0].sort().values
        assert torch.equal(given, r.logprobs[r.completion_mask.bool()].sort().values)


@pytest.mark.slow
def test_a_killed_sampler_process_stops_the_run_with_a_named_error_and_a_checkpoint(tmp_path):
    shared = []  # the sizes of the process's torch shared-memory mappings before it is killed

    def kill_at_two(step, metrics, trainer):
        if step == 2:
            maps = Path(f"/proc/{trainer.source.process.pid}/maps").read_text().splitlines()
            spans = [line.split()[0].split("-") for line in maps if "/dev/shm/torch_" in line]
            shared.extend(int(end, 16) - int(start, 16) for start, end in spans)
            os.kill(trainer.source.process.pid, signal.SIGKILL)

    trainer = make_trainer(
        tmp_path, "rollout.max_staleness=1", "train.steps=8", "train.samples_every=0", callbacks=[kill_at_two]
    )
    with pytest.raises(SamplerDiedError, match="killed by SIGKILL") as caught:
        trainer.train()
    # the batch it had made before it died may still be trained; then the run stops at the next take
    assert trainer.step in (2, 3)
    assert f"Checkpoint of step {trainer.step}" in str(caught.value)
    assert (tmp_path / "run" / "checkpoints" / f"step_{trainer.step:06d}").is_dir()
    # it maps the pushed weights' buffers, each at most one parameter's pages; the pickled policy it started
    # from (larger than any parameter) was freed once loaded, not kept for the run
    largest = max(p.numel() * p.element_size() for p in trainer.model.parameters())
    assert shared and max(shared) <= -(-largest // 4096) * 4096


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            ["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.mode=server",
             "rollout.vllm.server_url=http://127.0.0.1:8000"],
            "rollout.vllm.mode=server: the sampler process and the trainer's evaluation",
        ),
        (
            ["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.sync_every=2"],
            "rollout.vllm.sync_every=2: the sampler process's engine would keep weights older",
        ),
        (["rollout.sync_every=2"], "taken only with rollout.max_staleness >= 1"),
        (["rollout.max_staleness=-1"], "rollout.max_staleness"),
    ],
)
def test_settings_async_cannot_run_with_are_refused_with_the_reason(overrides, words):
    with pytest.raises(ConfigError, match=words):
        load_config(None, overrides)


def test_auto_correction_is_token_truncate_for_stale_samples():
    cfg = load_config(None, ["rollout.max_staleness=2"])  # the batch source's largest age: 2 steps
    assert MismatchCorrection.from_settings(cfg.rollout, 2) == MismatchCorrection("token_truncate", 2.0, None)
    cfg = load_config(None, ["rollout.max_staleness=2", "rollout.mismatch_correction=token_mask"])
    assert MismatchCorrection.from_settings(cfg.rollout, 2).mode == "token_mask"
    assert MismatchCorrection.from_settings(load_config(None, []).rollout) is None  # synchronous, fast engine


def test_effective_sample_size_of_the_weights_by_hand():
    """Weights (1, 1, 2, 0) over 4 loss tokens, a fifth token outside the mask: (1+1+2+0)^2 / (4 * 6) = 2/3."""
    stats = UpdateStats()
    w = torch.tensor([[1.0, 1.0, 2.0, 0.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    stats.add_is_weights(w, torch.ones_like(w, dtype=torch.bool), mask)
    assert stats.metrics(n_updates=1)["mismatch/ess"] == pytest.approx(2 / 3, abs=1e-12)
    equal = UpdateStats()
    equal.add_is_weights(torch.full((2, 3), 0.5), torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 3))
    assert equal.metrics(n_updates=1)["mismatch/ess"] == pytest.approx(1.0, abs=1e-12)
    assert math.isnan(UpdateStats().metrics(n_updates=1).get("mismatch/ess", math.nan))


def current_logprobs(learner, r) -> torch.Tensor:
    """(N, Lc) the learner's log-probs of fixed_rollout's completions, 0 at padding."""
    out = torch.zeros(r.completion_ids.shape)
    for i in range(r.completion_ids.shape[0]):
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
        completion = r.completion_ids[i][r.completion_mask[i].bool()].tolist()
        with torch.no_grad():
            out[i, : len(completion)] = row_logprobs(learner.model, prompt, completion, 1.0)
    return out


def test_the_behaviour_ratio_divides_by_the_samplers_log_probs():
    """rollout.async_ratio=behaviour, one pass, clip eps 0.2, every advantage > 0. Sampler log-probs equal to the
    policy's: ratio 1, the same gradient as the proximal ratio (bit for bit up to float rounding). Sampler
    log-probs 3 nats lower on every token: rho = e^3 > 1.2, so each clipped term is the constant 1.2 A and the
    gradient is 0; the proximal ratio (the policy's own, 1) still has one."""
    advantages = torch.tensor([1.0, 0.5, 0.25, 2.0])
    grads = {}
    for name, behaviour, shift in (("proximal", False, 0.0), ("same", True, 0.0), ("older", True, -3.0)):
        learner, cfg = make_learner("algo.preset=grpo", "algo.beta=0")
        r = fixed_rollout()
        r.logprobs = (current_logprobs(learner, r) + shift) * r.completion_mask
        updater = PolicyUpdate(
            learner, resolve_algo(cfg), cfg.optim, temperature=1.0, seed=0, behaviour_ratio=behaviour
        )
        grads[name] = grads_of_one_step(learner, lambda u=updater, r=r: u.update(r, advantages))
    scale = max(float(g.abs().max()) for g in grads["proximal"].values())
    assert scale > 1e-4
    for key, g in grads["proximal"].items():
        assert float((grads["same"][key] - g).abs().max()) <= 1e-5 * scale, key
        assert float(grads["older"][key].abs().max()) == 0.0, key


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, metric",
    [
        (("rollout.mismatch_correction=token_mask", "rollout.mismatch_cap=1.05"), "mismatch/bounded_frac"),
        (("rollout.mismatch_correction=sequence_truncate",), "mismatch/weight_mean"),
        (("rollout.async_ratio=behaviour", "algo.preset=dppo_tv"), "masked_frac/trust_region"),
    ],
)
def test_each_correction_acts_on_stale_batches(tmp_path, overrides, metric):
    """K = 1 at a high learning rate: the batches of steps 2-4 are one step old. The token mask (cap 1.05) and
    the sequence weights leave step 1 (sampled by the trainer's own weights) as it is and act on the stale
    steps; with the behaviour ratio, DPPO's trust region is measured from the sampler's policy and masks
    tokens of the stale steps (no importance weights then: auto is none)."""
    trainer = make_trainer(tmp_path, "rollout.max_staleness=1", "train.steps=4", "train.samples_every=0", *overrides)
    trainer.train()
    history = trainer.log_history
    stale = [m for m in history if m["async/staleness_max"] == 1]
    assert stale, "no step trained a stale batch"
    if metric == "mismatch/bounded_frac":
        assert history[0][metric] == 0.0 and max(m[metric] for m in stale) > 0
    elif metric == "mismatch/weight_mean":
        assert history[0][metric] == pytest.approx(1.0, abs=1e-3)
        assert max(abs(m[metric] - 1.0) for m in stale) > 0.01
    else:
        assert not any(k.startswith("mismatch/") for k in history[0])
        assert max(m[metric] for m in stale) > 0


@pytest.mark.slow
def test_with_lora_the_adapter_is_pushed_and_sampling_follows_it(tmp_path):
    """LoRA, K = 1, a push after every step: only the adapter's parameters travel (the frozen base never
    changes), and the batch of each step is sampled by the policy of its version (the adapter after that
    many steps), not by the first one: the pushes reach the sampler."""
    RecordingUpdate.seen = []
    policies = {}

    def keep(step, metrics, trainer):
        policies[step] = copy.deepcopy(trainer.model).eval()

    trainer = make_trainer(
        tmp_path, "rollout.max_staleness=1", "lora.enabled=true", "lora.r=4", "train.steps=4", "eval.enabled=false",
        "train.samples_every=0", "optim.lr=3e-2", updater=RecordingUpdate, callbacks=[keep],
    )  # fmt: skip
    pushed = trainable_parameters(trainer.model)
    assert pushed and all("lora_" in name for name in pushed)
    policies[0] = copy.deepcopy(trainer.model).eval()
    trainer.train()
    later = [(m, seen) for m, seen in zip(trainer.log_history, RecordingUpdate.seen) if m["async/version"] >= 2]
    assert later, "no batch of version 2 or later"
    for m, seen in later:
        r, version = seen["rollout"], int(m["async/version"])
        prompt = r.prompt_ids[0][r.prompt_mask[0].bool()].tolist()
        completion = r.completion_ids[0][r.completion_mask[0].bool()].tolist()
        with torch.no_grad():
            own = row_logprobs(policies[version], prompt, completion, 1.0)
            first = row_logprobs(policies[0], prompt, completion, 1.0)
        sampled = r.logprobs[0, : len(completion)]
        assert torch.allclose(sampled, own, atol=1e-4), (version, sampled, own)
        assert (sampled - first).abs().max() > 1e-3


def test_the_mismatch_watch_names_the_samples_age_in_asynchronous_runs():
    said, said_sync = [], []
    MismatchGuard(0.01, said.append, max_staleness=2).check({"sampler_kl": 0.5}, 3)
    MismatchGuard(0.01, said_sync.append).check({"sampler_kl": 0.5}, 3)
    assert "rollout.max_staleness=2" in said[0] and "samples' age" in said[0]
    assert "max_staleness" not in said_sync[0]
    guard = MismatchGuard(0.01, lambda m: None, max_staleness=1)
    with pytest.raises(MismatchError, match="rollout.max_staleness=1"):
        for step, kl in enumerate((0.1, 0.2, 0.3)):
            guard.check({"sampler_kl": kl}, step)


def broken_reward(prompts, completions, **kw):
    raise ValueError("the answer column is missing")


@pytest.mark.slow
def test_a_reward_failing_in_the_sampler_stops_the_run_and_leaves_no_process(tmp_path):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = make_cfg(tmp_path, "rollout.max_staleness=1", "eval.enabled=false")
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("broken", broken_reward, 1.0)]
    )
    trainer.source.process.start()
    pid = trainer.source.process.pid
    # a fresh interpreter (multiprocessing's spawn), not a fork of the trainer: it can use CUDA the trainer has.
    # Asked of the process object: /proc/<pid>/cmdline reads empty once the failing process has exited (a zombie)
    assert trainer.source.process.start_method == "spawn"
    assert type(trainer.source.process.process).__name__ == "SpawnProcess"
    # the user's code failing in the process keeps its kind (exit 3), not the process's (4): issue 48
    with pytest.raises(RewardFunctionError, match="in the sampler process, batch 0: step 1: .*answer column"):
        trainer.train()
    assert trainer.step == 0 and trainer.source.process.pid is None
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")  # ended and reaped by train()


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_a_reward_the_sampler_process_cannot_import_is_refused_before_the_model_loads(tmp_path, monkeypatch, start):
    """A spawned sampler (a GPU's, vLLM's) is a fresh interpreter: a lambda cannot reach it. Refused by name before
    any model loads (no model is given and model.name_or_path names none); on a forked run too (a CPU-only run's
    default), which could take it, so that the same config runs on a GPU. The message says which is which."""
    monkeypatch.setenv("GRPOKIT_SAMPLER_START", start)
    cfg = make_cfg(tmp_path, "rollout.max_staleness=1", f"model.name_or_path={tmp_path / 'no-model'}")
    said = (
        r"the reward functions cannot be sent to the sampler process: .*lambda.*a fork of this one on a CPU-only "
        r"run, but a fresh interpreter \(spawn\) with CUDA or vLLM.*refused on every run, forked too"
    )
    with pytest.raises(ConfigError, match=said):
        GRPOTrainer(cfg, train_rows=ROWS, reward_functions=[("seven", lambda prompts, completions, **kw: [], 1.0)])


def test_the_policy_reaches_the_process_without_the_trainers_hooks():
    """Gradient checkpointing with LoRA hangs a nested function on the embeddings (pickle cannot take it): the
    policy sent to the sampler process leaves the hooks behind and keeps every weight."""
    model, _ = make_tiny_model("qwen2", seed=0)

    def make_inputs_require_grads(module, args, output):  # what transformers' enable_input_require_grads adds
        output.requires_grad_(True)

    model.get_input_embeddings().register_forward_hook(make_inputs_require_grads)
    with pytest.raises((AttributeError, pickle.PicklingError)):
        pickle.dumps(model)
    payload = _shared_payload(("recipe", model))
    label, copied = pickle.loads(memoryview(payload.numpy()))
    assert label == "recipe" and not copied.get_input_embeddings()._forward_hooks
    assert model.state_dict().keys() == copied.state_dict().keys()
    for name, value in model.state_dict().items():
        assert torch.equal(value, copied.state_dict()[name]), name
    ids = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, copied(input_ids=ids).logits)


def test_transformers_own_input_grad_hooks_stay_behind_and_a_checkpointed_run_goes_async(tmp_path):
    """transformers 5's enable_input_require_grads (gradient checkpointing) also keeps the hooks' handles as model
    attributes (_require_grads_hook, _require_grads_hooks), and a handle pickles the hook it removes: before, every
    asynchronous run with model.gradient_checkpointing=true stopped at its start ("the policy cannot be sent")."""
    model, _ = make_tiny_model("qwen2", seed=0)
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    assert any(isinstance(v, list) for k, v in vars(model).items() if k.startswith("_require_grads_hook"))
    label, copied = pickle.loads(memoryview(_shared_payload(("recipe", model)).numpy()))
    assert label == "recipe" and not any(k.startswith("_require_grads_hook") for k in vars(copied))
    trainer = make_trainer(tmp_path, "rollout.max_staleness=1", "model.gradient_checkpointing=true", "train.steps=2",
                           "train.samples_every=0", "eval.enabled=false")  # fmt: skip
    trainer.train()
    assert [m["step"] for m in trainer.log_history] == [1, 2]


@pytest.mark.gpu
@pytest.mark.slow
def test_on_a_gpu_the_sampler_process_samples_on_the_trainers_device(tmp_path):
    """K = 1 on CUDA (spawned, so the trainer's CUDA does not stop it): a fresh batch's sampler log-probs are the
    trainer's own up to the GPU's rounding, and every batch is at most 1 step old."""
    trainer = make_trainer(
        tmp_path, "rollout.max_staleness=1", "model.device=cuda", "train.steps=3", "train.samples_every=0",
        "eval.enabled=false",
    )  # fmt: skip
    trainer.train()
    history = trainer.log_history
    assert len(history) == 3
    assert all(0 <= (m["step"] - 1) - m["async/version"] <= 1 for m in history)
    fresh = [m for m in history if m["async/staleness_max"] == 0]
    assert fresh and all(m["sampler_logprob_diff/max"] < 1e-2 for m in fresh)


# multi-turn episodes in the sampler process: a tool the random tiny model calls whenever its turn holds a digit,
# and a 3-turn environment (tests/episode_parts.py)


def test_a_tool_of_a_notebook_is_refused_before_the_sampler_process_starts(tmp_path, monkeypatch):
    """A tool named "__main__:count_digits" (what name_callables makes of a notebook's function) while __main__ has
    no file, as a notebook's has not: the sampler process could not import it. Refused by name when the trainer
    is built, not as a dead process at the first batch."""
    notebook = types.ModuleType("__main__")  # no __file__, no __spec__
    notebook.count_digits = count_digits
    monkeypatch.setitem(sys.modules, "__main__", notebook)
    model, tok = tool_model()
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}", "rollout.max_staleness=1", "model.device=cpu",
            "rollout.max_new_tokens=8", "rollout.tool_parser=episode_parts:digit_parser",
            "rollout.tools=[__main__:count_digits]",
        ],
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"__main__:count_digits is defined in __main__ \(a notebook"):
        GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("used_tool", used_tool, 1.0)])


@pytest.mark.slow
@pytest.mark.parametrize(
    "episodes, reward, ran",
    [
        (
            ["rollout.tool_parser=episode_parts:digit_parser", "rollout.tools=[episode_parts:count_digits]"],
            ("used_tool", used_tool, 1.0),
            "tools/calls",
        ),
        (["rollout.environment=episode_parts:Countdown"], ("turns", turns_reward, 1.0), "episode/turns_mean"),
    ],
    ids=["tools", "environment"],
)
def test_multi_turn_episodes_run_in_the_sampler_and_the_ratio_uses_its_log_probs_of_the_models_tokens(
    tmp_path, episodes, reward, ran
):
    """K = 1 with tools, and with an environment: the episodes (tool calls, the environment's turns) run in the
    sampler process and the run trains. Each batch's log-probs are those of the version that sampled it,
    teacher-forced over the whole episode (tool results, the environment's messages in the context), on the
    model's own tokens; the other tokens hold 0 and carry no loss; the importance weights divide by exactly the
    model tokens' log-probs."""
    RecordingUpdate.seen = []
    versions, processes = {}, set()

    def keep(step, metrics, trainer):
        versions[step] = weights(trainer.model)
        processes.add(trainer.source.process.process)

    model, tok = tool_model()
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}", "train.steps=3", "train.samples_every=0",
            "train.stop_after_flat_steps=0", "rollout.group_size=4", "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=8", "rollout.max_turns=3", *episodes, "optim.lr=3e-3", "model.device=cpu",
            "algo.preset=grpo", "eval.enabled=false", "rollout.max_staleness=1",
        ],
    )  # fmt: skip
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[reward], updater=RecordingUpdate,
        callbacks=[keep],
    )  # fmt: skip
    versions[0] = weights(trainer.model)
    trainer.train()
    history = trainer.log_history
    assert len(history) == 3 == len(RecordingUpdate.seen)
    assert all(math.isfinite(m["loss"]) for m in history)
    assert sum(m[ran] for m in history) > 0  # counted in the sampler process, sent with each batch
    assert [p.exitcode for p in processes] == [0]  # the run's end stopped it, with its tool/environment workers
    policy, _ = tool_model()
    tool_tokens = 0
    for m, seen in zip(history, RecordingUpdate.seen):
        r, version = seen["rollout"], int(m["async/version"])
        assert 0 <= (m["step"] - 1) - version <= 1
        policy.load_state_dict(versions[version])
        for i in range(r.completion_ids.shape[0]):
            prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
            context = r.context_mask[i].bool()  # the model's tokens and the tools' results, in order
            model_token = r.completion_mask[i][context].bool()
            with torch.no_grad():
                own = row_logprobs(policy, prompt, r.completion_ids[i][context].tolist(), 1.0)
            sampled = r.logprobs[i][context]
            assert torch.allclose(sampled[model_token], own[model_token], atol=1e-4), (m["step"], i)
            assert torch.equal(sampled[~model_token], torch.zeros(int((~model_token).sum())))
            tool_tokens += int((~model_token).sum())
        # (padding holds 0, and so may a near-certain model token: both sides leave out exact zeros)
        given, own_tokens = torch.cat([s.flatten() for s in seen["sampled"]]), r.logprobs[r.completion_mask.bool()]
        assert torch.equal(given[given != 0].sort().values, own_tokens[own_tokens != 0].sort().values)
    assert tool_tokens > 0  # some episode had a tool result (an environment message) in its context


def test_a_cpu_run_forks_its_sampler_and_spawns_it_where_a_fork_cannot_serve(monkeypatch):
    # a fork starts the first batch in 0.2 s where a fresh interpreter takes 5-12 s (the 2-core CPU); CUDA or
    # vLLM need the fresh interpreter; the environment variable chooses, and a fork it cannot serve is refused
    from grpokit.collect.async_sampler import start_method

    monkeypatch.delenv("GRPOKIT_SAMPLER_START", raising=False)
    assert not torch.cuda.is_initialized()
    assert start_method("fast") == "fork" and start_method("hf") == "fork"
    assert start_method("vllm") == "spawn"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert start_method("fast") == "spawn"
    monkeypatch.setenv("GRPOKIT_SAMPLER_START", "fork")
    with pytest.raises(ConfigError, match="GRPOKIT_SAMPLER_START=fork: a forked sampler process cannot use CUDA"):
        start_method("fast")
    monkeypatch.setenv("GRPOKIT_SAMPLER_START", "spawn")
    assert start_method("fast") == "spawn"
    monkeypatch.setenv("GRPOKIT_SAMPLER_START", "thread")
    with pytest.raises(ConfigError, match="GRPOKIT_SAMPLER_START='thread': expected spawn or fork"):
        start_method("fast")

"""TRL parity, item by item (issue 30): what a TRL 1.16 user moving over gets. TRL-dependent checks
skip without `trl` (CI installs it: .ci/run)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from grpokit.algos import PRESETS, compute_advantages
from grpokit.algos.advantages import group_advantages, rloo_advantages
from grpokit.rollout.batch import flat_groups


def trl_advantages(rewards: torch.Tensor, G: int, scale: str) -> torch.Tensor:
    """TRL 1.16's sum_then_normalize path (grpo_trainer.py, _generate_and_score_completions), rewards NaN
    where every function said None: nanmean / nanstd (unbiased), 1e-4, NaN advantages set to 0."""
    from trl.trainer.utils import nanstd

    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G)
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


# ------------------------------------------------------------------ item 2: None semantics


def test_unscored_rows_are_left_out_of_the_group_statistics():
    # G=3, rewards [1, 0, -]: mean 0.5 over the two scored, unbiased std 0.7071 -> +-0.7071, and 0.
    # Counting the unscored row as 0 would give mean 1/3, std 0.5774: [1.1547, -0.5774, -0.5774].
    rewards = torch.tensor([1.0, 0.0, 0.0])
    scored = torch.tensor([True, True, False])
    adv = group_advantages(rewards, 3, scored=scored, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.70710678, -0.70710678, 0.0]))
    adv_all = group_advantages(rewards, 3, eps=0.0)
    torch.testing.assert_close(adv_all, torch.tensor([1.1547005, -0.5773503, -0.5773503]))
    # Dr. GRPO: centred only, 0.5 / -0.5 / 0; RLOO: n=2 scored, so 2 * centred
    torch.testing.assert_close(group_advantages(rewards, 3, scale="none", scored=scored), torch.tensor([0.5, -0.5, 0.0]))
    torch.testing.assert_close(rloo_advantages(rewards, 3, scored), torch.tensor([1.0, -1.0, 0.0]))


def test_a_group_with_one_scored_row_or_none_is_flat():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 3.0])
    scored = torch.tensor([True, False, False, False, False, False])
    assert group_advantages(rewards, 3, scored=scored).abs().max() == 0
    assert flat_groups(rewards, 3, scored=scored).tolist() == [True, True]
    assert flat_groups(rewards, 3).tolist() == [False, False]


@pytest.mark.parametrize("estimator", ["group_std", "group_centre", "group_centre_reward_std", "token_whiten", "gae"])
def test_every_estimator_gives_unscored_rows_exactly_zero(estimator):
    torch.manual_seed(0)
    N, L = 8, 5
    rewards = torch.rand(N)
    scored = torch.tensor([True, False, True, True, True, True, False, True])
    mask = torch.ones(N, L)
    settings = PRESETS["grpo"].override(advantage=estimator)
    adv = compute_advantages(rewards, 4, settings, completion_mask=mask, scored=scored, values=torch.zeros(N, L))
    rows = adv if adv.dim() == 1 else adv.abs().sum(1)
    assert rows[~scored].abs().max() == 0 and rows[scored].abs().min() > 0


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_none_semantics_and_scales_match_trls_formula(scale):
    pytest.importorskip("trl")
    from grpokit.config.trl import SCALE_REWARDS

    torch.manual_seed(1)
    rewards = torch.randint(0, 4, (12,)).float() / 2
    rewards[[2, 7, 8]] = float("nan")  # every function said None there
    scored = ~rewards.isnan()
    settings = PRESETS["grpo"].override(advantage=SCALE_REWARDS[scale], std_eps=1e-4)
    ours = compute_advantages(rewards.nan_to_num(0.0), 4, settings, scored=scored)
    torch.testing.assert_close(ours, trl_advantages(rewards, 4, scale), rtol=1e-5, atol=1e-6)


def test_trls_batch_scale_is_the_std_of_the_rewards_not_of_the_centred_ones():
    # two groups [0, 1] and [2, 3]: centred +-0.5 each; std of the centred (unbiased) 0.5774, of the
    # rewards themselves 1.2910: TRL's scale_rewards="batch" divides by the second.
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0])
    lite = group_advantages(rewards, 2, scale="batch", eps=0.0)
    trl = group_advantages(rewards, 2, scale="batch_reward", eps=0.0)
    torch.testing.assert_close(lite, torch.tensor([-0.8660254, 0.8660254, -0.8660254, 0.8660254]))
    torch.testing.assert_close(trl, torch.tensor([-0.3872983, 0.3872983, -0.3872983, 0.3872983]))


# ------------------------------------------------------------------ item 3: which reward is accuracy


def test_accuracy_is_the_verifier_never_a_format_reward_listed_first():
    from grpokit.core.errors import ConfigError
    from grpokit.rewards.which_accuracy import choose_accuracy_reward as choose

    # the issue's case: TRL's think_format_reward listed first, accuracy_reward second
    assert choose(["think_format_reward", "accuracy_reward"], None) == "accuracy_reward"
    assert choose(["format_strict", "math_accuracy"], None) == "math_accuracy"
    assert choose(["format_strict", "code_tests", "overlong_penalty"], None) == "code_tests"
    assert choose(["has_seven"], None) == "has_seven"  # the only reward, not a shaping one
    assert choose(["a", "b"], "b") == "b"
    assert choose(["brevity"], "my_rewards.py:brevity", {"my_rewards.py:brevity": "brevity"}) == "brevity"
    # only format/length rewards: none, and the run trains without accuracy, as TRL's does (issue 38)
    assert choose(["think_format_reward"], None) is None
    assert choose(["format_strict", "overlong_penalty"], None) is None
    with pytest.raises(ConfigError, match="set train.accuracy_reward to the one whose 1 means correct"):
        choose(["math_accuracy", "code_tests"], None)  # several verifiers: which one is asked
    from grpokit.rewards.which_accuracy import pick_accuracy_reward

    # no verifier: the one reward that is not a format/length one; with several, none (no guess: issue 52's `fmt`
    # beside `exact_sort` was picked for being listed first), and the run says so, naming train.accuracy_reward
    assert pick_accuracy_reward(["format_strict", "has_seven"], None)[0] == "has_seven"
    name, why = pick_accuracy_reward(["fmt", "exact_sort"], None)
    assert name is None and "does not guess" in why and "train.accuracy_reward=exact_sort" in why
    assert pick_accuracy_reward(["format_strict", "digit_steps", "has_seven"], None)[0] is None
    with pytest.raises(ConfigError, match="2 look like verifiers"):
        choose(["math_accuracy", "accuracy_reward"], None)
    with pytest.raises(ConfigError, match="train.accuracy_reward='nope' is not one of the rewards"):
        choose(["a"], "nope")


# ------------------------------------------------------------------ item 5: schedules and knobs


def test_linear_schedule_is_transformers_linear_with_warmup():
    from transformers import get_linear_schedule_with_warmup

    from grpokit.train.schedules import lr_factor, warmup_steps

    for total, warm in [(4, 0), (10, 3), (7, 7)]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = get_linear_schedule_with_warmup(opt, warm, total)
        theirs = []
        for _ in range(total):
            theirs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        assert [lr_factor(s, "linear", warm, total) for s in range(total)] == pytest.approx(theirs)
    assert [lr_factor(s, "linear", 0, 4) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert warmup_steps(100, 5, 0.0) == 5 and warmup_steps(100, 5, 0.03) == 3 and warmup_steps(10, 0, 0.25) == 3


def test_adam_epsilon_and_warmup_ratio_reach_the_optimizer(tmp_path):
    from tiny_model import make_tiny_model

    from grpokit import GRPOTrainer, load_config

    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(None, [f"train.output_dir={tmp_path}", "optim.adam_epsilon=1e-5", "optim.schedule=linear",
                             "optim.warmup_ratio=0.5", "train.num_train_epochs=2", "rollout.prompts_per_step=2",
                             "model.device=cpu", "eval.enabled=false", "optim.lr=1e-3", "rollout.max_new_tokens=8"])
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=rows, reward_functions=[("r", lambda completions, **k: [0.0] * len(completions), 1.0)])
    assert trainer.learner.optimizer.param_groups[0]["eps"] == 1e-5
    assert trainer.cfg.train.steps == 3  # ceil(2 epochs * 3 prompts / 2 per step)
    # warm-up ceil(0.5 * 3) = 2 steps: lr 0, then 1e-3 / 2, then the linear decay (3 - 2) / (3 - 2)
    assert [trainer.learner.lr_factor(s) for s in range(3)] == [0.0, 0.5, 1.0]


# ------------------------------------------------------------------ item 4: TRL's config, mapped or refused


def test_trl_defaults_table_is_trls():
    pytest.importorskip("trl")
    import dataclasses

    from trl import GRPOConfig

    from grpokit.config.trl import TRL_DEFAULTS, VLLM_DEFAULTS

    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    for key, ours in {**TRL_DEFAULTS, **VLLM_DEFAULTS}.items():
        if key == "output_dir":  # None in the dataclass, "trainer_output" when the trainer runs
            continue
        f = fields[key]
        theirs = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        theirs = {"linear": "linear", "no": "no"}.get(str(getattr(theirs, "value", theirs)), theirs)
        assert ours == theirs or (key == "report_to" and theirs in ("none", None)), key


def test_the_issues_geometry_four_optimizer_steps_of_sixteen():
    from grpokit.config.trl import from_trl

    values, notes = from_trl({"num_generations": 4, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "loss_type": "grpo",
                              "steps_per_generation": 8, "max_steps": 400, "warmup_steps": 40, "save_steps": 100})
    assert values["rollout"]["prompts_per_step"] * values["rollout"]["group_size"] == 64  # one generation batch
    assert values["optim"]["mini_batches"] == 4 and values["optim"]["micro_batch_size"] == 8  # 4 steps of 16
    assert values["train"]["steps"] == 100 and values["optim"]["warmup_steps"] == 10 and values["train"]["save_every"] == 25
    assert "k=4 TRL optimizer step(s) of 16 completions" in notes[0]


def test_trl_algorithm_fields_map_to_the_same_algorithm():
    from grpokit.config.trl import from_trl

    algo = from_trl({"loss_type": "dr_grpo", "scale_rewards": "none", "epsilon": 0.3, "max_completion_length": 64})[0]["algo"]
    assert (algo["agg"], algo["norm_len"], algo["advantage"]) == ("seq-sum-norm", 64, "group_centre")
    assert (algo["eps_low"], algo["eps_high"]) == (0.3, 0.3)  # TRL's epsilon_high follows epsilon
    assert from_trl({"epsilon_high": 0.28})[0]["algo"]["eps_high"] == 0.28
    defaults = from_trl({})[0]  # TRL's defaults, not grpokit's
    assert defaults["algo"]["agg"] == "token-mean" and defaults["algo"]["beta"] == 0.0
    assert defaults["optim"]["adam_beta2"] == 0.999 and defaults["optim"]["schedule"] == "linear"
    assert defaults["train"]["seed"] == 42 and defaults["model"]["gradient_checkpointing"] is True
    assert defaults["train"]["num_train_epochs"] == 3.0
    assert from_trl({"warmup_steps": 0.1})[0]["optim"]["warmup_ratio"] == 0.1  # transformers 5's ratio form
    assert from_trl({"save_strategy": "no", "save_steps": 7})[0]["train"]["save_every"] == 0


def test_trls_min_p_and_repetition_penalty_map_to_the_rollouts():
    from grpokit.config.schema import config_from_dict
    from grpokit.config.trl import from_trl

    r = config_from_dict(from_trl({"min_p": 0.05, "repetition_penalty": 1.1, "top_k": 20})[0]).rollout
    assert (r.min_p, r.repetition_penalty, r.top_k) == (0.05, 1.1, 20)
    default = config_from_dict(from_trl({})[0]).rollout  # TRL's None and 1.0: both off
    assert (default.min_p, default.repetition_penalty) == (0.0, 1.0)


def test_use_vllm_maps_to_the_vllm_engine_and_trls_importance_sampling_to_the_mismatch_correction():
    from grpokit.config.schema import config_from_dict
    from grpokit.config.trl import from_trl

    rollout = from_trl({"use_vllm": True})[0]["rollout"]  # TRL's defaults: sequence_mask, clip_max 3
    assert (rollout["engine"], rollout["mismatch_correction"], rollout["mismatch_cap"]) == ("vllm", "sequence_mask", 3.0)
    values, notes = from_trl(
        {"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_cap": 2.5,
         "vllm_importance_sampling_clip_min": 0.5, "vllm_gpu_memory_utilization": 0.5, "vllm_enable_sleep_mode": True,
         "vllm_max_model_length": 1024},
    )  # fmt: skip
    cfg = config_from_dict(values)
    r = cfg.rollout
    assert (r.engine, r.mismatch_correction, r.mismatch_cap, r.mismatch_floor) == ("vllm", "token_truncate", 2.5, 0.5)
    assert (r.vllm.gpu_memory_utilization, r.vllm.sleep, r.vllm.max_model_len) == (0.5, True, 1024)
    assert any("rollout.mismatch_correction=token_truncate with cap 2.5" in n for n in notes)
    off = from_trl({"use_vllm": True, "vllm_importance_sampling_correction": False})[0]["rollout"]
    assert off["mismatch_correction"] == "none"
    plain = from_trl({"vllm_importance_sampling_mode": "token_mask"})[0]  # use_vllm off: the vLLM fields are inert
    assert "engine" not in plain["rollout"] and "mismatch_correction" not in plain["rollout"]


def test_trls_server_mode_maps_to_grpokits_with_its_address_and_timeout():
    from grpokit.config.checks import check_settings_in_use
    from grpokit.config.schema import config_from_dict
    from grpokit.config.trl import from_trl

    values, notes = from_trl({"use_vllm": True, "vllm_mode": "server", "vllm_server_port": 8123})
    cfg = config_from_dict(values)
    assert (cfg.rollout.vllm.mode, cfg.rollout.vllm.server_url) == ("server", "http://0.0.0.0:8123")  # TRL's host
    assert cfg.rollout.vllm.server_timeout_s == 240.0
    check_settings_in_use(cfg)  # no colocated engine's setting was written for a server
    values, notes = from_trl(
        {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://gpu7:9000", "vllm_server_host": "x",
         "vllm_server_timeout": 60, "vllm_gpu_memory_utilization": 0.8},
    )  # fmt: skip
    v = config_from_dict(values).rollout.vllm
    assert (v.server_url, v.server_timeout_s, v.gpu_memory_utilization) == ("http://gpu7:9000", 60.0, 0.3)
    assert (v.weight_transfer, v.collective_port) == ("http", 51216)  # TRL's default group port, HTTP kept
    port = from_trl({"use_vllm": True, "vllm_mode": "server", "vllm_group_port": 6123})[0]["rollout"]["vllm"]
    assert port["collective_port"] == 6123
    assert any("vllm_gpu_memory_utilization are the server's options" in n for n in notes)


def test_open_r1s_model_init_kwargs_convert():
    """open-r1's grpo.py sets training_args.model_init_kwargs to revision (its default "main"), trust_remote_code,
    attn_implementation, torch_dtype and use_cache (before: refused, "['revision', 'use_cache'] have no grpokit
    equivalent", so its script stopped at GRPOTrainer(...))."""
    from grpokit.config.trl import from_trl

    values, notes = from_trl({"model_init_kwargs": {"revision": "main", "trust_remote_code": False,
                              "attn_implementation": "sdpa", "torch_dtype": "bfloat16", "use_cache": False}})  # fmt: skip
    model = values["model"]
    assert (model["dtype"], model["attn_implementation"], model["trust_remote_code"]) == ("bfloat16", "sdpa", False)
    assert any(n.startswith("model_init_kwargs use_cache: no effect") for n in notes)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"loss_type": "bnpo", "gradient_accumulation_steps": 2}, "loss_type='bnpo' with gradient_accumulation_steps > 1"),
        ({"loss_type": "dapo", "steps_per_generation": 2}, "steps_per_generation = gradient_accumulation_steps"),
        ({"loss_type": "vespo", "importance_sampling_level": "sequence"}, "set importance_sampling_level: token"),
        ({"loss_type": "cispo"}, "caps the importance weight at epsilon_high=0.2 itself"),
        ({"loss_type": "cispo", "epsilon_high": 5.0, "steps_per_generation": 2}, "loss_type='cispo' with steps_per"),
        ({"max_steps": 10, "steps_per_generation": 4, "loss_type": "grpo"}, "use a multiple of 4"),
        ({"generation_kwargs": {"min_tokens": 4, "top_p": 0.9}}, r"generation_kwargs \['min_tokens'\] have no grpokit"),
        ({"use_vllm": True, "vllm_mode": "spmd"}, "vllm_mode='spmd': choose colocate or server"),
        ({"use_vllm": True, "vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size=2"),
        ({"multi_objective_aggregation": "mean"}, "choose sum_then_normalize or normalize_then_sum"),
        ({"delta": 1.1}, r"delta=1.1 is not above 1 \+ epsilon_high = 1.2"),
        ({"delta": 1.25, "epsilon_high": 0.28}, r"delta=1.25 is not above 1 \+ epsilon_high = 1.28"),
        ({"reward_weights": [1, 2]}, "reward_weights needs the rewards"),
        ({"frobnicate": 1}, r"\['frobnicate'\] have no grpokit equivalent"),
        ({"model_init_kwargs": {"device_map": "auto"}}, r"model_init_kwargs \['device_map'\]"),
        ({"model_init_kwargs": {"revision": "v2"}}, r"revision='v2': .*hf download REPO --revision v2 --local-dir DIR"),
    ],
)
def test_what_grpokit_cannot_honour_is_refused_by_name(fields, message):
    from grpokit.config.trl import from_trl
    from grpokit.core.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        from_trl(fields)


def test_generation_kwargs_win_over_the_fields_as_in_trl():
    from grpokit.config.trl import from_trl

    values, notes = from_trl({"temperature": 0.7, "generation_kwargs": {"temperature": 0.9, "max_tokens": 64,
                                                                        "top_k": 20}})  # fmt: skip
    r = values["rollout"]
    assert (r["temperature"], r["max_new_tokens"], r["top_k"], r["top_p"]) == (0.9, 64, 20, 1.0)
    assert any("generation_kwargs ['max_tokens', 'temperature', 'top_k']" in n for n in notes)


def test_delta_with_a_loss_that_is_not_clipped_changes_nothing_as_in_trl_and_says_so():
    from grpokit.config.trl import from_trl

    values, notes = from_trl({"loss_type": "sapo", "delta": 1.5})
    assert "dual_clip" not in values["algo"] and any("delta=1.5" in n and "no effect" in n for n in notes)
    values, notes = from_trl({"delta": 1.5})
    assert values["algo"]["dual_clip"] == 1.5 and any("algo.dual_clip=1.5" in n for n in notes)


@pytest.mark.slow
def test_a_flat_trl_yaml_trains_and_converts_from_the_cli(tmp_path):
    import subprocess
    import sys

    from grpokit.config.schema import load_config

    path = tmp_path / "trl.yaml"
    path.write_text("num_generations: 4\nlearning_rate: 3.0e-6\nloss_type: grpo\nmax_steps: 6\nbeta: 0.04\n"
                    "use_bias_correction_kl: false\nchat_template_kwargs: {enable_thinking: false}\n")
    cfg = load_config(path, ["train.output_dir=x"])
    assert (cfg.rollout.group_size, cfg.optim.lr, cfg.algo.agg, cfg.train.steps, cfg.algo.beta) == (
        4, 3e-6, "seq-mean-token-mean", 6, 0.04)
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}
    out = subprocess.run([sys.executable, "-m", "grpokit", "config", "--from-trl", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "# converted from TRL's GRPOConfig" in out.stdout and "agg: seq-mean-token-mean" in out.stdout
    converted = tmp_path / "cfg.yaml"
    converted.write_text(out.stdout)
    assert load_config(converted).rollout.group_size == 4  # what it prints loads back
    path.write_text("num_generations: 4\ntorch_compile: true\n")
    bad = subprocess.run([sys.executable, "-m", "grpokit", "config", "--from-trl", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "torch_compile=True is not supported" in bad.stderr


# ------------------------------------------------------------------ item 7: maj@k votes on what accuracy reads


def test_maj_at_k_votes_on_what_the_accuracy_reward_extracts():
    from grpokit.rollout.evaluate import majority_vote, voted_answers

    texts = ["I think 12", "12 for sure", "maybe 13", "dunno"]  # no tags, no \boxed: the verifier reads nothing
    assert voted_answers(lambda **k: None, texts, {}) == [None] * 4

    def last_number(completions, **kw):
        return [1.0 if t.split()[-1] == "12" else 0.0 for t in completions]

    last_number.answer_of = lambda t: t.split()[-1] if t.split()[-1].isdigit() else None
    answers = voted_answers(last_number, texts, {})
    assert answers == ["12", None, "13", None] and majority_vote(answers, [1, 0, 0, 0]) == 1.0
    # TRL's accuracy_reward logs what it parsed (log_extra "answer_parsed"), "[unparseable]" when nothing
    logged = {"answer_parsed": ["[12, '12']", "[12, '12']", "[13, '13']", "[unparseable]"]}
    answers = voted_answers(lambda **k: None, texts, logged)
    assert answers == ["[12, '12']", "[12, '12']", "[13, '13']", None]
    assert majority_vote(answers, [1.0, 1.0, 0.0, 0.0]) == 1.0


def test_evaluate_votes_with_the_accuracy_rewards_reader(tmp_path):
    from tiny_model import make_tiny_model

    from grpokit.config.schema import DataConfig
    from grpokit.rollout.evaluate import evaluate
    from grpokit.rollout.generation import FastGenerator

    model, tok = make_tiny_model("qwen2", seed=0)

    def first_char(completions, **kw):  # "correct" when the completion starts with a digit
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    first_char.answer_of = lambda t: t[:1] or None
    rows = [{"prompt": "1+2="}, {"prompt": "3+4="}]
    metrics = evaluate(model, tok, rows, accuracy_fn=first_char, generator=FastGenerator(), data_cfg=DataConfig(),
                       eos_token_ids=[tok.eos_token_id], num_samples=4, max_new_tokens=4)
    assert metrics["maj_at_4/no_answer"] < 1.0  # every non-empty completion votes with answer_of


# ------------------------------------------------------------------ item 6: TRL's metric names


def test_trl_metric_names_are_added_where_they_mean_the_same():
    from grpokit.compat.trl.names import with_trl_names

    m = with_trl_names({"reward/total/mean": 0.5, "reward/total/std": 0.1, "reward/acc/mean": 0.25,
                        "reward/acc/std": 0.2, "zero_variance_frac": 0.125, "completion_len/mean": 11.0,
                        "truncated_frac": 0.0, "lr": 1e-6, "kl": 0.01})
    assert (m["reward"], m["rewards/acc/mean"], m["frac_reward_zero_std"]) == (0.5, 0.25, 0.125)
    assert (m["completions/mean_length"], m["completions/clipped_ratio"], m["learning_rate"]) == (11.0, 0.0, 1e-6)
    assert "reward_std" not in m and "rewards/acc/std" not in m  # unbiased in TRL: not the same number
    assert m["reward/total/mean"] == 0.5 and m["kl"] == 0.01  # ours stay


def test_trls_unbiased_reward_stds_are_logged_by_trls_names():
    """reward_std and rewards/<fn>/std as TRL's nanstd computes them (n - 1), beside grpokit's population stds: a
    step of four rows, the accuracy reward not applying to the third. By hand: acc over [1, 0, 1]: mean 2/3, squares
    1/9 + 4/9 + 1/9 = 2/3, / 2 -> sqrt(1/3) = 0.57735; total [1, 0, 0.5, 1]: mean 0.625, squares 0.140625 +
    0.390625 + 0.015625 + 0.140625 = 0.6875, / 3 -> 0.47871."""
    from grpokit.rollout.batch import ScoredBatch, batch_reward_metrics

    pytest.importorskip("trl")
    per_function = {"acc": [1.0, 0.0, None, 1.0], "fmt": [1.0, 0.0, 0.5, 1.0]}
    batch = ScoredBatch.__new__(ScoredBatch)
    batch.per_function, batch.rewards = per_function, torch.tensor([1.0, 0.0, 0.5, 1.0])
    m = batch_reward_metrics(batch, [])
    assert m["rewards/acc/std"] == pytest.approx(math.sqrt(1 / 3), rel=1e-9)
    assert m["reward_std"] == pytest.approx(math.sqrt(0.6875 / 3), rel=1e-9)
    from trl.trainer.utils import nanstd

    acc = torch.tensor([1.0, 0.0, float("nan"), 1.0])
    assert m["rewards/acc/std"] == pytest.approx(float(nanstd(acc)), rel=1e-6)
    assert m["reward/acc/std"] == pytest.approx(math.sqrt(2 / 9), rel=1e-9)  # grpokit's own: divided by n


# ------------------------------------------------------------------ item 8: TRL's argument forms


ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)]
QUICK = ["rollout.group_size=2", "rollout.prompts_per_step=2", "rollout.max_new_tokens=4", "model.device=cpu",
         "eval.enabled=false", "train.samples_every=0", "train.stop_after_flat_steps=0"]


def correct_reward(completions, answer, **kwargs):
    return [1.0 if c.strip().startswith(a) else 0.0 for c, a in zip(completions, answer)]


def test_trl_argument_forms_are_taken(tmp_path):
    from peft import LoraConfig
    from tiny_model import save_tiny_model
    from transformers import TrainerCallback

    from grpokit import GRPOTrainer, load_config

    path = save_tiny_model(tmp_path / "tiny")
    seen = []

    class Watch(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            seen.append(("begin", state.global_step, args.output_dir == str(tmp_path / "run")))

        def on_step_end(self, args, state, control, **kw):
            seen.append(("step", state.global_step, state.num_train_epochs))
            if state.global_step == 2:
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            seen.append(("log", "reward" in logs, len(state.log_history)))

        def on_save(self, args, state, control, **kw):
            seen.append(("save", state.global_step))

        def on_train_end(self, args, state, control, **kw):
            seen.append(("end", state.global_step))

    cfg = load_config(None, [f"train.output_dir={tmp_path / 'run'}", "train.steps=5", *QUICK])
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = GRPOTrainer(cfg, model=str(path), train_rows=ROWS, reward_funcs=[correct_reward],
                          peft_config=peft, callbacks=[Watch])
    assert trainer.cfg.lora.enabled and (trainer.cfg.lora.r, trainer.cfg.lora.alpha) == (4, 8)
    assert trainer.cfg.model.name_or_path == str(path) and trainer.reward_names == ["correct_reward"]
    summary = trainer.train()
    assert summary["steps"] == 2 and "control.should_training_stop" in summary["stopped_early"]
    assert seen[0] == ("begin", 0, True)
    assert ("step", 1, 2.5) in seen and ("log", True, 2) in seen  # 5 steps x 2 prompts / 4 prompts
    assert seen[-2:] == [("save", 2), ("end", 2)]


def test_trl_argument_forms_refused_in_one_line(tmp_path):
    from tiny_model import make_tiny_model

    from grpokit import GRPOTrainer, load_config
    from grpokit.core.errors import ConfigError

    cfg = load_config(None, [f"train.output_dir={tmp_path / 'run'}", *QUICK])
    model, tok = make_tiny_model("qwen2", seed=0)
    with pytest.raises(ConfigError, match="needs its tokenizer too: pass tokenizer="):
        GRPOTrainer(cfg, model=model, train_rows=ROWS, reward_funcs=correct_reward)
    with pytest.raises(ConfigError, match=r"got a config twice \(the first argument and args=\)"):
        GRPOTrainer(cfg, model=model, tokenizer=tok, args={"learning_rate": 1e-6})
    with pytest.raises(ConfigError, match=r"reward_weights=...\) is not taken: reward weights are a GRPOConfig field"):
        GRPOTrainer(cfg, model=model, tokenizer=tok, reward_weights=[1.0])
    with pytest.raises(ConfigError, match=r"reward_functions\[0\]: got a model"):
        GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_funcs=[model])
    with pytest.raises(ConfigError, match="neither a function fn"):
        GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_funcs=correct_reward, callbacks=[3])


TRL_METRICS_NOT_LOGGED: set[str] = set()
"""TRL GRPOTrainer's metrics of a plain run that grpokit does not log (grpokit.compat.trl.names says why): none."""


def test_every_metric_trls_grpo_step_logs_is_logged_by_grpokit_under_its_name(tmp_path):
    """One step of TRL's own GRPOTrainer and of grpokit's with the same GRPOConfig (beta > 0, so that kl is logged):
    the names TRL logs are among grpokit's (but those named in TRL_METRICS_NOT_LOGGED); the values that mean the same
    on the same numbers agree by construction (the terminated lengths, the clip shares and policy_loss by hand in
    test_trl_names_worked_out_from_grpokits)."""
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from tiny_model import save_tiny_model

    from grpokit import GRPOTrainer

    model_dir = save_tiny_model(tmp_path / "tiny")
    rows = datasets.Dataset.from_list([{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)])
    common = dict(max_steps=1, per_device_train_batch_size=4, num_generations=2, max_completion_length=4, beta=0.04,
                  logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = trl.GRPOTrainer(model=str(model_dir), reward_funcs=[correct_reward], train_dataset=rows,
                                 args=trl.GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False,
                                                     **common))  # fmt: skip
        theirs.train()
    trl_names = {k for entry in theirs.state.log_history[:1] for k in entry} - {"step", "epoch"}
    ours = GRPOTrainer(model=str(model_dir), reward_funcs=[correct_reward], train_dataset=rows,
                       args={"output_dir": str(tmp_path / "ours"), **common})  # fmt: skip
    ours.train()
    missing = trl_names - set(ours.log_history[0]) - TRL_METRICS_NOT_LOGGED
    assert not missing, sorted(missing)
    assert TRL_METRICS_NOT_LOGGED <= trl_names  # TRL still logs them: the list is not stale
    for key in ("clip_ratio/low_min", "clip_ratio/high_max", "clip_ratio/low_mean"):  # one step on the same
        assert ours.log_history[0][key] == theirs.state.log_history[0][key] == 0.0  # policy: nothing clipped


def test_trl_names_worked_out_from_grpokits():
    """By hand: the terminated lengths of a batch of 3 (lengths 2, 4, 3; the second cut), 0 when none ended; the
    clip shares; tools/failure_frequency = 1 error / 4 calls; policy_loss = loss + entropy_coef x entropy/bonus
    (0.5 + 0.01 x 2.0) with the bonus, loss without it."""
    from grpokit.compat.trl.names import with_trl_names
    from grpokit.rollout.batch import ScoredBatch, step_metrics
    from grpokit.rollout.generation import Rollout

    def batch(truncated):
        mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
        rollout = Rollout(prompt_ids=torch.ones(3, 2, dtype=torch.long), prompt_mask=torch.ones(3, 2, dtype=torch.long),
                          completion_ids=mask.clone(), completion_mask=mask, logprobs=torch.zeros(3, 4),
                          truncated=torch.tensor(truncated))  # fmt: skip
        return ScoredBatch(rollout=rollout, rows=[{}] * 3, texts=["", "", ""], rewards=torch.zeros(3),
                           per_function={}, reward_metrics={})  # fmt: skip

    m = with_trl_names(step_metrics(batch([False, True, False]), 0.0, {"loss": 0.5, "clip_frac_low": 0.25,
                                    "clip_frac_high": 0.125, "clip_frac": 0.375}, {}, None))  # fmt: skip
    assert (m["completions/mean_terminated_length"], m["completions/min_terminated_length"],
            m["completions/max_terminated_length"]) == (2.5, 2.0, 3.0)  # fmt: skip
    assert (m["clip_ratio/low_mean"], m["clip_ratio/high_mean"], m["clip_ratio/region_mean"]) == (0.25, 0.125, 0.375)
    assert m["policy_loss"] == 0.5 and "tools/failure_frequency" not in m
    none_ended = step_metrics(batch([True, True, True]), 0.0, {}, {}, None)
    assert (none_ended["completion_len/ended_mean"], none_ended["completion_len/ended_max"]) == (0.0, 0.0)
    tools = with_trl_names({"tools/calls": 4.0, "tools/errors": 1.0, "tools/calls_per_episode": 0.5, "loss": 0.5,
                            "entropy_coef": 0.01, "entropy/bonus": 2.0})  # fmt: skip
    assert tools["tools/failure_frequency"] == 0.25 and tools["tools/call_frequency"] == 0.5
    assert tools["policy_loss"] == pytest.approx(0.52, rel=1e-12)
    assert with_trl_names({"tools/calls": 0.0})["tools/failure_frequency"] == 0.0

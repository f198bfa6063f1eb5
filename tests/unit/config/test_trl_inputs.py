"""What the TRL importer is given (grpokit.config.trl_fields, issues 48 and 52): a file that is no mapping, a field of
the wrong type, a count of 0, numbers that keep their text, a trl.GRPOConfig object or its to_dict(); each a named
one-line error or converted right."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from grpokit.cli.main import main
from grpokit.config.schema import config_from_dict
from grpokit.config.trl import from_trl
from grpokit.config.trl_fields import TRAINING_INERT, TRAINING_REFUSED_UNLESS_DEFAULT
from grpokit.core.errors import ConfigError


def convert(tmp_path, text: str, capsys) -> tuple[int, str, str]:
    path = tmp_path / "trl.yaml"
    path.write_text(text)
    code = main(["config", "--from-trl", str(path)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "text,message",
    [
        ("- num_generations\n- 4\n", "must be a mapping of field: value .* got list \\(a YAML list"),
        (
            "num_generations: four\n",
            "TRL num_generations='four': expected an integer, e.g. num_generations: 8",
        ),
        ("num_generations: 0\n", "TRL num_generations=0: must be at least 1"),
        ("per_device_train_batch_size: -8\n", "per_device_train_batch_size=-8: must be at least 1"),
        ("learning_rate: fast\n", "learning_rate='fast': expected a number"),
        ("use_vllm: yes please\n", "use_vllm='yes please': expected true or false"),
        ("num_generations: 4\n7: 2\n", "keys must be field names \\(text\\); got 7"),
    ],
)
def test_a_bad_trl_file_is_one_named_line(tmp_path, capsys, text, message):
    """Each of these ended in the catch-all line ('ValueError: invalid literal', 'ZeroDivisionError') or named
    the list's items as unknown fields before."""
    code, out, err = convert(tmp_path, text, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("grpokit: config error: ")
    assert __import__("re").search(message, err), err


def test_use_vllm_with_a_cap_written_as_a_float_converts(tmp_path, capsys):
    """The YAML reader's numbers keep their text (a float subclass) and yaml.safe_dump refused them: this crashed
    with RepresenterError: cannot represent an object 2.0."""
    code, out, err = convert(
        tmp_path, "use_vllm: true\nvllm_importance_sampling_cap: 2.0\nnum_generations: 4\n", capsys
    )
    assert code == 0, err
    values = yaml.safe_load(out)
    rollout = values["rollout"]
    assert (rollout["engine"], rollout["mismatch_cap"], rollout["group_size"]) == ("vllm", 2.0, 4)
    assert type(rollout["mismatch_cap"]) is float
    assert config_from_dict(values).rollout.mismatch_cap == 2.0


def test_a_grpoconfig_object_and_its_to_dict_convert_alike():
    trl = pytest.importorskip("trl")
    args = trl.GRPOConfig(output_dir="out", use_cpu=True, learning_rate=1e-5, max_steps=4, num_generations=4,
                          per_device_train_batch_size=4, ddp_timeout=60, beta=0.02)  # fmt: skip
    values, notes = from_trl(args)
    assert from_trl(args.to_dict())[0] == values
    assert (values["optim"]["lr"], values["train"]["steps"], values["rollout"]["group_size"]) == (1e-5, 4, 4)
    assert values["rollout"]["prompts_per_step"] == 1 and values["algo"]["beta"] == 0.02
    # __post_init__ sets generation_batch_size and steps_per_generation both (a file may set one): one rollout
    assert values["optim"]["mini_batches"] == 1
    listed = next(n for n in notes if n.startswith("accepted, no effect"))
    assert (
        "ddp_timeout" in listed and "dataloader_drop_last" not in listed
    )  # listed when set, not at TRL's default
    config_from_dict(values)  # grpokit's own checks take it


def test_use_liger_kernel_runs_grpokits_fused_log_softmax():
    trl = pytest.importorskip("trl")
    values, notes = from_trl(trl.GRPOConfig(output_dir="out", use_cpu=True, use_liger_kernel=True))
    assert values["optim"]["fused_logprobs"] is True and config_from_dict(values).optim.fused_logprobs is True
    assert any(n.startswith("use_liger_kernel: grpokit's fused log-softmax") for n in notes)
    assert "fused_logprobs" not in from_trl(trl.GRPOConfig(output_dir="out", use_cpu=True))[0].get("optim", {})


def test_a_training_argument_that_would_change_the_run_is_refused_by_name():
    trl = pytest.importorskip("trl")
    with pytest.raises(ConfigError, match="TRL neftune_noise_alpha=5.0 is not supported: no noise"):
        from_trl(trl.GRPOConfig(output_dir="out", use_cpu=True, neftune_noise_alpha=5.0))
    with pytest.raises(ConfigError, match="deepspeed='ds.json' is not supported: grpokit shards with FSDP2"):
        from_trl({"deepspeed": "ds.json"})
    with pytest.raises(ConfigError, match=r"\['frobnicate'\] have no grpokit equivalent"):
        from_trl({"frobnicate": 1})
    assert from_trl({"eval_delay": 0, "ddp_timeout": 5})[1][0].endswith(": ddp_timeout")  # default: accepted


def test_the_training_argument_tables_are_transformers_fields_and_defaults():
    trl = pytest.importorskip("trl")
    fields = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    assert TRAINING_INERT <= set(fields)
    for key, (default, _) in TRAINING_REFUSED_UNLESS_DEFAULT.items():
        assert fields[key].default == default, key


# ---------------------------------------------------------------- train.defaults=trl: TRL's defaults, one switch


def changed_by_the_switch() -> dict[str, object]:
    """Every dotted setting train.defaults=trl changes on an empty config, with its new value (the algorithm's as
    resolved over its preset; norm_len and overlong_buffer follow rollout.max_new_tokens)."""
    from grpokit.config.schema import Config, config_to_dict, load_config, resolve_algo

    default, switched = Config(), load_config(None, ["train.defaults=trl"])
    ours, theirs = config_to_dict(default), config_to_dict(switched)
    changed = {
        f"{section}.{key}": value
        for section, fields in theirs.items()
        if isinstance(fields, dict) and section != "algo"
        for key, value in fields.items()
        if value != ours[section][key] and (section, key) != ("train", "defaults")
    }
    a, b = resolve_algo(default).flat(), resolve_algo(switched).flat()
    changed.update({f"algo.{k}": b[k] for k in a if a[k] != b[k] and k not in ("norm_len", "overlong_buffer")})
    return changed


def test_the_trl_switch_gives_trls_defaults_where_they_differ():
    changed = changed_by_the_switch()
    # TRL 1.16's GRPOConfig defaults, written out by hand (grpokit's in brackets)
    expected = {
        "optim.adam_beta2": 0.999,  # (0.99)
        "algo.std_eps": 1e-4,  # (1e-6)
        "algo.beta": 0.0,  # (the grpo preset's 0.04)
        "algo.agg": "token-mean",  # TRL's loss_type dapo (the grpo preset's seq-mean-token-mean)
        "train.stop_after_flat_steps": 0,  # TRL has no such stop (5)
        "train.adopt_average": False,  # TRL's policy never takes an average of its weights (auto: on a CPU)
        "optim.schedule": "linear",  # (constant)
        "rollout.max_new_tokens": 512,  # (256)
        "train.seed": 42,  # (0)
        "model.gradient_checkpointing": True,  # (False)
        "train.num_train_epochs": 3.0,  # (train.steps 100)
    }
    assert changed == expected
    # where the run writes and the batch's geometry stay grpokit's
    for key in ("train.output_dir", "train.report_to", "rollout.prompts_per_step", "optim.micro_batch_size"):
        assert key not in changed


def test_what_is_given_wins_over_the_switch():
    from grpokit.config.schema import load_config, validated

    cfg = load_config(None, ["train.defaults=trl", "algo.preset=dapo", "train.steps=7", "optim.adam_beta2=0.95"])
    assert (cfg.optim.adam_beta2, cfg.train.steps, cfg.train.num_train_epochs) == (0.95, 7, None)
    assert (cfg.algo.agg, cfg.algo.beta, cfg.algo.std_eps) == (None, None, None)  # the dapo preset's own
    assert cfg.optim.schedule == "linear" and validated(cfg) == cfg  # a second pass changes nothing


def test_the_from_trl_guide_lists_every_default_the_switch_changes():
    from paths import REPO

    text = (REPO / "docs/guides/from-trl.md").read_text()
    table = text[text.index("## Defaults that differ from TRL's") :].split("\n## ")[0]
    missing = [key for key in changed_by_the_switch() if f"`{key}`" not in table]
    assert not missing, f"docs/guides/from-trl.md's defaults table does not name {missing}"

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

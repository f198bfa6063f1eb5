"""CLI habits: `--config PATH`, `grpokit config` / `train --print-config` listing every key with its doc."""

import dataclasses

import pytest
import yaml

from grpokit.cli.main import field_docs, main
from grpokit.config.schema import Config, config_from_dict


def every_key(cfg: Config) -> list[str]:
    """Every key `grpokit config` prints a line for: the fields of each section, a nested section (rollout.vllm)
    as its own line and one line per field of it."""

    def walk(prefix: str, item) -> list[str]:
        keys = []
        for f in dataclasses.fields(item):
            keys.append(f"{prefix}.{f.name}")
            value = getattr(item, f.name)
            if dataclasses.is_dataclass(value):
                keys += walk(f"{prefix}.{f.name}", value)
        return keys

    keys = []
    for section in dataclasses.fields(cfg):
        value = getattr(cfg, section.name)
        for item in value if isinstance(value, list) else [value]:
            keys += walk(section.name, item)
    return keys


def test_config_prints_every_key_with_default_and_doc_as_loadable_yaml(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert config_from_dict(yaml.safe_load(out)) == Config()  # `grpokit config > cfg.yaml` loads back
    lines = [line for line in out.splitlines() if line.startswith(("  ", "  - "))]
    assert len(lines) == len(every_key(Config()))
    for line in lines:
        key, _, doc = line.partition("  # ")
        assert doc.strip(), f"no doc for {key.strip()}"
    assert "  group_size: 8  # G: completions sampled per prompt." in out


def test_every_config_field_has_a_docstring():
    for section in dataclasses.fields(Config):
        cls = section.type if isinstance(section.type, type) else type(getattr(Config(), section.name))
        if cls is list:
            cls = type(Config().rewards[0])
        names = [f.name for f in dataclasses.fields(cls)]
        assert sorted(field_docs(cls)) == sorted(names), cls.__name__


def test_config_file_by_option_or_position_and_print_config(tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text("rollout:\n  group_size: 4\n")
    assert main(["config", "--config", str(path), "optim.lr=3e-6"]) == 0
    from_option = capsys.readouterr().out
    assert main(["config", str(path), "optim.lr=3e-6"]) == 0
    assert capsys.readouterr().out == from_option
    assert "  group_size: 4  #" in from_option and "  lr: 3.0e-06  #" in from_option

    # train --print-config: the resolved config, nothing trained, nothing written
    out_dir = tmp_path / "run"
    assert main(["train", "--config", str(path), "--print-config", f"train.output_dir={out_dir}"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rollout"]["group_size"] == 4 and printed["train"]["output_dir"] == str(out_dir)
    assert not out_dir.exists()


def test_config_given_twice_or_bad_key_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text("rollout:\n  group_sise: 4\n")
    assert main(["train", "--config", str(path), str(path)]) == 2
    assert "two config files: --config" in capsys.readouterr().err
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown config key 'rollout.group_sise'" in err


def test_train_help_points_at_grpokit_config(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--config PATH" in out and "--print-config" in out and "grpokit config" in out


def test_print_config_of_the_demo_shows_its_settings_and_builds_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    assert main(["train", "--print-config", "train.steps=3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["name_or_path"] == "<demo model>" and printed["train"]["steps"] == 3
    assert printed["rollout"]["prompts_per_step"] == 16
    assert not (tmp_path / "cache").exists()

"""Each setting declared once (grpokit.config.declare): the check, its message, `grpokit config` and the
reference page (grpokit.config.reference) all read the one declaration."""

import dataclasses
import math
import subprocess
import sys
import typing
from dataclasses import dataclass

import pytest
from paths import REPO

from grpokit.config.declare import check_section, field_docs, not_allowed, section_class, setting, undeclared
from grpokit.config.reference import section_table, settings_markdown, value_text
from grpokit.config.sample import SampleConfig
from grpokit.config.schema import Config, ConfigError, load_config
from grpokit.config.sft import SFTConfig

TREES = [Config, SFTConfig, SampleConfig]


@dataclass
class Beams:
    width: int = setting(4, "Beams kept per step.", range="[1, inf)", example=8, meaning="1 = greedy")
    engine: str = setting("fast", "Which decoder.", choices=("fast", "hf"))
    length_penalty: float | None = setting(None, "Exponent of the length.", range="(0, 2]")


def test_a_range_declared_once_gives_the_check_its_message_and_the_doc_line():
    with pytest.raises(ConfigError) as e:
        check_section(Beams(width=0), "beams")
    assert str(e.value) == "beams.width=0 is out of range: it must be >= 1; 1 = greedy (e.g. beams.width=8)."
    check_section(Beams(width=1, length_penalty=None), "beams")  # an unset optional passes
    with pytest.raises(
        ConfigError, match=r"beams.length_penalty=3 is out of range: it must be > 0 and <= 2 "
    ):
        check_section(Beams(length_penalty=3), "beams")
    row = section_table("beams", Beams())[2]
    assert row == "| `beams.width` | int | `4` | >= 1; 1 = greedy | Beams kept per step. |"
    assert field_docs(Beams)["width"] == "Beams kept per step."


def test_a_choice_declared_once_gives_the_check_with_the_nearest_name_and_the_doc_line():
    with pytest.raises(ConfigError) as e:
        check_section(Beams(engine="fsat"), "beams")
    assert str(e.value) == "beams.engine='fsat' is not one of ['fast', 'hf']. Did you mean 'fast'?"
    assert "| `beams.engine` | str | `fast` | `fast`, `hf` | Which decoder. |" in section_table(
        "beams", Beams()
    )


def test_the_same_declarations_in_the_sample_wording():
    """grpokit sample's own sections say "is not allowed: expected ..." from the same declaration."""
    with pytest.raises(ConfigError) as e:
        check_section(Beams(width=0), "beams", says=not_allowed)
    assert str(e.value) == "beams.width=0 is not allowed: expected an integer >= 1 (1 = greedy), e.g. 8."
    with pytest.raises(ConfigError, match=r"^beams.engine='x' is not allowed: expected fast or hf\.$"):
        check_section(Beams(engine="x"), "beams", says=not_allowed)
    with pytest.raises(
        ConfigError, match=r"^beams.length_penalty=3 is not allowed: expected in \(0, 2\] or null\.$"
    ):
        check_section(Beams(length_penalty=3), "beams", says=not_allowed)
    from grpokit.trainers.sample import load_sample_config

    with pytest.raises(ConfigError, match=r"^sample.n=0 is not allowed: expected an integer >= 1, e.g. 8\.$"):
        load_sample_config(None, ["data.train=x.jsonl", "sample.n=0"])


@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.__name__)
def test_every_field_of_every_tree_is_declared(tree):
    assert undeclared(tree) == []


def test_an_undeclared_field_is_caught():
    @dataclass
    class Section:
        declared: int = setting(1, "Declared.")
        forgotten: int = 2

    @dataclass
    class Tree:
        part: Section = setting(Section(), "A section.")
        loose: bool = False

    assert undeclared(Tree) == ["part.forgotten", "loose"]
    with pytest.raises(TypeError, match=r"part.forgotten is not declared"):
        section_table("part", Section())


def test_the_reference_lists_every_key_of_every_tree_with_its_default():
    text = settings_markdown()
    for tree in TREES:
        cfg = tree()
        hints = typing.get_type_hints(tree)
        for section in dataclasses.fields(cfg):
            value = getattr(cfg, section.name)
            if isinstance(value, list):  # rewards: its entries' keys (the first entry's defaults)
                value, prefix = (
                    (value[0] if value else section_class(hints[section.name])()),
                    f"{section.name}[]",
                )
            else:
                prefix = section.name
            # a section inside a section (rollout.vllm) is listed key by key under its own dotted prefix
            inner = [(f"{prefix}.{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value)]
            keys = [(prefix, value, f) for f in dataclasses.fields(value) if not dataclasses.is_dataclass(getattr(value, f.name))]
            keys += [(p, v, f) for p, v in inner if dataclasses.is_dataclass(v) for f in dataclasses.fields(v)]
            for where, holder, f in keys:
                row = f"| `{where}.{f.name}` | "
                default = f"`{value_text(getattr(holder, f.name))}`"
                assert any(line.startswith(row) and default in line for line in text.splitlines()), (
                    f"{tree.__name__}: {where}.{f.name} missing, or without its default {default}"
                )
    assert "| `optim.lr` | float | `2.0e-05` |" in text  # grpokit sft's own default
    assert "## `grpokit train`" in text and "## `grpokit sft`" in text and "## `grpokit sample`" in text


def test_grpokit_config_prints_the_declared_descriptions():
    from grpokit.cli.main import describe_config

    out = describe_config(load_config(None, []))
    assert "  lr: 1.0e-06  # AdamW learning rate.\n" in out
    assert (
        "  eps_high: null  # Upper clip range: ratio <= 1 + eps_high (DAPO clip-higher).\n" in out
    )  # from KNOBS


def test_registries_above_the_config_layer_hold_the_names_the_config_allows():
    from grpokit.config import schema
    from grpokit.data.templates import TEMPLATE_NAMES
    from grpokit.model.loading import DTYPES
    from grpokit.model.precision import PRECISION_CHOICES
    from grpokit.train.schedules import lr_factor

    assert schema.TEMPLATE_NAMES == TEMPLATE_NAMES
    assert schema.DTYPES == ("auto", *DTYPES)
    assert schema.PRECISION_MODES == PRECISION_CHOICES
    # train/ takes SCHEDULES and STRATEGIES from the config itself; each declared schedule is implemented
    assert [lr_factor(3, name, warmup=2, total=10) for name in schema.SCHEDULES] == pytest.approx(
        [1.0, 0.5 * (1 + math.cos(math.pi * 1 / 8)), 7 / 8]
    )
    with pytest.raises(ValueError, match="unknown schedule 'step'"):
        lr_factor(3, "step", warmup=2, total=10)


def test_importing_the_config_imports_no_torch():
    code = "import sys, grpokit.config.schema, grpokit.config.sft, grpokit.config.sample; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "False"

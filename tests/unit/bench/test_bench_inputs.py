"""grpokit bench's table of which mode reads which option (grpokit.bench.inputs.FLAG_MODES): every option is in it,
and an option given to a mode that does not read it is refused by name."""

import pytest

from grpokit.bench.cli import _bench_parser
from grpokit.bench.inputs import EVERY_MODE, FLAG_MODES, MODES, unused_flags


def test_every_option_says_which_modes_read_it():
    """A new option must be placed: read by every mode (EVERY_MODE) or by the modes FLAG_MODES names."""
    dests = {a.dest for a in _bench_parser()._actions}
    assert dests - set(FLAG_MODES) - set(EVERY_MODE) == set()
    assert all(set(modes) <= set(MODES) for modes in FLAG_MODES.values())


@pytest.mark.parametrize(
    "argv, refusal",
    [
        (["--plan", "c.json", "--memory-gib", "8", "--no-gradient-checkpointing"], "--no-gradient-checkpointing"),
        (["--memory", "--engine", "hf"], "--engine is not read by --memory, only by the GRPO step bench"),
        (["--async", "--quick"], "--quick is not read by --async, only by --learn"),
        (["--learn", "--ks", "0,1"], "--ks is not read by --learn, only by --async"),
        (["--mode", "sft", "--output-dir", "x"], "--output-dir is not read by --mode sft"),
        (["--trl-script", "t.py"], "--trl-script is read only with --compare trl"),
        (["--mode", "sft", "--plan", "c.json"], "--plan and --mode sft choose different benches"),
    ],
)
def test_an_option_another_mode_reads_is_refused(argv, refusal):
    args = _bench_parser().parse_args(argv)
    assert refusal in unused_flags(args, _bench_parser()._actions)


@pytest.mark.parametrize(
    "argv",
    [
        ["--shape", "tiny", "--engine", "hf", "--no-cuda-graphs", "--algos", "grpo,ppo", "--beta", "0"],
        ["--compare", "trl", "--trl-python", "python3", "--trl-script", "t.py"],
        ["--mode", "sft", "--packing", "--shape", "tiny", "--device", "cpu"],
        ["--plan", "c.json", "--memory-gib", "8", "--shape", "long", "--json", "r.json"],
        ["--memory", "--batch", "long-tail-16", "--beta", "0", "--set", "optim.lr=1e-6", "--steps", "2"],
        ["--async", "--ks", "0,1", "--seeds", "2", "--target", "0.5", "--output-dir", "o"],
        ["--learn", "--quick", "--trl-set", "adam_beta2=0.99", "--set", "optim.lr=1e-6"],
    ],
)
def test_what_each_mode_reads_is_accepted(argv):
    assert unused_flags(_bench_parser().parse_args(argv), _bench_parser()._actions) is None

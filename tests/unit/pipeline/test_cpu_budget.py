"""A stage's ``cpu_budget_of`` (issue 38, the R1 demo at equal compute): it trains for the CPU seconds the
stages it names used together, read from their recorded summaries (a sample stage's sampling, the others'
training steps), passed as train.max_cpu_seconds; mistakes are one-line errors naming the stage. The plot
across stages joins a stage to the one it grows from: RL alone, from the cold start, is no continuation of
the last stage (before: every stage was joined to the one before it)."""

import pytest
import yaml

from grpokit.pipeline.report import plot_edges, plot_stages, stage_row, table_markdown
from grpokit.pipeline.spec import (
    PipelineError,
    cpu_budget,
    lineage,
    load_pipeline,
    stage_command,
    stage_hash,
)

R1_STAGES = [
    {"name": "cold_start", "kind": "sft"},
    {"name": "reason", "kind": "rl"},
    {"name": "rejection", "kind": "sample"},
    {"name": "distill", "kind": "sft", "model": "base", "data": "rejection"},
    {"name": "final", "kind": "rl"},
    {"name": "rl_alone", "kind": "rl", "model": "cold_start", "cpu_budget_of": ["reason", "rejection", "distill", "final"]},
]  # fmt: skip


def write(tmp_path, stages):
    path = tmp_path / f"p{len(list(tmp_path.glob('p*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "model": "base-model", "stages": stages}))
    return path


def done(cpu: float, wall: float, kind: str = "rl") -> dict:
    """A done stage's state as the pipeline records it (_brief of its summary.json)."""
    keys = ("cpu_seconds", "seconds") if kind == "sample" else ("train_cpu_seconds", "train_seconds")
    return {"status": "done", "summary": dict(zip(keys, (cpu, wall)))}


def test_the_budget_is_the_sum_of_the_named_stages_cpu_seconds(tmp_path):
    pipe = load_pipeline(write(tmp_path, R1_STAGES))
    alone = pipe.stages[5]
    states = {0: done(99.0, 99.0, "sft"), 1: done(40.5, 50.0), 2: done(20.25, 30.0, "sample")}
    states |= {3: done(10.0, 12.0, "sft"), 4: done(30.0, 41.0)}
    budget = cpu_budget(pipe, alone, states)
    # 40.5 + 20.25 + 10 + 30 = 100.75 CPU s (the cold start's 99 is not named); wall 50 + 30 + 12 + 41 = 133
    assert budget == {
        "seconds": 100.75,
        "wall_seconds": 133.0,
        "of": {"reason": 40.5, "rejection": 20.25, "distill": 10.0, "final": 30.0},
    }
    cmd = stage_command(
        alone, tmp_path / "06-rl_alone", "m", None, resume=False, cpu_budget=budget["seconds"]
    )
    assert cmd[-5:-3] == ["model.name_or_path=m", "train.max_cpu_seconds=100.75"]
    assert cpu_budget(pipe, pipe.stages[4], states) is None  # no cpu_budget_of: no limit
    old = dict(states)
    old[2] = {"status": "done", "summary": {"seconds": 30.0}}  # recorded before CPU seconds were
    with pytest.raises(PipelineError, match=r"rl_alone\).cpu_budget_of: stage 03-rejection recorded no CPU"):
        cpu_budget(pipe, alone, old)


def test_a_budget_stage_reruns_when_a_stage_it_names_changed(tmp_path):
    """The budget comes from the named stages' runs: their hashes are in the budget stage's."""
    first = load_pipeline(write(tmp_path, R1_STAGES))
    changed = [dict(s) for s in R1_STAGES]
    changed[4] = {**changed[4], "set": {"train.steps": 7}}  # final changes, rl_alone's own entry does not
    second = load_pipeline(write(tmp_path, changed))

    def hashes(pipe):
        out = {}
        for stage in pipe.stages:
            out[stage.index] = stage_hash(stage, out, pipe)
        return out

    a, b = hashes(first), hashes(second)
    assert a[1] == b[1] and a[4] != b[4]
    assert a[5] != b[5]  # rl_alone starts from cold_start (unchanged) but its budget includes final's seconds


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"cpu_budget_of": ["reasn"]},
            r"cpu_budget_of names 'reasn', which is no stage; did you mean 'reason'\?",
        ),
        ({"cpu_budget_of": ["rl_alone"]}, r"cycle \(rl_alone -> rl_alone\)"),
        ({"cpu_budget_of": "reason"}, r"stages\[5\].cpu_budget_of: expected a list of earlier stages' names"),
        (
            {"kind": "sample", "set": {}},
            r"stages\[5\].cpu_budget_of: a sample stage has no training to limit",
        ),
        ({"set": {"train.max_cpu_seconds": 5}}, r"remove set.train.max_cpu_seconds \(or cpu_budget_of\)"),
    ],
)
def test_bad_budgets_are_one_line_errors(tmp_path, change, message):
    stages = [*R1_STAGES[:5], {**R1_STAGES[5], **change}]
    with pytest.raises(PipelineError, match=message):
        load_pipeline(write(tmp_path, stages))


def test_a_budget_naming_a_later_stage_is_refused(tmp_path):
    stages = [{"name": "a", "kind": "rl", "cpu_budget_of": ["b"]}, {"name": "b", "kind": "rl"}]
    with pytest.raises(
        PipelineError, match=r"stages\[0\] \(a\).cpu_budget_of='b' reads the output of a later"
    ):
        load_pipeline(write(tmp_path, stages))


def test_rl_alone_is_drawn_from_the_cold_start_not_after_the_final_stage(tmp_path):
    pipe = load_pipeline(write(tmp_path, R1_STAGES))
    parents = [lineage(pipe, s) for s in pipe.stages]
    assert parents == ["00-base", "01-cold_start", "02-reason", "03-rejection", "04-distill", "01-cold_start"]
    states = {
        "00-base": ("model", 0.06), "01-cold_start": ("sft", 0.27), "02-reason": ("rl", 0.25),
        "03-rejection": ("sample", None), "04-distill": ("sft", 0.51), "05-final": ("rl", 0.55),
        "06-rl_alone": ("rl", 0.54),
    }  # fmt: skip
    rows = [
        stage_row(name, kind, {"eval": {"accuracy": acc}} if acc is not None else {}, parent=parent)
        for (name, (kind, acc)), parent in zip(states.items(), [None, *parents])
    ]
    # evaluated rows: 0 base, 1 cold_start, 2 reason, 3 distill (from the rejection's rows: through reason),
    # 4 final, 5 rl_alone (from cold_start, 1: not from final, 4)
    assert plot_edges(rows) == [(0, 1), (1, 2), (2, 3), (3, 4), (1, 5)]
    plot_stages(rows, tmp_path / "stages.png")
    assert (tmp_path / "stages.png").stat().st_size > 1000
    head = table_markdown(rows).splitlines()[0]
    assert head == (
        "| stage | kind | accuracy | format | language | tokens | train s | train CPU s | stage s | note |"
    )

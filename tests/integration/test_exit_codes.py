"""How a run ends, through the CLI (grpokit.cli.main.main, in this process): each kind of failure has its exit
code and a one-line message naming the error class the docs' table uses (docs/exit-codes.md, grpokit --help),
and every signal to a process of an asynchronous run ends the whole run with a checkpoint, in bounded time.

The sampler process is real (forked) and so are the signals: a reward function of the run, running in a reward
worker below the sampler process, finds that process (the ancestor whose parent is this trainer) and signals it
at batch 2, once (a marker file). On 37165e5 a killed sampler and a reward that raised or hung there exited 2
(the usage error's code), a stopped sampler stalled the run forever, and SIGTERM to the sampler alone was
swallowed (the run finished with exit 0)."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from tiny_model import ADDITION_ROWS, SMALL_RUN, save_tiny_model

from grpokit.cli.main import EXIT_CODES, build_parser, main
from grpokit.model.checkpoint import list_checkpoints, verify_checkpoint

REWARDS = '''import os
import signal
import time


def score(prompts, completions, **kw):
    return [float("7" in c) for c in completions]


def broken(prompts, completions, **kw):
    raise ValueError("the answer column is missing")


def hangs(prompts, completions, **kw):
    time.sleep(60)


def _sampler():
    """The sampler process: the ancestor of this reward worker whose parent is the trainer."""
    trainer, pid = int(os.environ["GRPOKIT_TEST_TRAINER"]), os.getpid()
    while True:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        if parent == trainer:
            return pid
        pid = parent


def _once(trainer_state):
    """True at batch 2, the first time only (the reward may be called more than once for a batch)."""
    if trainer_state.global_step != 2:
        return False
    try:
        os.close(os.open(os.environ["GRPOKIT_TEST_MARKER"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def _signal_sampler(signum, trainer_state):
    if _once(trainer_state):
        os.kill(_sampler(), signum)


def stops_sampler(prompts, completions, trainer_state=None, **kw):
    _signal_sampler(signal.SIGSTOP, trainer_state)
    return score(prompts, completions)


def kills_sampler(prompts, completions, trainer_state=None, **kw):
    _signal_sampler(signal.SIGKILL, trainer_state)
    return score(prompts, completions)


def terminates_sampler(prompts, completions, trainer_state=None, **kw):
    _signal_sampler(signal.SIGTERM, trainer_state)
    return score(prompts, completions)


def terminates_its_worker(prompts, completions, trainer_state=None, **kw):
    if _once(trainer_state):
        os.kill(os.getpid(), signal.SIGTERM)  # this reward worker
    return score(prompts, completions)


def stops_sampler_then_terminates_trainer(prompts, completions, trainer_state=None, **kw):
    if _once(trainer_state):
        os.kill(_sampler(), signal.SIGSTOP)
        os.kill(int(os.environ["GRPOKIT_TEST_TRAINER"]), signal.SIGTERM)
    return score(prompts, completions)
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny model, the 16 additions and the reward functions, written once."""
    folder = tmp_path_factory.mktemp("exit_codes")
    save_tiny_model(folder / "model")
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ADDITION_ROWS))
    (folder / "rewards.py").write_text(REWARDS)
    return folder


@pytest.fixture
def run(files, tmp_path, monkeypatch, capfd):
    """``run(reward, *overrides)``: `grpokit train` in this process; (exit code, stderr with what the sampler
    process wrote, output folder)."""
    # the sampler process forked: a CPU run's default (the suite's spawn costs seconds a start)
    monkeypatch.setenv("GRPOKIT_SAMPLER_START", "fork")
    monkeypatch.setenv("GRPOKIT_TEST_TRAINER", str(os.getpid()))
    monkeypatch.setenv("GRPOKIT_TEST_MARKER", str(tmp_path / "signalled"))

    def train(reward: str, *overrides: str) -> tuple[int, str, object]:
        out = tmp_path / "run"
        argv = [
            "train", f"model.name_or_path={files / 'model'}", f"data.train={files / 'data.jsonl'}",
            f"train.output_dir={out}", f"rewards=[{{name: '{files / 'rewards.py'}:{reward}'}}]", *SMALL_RUN,
            "train.save_every=1", "train.steps=6", *overrides,
        ]  # fmt: skip
        capfd.readouterr()
        started = time.monotonic()
        code = main(argv)
        assert time.monotonic() - started < 300  # bounded: nothing waits forever
        return code, capfd.readouterr().err, out

    return train


def lines_of(err: str, start: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(start)]


def test_a_reward_that_raises_exits_3_naming_reward_function_error(run):
    code, err, out = run("broken", "train.steps=2")
    assert code == 3, err
    (line,) = lines_of(err, "grpokit: RewardFunctionError: step 1: reward function")
    assert "the answer column is missing" in err and "Traceback" not in err


def test_a_reward_that_hangs_in_the_sampler_process_exits_3(run):
    code, err, out = run("hangs", "rollout.max_staleness=1", "train.reward_timeout_s=0.5", "train.steps=2")
    assert code == 3, err
    assert lines_of(err, "grpokit: RewardFunctionError: in the sampler process, batch 0: step 1:"), err
    assert "timed out" in err or "timeout" in err


def test_a_killed_sampler_exits_4_naming_sampler_died_error_with_a_checkpoint(run):
    code, err, out = run("kills_sampler", "rollout.max_staleness=1")
    assert code == 4, err
    (line,) = lines_of(err, "grpokit: SamplerDiedError: the sampler process (pid ")
    assert "(killed by SIGKILL)" in line and "Checkpoint of step" in line
    assert verify_checkpoint(list_checkpoints(out / "checkpoints")[-1]) is None


def test_a_stopped_sampler_ends_the_run_with_sampler_stalled_error_after_the_stated_time(run):
    """SIGSTOP of the sampler process: no heartbeat for rollout.sampler_timeout_s (2 s) ends the run with a
    checkpoint of the last step (its batch in flight is not in it: the process never gave it)."""
    started = time.monotonic()
    code, err, out = run("stops_sampler", "rollout.max_staleness=1", "rollout.sampler_timeout_s=2")
    assert code == 4, err
    (line,) = lines_of(err, "grpokit: SamplerStalledError: the sampler process (pid ")
    assert "gave no heartbeat for" in line and "rollout.sampler_timeout_s=2" in line
    assert "(its state: stopped, as by SIGSTOP)" in line and "Checkpoint of step 2" in line
    assert time.monotonic() - started >= 2  # not before the stated time
    (checkpoint,) = [c for c in list_checkpoints(out / "checkpoints") if c.name == "step_000002"]
    assert verify_checkpoint(checkpoint) is None


def test_sigterm_to_the_sampler_alone_stops_the_run_with_a_checkpoint_and_143(run):
    code, err, out = run("terminates_sampler", "rollout.max_staleness=1", "train.steps=50")
    assert code == 143, err  # 37165e5: swallowed, the run trained on and finished with 0
    assert lines_of(err, "grpokit: sampler process ")[0].endswith(
        "SIGTERM: the run stops after this step with a checkpoint (SIGTERM again ends this process at once)"
    )
    assert lines_of(err, "grpokit: SIGTERM sent to the sampler process ")
    (stopped,) = lines_of(err, "grpokit: stopped by SIGTERM after step ")
    step = int(stopped.split("after step ")[1].split("/")[0])
    assert step in (2, 3) and f"step_{step:06d}" in stopped  # the step it was on ends, with its checkpoint


def test_sigterm_to_the_trainer_while_its_sampler_is_stopped_ends_the_run_with_143(run):
    """37165e5: the stopping line, then nothing, forever. Now the step's wait ends at once, and the checkpoint's
    wait for the batch in flight at rollout.sampler_timeout_s."""
    code, err, out = run("stops_sampler_then_terminates_trainer", "rollout.max_staleness=1",
                         "rollout.sampler_timeout_s=3", "train.steps=50")  # fmt: skip
    assert code == 143, err
    (stopped,) = lines_of(err, "grpokit: stopped by SIGTERM after step ")
    assert "continue with --resume" in stopped
    assert verify_checkpoint(list_checkpoints(out / "checkpoints")[-1]) is None


def test_sigterm_to_a_reward_worker_ends_the_run_with_its_error_and_a_checkpoint(run):
    """A synchronous run: the worker dies, its calls fail, and with train.max_reward_failure_frac 0 the run ends
    with the reward's error naming the dead worker and a checkpoint of the last step (37165e5: exit 2, the usage
    error's code, and no checkpoint)."""
    code, err, out = run("terminates_its_worker")
    assert code == 3, err
    assert lines_of(err, "grpokit: RewardFunctionError: step 3: reward function 'terminates_its_worker'")
    assert "its worker process died" in err and "Checkpoint of step 2: " in err
    assert verify_checkpoint(out / "checkpoints" / "step_000002") is None


def test_a_vllm_server_that_is_down_exits_4_naming_vllm_server_error(run):
    """rollout.vllm.mode=server with nothing listening at rollout.vllm.server_url (a port just closed): an engine
    failure (37165e5: 2, the usage error's code). Needs no vLLM here: the client is HTTP."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, err, _ = run("score", "rollout.engine=vllm", "rollout.vllm.mode=server", "rollout.vllm.server_timeout_s=1",
                       f"rollout.vllm.server_url=http://127.0.0.1:{port}")  # fmt: skip
    assert code == 4, err
    (line,) = lines_of(err, "grpokit: VLLMServerError: no vLLM server answered at http://127.0.0.1:")
    assert "Connection refused" in line and "grpokit vllm-serve" in line


def test_a_config_error_exits_2(run):
    code, err, _ = run("score", "rollout.group_size=one")
    assert code == 2 and lines_of(err, "grpokit: config error: rollout.group_size"), err


def test_the_exit_codes_table_is_in_grpokit_help(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    shown = capsys.readouterr().out
    for code, text in EXIT_CODES:
        assert f"{code:<4} {text.split()[0]}" in shown
    assert [code for code, _ in EXIT_CODES] == [0, 1, 2, 3, 4, 5, 130]
    assert "SamplerDiedError" in shown and "RewardFunctionError" in shown and "RunIOError" in shown


def test_the_docs_page_shows_the_same_table():
    """docs/exit-codes.md gets the table from EXIT_CODES at build time (docs/hooks/reference.py), as --help."""
    from paths import REPO

    from grpokit.cli.main import exit_codes_table

    assert "<!-- generated: exit codes -->" in (REPO / "docs" / "exit-codes.md").read_text()
    table = exit_codes_table()
    for code, text in EXIT_CODES:
        assert f"| {code} | {text} |" in table, code
    assert "Exit codes: exit-codes.md" in (REPO / "mkdocs.yml").read_text()

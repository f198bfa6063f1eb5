"""The sampler process of an asynchronous run (grpokit.collect.async_sampler has the whole picture): its main, which
ties its life to the trainer's, beats a heartbeat, builds its Sampler from the recipe and makes each credited
batch from the weights the credit names; and the trainer's helpers that read its replies and stop it.

    _sampler_process(parent, box, ...)    # the process's main (multiprocessing's target)
    _drain(conn, queue)                   # a trainer thread: every frame the process sends, into the queue
    _stop(process, to_child, owner)       # the trainer stops it and everything in its process group
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import select
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpokit.collect.transport import _load_payload, trainable_parameters
from grpokit.core.errors import (
    ConfigError,
    SamplerDiedError,
    TrainingError,
    UserCodeFailedError,
)
from grpokit.core.workers import PR_SET_PDEATHSIG, listen_for_stops, read_frame, write_frame
from grpokit.rewards import RewardRunner
from grpokit.rollout.episodes import EpisodeSampler, multi_turn
from grpokit.rollout.generation import rollout_metrics

HEARTBEAT_S = 1.0  # how often the process's heartbeat thread beats
BEAT, STARTED, SIGNAL, WORKER = range(4)  # the board's slots: beats, the last batch whose weights the process took,
# a signal sent to the process or to one of its tool or environment workers (its number; 0: none), that worker's pid
# (0: the process itself)


@dataclass
class Taken:
    """A batch taken off the queue: its index in the run, the policy version that made it, and the
    sampler's own numbers."""

    index: int
    version: int
    batch: object  # ScoredBatch
    timing: dict[str, float]  # the sampler's seconds: generation, scoring
    sampling: dict[str, float]  # sampling metrics (zero_variance_frac, sampling_rounds...)
    stream: dict[str, int]  # the prompt stream's position after this batch
    busy_s: float  # the sampler's seconds on this batch
    done_at: float  # time.monotonic() when it was sent
    episodes: dict[str, float] = field(default_factory=dict)  # episode/*, tools/* (multi-turn), rollout/*


@dataclass
class SamplerRecipe:
    """What the sampler process builds its Sampler from (every field picklable): the trainer's Sampler's
    settings and data, and ``rewards``, a picklable function that returns the run's [(name, fn, weight)]
    (called in the process: a config's rewards are resolved again there)."""

    sampler_class: type  # grpokit.collect.sampler.Sampler, or the subclass the trainer was given
    cfg: object  # Config
    algo: object  # the resolved algorithm
    tokenizer: object
    train_rows: list[dict]
    encoded: list[list[int]]  # the prompts' token ids
    reward_names: list[str]
    has_critic: bool
    dist: object  # its share of the prompts and its seed: Distributed() alone (grpokit.collect.async_ranks: a rank's)
    rewards: Callable[[], list]

    @classmethod
    def of(cls, sampler, rewards: Callable[[], list]) -> SamplerRecipe:
        """The recipe of the trainer's ``sampler`` (grpokit.collect.sampler.Sampler)."""
        return cls(
            type(sampler), sampler.cfg, sampler.algo, sampler.tokenizer, sampler.train_rows, sampler.encoded,
            list(sampler.reward_names), sampler.has_critic, sampler.dist, rewards,
        )  # fmt: skip

    def build(self, model: torch.nn.Module):
        """The Sampler of the process around ``model``: its own reward runner, engine and, with multi-turn
        rollouts, its own tool and environment workers."""
        functions = self.rewards()
        rewards = RewardRunner(functions, timeout_s=self.cfg.train.reward_timeout_s)
        rewards.start()  # the reward workers set up while the engine and the first batch get going
        episodes = EpisodeSampler(self.cfg, functions, self.algo) if multi_turn(self.cfg.rollout) else None
        return self.sampler_class(
            self.cfg, self.algo, model, self.tokenizer, self.train_rows, rewards, self.reward_names,
            dist=self.dist, has_critic=self.has_critic, episodes=episodes, encoded=self.encoded,
        )  # fmt: skip


def _raised_there(where: str, error: BaseException) -> Exception:
    """The trainer's error for ``error``, raised in the sampler process at ``where`` ("batch 3", "starting"): the
    user's code or settings failing there keep their own kind (a reward function: RewardFunctionError, exit 3);
    anything else is the process failing (SamplerDiedError)."""
    if isinstance(error, (UserCodeFailedError, ConfigError)):
        try:
            return type(error)(f"in the sampler process, {where}: {error}")
        except TypeError:  # a class of more arguments: its kind
            kind = UserCodeFailedError if isinstance(error, UserCodeFailedError) else ConfigError
            return kind(f"in the sampler process, {where}: {type(error).__name__}: {error}")
    return SamplerDiedError(f"the sampler process failed: {where}: {type(error).__name__}: {error}")


def _sendable(error: BaseException) -> BaseException:
    """``error`` if it pickles (it reaches the trainer as itself), else a TrainingError saying what it was."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any pickling failure: its text
        return TrainingError(f"{type(error).__name__}: {error}")


# ---------------------------------------------------------------------- the sampler process


def _sampler_process(
    parent, box, reference_tensors, shared, shared_version, lock, board, requests, replies, start
) -> None:
    """The process's main: tie its life to the trainer's and start its heartbeat, build the Sampler from the
    recipe and the policy pickled in ``box`` (a one-item list it empties: the bytes are freed once loaded; the
    reference pass, if any, with the trainer's ``reference_tensors``), then serve (a failure is sent to the
    trainer, which raises it: ``_raised_there``)."""
    _tie_to(parent, board.numpy())
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(1)
    out = replies.fileno()
    sampler, status = None, 0
    try:
        try:
            payload = box.pop()
            recipe, model, reference = _load_payload(payload, reference_tensors)
            del payload
            sampler = recipe.build(model)
        except Exception as e:  # noqa: BLE001 - the trainer raises it
            write_frame(out, ("error", ("starting", _sendable(e))))
            return
        _serve(
            sampler, reference, shared, shared_version, lock, board.numpy(), requests.fileno(), out, **start
        )
    except BaseException:  # noqa: BLE001 - shown here; the trainer sees the pipe close
        traceback.print_exc()
        status = 1
    finally:
        try:
            if sampler is not None:  # its reward, tool and environment workers and its engine end with it
                sampler.rewards.close()
                if sampler.episodes is not None:
                    sampler.episodes.close()
                close_engine = getattr(sampler.generator, "close", None)  # vllm: its engine, weights folder
                if close_engine is not None:
                    close_engine()
        except BaseException:  # noqa: BLE001 - shown; the process ends all the same
            traceback.print_exc()
            status = 1
        # now, not through the interpreter's shutdown, which waits for threads its libraries started (it held
        # every stop past close()'s 2 s until the process was killed)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _tie_to(parent: int, board) -> None:
    """This process in its own process group (the terminal's Ctrl-C is the trainer's; killpg reaches what it
    starts), killed when the trainer dies (PR_SET_PDEATHSIG), gone at once if it already has; its heartbeat
    started; SIGTERM and SIGINT sent to it asking the trainer to stop the run (``_signalled``)."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)
    for signum in (signal.SIGINT, signal.SIGTERM):  # (a fork inherits the trainer's StopOnSignals handler)
        signal.signal(signum, lambda signum, frame: _signalled(board, signum))
    listen_for_stops(lambda name, where, pid: _worker_signalled(board, name, where, pid))  # (and its listener)
    threading.Thread(target=_beat, args=(board,), daemon=True, name="grpokit-heartbeat").start()


def _beat(board) -> None:
    """The heartbeat: the board's count, every HEARTBEAT_S, while the process is scheduled at all."""
    while True:
        board[BEAT] += 1
        time.sleep(HEARTBEAT_S)


def _signalled(board, signum: int) -> None:
    """SIGTERM or SIGINT sent to the process: the first is written on the board for the trainer, which stops
    the run after its step with a checkpoint (the process keeps serving until then); a second ends it at once."""
    if board[SIGNAL] and not board[WORKER]:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    board[SIGNAL], board[WORKER] = signum, 0
    name = signal.Signals(signum).name
    # os.write, not print: the handler may interrupt a print of the process's own
    os.write(2, f"grpokit: sampler process {os.getpid()}: {name}: the run stops after this step with a checkpoint "
                f"({name} again ends this process at once)\n".encode())  # fmt: skip


def _worker_signalled(board, name: str, where: str, pid: int) -> None:
    """SIGTERM or SIGINT sent to one of the process's tool or environment workers (grpokit.rollout.tools.runner): on
    the board for the trainer, as one sent to the process is (the first of either), with that worker's pid."""
    if not board[SIGNAL]:
        board[WORKER], board[SIGNAL] = pid, signal.Signals[name].value
    print(f"grpokit: sampler process {os.getpid()}: {name} {where}: the run stops after this step with a "
          "checkpoint", file=sys.stderr, flush=True)  # fmt: skip


def _serve(
    sampler,
    reference,
    shared,
    shared_version,
    lock,
    board,
    requests: int,
    replies: int,
    *,
    index,
    stream,
    versions,
    log_history,
):
    """Make each credited batch from the weights its credit names (``versions``: those of the batches credited
    before the start), with ``reference`` (a ReferencePass) its reference log-probs too, and send it; end at
    "stop" or when the trainer's end of the requests closes."""
    params = trainable_parameters(sampler.model)
    sampler.stream.load_state(stream)
    log_history = list(log_history)  # the trainer's logged steps, for reward functions' trainer_state
    pending = deque(versions)  # the version each credited batch not yet started is made from, in order
    version = None  # the policy came pickled with the trainer's weights: the last push's are copied first
    while True:
        ready, _, _ = select.select([requests], [], [], None if not pending else 0)
        if ready:
            message = read_frame(requests)
            if message is None or message[0] == "stop":
                return
            # ("credit", the trainer's log lines since the last one, the version of the batch it allows)
            _, news, credited_version = message
            pending.append(credited_version)
            log_history += news
            continue
        wanted = pending.popleft()
        with lock, torch.no_grad():
            pushed = int(shared_version[0])
            if pushed != wanted:  # the trainer waits for STARTED before a push: this cannot happen
                problem = TrainingError(
                    f"its weights of version {wanted} were replaced by version {pushed} before it took them: a "
                    "defect of grpokit's push (please report it)"
                )
                write_frame(replies, ("error", (f"batch {index}", problem)))
                return
            if wanted != version:
                for name, buffer in shared.items():
                    params[name].copy_(buffer)
                version = wanted
            board[STARTED] = index  # a push may now replace them
        t = time.perf_counter()
        try:
            batch, timing, sampling = sampler.sample_batch(index, log_history)
            if reference is not None:  # the frozen reference's: the same whatever weights sampled the batch
                t_ref = time.perf_counter()
                batch.ref_logprobs = reference.logprobs(sampler.model, batch.rollout)  # (N, Lc)
                timing["reference"] = time.perf_counter() - t_ref
        except Exception as e:  # noqa: BLE001 - the trainer raises it
            write_frame(replies, ("error", (f"batch {index}", _sendable(e))))
            return
        busy = time.perf_counter() - t
        taken = Taken(
            index, version, batch, timing, sampling, sampler.stream.state(), busy, time.monotonic(),
            {**sampler.episode_metrics(), **rollout_metrics(sampler.generator)},
        )  # fmt: skip
        write_frame(replies, ("batch", taken))
        index += 1


def _drain(conn, into: queue.Queue) -> None:
    """A thread: every frame from the process into the queue (it never waits on a full pipe); None at the end.
    A function, not a method: the thread must not keep the AsyncSampler alive (its finalizer stops the process)."""
    try:
        while (frame := read_frame(conn.fileno())) is not None:
            into.put(frame)
    except (OSError, pickle.UnpicklingError, EOFError):
        pass
    conn.close()
    into.put(None)


def _stop(process, to_child, owner: int) -> None:
    """Stop the sampler process and its process group, reap it, close the pipe (its owner only)."""
    if os.getpid() != owner:  # a fork of the owner: not its process
        return
    try:  # "stop", then the end of its requests
        write_frame(to_child.fileno(), ("stop",))
    except (OSError, ValueError):
        pass
    to_child.close()
    process.join(2.0)
    if process.exitcode is None:
        _kill_group(process.pid)
        process.kill()
        process.join()
    _kill_group(process.pid)  # whatever it started in its group


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass

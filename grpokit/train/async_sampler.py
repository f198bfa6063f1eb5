"""Asynchronous rollouts (rollout.max_staleness = K >= 1): a sampler process generates and scores the next
batches while the trainer updates on the current one.

    sampler process                                 trainer (this process)
    -----------------------------------------       --------------------------------------------------
    copy of the policy at version v                 policy at version s (s updates done)
    batch j = sample_batch(j): generate + score     take(): the next batch; staleness s - v > K: dropped
      -> (j, v, batch)  --- reply pipe --->           (counted), the weights pushed at once
    waits while K batches are not taken yet         update, s += 1
    before each batch: the newest pushed weights <- push(model, s) every rollout.sync_every steps
                       (shared memory + its version)

Bounds, with sync_every = 1: batch j is started only once batch j - K was taken (a credit per taken batch,
so at most K batches are ahead), and by then the weights of version j - K were pushed: batch j, trained at
step j, is at most K versions old and none is dropped. With sync_every = S > 1 it can be up to K + S - 1
old; those over K are dropped and the weights pushed then, so the batches after them are fresh.

The sampled log-probs (the behaviour policy's, of the version that made the batch) travel in the batch's
Rollout.logprobs; the update's importance weights pi_old / pi_sampler (rollout.mismatch_correction,
grpokit.train.mismatch; auto is token_truncate with K >= 1) correct for the staleness with them.

Reward functions' ``trainer_state.log_history`` in the process: the steps the trainer had logged when the
batch's credit was sent (each credit carries the lines logged since the last), so batch j sees steps 1 .. j - K
at least (the synchronous loop's batch j sees 1 .. j). Under torchrun every rank runs its own process for its
share of the prompts, and take()'s ``agree`` makes a batch too old on one rank dropped on every rank
(grpokit.train.async_ranks).

Why fork and not spawn: the child starts with the trainer's objects as they are (the model, the tokenizer,
the engine, the reward functions, closures and functions defined in a notebook included), without pickling
any of them; a spawned child would need each to be importable. The price: a forked child cannot use CUDA
once the parent has, so K >= 1 runs on the CPU only for now (a ConfigError otherwise), and the child uses
one torch thread (sampler one core, trainer the others; no OpenMP pool inherited from the parent is entered).

Weights travel through shared memory made before the fork (one buffer per trainable parameter: with LoRA
the adapter alone, the frozen base never changes); a lock held only while one side copies means a push
never waits for a batch and the sampler never waits longer than a copy.

    sampler = AsyncSampler(trainer_sampler, model, max_staleness=1, sync_every=1, version=step)
    batch, timing, sampling, metrics = sampler.take(step, log_history=history)  # starts the process on the first call
    sampler.trained(model, step + 1)                       # push when due
    sampler.close()
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from grpokit.core.errors import ConfigError, TrainingError
from grpokit.core.workers import fork_worker, read_frame, write_frame

POLL_S = 0.5  # how often a waiting trainer checks that the sampler process is alive


class SamplerDiedError(TrainingError):
    """The sampler process of an asynchronous run (rollout.max_staleness >= 1) died or failed."""


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


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters a push carries: those that train (with LoRA the adapter; the frozen base never changes)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


class AsyncSampler:
    """Owns the sampler process, the queue of batches it made, and the version counter (the module docstring).

    sampler: the trainer's grpokit.train.sampler.Sampler (its model, engine, rewards and prompt stream are what
    the process starts with: fork it once they are restored). model: the policy (its trainable parameters
    are pushed). version: the trainer's step the process starts at (a resumed run: the checkpoint's)."""

    def __init__(
        self,
        sampler,
        model: torch.nn.Module,
        *,
        max_staleness: int,
        sync_every: int,
        version: int,
        first_batch: int | None = None,
    ):
        if max_staleness < 1:
            raise ValueError(f"max_staleness must be >= 1 (0 is the synchronous loop), got {max_staleness}")
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ConfigError(
                f"rollout.max_staleness={max_staleness}: the asynchronous sampler is a forked process, which "
                f"cannot use {device.type} once the trainer has; it runs on the CPU only for now "
                "(model.device=cpu), or set rollout.max_staleness=0."
            )
        self.sampler, self.max_staleness, self.sync_every = sampler, max_staleness, sync_every
        self.version = version  # the weights the process holds (the last push)
        self.next_index = version if first_batch is None else first_batch  # the next batch to take
        self.pid: int | None = None
        self.stream_state = sampler.stream.state()  # the prompts' position after the last batch taken
        self.dropped_total = 0
        self.log_history: list[dict] = []  # the trainer's logged steps the process was sent (credits carry them)
        self._queue: queue.Queue = queue.Queue()
        self._last_take: float | None = None
        with torch.no_grad():  # shared before the fork: both processes see the same pages
            self._shared = {
                n: p.detach().clone().share_memory_() for n, p in trainable_parameters(model).items()
            }
        self._shared_version = torch.tensor([version], dtype=torch.long).share_memory_()
        self._lock = multiprocessing.get_context("fork").Lock()
        self._finalizer = None
        self._drain: threading.Thread | None = None

    # ------------------------------------------------------------------ the trainer's side

    def start(self, version: int | None = None) -> None:
        """Fork the sampler process, unless it runs: it starts with the weights of ``version`` (the trainer's
        step; pushed first when newer than the last push) and the prompt stream where the last batch taken
        left it."""
        if self.pid is not None:
            return
        if version is not None and version > self.version:  # a restart after close(): the trainer moved on
            self._push_weights(version)
        owner = os.getpid()
        self.pid, self._to_child, self._from_child = fork_worker(self._serve, ())
        self._drain = threading.Thread(target=_drain, args=(self._from_child, self._queue), daemon=True)
        self._drain.start()
        self._finalizer = weakref.finalize(self, _stop, self.pid, self._to_child, owner)

    def take(
        self,
        step: int,
        *,
        log_history: Sequence[dict] = (),
        agree: Callable[[bool], bool] | None = None,
    ) -> tuple[object, dict[str, float], dict[str, float], dict[str, float]]:
        """(batch, the sampler's seconds by stage, sampling metrics, async/* metrics) for the trainer at
        ``step`` (its weights are version ``step``): the next batch at most max_staleness versions old.
        Older ones are dropped (counted) and the weights pushed at once. SamplerDiedError when the process
        died or failed. log_history: the trainer's logged steps; those the process was not sent yet go with
        the credit (its reward functions' trainer_state.log_history). agree: this process's "too old" ->
        every rank's (torchrun: a batch too old on any rank is dropped on all, grpokit.train.async_ranks)."""
        self.start(step)
        t0 = time.monotonic()
        dropped = 0
        while True:
            item = self._next_item()
            staleness = step - item.version
            self.stream_state = item.stream
            self.next_index = item.index + 1
            too_old = staleness > self.max_staleness
            if agree is not None:
                too_old = agree(too_old)
            if too_old and self.version < step:
                self._push_weights(step)  # the newest weights before the credit: the next batch is fresh
            logged = list(log_history[len(self.log_history) :])
            self.log_history += logged
            self._send(("credit", logged))  # room for one more batch, and the steps logged since the last
            if not too_old:
                break
            dropped += len(item.batch.texts)
        now = time.monotonic()
        waited = now - t0
        since = now - self._last_take if self._last_take is not None else None
        self._last_take = now
        self.dropped_total += dropped
        n = len(item.batch.texts)
        metrics = {
            "async/staleness_mean": float(staleness),
            "async/staleness_max": float(staleness),
            **{
                f"async/staleness_{k}": float(n if k == staleness else 0)
                for k in range(self.max_staleness + 1)
            },
            "async/dropped": float(dropped),
            "async/queue_depth": float(self._queue.qsize()),
            "async/wait_s": waited,
            "async/version": float(item.version),
        }
        if since:  # the sampler's seconds on this batch over the seconds since the last one was taken
            metrics["async/sampler_busy"] = min(1.0, item.busy_s / since)
        return item.batch, dict(item.timing), dict(item.sampling), metrics

    def trained(self, model: torch.nn.Module, version: int) -> bool:
        """The trainer finished the update that made ``version``: push its weights every sync_every steps
        (True when pushed)."""
        if version - self.version >= self.sync_every:
            self._push_weights(version, model)
            return True
        return False

    def close(self) -> None:
        """Stop the process and everything it started; the batches not taken are discarded (the next take
        starts a new process from the batch after the last one taken)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        if self._drain is not None:
            # the process is gone, so its pipe ends: wait for the thread that reads it. A daemon thread still
            # unpickling a batch's tensors while the interpreter exits aborted the process ("terminate called
            # without an active exception", exit -6, once in CI after a finished run)
            self._drain.join(timeout=10)
            self._drain = None
        self.pid, self._queue, self._last_take = None, queue.Queue(), None

    def in_flight(self) -> int:
        """Batches made or being made by the process and not taken: lost when the run stops here."""
        if self.pid is None:
            return 0
        made = sum(1 for frame in list(self._queue.queue) if frame is not None and frame[0] == "batch")
        return min(self.max_staleness, made + 1)  # credits bound what it holds and makes

    def checkpoint_state(self) -> dict[str, int]:
        """What a checkpoint records: the sampler's weights' version (the last push), the next batch's index
        (batches taken, dropped ones included) and the batches in flight, which a resume discards."""
        return {"version": self.version, "next_batch": self.next_index, "in_flight": self.in_flight()}

    # ------------------------------------------------------------------ internals

    def _push_weights(self, version: int, model: torch.nn.Module | None = None) -> None:
        model = model if model is not None else self.sampler.model
        params = trainable_parameters(model)
        with self._lock, torch.no_grad():
            for name, shared in self._shared.items():
                shared.copy_(params[name])
            self._shared_version[0] = version
        self.version = version

    def _send(self, message: tuple) -> None:
        try:
            write_frame(self._to_child, message)
        except OSError:  # the process is gone: _next_item says so
            pass

    def _next_item(self) -> Taken:
        while True:
            try:
                frame = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if self._exited():
                    frame = self._queue.get() if not self._queue.empty() else None
                else:
                    continue
            if frame is None:
                self._queue.put(None)  # every later take sees it too
                deadline = time.monotonic() + 2.0  # its pipe closed: it is exiting; how it ended
                while not self._exited() and time.monotonic() < deadline:
                    time.sleep(0.02)
                raise SamplerDiedError(
                    f"the sampler process (pid {self.pid}) of rollout.max_staleness={self.max_staleness} "
                    f"died{self._exit_status()}: no batch can come. See its messages above; the run stops here."
                )
            kind, payload = frame
            if kind == "error":
                self._queue.put(None)
                raise SamplerDiedError(f"the sampler process failed: {payload}")
            return payload

    def _exited(self) -> bool:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid:
            self._status = status
            return True
        return False

    def _exit_status(self) -> str:
        status = getattr(self, "_status", None)
        if status is None:
            return ""
        if os.WIFSIGNALED(status):
            return f" (killed by {signal.Signals(os.WTERMSIG(status)).name})"
        return f" (exit status {os.WEXITSTATUS(status)})"

    # ------------------------------------------------------------------ the sampler process

    def _serve(self, parent: int, requests: int, replies: int) -> None:
        """The process: take the newest pushed weights, make a batch, send it, while credits last."""
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        torch.set_num_threads(1)
        sampler = self.sampler
        sampler.say.log = None  # the trainer's log file is the trainer's: messages go to stderr
        params = trainable_parameters(sampler.model)
        version, index, credits = self.version, self.next_index, self.max_staleness
        history = list(self.log_history)  # reward functions' trainer_state.log_history
        sampler.stream.load_state(self.stream_state)
        while True:
            ready, _, _ = select.select([requests], [], [], None if credits == 0 else 0)
            if ready:
                message = read_frame(requests)
                if message is None or message[0] == "stop":
                    return
                credits += 1  # ("credit", the trainer's steps logged since the last credit)
                history += message[1]
                continue
            with self._lock, torch.no_grad():
                if int(self._shared_version[0]) != version:
                    for name, shared in self._shared.items():
                        params[name].copy_(shared)
                    version = int(self._shared_version[0])
            t = time.perf_counter()
            try:
                batch, timing, sampling = sampler.sample_batch(index, history)
            except Exception as e:  # noqa: BLE001 - the trainer raises it as SamplerDiedError
                write_frame(replies, ("error", f"batch {index}: {type(e).__name__}: {e}"))
                return
            busy = time.perf_counter() - t
            taken = Taken(
                index, version, batch, timing, sampling, sampler.stream.state(), busy, time.monotonic()
            )
            write_frame(replies, ("batch", taken))
            index += 1
            credits -= 1


def _drain(fd: int, into: queue.Queue) -> None:
    """A thread: every frame from the process into the queue (it never waits on a full pipe); None at the end.
    A function, not a method: the thread must not keep the AsyncSampler alive (its finalizer stops the process)."""
    try:
        while (frame := read_frame(fd)) is not None:
            into.put(frame)
    except (OSError, pickle.UnpicklingError, EOFError):
        pass
    try:
        os.close(fd)
    except OSError:
        pass
    into.put(None)


def _stop(pid: int, to_child: int, owner: int) -> None:
    """Stop the sampler process ``pid`` and its process group, reap it, close the pipe (its owner only)."""
    if os.getpid() != owner:  # a fork of the owner: not its process
        return
    try:  # "stop", then the end of its requests: it ends even if a process forked later holds the pipe open
        write_frame(to_child, ("stop",))
    except OSError:
        pass
    try:
        os.close(to_child)
    except OSError:
        pass
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
        except ChildProcessError:
            break
        time.sleep(0.02)
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    try:  # whatever it started in its group
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass

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

Versions set by the steps, not by timing: the credit for batch j names the version the trainer had pushed when
it gave it (the one taking batch j - K), and the process makes batch j from exactly those weights; a push waits,
if it must, until the process has copied the weights of every batch already credited (with K = 1 it has long
done so: it starts the batch as soon as the credit comes). So two runs with the same settings make the same
batches from the same weights, whatever the machine's load; a checkpoint keeps the batches in flight
(``checkpoint_state`` waits for them) and the weights of the last push when the trainer's are newer, and a
resume (``load_state``) takes those batches first and starts the process where the stopped one was: a resumed
run is the uninterrupted one bit for bit. (A process that made each batch from the newest weights it found
would make some batches a version fresher when it was slower than the trainer, by timing alone.)

Liveness: the process beats (a counter in shared memory, every HEARTBEAT_S) from a thread of its own; a
trainer waiting on it (for a batch, for it to take the weights before a push, for the batches a checkpoint
keeps) raises SamplerStalledError when no beat came for ``timeout_s`` (rollout.sampler_timeout_s: a
SIGSTOP, a frozen or hung process), SamplerDiedError when it ended. Before its first beat it gets
START_ALLOWANCE_S at least (a spawned process imports torch first). SIGTERM or SIGINT sent to the process
itself is not swallowed: it is written to the shared board (``signalled``) and the trainer stops the run
after its step with a checkpoint, as for a signal sent to it; a second one ends the process.

The sampled log-probs (the behaviour policy's, of the version that made the batch) travel in the batch's
Rollout.logprobs; the update's importance weights pi_old / pi_sampler (rollout.mismatch_correction,
grpokit.train.mismatch; auto is token_truncate with K >= 1) correct for the staleness with them. With a
reference (algo.beta > 0, or a KL in the reward) on a CPU, the process also computes the reference's log-probs of
each batch and ships them in it (ScoredBatch.ref_logprobs; grpokit.train.reference): the reference never
changes, so they are exact whatever the batch's age, and the trainer skips its own pass. The reference's weights
are the trainer's own, sent as themselves (``shared_tensors``): the pickled description names them.

A spawned process (a fresh interpreter, multiprocessing's 'spawn') where a fork cannot serve: a forked child
cannot use CUDA once the trainer has, nor start a vLLM engine. On a CPU-only run it is a fork by default
(``start_method``): the same code and the same description, but the first batch comes 0.2 s after the start
instead of the 5-12 s a fresh interpreter's imports take on a 2-core CPU, which on a short run costs more
than the overlap gains. GRPOKIT_SAMPLER_START=spawn|fork chooses (the test suite runs spawn: the GPU's
path). It starts from a description,
``SamplerRecipe``: the config, the resolved algorithm, the tokenizer, the prompts, a picklable function that
builds the reward functions again (a config's rewards are resolved again there; functions given in code
travel by reference: they must be importable by name, as in any spawned process), and the policy itself,
pickled once when the process starts (its weights at that version, on the trainer's device; without its
module hooks, which are the trainer's, e.g. gradient checkpointing's). The process builds its own Sampler
from it: its engine (a colocated vLLM engine too), its reward workers, and with multi-turn rollouts its tool
and environment workers, all closed with it before it exits. It uses one torch thread.

Weights travel through shared memory (one CPU buffer per trainable parameter: with LoRA the adapter alone,
the frozen base never changes); a lock held only while one side copies means a push never waits for a
batch and the sampler never waits longer than a copy.

    sampler = AsyncSampler(trainer_sampler, model, rewards=build_rewards, max_staleness=1, sync_every=1,
                           version=step, timeout_s=60)
    sampler.load_state(checkpoint["async"])                # a resume: the batches in flight, the last push
    batch, timing, sampling, metrics = sampler.take(step)  # starts the process on the first call
    sampler.trained(model, step + 1)                       # push when due
    state = sampler.checkpoint_state()                     # waits for the batches in flight
    sampler.close()
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from grpokit.collect.process import (
    BEAT,
    SIGNAL,
    STARTED,
    WORKER,
    SamplerRecipe,
    Taken,
    _drain,
    _raised_there,
    _sampler_process,
    _stop,
)
from grpokit.collect.transport import (
    _SCRIPT_HINT,
    _shared_payload,
    _started_by_script,
    check_named_code,
    check_sendable,
    shared_tensors,
    trainable_parameters,
)
from grpokit.core.errors import (
    ConfigError,
    SamplerDiedError,
    SamplerStalledError,
)
from grpokit.core.workers import write_frame
from grpokit.rollout.engines import engine_class

POLL_S = 0.5  # how often a waiting trainer checks that the sampler process is alive and beating
START_ALLOWANCE_S = 600.0  # the least time a process gets for its first beat (spawn imports torch... first)

__all__ = ["AsyncSampler", "SamplerDiedError", "SamplerStalledError", "StopRequested", "Taken"]


class StopRequested(Exception):
    """take() stopped waiting for a batch: ``stopping()`` said the run stops (a signal); no batch was taken."""


START_ENV = "GRPOKIT_SAMPLER_START"


def start_method(engine: str) -> str:
    """How the sampler process starts: $GRPOKIT_SAMPLER_START (spawn | fork) when set; else 'spawn' where a
    fork cannot serve (CUDA initialised in this process, or an engine that needs a fresh process: vLLM's), 'fork' otherwise (a CPU run: no
    fresh interpreter to import torch and transformers again before the first batch)."""
    chosen = os.environ.get(START_ENV, "").strip()
    if chosen:
        if chosen not in ("spawn", "fork"):
            raise ConfigError(f"{START_ENV}={chosen!r}: expected spawn or fork (or unset)")
        if chosen == "fork" and (torch.cuda.is_initialized() or engine_class(engine).needs_fresh_process):
            raise ConfigError(
                f"{START_ENV}=fork: a forked sampler process cannot use CUDA once this process has, nor start "
                "vLLM; unset it (spawn is chosen there)"
            )
        return chosen
    return "spawn" if torch.cuda.is_initialized() or engine_class(engine).needs_fresh_process else "fork"


class AsyncSampler:
    """Owns the sampler process, the queue of batches it made, and the version counter (the module docstring).

    sampler: the trainer's grpokit.collect.sampler.Sampler (its settings, data and prompt stream are what the
    process starts from; its model is the policy sent when the process starts). model: the policy (its
    trainable parameters are pushed). rewards: a picklable function returning the run's reward functions,
    called in the process. version: the trainer's step the process starts at (a resumed run: the checkpoint's;
    ``load_state`` then gives the rest). timeout_s: rollout.sampler_timeout_s, how long a waiting trainer lets
    the process go without a heartbeat."""

    def __init__(
        self,
        sampler,
        model: torch.nn.Module,
        *,
        rewards: Callable[[], list],
        max_staleness: int,
        sync_every: int,
        version: int,
        reference=None,
        timeout_s: float = 60.0,
    ):
        if max_staleness < 1:
            raise ValueError(f"max_staleness must be >= 1 (0 is the synchronous loop), got {max_staleness}")
        self.sampler, self.max_staleness, self.sync_every = sampler, max_staleness, sync_every
        self.timeout_s = timeout_s
        self.recipe = SamplerRecipe.of(sampler, rewards)
        # a grpokit.train.reference.ReferencePass: the process makes each batch's reference pass (None: the trainer)
        self.reference = reference
        self._reference_tensors = shared_tensors(getattr(reference, "model", None))  # sent as themselves
        check_sendable(self.recipe, max_staleness, "the sampler's settings, tokenizer, prompts or rewards")
        check_named_code(sampler.cfg.rollout, max_staleness)
        self.version = version  # the weights the process holds (the last push)
        self.next_index = version  # the next batch to take
        self.credited = self.next_index + max_staleness - 1  # the last batch the process was given credit for
        self.pid: int | None = None
        self.process = None
        self.failed = False  # the process ended, failed or stalled: nothing more comes from it
        self.stream_state = sampler.stream.state()  # the prompts' position after the last batch taken
        self.dropped_total = 0
        self._queue: queue.Queue = queue.Queue()
        self._last_take: float | None = None
        self._logged = 0  # the trainer's log lines the process was sent
        self.start_method = start_method(sampler.cfg.rollout.engine)  # spawn, or fork on a CPU-only run
        self._context = multiprocessing.get_context(self.start_method)
        with torch.no_grad():  # CPU shared memory, whatever the device: the process maps the same pages
            self._shared = {
                n: p.detach().to("cpu", copy=True).share_memory_()
                for n, p in trainable_parameters(model).items()
            }
        self._shared_version = torch.tensor([version], dtype=torch.long).share_memory_()
        self._board = torch.zeros(4, dtype=torch.long).share_memory_()  # BEAT, STARTED, SIGNAL, WORKER
        self._beats = (0, time.monotonic())  # the last beat count seen, and when it was seen to change
        self._lock = self._context.Lock()
        self._finalizer = None
        self._drain: threading.Thread | None = None

    # ------------------------------------------------------------------ the trainer's side

    def start(self, log_history: Sequence[dict[str, float]] = ()) -> None:
        """Start the sampler process, unless it runs: it starts from the policy (its module; its trainable weights
        are the last push's, taken from the shared buffers before its first batch), the prompt stream where the
        last batch it made left it, and ``log_history`` (the steps logged so far, for its reward functions).
        It makes the batches after those already queued (a resume's) up to the credited one, each from the
        weights its credit names (those before the start: the last push's). A restart after close() starts
        from the last push too, not from newer weights of the trainer: the versions stay set by the steps."""
        if self.process is not None:
            return
        try:
            payload = _shared_payload(
                (self.recipe, self.sampler.model, self.reference), self._reference_tensors
            )
        except Exception as e:  # noqa: BLE001 - named, with what to do
            raise ConfigError(
                f"rollout.max_staleness={self.max_staleness}: the policy cannot be sent to the sampler process "
                f"(pickle: {type(e).__name__}: {e}); set rollout.max_staleness=0."
            ) from None
        made = self._made()  # a resume's batches in flight, taken before any the process makes
        index = self.next_index + len(made)
        self._logged = len(log_history)  # the process starts with them; the credits carry the later ones
        requests, to_child = self._context.Pipe(duplex=False)  # (the process's end, the trainer's end)
        from_child, replies = self._context.Pipe(duplex=False)
        start = {
            "index": index, "stream": made[-1].stream if made else self.stream_state,
            "versions": [self.version] * (self.credited - index + 1), "log_history": list(log_history),
        }  # fmt: skip
        self._board.copy_(torch.tensor([0, index - 1, 0, 0]))
        self._beats, self.failed = (0, time.monotonic()), False
        process = self._context.Process(
            target=_sampler_process,
            args=(
                os.getpid(),
                [payload],  # a box the process empties: the pickled policy is freed once loaded
                self._reference_tensors,  # the reference's weights the payload names (spawn: shared memory)
                self._shared,
                self._shared_version,
                self._lock,
                self._board,
                requests,
                replies,
                start,
            ),
            name="grpokit-sampler",
        )
        process.start()
        requests.close()  # the process holds its own copies: the pipes end when it does
        replies.close()
        del payload
        self.process, self.pid, self._to_child = process, process.pid, to_child
        self._drain = threading.Thread(target=_drain, args=(from_child, self._queue), daemon=True)
        self._drain.start()
        self._finalizer = weakref.finalize(self, _stop, process, to_child, os.getpid())

    def take(
        self,
        step: int,
        *,
        log_history: Sequence[dict[str, float]] = (),
        agree: Callable[[bool], bool] | None = None,
        stopping: Callable[[], bool] | None = None,
    ) -> tuple[object, dict[str, float], dict[str, float], dict[str, float]]:
        """(batch, the sampler's seconds by stage, sampling metrics, async/* metrics and the batch's episode
        metrics) for the trainer at ``step`` (its weights are version ``step``): the next batch at most
        max_staleness versions old. Older ones are dropped (counted) and the weights pushed at once.
        SamplerDiedError when the process died or failed, SamplerStalledError when it gave no heartbeat for
        timeout_s; the user's code failing there (a reward function) raises its own error.

        log_history: the steps logged so far; those the process has not seen go with the next credit (its
        reward functions' trainer_state.log_history). agree: under torchrun, turns this rank's "too old" into
        every rank's (grpokit.collect.async_ranks.agree_on_age), so all ranks drop the same batches. stopping:
        polled while no batch has come; True raises StopRequested (nothing taken)."""
        self.start(log_history)
        t0 = time.monotonic()
        dropped = 0
        while True:
            item = self._next_item(stopping)
            staleness = step - item.version
            self.stream_state = item.stream
            self.next_index = item.index + 1
            too_old = staleness > self.max_staleness
            if agree is not None:
                too_old = agree(too_old)
            if too_old and self.version < step:
                self._push_weights(step)  # the newest weights before the credit: the next batch is fresh
            news, self._logged = list(log_history[self._logged :]), max(self._logged, len(log_history))
            self._send(("credit", news, self.version))  # room for one more batch, made from these weights
            self.credited += 1
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
        metrics.update(item.episodes)  # the process's engine and episodes made the batch: their metrics
        return item.batch, dict(item.timing), dict(item.sampling), metrics

    def trained(self, model: torch.nn.Module, version: int) -> bool:
        """The trainer finished the update that made ``version``: push its weights every sync_every steps
        (True when pushed)."""
        if version - self.version >= self.sync_every:
            self._push_weights(version, model)
            return True
        return False

    def signalled(self) -> tuple[str, int] | None:
        """The signal (SIGTERM, SIGINT) sent to the sampler process (pid 0) or to its tool or environment worker of
        that pid, which asks the run to stop after its step; None when none came."""
        number = int(self._board[SIGNAL])
        return (signal.Signals(number).name, int(self._board[WORKER])) if number else None

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
        self.pid, self.process, self._queue, self._last_take = None, None, queue.Queue(), None
        self.credited = self.next_index + self.max_staleness - 1

    def checkpoint_state(self, step: int) -> dict:
        """What a checkpoint of the trainer's ``step`` records (``load_state`` restores it): the last push's
        version, and its weights when the trainer's are newer (rollout.sync_every > 1); the next batch's index
        (batches taken, dropped ones included) and the prompt stream after the batch before it; the batches in
        flight (those the process was given credit for: at most K), waited for while the process lives and
        beats; ``in_flight``: those it could not give (it ended or stalled), made again on resume; the samples
        dropped so far."""
        if self.process is not None and not self.failed:
            wanted = self.credited - self.next_index + 1
            while len(self._made()) < wanted and not self._ended_in_queue():
                if self._exited() or self._stalled():
                    break
                time.sleep(0.01)
        made = self._made()
        state = {
            "version": self.version,
            "next_batch": self.next_index,
            "stream": self.stream_state,
            "batches": [
                {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name != "done_at"}
                for t in made
            ],
            "in_flight": self.credited - self.next_index + 1 - len(made),
            "dropped_total": self.dropped_total,
        }
        if self.version != step:  # the process's weights are older than the trainer's: kept, to go on from
            state["weights"] = {name: buffer.clone() for name, buffer in self._shared.items()}
        return state

    def load_state(self, saved: dict | None, policy: torch.nn.Module, version: int, stream: dict) -> int:
        """Go on from a checkpoint, before the process starts: ``policy``'s trainable weights (restored, the
        trainer's at ``version``, its step) as the last push, or the last push's own when the checkpoint kept
        them (``saved``: its ``checkpoint_state``, under torchrun this rank's); its batches in flight are taken
        first and the process makes the rest; ``stream``: the prompt stream after the last batch taken, when
        the checkpoint does not say. Returns how many batches in flight it lost (made again from the restored
        weights: the run then departs from the uninterrupted one). A checkpoint written before these were kept
        gives the index alone; None (a synchronous run's) the step."""
        saved = saved or {}
        with torch.no_grad():
            params = trainable_parameters(policy)
            kept = saved.get("weights")
            for name, buffer in self._shared.items():
                buffer.copy_(kept[name] if kept is not None else params[name])
        self.version = int(saved["version"]) if kept is not None else version
        self._shared_version[0] = self.version
        self.next_index = int(saved.get("next_batch", version))
        self.credited = self.next_index + self.max_staleness - 1
        self.dropped_total = int(saved.get("dropped_total", 0))
        self.stream_state = saved.get("stream") or stream
        batches = (saved.get("batches") or [])[: self.max_staleness]  # (a smaller K now: the first K)
        for fields in batches:
            self._queue.put(("batch", Taken(**fields, done_at=time.monotonic())))
        return (self.credited - self.next_index + 1 - len(batches)) if saved else 0

    # ------------------------------------------------------------------ internals

    def _made(self) -> list[Taken]:
        """The batches in the queue, from the next one to take on, in order."""
        out: list[Taken] = []
        for frame in list(self._queue.queue):
            if frame is None or frame[0] != "batch" or frame[1].index != self.next_index + len(out):
                break
            out.append(frame[1])
        return out

    def _ended_in_queue(self) -> bool:
        return any(frame is None or frame[0] == "error" for frame in list(self._queue.queue))

    def _push_weights(self, version: int, model: torch.nn.Module | None = None) -> None:
        """Write ``model``'s trainable weights (the sampler's own policy when None) as ``version``, once the process
        has taken the weights of every batch credited so far (their version: the module docstring)."""
        model = model if model is not None else self.sampler.model
        params = trainable_parameters(model)
        if self.process is not None and not self.failed:
            while int(self._board[STARTED]) < self.credited:
                if self._exited() or self._stalled():
                    break  # the next take says so
                time.sleep(0.002)
        locked = self._acquire()
        try:
            with torch.no_grad():
                for name, shared in self._shared.items():
                    shared.copy_(params[name])
                self._shared_version[0] = version
        finally:
            if locked:
                self._lock.release()
        self.version = version

    def _acquire(self) -> bool:
        """The lock the process copies the weights under; False, not held, when no process runs, or when it
        ended or stalled holding it (a SIGKILL or SIGSTOP in the middle of a copy): it reads nothing more."""
        if self.process is None:
            return False
        while not self._lock.acquire(timeout=POLL_S):
            if self._exited() or self._stalled():
                return False
        return True

    def _send(self, message: tuple) -> None:
        try:
            write_frame(self._to_child.fileno(), message)
        except (OSError, ValueError):  # the process is gone (or its pipe closed): _next_item says so
            pass

    def _next_item(self, stopping: Callable[[], bool] | None = None) -> Taken:
        while True:
            try:
                frame = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if self._exited():
                    frame = self._queue.get() if not self._queue.empty() else None
                elif stopping is not None and stopping():  # a signal first: the run stops as asked
                    raise StopRequested from None
                elif self._stalled():
                    self.failed = True
                    raise SamplerStalledError(self._stalled_message()) from None
                else:
                    continue
            if frame is None:
                self.failed = True
                self._queue.put(None)  # every later take sees it too
                deadline = time.monotonic() + 2.0  # its pipe closed: it is exiting; how it ended
                while not self._exited() and time.monotonic() < deadline:
                    time.sleep(0.02)
                raise SamplerDiedError(
                    f"the sampler process (pid {self.pid}) of rollout.max_staleness={self.max_staleness} "
                    f"died{self._exit_status()}: no batch can come. See its messages above; the run stops here."
                    + _SCRIPT_HINT
                    * _started_by_script()
                )
            kind, payload = frame
            if kind == "error":
                self.failed = True
                self._queue.put(None)
                raise _raised_there(*payload)
            return payload

    def _stalled(self) -> bool:
        """No heartbeat for timeout_s (START_ALLOWANCE_S at least before the first one)."""
        count, now = int(self._board[BEAT]), time.monotonic()
        if count != self._beats[0]:
            self._beats = (count, now)
            return False
        allowed = self.timeout_s if count else max(self.timeout_s, START_ALLOWANCE_S)
        return now - self._beats[1] > allowed

    def _stalled_message(self) -> str:
        state = {"T": " (its state: stopped, as by SIGSTOP)", "t": " (its state: stopped by a debugger)",
                 "D": " (its state: waiting on a disk or a device)"}  # fmt: skip
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            now = state.get(stat[stat.rindex(")") + 2], "")
        except (OSError, ValueError):
            now = ""
        return (
            f"the sampler process (pid {self.pid}) of rollout.max_staleness={self.max_staleness} gave no heartbeat "
            f"for {time.monotonic() - self._beats[1]:.0f} s (rollout.sampler_timeout_s={self.timeout_s:g}){now}: "
            "it is stopped, frozen or hung, so no batch can come; the run stops here (raise "
            "rollout.sampler_timeout_s if its machine can pause it that long)."
        )

    def _exited(self) -> bool:
        return self.process is None or not self.process.is_alive()

    def _exit_status(self) -> str:
        code = None if self.process is None else self.process.exitcode
        if code is None:
            return ""
        if code < 0:
            return f" (killed by {signal.Signals(-code).name})"
        return f" (exit status {code})"

"""Server mode's collective weight transfer (``rollout.vllm.weight_transfer: collective``): the trainer broadcasts
each tensor to the ``grpokit vllm-serve`` process over a two-process torch.distributed group of their own, NCCL
between GPUs, gloo otherwise (the CPU tests run it over loopback), after announcing the names, dtypes and
shapes over HTTP (grpokit.rollout.engines.vllm.remote, grpokit.rollout.engines.vllm.server).

    trainer (rank 1, the source)                         server (rank 0, the TCPStore's host)
    POST /collective/open {port, backend, group}   ->    TCPStore on its host:port, the group's rank 0
    TCPStore(server host, port), the group's rank 1 <->  (both sides form the group; the POST answers then)
    POST /collective/weights [[name, dtype, shape]] ->   receives each tensor in that order, then vLLM's
    broadcast each tensor, in that order             ->  reload_weights with them; the POST answers then

The group is not torch.distributed's default one (a trainer under torchrun has that, and so has vLLM's own
worker in the server): its backend object is built directly on a TCPStore (as vLLM's StatelessProcessGroup is
for TRL's client), so neither side's other groups see it. Each trainer that connects gets a group of its own
under a fresh name (a PrefixStore over the server's one store per port): a resumed run's new trainer replaces the
dead one's group. The tensors travel as raw bytes (a uint8 view), so every dtype goes the same way.
"""

from __future__ import annotations

import socket
import uuid
from datetime import timedelta

import torch
from torch import Tensor

SOURCE, RECEIVER = 1, 0
"""Ranks: the trainer broadcasts (1); the server hosts the store and receives (0)."""
BACKENDS = ("gloo", "nccl")


def route_address(peer: str) -> str:
    """This machine's address on the route to ``peer`` (no packet is sent): what gloo announces to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(peer), 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def new_group_name() -> str:
    return f"grpokit-weights-{uuid.uuid4().hex[:12]}"


def make_group(store, rank: int, backend: str, *, peer: str, timeout_s: float):
    """A two-process group (rank ``rank``) of ``backend`` over ``store``; blocks until the other side joins.
    gloo listens on this machine's address toward ``peer``."""
    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo":
        from torch.distributed import ProcessGroupGloo

        options = ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [ProcessGroupGloo.create_device(hostname=route_address(peer))]
        return ProcessGroupGloo(store, rank, 2, options)
    if backend == "nccl":
        from torch.distributed import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return ProcessGroupNCCL(store, rank, 2, options)
    raise ValueError(f"unknown collective backend {backend!r}; choose one of {BACKENDS}")


def _broadcast(group, tensor: Tensor) -> None:
    from torch.distributed import BroadcastOptions

    opts = BroadcastOptions()
    opts.rootRank, opts.rootTensor = SOURCE, 0
    group.broadcast([tensor], opts).wait()


def describe(weights: list[tuple[str, Tensor]]) -> list[list]:
    """The announcement: [name, dtype ("float32"...), shape] of each tensor, in the order they are sent."""
    return [[name, str(t.dtype).removeprefix("torch."), list(t.shape)] for name, t in weights]


def send(group, weights: list[tuple[str, Tensor]], device: torch.device) -> None:
    """Trainer side: broadcast each tensor (as bytes, on ``device``: CUDA for nccl, CPU for gloo), in order."""
    for _, t in weights:
        if t.numel():  # an empty tensor has no bytes to send (the receiver makes it from the announcement)
            _broadcast(group, t.detach().to(device).contiguous().reshape(-1).view(torch.uint8))


def receive(group, announced: list[list], device: torch.device) -> list[tuple[str, Tensor]]:
    """Server side: the announced tensors, each received into a new tensor on ``device``, in order."""
    out = []
    for name, dtype, shape in announced:
        tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        if tensor.numel():
            _broadcast(group, tensor.reshape(-1).view(torch.uint8))
        out.append((name, tensor))
    return out

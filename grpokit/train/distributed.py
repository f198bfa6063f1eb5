"""Data-parallel training under ``torchrun``: one process per device, ``torch.distributed`` between them.

    torchrun --nproc_per_node=N -m grpokit train cfg.yaml

Without torchrun (WORLD_SIZE unset or 1) ``Distributed()`` is a no-op whose helpers return their input,
so the trainer calls them unconditionally. Under torchrun:

- backend: NCCL when CUDA is available (device ``cuda:LOCAL_RANK``), gloo on CPU.
- each rank samples ``rollout.prompts_per_step / N`` prompts: its contiguous slice of the step's global
  take from the (seeded, identical on every rank) PromptStream, whole groups only, with its own sampling
  seed (``rank_seed``); under dynamic sampling every rank fills its own share and the rounds end when all
  ranks are full (``all_true``), so all ranks run the same number of rounds.
- the loss normaliser (num_sequences, num_tokens) is the global mini-batch's: num_tokens is all-reduced,
  num_sequences is local rows x N. DDP and FSDP *average* gradients over ranks, so each rank's loss is
  multiplied by N before backward: sum_r(N * L_r) / N = sum_r L_r, the single-process loss of the global
  batch. Example, token-mean on 2 ranks: rank 0 holds 30 loss tokens whose losses sum to 6, rank 1 holds
  20 summing to 4; one process: (6 + 4) / 50 = 0.2. Each rank divides by the all-reduced 50: 0.12 and
  0.08, times N = 2: 0.24 and 0.16, averaged by DDP/FSDP: 0.2. Micro-batch counts are equal on all ranks
  (padded: the longest row is all-reduced; packed by optim.micro_batch_tokens: the largest count is, and a
  rank that packed fewer cuts its fullest micro-batches in two), so every rank runs the same collectives.
  Clipping uses the global norm; a non-finite loss still runs its backward so the global norm is NaN on
  every rank and the step is skipped everywhere. optim.offload_reference: the reference moves to the device
  for its pass only (``movable``); under fsdp FSDP2 keeps its shards in CPU memory (CPUOffloadPolicy).
- strategy (train.distributed): ``fsdp`` shards the policy (each decoder layer, then the rest) and the
  reference with FSDP2 ``fully_shard``; ``ddp`` replicates them (DistributedDataParallel). ``auto``: ddp
  with LoRA (the adapter is tiny and the base must be whole for generation anyway), fsdp otherwise.
  The trainer's log-prob function (grpokit.model.logprobs.completion_logprobs) calls the decoder and LM head
  directly, so it runs inside a root module (``PolicyForward``) that FSDP/DDP wrap: their hooks fire.
- generation under fsdp: a full, unsharded copy of the policy is kept for sampling and evaluation; its
  trainable parameters are gathered from the shards once per optimizer step (``generation_model``), so
  decoding runs with no collective at all (ranks may stop at different lengths). Cost: one extra full
  copy of the weights per rank, and one all-gather of the trainable weights per step.
- rank 0 alone writes (``main_only``, ``on_main``); checkpoints are consolidated on rank 0 (full model
  state dict -> ``save_pretrained``; full optimizer state dict) with every rank's RNG state, and can be
  resumed at the same world size only (refused otherwise, naming both sizes).
- what it knows is ranks, sizes and reductions (sum, max, gather, agree, ``reduce`` a dict of numbers as
  told, ``gather_rows`` of a batch, ``my_share``); the owners of the numbers say how they add up over
  ranks: a scored batch (grpokit.rollout.batch: ``ScoredBatch.across_ranks``, ``advantage_abs_mean``),
  the update's sums (``UpdateStats.over_ranks``), the sampling and episode metrics (grpokit.collect.sampler),
  batch-wide advantage estimators (grpokit.train.advantages), a step's costs (grpokit.train.costs).
- refused before joining, with the numbers: prompts_per_step not divisible by N or smaller than N,
  model.device=cuda:K (each rank takes cuda:LOCAL_RANK), float16 loss scaling under fsdp.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from grpokit.config.schema import STRATEGIES  # the names, declared with train.distributed
from grpokit.core.errors import ConfigError

REDUCTIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "mean": lambda values: sum(values) / len(values),
    "max": max,
    "min": min,
}
"""How ``Distributed.reduce`` combines one number's values over ranks, in rank order."""
_SEED_STRIDE = 506_952_113  # rank r samples with seed + r * this (mod 2**31): far apart, rank 0 unchanged


class PolicyForward(nn.Module):
    """A root module whose forward is ``fn(policy, ...)``: FSDP/DDP hook into it. fn: the log-prob function
    of the trainer (default grpokit.model.logprobs.completion_logprobs; SFT's token_logprobs)."""

    def __init__(self, policy: nn.Module, fn: Callable[..., Any] | None = None):
        super().__init__()
        self.policy = policy
        self.fn = fn

    def forward(self, *args, **kwargs):
        from grpokit.model.logprobs import completion_logprobs

        out = (self.fn or completion_logprobs)(self.policy, *args, **kwargs)
        # FSDP2 hooks the backward onto the outputs: give it tensors of their own, not views
        if isinstance(out, torch.Tensor):
            return out.clone() if out._is_view() else out
        return tuple(t.clone() if t is not None and t._is_view() else t for t in out)


class NullLogger:
    """RunLogger's stand-in on ranks other than 0: every call does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> NullLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def resolve_strategy(setting: str, lora: bool) -> str:
    """auto -> ddp with LoRA, fsdp otherwise; fsdp and ddp as given."""
    if setting not in STRATEGIES:
        raise ConfigError(f"train.distributed={setting!r} is not one of {list(STRATEGIES)}")
    if setting == "auto":
        return "ddp" if lora else "fsdp"
    return setting


def check_launch(world: int, prompts_per_step: int, key: str = "rollout.prompts_per_step") -> None:
    """A clear error for a world size the step's prompts (``key``: SFT's sft.batch_size examples) cannot be
    split over (whole groups per rank)."""
    if world > prompts_per_step:
        raise ConfigError(
            f"torchrun started {world} processes but {key}={prompts_per_step}: each rank "
            f"needs at least one prompt (group). Raise {key} to a multiple of {world} or "
            f"start fewer processes (--nproc_per_node)."
        )
    if prompts_per_step % world:
        raise ConfigError(
            f"{key}={prompts_per_step} is not divisible by the world size {world}: each "
            f"rank takes whole groups, the same number each. Use a multiple of {world} (e.g. "
            f"{(prompts_per_step // world + 1) * world}) or another number of processes."
        )


@contextlib.contextmanager
def node_lock(path: Path) -> Iterator[None]:
    """Under torchrun the processes of a node run the block one at a time (an flock on ``path``), so that
    one builds a cached file (the demo's warm start) and the others find it; alone, no lock."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        yield
        return
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Distributed:
    """The trainer's view of the process group; ``Distributed()`` (one process) makes every helper a no-op."""

    def __init__(
        self,
        world: int = 1,
        rank: int = 0,
        device: torch.device | None = None,
        strategy: str = "none",
        *,
        offload_reference: bool = False,
    ):
        self.world, self.rank, self.strategy = world, rank, strategy
        # optim.offload_reference under fsdp: the reference's shards kept in CPU memory by FSDP2 itself
        self.offload_reference = offload_reference
        self.device = device or torch.device("cpu")  # where collectives' tensors live (NCCL: the GPU)
        self._forward: dict[int, nn.Module] = {}  # id(model) -> its FSDP/DDP root (PolicyForward)
        self._gen: nn.Module | None = None  # fsdp: the unsharded copy used for sampling
        self._gen_of: int | None = None  # id() of the policy _gen copies
        self._gen_version: Any = None

    @classmethod
    def from_env(cls, cfg, batch_size: int | None = None) -> Distributed:
        """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT);
        ``Distributed()`` when there is none. NCCL on CUDA (device cuda:LOCAL_RANK), gloo otherwise.
        batch_size: the step's examples split over ranks (SFT's sft.batch_size), else the step's prompts."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if batch_size is None:
            check_launch(world, cfg.rollout.prompts_per_step)
        else:
            check_launch(world, batch_size, "sft.batch_size")
        strategy = resolve_strategy(cfg.train.distributed, cfg.lora.enabled)
        fp16 = cfg.optim.precision == "fp16_mixed" or (
            cfg.optim.precision == "auto" and cfg.model.dtype == "float16"
        )
        if strategy == "fsdp" and fp16:
            raise ConfigError(
                "float16 loss scaling (optim.precision=fp16_mixed, or model.dtype=float16) is not supported "
                "with train.distributed=fsdp: use optim.precision=bf16_mixed or bf16_kahan, or "
                "train.distributed=ddp."
            )
        if strategy == "fsdp" and cfg.model.compile:
            raise ConfigError(
                "model.compile=true under train.distributed=fsdp: the fused norms would be handed FSDP's sharded weights; "
                "use train.distributed=ddp, or model.compile=false."
            )
        if cfg.model.device.startswith("cuda:"):
            raise ConfigError(
                f"model.device={cfg.model.device!r} under torchrun would put every rank on one GPU: each rank "
                "uses cuda:LOCAL_RANK, so set model.device=auto (or cuda); pick GPUs with CUDA_VISIBLE_DEVICES."
            )
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available() and cfg.model.device != "cpu"
        if cuda:
            torch.cuda.set_device(local_rank)  # "cuda" means this rank's GPU from here on
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
            atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        if dist.get_world_size() != world:
            raise ConfigError(f"WORLD_SIZE={world} but the process group has {dist.get_world_size()} ranks")
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        return cls(world, dist.get_rank(), device, strategy, offload_reference=cfg.optim.offload_reference)

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ collectives (no-ops alone)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over ranks (a new tensor on the collective device)."""
        if not self.active:
            return t
        t = t.detach().to(self.device, copy=True)
        dist.all_reduce(t)
        return t

    def max_int(self, value: int) -> int:
        if not self.active:
            return value
        t = torch.tensor([value], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)

    def all_true(self, flag: bool) -> bool:
        if not self.active:
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def agree(self, value: Any) -> Any:
        """The first non-None ``value`` over ranks (e.g. a signal one rank caught), the same on all."""
        if not self.active:
            return value
        return next((v for v in self.gather(value) if v is not None), None)

    def reduce(self, values: dict[str, float], how: dict[str, str]) -> dict[str, float]:
        """Each of ``values`` over ranks as ``how[key]`` says: "sum", "mean", "max" or "min" (plain floats, added in
        rank order, so every rank gets the same numbers). Alone: ``values``. The owner of the numbers
        says how each adds up (e.g. throughput sums, a peak is the largest)."""
        if not self.active:
            return values
        parts = self.gather(values)
        return {key: REDUCTIONS[how[key]]([p[key] for p in parts]) for key in values}

    def gather_rows(self, rows: dict[str, torch.Tensor | list]) -> dict[str, torch.Tensor | list]:
        """Every rank's ``rows`` (each entry n rows: a tensor (n,) or (n, L), or a list) joined in rank order,
        as one process holding the whole batch would have them: tensors on the CPU, (n, L) ones right-padded
        with 0 to the longest L. Alone: ``rows``. ``my_share`` takes this rank's rows back."""
        if not self.active:
            return rows
        parts = self.gather({k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in rows.items()})

        def joined(values: list) -> torch.Tensor | list:
            if not isinstance(values[0], torch.Tensor):
                return [x for v in values for x in v]
            if values[0].dim() == 2:
                width = max(v.shape[1] for v in values)
                values = [torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in values]
            return torch.cat(values)

        return {key: joined([p[key] for p in parts]) for key in rows}

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def on_main(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on rank 0 only; the others wait for it."""
        if self.is_main:
            fn()
        self.barrier()

    def main_only(self, cls: type) -> type:
        """``cls`` on rank 0, NullLogger elsewhere: only rank 0 writes logs and metrics."""
        return cls if self.is_main else NullLogger

    # ------------------------------------------------------------------ splitting the work

    def my_share(self, items: Sequence) -> Sequence:
        """This rank's contiguous slice of ``items`` (a list or a tensor's rows; len divisible by the world size)."""
        n = len(items) // self.world
        return items[self.rank * n : (self.rank + 1) * n]

    def rank_seed(self, seed: int) -> int:
        """This rank's sampling seed: ranks draw independent samples (rank 0 keeps ``seed``)."""
        return (seed + self.rank * _SEED_STRIDE) % 2**31

    # ------------------------------------------------------------------ wrapping the models

    def wrap(self, model: nn.Module, ref_model: nn.Module | None, resume_from=None, forward=None) -> None:
        """Shard (fsdp) or replicate (ddp) the policy and the reference. A checkpoint to resume from is
        loaded into the whole model first (consolidated weights, any strategy). ``forward``: the log-prob
        function the root module runs (default completion_logprobs)."""
        if not self.active:
            return
        if resume_from is not None:
            from grpokit.model.checkpoint import load_weights_into

            load_weights_into(model, resume_from)
        if self.strategy == "fsdp":
            self._gen = copy.deepcopy(model).requires_grad_(False).eval()
            self._gen_of = id(model)
            self._forward[id(model)] = self._fully_shard(model, forward)
            if ref_model is not None:
                offload = self.offload_reference
                self._forward[id(ref_model)] = self._fully_shard(ref_model, forward, offload=offload)
        else:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            # buffers (RoPE's inv_freq) are the same on every rank: no broadcast before each forward
            quiet = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
            sync = {"forward_sync_buffers": False} if quiet else {"broadcast_buffers": False}
            root = PolicyForward(model, forward)
            self._forward[id(model)] = DistributedDataParallel(root, device_ids=ids, **sync)
        self.barrier()  # no rank starts writing before every rank has checked the output folder

    @staticmethod
    def _fully_shard(model: nn.Module, forward=None, offload: bool = False) -> nn.Module:
        """``model`` sharded layer by layer, under a PolicyForward root. ``offload``: the shards kept in CPU
        memory (FSDP2's CPUOffloadPolicy: each layer's shard is copied to the device for its all-gather and
        freed after it), for a frozen reference only (the policy's optimizer would step on the CPU too)."""
        try:
            from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
        except ImportError:  # torch < 2.6
            from torch.distributed._composable.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        from grpokit.model.logprobs import base_model

        policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
        layers = getattr(base_model(model).get_decoder(), "layers", None) or []
        for layer in layers:
            fully_shard(layer, offload_policy=policy)
        # embeddings, final norm, (tied) LM head: the root group
        return fully_shard(PolicyForward(model, forward), offload_policy=policy)

    def logprobs_fn(self, model: nn.Module, fn: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """``fn`` (default completion_logprobs; the one given to wrap) bound to ``model``, through its
        FSDP/DDP root when it has one."""
        wrapped = self._forward.get(id(model))
        if wrapped is not None:
            return wrapped
        from grpokit.model.logprobs import completion_logprobs

        return functools.partial(fn or completion_logprobs, model)

    def resharded(self, model: nn.Module) -> nn.Module:
        """``model`` with its FSDP2 parameters back in their sharded form (each rank's shard registered): after a
        forward the root group (embeddings, final norm, LM head) may hold whole, unsharded parameters until the
        next backward, which a frozen reference never runs. A no-op outside fsdp."""
        root = self._forward.get(id(model))
        if self.strategy == "fsdp" and root is not None:
            for module in root.modules():
                if callable(getattr(module, "reshard", None)):
                    module.reshard()
        return model

    def unsharded(self, model: nn.Module) -> nn.Module:
        """``model`` with whole weights, for a forward of its own outside the FSDP root (a check such as
        grpokit.model.logprobs.check_packed_attention): under fsdp the policy's unsharded copy (``wrap``; its
        trainable weights as of the last ``generation_model``), else ``model`` itself."""
        return self._gen if self._gen is not None and id(model) == self._gen_of else model

    def movable(self, model: nn.Module | None) -> nn.Module | None:
        """``model``, to be moved between the CPU and the device by its owner (optim.offload_reference: alone,
        or under ddp, which leaves the reference unwrapped, each rank holding its own whole copy); None when
        FSDP shards it, as it then keeps the shards in CPU memory itself (``wrap``, CPUOffloadPolicy)."""
        return None if id(model) in self._forward and self.strategy == "fsdp" else model

    @torch.no_grad()
    def generation_model(self, model: nn.Module, version: Any) -> nn.Module:
        """The model to sample from: ``model`` itself, or under fsdp the unsharded copy, its trainable
        weights gathered from the shards when ``version`` (the trainer's step) changed."""
        if self._gen is None:
            return model
        if version != self._gen_version:
            for (name, p), (gen_name, g) in zip(model.named_parameters(), self._gen.named_parameters()):
                if p.requires_grad:  # frozen weights never change: copied once, at wrap()
                    assert name == gen_name, (name, gen_name)
                    g.copy_(p.full_tensor() if hasattr(p, "full_tensor") else p)
            self._gen_version = version
        return self._gen

    # ------------------------------------------------------------------ checkpoints

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """Consolidated weights for ``save_pretrained`` on rank 0 (every rank must call); None alone."""
        if not self.active:
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.strategy == "ddp":
            return {k: v.detach().cpu() for k, v in model.state_dict().items()} if self.is_main else {}
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def optimizer_state(self, model: nn.Module, optimizer) -> dict[str, Any]:
        """The optimizer's state dict: consolidated on rank 0 under torchrun (every rank must call)."""
        if not self.active:
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer, options=options)

    def load_optimizer(self, model: nn.Module, optimizer, state: dict[str, Any]) -> None:
        if not self.active:
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def rng_states(self) -> list[dict[str, Any]] | None:
        """Every rank's RNG state (saved by rank 0), None alone."""
        if not self.active:
            return None
        from grpokit.model.checkpoint import rng_state

        return self.gather(rng_state())

    def my_rng(self, state: dict[str, Any]) -> dict[str, Any]:
        ranks = state.get("rng_ranks")
        return ranks[self.rank] if ranks else state["rng"]

    def check_resume(self, state: dict[str, Any], path) -> None:
        """Refuse a checkpoint written at another world size, naming both."""
        saved = int(state.get("world_size") or 1)
        if saved != self.world:
            raise ConfigError(
                f"--resume: {path} was written by a run of {saved} process(es) and this run has "
                f"{self.world}. Resume with the same number (torchrun --nproc_per_node={saved}, or no "
                "torchrun for 1): each rank's sampling seed and share of the prompts depend on it. To go "
                "on at another size, start a new run from the checkpoint's weights "
                f"(model.name_or_path={path})."
            )

"""How weights are stored, computed with and updated: one ``optim.precision`` mode per run.

bfloat16 has an 8-bit mantissa: a weight w only moves when an update exceeds about |w| * 2^-9. At
GRPO's usual lr of 1e-6 AdamW moves each weight by about 1e-6 per step, so with bf16 weights updated in
place (``bf16_pure``) most updates round away and the run barely learns while its metrics look normal.
The modes below avoid that in two ways:

| mode         | weights | compute          | optimizer                         | bytes/param (w+g+opt) |
|--------------|---------|------------------|-----------------------------------|-----------------------|
| ``fp32``     | fp32    | fp32             | torch AdamW, fp32 states          | 4+4+8  = 16           |
| ``bf16_mixed`` | fp32  | bf16 autocast    | torch AdamW, fp32 states          | 4+4+8  = 16           |
| ``fp16_mixed`` | fp32  | fp16 autocast    | torch AdamW + GradScaler          | 4+4+8  = 16           |
| ``bf16_kahan`` | bf16  | bf16             | optimi AdamW, bf16 states + Kahan | 2+2+6  = 10           |
| ``bf16_pure``  | bf16  | bf16             | torch AdamW, bf16 states          | 2+2+4  = 8  (lossy)   |

``bf16_kahan`` keeps, per weight, the part of each update that rounding dropped in a bf16
compensation buffer and adds it back next step (Kahan summation), so ``weight + compensation`` follows
the float32 trajectory; the forward pass sees the bf16 weight, as it sees the bf16 cast of the
float32 master under autocast. It is the default for bfloat16 (``optim.precision=auto``): the same
correctness as ``bf16_mixed`` measured on the tiny model (tests/unit/model/test_precision.py) at 10 instead of 16
bytes per parameter, and the sampler uses the same bf16 weights the update differentiates.
The optimizer is torch-optimi's AdamW (a maintained package, matches torch.optim.AdamW to 6e-8 in
float32); we do not write our own.

float16 is only trained with float32 master weights and loss scaling (``fp16_mixed``): an overflow
skips the step (counted in ``skipped_updates``) and halves the scale; weights can never become NaN.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from grpokit.config.schema import ConfigError
from grpokit.model.offload import CPU, OffloadedOptimizer


@dataclass(frozen=True)
class Precision:
    name: str
    weight_dtype: torch.dtype  # dtype the trainable weights are stored (and updated) in
    compute_dtype: torch.dtype  # dtype of the matmuls in training forwards
    optimizer: str  # "adamw" (torch) | "adamw_kahan" (torch-optimi)
    bytes_per_param: int  # weights + gradients + optimizer states
    description: str

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """Autocast dtype of the training forwards (None: compute in the weights' own dtype)."""
        return self.compute_dtype if self.compute_dtype != self.weight_dtype else None

    @property
    def loss_scaling(self) -> bool:
        return self.compute_dtype == torch.float16

    def autocast(self, device: torch.device):
        """Context for training and log-prob forwards (a no-op unless weights and compute differ)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast_dtype)


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in [
        Precision("fp32", torch.float32, torch.float32, "adamw", 16, "float32 everything"),
        Precision(
            "bf16_mixed", torch.float32, torch.bfloat16, "adamw", 16,
            "float32 master weights, bfloat16 autocast (TRL's bf16=True)",
        ),
        Precision(
            "fp16_mixed", torch.float32, torch.float16, "adamw", 16,
            "float32 master weights, float16 autocast, dynamic loss scaling",
        ),
        Precision(
            "bf16_kahan", torch.bfloat16, torch.bfloat16, "adamw_kahan", 10,
            "bfloat16 weights, AdamW with Kahan-compensated updates (torch-optimi)",
        ),
        Precision(
            "bf16_pure", torch.bfloat16, torch.bfloat16, "adamw", 8,
            "bfloat16 weights updated in place: small updates round away (explicit choice only)",
        ),
    ]
}
PRECISION_CHOICES = ("auto", *PRECISIONS)
AUTO_FOR_DTYPE = {"float32": "fp32", "bfloat16": "bf16_kahan", "float16": "fp16_mixed"}


def resolve_precision(precision: str, model_dtype: str, device: torch.device) -> Precision:
    """The run's mode from ``optim.precision`` and ``model.dtype`` (auto: bfloat16 on CUDA, else float32).

    An explicit ``model.dtype`` names the compute dtype; an explicit precision that contradicts it is
    refused rather than silently preferring one of the two."""
    if precision not in PRECISION_CHOICES:
        raise ConfigError(f"optim.precision={precision!r} is not one of {list(PRECISION_CHOICES)}")
    if precision == "auto":
        dtype = model_dtype if model_dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
        return PRECISIONS[AUTO_FOR_DTYPE[dtype]]
    chosen = PRECISIONS[precision]
    if model_dtype != "auto":
        wanted = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[model_dtype]
        if wanted != chosen.compute_dtype:
            raise ConfigError(
                f"optim.precision={precision} computes in {str(chosen.compute_dtype)[6:]} but "
                f"model.dtype={model_dtype}; set model.dtype=auto (the precision decides) or pick a "
                f"precision for {model_dtype}, e.g. optim.precision={AUTO_FOR_DTYPE[model_dtype]}"
            )
    return chosen


def make_optimizer(params: list[torch.Tensor], precision: Precision, optim_cfg, device: torch.device):
    """AdamW for ``precision``: torch's (fused on CUDA) or torch-optimi's with Kahan summation; with
    optim.offload_optimizer its states and weight copy in CPU memory (grpokit.model.offload)."""
    if getattr(optim_cfg, "offload_optimizer", False):
        if precision.loss_scaling:
            raise ConfigError(
                f"optim.offload_optimizer=true does not work with optim.precision={precision.name} (float16 loss "
                "scaling unscales gradients on the device); use bf16_kahan or bf16_mixed, or no offload"
            )
        return OffloadedOptimizer(params, lambda cpu_params: _adamw(cpu_params, precision, optim_cfg, CPU))
    return _adamw(params, precision, optim_cfg, device)


def _adamw(params: list[torch.Tensor], precision: Precision, optim_cfg, device: torch.device):
    betas = (optim_cfg.adam_beta1, optim_cfg.adam_beta2)
    if precision.optimizer == "adamw_kahan":
        try:
            import optimi
        except ImportError as e:  # a dependency of grpokit; only a broken install lacks it
            raise ConfigError(
                "optim.precision=bf16_kahan needs torch-optimi: pip install torch-optimi "
                "(or choose optim.precision=bf16_mixed)"
            ) from e
        # torch-optimi's weight decay is lr-coupled (p *= 1 - lr*wd) unless decouple_lr, as torch's.
        return optimi.AdamW(
            params, lr=optim_cfg.lr, betas=betas, weight_decay=optim_cfg.weight_decay, eps=optim_cfg.adam_epsilon,
            kahan_sum=True,
        )
    return torch.optim.AdamW(
        params, lr=optim_cfg.lr, betas=betas, weight_decay=optim_cfg.weight_decay, eps=optim_cfg.adam_epsilon,
        fused=device.type == "cuda",
    )


def master_weights(param: torch.Tensor, optimizer) -> torch.Tensor:
    """The float32 value the optimizer is tracking for ``param``: the weight itself, plus the Kahan
    compensation in ``bf16_kahan`` (what a float32 run would hold, up to bf16 rounding of the buffer)."""
    value = param.detach().float()
    state = optimizer.master_state(param) if isinstance(optimizer, OffloadedOptimizer) else optimizer.state.get(param, {})
    comp = state.get("kahan_comp")
    return value + comp.float().to(value.device) if comp is not None else value


def make_grad_scaler(precision: Precision, device: torch.device):
    """A dynamic loss scaler for float16 compute, else None."""
    if not precision.loss_scaling:
        return None
    return torch.amp.GradScaler(device.type)

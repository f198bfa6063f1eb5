"""PPO's critic: a value model V(s_t) beside the policy, its targets, its clipped value loss and its state.

The critic has the policy's architecture with a scalar head per token (``AutoModelForTokenClassification``,
num_labels=1: Qwen2/Llama/... ``*ForTokenClassification``, a checkpoint any Hugging Face tool loads). It
starts as a copy of the policy's backbone with a ZERO-initialised head (V = 0 everywhere at step 0, so the
first advantages are the whitened returns; the head learns first, then the backbone), or from
``critic.path``. With LoRA it gets its own adapter on its own copy of the base weights (the head is
trained in full, PEFT's modules_to_save).

In one step (grpokit.trainer, ``train_step``):

    values  = V(s_t) of the sampled completions, no gradient           critic_values       (N, Lc)
    A, R    = GAE over r_t = score at EOS - kl_reward_coef * k1_t      algos.ppo.gae_targets (R = A + V)
    policy  : the clipped loss on whitened A (skipped for critic.warmup_steps steps)
    critic  : 0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2), token-mean over each mini-batch, over the
              policy's epochs and mini-batches (the same rows in the same order), its own AdamW (critic.lr)

V(s_t) is read at the position whose hidden state predicts completion token t (the state before t), as
OpenRLHF and TRL do; the value after the last token is 0 (terminal). ``CriticMixin`` holds the trainer's
side; a run without a critic-based estimator has ``trainer.critic = trainer.critic_optimizer = None``.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpokit.algos import AdvantageInputs, kl_estimate
from grpokit.algos.ppo import explained_variance, gae_targets, value_loss
from grpokit.batch import length_sorted
from grpokit.errors import ConfigError, TrainingError
from grpokit.modeling import base_model

CRITIC_DIR = "critic"
"""The critic's Hugging Face folder inside each checkpoint."""


def check_critic_config(cfg) -> None:
    """critic.* settings with an algorithm that trains no critic would be silently ignored: refuse them."""
    from grpokit.algos import PRESETS
    from grpokit.config import CriticConfig

    preset = PRESETS.get(cfg.algo.preset)
    try:
        algo = preset.override(advantage=cfg.algo.advantage) if preset is not None else None
    except ValueError:
        return  # a bad estimator name is reported by its own check
    if algo is None or algo.uses_critic:
        return
    changed = [
        f"critic.{f.name}={getattr(cfg.critic, f.name)!r}"
        for f in dataclasses.fields(CriticConfig)
        if getattr(cfg.critic, f.name) != f.default
    ]
    if changed:
        raise ConfigError(
            f"{', '.join(changed)}: algo.preset={cfg.algo.preset} (advantage {algo.advantage.estimator}) "
            "trains no critic, so these settings would be ignored. Use algo.preset=ppo (or algo.advantage=gae) "
            "to train one, or remove the critic.* settings."
        )


def _head(critic: torch.nn.Module) -> torch.nn.Module:
    """The value head (``score`` in transformers' generic token classifiers, ``classifier`` in others)."""
    for name in ("score", "classifier"):
        head = getattr(critic, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    raise ConfigError(f"{type(critic).__name__} has no 'score' or 'classifier' head: it cannot be a critic")


def _zero_head(critic: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in _head(critic).parameters():
            p.zero_()


def build_critic(policy: torch.nn.Module, cfg, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The critic for ``policy``: from critic.path, or the policy's backbone weights and a zero head;
    dropout off (values at sampling and in the update must agree); LoRA-wrapped when lora.enabled."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    path = cfg.critic.path
    if path:
        if not Path(path).is_dir():
            raise ConfigError(f"critic.path={path!r}: no such folder (give a Hugging Face model folder)")
        try:
            config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
            config.num_labels, config.classifier_dropout = 1, 0.0
            critic, info = AutoModelForTokenClassification.from_pretrained(
                path,
                config=config,
                dtype=dtype,
                trust_remote_code=cfg.model.trust_remote_code,
                output_loading_info=True,
            )
        except (OSError, ValueError, RuntimeError) as e:
            raise ConfigError(f"critic.path={path!r}: cannot load it as a token classifier ({e})") from e
        if any(k.split(".")[0] in ("score", "classifier") for k in info["missing_keys"]):
            _zero_head(critic)  # a causal LM's folder: its backbone, a fresh (zero) value head
    else:
        source = base_model(policy)  # the *ForCausalLM (under PEFT: with the adapter's layers injected)
        config = copy.deepcopy(source.config)
        config.num_labels, config.classifier_dropout, config.architectures = 1, 0.0, None
        try:
            critic = AutoModelForTokenClassification.from_config(
                config, dtype=dtype, trust_remote_code=cfg.model.trust_remote_code
            )
        except ValueError as e:
            raise ConfigError(
                f"{type(source).__name__} has no token-classification form for a critic ({e}); "
                "give one with critic.path"
            ) from e
        # the backbone's weights, minus PEFT's adapter tensors and its base_layer indirection
        state = {
            k.replace(".base_layer.", "."): v
            for k, v in source.base_model.state_dict().items()
            if "lora_" not in k
        }
        critic.base_model.load_state_dict(state)
        _zero_head(critic)
    critic.to(device)
    if cfg.model.gradient_checkpointing:
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora.enabled:
            critic.enable_input_require_grads()
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        critic = get_peft_model(
            critic,
            LoraConfig(
                r=cfg.lora.r,
                lora_alpha=cfg.lora.alpha,
                lora_dropout=cfg.lora.dropout,
                target_modules=list(cfg.lora.target_modules),
                task_type="TOKEN_CLS",  # the value head is trained in full (modules_to_save)
            ),
        )
    return critic


def completion_values(
    critic: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    context_mask: Tensor | None = None,
) -> Tensor:
    """V(s_t) for every completion token t: the head's output at the position that predicts token t.

    prompt_ids/mask (N, Lp) left-padded, completion_ids/mask (N, Lc) right-padded, context_mask as
    completion_logprobs' (multi-turn), with the same position ids. Returns (N, Lc) float32, 0 where
    completion_mask is 0."""
    Lp = prompt_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (N, Lp + Lc)
    attended = completion_mask if context_mask is None else context_mask  # (N, Lc)
    attention_mask = torch.cat([prompt_mask, attended], dim=1).long()  # (N, Lp + Lc)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (N, Lp + Lc)
    out = critic(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).logits  # (N, Lp + Lc, 1)
    values = out[:, Lp - 1 : -1, 0].float()  # (N, Lc): position Lp-1+t holds the state before token t
    return torch.where(completion_mask.bool(), values, 0.0)  # (N, Lc)


class CriticMixin:
    """GRPOTrainer's critic: built with the policy, its values before the update, its own update after the
    policy's, its checkpoint folder and optimizer state. Without a critic-based estimator every hook is a
    no-op and ``critic`` / ``critic_optimizer`` are None."""

    critic: torch.nn.Module | None = None
    critic_optimizer: torch.optim.Optimizer | None = None

    def _setup_critic(self) -> None:
        from grpokit.precision import make_grad_scaler, make_optimizer

        self.critic = self.critic_optimizer = self.critic_scheduler = self.critic_scaler = None
        if not self.algo.uses_critic:
            return
        if self.dist.active:
            raise ConfigError(
                "a critic (algo.preset=ppo / algo.advantage=gae) is not supported under torchrun yet: run it "
                "in one process"
            )
        cfg = self.cfg
        self.critic = build_critic(self.model, cfg, self.precision.weight_dtype, self.device)
        params = [p for p in self.critic.parameters() if p.requires_grad]
        critic_optim = dataclasses.replace(cfg.optim, lr=cfg.critic.lr)
        self.critic_optimizer = make_optimizer(params, self.precision, critic_optim, self.device)
        self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(self.critic_optimizer, self._lr_factor)
        self.critic_scaler = make_grad_scaler(self.precision, self.device)
        if cfg.critic.warmup_steps:
            # the policy's schedule counts every step, warm-up included; PyTorch would warn that its first
            # scheduler steps come before any optimizer step, which is what critic warm-up means
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")

    def policy_trains(self) -> bool:
        """False during the critic's warm-up (critic.warmup_steps): only the critic is updated then."""
        return self.critic is None or self.step >= self.cfg.critic.warmup_steps

    @torch.no_grad()
    def critic_values(self, r) -> Tensor | None:
        """(N, Lc) V(s_t) of the rollout ``r`` under the critic before any update (on the CPU), or None."""
        if self.critic is None:
            return None
        self.critic.eval()
        return self._rows_no_grad(  # (N, Lc)
            r,
            lambda t: completion_values(
                self.critic, t["prompt_ids"], t["prompt_mask"], t["completion_ids"], t["completion_mask"],
                t.get("context_mask"),
            ),
        )

    def critic_returns(self, batch, values: Tensor, old_logprobs, ref_logprobs) -> Tensor:
        """(N, Lc) the critic's targets R = A + V, GAE over the per-token rewards the advantages used."""
        kl_coef = self.algo.kl.reward_coef
        kl = kl_estimate(old_logprobs, ref_logprobs, "k1") if kl_coef > 0 else None  # (N, Lc)
        inputs = AdvantageInputs(
            rewards=batch.rewards,
            group_size=self.cfg.rollout.group_size,
            completion_mask=batch.rollout.completion_mask,
            kl=kl,
            kl_coef=kl_coef,
            values=values,
            gamma=self.algo.gae.gamma,
            lam=self.algo.gae.lam,
        )
        return gae_targets(inputs)[1]

    def critic_update(self, batch, values: Tensor | None, old_logprobs, ref_logprobs) -> dict[str, float]:
        """The critic's clipped value loss over the policy update's epochs and mini-batches (the same rows,
        the same order), one critic optimizer step per mini-batch. Returns critic/* metrics ({} without a
        critic; during warm-up also lr and the kl of the samples, as the policy update would log them)."""
        if self.critic is None:
            return {}
        cfg, r = self.cfg, batch.rollout
        returns = self.critic_returns(batch, values, old_logprobs, ref_logprobs)  # (N, Lc)
        loss_mask = self._loss_mask(r)  # (N, Lc): the tokens the policy's loss trains on
        lengths = r.row_lengths  # (N,)
        sums = {"loss": 0.0, "clipped": 0.0, "tokens": 0.0}
        norms: list[float] = []
        self.critic.train()
        for mb in self._mini_batch_order(r.completion_ids.shape[0]):  # the policy update's rows and order
            part, finite = self._with_micro_retry(
                lambda rows, mb=mb: self._critic_gradients(r, mb, rows, values, returns, loss_mask, lengths),
                lengths[mb],
            )
            norm = self._clip_and_step(
                finite, self.critic, self.critic_optimizer, self.critic_scaler, label="critic update"
            )
            if norm is not None:
                norms.append(norm)
            for k in sums:
                sums[k] += part[k]
        mask = loss_mask.bool()
        metrics = {
            "critic/value_loss": sums["loss"] / (cfg.optim.epochs * cfg.optim.mini_batches),
            "critic/value_clipfrac": sums["clipped"] / max(sums["tokens"], 1.0),
            "critic/values_mean": float(values[mask].mean()) if mask.any() else float("nan"),
            "critic/returns_mean": float(returns[mask].mean()) if mask.any() else float("nan"),
            "critic/explained_variance": float(explained_variance(values, returns, mask)),
            "critic/grad_norm": sum(norms) / len(norms) if norms else float("nan"),
            "critic/lr": self.critic_scheduler.get_last_lr()[0],
            "critic/warmup": float(not self.policy_trains()),
        }
        self.critic_scheduler.step()
        if not self.policy_trains():  # the policy update, which logs these, was skipped
            metrics["lr"] = self.scheduler.get_last_lr()[0]
            if ref_logprobs is not None and old_logprobs is not None:
                kl = kl_estimate(old_logprobs, ref_logprobs, self.algo.kl.kind)  # (N, Lc)
                metrics["kl"] = float(kl[mask].mean()) if mask.any() else 0.0
        return metrics

    def _critic_gradients(self, r, mb, rows, values, returns, loss_mask, lengths) -> tuple[dict, bool]:
        """Accumulate the value-loss gradient of mini-batch ``mb`` over micro-batches of ``rows`` rows; the
        normaliser is the mini-batch's token count, so the split never changes the gradient."""
        self.critic_optimizer.zero_grad(set_to_none=True)  # an out-of-memory retry starts afresh
        d, crit = self.device, self.cfg.critic
        num_tokens = loss_mask[mb].sum().clamp(min=1).to(d)
        part = {"loss": 0.0, "clipped": 0.0, "tokens": 0.0}
        for micro in length_sorted(mb, lengths).split(rows):
            t = self._micro_tensors(r, micro, loss_mask)
            with self.precision.autocast(d):
                v = completion_values(
                    self.critic, t["prompt_ids"], t["prompt_mask"], t["completion_ids"], t["completion_mask"],
                    t.get("context_mask"),
                )  # (n, L)
            width = v.shape[1]
            loss, stats = value_loss(
                v,
                values[micro][:, :width].to(d),
                returns[micro][:, :width].to(d),
                t["loss_mask"],
                crit.cliprange_value,
                num_tokens=num_tokens,
            )
            if not torch.isfinite(loss):
                return part, False
            scaled = loss * crit.value_coef
            (self.critic_scaler.scale(scaled) if self.critic_scaler is not None else scaled).backward()
            part["loss"] += float(loss.detach())
            part["clipped"] += float(stats["vf_clip_frac"]) * float(stats["num_tokens"])
            part["tokens"] += float(stats["num_tokens"])
        return part, True

    # ----------------------------------------------------------------------------- checkpoints

    def critic_folders(self) -> dict[str, torch.nn.Module]:
        """{"critic": the critic} to save as a Hugging Face folder inside each checkpoint, or {}."""
        return {CRITIC_DIR: self.critic} if self.critic is not None else {}

    def critic_state(self) -> dict[str, Any] | None:
        """The critic's optimizer, scheduler and loss-scaler states (trainer_state.pt["critic"]), or None."""
        if self.critic is None:
            return None
        return {
            "optimizer": self.critic_optimizer.state_dict(),
            "scheduler": self.critic_scheduler.state_dict(),
            "scaler": self.critic_scaler.state_dict() if self.critic_scaler is not None else None,
        }

    def resume_critic(self, state: dict[str, Any], checkpoint: Path) -> None:
        """Load the critic's weights (checkpoint/critic) and optimizer state, exactly as saved."""
        if self.critic is None:
            return
        from grpokit.checkpoint import load_weights_into

        folder = Path(checkpoint) / CRITIC_DIR
        if not folder.is_dir() or not state.get("critic"):
            raise TrainingError(
                f"{checkpoint} holds no critic ({CRITIC_DIR}/ and its optimizer state): it was saved by a run "
                "without one. Resume it with its own algorithm, or start a PPO run from its weights "
                "(model.name_or_path) in a new output folder."
            )
        load_weights_into(self.critic, folder)
        self.critic_optimizer.load_state_dict(state["critic"]["optimizer"])
        self.critic_scheduler.load_state_dict(state["critic"]["scheduler"])
        if self.critic_scaler is not None and state["critic"].get("scaler"):
            self.critic_scaler.load_state_dict(state["critic"]["scaler"])

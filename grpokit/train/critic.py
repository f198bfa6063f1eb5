"""PPO's critic: a value model V(s_t) beside the policy, its targets, its clipped value loss and its state.

The critic has the policy's architecture with a scalar head per token (``AutoModelForTokenClassification``,
num_labels=1: Qwen2/Llama/... ``*ForTokenClassification``, a checkpoint any Hugging Face tool loads). It
starts as a copy of the policy's backbone with a ZERO-initialised head (V = 0 everywhere at step 0, so the
first advantages are the whitened returns; the head learns first, then the backbone), or from
``critic.path``. With LoRA it gets its own adapter on its own copy of the base weights (the head is
trained in full, PEFT's modules_to_save).

In one step (grpokit.trainers.grpo, ``train_step``):

    values  = V(s_t) of the sampled completions, no gradient           Critic.values       (N, Lc)
    A, R    = GAE over r_t = score at EOS - kl_reward_coef * k1_t      algos.advantages.gae_targets (R = A + V)
    policy  : the clipped loss on whitened A (skipped for critic.warmup_steps steps)
    critic  : 0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2), token-mean over each mini-batch, over the
              policy's epochs and mini-batches (the same rows in the same order), its own AdamW (critic.lr)

V(s_t) is read at the position whose hidden state predicts completion token t (the state before t), as
OpenRLHF and TRL do; the value after the last token is 0 (terminal). ``Critic`` is the part a trainer
composes (its interface in its docstring); a run without a critic-based estimator has none
(``trainer.critic is None``).
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
from grpokit.algos.advantages import gae_targets
from grpokit.algos.ppo import explained_variance, value_loss
from grpokit.core.errors import ConfigError, TrainingError
from grpokit.model.checkpoint import load_weights_into
from grpokit.model.checks import first_line
from grpokit.model.logprobs import base_model, scoring_states
from grpokit.rollout.batch import length_sorted, step_seed
from grpokit.train.distributed import Distributed
from grpokit.train.learner import Learner
from grpokit.train.minibatch import loss_mask, micro_tensors, mini_batch_order, rows_no_grad

CRITIC_DIR = "critic"
"""The critic's Hugging Face folder inside each checkpoint."""


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
            raise ConfigError(f"critic.path={path!r}: cannot load it as a token classifier ({first_line(e)})") from e
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
    *,
    packed: bool = False,
) -> Tensor:
    """V(s_t) for every completion token t: the head's output at the position that predicts token t.

    prompt_ids/mask (N, Lp) left-padded, completion_ids/mask (N, Lc) right-padded, context_mask as
    completion_logprobs' (multi-turn), with the same position ids; ``packed``: one padding-free forward
    (grpokit.model.logprobs.scoring_states). Returns (N, Lc) float32, 0 where completion_mask is 0."""
    states = scoring_states(
        critic, prompt_ids, prompt_mask, completion_ids, completion_mask, context_mask, packed=packed
    )  # (K, 1): position Lp-1+t holds the state before token t
    values = torch.zeros(completion_mask.shape, dtype=torch.float32, device=states.device)  # (N, Lc)
    return values.masked_scatter(completion_mask.bool(), states[:, 0].float())  # (N, Lc)


class Critic:
    """PPO's critic as a part: its own ``Learner`` (the value model, an AdamW at critic.lr with the policy's
    schedule, its loss scaler; micro-batch sizing shared with the policy's learner) and the value loss.

        critic = Critic.build(policy_learner, cfg, algo, dist)        # only when algo.uses_critic
        values  = critic.values(rollout)                              # (N, Lc) before the update, no grad
        metrics = critic.update(batch, values, old, ref, step=s)      # critic/* metrics
        critic.policy_trains(step)     False during critic.warmup_steps (only the critic learns then)
        critic.folders() / critic.state() / critic.load(state, checkpoint)   # checkpoints
    """

    def __init__(
        self,
        learner: Learner,
        critic_cfg,
        optim,
        *,
        seed: int,
        kl_coef: float,
        gamma: float,
        lam: float,
        group_size: int,
        mask_truncated: bool,
    ):
        self.learner = learner
        self.cfg, self.optim, self.seed = critic_cfg, optim, seed
        self.kl_coef, self.gamma, self.lam = kl_coef, gamma, lam
        self.group_size, self.mask_truncated = group_size, mask_truncated

    @classmethod
    def build(cls, policy: Learner, cfg, algo, dist: Distributed) -> Critic:
        """The critic of ``policy`` (grpokit.train.learner.Learner) for ``cfg``/``algo`` (algo.uses_critic)."""
        if dist.active:
            raise ConfigError(
                "a critic (algo.preset=ppo / algo.advantage=gae) is not supported under torchrun yet: run it "
                "in one process"
            )
        model = build_critic(policy.model, cfg, policy.precision.weight_dtype, policy.device)
        learner = Learner(
            model,
            policy.precision,
            policy.device,
            dataclasses.replace(cfg.optim, lr=cfg.critic.lr),
            dist,
            total_steps=cfg.train.steps,
            micro=policy.micro,  # one micro-batch size (and OOM cap) for both models
            say=policy.say,
        )
        if cfg.critic.warmup_steps:
            # the policy's schedule counts every step, warm-up included; PyTorch would warn that its first
            # scheduler steps come before any optimizer step, which is what critic warm-up means
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
        return cls(
            learner,
            cfg.critic,
            cfg.optim,
            seed=cfg.train.seed,
            kl_coef=algo.kl.reward_coef,
            gamma=algo.gae.gamma,
            lam=algo.gae.lam,
            group_size=cfg.rollout.group_size,
            mask_truncated=algo.batch.mask_truncated,
        )

    @property
    def model(self) -> torch.nn.Module:
        return self.learner.model

    def policy_trains(self, step: int) -> bool:
        """False during the critic's warm-up (critic.warmup_steps): only the critic is updated then."""
        return step >= self.cfg.warmup_steps

    @torch.no_grad()
    def values(self, r) -> Tensor:
        """(N, Lc) V(s_t) of the rollout ``r`` under the critic before any update (on the CPU)."""
        self.model.eval()
        return rows_no_grad(  # (N, Lc)
            self.learner,
            r,
            lambda t: completion_values(
                self.model,
                t["prompt_ids"],
                t["prompt_mask"],
                t["completion_ids"],
                t["completion_mask"],
                t.get("context_mask"),
                packed=self.learner.micro.packed,
            ),
        )

    def returns(self, batch, values: Tensor, old_logprobs, ref_logprobs) -> Tensor:
        """(N, Lc) the critic's targets R = A + V, GAE over the per-token rewards the advantages used."""
        kl = kl_estimate(old_logprobs, ref_logprobs, "k1") if self.kl_coef > 0 else None  # (N, Lc)
        inputs = AdvantageInputs(
            rewards=batch.rewards,
            group_size=self.group_size,
            completion_mask=batch.rollout.completion_mask,
            kl=kl,
            kl_coef=self.kl_coef,
            values=values,
            gamma=self.gamma,
            lam=self.lam,
        )
        return gae_targets(inputs)[1]

    def update(self, batch, values: Tensor, old_logprobs, ref_logprobs, *, step: int) -> dict[str, float]:
        """The critic's clipped value loss over the policy update's epochs and mini-batches (the same rows,
        the same order), one critic optimizer step per mini-batch. Returns critic/* metrics."""
        r, learner = batch.rollout, self.learner
        returns = self.returns(batch, values, old_logprobs, ref_logprobs)  # (N, Lc)
        mask = loss_mask(r, self.mask_truncated)  # (N, Lc): the tokens the policy's loss trains on
        lengths = r.row_lengths  # (N,)
        sums = {"loss": 0.0, "clipped": 0.0, "tokens": 0.0}
        norms: list[float] = []
        self.model.train()
        order = mini_batch_order(r.completion_ids.shape[0], self.optim, step_seed(self.seed, step, 0))
        for mb in order:  # the policy update's rows and order
            part, finite = learner.run_micro(
                lambda rows, mb=mb: self._gradients(r, mb, rows, values, returns, mask, lengths),
                lengths[mb],
            )
            norm = learner.clip_and_step(finite, step, label="critic update")
            if norm is not None:
                norms.append(norm)
            for k in sums:
                sums[k] += part[k]
        trained = mask.bool()
        metrics = {
            "critic/value_loss": sums["loss"] / (self.optim.epochs * self.optim.mini_batches),
            "critic/value_clipfrac": sums["clipped"] / max(sums["tokens"], 1.0),
            "critic/values_mean": float(values[trained].mean()) if trained.any() else float("nan"),
            "critic/returns_mean": float(returns[trained].mean()) if trained.any() else float("nan"),
            "critic/explained_variance": float(explained_variance(values, returns, trained)),
            "critic/grad_norm": sum(norms) / len(norms) if norms else float("nan"),
            "critic/lr": learner.scheduler.get_last_lr()[0],
            "critic/warmup": float(not self.policy_trains(step)),
        }
        learner.scheduler.step()
        return metrics

    def _gradients(self, r, mb, rows, values, returns, mask, lengths) -> tuple[dict, bool]:
        """Accumulate the value-loss gradient of mini-batch ``mb`` over micro-batches of ``rows`` rows (packed:
        of at most ``rows`` tokens, learner.micro); the normaliser is the mini-batch's token count, so the
        split never changes the gradient."""
        learner = self.learner
        learner.optimizer.zero_grad(set_to_none=True)  # an out-of-memory retry starts afresh
        d = learner.device
        num_tokens = mask[mb].sum().clamp(min=1).to(d)
        part = {"loss": 0.0, "clipped": 0.0, "tokens": 0.0}
        for micro in learner.micro.split(length_sorted(mb, lengths), lengths, rows):
            t = micro_tensors(r, micro, mask, d)
            with learner.precision.autocast(d), learner.activations_offloaded():
                v = completion_values(
                    self.model,
                    t["prompt_ids"],
                    t["prompt_mask"],
                    t["completion_ids"],
                    t["completion_mask"],
                    t.get("context_mask"),
                    packed=learner.micro.packed,
                )  # (n, L)
            width = v.shape[1]
            loss, stats = value_loss(
                v,
                values[micro][:, :width].to(d),
                returns[micro][:, :width].to(d),
                t["loss_mask"],
                self.cfg.cliprange_value,
                num_tokens=num_tokens,
            )
            if not torch.isfinite(loss):
                return part, False
            learner.backward(loss * self.cfg.value_coef)
            part["loss"] += float(loss.detach())
            part["clipped"] += float(stats["vf_clip_frac"]) * float(stats["num_tokens"])
            part["tokens"] += float(stats["num_tokens"])
        return part, True

    # ----------------------------------------------------------------------------- checkpoints

    def folders(self) -> dict[str, torch.nn.Module]:
        """{"critic": the critic}, saved as a Hugging Face folder inside each checkpoint."""
        return {CRITIC_DIR: self.model}

    def state(self) -> dict[str, Any]:
        """The critic's optimizer, scheduler and loss-scaler states (trainer_state.pt["critic"])."""
        learner = self.learner
        return {
            "optimizer": learner.optimizer.state_dict(),
            "scheduler": learner.scheduler.state_dict(),
            "scaler": learner.scaler.state_dict() if learner.scaler is not None else None,
        }

    def load(self, state: dict[str, Any], checkpoint: Path) -> None:
        """Load the critic's weights (checkpoint/critic) and optimizer state, exactly as saved."""
        folder = Path(checkpoint) / CRITIC_DIR
        if not folder.is_dir() or not state.get("critic"):
            raise TrainingError(
                f"{checkpoint} holds no critic ({CRITIC_DIR}/ and its optimizer state): it was saved by a run "
                "without one. Resume it with its own algorithm, or start a PPO run from its weights "
                "(model.name_or_path) in a new output folder."
            )
        load_weights_into(self.model, folder)
        learner, saved = self.learner, state["critic"]
        learner.optimizer.load_state_dict(saved["optimizer"])
        learner.scheduler.load_state_dict(saved["scheduler"])
        if learner.scaler is not None and saved.get("scaler"):
            learner.scaler.load_state_dict(saved["scaler"])

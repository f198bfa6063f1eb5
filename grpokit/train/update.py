"""The policy-gradient update of a sampled batch: mu passes, each split into mini-batches (one optimizer step
each), each split into micro-batches whose gradients accumulate. The loss normaliser is the whole
mini-batch's (num_sequences / num_tokens), so the split never changes the objective.

``PolicyUpdate`` owns no state of its own beyond its settings: it steps a ``Learner`` (grpokit.train.learner) with
the preset's loss (grpokit.algos), and reads the frozen reference (a KL) when there is one.

    updater = PolicyUpdate(learner, algo, cfg.optim, temperature=cfg.rollout.temperature, seed=cfg.train.seed,
                           dist=dist, ref_model=ref_model)
    old, ref, seconds = updater.rollout_logprobs(rollout)                # (N, Lc) each, or None
    metrics, _ = updater.update(rollout, advantages, old, ref, step=s)   # advantages (N,) or (N, Lc)
    metrics = updater.waiting_metrics(rollout, old, ref)                 # PPO's critic warm-up: no update

The mini-batch helpers it shares with PPO's critic and the log-prob passes are grpokit.train.minibatch's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from grpokit.algos import AlgoSettings, get_loss, gradient_free_rows, kl_estimate
from grpokit.algos.entropy_bonus import EntropyControl
from grpokit.algos.masks import covariance_selection, high_entropy_mask, token_covariance
from grpokit.config.schema import OptimConfig
from grpokit.model.offload import CPU, on_device
from grpokit.rollout.batch import length_sorted, step_seed
from grpokit.rollout.generation import Rollout
from grpokit.rollout.record import TokenRecorder
from grpokit.train.distributed import Distributed
from grpokit.train.learner import Learner
from grpokit.train.minibatch import (
    eval_logprobs,
    loss_mask,
    micro_tensors,
    mini_batch_order,
    several_passes,
)
from grpokit.train.mismatch import MismatchCorrection
from grpokit.train.reference import mix_toward
from grpokit.train.update_stats import UpdateStats


@dataclasses.dataclass
class UpdatePlan:
    """One rollout's update in the making (PolicyUpdate.prepare), passed to forward_backward and optimizer_step
    for each mini-batch: the inputs of every mini-batch's loss and what the steps add up."""

    rollout: Rollout
    advantages: torch.Tensor  # (N,) or (N, Lc)
    mask: torch.Tensor  # (N, Lc) the tokens the loss trains on (loss_mask)
    old_logprobs: torch.Tensor | None  # (N, Lc) the ratio's denominator; None: the current log-probs, detached
    ref_logprobs: torch.Tensor | None  # (N, Lc) the reference's, for a KL
    entropy: torch.Tensor | None  # (N, Lc) the policy's before the update (algo.top_entropy_quantile)
    mini_batches: list[torch.Tensor]  # (M,) row indices each, in the order they step
    step: int  # the run's step: seeds the order and the masks' draws
    record: TokenRecorder | None  # the per-token numbers of a saved step
    ref_seconds: float  # spent on the reference's pass in prepare
    stats: UpdateStats = dataclasses.field(default_factory=UpdateStats)
    finite: bool = True  # the last mini-batch's gradient was finite
    coefs: list[float] = dataclasses.field(default_factory=list)  # the entropy bonus's alpha per optimizer step
    measured: torch.Tensor | None = None  # the last mini-batch's sum of H and tokens (the entropy bonus)
    bonus_sums: torch.Tensor = dataclasses.field(default_factory=lambda: torch.zeros(2, dtype=torch.float64))
    idle: torch.Tensor | None = None  # (N,) bool: rows left out of the passes, their gradient 0 (optim.skip_flat_rows)
    idle_rows: int = 0  # rows left out, summed over the mini-batches run
    rows_seen: int = 0  # rows of the mini-batches run


class PolicyUpdate:
    """The clipped policy-gradient update (see the module docstring); ``learner`` holds the policy."""

    def __init__(
        self,
        learner: Learner,
        algo: AlgoSettings,
        optim: OptimConfig,
        *,
        temperature: float,
        seed: int,
        dist: Distributed | None = None,
        ref_model: torch.nn.Module | None = None,
        correction: MismatchCorrection | None = None,
        behaviour_ratio: bool = False,
    ):
        self.learner, self.algo, self.optim = learner, algo, optim
        self.loss_options = algo.loss_options()  # built once (the entropy bonus's alpha: per step)
        self.correction = correction  # rollout.mismatch_correction: importance weights pi_old / pi_sampler
        # rollout.async_ratio=behaviour: the ratio's denominator is the sampler's log-probs (stale samples' own)
        self.behaviour_ratio = behaviour_ratio
        self.temperature, self.seed = temperature, seed
        self.dist = dist or Distributed()
        self.ref_model = ref_model  # None with LoRA too: the reference is then the adapter-less base
        self.uses_reference = algo.uses_reference
        # algo.entropy_coef / adaptive_entropy: the bonus's coefficient, moved after each optimizer step (checkpointed)
        self.entropy_control = EntropyControl(algo.entropy.coef)
        # optim.offload_reference: the reference waits in CPU memory, on the device for its pass only
        # (under fsdp FSDP2 keeps its shards in CPU memory itself: Distributed.movable is then None)
        self.offload_reference = optim.offload_reference and ref_model is not None
        if self.offload_reference and self.dist.movable(ref_model) is not None:
            ref_model.to(CPU)

    def sync_reference(self, step: int) -> bool:
        """algo.ref_sync_every = n > 0: after the step that makes ``step`` steps done, when n divides it, the
        reference moves toward the policy, pi_ref <- alpha pi_theta + (1 - alpha) pi_ref (alpha algo.ref_sync_alpha;
        TRL's sync_ref_model at optimizer steps that ref_model_sync_steps divides). True when it moved."""
        every = self.algo.kl.ref_sync_every
        if not every or self.ref_model is None or step % every:
            return False
        reference, policy = self.dist.resharded(self.ref_model), self.dist.resharded(self.learner.model)
        mix_toward(reference, policy, self.algo.kl.ref_sync_alpha)  # under fsdp: shard by shard
        return True

    def rollout_logprobs(
        self, r: Rollout, ref_logprobs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
        """(old_logprobs, ref_logprobs, seconds spent on the reference here), each (N, Lc) or None.

        old: the policy's own log-probs before any update, needed by more than one pass (the ratio's
        denominator) or by a KL in the reward (its k1 = old - ref). ref: whenever there is a reference,
        so the KL is logged even when only the reward uses it; ``ref_logprobs`` when the batch came with them
        (an asynchronous run's sampler process computed them, grpokit.train.reference): no pass here then."""
        # old log-probs before the update: several passes, a KL in the reward, a teacher's dense advantage
        needs_old = several_passes(self.optim) or self.algo.kl.reward_coef > 0 or self.algo.uses_teacher
        t = time.perf_counter()
        if not self.uses_reference:
            ref_logprobs = None
        elif ref_logprobs is None:
            ref_logprobs = self.logprobs_no_grad(self.ref_model, r, reference=True)
        ref_seconds = time.perf_counter() - t
        old_logprobs = self.logprobs_no_grad(self.learner.model, r) if needs_old else None
        return old_logprobs, ref_logprobs, ref_seconds

    def logprobs_no_grad(self, model, r: Rollout, reference: bool = False, entropy: bool = False) -> torch.Tensor:
        """(N, Lc) log-probs of the batch's completions under ``model`` (the reference when asked:
        with LoRA that is the base model with the adapter disabled); with ``entropy`` their entropies instead."""
        policy = self.learner.model
        if reference and model is None:
            ctx = policy.disable_adapter()
            model = policy
        else:
            ctx = contextlib.nullcontext()
        was_training = policy.training
        logprobs_fn = self.dist.logprobs_fn(model)  # torchrun: through FSDP/DDP's root module
        offload = reference and self.offload_reference
        with ctx, on_device(self.dist.movable(model), self.learner.device, offload):
            out = eval_logprobs(
                model, r, self.learner, logprobs_fn, temperature=self.temperature,
                chunk_size=self.optim.logprob_chunk_size, entropy=entropy,
            )  # fmt: skip
        policy.train(was_training)
        return out

    def update(
        self,
        r: Rollout,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        *,
        step: int = 0,
        record: TokenRecorder | None = None,
    ) -> tuple[dict[str, float], float]:
        """mu passes over the rollout ``r``, one optimizer step per mini-batch. advantages: (N,) or (N, Lc).
        old/ref log-probs as from ``rollout_logprobs`` (computed here when both are None). ``step``: the
        run's step (seeds the mini-batch order). ``record``: a rollout_record.TokenRecorder to fill with the
        per-token numbers the loss used. Returns the metrics (the global batch's under torchrun) and the
        seconds spent on the reference here.

        The same as the three public pieces a loop of one's own calls (docs/guides/own-loop.md):

            plan = updater.prepare(r, advantages, old, ref, step=step)
            for k in range(len(plan.mini_batches)):
                updater.forward_backward(plan, k)   # the gradient of mini-batch k, over its micro-batches
                updater.optimizer_step(plan, k)     # clip, step the optimizer, move the entropy coefficient
            metrics = updater.finish(plan)
        """
        plan = self.prepare(r, advantages, old_logprobs, ref_logprobs, step=step, record=record)
        for k in range(len(plan.mini_batches)):
            self.forward_backward(plan, k)
            self.optimizer_step(plan, k)
        return self.finish(plan), plan.ref_seconds

    def prepare(
        self,
        r: Rollout,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        *,
        step: int = 0,
        record: TokenRecorder | None = None,
    ) -> UpdatePlan:
        """What the update of rollout ``r`` needs before its first gradient: the loss mask, the ratio's denominator,
        the entropies that choose tokens (algo.top_entropy_quantile) and the mini-batches' rows (``update``)."""
        mask = loss_mask(r, self.algo.batch.mask_truncated)  # (N, Lc)
        ref_seconds = 0.0
        if old_logprobs is None and ref_logprobs is None:
            old_logprobs, ref_logprobs, ref_seconds = self.rollout_logprobs(r)
        if not several_passes(self.optim):
            old_logprobs = None  # one pass: the ratio's denominator is logprobs.detach(), ratio exactly 1
        if self.behaviour_ratio:  # the clip / trust region measured from the policy that sampled (TRL, prime-rl)
            old_logprobs = r.logprobs  # (N, Lc)
        # algo.top_entropy_quantile: the policy's entropies before the update choose the tokens to train
        top_entropy = self.algo.masks.top_entropy_quantile < 1
        entropy = self.logprobs_no_grad(self.learner.model, r, entropy=True) if top_entropy else None  # (N, Lc)
        self.learner.model.train()
        order = mini_batch_order(r.completion_ids.shape[0], self.optim, step_seed(self.seed, step, 0))
        plan = UpdatePlan(
            r, advantages, mask, old_logprobs, ref_logprobs, entropy, list(order), step, record, ref_seconds
        )
        plan.idle = self.idle_rows(advantages, record)
        return plan

    def idle_rows(self, advantages: torch.Tensor, record: TokenRecorder | None) -> torch.Tensor | None:
        """(N,) bool on the CPU: the rows the update leaves out because the loss gives them no gradient
        (grpokit.algos.gradient_free_rows: advantage 0 and no term without it), or None when every row runs:
        optim.skip_flat_rows off, a loss of one's own, the entropy bonus, torchrun (every rank must run the same
        collectives), or a step whose per-token numbers are saved (``record``: the explorer shows every row)."""
        if not self.optim.skip_flat_rows or record is not None or self.dist.active or self.algo.entropy.on:
            return None
        if get_loss(self.algo.loss.name) is not get_loss("clipped"):
            return None
        idle = gradient_free_rows(advantages.detach(), self.loss_options)  # (N,) or None
        return None if idle is None or not bool(idle.any()) else idle.cpu()

    def forward_backward(self, plan: UpdatePlan, k: int) -> None:
        """Accumulate the gradient of the plan's mini-batch ``k`` over its micro-batches (the learner's size,
        retried smaller after an out-of-memory error): the parameters' .grad, the plan's statistics."""
        r, mb, bonus = plan.rollout, plan.mini_batches[k], self.algo.entropy
        run = mb if plan.idle is None else mb[~plan.idle[mb]]  # (n,) the rows whose gradient is not 0
        if len(run) == 0:  # every row flat: the shortest runs, so the step has its metrics (and a gradient of 0)
            run = mb[r.row_lengths[mb].argmin()].reshape(1)
        plan.idle_rows += len(mb) - len(run)
        plan.rows_seen += len(mb)
        chosen = self.chosen_tokens(
            r, mb, plan.mask, plan.advantages, plan.entropy, step_seed(self.seed, plan.step, 1000 + k)
        )
        if bonus.on:  # the coefficient of this optimizer step; the bonus's entropy is filled in by the micro-batches
            chosen["entropy_coef"] = self.entropy_control.applied(bonus.adaptive, bonus.target)
            plan.coefs.append(chosen["entropy_coef"])
        measured = plan.measured = torch.zeros(2, dtype=torch.float64)  # this mini-batch's sum of H, tokens
        part, plan.finite = self.learner.run_micro(
            lambda rows: self._mini_batch_gradients(
                r, mb, rows, plan.advantages, plan.mask, r.row_lengths, plan.old_logprobs, plan.ref_logprobs,
                k == 0, plan.record, chosen, measured, run=run,
            ),
            r.row_lengths[run],
        )  # fmt: skip
        plan.stats.merge(part)

    def optimizer_step(self, plan: UpdatePlan, k: int) -> None:
        """The optimizer step after ``forward_backward(plan, k)``: clip the gradient and step (a non-finite one
        is skipped, Learner.clip_and_step); with an adaptive entropy bonus, move its coefficient (Skywork-OR1)."""
        plan.stats.add_step(self.learner.clip_and_step(plan.finite, plan.step))
        bonus = self.algo.entropy
        if bonus.on:
            measured = self.dist.sum(plan.measured).cpu()  # torchrun: the whole mini-batch's
            plan.bonus_sums += measured
            if bonus.adaptive:  # c moves by delta after each optimizer step
                e = float(measured[0] / measured[1]) if measured[1] > 0 else float("nan")
                self.entropy_control.observe(
                    e, target=bonus.target, delta=bonus.coef_delta, coef_min=bonus.coef_min, coef_max=bonus.coef_max
                )

    def finish(self, plan: UpdatePlan) -> dict[str, float]:
        """The update's metrics (the global batch's under torchrun), once every mini-batch has stepped."""
        stats = plan.stats
        stats.over_ranks(self.dist)  # torchrun: the global batch's sums
        metrics = stats.metrics(n_updates=self.optim.epochs * self.optim.mini_batches)
        metrics.update(self.learner.metrics())  # lr, loss_scale, micro_batch_size
        metrics["cov/logp_adv"] = self.logp_adv_covariance(plan.rollout, plan.mask, plan.advantages)
        if plan.idle is not None:  # optim.skip_flat_rows left rows out: the per-token metrics are the rest's
            metrics["update/skipped_rows"] = plan.idle_rows / max(plan.rows_seen, 1)
        if self.algo.entropy.on:
            sums = plan.bonus_sums
            metrics["entropy_coef"] = sum(plan.coefs) / len(plan.coefs)  # the alpha applied, averaged over steps
            metrics["entropy/bonus"] = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
        return metrics

    def chosen_tokens(self, r, mb, mask, advantages, entropy, seed: int) -> dict[str, torch.Tensor]:
        """The tokens of mini-batch ``mb`` (M,) that the masks choose over the whole mini-batch (so the split into
        micro-batches cannot change them), each (N, Lc) bool, False outside ``mb``: "entropy_mask" for
        algo.top_entropy_quantile, from ``entropy`` (N, Lc), the policy's before the update; "cov_mask" for
        algo.cov_penalty (KL-Cov / Clip-Cov), from the sampler's log-probs and the advantages (Clip-Cov's random
        draw seeded with ``seed``). Keyword arguments of the loss."""
        masks, out = self.algo.masks, {}
        m = mask[mb].bool()  # (M, Lc)
        if entropy is not None:
            out["entropy_mask"] = torch.zeros_like(mask, dtype=torch.bool)
            out["entropy_mask"][mb] = high_entropy_mask(entropy[mb], m, masks.top_entropy_quantile)
        if masks.cov_penalty != "none":
            logp = r.logprobs[mb]  # (M, Lc) the sampler's: the policy before the update, no extra pass
            scored = m & ~torch.isnan(logp)  # (M, Lc)
            cov = token_covariance(torch.nan_to_num(logp), self._token_advantages(advantages, mb, m), scored)
            picked = covariance_selection(
                masks.cov_penalty,
                cov,
                scored,
                masks.cov_ratio,
                bounds=(masks.clip_cov_lb, masks.clip_cov_ub),
                generator=torch.Generator().manual_seed(seed),
            )  # (M, Lc)
            out["cov_mask"] = torch.zeros_like(mask, dtype=torch.bool)
            out["cov_mask"][mb] = picked
        return out

    @staticmethod
    def _token_advantages(advantages: torch.Tensor, rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """advantages of ``rows`` on the CPU, per token (n, Lc) like ``like``."""
        adv = advantages[rows.to(advantages.device)].detach().float().cpu()  # (n,) or (n, Lc)
        return adv[:, None].expand(like.shape) if adv.dim() == 1 else adv  # (n, Lc)

    def logp_adv_covariance(self, r: Rollout, mask: torch.Tensor, advantages: torch.Tensor) -> float:
        """The covariance of the sampled tokens' log-probs (the sampler's) and their advantages over the loss tokens:
        the entropy falls when it is positive (arXiv 2505.22617, eq. 6). NaN without loss tokens."""
        m = mask.bool() & ~torch.isnan(r.logprobs)  # (N, Lc)
        if not m.any():
            return float("nan")
        every = torch.arange(mask.shape[0])
        cov = token_covariance(torch.nan_to_num(r.logprobs), self._token_advantages(advantages, every, m), m)
        return float(cov.sum() / m.sum())

    def waiting_metrics(
        self, r: Rollout, old_logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None
    ) -> dict[str, float]:
        """What the update logs on a step it does not take (PPO's critic warm-up): lr, and with a reference
        the KL of the samples to it over the tokens the loss would train on."""
        metrics = {"lr": self.learner.scheduler.get_last_lr()[0]}
        if ref_logprobs is not None and old_logprobs is not None:
            mask = loss_mask(r, self.algo.batch.mask_truncated).bool()  # (N, Lc)
            kl = kl_estimate(old_logprobs, ref_logprobs, self.algo.kl.kind)  # (N, Lc)
            metrics["kl"] = float(kl[mask].mean()) if mask.any() else 0.0
        return metrics

    def entropy_state(self) -> dict[str, float]:
        """The entropy bonus's coefficient and last measured entropy (trainer_state.pt["entropy_control"])."""
        return self.entropy_control.state()

    def load_entropy_state(self, state: dict[str, float] | None) -> None:
        """Resume the coefficient; a checkpoint without one (written before the bonus existed) starts it afresh."""
        if state is not None:
            self.entropy_control = EntropyControl.from_state(state)

    def _mini_batch_gradients(
        self,
        r,
        mb,
        rows,
        advantages,
        mask,
        lengths,
        old_logprobs,
        ref_logprobs,
        first,
        record=None,
        chosen=None,
        measured=None,
        run=None,
    ) -> tuple[UpdateStats, bool]:
        """Accumulate the gradient of mini-batch ``mb`` (M,) over micro-batches of ``rows`` rows (packed: of at
        most ``rows`` tokens), sorted by length: of its rows ``run`` (default all; PolicyUpdate.idle_rows leaves
        out those whose gradient is 0), the loss normalised over the whole of ``mb``. Returns its UpdateStats
        (loss metrics; sampler-vs-trainer log-prob differences and entropy on the first mini-batch) and whether
        every loss was finite (a NaN/inf loss stops the accumulation).
        Nothing outside changes but the parameters' .grad, and ``record`` (a rollout_record.TokenRecorder, at
        the steps whose rollouts are saved), which gets each micro-batch's per-token numbers as the loss saw them."""
        algo, learner, dist = self.algo, self.learner, self.dist
        device = learner.device
        loss_fn = get_loss(algo.loss.name)
        # the whole mini-batch's normaliser, over every rank under torchrun (grpokit.train.distributed)
        num_tokens = dist.sum(mask[mb].sum()).clamp(min=1).to(device)
        chosen = chosen or {}  # (N, Lc) each: the tokens the masks chose over the whole mini-batch (chosen_tokens)
        keep = chosen.get("entropy_mask")  # (N, Lc) or None: algo.top_entropy_quantile's
        masks = {key: t for key, t in chosen.items() if key in ("entropy_mask", "cov_mask")}
        options = self.loss_options
        bonus = {}  # the entropy bonus's keywords of the loss (algo.entropy_coef / adaptive_entropy)
        if "entropy_coef" in chosen:
            trained = mask[mb].bool() if keep is None else mask[mb].bool() & keep[mb]  # (M, Lc) its tokens
            options = options.replace(entropy_coef=chosen["entropy_coef"])  # this optimizer step's alpha
            bonus = {"entropy_tokens": dist.sum(trained.sum()).clamp(min=1).to(device)}
            measured.zero_()  # a retry after an out-of-memory error starts the sums again
        # a loss of one's own (algo.loss) also gets every setting as a keyword, as before LossOptions existed: one
        # that declares eps_low=0.2 (say) would otherwise keep that default silently; the built-in reads options
        settings = {} if loss_fn is get_loss("clipped") else dataclasses.asdict(options)
        stats = UpdateStats()
        run = mb if run is None else run  # (n,) the rows passed through the model
        for micro in learner.micro.split(length_sorted(run, lengths), lengths, rows):
            tensors = micro_tensors(r, micro, mask, device)
            with learner.precision.autocast(device), learner.activations_offloaded():
                logprobs, entropy = dist.logprobs_fn(learner.model)(
                    tensors["prompt_ids"],
                    tensors["prompt_mask"],
                    tensors["completion_ids"],
                    tensors["completion_mask"],
                    temperature=self.temperature,
                    chunk_size=self.optim.logprob_chunk_size,
                    with_entropy=first or record is not None,
                    context_mask=tensors.get("context_mask"),
                    packed=learner.micro.packed,
                    **({"entropy_grad": True} if bonus else {}),  # off: the call (and memory) of before
                    **({"shared_prefix": True} if learner.shared_prefix else {}),
                    **({"fused": True} if learner.fused_logprobs else {}),
                )  # (n, L), float32
            micro_mask = tensors["loss_mask"]
            width = logprobs.shape[1]
            old = old_logprobs[micro][:, :width].to(device) if old_logprobs is not None else logprobs.detach()
            ref = ref_logprobs[micro][:, :width].to(device) if ref_logprobs is not None else None
            adv = advantages[micro.to(device)]  # (n,) or (n, Lc)
            adv = adv[:, :width] if adv.dim() == 2 else adv  # (n,) or (n, L)
            if self.correction is not None:  # the sampler/trainer mismatch: A * pi_old / pi_sampler per token
                sampled = tensors["sample_logprobs"][:, :width]  # (n, L)
                w, unbounded = self.correction.weights(old, sampled, micro_mask)  # (n, L) each
                adv = (adv[:, None] if adv.dim() == 1 else adv) * w  # (n, L)
                stats.add_is_weights(w, unbounded, micro_mask)
            loss, loss_stats = loss_fn(
                logprobs,
                old,
                adv,
                micro_mask,
                options=options,
                **settings,
                ref_logprobs=ref,
                num_sequences=len(mb) * dist.world,
                num_tokens=num_tokens,
                sample_logprobs=tensors["sample_logprobs"][:, :width],  # the sampler's (off-policy mask)
                **{key: t[micro][:, :width].to(device) for key, t in masks.items()},
                **(bonus | {"entropy": entropy} if bonus else {}),
            )
            if not torch.isfinite(loss) and not dist.active:  # ranks: the global norm is NaN, all skip
                return stats, False
            if bonus:  # the entropy the bonus trained on, for the adaptive coefficient and entropy/bonus
                on = micro_mask.bool() if keep is None else micro_mask.bool() & keep[micro][:, :width].to(device)
                entropy = entropy.detach()  # the loss holds its graph; the metrics below take the values
                measured += torch.stack([entropy[on].double().sum().cpu(), on.sum().double().cpu()])
            learner.backward(loss)  # x world size: DDP/FSDP average gradients over ranks
            stats.add_loss(loss, loss_stats, float(micro_mask.sum()))
            if record is not None:
                record.add(
                    micro, logprobs, old, ref, adv, micro_mask, entropy,
                    sample_logprobs=tensors["sample_logprobs"][:, :width],
                    entropy_coef=chosen.get("entropy_coef"),  # the bonus's alpha (None: no bonus), for the view's loss
                    **{key: t[micro][:, :width] for key, t in masks.items()},
                )  # fmt: skip
            if first:
                generated = tensors["completion_mask"].bool()  # (n, L)
                stats.add_sampler_diff(logprobs, tensors["sample_logprobs"], generated)
                trained = micro_mask.bool() if keep is None else keep[micro][:, :width].to(device)  # (n, L)
                stats.add_entropy(entropy, generated, trained)
        return stats, True

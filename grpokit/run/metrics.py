"""Every metric a run writes, by name: one line of meaning and its unit each.

The metrics reference of the documentation is generated from these dicts (``metrics_markdown``), and
tests/docs/test_metric_names.py runs tiny GRPO, PPO, multi-turn and SFT runs and checks both ways: every
key their ``metrics.jsonl`` and ``eval.jsonl`` hold is here, and every entry here is written by one of them.
A metric added to a trainer without a line here fails that test.

Placeholders in a name stand for a part that varies: ``{reward}`` a reward function's name (as in
``rewards[i].name``, a file or module path reduced to the function's name), ``{metric}`` a name that
function logged with ``log_metric``, ``{k}`` the number of sampled completions per prompt
(``eval.num_samples``), ``{reason}`` the mask that dropped tokens from the policy gradient (``trust_region``,
``off_policy``, ``entropy``, ``clip_cov``), ``{lag}`` a staleness in steps (0 to ``rollout.max_staleness``). ``when`` says when a metric is written; empty means on every line.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Metric(NamedTuple):
    unit: str
    meaning: str
    when: str = ""


TRL_ALIAS = "TRL's name for the same value"

# metrics.jsonl of `grpokit train` (GRPOTrainer): one line per step, in the order data flows through it.
TRAIN: dict[str, Metric] = {
    "step": Metric("count", "steps done (one rollout and its updates each); 1 after the first"),
    # rewards: grpokit.rewards.result, grpokit.rollout.batch
    "reward/total/mean": Metric(
        "reward", "mean over the step's completions of the weighted sum of the rewards"
    ),
    "reward/total/std": Metric("reward", "std (population) of that sum over the step's completions"),
    "reward/{reward}/mean": Metric(
        "reward",
        "mean of one reward function's values over the completions it applies to (None left out)",
        "it gave a value to some completion",
    ),
    "reward/{reward}/std": Metric("reward", "std (population) of the same values", "it gave a value"),
    "reward/{reward}/applicable": Metric("share", "completions it gave a value (not None) to"),
    "reward/{reward}/failed": Metric("flag", "1 when the function failed on every completion of the step"),
    "reward/{reward}/failed_rows": Metric("count", "completions it failed on (raised, wrong type, NaN)"),
    "reward/{reward}/timeouts": Metric("count", "completions cut at their time budget (scored 0)"),
    "reward/{reward}/seconds": Metric("s", "wall time the function took this step"),
    "reward/{reward}/{metric}": Metric(
        "as logged", "a value the function passed to log_metric(name, value)", "the function calls log_metric"
    ),
    "accuracy": Metric("share", "completions the accuracy reward (train.accuracy_reward) scores 1"),
    "zero_variance_frac": Metric("share", "groups whose rewards are all equal (advantage 0: no signal)"),
    "sampling_rounds": Metric("count", "rollouts drawn to fill the step (1 without dynamic sampling)"),
    "dynamic_sampling/discarded_groups": Metric(
        "count", "groups dropped for having no reward spread", "algo.dynamic_sampling"
    ),
    "dynamic_sampling/discarded_reward_mean": Metric(
        "reward", "mean reward of the dropped groups (1: solved, 0: hopeless)", "a group was dropped"
    ),
    # prompt selection: grpokit.rollout.selection (data.selection.mode=greso)
    "selection/skipped_frac": Metric(
        "share",
        "prompts the stream reached and skipped before generation (GRESO's rule)",
        "data.selection on",
    ),
    "selection/generated_groups": Metric(
        "count", "groups generated for the step, refills included", "data.selection on"
    ),
    "selection/flat_trained": Metric(
        "count",
        "flat groups trained because data.selection.max_rounds could not refill them",
        "data.selection on",
    ),
    "selection/p_solved": Metric(
        "probability",
        "GRESO's keep probability p of a prompt all solved on its last visit (p^z after z)",
        "data.selection on",
    ),
    "selection/p_failed": Metric(
        "probability", "the same for a prompt all failed on its last visit", "data.selection on"
    ),
    "selection/dry": Metric(
        "flag", "1 while every training prompt's last visit was flat: no skip, no refill", "data.selection on"
    ),
    # the policy taking its average: grpokit.train.weight_average.Adoption (train.adopt_average)
    "average/adopted": Metric(
        "flag", "1 when the policy took its average's weights after this step", "train.adopt_average, every adopt_every"
    ),
    "average/score": Metric(
        "reward", "the average's greedy completions of the comparison's training prompts, mean reward",
        "train.adopt_average, every adopt_every",
    ),
    "average/policy_score": Metric(
        "reward", "the policy's, on the same prompts (before it took the average)", "train.adopt_average, every adopt_every"
    ),
    "history/seen_frac": Metric("share", "training prompts visited at least once", "data.selection on"),
    "history/solved_frac": Metric(
        "share", "training prompts whose last visit was all solved (no reward spread)", "data.selection on"
    ),
    "history/failed_frac": Metric(
        "share", "training prompts whose last visit was all failed (no reward spread)", "data.selection on"
    ),
    "history/pass_rate_mean": Metric(
        "share",
        "mean over the prompts visited of their recent pass rate (the accuracy reward's, last data.selection.window "
        "visits)",
        "data.selection on, with an accuracy reward",
    ),
    "advantage/abs_mean": Metric(
        "advantage", "mean |advantage| over completions (over tokens when per token)"
    ),
    # lengths
    "completion_len/mean": Metric("tokens", "mean completion length (episode: the model's own tokens)"),
    "completion_len/min": Metric("tokens", "shortest completion"),
    "completion_len/max": Metric("tokens", "longest completion"),
    "completion_len/correct": Metric(
        "tokens", "mean length of the completions counted correct (NaN if none)"
    ),
    "completion_len/incorrect": Metric("tokens", "mean length of the others (NaN if none)"),
    "truncated_frac": Metric("share", "completions cut at rollout.max_new_tokens (no EOS)"),
    "completion_len/ended_mean": Metric("tokens", "mean length of the completions that ended (EOS); 0 if none did"),
    "completion_len/ended_min": Metric("tokens", "shortest completion that ended; 0 if none did"),
    "completion_len/ended_max": Metric("tokens", "longest completion that ended; 0 if none did"),
    "tokens/step": Metric("tokens", "the step's prompt and completion tokens, padding left out (all ranks)"),
    # the update: grpokit.algos.loss, grpokit.train.update_stats, grpokit.train.learner
    "loss": Metric("loss", "the objective minimised, averaged over the step's optimizer steps"),
    "pg_loss": Metric("loss", "the clipped policy-gradient part, mean over loss tokens"),
    "kl": Metric(
        "nats/token",
        "KL to the reference by algo.kl_kind, mean over loss tokens",
        "a reference is used (algo.beta > 0 or algo.kl_reward_coef > 0)",
    ),
    "entropy": Metric("nats/token", "the policy's entropy over generated tokens"),
    "teacher/kl": Metric(
        "nats/token",
        "the student's reverse KL to the teacher on its own samples, log pi_s - log pi_T (k1), mean over "
        "generated tokens, before the update: what on-policy distillation lowers",
        "a teacher (algo.teacher_kl_coef > 0)",
    ),
    "entropy/trained": Metric(
        "nats/token", "the same over the tokens the loss trains on (less what algo.top_entropy_quantile drops)"
    ),
    "entropy/bonus": Metric(
        "nats/token",
        "the entropy the bonus was computed on, over the trained tokens of every optimizer step of the update (what "
        "algo.adaptive_entropy compares with algo.entropy_target)",
        "the entropy bonus is on (algo.entropy_coef > 0 or algo.adaptive_entropy)",
    ),
    "entropy_coef": Metric(
        "coefficient",
        "the entropy bonus's coefficient applied, mean over the step's optimizer steps (adaptive: 0 while the entropy "
        "is above algo.entropy_target); TRL's entropy_coef",
        "the entropy bonus is on",
    ),
    "clip_frac": Metric("share", "loss tokens whose ratio was clipped (either side)"),
    "clip_frac_low": Metric("share", "loss tokens clipped at 1 - eps_low (negative advantage)"),
    "clip_frac_high": Metric("share", "loss tokens clipped at 1 + eps_high (positive advantage)"),
    "clip_frac_low/seq_min": Metric("share", "the smallest share of a sequence's loss tokens clipped at 1 - eps_low"),
    "clip_frac_high/seq_max": Metric("share", "the largest share of a sequence's loss tokens clipped at 1 + eps_high"),
    "dual_clip_frac": Metric("share", "loss tokens capped by the dual clip", "algo.dual_clip is set"),
    "masked_frac/{reason}": Metric(
        "share",
        "loss tokens a mask took out of the policy gradient (still counted in the normaliser): trust_region "
        "(algo.surrogate=dppo_tv / dppo_kl), off_policy (algo.off_policy_mask), entropy (algo.top_entropy_quantile), "
        "clip_cov (algo.cov_penalty=clip_cov)",
        "that mask is on",
    ),
    "cov_penalised_frac": Metric(
        "share", "loss tokens KL-Cov penalises (the highest covariance of log-prob and advantage)", "algo.cov_penalty=kl_cov"
    ),
    "cov/logp_adv": Metric(
        "nats x advantage",
        "covariance of the sampled tokens' log-probs (the sampler's) and advantages over the loss tokens; the "
        "entropy falls while it is positive (arXiv 2505.22617)",
    ),
    "update/skipped_rows": Metric(
        "share",
        "completions the update left out of its forward and backward passes because the loss gives them no gradient "
        "(advantage 0: a group whose rewards all match); the update's per-token metrics (pg_loss, clip_frac, ratio_*, "
        "kl, entropy, sampler_*) are then over the rest",
        "optim.skip_flat_rows (on by default) with some such completion",
    ),
    "ratio_mean": Metric("ratio", "mean importance ratio pi / pi_old over loss tokens"),
    "ratio_min": Metric("ratio", "smallest ratio over the step's loss tokens"),
    "ratio_max": Metric("ratio", "largest ratio over the step's loss tokens"),
    "grad_norm": Metric("L2 norm", "gradient norm before clipping, mean over the step's optimizer steps"),
    "skipped_updates": Metric("count", "optimizer steps skipped for a non-finite loss or gradient"),
    "lr": Metric("lr", "the learning rate the step's update used (the schedule's value for it)"),
    "micro_batch_size": Metric("rows", "rows per forward/backward in the last pass (optim.micro_batch_size)"),
    "loss_scale": Metric("scale", "float16 dynamic loss scale", "optim.precision=fp16_mixed"),
    "sampler_logprob_diff/mean": Metric(
        "nats", "mean |trainer log-prob - sampler log-prob| of the sampled tokens (engine mismatch)"
    ),
    "sampler_logprob_diff/max": Metric("nats", "largest such difference"),
    "sampler_kl": Metric(
        "nats/token",
        "KL(sampler || trainer) of the sampled tokens, k3 estimate (grpokit.algos.mismatch); rollout.max_sampler_kl",
    ),
    "mismatch/weight_mean": Metric(
        "ratio", "mean importance weight pi_old / pi_sampler over loss tokens, bounded", "a mismatch correction"
    ),
    "mismatch/weight_min": Metric("ratio", "smallest such weight", "a mismatch correction"),
    "mismatch/weight_max": Metric("ratio", "largest such weight", "a mismatch correction"),
    "mismatch/bounded_frac": Metric(
        "share", "loss tokens whose weight the cap or floor truncated or masked", "a mismatch correction"
    ),
    "rollout/weight_lag": Metric(
        "steps", "steps the engine's weights are behind the trainer's (rollout.vllm.sync_every > 1)"
    ),
    "rollout/push_bytes": Metric(
        "bytes",
        "what the weight push before this step's rollout sent to the engine (vllm: every weight, or the LoRA "
        "adapter alone, rollout.vllm.lora_push); 0 when none (an engine that holds no weights, or none changed)",
    ),
    "rollout/push_s": Metric(
        "seconds", "that push's transfer and the engine's cache reset, before its checks; 0 when none"
    ),
    "mismatch/ess": Metric(
        "share",
        "effective sample size of those weights over the loss tokens, (sum w)^2 / (n sum w^2): 1 = all equal",
        "a mismatch correction",
    ),
    # asynchronous rollouts: grpokit.collect.async_sampler
    "async/staleness_mean": Metric(
        "steps", "mean over the trained samples of the steps between their policy version and the trainer's",
        "rollout.max_staleness >= 1",
    ),
    "async/staleness_max": Metric("steps", "largest such staleness (never above rollout.max_staleness)", "rollout.max_staleness >= 1"),
    "async/staleness_{lag}": Metric(
        "count", "trained samples {lag} steps old (0 ... rollout.max_staleness): the staleness histogram",
        "rollout.max_staleness >= 1",
    ),
    "async/dropped": Metric(
        "count", "samples dropped before this step for being more than rollout.max_staleness steps old",
        "rollout.max_staleness >= 1",
    ),
    "async/queue_depth": Metric(
        "batches", "batches made by the sampler process and waiting when this step's was taken",
        "rollout.max_staleness >= 1",
    ),
    "async/wait_s": Metric(
        "s", "seconds the trainer waited for the step's batch (under torchrun the rank that waited longest)",
        "rollout.max_staleness >= 1",
    ),
    "async/version": Metric(
        "step", "the policy version (steps done) whose weights sampled the step's batch (under torchrun the "
        "oldest of the ranks' shares; counts and drops are every rank's)", "rollout.max_staleness >= 1",
    ),
    "async/sampler_busy": Metric(
        "share", "the sampler process's seconds on the batch over the seconds since the previous batch was taken",
        "rollout.max_staleness >= 1, from the second step",
    ),
    "async/trainer_busy": Metric(
        "share", "share of the step the trainer did not wait for its batch (1: generation fully overlapped)",
        "rollout.max_staleness >= 1",
    ),
    # PPO's critic: grpokit.train.critic
    "critic/value_loss": Metric(
        "loss", "clipped value loss, mean over the critic's optimizer steps", "a critic"
    ),
    "critic/value_clipfrac": Metric("share", "tokens whose value prediction was clipped", "a critic"),
    "critic/values_mean": Metric("reward", "mean value V over loss tokens, before the update", "a critic"),
    "critic/returns_mean": Metric("reward", "mean return (GAE advantage + V) over loss tokens", "a critic"),
    "critic/explained_variance": Metric(
        "share", "1 - Var(returns - V) / Var(returns): how much of the returns V foresees", "a critic"
    ),
    "critic/grad_norm": Metric("L2 norm", "the critic's gradient norm, mean over its steps", "a critic"),
    "critic/lr": Metric("lr", "the critic's learning rate", "a critic"),
    "critic/warmup": Metric("flag", "1 while only the critic trains (critic.warmup_steps)", "a critic"),
    # multi-turn episodes: grpokit.rollout.multiturn
    "episode/turns_mean": Metric("turns", "model turns per episode", "rollout.tools or rollout.environment"),
    "episode/turns_max": Metric("turns", "most model turns in one episode", "multi-turn"),
    "episode/truncated_frac": Metric(
        "share", "episodes stopped by max_turns, the token budget or a cut turn", "multi-turn"
    ),
    "tools/calls": Metric("count", "tool calls in the step", "multi-turn"),
    "tools/calls_per_episode": Metric("count", "tool calls per episode", "multi-turn"),
    "tools/errors": Metric(
        "count", "calls answered with an Error: message (bad call, raise, crash)", "multi-turn"
    ),
    "tools/timeouts": Metric(
        "count", "calls stopped by a clock: rollout.tool_timeout_s, the tool's own, or a time budget", "multi-turn"
    ),
    "episodes/over_budget": Metric(
        "count", "episodes ended by rollout.episode_timeout_s or rollout.step_timeout_s", "multi-turn"
    ),
    "episodes/worker_lost": Metric(
        "count", "episodes cut because their environment worker was killed from outside grpokit", "multi-turn"
    ),
    "episodes/failed": Metric(
        "count", "episodes whose environment raised, hung, crashed or answered wrongly (scored 0)", "multi-turn"
    ),
    "masked_token_frac": Metric(
        "share", "episode tokens written by tools or the environment (no loss)", "multi-turn"
    ),
    "time/tools": Metric("s", "time waiting on tools or the environment", "multi-turn"),
    "time/turn_generation": Metric("s", "time generating the model's turns", "multi-turn"),
    # time, throughput, memory
    "time/step": Metric("s", "wall time of the whole step"),
    "time/generation": Metric("s", "sampling the completions"),
    "time/scoring": Metric("s", "running the reward functions"),
    "time/reference": Metric(
        "s",
        "the reference's log-probs before the update (rollout.max_staleness >= 1 on a CPU: the sampler process's "
        "seconds on the batch's, beside the update)",
    ),
    "time/update": Metric("s", "the policy (and critic) update"),
    "tokens_per_s": Metric("tokens/s", "generated tokens / time/step"),
    "peak_memory_mb": Metric(
        "MiB", "peak so far: CUDA max_memory_allocated, or the process's resident set on CPU"
    ),
    "rollout/cuda_graphs": Metric("flag", "1 when decoding replayed CUDA graphs"),
    "rollout/compiled": Metric("flag", "1 when the decode's layers ran compiled (rollout.compile)"),
    "rollout/static_kv_cache": Metric("flag", "1 when decoding ran over the static KV cache"),
    # TRL's names written beside grpokit's where they mean the same (grpokit.compat.trl.names)
    "reward": Metric("reward", f"{TRL_ALIAS}: reward/total/mean"),
    "rewards/{reward}/mean": Metric("reward", f"{TRL_ALIAS}: reward/{{reward}}/mean"),
    "rewards/{reward}/std": Metric("reward", "TRL's: the unbiased std (n - 1) of reward/{reward} over the rows it scored"),
    "num_tokens": Metric("tokens", "TRL's: the prompt and completion tokens of every step so far (tokens/step summed)"),
    "reward_std": Metric("reward", "TRL's: the unbiased std (n - 1) of the total reward over the step's scored rows"),
    "frac_reward_zero_std": Metric("share", f"{TRL_ALIAS}: zero_variance_frac"),
    "completions/mean_length": Metric("tokens", f"{TRL_ALIAS}: completion_len/mean"),
    "completions/min_length": Metric("tokens", f"{TRL_ALIAS}: completion_len/min"),
    "completions/max_length": Metric("tokens", f"{TRL_ALIAS}: completion_len/max"),
    "completions/clipped_ratio": Metric("share", f"{TRL_ALIAS}: truncated_frac"),
    "completions/mean_terminated_length": Metric("tokens", f"{TRL_ALIAS}: completion_len/ended_mean"),
    "completions/min_terminated_length": Metric("tokens", f"{TRL_ALIAS}: completion_len/ended_min"),
    "completions/max_terminated_length": Metric("tokens", f"{TRL_ALIAS}: completion_len/ended_max"),
    "clip_ratio/low_mean": Metric("share", f"{TRL_ALIAS}: clip_frac_low"),
    "clip_ratio/high_mean": Metric("share", f"{TRL_ALIAS}: clip_frac_high"),
    "clip_ratio/region_mean": Metric("share", f"{TRL_ALIAS}: clip_frac"),
    "clip_ratio/low_min": Metric("share", f"{TRL_ALIAS}: clip_frac_low/seq_min"),
    "clip_ratio/high_max": Metric("share", f"{TRL_ALIAS}: clip_frac_high/seq_max"),
    "policy_loss": Metric(
        "loss", "TRL's: the loss before the entropy bonus (loss itself without one; + entropy_coef x entropy/bonus)"
    ),
    "tools/call_frequency": Metric("count", f"{TRL_ALIAS}: tools/calls_per_episode", "multi-turn"),
    "step_time": Metric("s", "TRL's: time/step (TRL's is an optimizer step's; the same with one per step)"),
    "tools/failure_frequency": Metric("share", "TRL's: tools/errors / tools/calls (0 without calls)", "multi-turn"),
    "learning_rate": Metric("lr", f"{TRL_ALIAS}: lr"),
    "sampling/sampling_logp_difference/mean": Metric("nats", f"{TRL_ALIAS}: sampler_logprob_diff/mean"),
    "sampling/sampling_logp_difference/max": Metric("nats", f"{TRL_ALIAS}: sampler_logprob_diff/max"),
    "sampling/importance_sampling_ratio/mean": Metric(
        "ratio", f"{TRL_ALIAS}: mismatch/weight_mean", "a mismatch correction"
    ),
    "sampling/importance_sampling_ratio/min": Metric("ratio", f"{TRL_ALIAS}: mismatch/weight_min", "a mismatch correction"),
    "sampling/importance_sampling_ratio/max": Metric("ratio", f"{TRL_ALIAS}: mismatch/weight_max", "a mismatch correction"),
}

# what an evaluation by generation reports (grpokit.rollout.evaluate, grpokit.rollout.episodes)
_GENERATION_EVAL: dict[str, Metric] = {
    "accuracy": Metric(
        "share", "held-out prompts whose greedy completion the accuracy reward scores 1 (pass@1)"
    ),
    "greedy_score": Metric("reward", "mean accuracy-reward value of the greedy completions"),
    "completion_len/mean": Metric("tokens", "mean greedy completion length"),
    "num_examples": Metric("count", "held-out rows evaluated"),
    "mean_at_{k}": Metric("reward", "mean score of k sampled completions per prompt", "eval.num_samples > 0"),
    "pass_at_{k}": Metric(
        "share", "prompts with at least one of k samples scoring 1", "eval.num_samples > 0"
    ),
    "maj_at_{k}": Metric(
        "share", "prompts whose majority answer over k samples scores 1", "eval.num_samples > 0"
    ),
    "maj_at_{k}/no_answer": Metric(
        "share", "sampled completions with no answer to vote with", "eval.num_samples > 0"
    ),
}

# eval.jsonl of `grpokit train`: one line before training, every eval.every steps, and after
TRAIN_EVAL: dict[str, Metric] = {
    "step": Metric("count", "steps done when the evaluation ran (0: before training)"),
    **_GENERATION_EVAL,
    "episode/turns_mean": Metric("turns", "model turns per greedy episode", "multi-turn"),
    "tools/calls_per_episode": Metric("count", "tool calls per greedy episode", "multi-turn"),
    "ema/{metric}": Metric("", "the same metric of the averaged weights (ema/accuracy, ...)", "train.ema_decay > 0"),
    "ema/{metric}/{part}": Metric("", "the same (ema/maj_at_k/no_answer)", "train.ema_decay > 0"),
}

# metrics.jsonl of `grpokit sft` (SFTTrainer)
SFT: dict[str, Metric] = {
    "step": Metric("count", "optimizer steps done"),
    "loss": Metric(
        "nats/token", "cross-entropy over the step's trained tokens (all micro-batches and ranks)"
    ),
    "mean_token_accuracy": Metric(
        "fraction", "TRL's: trained tokens that are the argmax of the model's logits, over the step's trained tokens"
    ),
    "entropy": Metric("nats", "TRL's: entropy of the model's next-token distribution, mean over the trained tokens"),
    "grad_norm": Metric("L2 norm", "gradient norm before clipping (NaN when skipped)"),
    "skipped_update": Metric("flag", "1 when the step was skipped for a non-finite loss or gradient"),
    "tokens/trained": Metric("tokens", "tokens the loss is on (sft.loss_on)"),
    "tokens/input": Metric("tokens", "all tokens of the step's rows, prompts included"),
    "num_tokens": Metric("tokens", "TRL's: the input tokens of every step so far (tokens/input summed)"),
    "epoch": Metric("count", "passes over the training rows completed"),
    "lr": Metric("lr", "the learning rate the step's update used (the schedule's value for it)"),
    "learning_rate": Metric("lr", f"{TRL_ALIAS}: lr"),
    "micro_batch_size": Metric("rows", "rows per forward/backward in the step"),
    "loss_scale": Metric("scale", "float16 dynamic loss scale", "optim.precision=fp16_mixed"),
    "time/step": Metric("s", "wall time of the step"),
    "tokens_per_s": Metric("tokens/s", "input tokens / time/step"),
    "peak_memory_mb": Metric("MiB", "peak so far: CUDA max_memory_allocated, or the resident set on CPU"),
}

# eval.jsonl of `grpokit sft`: held-out loss; with a reward, generation as grpokit train reports it
SFT_EVAL: dict[str, Metric] = {
    "step": Metric("count", "steps done when the evaluation ran (0: before training)"),
    "loss": Metric("nats/token", "cross-entropy of the held-out rows' trained tokens"),
    "perplexity": Metric("perplexity", "exp(loss)"),
    "tokens": Metric("tokens", "held-out tokens scored"),
    "mean_token_accuracy": Metric("fraction", "held-out trained tokens that are the argmax of the logits (TRL's)"),
    "entropy": Metric("nats", "mean entropy of the next-token distribution at the held-out trained tokens (TRL's)"),
    **{name: m._replace(when=m.when or "rewards set") for name, m in _GENERATION_EVAL.items()},
}

FILES: dict[str, dict[str, Metric]] = {
    "grpokit train: metrics.jsonl": TRAIN,
    "grpokit train: eval.jsonl": TRAIN_EVAL,
    "grpokit sft: metrics.jsonl": SFT,
    "grpokit sft: eval.jsonl": SFT_EVAL,
}


def _pattern(name: str) -> re.Pattern[str]:
    """A regex of a registry name, each placeholder one path part: reward/{reward}/mean -> reward/[^/]+/mean."""
    parts = re.split(r"(\{\w+\})", name)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts) + "$")


def entry_for(key: str, registry: dict[str, Metric]) -> str | None:
    """The registry name ``key`` is an instance of: itself, else the matching name with the fewest
    placeholders ("reward/math_accuracy/mean" -> "reward/{reward}/mean", not "reward/{reward}/{metric}");
    None when none matches."""
    if key in registry:
        return key
    matches = [name for name in registry if "{" in name and _pattern(name).match(key)]
    return min(matches, key=lambda name: name.count("{"), default=None)


def metrics_markdown() -> str:
    """The metrics reference page's tables, one per file a run writes."""
    out = []
    for title, registry in FILES.items():
        out += [f"## {title}", "", "| metric | unit | meaning | written when |", "|---|---|---|---|"]
        for name, m in registry.items():
            out.append(f"| `{name}` | {m.unit} | {m.meaning} | {m.when or 'always'} |")
        out.append("")
    return "\n".join(out)

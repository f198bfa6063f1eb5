"""Named algorithms as presets over the independent axes (advantage, ratio/clip, KL, aggregation).

Each preset is an AlgoSettings (settings.py, where every setting's flat name, doc and allowed
values live); the config's `algo.*` keys override it.

The formulas, per preset:
  grpo         DeepSeekMath, arXiv 2402.03300. A_i = (r_i - mean_g)/std_g; token ratio, clip 0.2;
               loss (1/B) sum_i (1/|o_i|) sum_t [l_{i,t} + 0.04 * k3_{i,t}].
  grpo_process DeepSeekMath's GRPO with process supervision, arXiv 2402.03300 sec. 4.1.3. Step rewards
               (a process reward) normalised over all steps of the group's G outputs, A_{i,t} = sum of
               those of the steps ending at or after t (algos/process.py); otherwise as grpo.
  dr_grpo      Dr. GRPO, arXiv 2503.20783. A_i = r_i - mean_g (no std); loss sum_{i,t} l / (B * L_max);
               no KL. Removes the length and question-difficulty biases.
  dapo         DAPO, arXiv 2503.14476. GRPO advantage; clip-higher [0.8, 1.28]; loss sum m l / sum m;
               no KL; dynamic sampling; overlong shaping with L_cache = 4096 of L_max = 20480 (0.2).
  gspo         GSPO, arXiv 2507.18071. GRPO advantage; s_i = exp(mean_t log rho_{i,t}); clip
               [1 - 3e-4, 1 + 4e-4] on s_i; (1/B) sum_i (1/|o_i|) sum_t l; no KL.
  rloo         RLOO, arXiv 2402.14740. A_i = r_i - mean_{j!=i} r_j; REINFORCE on whole sequences,
               sum_t over tokens (seq-sum-norm with L_max, a constant rescaling of the sum); the paper
               puts its KL penalty into the reward, so the loss has beta = 0.
  reinforce_pp REINFORCE++, arXiv 2501.03262. r_t = -0.01 * k1_t (+ score at EOS), A_t = returns-to-go
               whitened per token over the batch (eq. 10, population std); token-mean; the KL lives in
               the reward (coefficient 0.01, OpenRLHF's init_kl_coef), so the loss has beta = 0.
  reinforce_pp_baseline  REINFORCE++-baseline, arXiv 2501.03262. Score r_i - mean_g, then the same
               per-token whitening; token-mean; the paper uses a k2 KL loss instead of a KL in the
               reward: set beta > 0 (its value is task-specific).
  ppo          PPO-RLHF, Ouyang et al. arXiv 2203.02155. A critic V (grpokit.train.critic); r_t = -0.05 * k1_t
               (+ score at EOS); A = GAE(gamma 1, lambda 0.95) whitened per token over the batch; token
               ratio clip 0.2; token-mean; clipped value loss R = A + V (critic.* settings). TRL's PPOConfig
               defaults (kl_coef 0.05, k1, gamma 1.0, lam 0.95).
  cispo        CISPO, MiniMax-M1 arXiv 2506.13585. GRPO advantage; l = -sg(min(rho, 5)) A logp on every token
               (the IS weight clipped, never the token: eps_low 1 = no lower bound, eps_high 4, the cap 5 of
               ScaleRL and TRL's recommendation); token-mean; no KL.
  sapo         SAPO, arXiv 2511.20347. GRPO advantage; l = -(4/tau) sigmoid(tau (rho - 1)) A, tau 1.0 for A > 0
               and 1.05 otherwise (TRL's defaults); (1/B) sum_i (1/|o_i|) sum_t l; no KL.
  gmpo         GMPO, arXiv 2507.20673. GRPO advantage; l_i = -A_i exp(mean_t clip(log rho_t, -0.4, 0.4)), the
               geometric mean of the token ratios clipped in log space (e^+-0.4) on the pessimistic side; mean over
               sequences; no KL.
  dppo_tv      DPPO-Binary-TV, arXiv 2602.04879. Dr. GRPO advantage and loss (sum / (B * L_max)); l = -A
               sg(min(rho, 20)) logp, masked where |p - p_old| leaves 0.15 on the side A pushes; no KL.
  dppo_kl      DPPO-Binary-KL, arXiv 2602.04879. The same with the binary KL of the token's probability, bound 0.05.
  luspo        LUSPO as TRL 1.16 defines it (loss_type="luspo"; TRL cites arXiv 2602.05261): GRPO advantage,
               sequence ratio (GSPO), clip 0.2; loss (1/B) sum_i sum_t l, summed over tokens, not averaged
               (seq-sum-norm with L = 1); no KL.
  vespo        VESPO as TRL 1.16 defines it (loss_type="vespo", arXiv 2602.10693): GRPO advantage;
               l = -sg(phi(w_i)) A logp with w_i the sequence's product of token ratios and the gamma-shaped
               phi(w) = e^lambda w^k e^(-lambda w) (k, lambda = 2, 3 for A >= 0 and 3, 2 otherwise); token-mean.
"""

from __future__ import annotations

import dataclasses

from .advantages import ADVANTAGES, get_advantage
from .knobs import flat_keys
from .objectives import SURROGATES
from .settings import KNOBS, AlgoSettings

PRESETS: dict[str, AlgoSettings] = {
    # DeepSeekMath, arXiv 2402.03300 (sec. 4.1): std-scaled group advantage, KL k3 in the loss, beta 0.04.
    "grpo": AlgoSettings.of(advantage="group_std", agg="seq-mean-token-mean", beta=0.04, kl_kind="k3"),
    # DeepSeekMath, arXiv 2402.03300 (sec. 4.1.3): the same with process supervision (per-step rewards, token-level advantages).
    "grpo_process": AlgoSettings.of(
        advantage="process_group", agg="seq-mean-token-mean", beta=0.04, kl_kind="k3"
    ),
    # Dr. GRPO, arXiv 2503.20783: no std division, constant normaliser L = max completion length, no KL.
    "dr_grpo": AlgoSettings.of(
        advantage="group_centre", agg="seq-sum-norm", norm_len="max_completion_length"
    ),
    # DAPO, arXiv 2503.14476: clip-higher 0.2/0.28, token-mean, no KL, dynamic sampling, overlong
    # shaping (buffer 4096 of 20480 tokens = 0.2) and overlong filtering (mask truncated completions).
    "dapo": AlgoSettings.of(
        advantage="group_std",
        eps_high=0.28,
        agg="token-mean",
        dynamic_sampling=True,
        overlong_shaping=True,
        overlong_buffer=0.2,
        mask_truncated=True,
    ),
    # GSPO, arXiv 2507.18071: sequence-level geometric-mean ratio, clip 3e-4 / 4e-4, no KL.
    "gspo": AlgoSettings.of(
        advantage="group_std", eps_low=3e-4, eps_high=4e-4, ratio_level="sequence", agg="seq-mean-token-mean"
    ),
    # RLOO, arXiv 2402.14740: leave-one-out baseline, sequence-level REINFORCE (sum over tokens); the paper's
    # KL lives in the reward (set algo.kl_reward_coef), none by default.
    "rloo": AlgoSettings.of(advantage="leave_one_out", agg="seq-sum-norm", norm_len="max_completion_length"),
    # REINFORCE++, arXiv 2501.03262: k1 KL in the per-token reward, returns whitened per token over the
    # batch (eq. 10), token-mean.
    "reinforce_pp": AlgoSettings.of(
        advantage="token_whiten", agg="token-mean", kl_kind="k1", kl_reward_coef=0.01
    ),
    # REINFORCE++-baseline, arXiv 2501.03262: group-mean baseline, then the same per-token whitening;
    # token-mean; k2 KL loss (set beta).
    "reinforce_pp_baseline": AlgoSettings.of(
        advantage="group_centre_token_whiten", agg="token-mean", kl_kind="k2"
    ),
    # PPO-RLHF, Ouyang et al. arXiv 2203.02155 (ALGORITHMS.md sec. 8): a critic (grpokit.train.critic), r_t = score
    # at EOS - 0.05 * k1_t, GAE gamma 1 / lambda 0.95, whitened advantages, clip 0.2, token-mean. The numbers
    # are TRL's PPOConfig defaults (kl_coef 0.05 with k1, gamma 1.0, lam 0.95, cliprange 0.2).
    "ppo": AlgoSettings.of(
        advantage="gae", agg="token-mean", kl_kind="k1", kl_reward_coef=0.05, gamma=1.0, lam=0.95
    ),
    # CISPO, MiniMax-M1 arXiv 2506.13585: clipped stop-gradient IS weight (cap 1 + 4 = 5, no lower bound) times
    # A logp, token-mean, no KL.
    "cispo": AlgoSettings.of(
        advantage="group_std", surrogate="cispo", eps_low=1.0, eps_high=4.0, agg="token-mean"
    ),
    # SAPO, arXiv 2511.20347: soft sigmoid gate, tau 1.0 / 1.05 (TRL's defaults), seq-mean-token-mean, no KL.
    "sapo": AlgoSettings.of(
        advantage="group_std",
        surrogate="sapo",
        sapo_tau_pos=1.0,
        sapo_tau_neg=1.05,
        agg="seq-mean-token-mean",
    ),
    # GMPO, arXiv 2507.20673: geometric mean of the token ratios, clipped in log space to (e^-0.4, e^0.4).
    "gmpo": AlgoSettings.of(
        advantage="group_std", surrogate="gmpo", eps_low=0.4, eps_high=0.4, agg="seq-mean-token-mean"
    ),
    # DPPO-Binary-TV, arXiv 2602.04879: trust-region mask |p - p_old| <= 0.15, Dr. GRPO advantage and loss
    # (verl's run_qwen30b_dppo.sh).
    "dppo_tv": AlgoSettings.of(
        advantage="group_centre",
        surrogate="dppo_tv",
        eps_low=0.15,
        eps_high=0.15,
        agg="seq-sum-norm",
        norm_len="max_completion_length",
    ),
    # DPPO-Binary-KL, arXiv 2602.04879: the mask from the binary KL of the token's probability, bound 0.05.
    "dppo_kl": AlgoSettings.of(
        advantage="group_centre",
        surrogate="dppo_kl",
        eps_low=0.05,
        eps_high=0.05,
        agg="seq-sum-norm",
        norm_len="max_completion_length",
    ),
    # LUSPO as TRL 1.16 defines it, arXiv 2602.05261: GSPO's sequence ratio, the loss summed over each
    # sequence's tokens and averaged over sequences.
    "luspo": AlgoSettings.of(advantage="group_std", ratio_level="sequence", agg="seq-sum-norm", norm_len=1),
    # VESPO as TRL 1.16 defines it, arXiv 2602.10693: a gamma-shaped weight of the sequence's IS ratio times
    # A logp, TRL's defaults k / lambda, token-mean.
    "vespo": AlgoSettings.of(advantage="group_std", surrogate="vespo", agg="token-mean"),
}

SETTING_KEYS = tuple(KNOBS)

PAPERS = {
    "grpo": "arXiv 2402.03300",
    "grpo_process": "arXiv 2402.03300 (4.1.3)",
    "dr_grpo": "arXiv 2503.20783",
    "dapo": "arXiv 2503.14476",
    "gspo": "arXiv 2507.18071",
    "rloo": "arXiv 2402.14740",
    "reinforce_pp": "arXiv 2501.03262",
    "reinforce_pp_baseline": "arXiv 2501.03262",
    "ppo": "arXiv 2203.02155",
    "cispo": "arXiv 2506.13585",
    "sapo": "arXiv 2511.20347",
    "gmpo": "arXiv 2507.20673",
    "dppo_tv": "arXiv 2602.04879",
    "dppo_kl": "arXiv 2602.04879",
    "luspo": "arXiv 2602.05261",
    "vespo": "arXiv 2602.10693",
}


def preset_table() -> str:
    """README's preset table in Markdown, generated from PRESETS (a test keeps README equal to it)."""
    rows = [
        "| preset | advantage | ratio / clip | KL | loss aggregation | paper |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in PRESETS.items():
        advantage = (get_advantage(s.advantage.estimator).__doc__ or s.advantage.estimator).strip()
        if s.uses_critic:
            advantage += f" (gamma {s.gae.gamma:g}, lambda {s.gae.lam:g})"
        clip = _num(s.ratio.eps_low) + (
            f" / {_num(s.ratio.eps_high)}" if s.ratio.eps_high != s.ratio.eps_low else ""
        )
        level = {
            "token": "token",
            "sequence": "sequence (geometric mean)",
            "sequence_token": "sequence-token",
        }
        entry = SURROGATES[s.ratio.surrogate]
        params = {} if entry.params is None else dataclasses.asdict(s.params_of(entry.params))
        words = entry.summary.format(
            clip=clip, level=level[s.ratio.level], lo=1 - s.ratio.eps_low, hi=1 + s.ratio.eps_high, **params
        )
        ratio = words + (f", dual clip {s.ratio.dual_clip:g}" if s.ratio.dual_clip else "")
        kl = [f"{s.kl.kind} in the loss, beta {s.kl.beta:g}"] if s.kl.beta > 0 else []
        kl += [f"k1 in the reward, {s.kl.reward_coef:g}"] if s.kl.reward_coef > 0 else []
        agg = s.loss.agg
        if agg == "seq-sum-norm":
            agg = {
                "max_completion_length": "sum / (B * max_len)",
                1: "sum over tokens, mean over sequences",
            }.get(s.loss.norm_len, f"sum / (B * {s.loss.norm_len})")
        batch = [
            text
            for on, text in (
                (s.batch.dynamic_sampling, "dynamic sampling"),
                (s.batch.overlong_shaping, "overlong shaping"),
                (s.batch.mask_truncated, "overlong filtering"),
            )
            if on
        ]
        agg += f"; {', '.join(batch)}" if batch else ""
        rows.append(
            f"| `{name}` | {advantage} | {ratio} | {'; '.join(kl) or 'none'} | {agg} | {PAPERS[name]} |"
        )
    return "\n".join(rows) + "\n"


def _num(x: float) -> str:
    """0.2 -> "0.2", 3e-4 -> "3e-4"."""
    return f"{x:g}" if x >= 1e-3 else f"{x:.0e}".replace("e-0", "e-")


def registry_tables() -> str:
    """docs/algorithms/index.md's two tables of who reads what, in Markdown, generated from the registrations
    (objectives.SURROGATES, advantages.ADVANTAGES; a test keeps the page equal to it)."""
    rows = [
        "| `algo.surrogate` | its own settings | reads of the clip range | ratio level |",
        "|---|---|---|---|",
    ]
    for name, s in SURROGATES.items():
        rows.append(
            f"| `{name}` | {_keys(s.params)} | {', '.join(f'`{k}`' for k in s.reads) or 'none'} | "
            f"{'token only (builds its own)' if s.token_ratio else 'any'} |"
        )
    rows += [
        "",
        "| `algo.advantage` | formula | its own settings | one value per | needs | under torchrun |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in ADVANTAGES.items():
        if ":" in name:  # a module:function imported this session
            continue
        needs = [
            text
            for on, text in (
                (e.needs_critic, "a critic"),
                (e.step_rewards, "step rewards (a process reward)"),
                (not e.kl_in_reward, "no KL in the reward"),
            )
            if on
        ]
        rows.append(
            f"| `{name}` | {(e.fn.__doc__ or '').strip()} | {_keys(e.params)} | "
            f"{'token' if e.per_token else 'completion'} | {', '.join(needs) or '-'} | "
            f"{'its own groups' if e.group_local else 'the whole batch gathered'} |"
        )
    return "\n".join(rows) + "\n"


def _keys(params: type | None) -> str:
    return ", ".join(f"`algo.{key}`" for key in flat_keys(params)) or "none"

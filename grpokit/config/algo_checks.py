"""The rules between the algorithm (``algo.*``, resolved from its preset and knobs) and the other settings: knobs
that could not take effect, an adaptive entropy coefficient that starts outside its range, a reference model offloaded
or moved when there is none to offload or move. Part of the config's checks (grpokit.config.checks calls them)."""

from __future__ import annotations

from typing import Any

from grpokit.core.errors import ConfigError


def check_reference_offload(cfg: Any) -> None:
    """optim.offload_reference=true moves a reference model that does not exist (algo.beta 0 and no KL in the
    reward; grpokit sft, which has none): it would do nothing, so it is refused."""
    if not hasattr(cfg, "algo"):  # grpokit sft: no reference model
        raise ConfigError(
            "optim.offload_reference=true: grpokit sft keeps no reference model, so there is nothing to offload; "
            "remove the setting (optim.offload_optimizer offloads the optimizer's states)."
        )
    settings = _resolved_algo(cfg)
    if settings is not None and not settings.uses_reference:
        raise ConfigError(
            f"optim.offload_reference=true: this run keeps no reference model (algo.beta={settings.kl.beta:g} and "
            f"algo.kl_reward_coef={settings.kl.reward_coef:g}: no KL), so there is nothing to offload; remove the "
            "setting, or set algo.beta > 0 for a KL to the reference."
        )


def _resolved_algo(cfg: Any) -> Any:
    """The algorithm cfg.algo resolves to (its preset with the knobs set), or None when a preset or value is bad
    (reported by its own check)."""
    from grpokit.algos import KNOBS, PRESETS  # lazy: grpokit.algos imports torch

    given = {key: getattr(cfg.algo, key) for key in KNOBS if getattr(cfg.algo, key) is not None}
    try:
        return PRESETS[cfg.algo.preset].override(**given)
    except (KeyError, ValueError):
        return None


def check_reference_sync(cfg: Any) -> None:
    """algo.ref_sync_every > 0 moves the reference copy toward the policy (grpokit.train.reference.mix_toward);
    with LoRA the reference is the base model with the adapter off, no copy, so it is refused (as TRL does)."""
    settings = _resolved_algo(cfg)
    if settings is None or not settings.kl.ref_sync_every or not cfg.lora.enabled:
        return
    raise ConfigError(
        f"algo.ref_sync_every={settings.kl.ref_sync_every} with lora.enabled=true: with LoRA the reference is the "
        "base model with the adapter switched off, not a copy that could move toward the policy; train without "
        "LoRA, or set algo.ref_sync_every=0."
    )


def check_entropy_start(cfg: Any) -> None:
    """With algo.adaptive_entropy the coefficient c lives in [entropy_coef_min, entropy_coef_max]
    (grpokit.algos.entropy_bonus.EntropyControl): a start (algo.entropy_coef) above the maximum is never applied
    (the bonus acts only after a step at or below the target, and that step clamps c to the maximum); one below
    the minimum would apply a coefficient the range excludes. Both refused."""
    settings = _resolved_algo(cfg)
    if settings is None:
        return
    entropy = settings.entropy
    if not entropy.adaptive or entropy.coef_min > entropy.coef_max:  # the latter is refused as ineffective
        return
    fix = "start within [algo.entropy_coef_min, algo.entropy_coef_max], or widen that range."
    if entropy.coef > entropy.coef_max:
        raise ConfigError(
            f"algo.entropy_coef={entropy.coef:g} is above algo.entropy_coef_max={entropy.coef_max:g}: the adaptive "
            "bonus acts only after a step at or below algo.entropy_target, which clamps the coefficient to the "
            f"maximum, so this start would never be used; {fix}"
        )
    if entropy.coef < entropy.coef_min:
        raise ConfigError(
            f"algo.entropy_coef={entropy.coef:g} is below algo.entropy_coef_min={entropy.coef_min:g}: the adaptive "
            f"coefficient would be applied below its own minimum until it climbs there; {fix}"
        )


def check_algo_knobs(cfg: Any) -> None:
    """algo.* knobs set explicitly that could not take effect (grpokit.algos.AlgoSettings.ineffective):
    refused now, not silently ignored, nor refused at the first step."""
    from grpokit.algos import KNOBS, PRESETS, IneffectiveSettingError  # lazy: grpokit.algos imports torch

    given = {key: getattr(cfg.algo, key) for key in KNOBS if getattr(cfg.algo, key) is not None}
    try:
        settings = PRESETS[cfg.algo.preset].override(**given)
    except IneffectiveSettingError as e:  # a surrogate's or estimator's own setting that neither reads
        problems = [str(e)]
    except (KeyError, ValueError):
        return  # a bad preset or value is reported by its own check
    else:
        problems = settings.ineffective(set(given))
    if problems:
        raise ConfigError(
            f"{problems[0]} (algo.preset={cfg.algo.preset}). Remove the setting or change the algorithm."
        )

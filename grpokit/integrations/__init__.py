"""What the ecosystem already has, plugged into grpokit: one module per ecosystem, each importing its package
only when used (the packages are optional extras).

    reasoning_gym   reasoning-gym's procedural tasks as data (data.train: reasoning_gym:TASK?size=..&seed=..),
                    their own scorers as a reward, per-task pass rates, a curriculum from the pass rates
    verifiers       a verifiers environment (single-turn, multi-turn, tool) as a rollout: its dataset as rows
                    (data.train: verifiers:ID), its rubric's functions as rewards (rollout.environment: verifiers:ID)
    openenv         an OpenEnv environment served over its protocol (rollout.environment: openenv:URL)

The layers below name these modules where a config's KIND:target points at them
(grpokit.data.prompts.SOURCE_KINDS, grpokit.rollout.episodes.ENVIRONMENT_KINDS).
"""

"""What the ecosystem already has, plugged into grpokit: one module per ecosystem, each importing its package
only when used (the packages are optional extras).

    reasoning_gym   reasoning-gym's procedural tasks as data (data.train: reasoning_gym:TASK?size=..&seed=..),
                    their own scorers as a reward, per-task pass rates, a curriculum from the pass rates
    openenv         an OpenEnv environment served over its protocol (rollout.environment: openenv:URL)

The layers below name these modules where a config's KIND:target points at them
(grpokit.data.prompts.SOURCE_KINDS, grpokit.rollout.episodes.ENVIRONMENT_KINDS).
"""

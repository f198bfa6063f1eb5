"""Moved to grpokit.rollout.engines.vllm.collective: this path keeps its public names."""

from grpokit.rollout.engines import moved
from grpokit.rollout.engines.vllm.collective import (
    BACKENDS,
    RECEIVER,
    SOURCE,
    describe,
    make_group,
    new_group_name,
    receive,
    route_address,
    send,
)

__all__ = [
    "BACKENDS",
    "RECEIVER",
    "SOURCE",
    "describe",
    "make_group",
    "new_group_name",
    "receive",
    "route_address",
    "send",
]


def __getattr__(name: str):
    raise moved(__name__, name, "grpokit.rollout.engines.vllm.collective")

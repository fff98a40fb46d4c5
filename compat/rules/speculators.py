"""Drafters in vllm-project/speculators' format: the verifier they pin, and the stacks that read them."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable

from specpair.checkpoint import Checkpoint
from specpair.compat.fixes import convert_command
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_STACKS, Values, kinds_where, rule
from specpair.compat.stacks import STACKS, fetch_step, pinned_ref

SPECULATORS_KINDS = kinds_where(lambda k: k.speculators is not None)
# Stacks that load an HF drafter directory (GGUF stacks: format.draft says what they need instead)
HF_STACKS = tuple(s.name for s in STACKS.values() if s.file_format != "gguf")
HF_CACHE_REPO = re.compile(r"(^|/)models--(?P<org>[^/]+)--(?P<name>[^/]+)/snapshots/[^/]+/?$")


def _names(ref: str) -> set[str]:
    """The names a reference goes by, lower-cased: as given, its absolute path, and its repo's name (the last part
    of org/name, of a directory, or of an HF cache snapshot's repo)."""
    bare = ref.partition("@")[0].rstrip("/")
    snapshot = HF_CACHE_REPO.search(os.path.abspath(bare))
    repo = f"{snapshot['org']}/{snapshot['name']}" if snapshot else bare
    return {n.lower() for n in (bare, repo, os.path.abspath(bare), repo.rsplit("/", 1)[-1])}


def _mismatch(pin: str, archs: list[str], target: Checkpoint) -> str | None:
    """Why `target` is not the verifier pinned as `pin` with `archs`; None when it is."""
    if archs and target.architecture and target.architecture not in archs:
        return f"the target's architecture is {target.architecture}"
    if not _names(pin) & _names(target.ref):
        return f"the target is {target.ref.partition('@')[0]}"
    return None


def _repin(p: Pair, stack: str) -> list[str]:
    """The drafter written again pinning this target, after the downloads convert needs (it reads local files)."""
    out = p.draft.ref.partition("@")[0].rstrip("/").rsplit("/", 1)[-1] + "-speculators"
    command = ["specpair", "convert", pinned_ref(p.draft), out, "--to", "speculators", "--target", pinned_ref(p.target)]
    return [*(step for c in (p.draft, p.target) if (step := fetch_step(c))), shlex.join(command)]


@rule(
    "speculators.verifier",
    "error",
    ALL_STACKS,
    SPECULATORS_KINDS,
    title="A speculators-format drafter pins the target it was made for (speculators_config.verifier): name and architectures.",
    message="{draft} pins its verifier {verifier} ({architectures}), but {why}: it was made for another target (`vllm serve` on it loads {verifier}). Pair it with {verifier}, or re-pin it to this target.",
    example={"verifier": "Qwen/Qwen3-8B", "architectures": "Qwen3ForCausalLM", "why": "the target is Qwen/Qwen3-14B"},
    fix=_repin,
)
def _verifier(p: Pair, stack: str) -> Iterable[Values]:
    d = p.draft.drafter
    if d is None or d.verifier is None:
        return
    why = _mismatch(d.verifier, d.verifier_architectures, p.target)
    if why:
        yield {"verifier": d.verifier, "architectures": ", ".join(d.verifier_architectures) or "none named", "why": why}


@rule(
    "speculators.format",
    "error",
    HF_STACKS,
    SPECULATORS_KINDS,
    title="The stack reads the drafter's kind in the speculators format, or the config holds the kind's own keys beside.",
    message="{draft} is in vLLM's speculators format, which {stack} does not read for {title} drafters (it reads the drafter's own config: model_type, architectures, {block}), and its config does not hold those beside. Write the drafter in its own layout.",
    example={"title": "DFlash2", "block": "dflash_config"},
    fix=lambda p, stack: convert_command(p.draft, stack, "draft"),
)
def _format(p: Pair, stack: str) -> Iterable[Values]:
    d = p.draft.drafter
    row = p.kind_row
    if d is not None and d.verifier is not None and stack not in row.speculators.readers and not d.native_keys:
        yield {"title": row.title, "block": row.config_block}

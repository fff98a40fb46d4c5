"""Where the checkpoints came from: pinned revisions, custom code, pickle files, catalog data."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint import Checkpoint
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_KINDS, ALL_STACKS, Values, rule
from specpair.compat.stacks import ABBREVIATED, COMMIT

REMOTE_SOURCES = ("hub", "hf-cache", "catalog")


WHY_PIN = {
    "drafter": "drafter configs change between revisions of one repo (z-lab's Qwen3.6-35B-A3B-DFlash changed its "
    "layers, taps and mask id), and stacks have let a draft fall back to the target's revision (sglang#5255)",
    "target": "a branch can move to other weights or another config after this check, and what is served is "
    "then not what was checked",
}
RESOLVED_SOURCES = ("hub", "hf-cache")  # where `revision` is the commit a branch points to now


def pin_state(checkpoint: Checkpoint) -> tuple[str, str] | None:
    """(what the reference names, how to pin it) for a Hub checkpoint not pinned to a 40-hex commit; None when it is."""
    repo, at, asked = checkpoint.ref.partition("@")
    if checkpoint.source not in REMOTE_SOURCES or COMMIT.match(asked.lower()):
        return None
    known = checkpoint.revision if checkpoint.source in RESOLVED_SOURCES and checkpoint.revision else None
    if not at:
        state = "is not pinned to a commit" + (f" (main points to {known} now)" if known else "")
    elif ABBREVIATED.match(asked.lower()):
        state = f"names the abbreviated commit {asked}, not a full 40-hex one" + (f" ({known})" if known else "")
    else:
        state = f"names the branch or tag {asked!r}, not a commit" + (f" (it points to {known} now)" if known else "")
    if checkpoint.source == "catalog" and checkpoint.revision:
        state += f" (the built-in catalog describes revision {checkpoint.revision})"
        if COMMIT.match(checkpoint.revision):
            known = checkpoint.revision
    return state, f"{repo}@{known or '<40-hex commit>'}"


@rule(
    "revision.pinned",
    "warn",
    ALL_STACKS,
    ALL_KINDS,
    title="Hub checkpoints are pinned to a 40-hex commit, target and drafter each (a branch, tag or abbreviation is not a pin).",
    message="{name} {state}: {why}. Pin it as {pinned}.",
    example={
        "name": "z-lab/Qwen3.6-35B-A3B-DFlash@main",
        "state": "names the branch or tag 'main', not a commit (it points to 0123456789abcdef0123456789abcdef01234567 now)",
        "why": WHY_PIN["drafter"],
        "pinned": "z-lab/Qwen3.6-35B-A3B-DFlash@0123456789abcdef0123456789abcdef01234567",
    },
)
def _pinned(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint in p.checkpoints:
        found = pin_state(checkpoint)
        if found is not None:
            state, pinned = found
            why = WHY_PIN["drafter" if checkpoint.role == "drafter" else "target"]
            yield {"name": checkpoint.ref, "state": state, "why": why, "pinned": pinned}


@rule(
    "revision.tensorfold",
    "warn",
    ("tensorfold",),
    ALL_KINDS,
    title="TensorFold has no --revision: it serves whatever the default branch holds.",
    message="TensorFold has no --revision flag and serves {name} from its default branch (or the first cached snapshot): download the pinned revision first and pass the local directory.",
    example={"name": "z-lab/Qwen3.8-27B-DFlash2"},
)
def _tensorfold_revision(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint in p.checkpoints:
        if checkpoint.source in REMOTE_SOURCES and "@" in checkpoint.ref:
            yield {"name": checkpoint.ref}

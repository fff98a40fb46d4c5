"""TensorFold specifics: its drafter loader's one file."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules.format import draft_fix
from specpair.compat.rules.table import (
    BLOCK_DRAFTERS,
    Values,
    rule,
)


@rule(
    "tensorfold.single_file",
    "error",
    ("tensorfold",),
    BLOCK_DRAFTERS,
    title="TensorFold's drafter loader opens exactly one model.safetensors.",
    message="TensorFold opens exactly model.safetensors for a drafter, but {draft} stores its weights in {files}.",
    example={"files": "model-00001-of-00002.safetensors, model-00002-of-00002.safetensors"},
    fix=draft_fix,
)
def _single_file(p: Pair, stack: str) -> Iterable[Values]:
    shards = [f.path for f in p.draft.files if f.path.endswith(".safetensors")]
    if p.draft.format == "safetensors" and shards and shards != ["model.safetensors"]:
        yield {"files": ", ".join(shards)}

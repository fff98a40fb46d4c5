"""The mask token a block drafter fills its block with: a row of the target's embedding, not a stop token."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_STACKS,
    BLOCK_DRAFTERS,
    Values,
    rule,
)
from specpair.compat.rules.vocab import target_tokens


@rule(
    "mask.range",
    "error",
    ALL_STACKS,
    BLOCK_DRAFTERS,
    title="The mask token id is a row of the target's embedding table.",
    message='{draft} fills masked block slots with token {mask} (from {source}), but {target}\'s embedding has {rows} rows (0..{last}); {stack} cannot look it up ("mask_token_id is outside the target vocab size").',
    example={"mask": 248077, "source": "dflash_config.mask_token_id", "rows": 151936, "last": 151935},
)
def _mask_range(p: Pair, stack: str) -> Iterable[Values]:
    d = p.draft.drafter
    rows = p.target.shapes.rows
    if d and d.mask_token_id is not None and not 0 <= d.mask_token_id < rows:
        yield {"mask": d.mask_token_id, "source": d.mask_token_source, "rows": rows, "last": rows - 1}


@rule(
    "mask.padded_row",
    "info",
    ALL_STACKS,
    BLOCK_DRAFTERS,
    title="The mask token is a padded embedding row past the tokenizer (fine, if the padding is kept).",
    message="{draft}'s mask token {mask} lies past {target}'s tokenizer ({tokens} tokens) in its padded embedding rows: fine, as long as nothing trims the vocabulary to the tokenizer size.",
    example={"mask": 248077, "tokens": 248077},
)
def _mask_padded(p: Pair, stack: str) -> Iterable[Values]:
    d, tokens = p.draft.drafter, target_tokens(p)
    if d and d.mask_token_id is not None and tokens and tokens <= d.mask_token_id < p.target.shapes.rows:
        yield {"mask": d.mask_token_id, "tokens": tokens}


@rule(
    "mask.special",
    "warn",
    ALL_STACKS,
    BLOCK_DRAFTERS,
    title="The mask token is not also the target's end/pad token.",
    message="{draft}'s mask token {mask} is {target}'s {role} token: the reference generator strips every generated token equal to the mask id (dflash#73), and trainers that fall back to pad_token_id produce drafters with silently low acceptance (Automodel#2461).",
    example={"mask": 151643, "role": "pad"},
)
def _mask_special(p: Pair, stack: str) -> Iterable[Values]:
    d, t = p.draft.drafter, p.target.tokenizer
    if d is None or d.mask_token_id is None or t is None:
        return
    roles = {"end-of-sequence": t.eos_ids, "pad": [t.pad_id], "begin-of-sequence": [t.bos_id]}
    for role, ids in roles.items():
        if d.mask_token_id in ids:
            yield {"mask": d.mask_token_id, "role": role}
            return

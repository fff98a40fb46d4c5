"""The mask token a block drafter fills its block with: a row of the target's embedding, not a stop token; and the
learned mask embedding some drafters ship in its place, in a form each stack reads or not."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint.families import MASK_PICKLE, MASK_TENSOR, OWN_STACK
from specpair.checkpoint.hf import from_pickle_command
from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_STACKS,
    BLOCK_DRAFTERS,
    MASK_EMBEDDING_DRAFTERS,
    Values,
    rule,
)
from specpair.compat.rules.vocab import target_tokens
from specpair.compat.stacks import fetch_step


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


def _shipped(p: Pair) -> dict[str, str]:
    """Form (MASK_TENSOR, MASK_PICKLE) -> how the drafter ships its learned mask embedding in it, as a message
    names it."""
    d, row = p.draft.drafter, p.kind_row.mask_embedding
    if d is None or row is None:
        return {}
    shipped = {MASK_TENSOR: d.mask_embedding_shape is not None, MASK_PICKLE: d.mask_embedding_file is not None}
    return {form: f"{row.forms[form]!r} ({form})" for form, present in shipped.items() if present}


def _conversion(p: Pair, stack: str) -> list[str]:
    """specpair reads the tensor form: the commands that write the pickle as it (a Hub drafter downloaded first)."""
    shipped = _shipped(p)
    if stack != OWN_STACK or MASK_PICKLE not in shipped or MASK_TENSOR in shipped:
        return []
    return [step for step in (fetch_step(p.draft), from_pickle_command(p.draft.ref)) if step]


@rule(
    "mask.embedding_unread",
    "warn",
    ALL_STACKS,
    MASK_EMBEDDING_DRAFTERS,
    title="A learned mask embedding the drafter ships is in a form the stack reads.",
    message="{draft} ships a learned mask embedding as {shipped}, which {stack} does not read ({reads}): it drafts the masked slots with {target}'s embedding row of token {mask} instead, so acceptance understates the drafter (the output is unchanged){remedy}.",
    example={
        "shipped": "'mask_embedding.pt' (pickle)",
        "reads": "it reads the tensor 'mask_embedding'",
        "mask": 154856,
        "remedy": "; `specpair convert ./drafter drafter-safetensors --from-pickle` writes it as that tensor through torch's weights-only loader",
    },
)
def _mask_embedding_unread(p: Pair, stack: str) -> Iterable[Values]:
    shipped, serves, row = _shipped(p), p.serves(stack), p.kind_row.mask_embedding
    reads = serves.mask_embedding if serves else ()
    if not shipped or set(shipped) & set(reads):
        return
    steps = _conversion(p, stack)
    yield {
        "shipped": " and ".join(shipped.values()),
        "reads": " or ".join(f"it reads {row.forms[f]!r}" for f in reads) or "it reads none",
        "mask": p.draft.drafter.mask_token_id,
        "remedy": f"; `{' && '.join(steps)}` writes it as {row.tensor!r} through torch's weights-only loader"
        if steps
        else "",
    }


@rule(
    "mask.embedding",
    "info",
    ALL_STACKS,
    MASK_EMBEDDING_DRAFTERS,
    title="The stack drafts with the learned mask embedding the drafter ships.",
    message="{stack} fills {draft}'s masked slots with its learned mask embedding {form} in place of {target}'s embedding row of token {mask}.",
    example={"form": "'mask_embedding' (tensor)", "mask": 154856},
)
def _mask_embedding(p: Pair, stack: str) -> Iterable[Values]:
    shipped, serves = _shipped(p), p.serves(stack)
    read = [form for form in (serves.mask_embedding if serves else ()) if form in shipped]
    if read:
        yield {"form": shipped[read[0]], "mask": p.draft.drafter.mask_token_id}


@rule(
    "mask.embedding_shape",
    "error",
    ALL_STACKS,
    MASK_EMBEDDING_DRAFTERS,
    title="A shipped mask embedding tensor is one vector of the drafter's width.",
    message="{draft}'s mask embedding {name!r} is {shape}, where it is one vector [{hidden}] (the drafter's hidden_size): {stack} cannot put it in the block.",
    example={"name": "mask_embedding", "shape": [2, 4096], "hidden": 4096},
)
def _mask_embedding_shape(p: Pair, stack: str) -> Iterable[Values]:
    d, serves, hidden = p.draft.drafter, p.serves(stack), p.draft.shapes.hidden_size
    if d is None or d.mask_embedding_shape is None or not serves or MASK_TENSOR not in serves.mask_embedding:
        return
    if d.mask_embedding_shape not in ([hidden], [1, hidden]):
        yield {"name": p.kind_row.mask_embedding.tensor, "shape": d.mask_embedding_shape, "hidden": hidden}

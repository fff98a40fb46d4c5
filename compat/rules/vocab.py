"""Vocabulary: token identity, embedding rows (padding versus real tokens), reduced draft vocabularies (d2t)."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint.families import HEAD_IGNORED, HEAD_READ, HEAD_REFUSED
from specpair.checkpoint.tokenizer import shared_prefix_differences
from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_STACKS,
    BLOCK_DRAFTERS,
    REDUCED_VOCABULARY_DRAFTERS,
    SEPARATE_DRAFTERS,
    Values,
    rule,
)

LLAMA_CPP_MAX_VOCAB_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE in common/speculative.cpp


def target_tokens(p: Pair) -> int | None:
    return p.target.tokenizer.length if p.target.tokenizer else None


@rule(
    "vocab.tokens",
    "error",
    ALL_STACKS,
    SEPARATE_DRAFTERS,
    title="Draft and target tokenizers map the shared ids to the same strings.",
    message="{draft} and {target} tokenize differently: {detail}; drafted ids would decode to other text and almost never be accepted. Use a drafter built on {target}'s tokenizer.",
    example={"detail": "151669 vs 248077 tokens (tokenizer families qwen3 vs qwen3_5)"},
)
def _tokens(p: Pair, stack: str) -> Iterable[Values]:
    a, b = p.draft.tokenizer, p.target.tokenizer
    if a is None or b is None or (a.fingerprint and a.fingerprint == b.fingerprint):
        return
    differing = shared_prefix_differences(a, b)
    if differing:
        yield {"detail": f"{differing} of the {min(a.length, b.length)} shared ids map to different strings"}
    elif differing is None and a.family and b.family and a.family != b.family:
        yield {"detail": f"{a.length} vs {b.length} tokens (tokenizer families {a.family} vs {b.family})"}
    elif differing is None and a.length != b.length and not (a.family and a.family == b.family):
        yield {"detail": f"{a.length} vs {b.length} tokens, and no token lists to compare the shared ids"}


@rule(
    "vocab.extended",
    "warn",
    ALL_STACKS,
    SEPARATE_DRAFTERS,
    title="One tokenizer extends the other: same strings on the shared ids, extra tokens on one side.",
    message="{draft} ({draft_len} tokens) and {target} ({target_len} tokens) agree on every shared id, but ids {first}..{last} exist only in {longer}: text that uses them drafts poorly.",
    example={"draft_len": 151665, "target_len": 151669, "first": 151665, "last": 151668, "longer": "Qwen/Qwen3-8B"},
)
def _extended(p: Pair, stack: str) -> Iterable[Values]:
    a, b = p.draft.tokenizer, p.target.tokenizer
    if a is None or b is None or a.length == b.length or shared_prefix_differences(a, b) != 0:
        return
    longer = p.draft.ref if a.length > b.length else p.target.ref
    yield {
        "draft_len": a.length,
        "target_len": b.length,
        "first": min(a.length, b.length),
        "last": max(a.length, b.length) - 1,
        "longer": longer,
    }


@rule(
    "vocab.pretokenizer",
    "warn",
    ALL_STACKS,
    SEPARATE_DRAFTERS,
    title="Same tokens, but a different normalizer / pre-tokenizer (text splits differently).",
    message="{draft} and {target} share their tokens but split text differently (pre-tokenizer {draft_pre} vs {target_pre}): the draft sees other token boundaries than the target.",
    example={"draft_pre": "qwen2", "target_pre": "qwen35"},
)
def _pretokenizer(p: Pair, stack: str) -> Iterable[Values]:
    a, b = p.draft.tokenizer, p.target.tokenizer
    if a and b and a.fingerprint and a.fingerprint == b.fingerprint and a.source == b.source and a.pre != b.pre:
        yield {"draft_pre": a.pre, "target_pre": b.pre}


def _rows(p: Pair) -> tuple[int, int, int | None]:
    """(draft rows, target rows, target tokenizer length) — DFlash/EAGLE-3 read the target's table; a weights-only
    drafter, with no vocabulary of its own, is judged with its target's."""
    draft_rows = p.draft.shapes.rows if p.kind_row.plain else p.draft.shapes.vocab_size
    return draft_rows or p.target.shapes.rows, p.target.shapes.rows, target_tokens(p)


def _padding_only(p: Pair) -> bool:
    draft_rows, target_rows, tokens = _rows(p)
    if draft_rows == target_rows:
        return False
    if p.kind_row.plain:
        a, b = p.draft.tokenizer, p.target.tokenizer
        same = (
            a is not None
            and b is not None
            and (
                (a.fingerprint and a.fingerprint == b.fingerprint)
                or (a.family and a.family == b.family and a.length == b.length)
            )
        )
        return bool(same) and min(draft_rows, target_rows) >= a.length
    return tokens is not None and draft_rows >= tokens


@rule(
    "vocab.rows",
    "error",
    ALL_STACKS,
    SEPARATE_DRAFTERS,
    title="The drafter's vocabulary covers every real token of the target (a difference beyond padding rows).",
    message="{draft} has a vocabulary of {draft_rows} rows but {target} has {target_rows} ({tokens} real tokens): {reason}; this drafter was trained for another vocabulary.",
    example={
        "draft_rows": 151936,
        "target_rows": 248320,
        "tokens": 248077,
        "reason": "ids 151936 and above cannot be drafted or embedded",
    },
)
def _vocab_rows(p: Pair, stack: str) -> Iterable[Values]:
    draft_rows, target_rows, tokens = _rows(p)
    if draft_rows == target_rows or _padding_only(p):
        return
    if p.kind_row.plain and p.draft.tokenizer and p.target.tokenizer:
        return  # vocab.tokens speaks for tokenizer differences of draft models
    reason = (
        f"ids {draft_rows} and above cannot be drafted or embedded"
        if draft_rows < target_rows
        else "its rows index another token table"
    )
    yield {"draft_rows": draft_rows, "target_rows": target_rows, "tokens": tokens or "unknown", "reason": reason}


@rule(
    "vocab.padding",
    "warn",
    ALL_STACKS,
    SEPARATE_DRAFTERS,
    title="Embedding rows differ only by padding past the tokenizer: fine, reported with the numbers.",
    message="{draft} has {draft_rows} vocabulary rows and {target} {target_rows}, but the tokenizer has {tokens} tokens, so only padding rows differ ({difference}); keep the target's padded rows (never trim them) — vLLM before #46435 dropped acceptance to 0 on exactly this.",
    example={"draft_rows": 152064, "target_rows": 152576, "tokens": 151665, "difference": 512},
)
def _padding(p: Pair, stack: str) -> Iterable[Values]:
    if _padding_only(p):
        draft_rows, target_rows, tokens = _rows(p)
        tokens = tokens if not p.kind_row.plain else p.draft.tokenizer.length
        yield {
            "draft_rows": draft_rows,
            "target_rows": target_rows,
            "tokens": tokens,
            "difference": abs(target_rows - draft_rows),
        }


@rule(
    "vocab.rows_equal",
    "error",
    ("vllm", "tensorfold", "llama.cpp"),
    SEPARATE_DRAFTERS,
    title="Stacks that demand equal vocabulary sizes even when only padding differs.",
    message="{stack} requires {requirement}; {draft} has {draft_rows} and {target} {target_rows}.",
    example={
        "requirement": "a draft model's vocab_size to equal the target's (allow_draft_model_vocab_padding is not in 0.33)",
        "draft_rows": 151936,
        "target_rows": 152064,
    },
)
def _rows_equal(p: Pair, stack: str) -> Iterable[Values]:
    draft_rows, target_rows, _ = _rows(p)
    if draft_rows == target_rows:
        return
    values = {"draft_rows": draft_rows, "target_rows": target_rows}
    if stack == "vllm" and p.kind_row.plain:
        yield {
            **values,
            "requirement": "a draft model's vocab_size to equal the target's (vllm#7252; allow_draft_model_vocab_padding is only proposed, vllm#42775)",
        }
    elif stack == "tensorfold" and p.kind in BLOCK_DRAFTERS:
        yield {**values, "requirement": '"drafter vocab_size must match the target\'s vocab_size"'}
    elif stack == "llama.cpp" and p.kind_row.plain and abs(draft_rows - target_rows) > LLAMA_CPP_MAX_VOCAB_DIFFERENCE:
        yield {
            **values,
            "requirement": f"draft and target vocabularies to differ by at most {LLAMA_CPP_MAX_VOCAB_DIFFERENCE} tokens",
        }


@rule(
    "vocab.d2t",
    "error",
    ALL_STACKS,
    REDUCED_VOCABULARY_DRAFTERS,
    title="A reduced-vocabulary EAGLE-3 head ships its d2t map to target ids.",
    message="{draft} drafts over {draft_vocab} ids, fewer than {target}'s {rows}, but has no d2t tensor to map them to target ids.",
    example={"draft_vocab": 32000, "rows": 151936},
)
def _d2t(p: Pair, stack: str) -> Iterable[Values]:
    d = p.draft.drafter
    if (
        d
        and d.draft_vocab_size
        and d.draft_vocab_size < p.target.shapes.rows
        and not d.has_d2t
        and p.draft.format != "config-only"
    ):
        yield {"draft_vocab": d.draft_vocab_size, "rows": p.target.shapes.rows}


@rule(
    "vocab.draft_head",
    "error",
    ALL_STACKS,
    BLOCK_DRAFTERS,
    title="A block drafter that ships a head of its own runs where the stack drafts through that head.",
    message="{draft} ships a head of its own ({head}); {stack} {treatment}.",
    example={
        "head": "lm_head of 32000 rows and d2t, where sglang-target has 151936",
        "rows": 32000,
        "treatment": "drafts DFlash through sglang-target's lm_head and skips this one: the drafter's features read through a head they were not trained for are rarely accepted (vllm-ascend#11374: 25 % to 1.7 %); vllm, llama.cpp draft through it",
    },
)
def _draft_head(p: Pair, stack: str) -> Iterable[Values]:
    d, serves, rows = p.draft.drafter, p.serves(stack), p.target.shapes.rows
    if d is None or serves is None or serves.draft_head not in (HEAD_REFUSED, HEAD_IGNORED):
        return
    reduced = d.has_d2t or (d.head_rows is not None and d.head_rows != rows)
    # a speculators drafter's full head is the verifier's copy (its converter writes one in), not a head of its own
    shipped = d.head_rows is not None and not (d.verifier is not None and d.head_rows == rows)
    # where the stack skips it, a full head may be the target's own copy: only a reduced one is surely not
    if not (reduced or (shipped and serves.draft_head == HEAD_REFUSED)):
        return
    title, target = p.kind_row.title, p.target.ref
    if serves.draft_head == HEAD_REFUSED:
        treatment = f"drafts {title} through {target}'s lm_head only, and `run` refuses to load it"
    else:
        readers = [s for s, row in p.kind_row.serving.items() if row.draft_head == HEAD_READ]
        treatment = (
            f"drafts {title} through {target}'s lm_head and skips this one: the drafter's features read through a "
            "head they were not trained for are rarely accepted (vllm-ascend#11374: 25 % to 1.7 %)"
            + (f"; {', '.join(readers)} draft through it" if readers else "")
        )
    parts = [f"lm_head of {d.head_rows} rows" if d.head_rows is not None else None, "d2t" if d.has_d2t else None]
    head = " and ".join(part for part in parts if part) + f", where {target} has {rows}"
    yield {"head": head, "rows": d.head_rows, "treatment": treatment}

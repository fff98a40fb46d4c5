"""Tokenizer identity, computed the same way from tokenizer.json and from a GGUF's token lists.

The fingerprint hashes what speculative decoding depends on: the token string of every id, in id
order, and the BPE merges in order. tokenizer.json (`model.vocab` + `added_tokens`) and GGUF
(`tokenizer.ggml.tokens`, with llama.cpp's `[PAD{i}]` filler rows dropped) give the same list for the
same tokenizer, so a GGUF drafter can be compared with a safetensors target. Pre-tokenizer and
chat-template identity are reported beside it; they differ in form between the two sources.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from operator import eq

import orjson

from specpair.errors import BadInput
from specpair.formats import MAX_JSON_DEPTH, brief, nests_deeper_than

MAX_TOKENS = 10_000_000
# Real vocabularies are dense: a largest id past twice the tokens listed plus SPARE_IDS is refused, so one
# id of 9,999,999 in a small file cannot cost an 80 MB id table.
SPARE_IDS = 65_536
GGUF_TOKEN_CONTROL = 3
GGUF_TOKEN_UNUSED = 5


@dataclass
class Tokenizer:
    """A tokenizer as far as pairing needs it. `tokens` stays in memory only, for exact prefix checks."""

    length: int
    source: str
    fingerprint: str | None = None
    merges: int = 0
    special_ids: list[int] = field(default_factory=list)
    bos_id: int | None = None
    eos_ids: list[int] = field(default_factory=list)
    pad_id: int | None = None
    pre: str | None = None
    chat_template_sha256: str | None = None
    family: str | None = None
    tokens: list[str] | None = field(default=None, repr=False, compare=False)
    # `tokens` as JSON, when another process parsed the tokenizer (sources/child.py): parsed on first use.
    tokens_json: bytes | None = field(default=None, repr=False, compare=False)
    # Where `tokens` come from when first needed (a cached Checkpoint keeps them in a file of their own).
    load_tokens: Callable[[], list[str] | None] | None = field(default=None, repr=False, compare=False)

    def token_list(self) -> list[str] | None:
        if self.tokens is None and self.tokens_json is not None:
            self.tokens, self.tokens_json = orjson.loads(self.tokens_json), None
        if self.tokens is None and self.load_tokens is not None:
            self.tokens, self.load_tokens = self.load_tokens(), None
        return self.tokens

    def token_list_json(self) -> bytes | None:
        """The token list as JSON, without parsing it when that is how it came."""
        if self.tokens_json is not None:
            return self.tokens_json
        return orjson.dumps(self.tokens) if self.tokens is not None else None

    def to_bytes(self) -> bytes:
        """Every field and the token list, for another process (`from_bytes`): one line of fields, then the tokens."""
        summary = {f.name: getattr(self, f.name) for f in fields(self) if f.compare}
        return orjson.dumps(summary) + b"\n" + (self.token_list_json() or b"null")

    @classmethod
    def from_bytes(cls, data: bytes) -> Tokenizer:
        summary, _, tokens = data.partition(b"\n")  # orjson writes no raw newline
        return cls(**orjson.loads(summary), tokens_json=None if tokens == b"null" else tokens)


def fingerprint(tokens: list[str], merges: list[str]) -> str:
    """sha256 of the canonical JSON [tokens in id order, merges in order] (orjson: ~10 ms for 248k tokens)."""
    return hashlib.sha256(orjson.dumps([tokens, merges])).hexdigest()


def from_tokenizer_json(
    raw: bytes, where: str, tokenizer_config: dict | None, generation_config: dict | None, chat_template: str | None
) -> Tokenizer:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadInput(where, f"not valid JSON ({e})") from None
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict):
        raise BadInput(where, "no 'model' object")
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], id = position
        if not all(isinstance(e, list) and e and isinstance(e[0], str) for e in vocab):
            raise BadInput(where, "model.vocab is a list but not of [piece, score] pairs")
        vocab = {e[0]: i for i, e in enumerate(vocab)}
    if not isinstance(vocab, dict):
        raise BadInput(where, "model.vocab is neither an object nor a list")
    added = doc.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(e, dict) and isinstance(e.get("content"), str) for e in added):
        raise BadInput(where, "added_tokens is not a list of objects with a string 'content'")
    added_ids = {e["content"]: e.get("id") for e in added}
    every_added_id = [e.get("id") for e in added]  # a content listed twice keeps one id above; check both
    vocab_ids = list(vocab.values())
    in_order = all(map(eq, vocab_ids, range(len(vocab_ids))))  # the usual file: in id order (no id table built)
    table: list[str] = []
    try:  # ids must be non-negative ints: max/min and list indexing raise TypeError on anything else
        top = len(vocab_ids) - 1 if in_order else max(vocab_ids, default=-1)
        length = max(top, max(every_added_id, default=-1)) + 1
        low = 0 if in_order else min(vocab_ids, default=0)
        if min(low, min(every_added_id, default=0)) < 0 or length > MAX_TOKENS:
            raise TypeError
        listed = len(vocab) + len(added)
        if length > 2 * listed + SPARE_IDS:
            raise BadInput(where, f"token ids run up to {length - 1}, but only {listed} tokens are listed")
        if in_order:
            table = list(vocab) + [""] * (length - len(vocab_ids))
        else:
            table = [""] * length
            for token, i in vocab.items():
                table[i] = token
        for token, i in added_ids.items():
            table[i] = token
    except (TypeError, RecursionError):  # comparing ids that are deeply nested lists recurses
        raise BadInput(where, f"a token id is not an integer in 0..{MAX_TOKENS - 1}") from None
    tokens = table
    merges = model.get("merges") or []
    if not isinstance(merges, list):
        _bad_merges(where)
    if set(map(type, merges)) - {str}:  # newer tokenizers store merges as ["a", "b"] pairs
        merges = [_merge(m, where) for m in merges]
    special = sorted(e["id"] for e in added if e.get("special"))
    pipeline = {k: doc.get(k) for k in ("normalizer", "pre_tokenizer", "decoder")}
    if nests_deeper_than(pipeline, MAX_JSON_DEPTH):
        raise BadInput(where, f"normalizer, pre_tokenizer or decoder nests deeper than {MAX_JSON_DEPTH} levels")
    pipeline_sha = hashlib.sha256(orjson.dumps(pipeline, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    config = tokenizer_config or {}
    template = chat_template if chat_template is not None else config.get("chat_template")

    def id_of(value: object) -> int | None:
        if isinstance(value, dict):  # {"content": "<|im_end|>", ...} in older tokenizer_config files
            value = value.get("content")
        return added_ids.get(value, vocab.get(value)) if isinstance(value, str) else None

    bos, eos, pad = (id_of(config.get(k)) for k in ("bos_token", "eos_token", "pad_token"))
    eos_ids = _id_list((generation_config or {}).get("eos_token_id")) or ([eos] if eos is not None else [])
    return Tokenizer(
        length=length,
        source="tokenizer.json",
        fingerprint=fingerprint(tokens, merges),
        merges=len(merges),
        special_ids=special,
        bos_id=bos,
        eos_ids=eos_ids,
        pad_id=pad,
        pre=f"pipeline:{pipeline_sha}",
        chat_template_sha256=_sha256_text(template),
        tokens=tokens,
    )


def from_gguf_fields(fields: dict[str, object], where: str) -> Tokenizer | None:
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return None
    if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
        raise BadInput(where, "tokenizer.ggml.tokens is not a list of strings")
    types = fields.get("tokenizer.ggml.token_type") or []
    if not isinstance(types, list) or (types and len(types) != len(tokens)):
        raise BadInput(where, "tokenizer.ggml.token_type does not match tokenizer.ggml.tokens")
    length = len(tokens)
    # llama.cpp pads the token list up to the embedding rows with unused "[PAD{i}]" entries.
    while (
        length and tokens[length - 1] == f"[PAD{length - 1}]" and (not types or types[length - 1] == GGUF_TOKEN_UNUSED)
    ):
        length -= 1
    token_strings = tokens[:length]
    merges = fields.get("tokenizer.ggml.merges") or []
    if not (isinstance(merges, list) and all(isinstance(m, str) for m in merges)):
        raise BadInput(where, "tokenizer.ggml.merges is not a list of strings")
    special = [i for i, t in enumerate(types[:length]) if t == GGUF_TOKEN_CONTROL]
    eos = _int_or_none(fields.get("tokenizer.ggml.eos_token_id"))
    eot = _int_or_none(fields.get("tokenizer.ggml.eot_token_id"))
    return Tokenizer(
        length=length,
        source="gguf",
        fingerprint=fingerprint(token_strings, merges),
        merges=len(merges),
        special_ids=special,
        bos_id=_int_or_none(fields.get("tokenizer.ggml.bos_token_id")),
        eos_ids=[i for i in dict.fromkeys([eos, eot]) if i is not None],
        pad_id=_int_or_none(fields.get("tokenizer.ggml.padding_token_id")),
        pre=_str_or_none(fields.get("tokenizer.ggml.pre")),
        chat_template_sha256=_sha256_text(fields.get("tokenizer.chat_template")),
        tokens=token_strings,
    )


def shared_prefix_differences(a: Tokenizer, b: Tokenizer) -> int | None:
    """How many ids below min(length) map to different strings; None when either token list is unknown."""
    tokens_a, tokens_b = a.token_list(), b.token_list()
    if tokens_a is None or tokens_b is None:
        return None
    return sum(x != y for x, y in zip(tokens_a, tokens_b))


def _bad_merges(where: str) -> list[str]:
    raise BadInput(where, "model.merges is not a list")


def _merge(value: object, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return f"{value[0]} {value[1]}"
    raise BadInput(where, f"merge {brief(value)} is neither 'a b' nor ['a', 'b']")


def _id_list(value: object) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _sha256_text(text: object) -> str | None:
    if isinstance(text, list):  # tokenizer_config may hold named templates: [{"name", "template"}]
        text = orjson.dumps(text, option=orjson.OPT_SORT_KEYS).decode()
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest() if isinstance(text, str) else None

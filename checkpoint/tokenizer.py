"""Tokenizer identity, computed the same way from tokenizer.json and from a GGUF's token lists.

The fingerprint hashes what speculative decoding depends on: the token string of every id, in id
order, and the BPE merges in order. tokenizer.json (`model.vocab` + `added_tokens`) and GGUF
(`tokenizer.ggml.tokens`, with llama.cpp's `[PAD{i}]` filler rows dropped) give the same list for the
same tokenizer, so a GGUF drafter can be compared with a safetensors target. Pre-tokenizer and
chat-template identity are reported beside it; they differ in form between the two sources.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from specpair.errors import BadInput

MAX_TOKENS = 10_000_000
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
    tokens: tuple[bytes, ...] | None = field(default=None, repr=False, compare=False)


def fingerprint(tokens: list[bytes] | tuple[bytes, ...], merges: list[str]) -> str:
    h = hashlib.sha256()
    for token in tokens:
        h.update(len(token).to_bytes(4, "little"))
        h.update(token)
    h.update(b"\xff" * 4)
    for merge in merges:
        data = merge.encode("utf-8", "surrogateescape")
        h.update(len(data).to_bytes(4, "little"))
        h.update(data)
    return h.hexdigest()


def from_tokenizer_json(raw: bytes, where: str, tokenizer_config: dict | None, generation_config: dict | None,
                        chat_template: str | None) -> Tokenizer:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(where, f"not valid JSON ({e})") from None
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict):
        raise BadInput(where, "no 'model' object")
    by_id: dict[int, str] = {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        for token, i in vocab.items():
            by_id[_token_id(i, where)] = token
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], id = position
        for i, entry in enumerate(vocab):
            if not (isinstance(entry, list) and entry and isinstance(entry[0], str)):
                raise BadInput(where, f"model.vocab[{i}] is not [piece, score]")
            by_id[i] = entry[0]
    else:
        raise BadInput(where, "model.vocab is neither an object nor a list")
    special = []
    added = doc.get("added_tokens") or []
    if not isinstance(added, list):
        raise BadInput(where, "added_tokens is not a list")
    for entry in added:
        if not (isinstance(entry, dict) and isinstance(entry.get("content"), str)):
            raise BadInput(where, "an added_tokens entry has no string 'content'")
        i = _token_id(entry.get("id"), where)
        by_id[i] = entry["content"]
        if entry.get("special"):
            special.append(i)
    length = max(by_id) + 1 if by_id else 0
    if length > MAX_TOKENS:
        raise BadInput(where, f"token id {length - 1} is out of range")
    tokens = tuple(by_id.get(i, "").encode("utf-8", "surrogateescape") for i in range(length))
    merges = [_merge(m, where) for m in model.get("merges") or []]
    pipeline = {k: doc.get(k) for k in ("normalizer", "pre_tokenizer", "decoder")}
    pipeline_sha = hashlib.sha256(json.dumps(pipeline, sort_keys=True).encode()).hexdigest()[:16]
    ids = {token: i for i, token in by_id.items()}
    config = tokenizer_config or {}
    template = chat_template if chat_template is not None else config.get("chat_template")
    bos, eos, pad = (_special_id(config.get(k), ids) for k in ("bos_token", "eos_token", "pad_token"))
    eos_ids = _id_list((generation_config or {}).get("eos_token_id")) or ([eos] if eos is not None else [])
    return Tokenizer(
        length=length, source="tokenizer.json", fingerprint=fingerprint(tokens, merges), merges=len(merges),
        special_ids=sorted(special), bos_id=bos, eos_ids=eos_ids, pad_id=pad, pre=f"pipeline:{pipeline_sha}",
        chat_template_sha256=_sha256_text(template), tokens=tokens,
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
    while length and tokens[length - 1] == f"[PAD{length - 1}]" and (not types or types[length - 1] == GGUF_TOKEN_UNUSED):
        length -= 1
    token_bytes = tuple(t.encode("utf-8", "surrogateescape") for t in tokens[:length])
    merges = fields.get("tokenizer.ggml.merges") or []
    if not (isinstance(merges, list) and all(isinstance(m, str) for m in merges)):
        raise BadInput(where, "tokenizer.ggml.merges is not a list of strings")
    special = [i for i, t in enumerate(types[:length]) if t == GGUF_TOKEN_CONTROL]
    eos = _int_or_none(fields.get("tokenizer.ggml.eos_token_id"))
    eot = _int_or_none(fields.get("tokenizer.ggml.eot_token_id"))
    return Tokenizer(
        length=length, source="gguf", fingerprint=fingerprint(token_bytes, merges), merges=len(merges),
        special_ids=special, bos_id=_int_or_none(fields.get("tokenizer.ggml.bos_token_id")),
        eos_ids=[i for i in dict.fromkeys([eos, eot]) if i is not None],
        pad_id=_int_or_none(fields.get("tokenizer.ggml.padding_token_id")),
        pre=_str_or_none(fields.get("tokenizer.ggml.pre")),
        chat_template_sha256=_sha256_text(fields.get("tokenizer.chat_template")), tokens=token_bytes,
    )


def shared_prefix_differences(a: Tokenizer, b: Tokenizer) -> int | None:
    """How many ids below min(length) map to different strings; None when either token list is unknown."""
    if a.tokens is None or b.tokens is None:
        return None
    return sum(x != y for x, y in zip(a.tokens, b.tokens))


def _token_id(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_TOKENS:
        raise BadInput(where, f"token id {value!r} is not an integer in range")
    return value


def _merge(value: object, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return f"{value[0]} {value[1]}"
    raise BadInput(where, f"merge {value!r} is neither 'a b' nor ['a', 'b']")


def _special_id(value: object, ids: dict[str, int]) -> int | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", ...} in older tokenizer_config files
        value = value.get("content")
    return ids.get(value) if isinstance(value, str) else None


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
        text = json.dumps(text, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest() if isinstance(text, str) else None

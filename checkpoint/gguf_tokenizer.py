"""The tokenizer both ways between Hugging Face files (tokenizer.json and its configs) and GGUF `tokenizer.*` keys.

Byte-level BPE (`tokenizer.ggml.model = "gpt2"`: Qwen3, Qwen3.5/3.6, SmolLM2, Llama 3) converts both ways;
SentencePiece (`"llama"`: Llama 2, Mistral, TinyLlama) converts GGUF -> HF only, as transformers reads it.
HF -> GGUF writes what llama.cpp's converter writes (conversion/base.py get_vocab_base and _set_vocab_gpt2,
gguf-py SpecialVocab): tokens in id order padded with "[PAD{i}]" rows of type UNUSED, added tokens CONTROL
when special or shaped like one, USER_DEFINED otherwise, merges as "a b", special ids and the chat template.

llama.cpp names the pre-tokenizer (`tokenizer.ggml.pre`) by hashing the ids of a probe text, which needs the
tokenizers library. We name it by what decides pre-tokenization instead: the normalizer and pre_tokenizer
JSON of tokenizer.json, canonicalized and looked up in PRE_TOKENIZERS; the same table gives the JSON back
for GGUF -> HF. The token strings and merges pass through unchanged both ways, so the fingerprint of
checkpoint/tokenizer.py is the same on either side.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from gguf.constants import GGUFValueType, TokenType

from specpair.checkpoint.tokenizer import MAX_TOKENS, SPARE_IDS, from_gguf_fields, from_tokenizer_json
from specpair.errors import BadInput
from specpair.formats import brief

Field = tuple[str, object, GGUFValueType]

# The regexes as the models' tokenizer.json files spell them (llama.cpp src/llama-vocab.cpp quotes each).
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN35_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# llama.cpp's "default" applies these one after the other, each splitting the pieces the last one left.
DEFAULT_SPLITS = (
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
)

NFC = {"type": "NFC"}
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
GPT2_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


def _split(*regexes: str) -> dict[str, Any]:
    """Regex splits (matches kept as pieces), then byte-level encoding, as the Qwen and Llama 3 files write it."""
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in regexes]
    return {"type": "Sequence", "pretokenizers": [*splits, BYTE_LEVEL]}


@dataclass(frozen=True)
class PreTokenizer:
    """A llama.cpp pre-tokenizer name and the tokenizer.json pieces that behave as it does.

    `normalizers` are the ones recognized with `pre_tokenizer`, the first is the one written: llama.cpp
    normalizes nothing, so a Qwen file's NFC and no normalizer at all (transformers' GGUF loader) give the
    same ids on NFC text. `ignore_merges`, `add_bos` and `clean_spaces` are what llama.cpp sets for the name
    (llama-vocab.cpp); `add_bos` only counts where a GGUF has no add_bos_token key, `clean_spaces` is
    transformers' clean_up_tokenization_spaces (decoding only).
    """

    name: str
    pre_tokenizer: dict[str, Any]
    normalizers: tuple[dict[str, Any] | None, ...] = (None,)
    ignore_merges: bool = False
    add_bos: bool = False
    clean_spaces: bool = False
    aliases: tuple[str, ...] = ()  # other names llama.cpp gives exactly the same behaviour
    # The regex transformers' GGUF loader splits with for the name (GGUF_PRE_TOKENIZER_SPLITS); None: GPT-2's own.
    transformers_split: str | None = None


PRE_TOKENIZERS = (
    PreTokenizer(
        "qwen2", _split(QWEN2_SPLIT), (NFC, None), aliases=("deepseek-r1-qwen",), transformers_split=QWEN2_SPLIT
    ),  # Qwen2, Qwen3
    PreTokenizer(
        "qwen35", _split(QWEN35_SPLIT), (NFC, None), transformers_split=QWEN35_SPLIT
    ),  # Qwen3.5 / 3.6: marks (\p{M}) stay with letters
    PreTokenizer(
        "llama-bpe",
        _split(LLAMA3_SPLIT),
        ignore_merges=True,
        add_bos=True,
        clean_spaces=True,
        aliases=("llama3", "llama-v3"),
        transformers_split=LLAMA3_SPLIT,
    ),  # Llama 3.x: digits in threes
    PreTokenizer(
        "smollm",
        {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, GPT2_BYTE_LEVEL]},
    ),  # SmolLM / SmolLM2
    PreTokenizer("gpt-2", GPT2_BYTE_LEVEL, clean_spaces=True),  # GPT-2's own regex inside ByteLevel
    PreTokenizer("default", _split(*DEFAULT_SPLITS), clean_spaces=True),  # what llama.cpp runs for unknown files
)


def _canonical(normalizer: object, pre_tokenizer: object) -> bytes:
    """The JSON that decides pre-tokenization, without ByteLevel's trim_offsets (it moves offsets, not ids)."""

    def strip(node: object) -> object:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "trim_offsets"}
        return [strip(v) for v in node] if isinstance(node, list) else node

    return orjson.dumps([strip(normalizer), strip(pre_tokenizer)], option=orjson.OPT_SORT_KEYS)


_BY_JSON = {_canonical(n, p.pre_tokenizer): p for p in PRE_TOKENIZERS for n in p.normalizers}
_BY_NAME = {name: p for p in PRE_TOKENIZERS for name in (p.name, *p.aliases)}
_DEFAULT = _BY_NAME["default"]

GGML = "tokenizer.ggml."  # every tokenizer key but tokenizer.chat_template
_SPECIAL_KEYS = (
    ("bos_token", "bos_token_id"),
    ("eos_token", "eos_token_id"),
    ("unk_token", "unknown_token_id"),
    ("pad_token", "padding_token_id"),
)  # tokenizer_config key -> GGUF key, in llama.cpp's order
# llama.cpp's does_token_look_special: added tokens it makes CONTROL though their files do not flag them special.
LOOK_SPECIAL_NAMES = frozenset({"<pad>", "<mask>", "<2mass>", "[@BOS@]"})
LOOK_SPECIAL_SHAPES = (("<|", "|>"), ("<｜", "｜>"), ("<unused", ">"))  # (start, end)
_TOKEN_TYPES = frozenset(int(t) for t in TokenType) | {0}  # 0: LLAMA_TOKEN_TYPE_UNDEFINED


@dataclass(frozen=True)
class GGUFTokenizer:
    """`tokenizer.*` keys for a GGUF as (key, value, type) triples, in the order llama.cpp writes them.

    Arrays are typed ARRAY; GGUFWriter.add_key_value infers their elements (strings, INT32 token types), as
    add_array does. `notes` says what llama.cpp will not reproduce exactly, one line each, for the caller to print.
    """

    fields: list[Field]
    pre: str
    notes: tuple[str, ...] = ()


def gguf_tokenizer_fields(
    tokenizer_json: bytes,
    tokenizer_config: dict | None,
    generation_config: dict | None,
    chat_template: str | None,
    vocab_size: int | None,
    where: str,
) -> GGUFTokenizer:
    """GGUF tokenizer keys from tokenizer.json and its configs; `vocab_size` (embedding rows) pads the token list.

    `chat_template` (chat_template.jinja) wins over tokenizer_config's. Special ids come from tokenizer_config,
    then generation_config, as llama.cpp takes them from tokenizer_config, then config.json.
    """
    table = from_tokenizer_json(tokenizer_json, where, tokenizer_config, generation_config, chat_template).tokens or []
    doc = orjson.loads(tokenizer_json)  # valid: from_tokenizer_json parsed and checked it
    model = doc["model"]
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise BadInput(
            where,
            f"model.type {brief(model.get('type'))}: only byte-level BPE converts to GGUF "
            "(SentencePiece/Unigram and WordPiece vocabularies are not supported)",
        )
    if "ByteLevel" not in _types_in(doc.get("pre_tokenizer")):
        raise BadInput(
            where,
            "a BPE without a ByteLevel pre-tokenizer (SentencePiece-style) does not convert to "
            "GGUF's byte-level 'gpt2' model",
        )
    added = {e["id"]: e for e in doc.get("added_tokens") or []}
    present = set(model["vocab"].values()) | set(added)
    tokens = [t if i in present else f"[PAD{i}]" for i, t in enumerate(table)]
    ids = _unique_ids(tokens, where, "added_tokens")
    types = [
        _added_type(added[i]) if i in added else TokenType.NORMAL if i in present else TokenType.UNUSED
        for i in range(len(tokens))
    ]
    rows = len(tokens) if vocab_size is None else vocab_size
    if type(rows) is not int or not len(tokens) <= rows <= min(MAX_TOKENS, 2 * len(tokens) + SPARE_IDS):
        raise BadInput(where, f"vocab_size {brief(vocab_size)} does not fit the tokenizer's {len(tokens)} ids")
    tokens += [f"[PAD{i}]" for i in range(len(tokens), rows)]
    types += [TokenType.UNUSED] * (rows - len(types))
    merges = _merge_strings(model.get("merges") or [], where)
    _check_merges(merges, ids, where, "model.merges")
    if not merges:
        raise BadInput(where, "model.merges is empty: llama.cpp cannot load a BPE vocabulary without merges")

    notes = []
    pipeline = _canonical(doc.get("normalizer"), doc.get("pre_tokenizer"))
    pre = _BY_JSON.get(pipeline)
    if pre is None:
        pipeline_sha = hashlib.sha256(pipeline).hexdigest()[:16]
        notes.append(
            f"the normalizer and pre_tokenizer of tokenizer.json (sha256 {pipeline_sha}) match no "
            "pre-tokenizer llama.cpp names; wrote 'default', so llama.cpp may split text differently"
        )
        pre = _DEFAULT
    if bool(model.get("ignore_merges")) != pre.ignore_merges:
        notes.append(
            f"tokenizer.json has ignore_merges={bool(model.get('ignore_merges'))}, llama.cpp's "
            f"'{pre.name}' has {pre.ignore_merges}: a word that is a whole token may split differently"
        )

    config, generation = tokenizer_config or {}, generation_config or {}
    fields: list[Field] = [
        (GGML + "model", "gpt2", GGUFValueType.STRING),
        (GGML + "pre", pre.name, GGUFValueType.STRING),
        (GGML + "tokens", tokens, GGUFValueType.ARRAY),
        (GGML + "token_type", [int(t) for t in types], GGUFValueType.ARRAY),
        (GGML + "merges", merges, GGUFValueType.ARRAY),
    ]
    for config_key, gguf_key in _SPECIAL_KEYS:
        token_id = _config_token_id(config.get(config_key), ids, config_key, notes)
        if token_id is None:
            token_id = _generation_id(generation.get(f"{config_key}_id"), len(table), config_key, where)
        if token_id is not None:
            fields.append((GGML + gguf_key, token_id, GGUFValueType.UINT32))
    add_bos, add_eos = _adds_special(config, doc.get("post_processor"), notes)
    fields += [
        (GGML + "add_bos_token", add_bos, GGUFValueType.BOOL),
        (GGML + "add_eos_token", add_eos, GGUFValueType.BOOL),
    ]
    template = chat_template if chat_template is not None else _config_template(config.get("chat_template"), notes)
    if template is not None:
        fields.append(("tokenizer.chat_template", template, GGUFValueType.STRING))
    return GGUFTokenizer(fields, pre.name, tuple(notes))


def hf_tokenizer_files(
    fields: dict[str, object], where: str, reader: Literal["llama.cpp", "transformers"] = "llama.cpp"
) -> dict[str, bytes]:
    """tokenizer.json, tokenizer_config.json, generation_config.json and chat_template.jinja (transformers 5's
    layout) from a GGUF's `tokenizer.*` keys, by file name.

    `reader` is whose reading of a byte-level ('gpt2') vocabulary the files reproduce: llama.cpp's (convert's;
    "[PAD{i}]" filler rows left out) or transformers' `AutoTokenizer.from_pretrained(dir, gguf_file=...)` (the
    runtime's; see _as_transformers_reads). A SentencePiece ('llama') vocabulary is always read as transformers
    reads it: a BPE over the pieces, which llama.cpp's score-driven merging does not promise to equal.
    """
    model = fields.get(GGML + "model")
    if model == "llama" or (model == "gpt2" and reader == "transformers"):
        return _as_transformers_reads(fields, model, where)
    if model != "gpt2":
        raise BadInput(
            where,
            f"{GGML}model {brief(model)}: only byte-level BPE ('gpt2') and SentencePiece "
            "('llama') convert to tokenizer.json",
        )
    parsed = from_gguf_fields(fields, where)  # checks tokens and merges are strings, types as many as tokens
    if parsed is None:
        raise BadInput(where, f"{GGML}model is 'gpt2' but the file has no {GGML}tokens")
    tokens = parsed.tokens or []
    types = fields.get(GGML + "token_type") or [int(TokenType.NORMAL)] * len(tokens)
    if not all(type(t) is int and t in _TOKEN_TYPES for t in types):
        raise BadInput(where, f"{GGML}token_type holds a value that is not a token type (0..6)")
    ids = _unique_ids(tokens, where, f"{GGML}tokens")
    merges = fields.get(GGML + "merges") or []
    _check_merges(merges, ids, where, f"{GGML}merges")
    name = fields.get(GGML + "pre", "default")  # llama.cpp reads a missing name as "default"
    pre = _BY_NAME.get(name) if isinstance(name, str) else None
    if pre is None:
        raise BadInput(
            where,
            f"{GGML}pre {brief(name)} has no tokenizer.json equivalent here (known: {', '.join(sorted(_BY_NAME))})",
        )

    special = {
        key: _gguf_id(fields, key, len(tokens), where)
        for key in (
            "bos_token_id",
            "eos_token_id",
            "unknown_token_id",
            "padding_token_id",
            "eot_token_id",
            "eom_token_id",
        )
    }
    add_bos = _gguf_flag(fields, "add_bos_token", pre.add_bos, where)
    add_eos = _gguf_flag(fields, "add_eos_token", False, where)
    bos, eos = special["bos_token_id"], special["eos_token_id"]
    for flag, token_id, what in ((add_bos, bos, "bos"), (add_eos, eos, "eos")):
        if flag and token_id is None:
            raise BadInput(where, f"{GGML}add_{what}_token is set but the file has no {GGML}{what}_token_id")
    template = fields.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise BadInput(where, "tokenizer.chat_template is not a string")

    added = [
        {
            "id": i,
            "content": tokens[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": types[i] == TokenType.CONTROL,
        }
        for i in range(len(tokens))
        if types[i] in (TokenType.CONTROL, TokenType.USER_DEFINED)
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": pre.normalizers[0],
        "pre_tokenizer": pre.pre_tokenizer,
        "post_processor": _template_processing(tokens, bos if add_bos else None, eos if add_eos else None),
        "decoder": BYTE_LEVEL_DECODER,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre.ignore_merges,
            "vocab": ids,
            "merges": [m.split(" ", 1) for m in merges],
        },
    }
    return _tokenizer_files(tokenizer, tokens, special, add_bos, add_eos, pre.clean_spaces, template)


# What transformers 5's GGUF loader builds (integrations/gguf/gguf_tokenizer_mapping.py): GPT2Tokenizer's pipeline for
# 'gpt2', LlamaTokenizer's for 'llama' (models/*/tokenization_*.py), serialized as tokenizers writes them.
METASPACE = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
SENTENCEPIECE_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ],
}
BYTE_LEVEL_MODEL = {
    "type": "BPE",
    "dropout": None,
    "unk_token": None,
    "continuing_subword_prefix": "",
    "end_of_word_suffix": "",
    "fuse_unk": False,
    "byte_fallback": False,
    "ignore_merges": False,
}
SENTENCEPIECE_MODEL = {
    "type": "BPE",
    "dropout": None,
    "unk_token": None,
    "continuing_subword_prefix": None,
    "end_of_word_suffix": None,
    "fuse_unk": True,
    "byte_fallback": True,
    "ignore_merges": False,
}
# Architectures whose SentencePiece vocabulary transformers rebuilds its own way (respelled spaces, merges by
# position, another pipeline: GGUF_SENTENCEPIECE_BUILDERS); not reproduced here.
OWN_SENTENCEPIECE_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "phi3"})


def _as_transformers_reads(fields: dict[str, object], model: str, where: str) -> dict[str, bytes]:
    """The tokenizer files of what transformers builds from the GGUF, so that loading them anywhere gives its ids.

    Where transformers and llama.cpp part (the runtime follows transformers): every row is kept, "[PAD{i}]" filler
    too; no normalizer (Qwen's NFC is dropped); a 'gpt2' vocabulary splits with the name's regex where transformers
    knows one (qwen2, qwen35, llama-bpe) and with GPT-2's ByteLevel regex otherwise (smollm's Digits and 'default''s
    splits are dropped), and applies every merge (llama-bpe's ignore_merges is dropped); BOS is added only when
    add_bos_token says so, except that a 'llama' vocabulary without the key adds it; a 'llama' vocabulary always
    prefixes a space to the text (add_space_prefix is ignored) and gets its merges, when the file has none, from the
    scores (generate_merges); a CONTROL token with a character outside GPT-2's byte alphabet stays unsplit text.
    One departure: a bos/eos/unk/pad token outside that alphabet keeps its GGUF id (transformers would append it
    as a new id the model has no row for).
    """
    tokens = fields.get(GGML + "tokens")
    if not (isinstance(tokens, list) and tokens and all(isinstance(t, str) for t in tokens)):
        raise BadInput(where, f"{GGML}model is {model!r} but {GGML}tokens is not a list of strings")
    if len(tokens) > MAX_TOKENS:
        raise BadInput(where, f"{GGML}tokens lists {len(tokens)} tokens, more than {MAX_TOKENS}")
    types = fields.get(GGML + "token_type") or [int(TokenType.NORMAL)] * len(tokens)
    if not (isinstance(types, list) and len(types) == len(tokens)):
        raise BadInput(where, f"{GGML}token_type does not match {GGML}tokens")
    if not all(type(t) is int and t in _TOKEN_TYPES for t in types):
        raise BadInput(where, f"{GGML}token_type holds a value that is not a token type (0..6)")
    merges = fields.get(GGML + "merges")
    if merges is not None and not (isinstance(merges, list) and all(isinstance(m, str) for m in merges)):
        raise BadInput(where, f"{GGML}merges is not a list of strings")
    if model == "gpt2":
        name = fields.get(GGML + "pre", "default")
        pre = _BY_NAME.get(name) if isinstance(name, str) else None
        if pre is None:
            raise BadInput(
                where,
                f"{GGML}pre {brief(name)} has no tokenizer.json equivalent here (known: {', '.join(sorted(_BY_NAME))})",
            )
        # A token with a character outside the byte alphabet is stored as its UTF-8 bytes spelled in it.
        vocab_tokens = [t if set(t) <= _BYTE_ALPHABET else byte_level(t) for t in tokens]
        split = {"type": "Split", "pattern": {"Regex": pre.transformers_split}, "behavior": "Isolated", "invert": False}
        pre_tokenizer = (
            GPT2_BYTE_LEVEL
            if pre.transformers_split is None
            else {"type": "Sequence", "pretokenizers": [split, {**BYTE_LEVEL, "trim_offsets": True}]}
        )
        decoder, bpe = BYTE_LEVEL_DECODER, BYTE_LEVEL_MODEL
    else:
        architecture = fields.get("general.architecture")
        if isinstance(architecture, str) and architecture in OWN_SENTENCEPIECE_ARCHS:
            raise BadInput(
                where,
                f"general.architecture {architecture!r}: transformers builds this SentencePiece "
                "vocabulary its own way, which is not reproduced here",
            )
        vocab_tokens, pre_tokenizer, decoder, bpe = tokens, METASPACE, SENTENCEPIECE_DECODER, SENTENCEPIECE_MODEL
    ids = _unique_ids(vocab_tokens, where, f"{GGML}tokens")
    if merges is None:
        if model == "gpt2":
            raise BadInput(where, f"{GGML}model is 'gpt2' but the file has no {GGML}merges")
        scores = fields.get(GGML + "scores")
        if not (
            isinstance(scores, list) and len(scores) == len(tokens) and all(type(v) in (int, float) for v in scores)
        ):
            raise BadInput(
                where, f"{GGML}model is 'llama' with no {GGML}merges, and {GGML}scores is not one number per token"
            )
        pairs = _merges_from_scores(ids, dict(zip(tokens, scores)))
    else:
        _check_merges(merges, ids, where, f"{GGML}merges")
        pairs = [m.split(" ", 1) for m in merges]

    special = {
        key: _gguf_id(fields, key, len(tokens), where)
        for key in (
            "bos_token_id",
            "eos_token_id",
            "unknown_token_id",
            "padding_token_id",
            "eot_token_id",
            "eom_token_id",
        )
    }
    bos, eos = special["bos_token_id"], special["eos_token_id"]
    # transformers turns add_bos_token off, silently, when there is no BOS token to add.
    add_bos = _gguf_flag(fields, "add_bos_token", model == "llama", where) and bos is not None
    add_eos = _gguf_flag(fields, "add_eos_token", False, where) and eos is not None
    template = fields.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise BadInput(where, "tokenizer.chat_template is not a string")

    named = {special[gguf_key] for _, gguf_key in _SPECIAL_KEYS} - {None}
    added = {}  # id -> (content, special), in the order transformers adds them
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind == TokenType.CONTROL and (model == "llama" or set(token) <= _BYTE_ALPHABET):
            added[i] = (token, True)
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind == TokenType.USER_DEFINED and i not in added and token in ids:
            added[ids[token]] = (token, False)
    for i in sorted(named - set(added)):
        added[i] = (tokens[i], True)
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": is_special,
            }
            for i, (content, is_special) in sorted(added.items())
        ],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _template_processing(tokens, bos if add_bos else None, eos if add_eos else None),
        "decoder": decoder,
        "model": {**bpe, "vocab": ids, "merges": pairs},
    }
    return _tokenizer_files(tokenizer, tokens, special, add_bos, add_eos, False, template)


def _tokenizer_files(
    tokenizer: dict[str, object],
    tokens: list[str],
    special: dict[str, int | None],
    add_bos: bool,
    add_eos: bool,
    clean_spaces: bool,
    template: str | None,
) -> dict[str, bytes]:
    """The files transformers reads beside tokenizer.json: its config (the special tokens by name), the generation
    config (every stop id the GGUF names) and the chat template."""
    bos, eos = special["bos_token_id"], special["eos_token_id"]
    config: dict[str, object] = {"add_bos_token": add_bos, "add_eos_token": add_eos, "backend": "tokenizers"}
    for config_key, gguf_key in _SPECIAL_KEYS:
        token_id = special[gguf_key]
        config[config_key] = tokens[token_id] if token_id is not None else None
    # TokenizersBackend takes tokenizer.json as written; a model class (Qwen2Tokenizer...) would rebuild its own.
    config |= {"clean_up_tokenization_spaces": clean_spaces, "tokenizer_class": "TokenizersBackend"}
    stops = [i for i in dict.fromkeys((eos, special["eot_token_id"], special["eom_token_id"])) if i is not None]
    generation = {
        "bos_token_id": bos,
        "eos_token_id": stops[0] if len(stops) == 1 else stops or None,
        "pad_token_id": special["padding_token_id"],
    }
    files = {
        "tokenizer.json": orjson.dumps(tokenizer, option=orjson.OPT_INDENT_2),
        "tokenizer_config.json": orjson.dumps(config, option=orjson.OPT_INDENT_2),
        "generation_config.json": orjson.dumps(
            {k: v for k, v in generation.items() if v is not None}, option=orjson.OPT_INDENT_2
        ),
    }
    if template is not None:
        files["chat_template.jinja"] = template.encode()
    return files


def _merges_from_scores(ids: dict[str, int], scores: dict[str, float]) -> list[list[str]]:
    """transformers' generate_merges(vocab, vocab_scores): every split of a piece into two pieces, best score first
    (ties: shorter left, then shorter right, then the order found; within a piece by the ids of its halves)."""
    found = []
    for piece, score in scores.items():
        halves = [(piece[:k], piece[k:], score) for k in range(1, len(piece)) if piece[:k] in ids and piece[k:] in ids]
        found.extend(sorted(halves, key=lambda h: (ids[h[0]], ids[h[1]])))
    found.sort(key=lambda h: (h[2], len(h[0]), len(h[1])), reverse=True)
    return [[left, right] for left, right, _ in found]


def byte_level(text: str) -> str:
    """GPT-2's spelling of text's UTF-8 bytes (transformers' bytes_to_unicode); sorted(BYTE_SPELLING) is the
    byte-level vocabulary's first 256 tokens in their usual order (printable bytes first)."""
    return "".join(BYTE_SPELLING[b] for b in text.encode())


def _byte_spelling() -> list[str]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    spelling = {b: chr(b) for b in printable}
    spelling |= {b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in spelling)}
    return [spelling[b] for b in range(256)]


BYTE_SPELLING = _byte_spelling()
_BYTE_ALPHABET = frozenset(BYTE_SPELLING)


def _types_in(node: object) -> list[object]:
    """The `type` of a pre-tokenizer and of each one in a Sequence."""
    if not isinstance(node, dict):
        return []
    inner = node.get("pretokenizers")
    return [node.get("type"), *(t for child in (inner if isinstance(inner, list) else []) for t in _types_in(child))]


def _added_type(entry: dict) -> TokenType:
    """CONTROL for a special added token or one that looks special, USER_DEFINED for the others."""
    content = entry["content"]
    looks_special = content in LOOK_SPECIAL_NAMES or any(
        content.startswith(start) and content.endswith(end) for start, end in LOOK_SPECIAL_SHAPES
    )
    return TokenType.CONTROL if entry.get("special") or looks_special else TokenType.USER_DEFINED


def _unique_ids(tokens: list[str], where: str, what: str) -> dict[str, int]:
    """token -> id; llama.cpp asserts every token string is distinct, so a repeated one is refused here."""
    ids = {t: i for i, t in enumerate(tokens)}
    if len(ids) != len(tokens):
        for i, token in enumerate(tokens):
            if ids[token] != i:
                raise BadInput(where, f"{what}: token {brief(token)} is listed at ids {i} and {ids[token]}")
    return ids


def _merge_strings(merges: list, where: str) -> list[str]:
    """Merges as GGUF stores them, "a b"; a part holding a space cannot be stored that way.

    from_tokenizer_json has checked each is a string or a pair of strings."""
    joined = [m if type(m) is str else f"{m[0]} {m[1]}" for m in merges]
    for n, merge in enumerate(joined):
        if merge.count(" ") != 1 or merge[0] == " " or merge[-1] == " ":
            raise BadInput(
                where, f"model.merges[{n}] {brief(merges[n])} is not 'a b' nor ['a', 'b'] of two tokens without spaces"
            )
    return joined


def _check_merges(merges: list[str], ids: dict[str, int], where: str, key: str) -> None:
    """Each merge joins two tokens into a third, all in the vocabulary (tokenizers refuses to load it otherwise)."""
    for n, merge in enumerate(merges):
        left, _, right = merge.partition(" ")
        if not (left and right and left in ids and right in ids and left + right in ids):
            raise BadInput(where, f"{key}[{n}] {brief(merge)} does not join two tokens of the vocabulary into a third")


def _config_token_id(value: object, ids: dict[str, int], key: str, notes: list[str]) -> int | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", ...} in older tokenizer_config files
        value = value.get("content")
    if not isinstance(value, str):
        return None
    if value not in ids:
        notes.append(f"tokenizer_config.json {key} {brief(value)} is not in the vocabulary; left out")
    return ids.get(value)


def _generation_id(value: object, length: int, key: str, where: str) -> int | None:
    """generation_config's `{key}_id`: an id, or a list of them (stops) whose first is the one GGUF holds."""
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < length:
        raise BadInput(where, f"generation_config.json {key}_id {brief(value)} is not an id below {length}")
    return value


def _adds_special(config: dict, post_processor: object, notes: list[str]) -> tuple[bool, bool]:
    """Whether encoding adds BOS / EOS: what tokenizer.json's post-processor does. transformers 5 drops
    tokenizer_config's add_bos_token / add_eos_token when there is a tokenizer.json, and llama.cpp's converter
    lets the post-processor win over them too."""
    adds = {"bos": False, "eos": False}
    processors = post_processor.get("processors") if isinstance(post_processor, dict) else None
    for processor in processors if isinstance(processors, list) else [post_processor]:
        kind = processor.get("type") if isinstance(processor, dict) else None
        if kind == "RobertaProcessing":
            adds = {"bos": True, "eos": True}
        elif kind == "TemplateProcessing" and isinstance(single := processor.get("single"), list) and single:
            adds = {
                "bos": isinstance(single[0], dict) and "SpecialToken" in single[0],
                "eos": isinstance(single[-1], dict) and "SpecialToken" in single[-1],
            }
    for what, added in adds.items():
        said = config.get(f"add_{what}_token")
        if isinstance(said, bool) and said != added:
            notes.append(
                f"tokenizer_config.json says add_{what}_token={said} but tokenizer.json's post-processor "
                f"{'adds' if added else 'adds no'} {what.upper()}; wrote {added}, as transformers 5 reads it"
            )
    return adds["bos"], adds["eos"]


def _config_template(value: object, notes: list[str]) -> str | None:
    """tokenizer_config's chat_template: a string, or named templates of which GGUF here keeps 'default'."""
    if isinstance(value, list):
        named = {e.get("name"): e.get("template") for e in value if isinstance(e, dict)}
        if dropped := [str(n) for n in named if n != "default"]:
            notes.append(f"named chat templates {', '.join(dropped)} are not carried over; only 'default' is")
        value = named.get("default")
    return value if isinstance(value, str) else None


def _gguf_id(fields: dict[str, object], key: str, length: int, where: str) -> int | None:
    value = fields.get(GGML + key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < length:
        raise BadInput(where, f"{GGML}{key} {brief(value)} is not a token id below {length}")
    return value


def _gguf_flag(fields: dict[str, object], key: str, default: bool, where: str) -> bool:
    value = fields.get(GGML + key, default)
    if not isinstance(value, bool):
        raise BadInput(where, f"{GGML}{key} {brief(value)} is not a boolean")
    return value


def _template_processing(tokens: list[str], bos: int | None, eos: int | None) -> dict[str, object]:
    """The post-processor transformers builds for add_bos_token / add_eos_token (update_post_processor)."""

    def special(token_id: int | None, type_id: int) -> list[dict]:
        return [] if token_id is None else [{"SpecialToken": {"id": tokens[token_id], "type_id": type_id}}]

    def sequence(name: str, type_id: int) -> list[dict]:
        return [*special(bos, type_id), {"Sequence": {"id": name, "type_id": type_id}}, *special(eos, type_id)]

    return {
        "type": "TemplateProcessing",
        "single": sequence("A", 0),
        "pair": sequence("A", 0) + sequence("B", 1),
        "special_tokens": {
            tokens[i]: {"id": tokens[i], "ids": [i], "tokens": [tokens[i]]}
            for i in dict.fromkeys((bos, eos))
            if i is not None
        },
    }

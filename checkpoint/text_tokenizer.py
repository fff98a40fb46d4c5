"""Text to token ids and back, and chat prompts, as transformers 5 makes them, for the runtime.

Built from an HF checkpoint's tokenizer files or from a GGUF's `tokenizer.*` keys (through the GGUF ->
tokenizer.json conversion of checkpoint/gguf_tokenizer.py, read as transformers reads a GGUF). Encoding and
decoding run in the `tokenizers` library on the pipeline transformers would hand it, so ids are
transformers' by construction rather than by imitation:

- `tokenizer_class` picks the pipeline as AutoTokenizer does (transformers 5.24, tokenization_auto.py):
  TokenizersBackend and the names that resolve to it load tokenizer.json as written; the classes with an
  `__init__` of their own (REBUILT) keep tokenizer.json's vocabulary, merges and post-processor and put their
  own normalizer, pre-tokenizer and decoder around them. Any other class is refused: transformers would run
  code of that class that is not reproduced here.
- Special and added tokens are added in the order and with the calls TokenizersBackend.__init__ makes, so
  tokens named in tokenizer_config.json but missing from tokenizer.json get the ids transformers gives them.
- Chat templates render in the sandbox transformers sets up (utils/chat_template_utils.py): trim_blocks,
  lstrip_blocks, loopcontrols, `{% generation %}`, `raise_exception`, `strftime_now`, its `tojson`, `dict` and
  `namespace`, with the named special tokens as variables.

Importing this module costs `tokenizers` and `jinja2`; `check` never imports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import orjson
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer
from tokenizers.processors import TemplateProcessing

from specpair.checkpoint.gguf_tokenizer import (
    BYTE_LEVEL_DECODER,
    GPT2_BYTE_LEVEL,
    METASPACE,
    QWEN2_SPLIT,
    QWEN35_SPLIT,
    hf_tokenizer_files,
)
from specpair.checkpoint.tokenizer import from_tokenizer_json
from specpair.errors import BadInput
from specpair.formats import brief

# PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES: the named special tokens, in transformers' order.
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# tokenizer_class values (less a "Fast" suffix) that AutoTokenizer loads as TokenizersBackend: tokenizer.json as
# written. PreTrainedTokenizer is PythonBackend, which AutoTokenizer swaps for TokenizersBackend; Bloom's were removed.
AS_WRITTEN = frozenset({None, "TokenizersBackend", "PreTrainedTokenizer", "BloomTokenizer"})
ADDED_TOKEN_KEYS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")
# The message keys a reasoning trace comes under; transformers copies it to the first and to "thinking".
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass(frozen=True)
class Rebuild:
    """What a transformers tokenizer class with its own `__init__` builds around tokenizer.json's vocabulary."""

    model: dict[str, Any]  # the BPE options the class passes (vocab and merges come from tokenizer.json)
    pipeline: Callable[[dict], dict[str, Any]]  # tokenizer_config -> normalizer, pre_tokenizer, decoder
    defaults: dict[str, str | None]  # the class's special-token defaults, which tokenizer_config keys override
    adds_special_tokens: bool = False  # Qwen2Tokenizer adds every special token again after __init__


def _byte_level_bpe(**flags: object) -> dict[str, Any]:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": "",
        "end_of_word_suffix": "",
        "fuse_unk": False,
        **flags,
    }


def _qwen(regex: str) -> Callable[[dict], dict[str, Any]]:
    def pipeline(config: dict) -> dict[str, Any]:
        byte_level = {
            "type": "ByteLevel",
            "add_prefix_space": bool(config.get("add_prefix_space")),
            "trim_offsets": True,
            "use_regex": False,
        }
        split = {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
        return {
            "normalizer": {"type": "NFC"},
            "decoder": BYTE_LEVEL_DECODER,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]},
        }

    return pipeline


def _gpt2(config: dict) -> dict[str, Any]:
    return {
        "normalizer": None,
        "decoder": BYTE_LEVEL_DECODER,
        "pre_tokenizer": {**GPT2_BYTE_LEVEL, "add_prefix_space": bool(config.get("add_prefix_space"))},
    }


def _llama(config: dict) -> dict[str, Any]:
    """LlamaTokenizer: Metaspace, prefixing a space to the first piece ("first"), to every piece when legacy
    ("always"), or never without add_prefix_space (_get_prepend_scheme); the decoder strips what it prefixed."""
    prefix = config.get("add_prefix_space")
    prefix = True if prefix is None else bool(prefix)
    scheme = ("always" if config.get("legacy", False) else "first") if prefix else "never"
    strip = [{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else []
    decoder = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            *strip,
        ],
    }
    return {"normalizer": None, "decoder": decoder, "pre_tokenizer": {**METASPACE, "prepend_scheme": scheme}}


QWEN_DEFAULTS = {
    "unk_token": "<|endoftext|>",
    "bos_token": None,
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
}
REBUILT = {  # class name -> its __init__ (models/<family>/tokenization_<family>.py)
    "Qwen2Tokenizer": Rebuild(
        _byte_level_bpe(byte_fallback=False), _qwen(QWEN2_SPLIT), QWEN_DEFAULTS, adds_special_tokens=True
    ),
    "Qwen3_5Tokenizer": Rebuild(_byte_level_bpe(byte_fallback=False), _qwen(QWEN35_SPLIT), QWEN_DEFAULTS),
    "GPT2Tokenizer": Rebuild(
        _byte_level_bpe(),
        _gpt2,
        {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": None},
    ),
    "LlamaTokenizer": Rebuild(
        {"type": "BPE", "dropout": None, "fuse_unk": True, "byte_fallback": True},
        _llama,
        {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    ),
}


@dataclass
class TextTokenizer:
    """Encode, decode and render chat prompts exactly as transformers' AutoTokenizer for the same files."""

    backend: Tokenizer = field(repr=False)
    where: str
    special_tokens: dict[str, str]  # transformers' special_tokens_map: named and model-specific, set ones only
    chat_template: str | dict[str, str] | None = field(default=None, repr=False)
    stop_ids: list[int] = field(default_factory=list)
    clean_up_spaces: bool = False  # decode's clean_up_tokenization (transformers skips it for BPE)
    _templates: dict[str, jinja2.Template] = field(default_factory=dict, repr=False)

    @classmethod
    def from_files(
        cls,
        tokenizer_json: bytes,
        tokenizer_config: dict | None,
        generation_config: dict | None,
        chat_template: str | None,
        where: str,
    ) -> TextTokenizer:
        """tokenizer.json with tokenizer_config.json, generation_config.json and chat_template.jinja (each None
        when absent); `where` names the checkpoint in errors."""
        config = _mapping(tokenizer_config, where, "tokenizer_config.json")
        generation = _mapping(generation_config, where, "generation_config.json")
        if chat_template is not None and not isinstance(chat_template, str):
            raise BadInput(where, "chat_template.jinja is not text")
        from_tokenizer_json(tokenizer_json, where, config, generation, chat_template)  # checks ids, merges, depth
        doc = orjson.loads(tokenizer_json)
        name = config.get("tokenizer_class")
        if name is not None and not isinstance(name, str):
            raise BadInput(where, f"tokenizer_config.json tokenizer_class {brief(name)} is not a string")
        klass = name.removesuffix("Fast") if name else None
        rebuild, listed = None, doc.get("added_tokens") or []
        if klass not in AS_WRITTEN and not (klass == "LlamaTokenizer" and _byte_level(doc)):
            rebuild = REBUILT.get(klass)
            if rebuild is None:
                raise BadInput(
                    where,
                    f"tokenizer_class {name!r}: transformers builds this tokenizer with code of its "
                    f"own, which is not reproduced here (known: {', '.join(sorted(REBUILT))}, "
                    "TokenizersBackend, PreTrainedTokenizerFast)",
                )
            if doc["model"].get("type") != "BPE":
                raise BadInput(
                    where,
                    f"tokenizer_class {name!r} takes a BPE model, but tokenizer.json's model.type is "
                    f"{brief(doc['model'].get('type'))}",
                )
            doc = {
                **doc,
                **rebuild.pipeline(config),
                "added_tokens": [],
                "model": {**rebuild.model, "vocab": doc["model"]["vocab"], "merges": doc["model"].get("merges", [])},
            }
        try:  # tokenizer.json as written loads from its own text (valid UTF-8: orjson parsed it)
            backend = Tokenizer.from_str(tokenizer_json.decode() if rebuild is None else json.dumps(doc))
        except Exception as e:  # the Rust side reports any inconsistency as one exception type
            raise BadInput(where, f"tokenizer.json does not load ({_line(e)})") from None
        backend.no_truncation()
        backend.no_padding()
        if backend.post_processor is None:  # update_post_processor, with add_bos/eos_token dropped for tokenizer.json
            backend.post_processor = TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
        special = _add_tokens_as_transformers(backend, listed, config, rebuild, where)
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))

        template: str | dict[str, str] | None = chat_template
        if template is None:
            template = config.get("chat_template")
            if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
                if not all(
                    isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("template"), str)
                    for e in template
                ):
                    raise BadInput(where, "tokenizer_config.json chat_template is a list but not of {name, template}")
                template = {e["name"]: e["template"] for e in template}
            elif template is not None and not isinstance(template, str):
                raise BadInput(where, f"tokenizer_config.json chat_template {brief(template)} is not a string")
        eos = special.get("eos_token")
        stops = _ids(generation.get("eos_token_id"), where)
        if not stops and eos is not None and backend.token_to_id(eos) is not None:
            stops = [backend.token_to_id(eos)]
        force = bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
        clean = bool(config.get("clean_up_tokenization_spaces")) and (force or doc["model"].get("type") != "BPE")
        return cls(backend, where, special, template, stops, clean)

    @classmethod
    def from_gguf(cls, fields: dict[str, object], where: str) -> TextTokenizer:
        """A GGUF's tokenizer keys (formats.gguf.read_local(path).fields), read as transformers reads them."""
        files = hf_tokenizer_files(fields, where, reader="transformers")
        template = files.get("chat_template.jinja")
        return cls.from_files(
            files["tokenizer.json"],
            orjson.loads(files["tokenizer_config.json"]),
            orjson.loads(files["generation_config.json"]),
            template.decode() if template is not None else None,
            where,
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text; BOS/EOS as the post-processor adds them when add_special_tokens."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self.clean_up_spaces else text

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        template: str | None = None,
        **template_kwargs: object,
    ) -> str:
        """The prompt text, as transformers' apply_chat_template(..., tokenize=False); `template` is a template or
        the name of one; `template_kwargs` (enable_thinking, ...) reach the template as variables."""
        source = self._template_source(template, tools)
        compiled = self._templates.get(source)
        if compiled is None:
            try:
                compiled = self._templates[source] = _ENVIRONMENT.from_string(source)
            except Exception as e:  # the template is untrusted text: any failure is the template's
                raise BadInput(self.where, f"chat template does not compile ({_line(e)})") from None
        if not messages:
            raise BadInput(self.where, "a chat needs at least one message")
        chat = _aliased_reasoning(
            [
                _plain({k: v for k, v in m.items() if v is not None})
                if isinstance(m, Mapping)
                else _not_a_message(m, self.where)
                for m in messages
            ]
        )
        variables = {**self.special_tokens, **_plain(template_kwargs)}
        try:
            return compiled.render(
                messages=chat,
                tools=_plain(tools),
                documents=_plain(documents),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except Exception as e:  # raise_exception, a sandbox refusal, or the template's own TypeError...
            raise BadInput(self.where, f"chat template: {_line(e)}") from None

    @property
    def bos_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def eos_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def pad_id(self) -> int | None:
        return self._special_id("pad_token")

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def id_of(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def _special_id(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        return None if token is None else self.backend.token_to_id(token)

    def _template_source(self, template: str | None, tools: list[dict] | None) -> str:
        """get_chat_template: a named template when there are several ('tool_use' for tools, else 'default')."""
        own = self.chat_template
        if isinstance(own, dict):
            if template is not None:
                return own.get(template, template)
            if tools is not None and "tool_use" in own:
                return own["tool_use"]
            if "default" in own:
                return own["default"]
            raise BadInput(self.where, f"several chat templates ({', '.join(sorted(own))}) and none named 'default'")
        if template is not None:
            return template
        if own is None:
            raise BadInput(self.where, "the tokenizer has no chat template")
        return own


def _add_tokens_as_transformers(
    backend: Tokenizer, listed: list, config: dict, rebuild: Rebuild | None, where: str
) -> dict[str, str]:
    """Add tokens as TokenizersBackend.__init__ does, and return transformers' special_tokens_map.

    Added tokens come from tokenizer_config's added_tokens_decoder (else tokenizer.json's added_tokens); those the
    backend lacks with the same flags are added, then every special token missing from the added ones, in one
    add_tokens call, so new ids follow transformers'.
    """
    decoder = config.get("added_tokens_decoder")
    if decoder is None:
        entries = [(e["id"], e) for e in listed]  # from_tokenizer_json checked each has an int id and a content
    elif isinstance(decoder, dict):
        entries = [(_int_key(k, where), v) for k, v in decoder.items()]
    else:
        raise BadInput(where, "tokenizer_config.json added_tokens_decoder is not an object")
    declared = [_added_token(e, where, f"added token {i}") for i, e in sorted(entries, key=lambda p: p[0])]
    have = {_flags(t) for t in backend.get_added_tokens_decoder().values()}
    to_add: list[AddedToken | str] = [t for t in declared if _flags(t) not in have]

    values: dict[str, AddedToken | str | None] = dict(rebuild.defaults) if rebuild else {}
    for key in NAMED_SPECIAL_TOKENS:
        if key in config:
            values[key] = _token_value(config[key], where, key)
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    for key, value in config.items():  # model-specific named tokens: image_token, ...
        if key.endswith("_token") and key not in NAMED_SPECIAL_TOKENS and isinstance(value, str):
            values[key] = value
    if isinstance(extra, dict):
        values |= {str(k): _token_value(v, where, str(k)) for k, v in extra.items()}
        extra = []
    if not isinstance(extra, list):
        raise BadInput(where, "tokenizer_config.json extra_special_tokens is neither a list nor an object")
    extra_tokens = [_token_value(v, where, "extra_special_tokens") for v in extra]
    by_content = {str(t): t for t in declared}  # a named token takes its flags from the added token of that text
    named = {k: by_content.get(str(v), v) for k, v in values.items() if v is not None}

    encoder = {t.content for t in backend.get_added_tokens_decoder().values()} | {str(t) for t in to_add}
    names = {str(v) for v in named.values()}
    for value in [*named.values(), *extra_tokens]:
        if value is not None and str(value) not in encoder:
            to_add.append(value)
            encoder.add(str(value))
    if to_add:
        tokens = []
        for token in to_add:
            if isinstance(token, str):
                token = AddedToken(token, special=True)
            elif not token.special and str(token) in names:
                token.special = True
            tokens.append(token)
        backend.add_tokens(tokens)
    if rebuild is not None and rebuild.adds_special_tokens:
        every = dict.fromkeys([*(str(v) for v in named.values()), *(str(t) for t in extra_tokens if t is not None)])
        backend.add_tokens([AddedToken(t, special=True) for t in every])
    return {k: str(v) for k, v in named.items()}


def _byte_level(doc: dict) -> bool:
    """TokenizersBackend._tokenizer_json_has_byte_level: a ByteLevel pre-tokenizer or decoder anywhere."""

    def has(node: object) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(has(v) for v in node.values())
        return any(has(v) for v in node) if isinstance(node, list) else False

    return has(doc.get("pre_tokenizer")) or has(doc.get("decoder"))


def _added_token(entry: object, where: str, what: str) -> AddedToken:
    if not (isinstance(entry, dict) and isinstance(entry.get("content"), str)):
        raise BadInput(where, f"tokenizer_config.json {what} {brief(entry)} is not an object with a string 'content'")
    flags = {k: bool(entry[k]) for k in ADDED_TOKEN_KEYS[1:] if k in entry}
    return AddedToken(entry["content"], **flags)


def _flags(token: AddedToken) -> tuple:
    return tuple(getattr(token, k) for k in ADDED_TOKEN_KEYS)


def _token_value(value: object, where: str, key: str) -> AddedToken | str | None:
    """A special token in tokenizer_config: a string, an AddedToken object, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return _added_token(value, where, key)
    raise BadInput(where, f"tokenizer_config.json {key} {brief(value)} is not a token")


def _int_key(key: str, where: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise BadInput(where, f"tokenizer_config.json added_tokens_decoder key {brief(key)} is not an id") from None


def _mapping(value: object, where: str, name: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadInput(where, f"{name} is not a JSON object")
    return value


def _ids(value: object, where: str) -> list[int]:
    """generation_config's eos_token_id: one id or a list of them."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(type(v) is int and v >= 0 for v in values):
        raise BadInput(where, f"generation_config.json eos_token_id {brief(value)} is not an id or a list of ids")
    return list(dict.fromkeys(values))


def _line(error: Exception) -> str:
    """An exception as one line: its first line, or its type's name when it says nothing."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _clean_up_tokenization(text: str) -> str:
    """PreTrainedTokenizerBase.clean_up_tokenization."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


# --------------------------------------------------------------------------------------------------
# The chat-template sandbox (transformers' _cached_compile_jinja_template)


def _plain(value: object) -> object:
    """_plain_template_data: the template sees plain JSON types only; anything else becomes "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _aliased_reasoning(chat: list[dict]) -> list[dict]:
    """A message's reasoning under any of REASONING_FIELDS is also given as 'reasoning_content' and 'thinking'."""
    out = []
    for message in chat:
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        out.append(message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning})
    return out


def _not_a_message(message: object, where: str) -> dict:
    raise BadInput(where, f"chat message {brief(message)} is not an object")


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' tojson: json.dumps without Jinja's HTML escaping."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` in templates, without the attributes of the dict type."""

    def __call__(self, *args: object, **kwargs: object) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: object, **kwargs: object) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attributes."""

    def __init__(*args: object, **kwargs: object) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: object) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute cannot start with '_' ({name!r})")


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-token masks in transformers) renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals |= {
        "raise_exception": _raise_exception,
        "strftime_now": _strftime_now,
        "dict": _TemplateDict(),
        "namespace": _TemplateNamespace,
    }
    return environment


_ENVIRONMENT = _environment()

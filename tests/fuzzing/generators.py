"""Hypothesis strategies for hostile inputs: values, JSON documents, safetensors and GGUF files, byte mutations.

Every strategy returns the bytes to write together with the faults it injected ("huge-int",
"deep-nesting", "flip", ...), so a run can report what it tried as well as how the parsers answered.
Two kinds of input: structured (a valid-shaped document or file whose values are hostile: huge,
negative, float, bool or wrongly typed numbers, deep nesting, odd unicode, lying length fields) and
mutated (a valid fixture file with bytes flipped, overwritten, inserted, deleted or truncated).
"""

from __future__ import annotations

import functools
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from specpair.checkpoint.config import MAX_LAYERS
from specpair.checkpoint.tokenizer import MAX_TOKENS
from specpair.formats.safetensors import DTYPE_BYTES, MAX_HEADER_BYTES

KeyPath = tuple[str, ...]  # a key path into a JSON document

SOURCE_ROOT = Path(__file__).resolve().parents[2]

# Boundaries of the formats and of specpair's own limits: where off-by-one and overflow bugs live.
EDGE_INTS = (
    0,
    1,
    2,
    3,
    7,
    8,
    15,
    16,
    31,
    32,
    63,
    64,
    127,
    128,
    255,
    256,
    1023,
    1024,
    4095,
    4096,
    65535,
    65536,
    MAX_LAYERS - 1,
    MAX_LAYERS,
    MAX_LAYERS + 1,
    MAX_TOKENS - 1,
    MAX_TOKENS,
    MAX_HEADER_BYTES,
    MAX_HEADER_BYTES + 1,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**40,
    2**53,
    2**53 + 1,
    2**60,
    2**62 - 1,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 1,
)
HUGE_INTS = (2**64, 2**100, 10**30, 10**400)  # past 64 bits: orjson refuses them, Python's json does not
NEGATIVE_INTS = (-1, -2, -8, -(2**31), -(2**32), -(2**53), -(2**63), -(2**63) - 1, -(2**64))
ODD_FLOATS = (
    0.0,
    -0.0,
    0.5,
    1.5,
    2.0,
    64.0,
    1e-310,
    1e6,
    1e16,
    1e300,
    1.7976931348623157e308,
    float("inf"),
    float("-inf"),
    float("nan"),
)
ODD_TEXT = (
    "",
    " ",
    "0",
    "64",
    "-1",
    "1e9",
    "true",
    "null",
    "NaN",
    "\n",
    "a\nb",
    "\r",
    "\x00",
    "\x1b[31m",
    "\u2028",
    "\x85",
    "\ufeff",
    "\u202e",
    "\ud800",
    "é",
    "e\u0301",
    "\U0001f600",
    "²",
    "٣",
    "../../etc/passwd",
    "/etc/passwd",
    "C:\\Windows",
    "%s%n",
    "{}",
    "{0}",
    "{target}",
    "[PAD0]",
    "<|im_end|>",
    "x" * 4096,
)
DEEP_LEVELS = (64, 65, 254, 256, 900, 990, 1000, 1025, 100_000)  # around the limits of specpair, orjson, repr


@dataclass(frozen=True)
class Deep:
    """A value nested `levels` deep, written straight as JSON text: json.dumps itself would recurse."""

    levels: int
    opener: str  # "[" or '{"k":'

    def text(self) -> str:
        closer = "]" if self.opener == "[" else "}"
        return self.opener * self.levels + "0" + closer * self.levels


@st.composite
def hostile_value(draw: st.DrawFn, faults: list[str]) -> Any:
    """One value of a hostile kind, recording the kind in `faults`."""
    kind = draw(
        st.sampled_from(
            (
                "edge-int",
                "huge-int",
                "negative",
                "float",
                "bool",
                "null",
                "text",
                "wrong-container",
                "long",
                "deep-nesting",
            )
        )
    )
    faults.append(kind)
    if kind == "edge-int":
        return draw(st.sampled_from(EDGE_INTS) | st.integers(0, 2**64 - 1))
    if kind == "huge-int":
        return draw(st.sampled_from(HUGE_INTS))
    if kind == "negative":
        return draw(st.sampled_from(NEGATIVE_INTS) | st.integers(max_value=-1))
    if kind == "float":
        return draw(st.sampled_from(ODD_FLOATS) | st.floats())
    if kind == "bool":
        return draw(st.booleans())
    if kind == "null":
        return None
    if kind == "text":
        return draw(st.sampled_from(ODD_TEXT) | st.text(max_size=24))
    if kind == "wrong-container":
        scalar = st.sampled_from(EDGE_INTS) | st.sampled_from(ODD_TEXT) | st.booleans() | st.none() | st.floats()
        return draw(st.lists(scalar, max_size=5) | st.dictionaries(st.sampled_from(ODD_TEXT), scalar, max_size=4))
    if kind == "long":
        n = draw(st.sampled_from((1000, 100_000)))
        shape = draw(st.sampled_from(("strings", "ints", "text", "object")))
        return {
            "strings": lambda: ["x"] * n,
            "ints": lambda: [1] * n,
            "text": lambda: "x" * n * 10,
            "object": lambda: {f"k{i}": i for i in range(n)},
        }[shape]()
    return Deep(draw(st.sampled_from(DEEP_LEVELS)), draw(st.sampled_from(("[", '{"k":'))))


def encode_json(document: Any, ascii_only: bool = True) -> bytes:
    """JSON text of `document`, with every Deep value written in place (NaN/Infinity as Python writes them)."""
    deep: dict[str, str] = {}

    def mark(value: Any) -> Any:
        if isinstance(value, Deep):
            token = f"\x00deep{len(deep)}\x00"
            deep[json.dumps(token)] = value.text()
            return token
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(document), ensure_ascii=ascii_only)
    for token, replacement in deep.items():
        text = text.replace(token, replacement)
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes invalid UTF-8, on purpose


@functools.cache
def keys_in_source(*relative_paths: str) -> list[str]:
    """String constants that look like JSON keys in specpair's own source: the keys its readers look up."""
    found: set[str] = set()
    for relative in relative_paths:
        found |= set(re.findall(r'"([a-z][a-z0-9_]*)"', (SOURCE_ROOT / relative).read_text()))
    return sorted(found)


def key_paths(document: Any, prefix: KeyPath = (), depth: int = 3, per_level: int = 40) -> list[KeyPath]:
    """Key paths of a document, at most `per_level` children per container (a vocabulary has 100k keys)."""
    paths: list[KeyPath] = []
    if depth == 0:
        return paths
    if isinstance(document, dict):
        items = list(document.items())[:per_level]
    elif isinstance(document, list):
        items = [(str(i), v) for i, v in enumerate(document[:per_level])]
    else:
        return paths
    for key, value in items:
        paths.append((*prefix, key))
        paths += key_paths(value, (*prefix, key), depth - 1, per_level)
    return paths


def _parent(document: Any, path: KeyPath) -> tuple[Any, str | int] | None:
    """The container holding `path`'s last key, creating missing objects on the way; None when blocked."""
    node = document
    for key in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(key, {})
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    last = path[-1]
    if isinstance(node, dict):
        return node, last
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        return node, int(last)
    return None


@st.composite
def edited_document(
    draw: st.DrawFn, base: dict[str, Any], paths: Sequence[KeyPath], faults: list[str], max_edits: int = 4
) -> Any:
    """A deep copy of `base` with 1..max_edits hostile edits at `paths` (set, delete, or replace the whole)."""
    document = json.loads(json.dumps(base))
    for _ in range(draw(st.sampled_from((1, 1, 1, 2, max_edits)))):  # mostly one fault, so it meets the checks alone
        op = draw(st.sampled_from(("set",) * 8 + ("delete",) * 2 + ("whole",)))
        if op == "whole":
            faults.append("whole-document")
            return draw(hostile_value(faults))
        path = draw(st.sampled_from(paths))
        slot = _parent(document, path)
        if slot is None:
            continue
        container, key = slot
        if op == "delete":
            faults.append("missing-key")
            if isinstance(container, dict):
                container.pop(key, None)
            else:
                del container[key]
        else:
            container[key] = draw(hostile_value(faults))
    return document


# ---------------------------------------------------------------------------------------------------
# safetensors files

SAFETENSORS_NAMES = (
    "model.embed_tokens.weight",
    "lm_head.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "fc.weight",
    "d2t",
    "mtp.layers.0.mlp.gate.weight",
    "model.layers.0.mlp.experts.0.down_proj.weight",
    "a.weight_scale",
    "a.weight",
    "a.scales",
    "a.biases",
    "a.trellis",
    "a.weight_packed",
    "a.weight_scale_inv",
    "a.su",
    "mtp.layers.",
    "mtp.",
    "model.layers.٣.mlp.gate_proj.weight",
    "__metadata__",
    "",
)


SAFETENSORS_FAULTS = (
    "tensor-dtype",
    "tensor-shape",
    "tensor-offsets",
    "tensor-extra",
    "metadata",
    "overlap",
    "whole-header",
    "length-prefix",
    "data-size",
)


@st.composite
def safetensors_file(draw: st.DrawFn, faults: list[str]) -> bytes:
    """A safetensors file with consistent tensors and at most one kind of fault (so most inputs get past
    the first check); the tensor names and shapes are odd on their own (scalars, empty, unicode)."""
    fault = draw(st.sampled_from((None,) * 4 + SAFETENSORS_FAULTS))
    if fault:
        faults.append(fault)
    header: dict[str, Any] = {}
    offset = 0
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.sampled_from(SAFETENSORS_NAMES) | st.text(max_size=30))
        dtype = draw(st.sampled_from(sorted(DTYPE_BYTES)))
        shape = draw(st.lists(st.integers(0, 9), max_size=4))
        nbytes = -(-_prod(shape) * int(DTYPE_BYTES[dtype] * 2) // 2)
        entry: dict[str, Any] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        if fault and fault.startswith("tensor-") and draw(st.booleans()):
            field = {
                "tensor-dtype": "dtype",
                "tensor-shape": "shape",
                "tensor-offsets": "data_offsets",
                "tensor-extra": "extra",
            }[fault]
            value = draw(hostile_value(faults))
            if field in ("shape", "data_offsets") and entry[field] and draw(st.booleans()):  # one element
                entry[field][draw(st.integers(0, len(entry[field]) - 1))] = value
            else:
                entry[field] = value
        header[name] = entry
    if draw(st.booleans()):
        header["__metadata__"] = {"format": "pt"}
    if fault == "metadata":
        header["__metadata__"] = draw(edited_document({"format": "pt"}, [("format",), ("x",)], faults))
    names = [n for n in header if n != "__metadata__"]
    if fault == "overlap" and names:
        header[draw(st.sampled_from(names))]["data_offsets"] = [0, max(1, offset)]
    if fault == "whole-header":
        header = draw(hostile_value(faults))
    raw = encode_json(header, ascii_only=draw(st.booleans()))
    raw += b" " * draw(st.integers(0, 7))
    length = len(raw)
    if fault == "length-prefix":
        length = draw(st.sampled_from(EDGE_INTS) | st.integers(0, len(raw) + 16))
    data = draw(st.integers(0, offset + 64)) if fault == "data-size" else offset
    return struct.pack("<Q", length % 2**64) + raw + b"\0" * min(data, 1 << 20)


def _prod(shape: list[int]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


# ---------------------------------------------------------------------------------------------------
# GGUF files

GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9
GGML_TYPES = (0, 1, 2, 8, 10, 12, 14, 30, 39)  # F32, F16, Q4_0, Q8_0, Q2_K, Q4_K, Q6_K, BF16, MXFP4
GGUF_ARCHS = ("llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "dflash", "dflash-draft", "eagle3")
GGUF_TENSOR_NAMES = (
    "token_embd.weight",
    "output.weight",
    "output_norm.weight",
    "blk.0.attn_q.weight",
    "blk.1.ffn_up_exps.weight",
    "blk.9.nextn.eh_proj.weight",
    "fc.weight",
    "dflash_fc.weight",
    "selector_hidden.weight",
    "blk.².attn_q.weight",
    "blk.٣.ffn_down.weight",
    "blk..x",
    "blk.",
    "",
)


@functools.cache
def gguf_keys() -> list[str]:
    """Metadata keys the GGUF readers look up, from their source; `{arch}` and `{prefix}` left in place."""
    keys: set[str] = {"general.alignment", "general.architecture", "general.file_type"}
    for relative in ("checkpoint/gguf.py", "checkpoint/tokenizer.py"):
        text = (SOURCE_ROOT / relative).read_text()
        keys |= {"{arch}." + k for k in re.findall(r"\{arch\}\.([a-z0-9_.]+)", text)}
        keys |= {"{prefix}" + k for k in re.findall(r"\{prefix\}([a-z0-9_.]+)", text)}
        keys |= set(re.findall(r'"((?:general|tokenizer|dflash)\.[a-z0-9_.]+)"', text))
    keys |= {"{prefix}" + k for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")}
    return sorted(keys)


GGUF_LIES = (
    "value-type",
    "string-length",
    "array-count",
    "invalid-utf8",
    "tensor-n_dims",
    "tensor-dim",
    "tensor-type",
    "tensor-offset",
    "tensor-count",
    "kv-count",
    "version",
    "data-size",
)


@st.composite
def gguf_value(
    draw: st.DrawFn, faults: list[str], lie: str | None, vtype: int | None = None, depth: int = 0
) -> tuple[int, bytes]:
    """(value type, encoded value) of the given or a drawn type, hostile within its type; `lie` is the
    one kind of structural fault this file tells (an unknown type, a false length), or None."""
    if vtype is None:
        vtype = draw(st.sampled_from((4, 4, 5, 10, 7, 6, 12, 8, 8, 9, 9)))
        if lie == "value-type" and draw(st.integers(0, 3)) == 0:
            vtype = draw(st.sampled_from((13, 14, 2**31, 2**32 - 1)))
    if vtype in GGUF_SCALARS:
        fmt = GGUF_SCALARS[vtype]
        size = struct.calcsize(fmt)
        if fmt[1] in "fd":
            return vtype, struct.pack(fmt, draw(st.floats(width=32 if fmt[1] == "f" else 64)))
        if fmt[1] == "?":
            return vtype, bytes([draw(st.sampled_from((0, 1, 2, 255)))])
        signed = fmt[1].islower()
        low, high = (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1) if signed else (0, 2 ** (8 * size) - 1)
        edges = [v for v in (*EDGE_INTS, *NEGATIVE_INTS) if low <= v <= high]
        return vtype, struct.pack(fmt, draw(st.sampled_from(edges) | st.integers(low, high)))
    if vtype == GGUF_STRING:
        return vtype, draw(gguf_string(lie))
    if vtype == GGUF_ARRAY:
        element = draw(st.sampled_from((4, 5, 8, 6, 0, 9))) if depth < 3 else 4
        items = [draw(gguf_value(faults, lie, element, depth + 1))[1] for _ in range(draw(st.integers(0, 6)))]
        count = len(items)
        if lie == "array-count" and draw(st.integers(0, 3)) == 0:
            count = draw(st.sampled_from((2**32, 2**40, 2**60, 2**64 - 1)) | st.integers(0, 64))
        return vtype, struct.pack("<IQ", element, count) + b"".join(items)
    return vtype, draw(st.binary(max_size=16))


@st.composite
def gguf_string(draw: st.DrawFn, lie: str | None, text: st.SearchStrategy[str] | None = None) -> bytes:
    strings = text if text is not None else st.sampled_from(ODD_TEXT) | st.text(max_size=20)
    raw = draw(strings).encode("utf-8", "surrogatepass")
    if lie == "invalid-utf8" and draw(st.integers(0, 3)) == 0:
        raw += b"\xff\xc0"
    length = len(raw)
    if lie == "string-length" and draw(st.integers(0, 5)) == 0:
        length = draw(st.sampled_from((2**32, 2**40, 2**60, 2**63, 2**64 - 1)) | st.integers(0, len(raw) + 64))
    return struct.pack("<Q", length) + raw


@st.composite
def gguf_file(draw: st.DrawFn, faults: list[str]) -> bytes:
    """A GGUF file: an architecture, hyper-parameters at hostile or sane values, tensor infos, data.
    Half the files tell no structural lie (only their values are hostile), so the builder is reached;
    the others tell one kind of lie (GGUF_LIES)."""
    lie = draw(st.sampled_from((None,) * len(GGUF_LIES) + GGUF_LIES))
    if lie:
        faults.append(lie)
    arch = draw(st.sampled_from(GGUF_ARCHS)) if draw(st.integers(0, 3)) else draw(st.sampled_from(ODD_TEXT))
    prefix = "dflash-draft.dflash." if arch == "dflash-draft" else "dflash."
    keys = gguf_keys()
    kv = [(b"general.architecture", GGUF_STRING, draw(gguf_string(lie, st.just(arch))))]
    for suffix in ("block_count", "embedding_length", "attention.head_count", "vocab_size"):
        value = draw(st.sampled_from((1, 2, 4, 64)) | st.sampled_from(EDGE_INTS).filter(lambda v: v < 2**32))
        kv.append((f"{arch}.{suffix}".encode("utf-8", "surrogatepass"), 4, struct.pack("<I", value)))
    for _ in range(draw(st.integers(0, 8))):
        key = draw(st.sampled_from(keys)).replace("{arch}", arch).replace("{prefix}", prefix)
        vtype, raw = draw(gguf_value(faults, lie))
        kv.append((key.encode("utf-8", "surrogatepass"), vtype, raw))
    tensors = []
    offset = 0
    for _ in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from(GGUF_TENSOR_NAMES) | st.text(max_size=20))
        n_dims = draw(st.integers(1, 4))
        dims = [256] + [draw(st.sampled_from((1, 2, 4))) for _ in range(n_dims - 1)]  # rows of whole blocks
        ggml_type = draw(st.sampled_from(GGML_TYPES))
        tensor_offset = offset
        if lie and lie.startswith("tensor-") and draw(st.booleans()):
            if lie == "tensor-n_dims":
                n_dims = draw(st.sampled_from((0, 5, 2**31, 2**32 - 1)))
            elif lie == "tensor-dim":
                dims[0] = draw(st.sampled_from((0, 3, 2**32, 2**60, 2**63, 2**64 - 1)))
            elif lie == "tensor-type":
                ggml_type = draw(st.sampled_from((4, 5, 31, 99, 2**31, 2**32 - 1)))
            else:
                tensor_offset = draw(st.sampled_from((1, 2**40, 2**63, 2**64 - 1)))
        tensors.append(
            gguf_tensor_info(draw(gguf_string(lie, st.just(name))), n_dims, dims, ggml_type, tensor_offset % 2**64)
        )
        offset += -(-_prod(dims) * 4 // 32) * 32  # at most 4 bytes an element in the types drawn above
    tensor_count, kv_count, version, data = len(tensors), len(kv), 3, offset
    if lie == "tensor-count":
        tensor_count = draw(st.sampled_from((2**31, 2**40, 2**63, 2**64 - 1)) | st.integers(0, 8))
    elif lie == "kv-count":
        kv_count = draw(st.sampled_from((2**31, 2**40, 2**63, 2**64 - 1)) | st.integers(0, 16))
    elif lie == "version":
        version = draw(st.sampled_from((0, 1, 4, 2**32 - 1)))
    elif lie == "data-size":
        data = draw(st.integers(0, offset + 64))
    return gguf_bytes(kv, tensors, min(data, 1 << 20), version, tensor_count, kv_count)


def gguf_text(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(raw)) + raw


def gguf_tensor_info(name: bytes, n_dims: int, dims: Sequence[int], ggml_type: int, offset: int) -> bytes:
    """One tensor info; `name` is already encoded (length and bytes), dims in ggml order."""
    return (
        name
        + struct.pack("<I", n_dims)
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<IQ", ggml_type, offset)
    )


def gguf_bytes(
    kv: Sequence[tuple[bytes, int, bytes]],
    tensors: Sequence[bytes],
    data: int,
    version: int = 3,
    tensor_count: int | None = None,
    kv_count: int | None = None,
) -> bytes:
    """A GGUF file from (key, value type, encoded value) entries and encoded tensor infos, padded to 32,
    then `data` zero bytes; the counts default to the true ones."""
    header = b"GGUF" + struct.pack(
        "<IQQ",
        version,
        len(tensors) if tensor_count is None else tensor_count,
        len(kv) if kv_count is None else kv_count,
    )
    header += b"".join(
        struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype % 2**32) + raw for key, vtype, raw in kv
    )
    header += b"".join(tensors)
    return header + b"\0" * (-len(header) % 32) + b"\0" * data


# ---------------------------------------------------------------------------------------------------
# byte mutation of valid files

LE_INTS = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**60, 2**63, 2**64 - 1)
JSON_TOKENS = (
    b"[",
    b"]",
    b"{",
    b"}",
    b'"',
    b",",
    b":",
    b"\\",
    b"null",
    b"true",
    b"-0",
    b"1e999",
    b"NaN",
    b"18446744073709551616",
    b"\\u0000",
    b"\\ud800",
    b"\xff",
    b"\xc0\x80",
    b"[" * 2000,
    b'{"a":' * 2000,
)


@st.composite
def mutated(draw: st.DrawFn, seed: bytes, hot_end: int, faults: list[str], json_text: bool = False) -> bytes:
    """`seed` with 1..8 edits, positions mostly below `hot_end` (the header: data bytes are never parsed)."""
    data = bytearray(seed)
    for _ in range(draw(st.sampled_from((1, 1, 1, 2, 2, 3, 8)))):
        limit = max(1, min(hot_end, len(data)) if draw(st.integers(0, 4)) else len(data))
        at = draw(st.integers(0, limit - 1)) if data else 0
        ops = ["flip", "byte", "int", "insert", "delete", "truncate", "duplicate"] + (
            ["token", "number"] if json_text else []
        )
        op = draw(st.sampled_from(ops))
        faults.append(op)
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte" and data:
            data[at] = draw(st.sampled_from((0, 0xFF, 0x7F, 0x80, ord('"'), ord("{"), ord("\\"), ord("\n"))))
        elif op == "int":
            width = draw(st.sampled_from((1, 2, 4, 8)))
            value = draw(st.sampled_from(LE_INTS)) % 2 ** (8 * width)
            data[at : at + width] = value.to_bytes(width, "little")
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        elif op == "truncate":
            del data[at:]
        elif op == "duplicate":
            chunk = bytes(data[at : at + draw(st.integers(1, 256))])
            data[at:at] = chunk * draw(st.integers(1, 64))
        elif op == "token":
            data[at:at] = draw(st.sampled_from(JSON_TOKENS))
        elif op == "number":  # rewrite the next number in the text with a hostile one
            match = re.compile(rb"-?\d+(\.\d+)?").search(bytes(data), at)
            if match:
                data[match.start() : match.end()] = str(
                    draw(st.sampled_from((*EDGE_INTS, *HUGE_INTS, *NEGATIVE_INTS, 1.5, 1e308)))
                ).encode()
    return bytes(data)


# ---------------------------------------------------------------------------------------------------
# valid files re-encoded with edits: GGUF keys and tensor infos, safetensors tensors

GGUF_INTS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}


@dataclass
class GGUFParts:
    """A valid GGUF split into what the edits change: key-value entries (key, value type, encoded value),
    tensor infos ([name, dims in ggml order, ggml type, offset into the data]) and the data section."""

    version: int
    kv: list[tuple[bytes, int, bytes]]
    tensors: list[list[Any]]
    alignment: int
    data: bytes


def _gguf_value_end(raw: bytes, at: int, vtype: int) -> int:
    if vtype in GGUF_SCALARS:
        return at + struct.calcsize(GGUF_SCALARS[vtype])
    if vtype == GGUF_STRING:
        return at + 8 + struct.unpack_from("<Q", raw, at)[0]
    element, count = struct.unpack_from("<IQ", raw, at)
    at += 12
    for _ in range(count):
        at = _gguf_value_end(raw, at, element)
    return at


def split_gguf(raw: bytes) -> GGUFParts:
    """The parts of a GGUF this suite wrote itself (so every length in it is true)."""
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", raw, 4)
    at, kv, alignment = 24, [], 32
    for _ in range(kv_count):
        length = struct.unpack_from("<Q", raw, at)[0]
        key = raw[at + 8 : at + 8 + length]
        vtype = struct.unpack_from("<I", raw, at + 8 + length)[0]
        start = at + 12 + length
        at = _gguf_value_end(raw, start, vtype)
        kv.append((key, vtype, raw[start:at]))
        if key == b"general.alignment":
            alignment = struct.unpack_from("<I", raw, start)[0]
    tensors = []
    for _ in range(tensor_count):
        length = struct.unpack_from("<Q", raw, at)[0]
        name = raw[at + 8 : at + 8 + length]
        at += 8 + length
        n_dims = struct.unpack_from("<I", raw, at)[0]
        dims = list(struct.unpack_from(f"<{n_dims}Q", raw, at + 4))
        ggml_type, offset = struct.unpack_from("<IQ", raw, at + 4 + 8 * n_dims)
        at += 4 + 8 * n_dims + 12
        tensors.append([name, dims, ggml_type, offset])
    return GGUFParts(version, kv, tensors, alignment, raw[at + (-at % alignment) :])


def join_gguf(parts: GGUFParts) -> bytes:
    header = b"GGUF" + struct.pack("<IQQ", parts.version, len(parts.tensors), len(parts.kv))
    header += b"".join(
        struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype) + raw for key, vtype, raw in parts.kv
    )
    header += b"".join(
        gguf_tensor_info(struct.pack("<Q", len(name)) + name, len(dims), dims, ggml_type, offset)
        for name, dims, ggml_type, offset in parts.tensors
    )
    return header + b"\0" * (-len(header) % parts.alignment) + parts.data


def encode_gguf_value(vtype: int, value: Any, element: int | None = None) -> bytes:
    """A Python value as GGUF encodes it in `vtype` (arrays: of `element`); integers wrap to the type."""
    if vtype in GGUF_INTS:
        bits = 8 * struct.calcsize(GGUF_INTS[vtype])
        wrapped = int(value) % 2**bits
        if GGUF_INTS[vtype][1].islower() and wrapped >= 2 ** (bits - 1):
            wrapped -= 2**bits
        return struct.pack(GGUF_INTS[vtype], wrapped)
    if vtype in (6, 12):
        return struct.pack(GGUF_SCALARS[vtype], float(value))
    if vtype == 7:
        return bytes([bool(value)])
    if vtype == GGUF_STRING:
        return gguf_text(str(value))
    element = element if element is not None else _element_type(value)
    return struct.pack("<IQ", element, len(value)) + b"".join(encode_gguf_value(element, v) for v in value)


def _element_type(values: list[Any]) -> int:
    first = values[0] if values else 0
    return (
        7
        if isinstance(first, bool)
        else 5
        if isinstance(first, int)
        else 6
        if isinstance(first, float)
        else 9
        if isinstance(first, list)
        else GGUF_STRING
    )


GGUF_EDITS = (
    "gguf-key",
    "gguf-key-type",
    "missing-key",
    "duplicate-key",
    "array-element",
    "array-length",
    "architecture",
    "tensor-shape",
    "tensor-name",
    "tensor-drop",
    "tensor-duplicate",
    "tensor-type",
)


@st.composite
def gguf_edit(
    draw: st.DrawFn,
    raw: bytes,
    fields: dict[str, Any],
    types: dict[str, tuple[int, ...]],
    keys: Sequence[str],
    faults: list[str],
    tensor_names: Sequence[str] = (),
    edits: Sequence[str] = GGUF_EDITS,
) -> bytes:
    """A valid GGUF with 1..3 edits among `edits`: `keys` (with `{arch}` in place) get hostile values, types,
    duplicates or go missing; arrays lose, repeat or change elements; tensor infos get other dims, names
    (`tensor_names` are names the readers expect) or types. Lengths stay true: only values lie."""
    parts = split_gguf(raw)
    arch = str(fields.get("general.architecture", ""))
    by_key = {key.decode("utf-8", "surrogatepass"): i for i, (key, _, _) in enumerate(parts.kv)}
    for _ in range(draw(st.sampled_from((1, 1, 2, 3)))):
        edit = draw(st.sampled_from(edits))
        if edit.startswith("tensor") and not parts.tensors:
            continue
        faults.append(edit)
        key = draw(st.sampled_from(keys)).replace("{arch}", arch)
        encoded = key.encode("utf-8", "surrogatepass")
        if edit in ("gguf-key", "gguf-key-type", "duplicate-key"):
            native = types.get(key, (None,))[0]
            if edit == "gguf-key-type" and key in fields:
                vtype, value = draw(_retyped(fields[key], faults))
            else:
                vtype, value = draw(
                    gguf_value(faults, None, native if native is not None and draw(st.booleans()) else None)
                )
            entry = (encoded, vtype, value)
            if key in by_key and edit != "duplicate-key":
                parts.kv[by_key[key]] = entry
            else:
                parts.kv.append(entry)
        elif edit == "missing-key" and key in by_key:  # renamed out of the way: the entries keep their places
            parts.kv[by_key[key]] = (b"general.dropped." + encoded, GGUF_STRING, gguf_text("x"))
        elif edit in ("array-element", "array-length"):
            arrays = [k for k in by_key if isinstance(fields.get(k), list)]
            if not arrays:
                continue
            name = draw(st.sampled_from(arrays))
            values = list(fields[name])
            if edit == "array-element" and values:
                at = draw(st.integers(0, len(values) - 1))
                values[at] = draw(
                    st.sampled_from(
                        (values[0], values[-1], values[at] + values[at] if not isinstance(values[at], bool) else True)
                    )
                    | _like(values[at])
                )
            else:
                size = draw(st.sampled_from((0, 1, max(0, len(values) - 1), len(values) + 1, 2 * len(values) + 3)))
                values = (values * (size // max(1, len(values)) + 1))[:size] if values else [0] * size
            element = types[name][1] if len(types[name]) > 1 else _element_type(values)
            parts.kv[by_key[name]] = (
                name.encode("utf-8", "surrogatepass"),
                GGUF_ARRAY,
                encode_gguf_value(GGUF_ARRAY, values, element),
            )
        elif edit == "architecture":
            other = draw(st.sampled_from(GGUF_ARCHS))
            parts.kv[by_key["general.architecture"]] = (b"general.architecture", GGUF_STRING, gguf_text(other))
        elif edit == "tensor-shape":
            tensor = draw(st.sampled_from(parts.tensors))
            dims = tensor[1]
            at = draw(st.integers(0, len(dims) - 1))
            # a u64 field: one below 0 wraps to 2^64 - 1, as a hostile writer would store it
            dims[at] = draw(
                st.sampled_from((0, 1, 2, dims[at] - 1, dims[at] + 1, dims[at] * 2, dims[at] // 2, 2**32))
            ) % (1 << 64)
            if len(dims) > 1 and draw(st.booleans()):
                dims.reverse()
        elif edit == "tensor-name":
            tensor = draw(st.sampled_from(parts.tensors))
            tensor[0] = draw(st.sampled_from([*tensor_names, *GGUF_TENSOR_NAMES])).encode("utf-8", "surrogatepass")
        elif edit == "tensor-drop":
            parts.tensors.pop(draw(st.integers(0, len(parts.tensors) - 1)))
        elif edit == "tensor-duplicate":
            parts.tensors.append(list(draw(st.sampled_from(parts.tensors))))
        else:
            draw(st.sampled_from(parts.tensors))[2] = draw(st.sampled_from(GGML_TYPES))
    return join_gguf(parts)


@st.composite
def _retyped(draw: st.DrawFn, value: Any, faults: list[str]) -> tuple[int, bytes]:
    """The same value in another GGUF type: 64 as a string, a float, a bool, an array, a negative i64."""
    if isinstance(value, list):
        return GGUF_STRING, gguf_text(str(value)[:200])
    kind = draw(st.sampled_from(("string", "float", "bool", "array", "int64", "int8")))
    faults.append(f"as-{kind}")
    if kind == "string":
        return GGUF_STRING, gguf_text(str(value))
    if kind == "float":
        return 12, struct.pack("<d", float(value) if not isinstance(value, str) else 1.5)
    if kind == "bool":
        return 7, bytes([1])
    if kind == "array":
        return GGUF_ARRAY, encode_gguf_value(GGUF_ARRAY, [value] if not isinstance(value, str) else [value], None)
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else 1
    return (11, struct.pack("<q", -abs(int(number)) - 1)) if kind == "int64" else (1, struct.pack("<b", -1))


def _like(value: Any) -> st.SearchStrategy[Any]:
    """A hostile value of the same Python type (array elements keep their GGUF element type)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.sampled_from((0, 1, -1, 2**31 - 1, 2**32 - 1, 1023, 1024, 65535))
    if isinstance(value, float):
        return st.sampled_from(ODD_FLOATS)
    return st.sampled_from(ODD_TEXT) | st.sampled_from(("a b", "a  b", " a b", "a b ", "ab", "a b c"))


def split_safetensors(raw: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(header without offsets, tensor name -> data) of a valid safetensors file."""
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    data = raw[8 + length :]
    tensors = {
        name: data[entry["data_offsets"][0] : entry["data_offsets"][1]]
        for name, entry in header.items()
        if name != "__metadata__"
    }
    return header, tensors


def join_safetensors(header: dict[str, Any], tensors: dict[str, bytes]) -> bytes:
    """A safetensors file of `tensors` in order; each header entry's offsets are where its data lands."""
    out, offset, chunks = {}, 0, []
    if "__metadata__" in header:
        out["__metadata__"] = header["__metadata__"]
    for name, data in tensors.items():
        out[name] = {**header[name], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    raw = json.dumps(out).encode()
    return struct.pack("<Q", len(raw)) + raw + b"".join(chunks)


def _nbytes(dtype: str, shape: Sequence[int]) -> int:
    return -(-_prod(list(shape)) * int(DTYPE_BYTES[dtype] * 2) // 2)


def _random_bytes(draw: st.DrawFn, size: int) -> bytes:
    import random

    return random.Random(draw(st.integers(0, 2**32))).randbytes(min(size, 1 << 20))


EXL3_EDITS = (
    "trellis-shape",
    "trellis-dtype",
    "trellis-data",
    "scale-shape",
    "scale-dtype",
    "scale-missing",
    "old-scales",
    "marker",
    "marker-both",
    "marker-dtype",
    "marker-value",
    "scale-values",
)
EXL3_MARKERS = {"mcg": 0xCBAC1FED - 2**32, "mul1": 0x83DCD12D - 2**32}  # int32 as stored


@st.composite
def exl3_edit(draw: st.DrawFn, raw: bytes, faults: list[str]) -> bytes:
    """A valid EXL3 safetensors file with 1..3 of its linears' parts made hostile, their data sized to fit (so
    the file parses and dequantize meets them): trellis sizes and dtypes, scale vectors, codebook markers."""
    header, tensors = split_safetensors(raw)
    modules = sorted(name.removesuffix(".trellis") for name in tensors if name.endswith(".trellis"))
    shapes = {module: header[module + ".trellis"]["shape"] for module in modules}  # before any edit

    def put(name: str, dtype: str, shape: list[int], data: bytes | None = None) -> None:
        header[name] = {"dtype": dtype, "shape": shape}
        tensors[name] = data if data is not None else _random_bytes(draw, _nbytes(dtype, shape))

    for _ in range(draw(st.sampled_from((1, 1, 2, 3)))):
        module = draw(st.sampled_from(modules))
        edit = draw(st.sampled_from(EXL3_EDITS))
        faults.append(edit)
        rows, cols, width = shapes[module]
        scale = draw(st.sampled_from((".suh", ".svh")))
        size = rows * 16 if scale == ".suh" else cols * 16
        if edit == "trellis-shape":
            shape = [
                draw(st.sampled_from((rows, 0, 1, 7, 8, 16, rows * 2))),
                draw(st.sampled_from((cols, 0, 1, 9, 8, 16))),
                draw(st.sampled_from((16, 32, 48, 64, 128, 24, 40, 56, 0, 17, 144, width))),
            ]
            put(
                module + ".trellis",
                "I16",
                draw(st.sampled_from((shape, shape[:2], shape + [1], []))) if draw(st.integers(0, 3)) == 0 else shape,
            )
        elif edit == "trellis-dtype":
            put(
                module + ".trellis",
                draw(st.sampled_from(("F16", "BF16", "I32", "U16", "U8", "F8_E4M3"))),
                [rows, cols, width],
            )
        elif edit == "trellis-data":
            put(
                module + ".trellis",
                "I16",
                [rows, cols, width],
                draw(st.sampled_from((b"\0", b"\xff", b"\x55"))) * _nbytes("I16", [rows, cols, width]),
            )
        elif edit == "scale-shape":
            put(module + scale, "F16", draw(st.sampled_from(([size + 16], [size - 1], [size, 1], [1, size], [], [0]))))
        elif edit == "scale-dtype":
            put(module + scale, draw(st.sampled_from(("F32", "BF16", "I16", "U8"))), [size])
        elif edit == "scale-missing":
            header.pop(module + scale, None)
            tensors.pop(module + scale, None)
        elif edit == "old-scales":  # the old sign bitfields: valid at [size / 16], else not
            header.pop(module + scale, None)
            tensors.pop(module + scale, None)
            put(
                module + scale[:-1],
                draw(st.sampled_from(("I16", "I16", "F16"))),
                [draw(st.sampled_from((size // 16, size // 16, size, 1)))],
            )
        elif edit == "scale-values":
            value = draw(
                st.sampled_from((b"\x00\x7c", b"\x00\xfc", b"\x01\x7e", b"\x00\x00", b"\xff\x7b"))
            )  # inf, -inf, nan, 0, max
            put(module + scale, "F16", [size], value * size)
        else:
            codebook = draw(st.sampled_from(sorted(EXL3_MARKERS)))
            value = EXL3_MARKERS[codebook]
            if edit == "marker-value":
                value = draw(
                    st.sampled_from((0, -1, 1, EXL3_MARKERS["mcg" if codebook == "mul1" else "mul1"], 2**31 - 1))
                )
            dtype, shape = ("I32", [])
            if edit == "marker-dtype":
                dtype, shape = draw(
                    st.sampled_from((("I64", []), ("F32", []), ("I16", []), ("I32", [1]), ("I32", [2])))
                )
            data = (
                (value % 2**64).to_bytes(8, "little")[: _nbytes(dtype, shape)]
                if dtype != "F32"
                else struct.pack("<f", 1.0)
            )
            put(module + "." + codebook, dtype, shape, data.ljust(_nbytes(dtype, shape), b"\0"))
            if edit == "marker-both":
                other = "mcg" if codebook == "mul1" else "mul1"
                put(module + "." + other, "I32", [], (EXL3_MARKERS[other] % 2**32).to_bytes(4, "little"))
    return join_safetensors(header, tensors)


MLX_VALUES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256, -4, 2**31, 2**64, 4.0, 4.5, "4", True, None, [4], {})


@st.composite
def mlx_quantization_edit(draw: st.DrawFn, config: dict[str, Any], raw: bytes, faults: list[str]) -> dict[str, bytes]:
    """An MLX checkpoint whose `quantization` block (defaults and per-module overrides) or whose scale tensors
    tell another story than the codes: config.json, and sometimes model.safetensors."""
    config = json.loads(json.dumps(config))
    header, tensors = split_safetensors(raw)
    modules = sorted(name.removesuffix(".scales") for name in tensors if name.endswith(".scales"))
    files: dict[str, bytes] = {}
    block = config.setdefault("quantization", {})
    for _ in range(draw(st.sampled_from((1, 1, 2, 3)))):
        edit = draw(
            st.sampled_from(
                ("default", "override", "override-kind", "mode", "scales-shape", "scales-dtype", "biases-missing")
            )
        )
        faults.append(f"mlx-{edit}")
        module = draw(st.sampled_from(modules))
        if edit == "default":
            block[draw(st.sampled_from(("bits", "group_size")))] = draw(st.sampled_from(MLX_VALUES))
        elif edit == "override":
            override = block.setdefault(module, {}) if isinstance(block.get(module), dict) else {}
            override[draw(st.sampled_from(("bits", "group_size")))] = draw(st.sampled_from(MLX_VALUES))
            block[module] = override
        elif edit == "override-kind":  # mlx-lm writes False for a module it left unquantized
            block[draw(st.sampled_from((module, module + ".weight", "lm_head", "")))] = draw(
                st.sampled_from((False, True, 8, "8", [], None, {"bits": 8, "group_size": 64}))
            )
        elif edit == "mode":
            block["mode"] = draw(st.sampled_from(("affine", "nvfp4", "mxfp4", "x", 4, None)))
        else:
            name = module + (".biases" if edit == "biases-missing" else ".scales")
            if name not in header:
                continue
            rows, groups = header[name]["shape"][:-1], header[name]["shape"][-1]
            if edit == "biases-missing":
                header.pop(name, None)
                tensors.pop(name, None)
            else:
                dtype = (
                    draw(st.sampled_from(("BF16", "F16", "F32", "U8")))
                    if edit == "scales-dtype"
                    else header[name]["dtype"]
                )
                shape = (
                    [*rows, draw(st.sampled_from((groups * 2, groups // 2, groups + 1, 1, 0)))]
                    if edit == "scales-shape"
                    else [*rows, groups]
                )
                header[name] = {"dtype": dtype, "shape": shape}
                tensors[name] = _random_bytes(draw, _nbytes(dtype, shape))
            files["model.safetensors"] = join_safetensors(header, tensors)
    files["config.json"] = encode_json(config)
    return files


LOCK_PATHS = (
    "/dev",
    "/dev/zero",
    "/proc/self",
    "/",
    "..",
    "../..",
    "~",
    "$HOME",
    ".",
    "",
    "model\x00",
    "\ud800",
    "\udcff",
    "a\nb",
    "/etc",
    "x" * 5000,
    "model/",
    "./model",
    "model/../model",
)
LOCK_FILE_NAMES = (
    "zero",
    "null",
    "fd/0",
    "stdin",
    "passwd",
    "../x",
    "/etc/passwd",
    ".",
    "a//b",
    "x\x00",
    "\ud800",
    "config.json/",
    "model.safetensors",
    "",
    "self/mem",
)


@st.composite
def lock_edit(draw: st.DrawFn, lock: dict[str, Any], keys: list[str], faults: list[str]) -> bytes:
    """specpair.lock with hostile edits: any key the reader looks up, the directory it names, file names, sizes."""
    document = json.loads(json.dumps(lock))
    kind = draw(st.sampled_from(("document", "document", "path", "file-name", "size", "repos")))
    repo = document["repos"][0]
    if kind == "path":
        faults.append("lock-path")
        repo["path"] = draw(st.sampled_from(LOCK_PATHS))
        if draw(st.booleans()):
            repo["files"][0].update(
                path=draw(st.sampled_from(LOCK_FILE_NAMES)), size=draw(st.sampled_from((0, 1, 4096)))
            )
    elif kind == "file-name":
        faults.append("lock-file-name")
        repo["files"][draw(st.integers(0, len(repo["files"]) - 1))]["path"] = draw(st.sampled_from(LOCK_FILE_NAMES))
    elif kind == "size":
        faults.append("lock-size")
        repo["files"][draw(st.integers(0, len(repo["files"]) - 1))]["size"] = draw(
            st.sampled_from((0, -1, 2**63, 2**64, True, 1.5, "1", None))
        )
    elif kind == "repos":
        faults.append("lock-repos")
        document["repos"] = draw(st.sampled_from(([], [repo] * 3, [repo, repo], [repo, {}], [None], {"0": repo})))
    else:
        containers = ((), ("repos", "0"), ("repos", "0", "selection"), ("repos", "0", "files", "0"))
        paths = key_paths(document) + [(*c, k) for c in containers for k in keys]
        return encode_json(draw(edited_document(document, paths, faults)), ascii_only=draw(st.booleans()))
    return encode_json(document, ascii_only=draw(st.booleans()))

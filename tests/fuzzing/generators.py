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
from specpair.checkpoint import MAX_LAYERS
from specpair.checkpoint.tokenizer import MAX_TOKENS
from specpair.formats.safetensors import DTYPE_BYTES, MAX_HEADER_BYTES

KeyPath = tuple[str, ...]  # a key path into a JSON document

SOURCE_ROOT = Path(__file__).resolve().parents[2]

# Boundaries of the formats and of specpair's own limits: where off-by-one and overflow bugs live.
EDGE_INTS = (
    0, 1, 2, 3, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 1023, 1024, 4095, 4096, 65535, 65536,
    MAX_LAYERS - 1, MAX_LAYERS, MAX_LAYERS + 1, MAX_TOKENS - 1, MAX_TOKENS, MAX_HEADER_BYTES, MAX_HEADER_BYTES + 1,
    2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**53, 2**53 + 1, 2**60, 2**62 - 1, 2**62, 2**63 - 1, 2**63,
    2**64 - 1,
)
HUGE_INTS = (2**64, 2**100, 10**30, 10**400)  # past 64 bits: orjson refuses them, Python's json does not
NEGATIVE_INTS = (-1, -2, -8, -2**31, -2**32, -2**53, -2**63, -2**63 - 1, -2**64)
ODD_FLOATS = (0.0, -0.0, 0.5, 1.5, 2.0, 64.0, 1e-310, 1e6, 1e16, 1e300, 1.7976931348623157e308, float("inf"),
              float("-inf"), float("nan"))
ODD_TEXT = (
    "", " ", "0", "64", "-1", "1e9", "true", "null", "NaN", "\n", "a\nb", "\r", "\x00", "\x1b[31m", "\u2028", "\x85",
    "\ufeff", "\u202e", "\ud800", "é", "e\u0301", "\U0001f600", "²", "٣", "../../etc/passwd", "/etc/passwd",
    "C:\\Windows", "%s%n", "{}", "{0}", "{target}", "[PAD0]", "<|im_end|>", "x" * 4096,
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
    kind = draw(st.sampled_from(("edge-int", "huge-int", "negative", "float", "bool", "null", "text", "wrong-container",
                                 "long", "deep-nesting")))
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
        return {"strings": lambda: ["x"] * n, "ints": lambda: [1] * n, "text": lambda: "x" * n * 10,
                "object": lambda: {f"k{i}": i for i in range(n)}}[shape]()
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
def edited_document(draw: st.DrawFn, base: dict[str, Any], paths: Sequence[KeyPath], faults: list[str],
                    max_edits: int = 4) -> Any:
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
    "model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight", "fc.weight", "d2t",
    "mtp.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.0.down_proj.weight", "a.weight_scale",
    "a.weight", "a.scales", "a.biases", "a.trellis", "a.weight_packed", "a.weight_scale_inv", "a.su", "mtp.layers.",
    "mtp.", "model.layers.٣.mlp.gate_proj.weight", "__metadata__", "",
)


SAFETENSORS_FAULTS = ("tensor-dtype", "tensor-shape", "tensor-offsets", "tensor-extra", "metadata", "overlap",
                      "whole-header", "length-prefix", "data-size")


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
            field = {"tensor-dtype": "dtype", "tensor-shape": "shape", "tensor-offsets": "data_offsets",
                     "tensor-extra": "extra"}[fault]
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
    "token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_q.weight", "blk.1.ffn_up_exps.weight",
    "blk.9.nextn.eh_proj.weight", "fc.weight", "dflash_fc.weight", "selector_hidden.weight", "blk.².attn_q.weight",
    "blk.٣.ffn_down.weight", "blk..x", "blk.", "",
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


GGUF_LIES = ("value-type", "string-length", "array-count", "invalid-utf8", "tensor-n_dims", "tensor-dim", "tensor-type",
             "tensor-offset", "tensor-count", "kv-count", "version", "data-size")


@st.composite
def gguf_value(draw: st.DrawFn, faults: list[str], lie: str | None, vtype: int | None = None,
               depth: int = 0) -> tuple[int, bytes]:
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
        tensors.append(gguf_tensor_info(draw(gguf_string(lie, st.just(name))), n_dims, dims, ggml_type,
                                        tensor_offset % 2**64))
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
    return name + struct.pack("<I", n_dims) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ggml_type, offset)


def gguf_bytes(kv: Sequence[tuple[bytes, int, bytes]], tensors: Sequence[bytes], data: int, version: int = 3,
               tensor_count: int | None = None, kv_count: int | None = None) -> bytes:
    """A GGUF file from (key, value type, encoded value) entries and encoded tensor infos, padded to 32,
    then `data` zero bytes; the counts default to the true ones."""
    header = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if tensor_count is None else tensor_count,
                                   len(kv) if kv_count is None else kv_count)
    header += b"".join(struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype % 2**32) + raw for key, vtype, raw in kv)
    header += b"".join(tensors)
    return header + b"\0" * (-len(header) % 32) + b"\0" * data


# ---------------------------------------------------------------------------------------------------
# byte mutation of valid files

LE_INTS = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**60, 2**63, 2**64 - 1)
JSON_TOKENS = (b"[", b"]", b"{", b"}", b'"', b",", b":", b"\\", b"null", b"true", b"-0", b"1e999", b"NaN",
               b"18446744073709551616", b"\\u0000", b"\\ud800", b"\xff", b"\xc0\x80", b"[" * 2000, b'{"a":' * 2000)


@st.composite
def mutated(draw: st.DrawFn, seed: bytes, hot_end: int, faults: list[str], json_text: bool = False) -> bytes:
    """`seed` with 1..8 edits, positions mostly below `hot_end` (the header: data bytes are never parsed)."""
    data = bytearray(seed)
    for _ in range(draw(st.sampled_from((1, 1, 1, 2, 2, 3, 8)))):
        limit = max(1, min(hot_end, len(data)) if draw(st.integers(0, 4)) else len(data))
        at = draw(st.integers(0, limit - 1)) if data else 0
        ops = ["flip", "byte", "int", "insert", "delete", "truncate", "duplicate"] + (["token", "number"] if json_text else [])
        op = draw(st.sampled_from(ops))
        faults.append(op)
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte" and data:
            data[at] = draw(st.sampled_from((0, 0xFF, 0x7F, 0x80, ord('"'), ord("{"), ord("\\"), ord("\n"))))
        elif op == "int":
            width = draw(st.sampled_from((1, 2, 4, 8)))
            value = draw(st.sampled_from(LE_INTS)) % 2 ** (8 * width)
            data[at:at + width] = value.to_bytes(width, "little")
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 64))]
        elif op == "truncate":
            del data[at:]
        elif op == "duplicate":
            chunk = bytes(data[at:at + draw(st.integers(1, 256))])
            data[at:at] = chunk * draw(st.integers(1, 64))
        elif op == "token":
            data[at:at] = draw(st.sampled_from(JSON_TOKENS))
        elif op == "number":  # rewrite the next number in the text with a hostile one
            match = re.compile(rb"-?\d+(\.\d+)?").search(bytes(data), at)
            if match:
                data[match.start():match.end()] = str(draw(st.sampled_from(
                    (*EDGE_INTS, *HUGE_INTS, *NEGATIVE_INTS, 1.5, 1e308)))).encode()
    return bytes(data)


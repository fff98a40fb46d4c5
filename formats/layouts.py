"""Which storage layout each tensor is in, told from tensor headers alone.

A quantized linear is stored as a weight plus companion tensors (scales, sign vectors, markers); the
companions decide the layout. Labels: bf16 | f16 | f32 | fp8-tensor | fp8-block | int8 |
nvfp4-modelopt | nvfp4-ct | nvfp4-mlx | nvfp4-gguf | mxfp4-mlx | int4-ct | affine{bits}-g{group} |
exl3-{bits}bpw | gguf-{TYPE} | int.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from specpair.formats import TensorInfo, TensorTable


@dataclass(frozen=True)
class LayoutKind:
    """One row of the layout table: a kind of storage and what code branches on for it."""

    name: str
    form: re.Pattern[str]  # its labels; groups are (flavour,), (bits, group) or (bits,)
    title: str  # as messages write it
    native_capability: tuple[int, int] | None = None  # the CUDA compute capability with tensor cores for it
    native: str = ""  # those tensor cores, for messages
    code_bits: int | None = None  # bits per code, for a kind of sub-byte codes packed into bytes or words


# Kinds code names (compat, codecs), defined once here
FLOAT, INT, FP8, NVFP4, MXFP4, INT4, INT8, AFFINE, GGUF, EXL3 = (
    "float",
    "int",
    "fp8",
    "nvfp4",
    "mxfp4",
    "int4",
    "int8",
    "affine",
    "gguf",
    "exl3",
)

# The registry, in the order labels are tried.
LAYOUT_KINDS: dict[str, LayoutKind] = {
    k.name: k
    for k in (
        LayoutKind(FLOAT, re.compile(r"(bf16|f16|f32|f64)"), "float"),
        LayoutKind(INT, re.compile(r"int"), "integer"),
        LayoutKind(FP8, re.compile(r"fp8-(tensor|block)"), "FP8", (8, 9), "FP8 tensor cores (Ada/Hopper)"),
        LayoutKind(
            NVFP4, re.compile(r"nvfp4-(modelopt|ct|mlx|gguf)"), "NVFP4", (10, 0), "FP4 tensor cores (Blackwell)", 4
        ),
        LayoutKind(MXFP4, re.compile(r"mxfp4-(mlx)"), "MXFP4", code_bits=4),
        LayoutKind(INT4, re.compile(r"int4-(ct)"), "INT4", code_bits=4),
        LayoutKind(INT8, re.compile(r"int8"), "INT8"),
        # bare "affine": MLX scales of no known group size
        LayoutKind(AFFINE, re.compile(r"affine(?:(\d)-g(\d+))?"), "MLX affine"),
        LayoutKind(GGUF, re.compile(r"gguf-(\w+)"), "GGUF"),
        LayoutKind(EXL3, re.compile(r"exl3-(\d+(?:\.\d+)?)bpw"), "EXL3"),
    )
}


@dataclass(frozen=True)
class Layout:
    """A layout label taken apart: every test of what a label is reads these fields, never the label's text."""

    label: str
    kind: str  # LAYOUT_KINDS key
    flavour: str | None = None  # fp8: tensor | block; nvfp4: modelopt | ct | mlx | gguf; gguf: the ggml type
    bits: float | None = None  # affine and exl3: bits per weight (exl3: trellis bits, half-integers read)
    group: int | None = None  # affine: values per scale

    @property
    def packing(self) -> tuple[int, int] | None:
        """(bits per stored element, bits per code) of a layout of packed codes: MLX packs them into 32-bit words,
        the others into bytes; None where a stored element is one weight (GGUF's block tensors have the weight's
        own shape) or the packing is unknown."""
        bits = LAYOUT_KINDS[self.kind].code_bits or (int(self.bits) if self.kind == AFFINE and self.bits else None)
        if bits is None or self.flavour == "gguf":
            return None
        return (32 if self.flavour == "mlx" or self.kind == AFFINE else 8), bits

    def matches(self, names: tuple[str, ...] | set[str] | frozenset[str]) -> bool:
        """Whether `names` (layout labels or kinds: "fp8" covers fp8-tensor and fp8-block) hold this layout."""
        return self.label in names or self.kind in names


@functools.cache
def layout_of(label: str) -> Layout:
    """The parsed form of a layout label; ValueError for a label no row of LAYOUT_KINDS has."""
    for kind in LAYOUT_KINDS.values():
        m = kind.form.fullmatch(label)
        if m is None:
            continue
        if kind.name == AFFINE:
            return Layout(label, AFFINE, bits=float(m[1]) if m[1] else None, group=int(m[2]) if m[2] else None)
        if kind.name == EXL3:
            return Layout(label, EXL3, bits=float(m[1]))
        return Layout(label, kind.name, flavour=m.groups()[0] if m.groups() else None)
    raise ValueError(f"{label!r} is not a layout label")


FLOAT_DTYPES = {"BF16": "bf16", "F16": "f16", "F32": "f32", "F64": "f64"}
FP8_DTYPES = {"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}

# Suffixes that name the stored weight itself, then companions that only make sense beside one.
WEIGHT_SUFFIXES = (".weight_packed", ".trellis", ".weight")
COMPANION_SUFFIXES = (
    ".weight_scale_inv",
    ".weight_scale_2",
    ".weight_scale",
    ".weight_global_scale",
    ".weight_zero_point",
    ".weight_shape",
    ".input_scale",
    ".input_global_scale",
    ".scales",
    ".biases",
    ".global_scale",
    ".suh",
    ".svh",
    ".su",
    ".sv",
    ".mcg",
    ".mul1",
    ".k_scale",
    ".v_scale",
)

GGUF_LAYOUTS = {"F32": "f32", "F16": "f16", "BF16": "bf16", "NVFP4": "nvfp4-gguf"}
AFFINE_BITS = (1, 2, 3, 4, 5, 6, 8)  # formats/affine.py, without importing torch
AFFINE_GROUPS = (32, 64, 128)


SUFFIXES = frozenset(COMPANION_SUFFIXES + WEIGHT_SUFFIXES)  # each is one name component


def split_module(name: str) -> tuple[str, str]:
    """'a.b.weight_scale' -> ('a.b', '.weight_scale'); names without a known suffix are their own module."""
    module, dot, last = name.rpartition(".")
    if dot and "." + last in SUFFIXES:
        return module, "." + last
    return name, ""


LAST_COMPONENTS = frozenset(suffix[1:] for suffix in SUFFIXES)


def modules_of(names: list[str]) -> tuple[list[str], list[str], dict[str, list[int]]]:
    """(each name's module, each name's suffix, module -> its rows), modules in first-appearance order: what
    `split_module` gives name by name, in a few passes over the columns."""
    split = [name.rpartition(".") for name in names]
    suffixes = ["." + last if dot and last in LAST_COMPONENTS else "" for _, dot, last in split]
    modules = [module if suffix else name for (module, _, _), suffix, name in zip(split, suffixes, names)]
    rows_of: dict[str, list[int]] = {}
    for k, module in enumerate(modules):
        rows = rows_of.get(module)
        if rows is None:
            rows_of[module] = [k]
        else:
            rows.append(k)
    return modules, suffixes, rows_of


def classify(tensors: list[TensorInfo], mlx: dict | None = None) -> dict[str, str]:
    """Layout label for every tensor name; `mlx` is an MLX config's `quantization` block when it has one
    (default bits and group size, and per-module overrides)."""
    table = TensorTable.of(tensors)
    return dict(zip(table.names, classify_table(table, mlx)))


def classify_table(
    table: TensorTable,
    mlx: dict | None = None,
    modules: tuple[list[str], list[str], dict[str, list[int]]] | None = None,
) -> list[str]:
    """`classify` over columns: the label of each row. A module's label depends only on its parts' suffixes,
    dtypes and last dimensions, so it is worked out once per distinct combination, not once per module."""
    mlx = mlx if isinstance(mlx, dict) else {}
    module_of, suffixes, rows_of = modules or modules_of(table.names)
    parts_of_row = list(zip(suffixes, table.dtypes, [shape[-1] if shape else None for shape in table.shapes]))
    default = (_int(mlx.get("bits")), _int(mlx.get("group_size")))
    known: dict[tuple, str | None] = {}
    label_of: dict[str, str | None] = {}
    for module, rows in rows_of.items():
        params = mlx.get(module) if mlx else None
        affine = (_int(params.get("bits")), _int(params.get("group_size"))) if isinstance(params, dict) else default
        key = (affine, *map(parts_of_row.__getitem__, rows))
        label = known.get(key, False)
        if label is False:
            label = known[key] = module_layout({suffix: (dtype, last) for suffix, dtype, last in key[1:]}, *affine)
        label_of[module] = label
    return [label_of[module] or plain_layout(dtype) for module, dtype in zip(module_of, table.dtypes)]


def gguf_layout(ggml_type: str) -> str:
    return GGUF_LAYOUTS.get(ggml_type, f"gguf-{ggml_type}")


Part = tuple[str, int | None]  # (dtype, last dimension; None for a scalar)


def module_layout(parts: dict[str, Part], affine_bits: int | None, affine_group: int | None) -> str | None:
    if ".trellis" in parts and parts[".trellis"][1] is not None:
        bits = parts[".trellis"][1] / 16
        return f"exl3-{bits:g}bpw"
    if ".weight_packed" in parts:
        scale = parts.get(".weight_scale")
        return "nvfp4-ct" if scale is not None and scale[0] in FP8_DTYPES else "int4-ct"
    weight = parts.get(".weight")
    if weight is None:
        return None
    dtype = weight[0]
    if dtype == "U8" and ".weight_scale" in parts and parts[".weight_scale"][0] in FP8_DTYPES:
        return "nvfp4-modelopt"
    if dtype == "U32" and ".scales" in parts and weight[1] is not None and parts[".scales"][1] is not None:
        return _mlx_layout(weight[1], parts[".scales"][1], ".biases" in parts, affine_bits, affine_group)
    if dtype in FP8_DTYPES:
        return "fp8-block" if ".weight_scale_inv" in parts else "fp8-tensor"
    if dtype == "I8" and ".weight_scale" in parts:
        return "int8"
    return None


def _mlx_layout(words: int, groups: int, has_biases: bool, bits: int | None, group: int | None) -> str:
    if not has_biases:  # nvfp4 (group 16) or mxfp4 (group 32): 4-bit codes, 8 per word, 8-bit scales
        return "nvfp4-mlx" if groups and words * 8 == groups * 16 else "mxfp4-mlx"
    if groups == 0:
        return "affine"
    per_group_bits = words * 32 // groups  # = bits * group_size
    # the config's group size, then its bits, then MLX's usual groups: the first that gives a real layout
    candidates = (
        ([group] if group else [])
        + ([per_group_bits // bits] if bits and per_group_bits % bits == 0 else [])
        + [64, 32, 128]
    )
    for g in candidates:
        if g in AFFINE_GROUPS and per_group_bits % g == 0 and per_group_bits // g in AFFINE_BITS:
            return f"affine{per_group_bits // g}-g{g}"
    return "affine"


def plain_layout(dtype: str) -> str:
    """The label of a tensor with no companions: its float dtype, a lone FP8 tensor's per-tensor layout, or int."""
    if dtype in FLOAT_DTYPES:
        return FLOAT_DTYPES[dtype]
    if dtype in FP8_DTYPES:
        return "fp8-tensor"
    return "int"


# the labels plain_layout gives
PLAIN_LAYOUTS = frozenset({*FLOAT_DTYPES.values(), plain_layout(next(iter(FP8_DTYPES))), plain_layout("I32")})


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

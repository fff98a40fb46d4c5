"""The column passes that read a MoE export's ~10^5 tensors (safetensors headers, tensor groups) give what the
tensor-by-tensor code gives: the same tensors and groups for good input, the same one-line error for bad."""

from __future__ import annotations

import random

import pytest

from specpair.checkpoint.groups import summarize_hf, summarize_table
from specpair.errors import BadInput
from specpair.formats import TensorTable
from specpair.formats.layouts import classify_table, modules_of
from specpair.formats.safetensors import parse_header_json, parse_header_table

EXPERT_PARTS = [  # NVFP4 as ModelOpt stores it, one module per expert
    ("weight", "U8", [64, 32]),
    ("weight_scale", "F8_E4M3", [64, 4]),
    ("weight_scale_2", "F32", []),
    ("input_scale", "F32", []),
]


def moe_tensors() -> list[tuple[str, str, list[int]]]:
    tensors = [("model.embed_tokens.weight", "BF16", [256, 64])]
    for layer in range(3):
        prefix = f"model.layers.{layer}"
        tensors += [
            (f"{prefix}.input_layernorm.weight", "BF16", [64]),
            (f"{prefix}.linear_attn.A_log", "F32", [8]),  # ends in no part name: its own module
            (f"{prefix}.linear_attn.dt_bias", "BF16", [8]),
            (f"{prefix}.mlp.gate.weight", "BF16", [12, 64]),
            (f"{prefix}.mlp.shared_expert_gate.weight", "BF16", [1, 64]),
        ]
        for expert in range(12):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                tensors += [(f"{prefix}.mlp.experts.{expert}.{proj}.{part}", d, s) for part, d, s in EXPERT_PARTS]
    tensors += [
        ("model.visual.blocks.0.mlp.linear_fc1.weight", "BF16", [32, 16]),
        ("model.visual.blocks.0.mlp.linear_fc1.bias", "BF16", [32]),
        ("model.visual.blocks.1.mlp.linear_fc1.weight", "BF16", [32, 16]),  # a kind whose modules lack a part
        ("weight", "BF16", [4]),  # no dot: its own module, though a part name
        (".weight", "BF16", [4]),
        ("lm_head.weight", "BF16", [256, 64]),
    ]
    return tensors


def header_of(tensors: list[tuple[str, str, list[int]]], gaps: int = 0) -> dict:
    """A header with the data in header order, `gaps` bytes between tensors, zero-length tensors included."""
    from specpair.formats.safetensors import DTYPE_BYTES

    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in tensors:
        count = 1
        for d in shape:
            count *= d
        nbytes = -(-count * DTYPE_BYTES[dtype] // 1)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + int(nbytes)]}
        offset += int(nbytes) + gaps
    return header


def table_of(header: dict) -> TensorTable:
    tensors, _ = parse_header_json(header, None, "h", 8)
    table = TensorTable.of(tensors)
    return table


@pytest.mark.parametrize("order", ["header order", "gaps", "shuffled", "with empty tensors"])
def test_columns_equal_the_tensor_by_tensor_reading(order: str) -> None:
    tensors = moe_tensors()
    if order == "with empty tensors":
        tensors = [("empty.a", "F32", [0]), *tensors[:5], ("empty.b", "BF16", [0, 4]), *tensors[5:]]
    header = header_of(tensors, gaps=8 if order == "gaps" else 0)
    if order == "shuffled":  # the data no longer in header order: the sort decides
        items = list(header.items())
        random.Random(0).shuffle(items)
        header = dict(items)
    table, metadata = parse_header_table(header, 10**9, "h", 8)
    expected, expected_metadata = parse_header_json(header, 10**9, "h", 8)
    assert table.infos() == expected and metadata == expected_metadata


def overlapping(shuffled: bool) -> dict:
    header = header_of(moe_tensors())
    names = [n for n in header if n != "__metadata__"]
    victim = header[names[7]]
    begin, end = victim["data_offsets"]
    size = end - begin
    earlier = header[names[6]]["data_offsets"][0]
    victim["data_offsets"] = [earlier, earlier + size]  # the same size, starting inside the tensor before it
    if shuffled:
        items = list(header.items())
        random.Random(1).shuffle(items)
        header = dict(items)
    return header


@pytest.mark.parametrize(
    "bad",
    [
        lambda h: overlapping(False),
        lambda h: overlapping(True),
        lambda h: {**h, "x.weight": {"dtype": "BF16", "shape": [True, 2], "data_offsets": [0, 4]}},
        lambda h: {**h, "x.weight": {"dtype": "BF16", "shape": [2**62, 0], "data_offsets": [0, 0]}},
        lambda h: {**h, "x.weight": {"dtype": "BF16", "shape": [[2], 2], "data_offsets": [0, 4]}},
        lambda h: {**h, "x.weight": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 4]}},
        lambda h: {**h, "x.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4, 4]}},
        lambda h: {**h, "x.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [10**12, 10**12 + 4]}},
        lambda h: {**h, "x.weight": [1, 2]},
    ],
    ids=[
        "overlap",
        "overlap out of order",
        "bool dim",
        "huge dim",
        "nested shape",
        "dtype",
        "offsets",
        "past the end",
        "entry",
    ],
)
def test_bad_headers_get_the_tensor_by_tensor_error(bad) -> None:
    header = bad(header_of(moe_tensors()))
    with pytest.raises(BadInput) as expected:
        parse_header_json(header, 10**9, "h", 8)
    with pytest.raises(BadInput) as got:
        parse_header_table(header, 10**9, "h", 8)
    assert got.value.problem == expected.value.problem and "\n" not in got.value.problem


@pytest.mark.parametrize("mlx", [None, {"bits": 4, "group_size": 64}])
def test_grouped_summary_equals_the_per_module_one(mlx: dict | None) -> None:
    table = table_of(header_of(moe_tensors()))
    modules = modules_of(table.names)
    per_module = summarize_table(table, classify_table(table, mlx or {}, modules), modules=modules)
    groups = summarize_hf(table, mlx)
    assert groups == per_module
    assert {g.group for g in groups} >= {"experts", "linear_attention", "router", "vision", "norm", "other"}
    assert sum(g.tensors for g in groups) == len(table)

"""Malformed checkpoints: `specpair inspect` exits 2 with one `error: <file>: <problem>` line, no traceback.

Each case writes one broken file next to otherwise valid ones and names the file the message must
mention. The CLI runs as a subprocess, exactly as a user would run it.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures import build_dflash, build_gguf_target, build_target

Case = Callable[[Path], tuple[Path, Path]]  # tmp dir -> (what to inspect, the file the error must name)


def safetensors_bytes(header: object, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(raw)) + raw + data


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def gguf_bytes(tensor_count: int, kv: bytes = b"", kv_count: int = 0, tail: bytes = b"\0" * 64) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count) + kv + tail


def with_weights(header: object, data: bytes = b"") -> Case:
    """A valid tiny Qwen3 whose model.safetensors is replaced by the given header and data."""

    def make(tmp: Path) -> tuple[Path, Path]:
        root = build_target(tmp / "model", "qwen3", layers=1)
        (root / "model.safetensors").write_bytes(safetensors_bytes(header, data))
        return root, root / "model.safetensors"

    return make


def with_raw_weights(raw: bytes) -> Case:
    def make(tmp: Path) -> tuple[Path, Path]:
        root = build_target(tmp / "model", "qwen3", layers=1)
        (root / "model.safetensors").write_bytes(raw)
        return root, root / "model.safetensors"

    return make


def with_config(edit: Callable[[dict], object] | bytes, drafter: bool = False) -> Case:
    """A valid tiny Qwen3 (or DFlash drafter) whose config.json is edited, or replaced by raw bytes."""

    def make(tmp: Path) -> tuple[Path, Path]:
        root = build_dflash(tmp / "model") if drafter else build_target(tmp / "model", "qwen3", layers=1)
        config = root / "config.json"
        if isinstance(edit, bytes):
            config.write_bytes(edit)
        else:
            document = json.loads(config.read_text())
            edit(document)
            config.write_text(json.dumps(document))
        return root, config

    return make


def with_index(edit: Callable[[dict], object]) -> Case:
    """A two-shard target whose shards are not named as a huggingface_hub series (model-0000k-of-0000n), so that
    its index decides what is read, with the index edited."""

    def make(tmp: Path) -> tuple[Path, Path]:
        root = build_target(tmp / "model", "qwen3", layers=1, shards=2)
        index = root / "model.safetensors.index.json"
        document = json.loads(index.read_text())
        renames = {
            shard: f"part-{k}.safetensors" for k, shard in enumerate(sorted(set(document["weight_map"].values())))
        }
        for old, new in renames.items():
            (root / old).rename(root / new)
        document["weight_map"] = {name: renames[shard] for name, shard in document["weight_map"].items()}
        edit(document)
        index.write_text(json.dumps(document))
        return root, index

    return make


def series_missing_a_shard(tmp: Path) -> tuple[Path, Path]:
    """model-00002-of-00002.safetensors gone from a two-shard series (an interrupted download): named without
    reading the index."""
    root = build_target(tmp / "model", "qwen3", layers=1, shards=2)
    (root / "model-00002-of-00002.safetensors").unlink()
    return root, root


def gguf_file(raw: bytes | Callable[[bytes], bytes]) -> Case:
    """A .gguf file: given bytes, or a valid tiny Llama GGUF passed through an edit."""

    def make(tmp: Path) -> tuple[Path, Path]:
        path = tmp / "model.gguf"
        if isinstance(raw, bytes):
            path.write_bytes(raw)
        else:
            valid = build_gguf_target(tmp / "valid.gguf", "llama", layers=1).read_bytes()
            path.write_bytes(raw(valid))
        return path, path

    return make


def gguf_kv(key: str, vtype: int, value: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", vtype) + value


def replace_gguf_u32(key: str, value: int) -> Callable[[bytes], bytes]:
    """Overwrite the u32 value of `key` in a GGUF written by the fixtures."""

    def edit(raw: bytes) -> bytes:
        at = raw.index(gguf_string(key)) + len(gguf_string(key))
        assert struct.unpack_from("<I", raw, at)[0] == 4  # value type u32
        return raw[: at + 4] + struct.pack("<I", value) + raw[at + 8 :]

    return edit


def nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def set_key(key: str, value: object) -> Callable[[dict], None]:
    return lambda document: document.__setitem__(key, value)


def delete_key(key: str) -> Callable[[dict], None]:
    return lambda document: document.__delitem__(key)


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
NORM = "model.norm.weight"  # a tensor of the last shard of the two-shard fixture
OUTPUT = gguf_string("output.weight")  # the last tensor info of the GGUF fixture

CASES: dict[str, Case] = {
    # safetensors headers
    "safetensors truncated before the length": with_raw_weights(b"\x10\0\0\0\0"),
    "safetensors header length past the end": with_raw_weights(struct.pack("<Q", 10_000) + b'{"a": 1}'),
    "safetensors header length zero": with_raw_weights(struct.pack("<Q", 0) + b"\0" * 16),
    "safetensors header not UTF-8": with_weights(b"\xff\xfe\xfd" + b" " * 13, b"\0" * 8),
    "safetensors header not JSON": with_weights(b'{"a": {"dtype": ', b"\0" * 8),
    "safetensors header not an object": with_weights([1, 2]),
    "safetensors overlapping offsets": with_weights({"a": F32, "b": {**F32, "data_offsets": [4, 12]}}, b"\0" * 12),
    "safetensors offsets past the end": with_weights(
        {"a": {**F32, "shape": [1024], "data_offsets": [0, 4096]}}, b"\0" * 64
    ),
    "safetensors span does not match the shape": with_weights({"a": {**F32, "data_offsets": [0, 12]}}, b"\0" * 12),
    "safetensors unknown dtype": with_weights({"a": {**F32, "dtype": "F12"}}, b"\0" * 8),
    "safetensors dtype not a string": with_weights({"a": {**F32, "dtype": ["F32"]}}, b"\0" * 8),
    "safetensors shape not integers": with_weights({"a": {**F32, "shape": [2.0]}}, b"\0" * 8),
    "safetensors shape out of range": with_weights({"a": {**F32, "dtype": "F4", "shape": [2**61] * 17}}, b"\0" * 8),
    "safetensors negative offset": with_weights({"a": {**F32, "data_offsets": [-8, 0]}}, b"\0" * 8),
    "safetensors __metadata__ value not a string": with_weights(
        {"__metadata__": {"format": ["pt"]}, "a": F32}, b"\0" * 8
    ),
    "safetensors header 100000 levels deep": with_raw_weights(
        struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000
    ),
    # config.json
    "config not UTF-8": with_config(b'{"hidden_size": "\xff\xfe"}'),
    "config not JSON": with_config(b'{"hidden_size": 64,'),
    "config not an object": with_config(b"[1, 2, 3]"),
    "config missing hidden_size": with_config(delete_key("hidden_size")),
    "config hidden_size a string": with_config(set_key("hidden_size", "64")),
    "config hidden_size a bool": with_config(set_key("hidden_size", True)),
    "config num_attention_heads zero": with_config(set_key("num_attention_heads", 0)),
    "config architectures a string": with_config(set_key("architectures", "Qwen3ForCausalLM")),
    "config layer_types not strings": with_config(set_key("layer_types", [0, 1])),
    "config absurd layer count": with_config(set_key("num_hidden_layers", 10**12)),
    "config absurd hybrid layer count": with_config(
        lambda c: c.update(num_hidden_layers=10**10, full_attention_interval=4)
    ),
    "config nested 100 levels deep": with_config(set_key("rope_scaling", {"rope_type": "yarn", "factor": nested(100)})),
    "dflash taps not a list": with_config(lambda c: c["dflash_config"].update(target_layer_ids="1,5"), drafter=True),
    "dflash taps not integers": with_config(
        lambda c: c["dflash_config"].update(target_layer_ids=[1.5, 5]), drafter=True
    ),
    "dflash block_size a string": with_config(lambda c: c["dflash_config"].update(block_size="16"), drafter=True),
    # shard index
    "index names a missing shard": with_index(lambda d: d["weight_map"].update({NORM: "part-9.safetensors"})),
    "index maps a tensor to the wrong shard": with_index(
        lambda d: d["weight_map"].update(
            {NORM: next(s for s in d["weight_map"].values() if s != d["weight_map"][NORM])}
        )
    ),
    "index weight_map not an object": with_index(lambda d: d.update(weight_map=["part-0.safetensors"])),
    "shard series with a shard missing": lambda tmp: series_missing_a_shard(tmp),
    # GGUF
    "gguf bad magic": gguf_file(lambda raw: b"GGML" + raw[4:]),
    "gguf unsupported version": gguf_file(lambda raw: raw[:4] + struct.pack("<I", 7) + raw[8:]),
    "gguf truncated in the metadata": gguf_file(lambda raw: raw[:300]),
    "gguf truncated in the tensor infos": gguf_file(
        lambda raw: raw[: raw.rindex(OUTPUT) + len(OUTPUT) + 2]
    ),  # in n_dims
    "gguf shorter than a header": gguf_file(b"GGUF\x03\0\0\0"),
    "gguf absurd tensor count": gguf_file(gguf_bytes(tensor_count=2**40)),
    "gguf absurd metadata count": gguf_file(gguf_bytes(tensor_count=0, kv_count=2**40)),
    "gguf string length 2^60": gguf_file(gguf_bytes(0, struct.pack("<Q", 2**60) + b"general.name", kv_count=1)),
    "gguf unknown value type": gguf_file(gguf_bytes(0, gguf_kv("general.name", 13, b"\0" * 8), kv_count=1)),
    "gguf absurd array count": gguf_file(gguf_bytes(0, gguf_kv("a", 9, struct.pack("<IQ", 8, 2**50)), kv_count=1)),
    "gguf unknown array element type": gguf_file(gguf_bytes(0, gguf_kv("a", 9, struct.pack("<IQ", 42, 1)), kv_count=1)),
    "gguf tensor with zero dimensions": gguf_file(gguf_bytes(1, gguf_string("t") + struct.pack("<IIQ", 0, 0, 0))),
    "gguf unknown ggml type": gguf_file(gguf_bytes(1, gguf_string("t") + struct.pack("<IQIQ", 1, 32, 999, 0))),
    "gguf tensor data past the end": gguf_file(gguf_bytes(1, gguf_string("t") + struct.pack("<IQIQ", 1, 2**20, 0, 0))),
    "gguf no architecture": gguf_file(gguf_bytes(0, gguf_kv("general.name", 8, gguf_string("x")), kv_count=1)),
    "gguf architecture with a newline": gguf_file(
        gguf_bytes(0, gguf_kv("general.architecture", 8, gguf_string("llama\nx")), kv_count=1)
    ),
    "gguf absurd block count": gguf_file(replace_gguf_u32("llama.block_count", 2**32 - 1)),
    "gguf zero heads": gguf_file(replace_gguf_u32("llama.attention.head_count", 0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    target, named = CASES[case](tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "specpair", "inspect", str(target)], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert str(named) in lines[0]
    assert done.stdout == ""


def test_the_unedited_fixtures_are_accepted(tmp_path: Path) -> None:
    """Every case above starts from a fixture that inspects cleanly, so only the edit is to blame."""
    for name, make in [
        ("target", lambda p: build_target(p, "qwen3", layers=1)),
        ("sharded", lambda p: build_target(p, "qwen3", layers=1, shards=2)),
        ("drafter", build_dflash),
        ("gguf", lambda p: build_gguf_target(p.with_suffix(".gguf"), "llama", layers=1)),
    ]:
        path = make(tmp_path / name)
        done = subprocess.run(
            [sys.executable, "-m", "specpair", "inspect", str(path), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert json.loads(done.stdout)["schema"] == "specpair.inspect/1"

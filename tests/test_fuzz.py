"""Fuzzing every parser in CI: a few hundred Hypothesis inputs per parser and mode, the file in about two minutes.

Parsers: safetensors headers, GGUF headers and metadata, config.json, tokenizer.json (with
tokenizer_config.json and generation_config.json), model.safetensors.index.json, and the
quantization configs (quantization_config, hf_quant_config.json, MLX `quantization`, EXL3
quantization_config.json), through `specpair inspect` or `specpair check` (with or without --json);
and through `specpair convert` the converter's own parsers: tokenizer.json -> GGUF keys, GGUF
tokenizer keys -> tokenizer files, GGUF headers -> config.json and tensor maps (dflash and the fork's
dflash-draft too), EXL3 trellis/scales/markers -> dequantize, MLX quantization overrides -> layouts,
and planning on hostile checkpoints (tests/test_hostile.py's layouts); and specpair.lock through
`specpair verify` and `check`. Each input runs in-process on a tiny checkpoint carrying it; the
property (tests/fuzzing/targets.py) is that it is accepted or refused with one BadInput line naming
a file of that checkpoint (for convert also a tensor of it), in under 5 s of CPU time, without
allocating by what a header merely claims, opening nothing outside the checkpoint, and (convert)
leaving no partial output behind. Inputs are derandomized, so CI is repeatable; the long run
(tests/fuzzing/run.py, docs/reliability.md) explores with other seeds. Below the fuzzing, the inputs
the long runs found crashing, kept as examples.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator

import pytest
from fuzzing.generators import (
    Deep,
    encode_gguf_value,
    encode_json,
    gguf_bytes,
    gguf_tensor_info,
    gguf_text,
    join_gguf,
    join_safetensors,
    split_gguf,
    split_safetensors,
)
from fuzzing.targets import (
    MODES,
    TARGETS,
    Case,
    Outcome,
    Workspace,
    cases,
    exercise,
    remove_workspace,
    temporary_workspace,
)
from hypothesis import HealthCheck, Phase, given, settings


@pytest.fixture(scope="module")
def workspace() -> Iterator[Workspace]:
    built = temporary_workspace()
    yield built
    remove_workspace(built)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("parser", list(TARGETS))
def test_every_input_is_accepted_or_refused_in_one_line(workspace: Workspace, parser: str, mode: str) -> None:
    outcomes: list[Outcome] = []

    @settings(
        max_examples=TARGETS[parser].examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
        # no explain phase: it replays a failure under a line tracer, slow enough to fire the alarm and hide the failure
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    )
    @given(cases(workspace, TARGETS[parser], mode))
    def fuzz(case: Case) -> None:
        outcomes.append(exercise(workspace, case))

    fuzz()
    # Both answers occur, so the inputs reach past the first check and the parser still refuses some.
    assert any(o.accepted for o in outcomes) and any(not o.accepted for o in outcomes)


# ---------------------------------------------------------------------------------------------------
# inputs the long run found crashing, each with the answer it gets now (None: accepted)


def safetensors_file(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 64


def gguf_u32(key: str, value: int) -> tuple[bytes, int, bytes]:
    return key.encode(), 4, struct.pack("<I", value)


def gguf_llama(
    arch: str = "llama", head_count: tuple[int, bytes] | None = None, tensor: str = "token_embd.weight"
) -> bytes:
    kv = [
        (b"general.architecture", 8, gguf_text(arch)),
        gguf_u32(f"{arch}.block_count", 1),
        gguf_u32(f"{arch}.embedding_length", 32),
        gguf_u32(f"{arch}.vocab_size", 8),
    ]
    vtype, value = head_count or (4, struct.pack("<I", 4))
    kv.append((f"{arch}.attention.head_count".encode(), vtype, value))
    return gguf_bytes(kv, [gguf_tensor_info(gguf_text(tensor), 2, [32, 8], 0, 0)], 32 * 8 * 4)


def edited(workspace: Workspace, base: str, file: str, edit: Callable[[dict], object]) -> dict[str, bytes]:
    document = workspace.document(base, file)
    edit(document)
    return {file: encode_json(document)}


def duplicate_special_content(tokenizer: dict) -> None:
    tokenizer["added_tokens"] += [
        {"content": "<x>", "id": "seven", "special": True},
        {"content": "<x>", "id": 7, "special": True},
    ]


FOUND: dict[str, tuple[str, Callable[[Workspace], dict[str, bytes]], str | None]] = {
    # safetensors: classify() took shape[-1] of a scalar companion tensor
    "scalar .trellis shape": (
        "qwen3",
        lambda w: {
            "model.safetensors": safetensors_file({"a.trellis": {"dtype": "I16", "shape": [], "data_offsets": [0, 2]}})
        },
        None,
    ),
    "scalar MLX .scales shape": (
        "qwen3-mlx",
        lambda w: {
            "model.safetensors": safetensors_file(
                {
                    "a.weight": {"dtype": "U32", "shape": [], "data_offsets": [0, 4]},
                    "a.scales": {"dtype": "F16", "shape": [], "data_offsets": [4, 6]},
                    "a.biases": {"dtype": "F16", "shape": [], "data_offsets": [6, 8]},
                }
            )
        },
        None,
    ),
    # json.loads recursed once per level of the header
    "safetensors header 100000 levels deep": (
        "qwen3",
        lambda w: {"model.safetensors": struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000},
        "nested too deeply",
    ),
    # GGUF: "²".isdigit() is true, int("²") raises
    "GGUF tensor blk.².attn_q.weight": (
        "gguf-llama",
        lambda w: {"model.gguf": gguf_llama(tensor="blk.².attn_q.weight")},
        None,
    ),
    # GGUF: the architecture name went into key names and messages, newline included
    "GGUF architecture with a newline": (
        "gguf-llama",
        lambda w: {"model.gguf": gguf_llama(arch="a\nb")},
        "is not an architecture name",
    ),
    # GGUF: max() over an array of arrays of different element types
    "GGUF head_count as mixed nested arrays": (
        "gguf-llama",
        lambda w: {
            "model.gguf": gguf_llama(
                head_count=(
                    9,
                    struct.pack("<IQ", 9, 2) + struct.pack("<IQI", 4, 1, 4) + struct.pack("<IQ", 8, 1) + gguf_text("x"),
                )
            )
        },
        "'llama.attention.head_count' is [[4], ['x']], not a positive integer",
    ),
    # JSON nested past repr / dataclasses.asdict / orjson.dumps recursion limits
    "config rope_scaling 1000 levels deep": (
        "qwen3",
        lambda w: edited(
            w, "qwen3", "config.json", lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": Deep(1000, "[")})
        ),
        "nests deeper than 64 levels",
    ),
    "config architectures 1000 levels deep": (
        "qwen3",
        lambda w: edited(w, "qwen3", "config.json", lambda c: c.update(architectures=Deep(1000, "["))),
        "nests deeper than 64 levels",
    ),
    "tokenizer normalizer 300 levels deep": (
        "qwen3",
        lambda w: edited(w, "qwen3", "tokenizer.json", lambda t: t.update(normalizer=Deep(300, "["))),
        "nests deeper than 64 levels",
    ),
    "tokenizer_config chat_template 300 levels deep": (
        "qwen3",
        lambda w: edited(w, "qwen3", "tokenizer_config.json", lambda t: t.update(chat_template=[Deep(300, "[")])),
        "nests deeper than 64 levels",
    ),
    "tokenizer ids that are 1000-deep lists": (
        "qwen3",
        lambda w: edited(
            w,
            "qwen3",
            "tokenizer.json",
            lambda t: t["model"]["vocab"].update({"!": Deep(1000, "["), '"': Deep(1000, "[")}),
        ),
        "is not an integer",
    ),
    "tokenizer merge 1000 levels deep": (
        "qwen3",
        lambda w: edited(w, "qwen3", "tokenizer.json", lambda t: t["model"]["merges"].__setitem__(0, Deep(1000, "["))),
        "is neither 'a b' nor ['a', 'b']",
    ),
    # a top-level model_type that is a list: dict.get() with an unhashable key, TypeError (found in CI's sample
    # once the workspace grew)
    "config model_type as a list": (
        "qwen3",
        lambda w: edited(w, "qwen3", "config.json", lambda c: c.update(model_type=["qwen3"])),
        None,
    ),
    # sorted() over the ids of special added tokens, one of them a string
    "special token listed twice, once with a string id": (
        "qwen3",
        lambda w: edited(w, "qwen3", "tokenizer.json", duplicate_special_content),
        "is not an integer",
    ),
    # one id of 9,999,999 in a 14 kB file made a 10-million-entry id table (104 MB)
    "tokenizer id 9999999": (
        "qwen3",
        lambda w: edited(w, "qwen3", "tokenizer.json", lambda t: t["model"]["vocab"].update({"!": 9_999_999})),
        "token ids run up to 9999999, but only 482 tokens are listed",
    ),
}


@pytest.mark.parametrize("command", ["inspect --json", "check"])
@pytest.mark.parametrize("name", list(FOUND))
def test_inputs_found_by_the_long_run(workspace: Workspace, name: str, command: str) -> None:
    base, files, answer = FOUND[name]
    outcome = exercise(workspace, Case(base, files(workspace), command, ()))
    if answer is None:
        assert outcome.accepted, outcome.problem
    else:
        assert not outcome.accepted and answer in (outcome.problem or ""), outcome.problem


def gguf_with(workspace: Workspace, base: str, **changes: tuple[int, bytes] | None) -> dict[str, bytes]:
    """The base's GGUF with keys (dots written as __) set to (value type, encoded value), or dropped (None)."""
    keys = {key.replace("__", "."): value for key, value in changes.items()}
    parts = split_gguf(workspace.originals[base]["model.gguf"])
    parts.kv = [entry for entry in parts.kv if entry[0].decode() not in keys]
    parts.kv += [(key.encode(), *value) for key, value in keys.items() if value is not None]
    return {"model.gguf": join_gguf(parts)}


def u32(value: int) -> tuple[int, bytes]:
    return 4, struct.pack("<I", value)


def safetensors_with(
    workspace: Workspace,
    base: str,
    drop: tuple[str, ...] = (),
    add: dict[str, tuple[str, list[int], bytes]] | None = None,
) -> dict[str, bytes]:
    """The base's model.safetensors without the tensors `drop`, with `add` ({name: (dtype, shape, data)})."""
    header, tensors = split_safetensors(workspace.originals[base]["model.safetensors"])
    for name in drop:
        del header[name], tensors[name]
    for name, (dtype, shape, data) in (add or {}).items():
        header[name], tensors[name] = {"dtype": dtype, "shape": shape}, data
    return {"model.safetensors": join_safetensors(header, tensors)}


def lock_with(
    path: str | None = None,
    files: list[dict] | None = None,
    more: list[dict] = (),
    extra: dict[str, bytes] | None = None,
) -> Callable[[Workspace], dict[str, bytes]]:
    """The lock base's specpair.lock naming another directory, other files or `more` files, with `extra` files
    written beside it."""

    def build(workspace: Workspace) -> dict[str, bytes]:
        lock = workspace.document("lock", "specpair.lock")
        repo = lock["repos"][0]
        repo.update({k: v for k, v in (("path", path), ("files", files)) if v is not None})
        repo["files"] += list(more)
        return {"specpair.lock": encode_json(lock), **(extra or {})}

    return build


ZERO_SHA = "0" * 64
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000


# Found through `specpair convert`, `verify` and `check LOCK` by the fuzzing of the converter's parsers and
# the lockfile, with the answer each gets now (every one crashed, hung or named no file before its fix).
FOUND_CONVERT_AND_LOCK: dict[str, tuple[str, str, Callable[[Workspace], dict[str, bytes]], str]] = {
    # hf_tokenizer_files: from_gguf_fields returns None without a token list: AttributeError
    "GGUF gpt2 tokenizer without tokens": (
        "gguf-llama",
        "convert --dry-run --to bf16",
        lambda w: gguf_with(w, "gguf-llama", tokenizer__ggml__tokens=None),
        "is 'gpt2' but the file has no tokenizer.ggml.tokens",
    ),
    # from_gguf built 3 x 10^7 per-expert tensor maps for each block before comparing them: a hang
    "qwen3moe GGUF claiming 10^7 experts": (
        "gguf-qwen3moe",
        "convert --dry-run --to bf16",
        lambda w: gguf_with(w, "gguf-qwen3moe", qwen3moe__expert_count=u32(10**7)),
        "more experts than the checkpoint's tensors hold",
    ),
    # a 99,999-block layout for a 12-tensor file: 14 s of CPU and 1.1 GB
    "GGUF claiming 99,999 blocks": (
        "gguf-llama",
        "convert --dry-run --to bf16",
        lambda w: gguf_with(w, "gguf-llama", llama__block_count=u32(99_999)),
        "'llama.block_count' is 99999, but the file holds only",
    ),
    # the V-head permutation was sized by ssm.state_size before any shape was compared: MemoryError
    "qwen35moe GGUF ssm.state_size 2^32 - 1": (
        "gguf-qwen35moe",
        "convert --dry-run --to bf16",
        lambda w: gguf_with(w, "gguf-qwen35moe", qwen35moe__ssm__state_size=u32(2**32 - 1)),
        "tensor dimension k_head_dim of 4294967295, more values than the checkpoint's largest tensor holds",
    ),
    # float(rope.freq_base): ValueError
    "GGUF rope.freq_base as a string": (
        "gguf-llama",
        "convert --dry-run --to bf16",
        lambda w: gguf_with(w, "gguf-llama", llama__rope__freq_base=(8, gguf_text("x"))),
        "'llama.rope.freq_base' is 'x', not a positive number",
    ),
    # rope.dimension_count / head_dim: TypeError
    "GGUF rope.dimension_count as an array": (
        "gguf-dflash",
        "convert --dry-run --to bf16",
        lambda w: gguf_with(w, "gguf-dflash", dflash__rope__dimension_count=(9, encode_gguf_value(9, [16], 5))),
        "'dflash.rope.dimension_count' is [16], not a positive integer",
    ),
    # int(head_dim * "0.25") repeated the string: ValueError (a 2^31 head_dim would have made a 6 GB string)
    "config partial_rotary_factor as a string": (
        "qwen3.5-moe-nvfp4",
        "convert --dry-run --to gguf:Q8_0",
        lambda w: edited(
            w,
            "qwen3.5-moe-nvfp4",
            "config.json",
            lambda c: c["text_config"]["rope_parameters"].update(partial_rotary_factor="0.25"),
        ),
        "'partial_rotary_factor' is '0.25', not a number in (0, 1]",
    ),
    # to_gguf: the same per-expert blow-up from config.json
    "config claiming 10^7 experts": (
        "qwen3.5-moe-nvfp4",
        "convert --dry-run --to gguf:Q8_0",
        lambda w: edited(w, "qwen3.5-moe-nvfp4", "config.json", lambda c: c["text_config"].update(num_experts=10**7)),
        "'num_experts' is 10000000, more experts than the checkpoint's tensors hold",
    ),
    # an MLX weight without biases is mxfp4: the error named the layout label "mxfp4-mlx", not the file
    "MLX weight without biases": (
        "qwen3-mlx",
        "convert --dry-run --to bf16",
        lambda w: safetensors_with(w, "qwen3-mlx", drop=("model.layers.0.mlp.up_proj.biases",)),
        "weight 'model.layers.0.mlp.up_proj.weight' is stored as mxfp4-mlx, which specpair cannot read",
    ),
    # a C64 tensor: stored_nbytes raised BadInput("C64", "unknown GGUF type"), naming a dtype
    "complex tensor": (
        "qwen3",
        "convert --dry-run --to bf16",
        lambda w: safetensors_with(w, "qwen3", add={"extra.weight": ("C64", [2], b"\0" * 16)}),
        "tensor 'extra.weight' has dtype C64, which",
    ),
    # a U16 tensor into GGUF: the error named "tensor", not the tensor
    "U16 norm into GGUF": (
        "qwen3",
        "convert --dry-run --to gguf:Q8_0",
        lambda w: safetensors_with(
            w, "qwen3", drop=("model.norm.weight",), add={"model.norm.weight": ("U16", [64], b"\0" * 128)}
        ),
        "dtype U16 has no GGUF type",
    ),
    # an EXL3 trellis of one dimension: _logical_shape took shape[1], IndexError
    "1-D EXL3 trellis": (
        "qwen3-exl3",
        "convert --dry-run --to bf16",
        lambda w: safetensors_with(
            w,
            "qwen3-exl3",
            drop=("model.layers.0.mlp.up_proj.trellis",),
            add={"model.layers.0.mlp.up_proj.trellis": ("I16", [64], b"\0" * 128)},
        ),
        "is not [in/16, out/16, 16·bits]",
    ),
    # a per-layer array where _sizes wants one number: TypeError comparing it with the largest tensor
    "GGUF feed_forward_length as an array": (
        "gguf-qwen3moe",
        "convert --dry-run --to bf16",
        lambda w: gguf_with(w, "gguf-qwen3moe", qwen3moe__feed_forward_length=(9, encode_gguf_value(9, [16, 16], 5))),
        "'qwen3moe.feed_forward_length' is [16, 16], not a positive integer",
    ),
    # a 3-D weight where EXL3 takes matrices only: the error named the layout "exl3-4bpw", not the tensor
    "3-D tensor into EXL3": (
        "qwen3",
        "convert --dry-run --to exl3:4",
        lambda w: safetensors_with(w, "qwen3", add={"fc.weight": ("F16", [2, 16, 16], b"\0" * 1024)}),
        "fc.weight: cannot be stored as exl3-4bpw: holds matrices only; shape [2, 16, 16] is not one",
    ),
    # verify hashed /dev/zero for ever (a FIFO would have blocked on open)
    "lock naming /dev/zero": (
        "lock",
        "verify",
        lock_with("/dev", [{"path": "zero", "size": 0, "sha256": ZERO_SHA}]),
        "/dev/zero: is not a regular file: refused",
    ),
    # os.stat: ValueError (embedded null byte), UnicodeEncodeError (a lone surrogate JSON allows)
    "lock file name with a NUL": (
        "lock",
        "verify",
        lock_with(files=[{"path": "a\0", "size": 0, "sha256": ZERO_SHA}]),
        "needs a relative 'path' inside the repo",
    ),
    "lock file name with a lone surrogate": (
        "lock",
        "verify",
        lock_with(files=[{"path": "\ud800", "size": 0, "sha256": ZERO_SHA}]),
        "needs a relative 'path' inside the repo",
    ),
    # json.loads: RecursionError
    "lock nested 100,000 levels": ("lock", "verify", lambda w: {"specpair.lock": DEEP_JSON}, "JSON nested too deeply"),
    # check LOCK walked the whole directory the lock names (a lock naming / walks the file system): here the
    # workspace above the lock, whose GGUF files it then counted
    "lock naming the directory above it": ("lock", "check", lock_with(".."), "no config.json and no GGUF file"),
    # the cache reader's json.loads of an index: RecursionError
    "index nested 100,000 levels in a lock's directory": (
        "lock",
        "check",
        lock_with(
            more=[{"path": "model.safetensors.index.json", "size": len(DEEP_JSON), "sha256": ZERO_SHA}],
            extra={"model/model.safetensors.index.json": DEEP_JSON},
        ),
        "not valid JSON (depth limit exceeded",
    ),
}


@pytest.mark.parametrize("name", list(FOUND_CONVERT_AND_LOCK))
def test_inputs_found_by_fuzzing_convert_and_locks(workspace: Workspace, name: str) -> None:
    base, command, files, answer = FOUND_CONVERT_AND_LOCK[name]
    outcome = exercise(workspace, Case(base, files(workspace), command, ()))
    assert not outcome.accepted and answer in (outcome.problem or ""), outcome.problem

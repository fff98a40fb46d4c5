"""Fuzzing every parser in CI: a few hundred Hypothesis inputs per parser and mode, the file in well under a minute.

Parsers: safetensors headers, GGUF headers and metadata, config.json, tokenizer.json (with
tokenizer_config.json and generation_config.json), model.safetensors.index.json, and the
quantization configs (quantization_config, hf_quant_config.json, MLX `quantization`, EXL3
quantization_config.json). Each input runs `specpair inspect` or `specpair check` (with or without
--json) in-process on a tiny checkpoint carrying it; the property (tests/fuzzing/targets.py) is that
it is accepted or refused with one BadInput line naming a file of that checkpoint, in under 2 s of CPU time,
without allocating by what a header merely claims. Inputs are derandomized, so CI is repeatable; the
long run (tests/fuzzing/run.py, docs/reliability.md) explores with other seeds. Below the fuzzing,
the inputs the long run found crashing, kept as examples.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator

import pytest
from fuzzing.generators import (
    Deep,
    encode_json,
    gguf_bytes,
    gguf_tensor_info,
    gguf_text,
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
from hypothesis import HealthCheck, given, settings

EXAMPLES_PER_MODE = 400


@pytest.fixture(scope="module")
def workspace() -> Iterator[Workspace]:
    built = temporary_workspace()
    yield built
    remove_workspace(built)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("parser", list(TARGETS))
def test_every_input_is_accepted_or_refused_in_one_line(workspace: Workspace, parser: str, mode: str) -> None:
    outcomes: list[Outcome] = []

    @settings(max_examples=EXAMPLES_PER_MODE, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
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


def gguf_llama(arch: str = "llama", head_count: tuple[int, bytes] | None = None, tensor: str = "token_embd.weight") -> bytes:
    kv = [(b"general.architecture", 8, gguf_text(arch)), gguf_u32(f"{arch}.block_count", 1),
          gguf_u32(f"{arch}.embedding_length", 32), gguf_u32(f"{arch}.vocab_size", 8)]
    vtype, value = head_count or (4, struct.pack("<I", 4))
    kv.append((f"{arch}.attention.head_count".encode(), vtype, value))
    return gguf_bytes(kv, [gguf_tensor_info(gguf_text(tensor), 2, [32, 8], 0, 0)], 32 * 8 * 4)


def edited(workspace: Workspace, base: str, file: str, edit: Callable[[dict], object]) -> dict[str, bytes]:
    document = workspace.document(base, file)
    edit(document)
    return {file: encode_json(document)}


def duplicate_special_content(tokenizer: dict) -> None:
    tokenizer["added_tokens"] += [{"content": "<x>", "id": "seven", "special": True},
                                  {"content": "<x>", "id": 7, "special": True}]


FOUND: dict[str, tuple[str, Callable[[Workspace], dict[str, bytes]], str | None]] = {
    # safetensors: classify() took shape[-1] of a scalar companion tensor
    "scalar .trellis shape": ("qwen3", lambda w: {"model.safetensors": safetensors_file(
        {"a.trellis": {"dtype": "I16", "shape": [], "data_offsets": [0, 2]}})}, None),
    "scalar MLX .scales shape": ("qwen3-mlx", lambda w: {"model.safetensors": safetensors_file(
        {"a.weight": {"dtype": "U32", "shape": [], "data_offsets": [0, 4]},
         "a.scales": {"dtype": "F16", "shape": [], "data_offsets": [4, 6]},
         "a.biases": {"dtype": "F16", "shape": [], "data_offsets": [6, 8]}})}, None),
    # json.loads recursed once per level of the header
    "safetensors header 100000 levels deep": ("qwen3", lambda w: {"model.safetensors": struct.pack("<Q", 200_000)
                                                                  + b"[" * 100_000 + b"]" * 100_000},
                                              "nested too deeply"),
    # GGUF: "²".isdigit() is true, int("²") raises
    "GGUF tensor blk.².attn_q.weight": ("gguf-llama", lambda w: {"model.gguf": gguf_llama(tensor="blk.².attn_q.weight")},
                                        None),
    # GGUF: the architecture name went into key names and messages, newline included
    "GGUF architecture with a newline": ("gguf-llama", lambda w: {"model.gguf": gguf_llama(arch="a\nb")},
                                         "is not an architecture name"),
    # GGUF: max() over an array of arrays of different element types
    "GGUF head_count as mixed nested arrays": ("gguf-llama", lambda w: {"model.gguf": gguf_llama(head_count=(
        9, struct.pack("<IQ", 9, 2) + struct.pack("<IQI", 4, 1, 4) + struct.pack("<IQ", 8, 1) + gguf_text("x")))},
        "missing or invalid GGUF key llama.attention.head_count"),
    # JSON nested past repr / dataclasses.asdict / orjson.dumps recursion limits
    "config rope_scaling 1000 levels deep": ("qwen3", lambda w: edited(
        w, "qwen3", "config.json", lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": Deep(1000, "[")})),
        "nests deeper than 64 levels"),
    "config architectures 1000 levels deep": ("qwen3", lambda w: edited(
        w, "qwen3", "config.json", lambda c: c.update(architectures=Deep(1000, "["))), "nests deeper than 64 levels"),
    "tokenizer normalizer 300 levels deep": ("qwen3", lambda w: edited(
        w, "qwen3", "tokenizer.json", lambda t: t.update(normalizer=Deep(300, "["))), "nests deeper than 64 levels"),
    "tokenizer_config chat_template 300 levels deep": ("qwen3", lambda w: edited(
        w, "qwen3", "tokenizer_config.json", lambda t: t.update(chat_template=[Deep(300, "[")])),
        "nests deeper than 64 levels"),
    "tokenizer ids that are 1000-deep lists": ("qwen3", lambda w: edited(
        w, "qwen3", "tokenizer.json", lambda t: t["model"]["vocab"].update({"!": Deep(1000, "["), '"': Deep(1000, "[")})),
        "is not an integer"),
    "tokenizer merge 1000 levels deep": ("qwen3", lambda w: edited(
        w, "qwen3", "tokenizer.json", lambda t: t["model"]["merges"].__setitem__(0, Deep(1000, "["))),
        "is neither 'a b' nor ['a', 'b']"),
    # sorted() over the ids of special added tokens, one of them a string
    "special token listed twice, once with a string id": ("qwen3", lambda w: edited(
        w, "qwen3", "tokenizer.json", duplicate_special_content), "is not an integer"),
    # one id of 9,999,999 in a 14 kB file made a 10-million-entry id table (104 MB)
    "tokenizer id 9999999": ("qwen3", lambda w: edited(
        w, "qwen3", "tokenizer.json", lambda t: t["model"]["vocab"].update({"!": 9_999_999})),
        "token ids run up to 9999999, but only 482 tokens are listed"),
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

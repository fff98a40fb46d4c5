"""The parsers under fuzzing, each fed through the CLI commands, and the property every input must keep.

A case overlays generated files on a tiny valid checkpoint (built once from tests/fixtures.py) and
runs `specpair inspect` or `specpair check` on it in-process, with or without --json: the same code
path a user hits, down to the rules and the rich tables. The property, for every input:

- the command returns, or raises BadInput whose `where` lies inside the checkpoint it was given and
  whose message is one line; no other exception escapes;
- it takes under TIME_LIMIT_S of CPU time (a quadratic blow-up fails; CPU time, not wall time, so
  other processes on the machine do not make it flaky), and an alarm stops it after HANG_LIMIT_S of
  wall time (a hang fails instead of blocking the run);
- its peak resident memory grows by less than MEMORY_BASE + MEMORY_PER_INPUT_BYTE x the bytes of
  the generated files, so nothing is sized by a number a header merely claims.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import signal
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from fixtures import (
    build_dflash,
    build_eagle3,
    build_gguf_dflash,
    build_gguf_target,
    build_target,
)
from fuzzing.generators import (
    KeyPath,
    edited_document,
    encode_json,
    gguf_file,
    key_paths,
    keys_in_source,
    mutated,
    safetensors_file,
)
from hypothesis import strategies as st
from specpair.cli import check as check_command
from specpair.cli import inspect as inspect_command
from specpair.errors import BadInput
from specpair.formats import gguf

TIME_LIMIT_S = 2.0
HANG_LIMIT_S = 10.0
MEMORY_BASE = 64 << 20
MEMORY_PER_INPUT_BYTE = 32
COMMANDS = ("inspect", "inspect --json", "check", "check --json")
MODES = ("structured", "mutate")


class PropertyViolation(AssertionError):
    """An input broke the property without raising: too slow, too much memory, or a bad error report."""


@dataclass(frozen=True)
class Base:
    build: Callable[[Path], Path]  # writes the checkpoint under a directory, returns what to pass the CLI
    pair_with: str | None = None  # for a drafter: the base `check` pairs it with as the target


BASES: dict[str, Base] = {
    "qwen3": Base(lambda d: build_target(d, "qwen3", layers=1)),
    "qwen3-sharded": Base(lambda d: build_target(d, "qwen3", layers=1, shards=2)),
    "llama": Base(lambda d: build_target(d, "llama", layers=8)),
    "qwen3.5-moe-nvfp4": Base(lambda d: build_target(d, "qwen3_5_moe", layers=8, quant="nvfp4-modelopt")),
    "qwen3-fp8": Base(lambda d: build_target(d, "qwen3", layers=1, quant="fp8-block")),
    "qwen3-nvfp4-ct": Base(lambda d: build_target(d, "qwen3", layers=1, quant="nvfp4-ct")),
    "qwen3-mlx": Base(lambda d: build_target(d, "qwen3", layers=1, quant="mlx-affine4")),
    "qwen3-exl3": Base(lambda d: build_target(d, "qwen3", layers=1, quant="exl3")),
    "dflash": Base(lambda d: build_dflash(d, tokenizer=True), pair_with="qwen3.5-moe-nvfp4"),
    "eagle3": Base(build_eagle3, pair_with="llama"),
    "gguf-llama": Base(lambda d: build_gguf_target(_mkdir(d) / "model.gguf", "llama", layers=1)),
    "gguf-qwen35moe": Base(lambda d: build_gguf_target(_mkdir(d) / "model.gguf", "qwen35moe", layers=8)),
    "gguf-dflash": Base(lambda d: build_gguf_dflash(_mkdir(d) / "model.gguf"), pair_with="gguf-qwen35moe"),
}


def _mkdir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@dataclass(frozen=True)
class Case:
    base: str
    files: dict[str, bytes]  # written over the base checkpoint's files for this run only
    command: str  # one of COMMANDS
    faults: tuple[str, ...]

    @property
    def size(self) -> int:
        return sum(len(raw) for raw in self.files.values())


@dataclass
class Outcome:
    accepted: bool
    seconds: float  # CPU time
    peak_bytes: int  # growth of peak resident memory while it ran
    problem: str | None  # the BadInput message of a rejected input


def header_end(name: str, raw: bytes) -> int:
    """Where the parsed part of a file ends: mutations past it only touch tensor data, never read."""
    if name.endswith(".safetensors"):
        return 8 + int.from_bytes(raw[:8], "little")
    if name.endswith(".gguf"):
        header = gguf.read_header(io.BytesIO(raw).read, len(raw), name)
        return len(raw) - sum(-(-t.nbytes // 32) * 32 for t in header.tensors)
    return len(raw)


class Workspace:
    """Every base checkpoint, built once under `root`; a case overlays its files and restores them after."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.refs = {name: base.build(root / name) for name, base in BASES.items()}
        self.originals: dict[str, dict[str, bytes]] = {
            name: {p.name: p.read_bytes() for p in (root / name).iterdir() if p.is_file()} for name in BASES
        }
        self.header_ends = {(base, name): header_end(name, raw) for base, files in self.originals.items()
                            for name, raw in files.items()}
        self.memory = PeakMemory()
        for name in BASES:  # first runs import rich, gguf and the rules: keep that out of the per-input clock
            for command in COMMANDS:
                run_command(self, Case(name, {}, command, ()))

    def document(self, base: str, file: str) -> Any:
        return json.loads(self.originals[base][file])

    @contextlib.contextmanager
    def overlay(self, case: Case) -> Iterator[None]:
        directory = self.root / case.base
        try:
            for name, raw in case.files.items():
                (directory / name).write_bytes(raw)
            yield
        finally:
            for name in case.files:
                original = self.originals[case.base].get(name)
                if original is None:
                    (directory / name).unlink(missing_ok=True)
                else:
                    (directory / name).write_bytes(original)


def run_command(workspace: Workspace, case: Case) -> None:
    """`specpair inspect|check [--json]` on the case's checkpoint, in-process, output discarded."""
    ref = str(workspace.refs[case.base])
    command, _, flag = case.command.partition(" ")
    json_output = flag == "--json"
    with workspace.overlay(case), contextlib.redirect_stdout(io.StringIO()):
        if command == "inspect":
            inspect_command.inspect(ref=ref, gguf_file=None, offline=False, json_output=json_output)
            return
        pair_with = BASES[case.base].pair_with
        target, draft = (str(workspace.refs[pair_with]), ref) if pair_with else (ref, None)
        try:
            check_command.check(target=target, draft=draft, stack=None, gpu="h200", gpus=1, context=None,
                                concurrency=1, gguf_file=None, draft_gguf_file=None, offline=False,
                                json_output=json_output, quiet=False)
        except typer.Exit:
            pass  # the verdict's exit code (0 or 1)


class PeakMemory:
    """Growth of the peak resident set over a block, from Linux's resettable high-water mark (free to
    read, unlike tracemalloc, which slows the parsers 4x); tracemalloc where /proc cannot reset it."""

    def __init__(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current VmRSS
            self.proc = True
        except OSError:
            self.proc = False
            tracemalloc.start()

    def start(self) -> int:
        if self.proc:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return self._status("VmRSS")
        tracemalloc.reset_peak()
        return tracemalloc.get_traced_memory()[0]

    def grown_since(self, start: int) -> int:
        return (self._status("VmHWM") if self.proc else tracemalloc.get_traced_memory()[1]) - start

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"/proc/self/status has no {field}")


def _hung(signum: int, frame: object) -> None:
    raise PropertyViolation(f"still running after {HANG_LIMIT_S} s: a hang")


def exercise(workspace: Workspace, case: Case) -> Outcome:
    """Run one case and check the property; raises PropertyViolation, or whatever the command let escape."""
    memory = workspace.memory
    previous = signal.signal(signal.SIGALRM, _hung)
    signal.setitimer(signal.ITIMER_REAL, HANG_LIMIT_S)
    before = memory.start()
    start = time.process_time()
    try:
        run_command(workspace, case)
        problem = None
    except BadInput as e:
        problem = e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    seconds = time.process_time() - start
    peak = memory.grown_since(before)
    directory = str(workspace.root / case.base)
    if problem is not None:
        if problem.where != directory and not problem.where.startswith(directory + "/"):
            raise PropertyViolation(f"BadInput names {problem.where!r}, outside the checkpoint {directory}")
        if len(str(problem).splitlines()) != 1 or not problem.problem:
            raise PropertyViolation(f"BadInput message is not one non-empty line: {str(problem)[:300]!r}")
    if seconds > TIME_LIMIT_S:
        raise PropertyViolation(f"took {seconds:.2f} s of CPU time (limit {TIME_LIMIT_S} s)")
    budget = MEMORY_BASE + MEMORY_PER_INPUT_BYTE * case.size
    if peak > budget:
        raise PropertyViolation(f"allocated {peak >> 20} MiB at peak for {case.size} input bytes (budget {budget >> 20} MiB)")
    return Outcome(problem is None, seconds, peak, str(problem) if problem else None)


# ---------------------------------------------------------------------------------------------------
# what each parser is fed

# Objects the HF reader looks into; any key it reads may be set inside any of them.
CONFIG_CONTAINERS: tuple[KeyPath, ...] = (
    (), ("text_config",), ("dflash_config",), ("eagle_config",), ("rope_parameters",), ("rope_scaling",),
    ("quantization_config",), ("quantization_config", "kv_cache_scheme"), ("quantization_config", "producer"),
    ("quantization",),
)
QUANT_CONTAINERS: tuple[KeyPath, ...] = (
    ("quantization_config",), ("quantization_config", "kv_cache_scheme"), ("quantization_config", "producer"),
    ("quantization",),
)
HOSTILE_SHARD_NAMES = (
    "../../etc/passwd", "/etc/passwd", "..", ".", "", "./model-00001-of-00002.safetensors",
    "Model-00001-of-00002.safetensors", "MODEL-00002-OF-00002.SAFETENSORS", "model-00001-of-00002.safetensors/",
    "sub/../model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors\x00", "tokenizer.json",
    "config.json", "a\nb.safetensors",
)


def paths_under(containers: tuple[KeyPath, ...], keys: list[str]) -> list[KeyPath]:
    return [(*container, key) for container in containers for key in keys]


@st.composite
def json_file_edit(draw: st.DrawFn, workspace: Workspace, base: str, file: str, paths: list[KeyPath],
                   faults: list[str]) -> dict[str, bytes]:
    document = workspace.document(base, file)
    edited = draw(edited_document(document, key_paths(document) + paths, faults))
    return {file: encode_json(edited, ascii_only=draw(st.booleans()))}


@st.composite
def config_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    keys = keys_in_source("checkpoint/hf.py", "sources/__init__.py")
    return draw(json_file_edit(workspace, base, "config.json", paths_under(CONFIG_CONTAINERS, keys), faults))


@st.composite
def quant_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    keys = keys_in_source("checkpoint/hf.py")
    files = sorted(n for n in ("hf_quant_config.json", "quantization_config.json") if n in workspace.originals[base])
    file = draw(st.sampled_from(["config.json", *files]))
    if file == "config.json":
        config = workspace.document(base, file)
        paths = [p for p in key_paths(config) if p[0] in ("quantization_config", "quantization")]
        return draw(json_file_edit(workspace, base, file, paths + paths_under(QUANT_CONTAINERS, keys), faults))
    containers = ((), ("quantization",), ("producer",)) if file == "hf_quant_config.json" else ((),)
    return draw(json_file_edit(workspace, base, file, paths_under(containers, keys), faults))


@st.composite
def tokenizer_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    keys = keys_in_source("checkpoint/tokenizer.py")
    file = draw(st.sampled_from(["tokenizer.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]))
    if file not in workspace.originals[base]:
        file = "tokenizer.json"
    containers = ((), ("model",), ("added_tokens", "0")) if file == "tokenizer.json" else ((),)
    return draw(json_file_edit(workspace, base, file, paths_under(containers, keys), faults))


@st.composite
def index_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    file = "model.safetensors.index.json"
    document = workspace.document(base, file)
    if draw(st.booleans()):  # a hostile shard file name
        faults.append("shard-name")
        tensor = draw(st.sampled_from(sorted(document["weight_map"])))
        document["weight_map"][tensor] = draw(st.sampled_from(HOSTILE_SHARD_NAMES) | st.text(max_size=40))
        return {file: encode_json(document)}
    paths = [("weight_map",), ("metadata", "total_size")] + [("weight_map", t) for t in sorted(document["weight_map"])]
    return draw(json_file_edit(workspace, base, file, paths, faults))


@dataclass(frozen=True)
class Target:
    """One parser: the bases it runs on, the file it is fed, and how structured inputs are made."""

    name: str
    parser: str  # the code under test, for the report
    bases: tuple[str, ...]
    files: tuple[str, ...]  # the files mutation mode rewrites
    structured: Callable[[Workspace, str, list[str]], st.SearchStrategy[dict[str, bytes]]]


HF_BASES = ("qwen3", "llama", "qwen3.5-moe-nvfp4", "qwen3-mlx", "qwen3-exl3", "dflash", "eagle3")
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("safetensors", "formats/safetensors.read_header, formats/layouts.classify", HF_BASES,
           ("model.safetensors",), lambda w, b, f: safetensors_file(f).map(lambda raw: {"model.safetensors": raw})),
    Target("gguf", "formats/gguf.read_header, checkpoint/gguf.build", ("gguf-llama", "gguf-qwen35moe", "gguf-dflash"),
           ("model.gguf",), lambda w, b, f: gguf_file(f).map(lambda raw: {"model.gguf": raw})),
    Target("config", "config.json: checkpoint/hf.build via sources.read_checkpoint", HF_BASES,
           ("config.json",), config_case),
    Target("tokenizer", "tokenizer.json: checkpoint/tokenizer.from_tokenizer_json",
           ("qwen3", "qwen3.5-moe-nvfp4", "dflash", "llama"),
           ("tokenizer.json", "tokenizer_config.json", "generation_config.json"), tokenizer_case),
    Target("index", "model.safetensors.index.json: sources._safetensors_shards, _check_index", ("qwen3-sharded",),
           ("model.safetensors.index.json",), index_case),
    Target("quantization", "quantization_config, hf_quant_config.json, MLX quantization, EXL3 quantization_config.json",
           ("qwen3.5-moe-nvfp4", "qwen3-fp8", "qwen3-nvfp4-ct", "qwen3-mlx", "qwen3-exl3"),
           ("config.json", "hf_quant_config.json", "quantization_config.json"), quant_case),
)}


@st.composite
def cases(draw: st.DrawFn, workspace: Workspace, target: Target, mode: str) -> Case:
    faults: list[str] = []
    base = draw(st.sampled_from(target.bases))
    if mode == "mutate":
        name = draw(st.sampled_from([n for n in target.files if n in workspace.originals[base]]))
        seed, end = workspace.originals[base][name], workspace.header_ends[(base, name)]
        files = {name: draw(mutated(seed, end, faults, json_text=name.endswith(".json")))}
    else:
        files = draw(target.structured(workspace, base, faults))
    return Case(base, files, draw(st.sampled_from(COMMANDS)), tuple(faults))


def case_input(case: Case) -> dict[str, Any]:
    """A crash reproducer: the case with its files as latin-1 text (lossless for any bytes)."""
    return {"base": case.base, "command": case.command, "faults": list(case.faults),
            "files": {name: raw.decode("latin-1") for name, raw in case.files.items()}}


def temporary_workspace() -> Workspace:
    return Workspace(Path(tempfile.mkdtemp(prefix="specpair-fuzz-")))


def remove_workspace(workspace: Workspace) -> None:
    shutil.rmtree(workspace.root, ignore_errors=True)

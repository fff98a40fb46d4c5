"""The parsers under fuzzing, each fed through the CLI commands, and the property every input must keep.

A case overlays generated files on a tiny valid checkpoint (built once from tests/fixtures.py), or lays
it out in a hostile way (symlinks out, FIFOs, sparse giants, pickles, custom code), and runs a command
on it in-process: `specpair inspect` or `check` (with or without --json), `convert` (a --dry-run plan, or
a real conversion into a scratch directory), or `verify` on a lockfile. The same code path a user hits,
down to the rules and the rich tables. The property, for every input:

- the command returns, or raises BadInput whose message is one line and whose `where` names what it
  was given: a path inside the checkpoint (for convert also a tensor or key of it, or its own --to /
  --keep argument; for a lockfile also the directory the lock names); no other exception escapes;
- a conversion either writes its destination or leaves nothing behind (no destination, no partial);
- nothing outside the checkpoint, no pickle and no code file of it is opened (an audit hook records
  every open while a case runs);
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
import os
import re
import shlex
import shutil
import signal
import struct
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from fixtures import (
    TRAP_MARKER,
    build_dflash,
    build_eagle3,
    build_gguf_dflash,
    build_gguf_target,
    build_target,
    trap_pickle,
)
from fuzzing.generators import (
    EXL3_MARKERS,
    GGUF_EDITS,
    KeyPath,
    edited_document,
    encode_json,
    exl3_edit,
    gguf_edit,
    gguf_file,
    join_safetensors,
    key_paths,
    keys_in_source,
    lock_edit,
    mlx_quantization_edit,
    mutated,
    safetensors_file,
    split_safetensors,
)
from hypothesis import strategies as st
from test_hostile import PICKLES, link_out, sparse

from specpair.cli import check as check_command
from specpair.cli import convert as convert_command
from specpair.cli import inspect as inspect_command
from specpair.cli import verify as verify_command
from specpair.errors import BadInput
from specpair.formats import gguf

# The slowest accepted input takes ~0.55 s on an idle core here and 2.3 s was seen on CI's two shared cores
# beside a second test worker; a blow-up on these inputs costs orders of magnitude more.
TIME_LIMIT_S = 5.0
HANG_LIMIT_S = 10.0
MEMORY_BASE = 64 << 20
MEMORY_PER_INPUT_BYTE = 32
COMMANDS = ("inspect", "inspect --json", "check", "check --json")
MODES = ("structured", "mutate")
GIB = 1 << 30


class PropertyViolation(AssertionError):
    """An input broke the property without raising: too slow, too much memory, or a bad error report."""


@dataclass(frozen=True)
class Base:
    build: Callable[[Path], Path]  # writes the checkpoint under a directory, returns what to pass the CLI
    pair_with: str | None = None  # for a drafter: the base `check` pairs it with as the target


BASES: dict[str, Base] = {
    "qwen3": Base(lambda d: build_target(d, "qwen3", layers=1)),
    # shards not named as a huggingface_hub series, so that the index decides what is read
    "qwen3-sharded": Base(lambda d: _custom_shard_names(build_target(d, "qwen3", layers=1, shards=2))),
    "llama": Base(lambda d: build_target(d, "llama", layers=8)),
    "qwen3.5-moe-nvfp4": Base(lambda d: build_target(d, "qwen3_5_moe", layers=8, quant="nvfp4-modelopt")),
    "qwen3-fp8": Base(lambda d: build_target(d, "qwen3", layers=1, quant="fp8-block")),
    "qwen3-nvfp4-ct": Base(lambda d: build_target(d, "qwen3", layers=1, quant="nvfp4-ct")),
    "qwen3-mlx": Base(lambda d: build_target(d, "qwen3", layers=1, quant="mlx-affine4")),
    "qwen3-exl3": Base(lambda d: _true_markers(build_target(d, "qwen3", layers=1, quant="exl3"))),
    "dflash": Base(lambda d: build_dflash(d, tokenizer=True), pair_with="qwen3.5-moe-nvfp4"),
    "eagle3": Base(build_eagle3, pair_with="llama"),
    "gguf-llama": Base(lambda d: build_gguf_target(_mkdir(d) / "model.gguf", "llama", layers=1)),
    "gguf-qwen35moe": Base(lambda d: build_gguf_target(_mkdir(d) / "model.gguf", "qwen35moe", layers=8)),
    "gguf-dflash": Base(lambda d: build_gguf_dflash(_mkdir(d) / "model.gguf"), pair_with="gguf-qwen35moe"),
    "gguf-dflash-draft": Base(
        lambda d: build_gguf_dflash(_mkdir(d) / "model.gguf", arch="dflash-draft"), pair_with="gguf-qwen35moe"
    ),
    "gguf-qwen3moe": Base(lambda d: _converted(build_target(d / "hf", "qwen3_moe", layers=2), d / "model.gguf")),
    "lock": Base(lambda d: _locked(d, build_target(d / "model", "qwen3", layers=1))),
}


def _converted(source: Path, destination: Path) -> Path:
    """A GGUF the fixtures cannot write (qwen3moe: experts stacked in GGUF, one by one in HF), by convert."""
    from specpair.convert import converter as convert

    convert.execute(convert.plan(convert.open_source(str(source)), convert.parse_target("gguf:F16")), str(destination))
    shutil.rmtree(source)
    return destination


def _true_markers(checkpoint: Path) -> Path:
    """The fixture's EXL3 codebook markers hold random bytes; a conversion reads them, so write the real ones."""
    shard = checkpoint / "model.safetensors"
    header, tensors = split_safetensors(shard.read_bytes())
    for name in tensors:
        codebook = name.rsplit(".", 1)[-1]
        if codebook in EXL3_MARKERS:
            tensors[name] = (EXL3_MARKERS[codebook] % 2**32).to_bytes(4, "little")
    shard.write_bytes(join_safetensors(header, tensors))
    return checkpoint


def _locked(directory: Path, checkpoint: Path) -> Path:
    """A specpair.lock beside `checkpoint` listing its files, as `download --local-dir` writes one."""
    import hashlib

    from specpair.sources.lockfile import LockedFile, LockedRepo, write_lock

    files = [
        LockedFile(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(checkpoint.iterdir())
    ]
    repo = LockedRepo(
        "org/model",
        "target",
        "0" * 40,
        "0" * 40,
        "https://huggingface.co",
        "local-dir",
        str(checkpoint),
        [],
        [],
        False,
        files,
    )
    write_lock(str(directory / "specpair.lock"), [repo])
    return directory / "specpair.lock"


def _mkdir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@dataclass(frozen=True)
class Case:
    base: str
    files: dict[str, bytes]  # written over the base checkpoint's files for this run only
    command: str  # one of the target's commands
    faults: tuple[str, ...]
    layout: tuple[tuple[str, str], ...] = ()  # hostile layout operations (HOSTILE_LAYOUTS), with their file

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
        self.header_ends = {
            (base, name): header_end(name, raw) for base, files in self.originals.items() for name, raw in files.items()
        }
        self.elsewhere = root / "elsewhere"  # where hostile symlinks point: never to be opened
        self.scratch = root / "scratch"  # a real conversion's destination
        self.pristine = root / "pristine"  # copies that undo a hostile layout
        for name in BASES:
            shutil.copytree(root / name, self.pristine / name, symlinks=True)
        self.memory = PeakMemory()
        self.opened: list[str] | None = None  # paths opened while a command runs
        self.last_opened: list[str] = []
        self.trapped = False
        sys.addaudithook(self._audit)
        # first runs import rich, gguf, torch and the rules: keep that out of the per-input clock (one plan and
        # one real conversion per base do for convert: the other --to targets import nothing more)
        warm: dict[tuple[str, str], str] = {}
        for target in TARGETS.values():
            for name in target.bases:
                for command in target.commands:
                    kind = ("plan" if "--dry-run" in command else "write") if command.startswith("convert") else command
                    warm.setdefault((name, kind), command)
        for (name, _), command in warm.items():
            with contextlib.suppress(BadInput):
                run_command(self, Case(name, {}, command, ()))

    def _audit(self, event: str, args: tuple) -> None:
        if event == "open" and self.opened is not None and isinstance(args[0], (str, bytes)):
            self.opened.append(os.fsdecode(args[0]))

    @contextlib.contextmanager
    def watching(self, case: Case) -> Iterator[None]:
        """Record what the command opens, and whether a pickle or code of the checkpoint ran (its trap fired)."""
        self.opened, self.trapped = [], False
        try:
            yield
        finally:
            self.last_opened, self.opened = self.opened, None
            self.trapped = (self.root / case.base / TRAP_MARKER).exists()

    def document(self, base: str, file: str) -> Any:
        return json.loads(self.originals[base][file])

    @contextlib.contextmanager
    def overlay(self, case: Case) -> Iterator[None]:
        directory = self.root / case.base
        try:
            for name, raw in case.files.items():
                (directory / name).write_bytes(raw)
            for operation, name in case.layout:
                HOSTILE_LAYOUTS[operation](self, directory, name)
            yield
        finally:
            if case.layout:  # files moved, linked or replaced: put the whole checkpoint back
                shutil.rmtree(directory)
                shutil.copytree(self.pristine / case.base, directory, symlinks=True)
                shutil.rmtree(self.elsewhere, ignore_errors=True)
            else:
                for name in case.files:
                    original = self.originals[case.base].get(name)
                    if original is None:
                        (directory / name).unlink(missing_ok=True)
                    else:
                        (directory / name).write_bytes(original)


def run_command(workspace: Workspace, case: Case) -> None:
    """`specpair inspect|check|convert|verify ...` on the case's checkpoint, in-process, output discarded."""
    ref = str(workspace.refs[case.base])
    command, *options = shlex.split(case.command)
    json_output = "--json" in options
    with workspace.overlay(case), contextlib.redirect_stdout(io.StringIO()), workspace.watching(case):
        if command == "inspect":
            inspect_command.inspect(ref=ref, gguf_file=None, offline=False, json_output=json_output)
        elif command == "convert":
            _convert(workspace, ref, options)
        elif command == "verify":
            with contextlib.suppress(typer.Exit):  # 0 or 1: whether the files match
                verify_command.verify(target=ref, json_output=json_output, quiet=False)
        else:
            pair_with = BASES[case.base].pair_with
            target, draft = (str(workspace.refs[pair_with]), ref) if pair_with else (ref, None)
            with contextlib.suppress(typer.Exit):  # the verdict's exit code (0 or 1)
                check_command.check(
                    target=target,
                    draft=draft,
                    stack=None,
                    gpu="h200",
                    gpus=1,
                    context=None,
                    concurrency=1,
                    gguf_file=None,
                    draft_gguf_file=None,
                    offline=False,
                    json_output=json_output,
                    quiet=False,
                )


def _convert(workspace: Workspace, ref: str, options: list[str]) -> None:
    """`convert REF DST --to SPEC [--keep RULE] [--dry-run] [--json]`; a real run writes DST under scratch/,
    which must then hold the destination (accepted) or nothing at all (refused), and is emptied after."""
    to = options[options.index("--to") + 1]
    keep = [options[options.index("--keep") + 1]] if "--keep" in options else None
    destination = workspace.scratch / ("converted.gguf" if to.startswith("gguf") else "converted")
    workspace.scratch.mkdir(exist_ok=True)
    accepted = False
    try:
        convert_command.convert(
            source=ref,
            destination=str(destination),
            to=to,
            target=None,
            keep=keep,
            device="cpu",
            workers=1,
            max_shard_size="5GB",
            gguf_file=None,
            dry_run="--dry-run" in options,
            json_output="--json" in options,
            quiet=False,
        )
        accepted = True
    finally:
        left = sorted(p.name for p in workspace.scratch.iterdir())
        shutil.rmtree(workspace.scratch)
        expected = [destination.name] if accepted and "--dry-run" not in options else []
        if left != expected:
            raise PropertyViolation(f"convert left {left} behind (expected {expected})")


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
        if not _names_its_input(problem.where, directory, workspace, case):
            raise PropertyViolation(f"BadInput names {problem.where!r}, not the checkpoint {directory} or a part of it")
        if len(_as_printed(problem, case).splitlines()) != 1 or not problem.problem:
            raise PropertyViolation(f"BadInput message is not one non-empty line: {str(problem)[:300]!r}")
    forbidden = [path for path in workspace.last_opened if _never_to_open(workspace, directory, path)]
    if forbidden:
        raise PropertyViolation(f"opened {forbidden[0]!r}, outside the checkpoint or a pickle or code file of it")
    if workspace.trapped:
        raise PropertyViolation("a pickle was loaded or custom code was run")
    if seconds > TIME_LIMIT_S:
        raise PropertyViolation(f"took {seconds:.2f} s of CPU time (limit {TIME_LIMIT_S} s)")
    budget = MEMORY_BASE + MEMORY_PER_INPUT_BYTE * case.size
    if peak > budget:
        raise PropertyViolation(
            f"allocated {peak >> 20} MiB at peak for {case.size} input bytes (budget {budget >> 20} MiB)"
        )
    return Outcome(problem is None, seconds, peak, str(problem) if problem else None)


def _names_its_input(where: str, directory: str, workspace: Workspace, case: Case) -> bool:
    if where == directory or where.startswith(directory + "/"):
        return True
    if case.command.startswith("convert"):  # a tensor of the checkpoint, or the --to / --keep argument
        names = _tensor_names(workspace, case)
        return (
            where.startswith(("--to ", "--keep "))
            or TENSOR_NAME.fullmatch(where) is not None
            or where in names
            or where.rsplit(".", 1)[0] in names
        )  # a module's part, present or missing
    # the directory the lock names, or the repo it locks
    return case.base == "lock" and (os.path.isabs(where) or where.startswith("org/model@"))


def _as_printed(problem: BadInput, case: Case) -> str:
    """The message; for a path a lockfile names (a newline is a legal file name character), as the CLI's
    one-line error prints it, control characters escaped."""
    if case.base != "lock":
        return str(problem)
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(problem))


# A dotted name such as blk.0.attn_q.weight or lm_head.mcg (output names too); not a file, a layout label or a dtype.
TENSOR_NAME = re.compile(r"(?![^/]*\.json$)[\w\-]+(\.[\w\-]+)+")


def _tensor_names(workspace: Workspace, case: Case) -> set[str]:
    """Tensor and module names the case's weight files hold; a module may be named without a dot ("a",
    "d2t") or with any character at all."""
    from specpair.formats.layouts import split_module

    names: set[str] = set()
    for file, raw in {**workspace.originals[case.base], **case.files}.items():
        with contextlib.suppress(Exception):  # a file the readers refused holds no names to match
            if file.endswith(".safetensors"):
                names |= set(json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")]))
            elif file.endswith(".gguf"):
                names |= {t.name for t in gguf.read_header(io.BytesIO(raw).read, len(raw), file).tensors}
    return names | {split_module(name)[0] for name in names}


def _never_to_open(workspace: Workspace, directory: str, path: str) -> bool:
    resolved = os.path.realpath(path)
    if resolved.startswith(str(workspace.elsewhere) + "/"):
        return True
    name = os.path.basename(resolved)
    return resolved.startswith(directory + "/") and (name in PICKLES or name == EVIL_CODE)


# ---------------------------------------------------------------------------------------------------
# what each parser is fed

# Objects the HF reader looks into; any key it reads may be set inside any of them.
CONFIG_CONTAINERS: tuple[KeyPath, ...] = (
    (),
    ("text_config",),
    ("dflash_config",),
    ("eagle_config",),
    ("rope_parameters",),
    ("rope_scaling",),
    ("quantization_config",),
    ("quantization_config", "kv_cache_scheme"),
    ("quantization_config", "producer"),
    ("quantization",),
)
QUANT_CONTAINERS: tuple[KeyPath, ...] = (
    ("quantization_config",),
    ("quantization_config", "kv_cache_scheme"),
    ("quantization_config", "producer"),
    ("quantization",),
)
HOSTILE_SHARD_NAMES = (
    "../../etc/passwd",
    "/etc/passwd",
    "..",
    ".",
    "",
    "./part-0.safetensors",
    "Part-0.safetensors",
    "PART-1.SAFETENSORS",
    "part-0.safetensors/",
    "sub/../part-0.safetensors",
    "part-0.safetensors\x00",
    "tokenizer.json",
    "config.json",
    "a\nb.safetensors",
)


def paths_under(containers: tuple[KeyPath, ...], keys: list[str]) -> list[KeyPath]:
    return [(*container, key) for container in containers for key in keys]


@st.composite
def json_file_edit(
    draw: st.DrawFn, workspace: Workspace, base: str, file: str, paths: list[KeyPath], faults: list[str]
) -> dict[str, bytes]:
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
    file = draw(
        st.sampled_from(["tokenizer.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"])
    )
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


@st.composite
def tokenizer_to_gguf_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    """tokenizer.json and its configs (or chat_template.jinja) as `convert --to gguf:*` turns them into keys."""
    if draw(st.integers(0, 4)) == 0:
        faults.append("chat-template")
        template = draw(
            st.sampled_from(("", "{{", "\x00", "\ud800", "x" * 100_000, "{% for m in messages %}"))
            | st.text(max_size=40)
        )
        return {"chat_template.jinja": template.encode("utf-8", "surrogatepass")}
    keys = keys_in_source("checkpoint/tokenizer.py", "checkpoint/gguf_tokenizer.py")
    file = draw(
        st.sampled_from(["tokenizer.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"])
    )
    if file not in workspace.originals[base]:
        file = "tokenizer.json"
    containers = (
        ((), ("model",), ("added_tokens", "0"), ("pre_tokenizer",), ("post_processor",))
        if file == "tokenizer.json"
        else ((),)
    )
    return draw(json_file_edit(workspace, base, file, paths_under(containers, keys), faults))


def _gguf_header(workspace: Workspace, base: str) -> gguf.GGUFHeader:
    raw = workspace.originals[base]["model.gguf"]
    return gguf.read_header(io.BytesIO(raw).read, len(raw), "model.gguf")


GGUF_TOKENIZER_KEYS = tuple(
    f"tokenizer.ggml.{k}"
    for k in (
        "model",
        "pre",
        "tokens",
        "token_type",
        "merges",
        "bos_token_id",
        "eos_token_id",
        "unknown_token_id",
        "padding_token_id",
        "eot_token_id",
        "eom_token_id",
        "add_bos_token",
        "add_eos_token",
        "mask_token_id",
    )
) + ("tokenizer.chat_template",)


@st.composite
def gguf_tokenizer_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    """A GGUF whose `tokenizer.*` keys are hostile, as `convert --to bf16` turns them into tokenizer files."""
    header = _gguf_header(workspace, base)
    edits = tuple(e for e in GGUF_EDITS if not e.startswith(("tensor", "architecture")))
    raw = draw(
        gguf_edit(
            workspace.originals[base]["model.gguf"],
            header.fields,
            header.types,
            GGUF_TOKENIZER_KEYS,
            faults,
            edits=edits,
        )
    )
    return {"model.gguf": raw}


def gguf_arch_keys() -> tuple[str, ...]:
    """The keys gguf_arch.from_gguf looks up: every `{arch}.*` hyper-parameter, the fork's keys, the mask token."""
    from specpair.checkpoint import gguf_arch

    keys = {"{arch}." + key for _, key, _, _ in gguf_arch.HPARAMS}
    keys |= {f"dflash.{key}" for _, key, _, _ in gguf_arch.HPARAMS} | {
        "dflash-draft.dflash." + k for k in gguf_arch.FORK_KEYS
    }
    keys |= {"{arch}.dflash." + k for k in gguf_arch.UNMAPPED_DFLASH_KEYS}
    return tuple(sorted(keys | {gguf_arch.MASK_TOKEN_KEY, "general.architecture", "general.alignment"}))


@st.composite
def gguf_arch_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    """A GGUF whose hyper-parameters, architecture and tensor infos are hostile, as convert maps it to HF."""
    header = _gguf_header(workspace, base)
    names = [t.name for t in header.tensors]
    return {
        "model.gguf": draw(
            gguf_edit(
                workspace.originals[base]["model.gguf"], header.fields, header.types, gguf_arch_keys(), faults, names
            )
        )
    }


@st.composite
def exl3_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    return {"model.safetensors": draw(exl3_edit(workspace.originals[base]["model.safetensors"], faults))}


@st.composite
def mlx_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    return draw(
        mlx_quantization_edit(
            workspace.document(base, "config.json"), workspace.originals[base]["model.safetensors"], faults
        )
    )


@st.composite
def lock_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    keys = keys_in_source("sources/lockfile.py")
    return {"specpair.lock": draw(lock_edit(workspace.document(base, "specpair.lock"), keys, faults))}


@st.composite
def plan_case(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> dict[str, bytes]:
    """Any of the hostile files above, on any base, for `convert --dry-run` to plan from."""
    if base.startswith("gguf"):
        if draw(st.booleans()):
            return draw(gguf_arch_case(workspace, base, faults))
        return {"model.gguf": draw(gguf_file(faults))}
    kind = draw(
        st.sampled_from(
            ("safetensors", "config", "quantization")
            + (("tokenizer",) if "tokenizer.json" in workspace.originals[base] else ())
            + (("index",) if base == "qwen3-sharded" else ())
        )
    )
    if kind == "safetensors":
        return {"model.safetensors": draw(safetensors_file(faults))}
    return draw(
        {"config": config_case, "quantization": quant_case, "tokenizer": tokenizer_to_gguf_case, "index": index_case}[
            kind
        ](workspace, base, faults)
    )


# ---------------------------------------------------------------------------------------------------
# hostile layouts (tests/test_hostile.py's cases), applied to a base for one case and undone after

EVIL_CODE = "modeling_evil.py"


def _sparse_giant(workspace: Workspace, directory: Path, name: str) -> None:
    head = {".safetensors": struct.pack("<Q", 2**63), ".gguf": b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**26)}
    sparse(directory / name, GIB, head.get(Path(name).suffix, b"{"))


def _custom_shard_names(root: Path) -> Path:
    index = root / "model.safetensors.index.json"
    document = json.loads(index.read_text())
    renames = {shard: f"part-{k}.safetensors" for k, shard in enumerate(sorted(set(document["weight_map"].values())))}
    for old, new in renames.items():
        (root / old).rename(root / new)
    document["weight_map"] = {name: renames[shard] for name, shard in document["weight_map"].items()}
    index.write_text(json.dumps(document))
    return root


def _replace(directory: Path, name: str, make: Callable[[Path], None]) -> None:
    (directory / name).unlink()
    make(directory / name)


def _index_outside(workspace: Workspace, directory: Path, name: str) -> None:
    index = directory / "model.safetensors.index.json"
    document = json.loads(index.read_text())
    shard = sorted(set(document["weight_map"].values()))[-1]
    workspace.elsewhere.mkdir(exist_ok=True)
    shutil.copy(directory / shard, workspace.elsewhere / shard)
    document["weight_map"] = {
        k: f"../{workspace.elsewhere.name}/{shard}" if v == shard else v for k, v in document["weight_map"].items()
    }
    index.write_text(json.dumps(document))


def _custom_code(workspace: Workspace, directory: Path, name: str) -> None:
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.Evil", "AutoConfig": "modeling_evil.EvilConfig"}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / EVIL_CODE).write_text(f"open({str(directory / TRAP_MARKER)!r}, 'w')\n")


def _pickles(workspace: Workspace, directory: Path, name: str) -> None:
    for pickle in PICKLES:
        (directory / pickle).write_bytes(trap_pickle(directory / TRAP_MARKER))


def _linked_inside(workspace: Workspace, directory: Path, name: str) -> None:
    (directory / "weights").mkdir(exist_ok=True)
    shutil.move(directory / name, directory / "weights" / name)
    (directory / name).symlink_to(f"weights/{name}")


HOSTILE_LAYOUTS: dict[str, Callable[[Workspace, Path, str], None]] = {
    "symlink-out-relative": lambda w, d, name: link_out(d, name, w.elsewhere, relative=True) and None,
    "symlink-out-absolute": lambda w, d, name: link_out(d, name, w.elsewhere, relative=False) and None,
    "symlink-dev-zero": lambda w, d, name: _replace(d, name, lambda p: p.symlink_to("/dev/zero")),
    "fifo": lambda w, d, name: _replace(d, name, os.mkfifo),
    "directory": lambda w, d, name: _replace(d, name, os.mkdir),
    "sparse-giant": _sparse_giant,
    "case-collision": lambda w, d, name: shutil.copy(d / name, d / (name[0].upper() + name[1:])) and None,
    "symlink-inside": _linked_inside,
    "pickles": _pickles,
    "custom-code": _custom_code,
    "index-outside": _index_outside,
}


@st.composite
def hostile_layout(draw: st.DrawFn, workspace: Workspace, base: str, faults: list[str]) -> tuple[tuple[str, str], ...]:
    """One hostile layout operation on one file of the base (a GGUF named on the command line is the user's
    own choice, so it is not symlinked away)."""
    names = sorted(workspace.originals[base])
    operations = [
        op
        for op in HOSTILE_LAYOUTS
        if not (op.startswith("symlink") and base.startswith("gguf"))
        and (op != "index-outside" or "model.safetensors.index.json" in names)
        and (op != "custom-code" or "config.json" in names)
    ]
    operation = draw(st.sampled_from(operations))
    faults.append(operation)
    return ((operation, draw(st.sampled_from(names))),)


@dataclass(frozen=True)
class Target:
    """One parser: the bases it runs on, the file it is fed, how structured inputs are made, the commands
    that run it, and its share of a run (relative to the others: slow parsers get fewer inputs)."""

    name: str
    parser: str  # the code under test, for the report
    bases: tuple[str, ...]
    files: tuple[str, ...]  # the files mutation mode rewrites
    structured: Callable[[Workspace, str, list[str]], st.SearchStrategy[dict[str, bytes]]]
    commands: tuple[str, ...] = COMMANDS
    hostile_layouts: bool = False  # structured inputs are hostile layouts half of the time
    share: float = 1.0
    examples: int = 400  # per mode in CI (tests/test_fuzz.py)


def _dry_runs(*specs: str) -> tuple[str, ...]:
    return tuple(f"convert --dry-run --to {spec}" for spec in specs)


HF_BASES = ("qwen3", "llama", "qwen3.5-moe-nvfp4", "qwen3-mlx", "qwen3-exl3", "dflash", "eagle3")
GGUF_BASES = ("gguf-llama", "gguf-qwen35moe", "gguf-qwen3moe", "gguf-dflash", "gguf-dflash-draft")
CONVERT_SPECS = (
    "bf16",
    "f32",
    "fp8",
    "fp8:tensor",
    "nvfp4",
    "nvfp4:ct",
    "nvfp4:mlx",
    "affine4",
    "affine:8:32:minmax",
    "gguf:Q8_0",
    "gguf:Q4_K",
    "gguf:NVFP4",
    "exl3:4",
)
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "safetensors",
            "formats/safetensors.read_header, formats/layouts.classify",
            HF_BASES,
            ("model.safetensors",),
            lambda w, b, f: safetensors_file(f).map(lambda raw: {"model.safetensors": raw}),
        ),
        Target(
            "gguf",
            "formats/gguf.read_header, checkpoint/gguf.build",
            ("gguf-llama", "gguf-qwen35moe", "gguf-dflash"),
            ("model.gguf",),
            lambda w, b, f: gguf_file(f).map(lambda raw: {"model.gguf": raw}),
        ),
        Target(
            "config",
            "config.json: checkpoint/hf.build via sources.reading.read_checkpoint",
            HF_BASES,
            ("config.json",),
            config_case,
        ),
        Target(
            "tokenizer",
            "tokenizer.json: checkpoint/tokenizer.from_tokenizer_json",
            ("qwen3", "qwen3.5-moe-nvfp4", "dflash", "llama"),
            ("tokenizer.json", "tokenizer_config.json", "generation_config.json"),
            tokenizer_case,
        ),
        Target(
            "index",
            "model.safetensors.index.json: sources.reading.safetensors_shards, check_index",
            ("qwen3-sharded",),
            ("model.safetensors.index.json",),
            index_case,
        ),
        Target(
            "quantization",
            "quantization_config, hf_quant_config.json, MLX quantization, EXL3 quantization_config.json",
            ("qwen3.5-moe-nvfp4", "qwen3-fp8", "qwen3-nvfp4-ct", "qwen3-mlx", "qwen3-exl3"),
            ("config.json", "hf_quant_config.json", "quantization_config.json"),
            quant_case,
        ),
        Target(
            "tokenizer-to-gguf",
            "tokenizer.json and configs -> GGUF keys: checkpoint/gguf_tokenizer.gguf_tokenizer_fields "
            "(convert --dry-run --to gguf:*)",
            ("qwen3", "llama", "qwen3.5-moe-nvfp4", "dflash"),
            ("tokenizer.json", "tokenizer_config.json", "generation_config.json"),
            tokenizer_to_gguf_case,
            _dry_runs("gguf:F16", "gguf:Q8_0 --json"),
            examples=100,
        ),
        Target(
            "tokenizer-from-gguf",
            "GGUF tokenizer.* keys -> tokenizer files: checkpoint/gguf_tokenizer.hf_tokenizer_files "
            "(convert --dry-run --to bf16)",
            GGUF_BASES,
            ("model.gguf",),
            gguf_tokenizer_case,
            _dry_runs("bf16", "bf16 --json"),
            examples=100,
        ),
        Target(
            "gguf-arch",
            "GGUF header -> config.json and tensor maps: checkpoint/gguf_arch.from_gguf, to_gguf for "
            "dflash-draft (convert; real conversions of accepted inputs too)",
            GGUF_BASES,
            ("model.gguf",),
            gguf_arch_case,
            (*_dry_runs("bf16", "fp8 --json", "gguf:Q8_0"), "convert --to bf16"),
            share=0.8,
            examples=100,
        ),
        Target(
            "exl3",
            "EXL3 trellis, scales and codebook markers -> formats/exl3.dequantize (convert --to bf16/f32, "
            "real conversions)",
            ("qwen3-exl3",),
            ("model.safetensors",),
            exl3_case,
            ("convert --to bf16", "convert --to f32", "convert --dry-run --to bf16"),
            share=0.5,
            examples=100,
        ),
        Target(
            "mlx",
            "MLX quantization defaults and per-module overrides -> formats/layouts.classify, weights.hf_weights "
            "(inspect, convert: plans and real conversions)",
            ("qwen3-mlx",),
            ("config.json", "model.safetensors"),
            mlx_case,
            ("inspect --json", *_dry_runs("bf16"), "convert --to bf16", "convert --to affine:8:64"),
            share=0.6,
            examples=100,
        ),
        Target(
            "lockfile",
            "specpair.lock: sources/lockfile.read_lock, verify, open_locked_pair (verify, check)",
            ("lock",),
            ("specpair.lock",),
            lock_case,
            ("verify", "verify --json", "check", "check --json"),
            examples=100,
        ),
        Target(
            "convert-plan",
            "convert planning on hostile checkpoints: convert/converter.open_source, plan (--dry-run), "
            "with tests/test_hostile.py's layouts",
            (*HF_BASES, "qwen3-sharded", "gguf-llama", "gguf-dflash"),
            ("config.json", "model.safetensors", "model.gguf", "tokenizer.json", "model.safetensors.index.json"),
            plan_case,
            (
                *_dry_runs(*CONVERT_SPECS),
                "convert --dry-run --to gguf:Q8_0 --json",
                "convert --dry-run --to fp8 --keep *.mlp.*=bf16",
            ),
            hostile_layouts=True,
            examples=100,
        ),
    )
}


@st.composite
def cases(draw: st.DrawFn, workspace: Workspace, target: Target, mode: str) -> Case:
    faults: list[str] = []
    base = draw(st.sampled_from(target.bases))
    layout: tuple[tuple[str, str], ...] = ()
    if mode == "mutate":
        name = draw(st.sampled_from([n for n in target.files if n in workspace.originals[base]]))
        seed, end = workspace.originals[base][name], workspace.header_ends[(base, name)]
        files = {name: draw(mutated(seed, end, faults, json_text=name.endswith((".json", ".lock"))))}
    elif target.hostile_layouts and draw(st.booleans()):
        files, layout = {}, draw(hostile_layout(workspace, base, faults))
    else:
        files = draw(target.structured(workspace, base, faults))
    return Case(base, files, draw(st.sampled_from(target.commands)), tuple(faults), layout)


def case_input(case: Case) -> dict[str, Any]:
    """A crash reproducer: the case with its files as latin-1 text (lossless for any bytes)."""
    return {
        "base": case.base,
        "command": case.command,
        "faults": list(case.faults),
        "layout": list(case.layout),
        "files": {name: raw.decode("latin-1") for name, raw in case.files.items()},
    }


def temporary_workspace() -> Workspace:
    return Workspace(Path(tempfile.mkdtemp(prefix="specpair-fuzz-")))


def remove_workspace(workspace: Workspace) -> None:
    shutil.rmtree(workspace.root, ignore_errors=True)

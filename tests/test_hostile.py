"""Hostile checkpoints through the CLI: `specpair inspect` and `specpair check` as subprocesses.

A checkpoint directory is untrusted. Its index may name paths outside it, its files may be symlinks
out of it, FIFOs or sparse giants, its shards may collide by case, it may ship pickles and custom
code. Each case checks what a user sees (exit 2 and one `error: <file>: <problem>` line, or a normal
answer with a note) and, through a Python audit hook in the CLI process, which files were opened:
nothing outside the checkpoint, no pickle, no code. Memory-sensitive cases run under an address-space
cap, so a reader that allocated what a header claims dies instead of passing.
(tests/test_bad_input.py holds the malformed-file cases; this file the hostile-layout ones.)
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures import (
    TRAP_MARKER,
    build_dflash,
    build_gguf_target,
    build_target,
    trap_pickle,
)

GIB = 1 << 30
MEMORY_CAP = GIB  # address space of a CLI process in the memory-sensitive cases (it needs ~300 MB)

# The CLI's own entry point, with an audit hook that logs every path the process opens.
AUDITED_CLI = """
import os, sys
log = os.open(sys.argv.pop(1), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
def record(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)):
        os.write(log, os.fsencode(os.path.abspath(os.fsdecode(args[0]))) + b"\\0")
sys.addaudithook(record)
sys.argv[0] = "specpair"
from specpair.cli import main
main()
"""


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    opened: set[str]  # every path opened, resolved (symlinks followed) after the run
    seconds: float


def specpair(
    *args: str | Path, tmp: Path, env: dict[str, str] | None = None, memory_cap: int | None = None, timeout: float = 60
) -> Run:
    log = tmp / "opened.log"
    log.unlink(missing_ok=True)
    cap = None if memory_cap is None else lambda: resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", AUDITED_CLI, str(log), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        preexec_fn=cap,
        check=False,
    )
    seconds = time.perf_counter() - start
    paths = log.read_bytes().split(b"\0") if log.exists() else []
    return Run(
        done.returncode, done.stdout, done.stderr, {os.path.realpath(os.fsdecode(p)) for p in paths if p}, seconds
    )


def assert_refused(run: Run, names: Path | str, problem: str) -> None:
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 2, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {names}: "), run.stderr
    assert problem in lines[0], lines[0]
    assert run.stdout == ""


def assert_never_opened(run: Run, *paths: Path) -> None:
    for path in paths:
        assert os.path.realpath(path) not in run.opened, f"{path} was opened"


def commands(root: Path) -> list[list[str | Path]]:
    """Both commands on a target checkpoint."""
    return [["inspect", root], ["check", root, "--gpu", "h200"]]


def custom_shard_names(root: Path) -> Path:
    """Rename a huggingface_hub shard series (model-0000k-of-0000n) to names outside it, so that only the index
    says which files hold the weights: the layout in which specpair reads the index."""
    index = root / "model.safetensors.index.json"
    document = json.loads(index.read_text())
    renames = {shard: f"part-{k}.safetensors" for k, shard in enumerate(sorted(set(document["weight_map"].values())))}
    for old, new in renames.items():
        (root / old).rename(root / new)
    document["weight_map"] = {name: renames[shard] for name, shard in document["weight_map"].items()}
    index.write_text(json.dumps(document))
    return root


def edit_json(path: Path, edit) -> None:
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))


def sparse(path: Path, size: int, head: bytes = b"") -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def test_the_audit_sees_every_file_the_cli_reads(tmp_path: Path) -> None:
    root = build_target(tmp_path / "model", "qwen3", layers=1, shards=2)
    run = specpair("inspect", root, tmp=tmp_path)
    assert run.returncode == 0, run.stderr
    read = {p.name for p in root.iterdir() if str(p) in run.opened}
    # a complete shard series is read from its headers; its index, which only repeats them, is not opened
    assert read == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }


# ---------------------------------------------------------------------------------------------------
# index shard names that leave the checkpoint


@pytest.fixture
def sharded(tmp_path: Path) -> tuple[Path, Path]:
    """A two-shard target whose index is read (its shards are not named as a huggingface_hub series), and a valid
    copy of its second shard lying outside it."""
    root = custom_shard_names(build_target(tmp_path / "model", "qwen3", layers=1, shards=2))
    outside = tmp_path / "outside.safetensors"
    shutil.copy(root / "part-1.safetensors", outside)
    return root, outside


@pytest.mark.parametrize("command", ["inspect", "check"])
@pytest.mark.parametrize(
    "shard",
    [
        "../outside.safetensors",
        "sub/../../outside.safetensors",
        "OUTSIDE",
        "../../etc/passwd",
        "/etc/passwd",
        "./part-1.safetensors",
    ],
)
def test_index_names_outside_the_checkpoint_are_refused_unopened(
    sharded: tuple[Path, Path], tmp_path: Path, shard: str, command: str
) -> None:
    root, outside = sharded
    shard = str(outside) if shard == "OUTSIDE" else shard
    index = root / "model.safetensors.index.json"
    edit_json(
        index,
        lambda d: d["weight_map"].update({k: shard for k, v in d["weight_map"].items() if v == "part-1.safetensors"}),
    )
    run = specpair(*next(c for c in commands(root) if c[0] == command), tmp=tmp_path)
    assert_refused(
        run, index, f"names shard {shard!r}, which is not a plain relative path inside the checkpoint: refused"
    )
    assert_never_opened(run, outside, Path("/etc/passwd"))


# ---------------------------------------------------------------------------------------------------
# symlinks


def link_out(root: Path, name: str, elsewhere: Path, relative: bool) -> Path:
    """Move root/name to elsewhere/name and leave a symlink to it in its place."""
    elsewhere.mkdir(exist_ok=True)
    target = elsewhere / name
    shutil.move(root / name, target)
    (root / name).symlink_to(os.path.relpath(target, root) if relative else target)
    return target


@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute"])
@pytest.mark.parametrize(
    "name", ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "tokenizer_config.json"]
)
def test_symlink_out_of_the_checkpoint_is_refused(tmp_path: Path, name: str, relative: bool) -> None:
    root = build_target(tmp_path / "model", "qwen3", layers=1)
    target = link_out(root, name, tmp_path / "elsewhere", relative)
    for command in commands(root):
        run = specpair(*command, tmp=tmp_path)
        assert_refused(run, root / name, f"resolves to {str(target)!r}, outside the checkpoint directory: refused")
        assert_never_opened(run, target)


def test_symlinked_shard_and_index_of_a_drafter_are_refused_in_check(tmp_path: Path) -> None:
    target = build_target(tmp_path / "target", "qwen3_5_moe", layers=8)
    drafter = build_dflash(tmp_path / "drafter")
    shard = link_out(drafter, "model.safetensors", tmp_path / "elsewhere", relative=True)
    run = specpair("check", target, drafter, "--gpu", "h200", tmp=tmp_path)
    assert_refused(run, drafter / "model.safetensors", "outside the checkpoint directory: refused")
    assert_never_opened(run, shard)

    sharded = custom_shard_names(build_target(tmp_path / "sharded", "qwen3", layers=1, shards=2))
    index = link_out(sharded, "model.safetensors.index.json", tmp_path / "elsewhere", relative=False)
    run = specpair("check", sharded, "--gpu", "h200", tmp=tmp_path)
    assert_refused(run, sharded / "model.safetensors.index.json", "outside the checkpoint directory: refused")
    assert_never_opened(run, index)
    # beside a complete shard series the index is not read at all, so a symlink out of it opens nothing
    series = build_target(tmp_path / "series", "qwen3", layers=1, shards=2)
    index = link_out(series, "model.safetensors.index.json", tmp_path / "elsewhere-2", relative=False)
    run = specpair("check", series, "--gpu", "h200", tmp=tmp_path)
    assert run.returncode in (0, 1), run.stderr
    assert_never_opened(run, index)


def test_devices_and_fifos_are_refused_without_blocking(tmp_path: Path) -> None:
    root = build_target(tmp_path / "model", "qwen3", layers=1)
    (root / "config.json").unlink()
    (root / "config.json").symlink_to("/dev/zero")  # would read forever
    run = specpair("inspect", root, tmp=tmp_path, timeout=30)
    assert_refused(run, root / "config.json", "resolves to '/dev/zero', outside the checkpoint directory: refused")

    for name in ("config.json", "model.safetensors"):
        root = build_target(tmp_path / name.replace(".", "-"), "qwen3", layers=1)
        (root / name).unlink()
        os.mkfifo(root / name)  # opening it for reading would wait for a writer forever
        run = specpair("inspect", root, tmp=tmp_path, timeout=30)
        assert_refused(run, root / name, "is not a regular file: refused")


def test_symlinks_inside_the_checkpoint_are_followed(tmp_path: Path) -> None:
    plain = build_target(tmp_path / "plain", "qwen3", layers=1)
    linked = build_target(tmp_path / "linked", "qwen3", layers=1)
    (linked / "weights").mkdir()
    shutil.move(linked / "model.safetensors", linked / "weights" / "model.safetensors")
    (linked / "model.safetensors").symlink_to("weights/model.safetensors")
    runs = [specpair("inspect", path, "--json", tmp=tmp_path) for path in (plain, linked)]
    assert [r.returncode for r in runs] == [0, 0], runs[1].stderr
    plain_json, linked_json = (json.loads(r.stdout)["checkpoint"] for r in runs)
    assert linked_json["groups"] == plain_json["groups"] and linked_json["shapes"] == plain_json["shapes"]


def test_a_gguf_named_on_the_command_line_is_followed_but_not_one_inside_a_directory(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    real = build_gguf_target(tmp_path / "store" / "model.gguf", "llama", layers=1)
    models = tmp_path / "models"
    models.mkdir()
    (models / "link.gguf").symlink_to(real)
    run = specpair("inspect", models / "link.gguf", "--json", tmp=tmp_path)  # the user's own choice of file
    assert run.returncode == 0 and json.loads(run.stdout)["checkpoint"]["format"] == "gguf", run.stderr
    run = specpair("inspect", models, "--gguf-file", "link.gguf", tmp=tmp_path)  # a file of a checkpoint directory
    assert_refused(run, models / "link.gguf", "outside the checkpoint directory: refused")


# ---------------------------------------------------------------------------------------------------
# the huggingface_hub cache: snapshot files are symlinks into the repo's blobs/

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hf_cache(checkpoint: Path, cache: Path, repo: str = "org/tiny", subfolder: str = "") -> Path:
    """Lay `checkpoint` out as huggingface_hub does: blobs/<sha256>, and in snapshots/<commit>/[subfolder/]
    a relative symlink per file to its blob. Returns the folder holding the checkpoint's files."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    files = folder / "snapshots" / COMMIT / subfolder
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    files.mkdir(parents=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(COMMIT)
    for file in sorted(checkpoint.iterdir()):
        blob = folder / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copy(file, blob)
        (files / file.name).symlink_to(os.path.relpath(blob, files))
    return files


def offline_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return {**env, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def test_hf_cache_snapshots_keep_working(tmp_path: Path) -> None:
    plain = build_target(tmp_path / "plain", "qwen3", layers=1)
    snapshot = hf_cache(plain, tmp_path / "cache")
    expected = json.loads(specpair("inspect", plain, "--json", tmp=tmp_path).stdout)["checkpoint"]
    for ref in (snapshot, "org/tiny"):
        run = specpair("inspect", ref, "--json", tmp=tmp_path, env=offline_env(tmp_path / "cache"))
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout)["checkpoint"]
        assert (got["groups"], got["shapes"], got["tokenizer"]) == (
            expected["groups"],
            expected["shapes"],
            expected["tokenizer"],
        )
    run = specpair("check", "org/tiny", "--gpu", "h200", tmp=tmp_path, env=offline_env(tmp_path / "cache"))
    assert run.returncode in (0, 1) and run.stderr == "", run.stderr
    # A checkpoint in a subfolder of a repo: its symlinks climb one level more to the same blobs/.
    drafter = hf_cache(build_dflash(tmp_path / "drafter"), tmp_path / "cache", subfolder="draft")
    run = specpair("check", snapshot, drafter, "--gpu", "h200", tmp=tmp_path)
    assert run.returncode in (0, 1) and run.stderr == "", run.stderr


@pytest.mark.parametrize("escape", ["other repo's blob", "outside the cache"])
def test_hf_cache_symlink_leaving_the_repo_folder_is_refused(tmp_path: Path, escape: str) -> None:
    plain = build_target(tmp_path / "plain", "qwen3", layers=1)
    cache = tmp_path / "cache"
    snapshot = hf_cache(plain, cache)
    other = hf_cache(plain, cache, repo="org/other")
    target = other / "config.json" if escape == "other repo's blob" else plain / "config.json"
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(os.path.relpath(os.path.realpath(target), snapshot))
    for ref in (snapshot, "org/tiny"):
        run = specpair("inspect", ref, tmp=tmp_path, env=offline_env(cache))
        assert_refused(run, snapshot / "config.json", "outside the checkpoint directory: refused")
        assert_never_opened(run, target)


# ---------------------------------------------------------------------------------------------------
# names that collide on case-insensitive file systems


def test_shards_differing_only_in_case_are_refused(tmp_path: Path) -> None:
    root = build_target(tmp_path / "sharded", "qwen3", layers=1, shards=2)
    shutil.copy(root / "model-00001-of-00002.safetensors", root / "Model-00001-of-00002.safetensors")
    index = root / "model.safetensors.index.json"
    edit_json(
        index, lambda d: d["weight_map"].update({"model.embed_tokens.weight": "Model-00001-of-00002.safetensors"})
    )
    for command in commands(root):
        run = specpair(*command, tmp=tmp_path)
        assert_refused(
            run,
            root,
            "names shards 'Model-00001-of-00002.safetensors' and "
            "'model-00001-of-00002.safetensors', which differ only in case: refused",
        )

    single = build_target(tmp_path / "single", "qwen3", layers=1)
    shutil.copy(single / "model.safetensors", single / "MODEL.safetensors")
    run = specpair("inspect", single, tmp=tmp_path)
    assert_refused(run, single, "names shards 'MODEL.safetensors' and 'model.safetensors', which differ only in case")


# ---------------------------------------------------------------------------------------------------
# pickles and custom code: reported, never opened

PICKLES = ("pytorch_model.bin", "training_args.bin", "optimizer.pt", "rng_state.pth", "extra.pkl", "last.ckpt")


@pytest.mark.parametrize("safetensors", [True, False], ids=["beside-safetensors", "pickles-only"])
def test_pickle_files_are_reported_never_loaded(tmp_path: Path, safetensors: bool) -> None:
    root = build_target(tmp_path / "model", "qwen3", layers=1)
    if not safetensors:
        (root / "model.safetensors").unlink()
    for name in PICKLES:
        (root / name).write_bytes(trap_pickle(root / TRAP_MARKER))
    run = specpair("inspect", root, "--json", tmp=tmp_path)
    assert run.returncode == 0, run.stderr
    checkpoint = json.loads(run.stdout)["checkpoint"]
    assert checkpoint["format"] == ("safetensors" if safetensors else "config-only")
    assert {f"pickle file {name}: reported, never loaded" for name in PICKLES} <= set(checkpoint["notes"])
    run_check = specpair("check", root, "--gpu", "h200", tmp=tmp_path)
    assert run_check.returncode in (0, 1), run_check.stderr
    assert not (root / TRAP_MARKER).exists()
    for done in (run, run_check):
        assert_never_opened(done, *(root / name for name in PICKLES))


def test_custom_code_is_reported_never_run(tmp_path: Path) -> None:
    target = build_target(tmp_path / "target", "qwen3_5_moe", layers=8)
    edit_json(target / "config.json", lambda c: c.update(auto_map={"AutoModelForCausalLM": "modeling_evil.Evil"}))
    (target / "modeling_evil.py").write_text(f"open({str(target / TRAP_MARKER)!r}, 'w')\n")
    drafter = build_dflash(tmp_path / "drafter", auto_map=True, tokenizer=True)
    inspected = specpair("inspect", target, "--json", tmp=tmp_path)
    checked = specpair("check", target, drafter, "--json", "--gpu", "h200", tmp=tmp_path)
    assert inspected.returncode == 0 and checked.returncode in (0, 1), checked.stderr
    assert (
        "auto_map names custom code (AutoModelForCausalLM=modeling_evil.Evil): reported, never run"
        in json.loads(inspected.stdout)["checkpoint"]["notes"]
    )
    assert (
        "auto_map names custom code (AutoModel=dflash.DFlashDraftModel): reported, never run"
        in json.loads(checked.stdout)["draft"]["notes"]
    )
    assert not (target / TRAP_MARKER).exists() and not (drafter / TRAP_MARKER).exists()
    for done in (inspected, checked):
        assert_never_opened(done, target / "modeling_evil.py", drafter / "dflash.py")


# ---------------------------------------------------------------------------------------------------
# sizes: sparse giants cost no disk, and must cost no memory or time either


@pytest.mark.parametrize(
    ("name", "sharded"),
    [
        ("config.json", False),
        ("tokenizer.json", False),
        ("tokenizer_config.json", False),
        ("generation_config.json", False),
        ("model.safetensors.index.json", True),
        ("hf_quant_config.json", False),
    ],
)
def test_a_1_gib_small_file_is_refused_by_size_before_reading(tmp_path: Path, name: str, sharded: bool) -> None:
    root = build_target(tmp_path / "model", "qwen3", layers=1, shards=2 if sharded else 1)
    if sharded:  # an index is read only where the shard names need it
        custom_shard_names(root)
    sparse(root / name, GIB, b"{")
    run = specpair("inspect", root, tmp=tmp_path, memory_cap=MEMORY_CAP)
    assert_refused(run, root / name, f"is {GIB} bytes, over the")


def test_gguf_counts_that_fit_a_sparse_file_are_refused_quickly(tmp_path: Path) -> None:
    # 2^26 metadata entries of 13 zero bytes each (an empty key, a u8 0) are a valid 872 MB header.
    entries = sparse(tmp_path / "entries.gguf", GIB, b"GGUF" + struct.pack("<IQQ", 3, 0, 2**26))
    run = specpair("inspect", entries, tmp=tmp_path, memory_cap=MEMORY_CAP, timeout=30)
    assert_refused(run, entries, "GGUF metadata count 67108864 cannot fit in the")
    assert run.seconds < 10

    # A 2 GiB string inside a 3 GiB file: reading it would need 2 GiB of memory.
    key = b"general.name"
    string = sparse(
        tmp_path / "string.gguf",
        3 * GIB,
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, 2 * GIB),
    )
    run = specpair("inspect", string, tmp=tmp_path, memory_cap=MEMORY_CAP, timeout=30)
    assert_refused(run, string, "GGUF string length count 2147483648 cannot fit in the")

    # The same claims reach `check` through a drafter: the message names the drafter's file.
    target = build_gguf_target(tmp_path / "target.gguf", "llama", layers=1)
    tensors = sparse(tmp_path / "tensors.gguf", GIB, b"GGUF" + struct.pack("<IQQ", 3, 2**40, 0))
    run = specpair("check", target, tensors, "--gpu", "h200", tmp=tmp_path, memory_cap=MEMORY_CAP, timeout=30)
    assert_refused(run, tensors, "GGUF tensor count 1099511627776 cannot fit in the")


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (
            {
                "fc.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "norm.weight": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            "overlap in the data section",
        ),
        ({"fc.weight": {"dtype": "U8", "shape": [2**40], "data_offsets": [0, 2**40]}}, "runs past the file's data"),
    ],
    ids=["overlapping", "past-the-end"],
)
def test_drafter_offsets_that_overlap_or_run_past_a_sparse_file_fail_check(
    tmp_path: Path, header: dict, problem: str
) -> None:
    target = build_target(tmp_path / "target", "qwen3_5_moe", layers=8)
    drafter = build_dflash(tmp_path / "drafter")
    raw = json.dumps(header).encode()
    shard = sparse(drafter / "model.safetensors", 4 * GIB, struct.pack("<Q", len(raw)) + raw)
    run = specpair("check", target, drafter, "--gpu", "h200", tmp=tmp_path, memory_cap=MEMORY_CAP)
    assert_refused(run, shard, problem)


def test_safetensors_header_claims_in_a_sparse_file_are_refused(tmp_path: Path) -> None:
    root = build_target(tmp_path / "model", "qwen3", layers=1)
    shard = root / "model.safetensors"
    sparse(shard, 4 * GIB, struct.pack("<Q", 100_000_001))  # past safetensors' own 100 MB header limit
    run = specpair("inspect", root, tmp=tmp_path, memory_cap=MEMORY_CAP)
    assert_refused(run, shard, "safetensors header length 100000001 is out of range")
    sparse(shard, 4 * GIB, struct.pack("<Q", 2**63))
    run = specpair("check", root, "--gpu", "h200", tmp=tmp_path, memory_cap=MEMORY_CAP)
    assert_refused(run, shard, f"safetensors header length {2**63} is out of range")

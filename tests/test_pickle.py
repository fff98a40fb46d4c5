"""Drafters published with pickled weights only (pytorch_model.bin, as the EAGLE authors publish EAGLE-3 heads), or
with their learned mask embedding as a pickle beside safetensors weights (mask_embedding.pt, as SGLang and vLLM load
it): `check` and `run` agree on what specpair does with them and name the same command, and `convert --from-pickle`
makes the safetensors copy through torch's weights-only loader, refusing hostile pickles in one line with exit 2
and nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import build_dflash, build_eagle3, build_target, write_json
from safetensors.torch import load_file

from specpair.checkpoint.hf import from_pickle_command
from specpair.convert.converter import PARTIAL_SUFFIX

ROOT = Path(__file__).resolve().parents[1]


def specpair(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "specpair", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def as_printed(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """A command specpair printed, run through a shell as a user pastes it (specpair: this checkout's)."""
    return subprocess.run(
        command.replace("specpair", f"{sys.executable} -m specpair", 1),
        shell=True,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT.parent)},
        timeout=300,
    )


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one error line a refused command prints, last on stderr after its progress lines."""
    lines = done.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:], done.stderr
    return errors[0]


def refused_leaving_nothing(draft: Path, pickled: Path, problem: str, destination: Path, marker: Path) -> None:
    """`convert --from-pickle` refuses `pickled` in one line naming it and `problem`, exit 2, with nothing written
    (no destination, no partial one) and nothing run (no marker)."""
    done = specpair("convert", draft, destination, "--from-pickle")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert error_line(done).startswith(f"error: {pickled}: ") and problem in error_line(done), done.stderr
    assert not destination.exists() and not Path(str(destination) + PARTIAL_SUFFIX).exists()
    assert not marker.exists()


def pickled(directory: Path, state: object) -> Path:
    """An EAGLE-3 checkpoint whose weights file is pytorch_model.bin holding `state` (its own tensors when None)."""
    build_eagle3(directory)
    weights = directory / "model.safetensors"
    torch.save(load_file(str(weights)) if state is None else state, directory / "pytorch_model.bin")
    weights.unlink()
    return directory


class Payload:
    """Unpickling it creates the marker file (os.system), as a hostile checkpoint would run anything."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_check_and_run_agree_and_name_the_conversion(tmp_path: Path) -> None:
    target = build_target(tmp_path / "target", "llama", flavour="llama3")
    draft = pickled(tmp_path / "eagle3", None)
    (draft / "training_args.bin").write_bytes(b"not read")
    command = from_pickle_command(str(draft))
    done = specpair("check", target, draft, "--stack", "specpair", "--json")
    report = json.loads(done.stdout)
    stack = report["verdicts"]["specpair"]
    reasons = {r["rule"]: r["message"] for r in stack["reasons"]}
    assert stack["status"] == "fail" and done.returncode != 0 and stack["fix"] == command
    assert f"`{command}`" in reasons["trust.pickle_weights"]
    done = specpair("run", target, draft, "--prompt", "hi", "--max-tokens", "2", "--device", "cpu")
    assert done.returncode == 2 and f"`{command}`" in error_line(done) and "pickle" in error_line(done)
    # the command as printed makes a copy that check no longer refuses, with the same tensors
    done = as_printed(command, tmp_path)
    assert done.returncode == 0, done.stderr
    copy = tmp_path / "eagle3-safetensors"
    assert sorted(p.name for p in copy.iterdir()) == ["config.json", "model.safetensors"]  # training_args.bin left out
    original = torch.load(draft / "pytorch_model.bin", weights_only=True)
    written = load_file(str(copy / "model.safetensors"))
    assert written.keys() == original.keys() and all(torch.equal(written[k], original[k]) for k in original)
    report = json.loads(specpair("check", target, copy, "--stack", "specpair", "--json").stdout)
    assert "trust.pickle_weights" not in {r["rule"] for r in report["verdicts"]["specpair"]["reasons"]}


@pytest.mark.parametrize("hostile", ["runs code", "not a tensor", "not a state dict", "truncated"])
def test_hostile_pickles_are_refused_with_nothing_written(tmp_path: Path, hostile: str) -> None:
    marker = tmp_path / "MARKER"
    states = {
        "runs code": {"fc.weight": Payload(marker)},
        "not a tensor": {"fc.weight": torch.ones(2), "epoch": "3"},
        "not a state dict": [torch.ones(2)],
        "truncated": None,
    }
    draft = pickled(tmp_path / "eagle3", states[hostile])
    weights = draft / "pytorch_model.bin"
    if hostile == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    problem = {
        "runs code": "refused by torch's weights-only loader: Trying to load unsupported GLOBAL posix.system",
        "not a tensor": "holds a str at 'epoch': only dense tensors are converted",
        "not a state dict": "holds a list, not a state dict",
        "truncated": "not a complete torch.save file, refused",
    }[hostile]
    refused_leaving_nothing(draft, weights, problem, tmp_path / "out", marker)


def test_the_conversion_is_never_implicit(tmp_path: Path) -> None:
    """Without --from-pickle, convert asks for a layout; with --to beside it, it is refused; a checkpoint that has
    safetensors weights is not converted from pickles."""
    draft = pickled(tmp_path / "eagle3", None)
    done = specpair("convert", draft, tmp_path / "out")
    assert done.returncode == 2 and "--to: missing" in done.stderr
    done = specpair("convert", draft, tmp_path / "out", "--from-pickle", "--to", "bf16")
    assert done.returncode == 2 and "drop --to bf16" in done.stderr
    done = specpair("convert", build_eagle3(tmp_path / "plain"), tmp_path / "out", "--from-pickle")
    assert done.returncode == 2 and "already has .safetensors weights" in done.stderr
    assert not (tmp_path / "out").exists()


def mask_drafter(directory: Path, state: object) -> Path:
    """A DFlash drafter (qwen3_target's width, 64) shipping `state` as mask_embedding.pt beside its safetensors."""
    draft = build_dflash(
        directory, target_layer_ids=[1, 2], num_target_layers=4, flavour="qwen3", layers=1, block_size=4
    )
    torch.save(state, draft / "mask_embedding.pt")
    return draft


def mask_token(draft: Path) -> int:
    return json.loads((draft / "config.json").read_text())["dflash_config"]["mask_token_id"]


def test_a_mask_embedding_pickle_check_and_run_agree_and_the_conversion_is_drafted_with(tmp_path: Path) -> None:
    """check warns that specpair drafts with the target's row of the mask token, and run shows the same warning and
    runs (the output is unchanged); the command both name writes the pickle's vector as the tensor specpair drafts
    with, and check then says so."""
    target = build_target(tmp_path / "target", "qwen3", layers=4)
    vector = torch.randn(64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    draft = mask_drafter(tmp_path / "dflash", None)
    torch.save({"embedding": vector, "mask_token_id": mask_token(draft)}, draft / "mask_embedding.pt")
    command = from_pickle_command(str(draft))
    done = specpair("check", target, draft, "--stack", "specpair", "--stack", "vllm", "--json")
    verdicts = json.loads(done.stdout)["verdicts"]
    reasons = {r["rule"]: r["message"] for r in verdicts["specpair"]["reasons"]}
    assert (
        verdicts["specpair"]["status"] == "warn"
        and f"`{command}` writes it as 'mask_embedding'" in reasons["mask.embedding_unread"]
    )
    assert "mask.embedding" in {r["rule"] for r in verdicts["vllm"]["reasons"]}  # vLLM loads the pickle itself
    asked = [
        "--prompt",
        "a b c d e f g h",
        "--max-tokens",
        "16",
        "--batch",
        "1",
        "--temperature",
        "0",
        "--device",
        "cpu",
    ]
    done = specpair("run", target, draft, *asked)
    assert done.returncode == 0, done.stderr
    assert "warning: mask.embedding_unread: " in done.stderr and f"`{command}`" in done.stderr
    done = as_printed(command, tmp_path)
    assert done.returncode == 0, done.stderr
    copy = tmp_path / "dflash-safetensors"
    assert sorted(p.name for p in copy.iterdir()) == ["config.json", "mask_embedding.safetensors", "model.safetensors"]
    assert load_file(str(copy / "model.safetensors")).keys() == load_file(str(draft / "model.safetensors")).keys()
    assert torch.equal(load_file(str(copy / "mask_embedding.safetensors"))["mask_embedding"], vector)
    done = specpair("check", target, copy, "--stack", "specpair", "--stack", "vllm", "--json")
    verdicts = json.loads(done.stdout)["verdicts"]
    assert "mask.embedding" in {r["rule"] for r in verdicts["specpair"]["reasons"]}
    assert "mask.embedding_unread" in {r["rule"] for r in verdicts["vllm"]["reasons"]}  # vLLM reads the pickle only
    done = specpair("run", target, copy, *asked)
    assert done.returncode == 0 and "mask.embedding" not in done.stderr, done.stderr


def test_a_bare_mask_embedding_tensor_joins_the_index(tmp_path: Path) -> None:
    """vLLM also loads a bare tensor; a drafter read through its safetensors index gets the tensor added to it, and
    its runtime drafts with it."""
    from drafting import load_target

    from specpair.runtime.drafters.loading import load_drafter
    from specpair.sources.model import open_model

    target = build_target(tmp_path / "target", "qwen3", layers=4)
    vector = torch.randn(1, 64, generator=torch.Generator().manual_seed(3))
    draft = mask_drafter(tmp_path / "dflash", vector)
    names = load_file(str(draft / "model.safetensors")).keys()
    write_json(
        draft / "model.safetensors.index.json",
        {"metadata": {}, "weight_map": dict.fromkeys(names, "model.safetensors")},
    )
    done = specpair("convert", draft, tmp_path / "copy", "--from-pickle", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"] == ["mask_embedding.safetensors"]
    index = json.loads((tmp_path / "copy" / "model.safetensors.index.json").read_text())
    assert (
        index["weight_map"]["mask_embedding"] == "mask_embedding.safetensors" and index["metadata"]["total_size"] == 256
    )
    model, runtime = load_target(target)
    drafter = load_drafter(open_model(str(tmp_path / "copy")), model, runtime)
    assert torch.equal(drafter.mask_embedding, vector[0])


@pytest.mark.parametrize(
    "hostile", ["runs code", "not a tensor", "wrong shape", "truncated", "another mask token", "per position"]
)
def test_hostile_mask_embedding_pickles_are_refused_with_nothing_written(tmp_path: Path, hostile: str) -> None:
    marker = tmp_path / "MARKER"
    draft = mask_drafter(tmp_path / "dflash", None)
    mask = mask_token(draft)
    states = {
        "runs code": {"embedding": Payload(marker), "mask_token_id": mask},
        "not a tensor": {"embedding": [0.5] * 64, "mask_token_id": mask},
        "wrong shape": {"embedding": torch.ones(2, 64), "mask_token_id": mask},
        "truncated": {"embedding": torch.ones(64), "mask_token_id": mask},
        "another mask token": {"embedding": torch.ones(64), "mask_token_id": mask - 1},
        "per position": {"embedding": torch.ones(64), "mask_token_id": mask, "per_position": True},
    }
    pickled = draft / "mask_embedding.pt"
    torch.save(states[hostile], pickled)
    if hostile == "truncated":
        pickled.write_bytes(pickled.read_bytes()[: pickled.stat().st_size // 2])
    problem = {
        "runs code": "refused by torch's weights-only loader: Trying to load unsupported GLOBAL posix.system",
        "not a tensor": "holds a list where the mask embedding belongs: a float tensor [64]",
        "wrong shape": "holds a [2, 64] tensor, where the mask embedding is [64] (the drafter's hidden_size)",
        "truncated": "not a complete torch.save file, refused",
        "another mask token": f"was saved for mask_token_id {mask - 1}, but the drafter's config has {mask}",
        "per position": "holds per-position mask embeddings (per_position), which no stack drafts with",
    }[hostile]
    refused_leaving_nothing(draft, pickled, problem, tmp_path / "out", marker)

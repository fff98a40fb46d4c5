"""Drafters published with pickled weights only (pytorch_model.bin, as the EAGLE authors publish EAGLE-3 heads):
`check` and `run` agree that specpair does not load them and name the same command, and `convert --from-pickle`
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
from fixtures import build_eagle3, build_target
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


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one error line a refused command prints, last on stderr after its progress lines."""
    lines = done.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:], done.stderr
    return errors[0]


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
    done = subprocess.run(
        command.replace("specpair", f"{sys.executable} -m specpair", 1),
        shell=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT.parent)},
        timeout=300,
    )
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
    destination = tmp_path / "out"
    done = specpair("convert", draft, destination, "--from-pickle")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert error_line(done).startswith(f"error: {weights}: ") and problem in error_line(done), done.stderr
    assert not destination.exists() and not Path(str(destination) + PARTIAL_SUFFIX).exists()
    assert not marker.exists()


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

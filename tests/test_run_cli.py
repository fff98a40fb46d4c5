"""`specpair run TARGET` end to end on a tiny checkpoint: the streamed text, the specpair.run/1 document, and
bad input as one line (or one JSON document) with exit code 2."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import build_dflash, save, tiny_model, vocabulary
from jsonschema import Draft202012Validator

from specpair.runtime.generate import generate
from specpair.runtime.kernels.cpu_rows import native_bf16
from specpair.runtime.loading import load, plan_load
from specpair.runtime.sampling import Sampling
from specpair.sources.model import open_model


def run(*args: str) -> subprocess.CompletedProcess:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:  # the tree under test, where it is not the installed one
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        [sys.executable, "-m", "specpair", "run", *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return save(tiny_model("qwen3_5"), tmp_path_factory.mktemp("target") / "hf", "qwen3")


def test_json_document_holds_the_generation(target):
    prompt = "Hello there"
    done = run(str(target), "--prompt", prompt, "--max-tokens", "5", "--device", "cpu", "--json", "--no-chat")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "schemas" / "run.schema.json").read_text())
    Draft202012Validator(schema).validate(report)
    model = open_model(str(target))
    tokenizer = model.tokenizer()
    served = getattr(torch, report["dtype"])  # bfloat16 on a CPU with native bf16 products, else float32
    assert served == (torch.bfloat16 if native_bf16() else torch.float32)
    (expected,), _ = generate(
        load(plan_load(model, "cpu", served)), [tokenizer.encode(prompt)], 5, Sampling(), tokenizer.stop_ids
    )
    assert report["schema"] == "specpair.run/1"
    assert report["tokens"] == expected.tokens
    assert report["text"] == tokenizer.decode(expected.tokens[:-1] if expected.stopped else expected.tokens)
    assert report["prompt"] == {
        "sha256": hashlib.sha256(prompt.encode()).hexdigest(),
        "tokens": len(tokenizer.encode(prompt)),
        "chat": False,
        "chat_template_kwargs": {},
    }
    assert report["device"] == "cpu"
    assert report["target"]["revision"] is None and report["target"]["family"] == "qwen3_5"
    assert report["tokens_per_s"] > 0 and set(report["seconds"]) == {"load", "prefill", "decode"}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dtype_asked_is_the_dtype_run(target, dtype):
    """--dtype float32 on any CPU gives the float32 runtime's tokens (transformers' bits), bfloat16 the bf16 one's."""
    prompt = "Hello there"
    done = run(
        str(target), "--prompt", prompt, "--max-tokens", "5", "--device", "cpu", "--json", "--no-chat", "--dtype", dtype
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["dtype"] == dtype
    model = open_model(str(target))
    tokenizer = model.tokenizer()
    (expected,), _ = generate(
        load(plan_load(model, "cpu", getattr(torch, dtype))),
        [tokenizer.encode(prompt)],
        5,
        Sampling(),
        tokenizer.stop_ids,
    )
    assert report["tokens"] == expected.tokens


def test_a_dtype_the_runtime_does_not_serve_is_one_line(target):
    done = run(str(target), "--prompt", "Hi", "--device", "cpu", "--dtype", "float16")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == "error: --dtype: 'float16' is not one of bfloat16, float32"


def test_text_streams_to_stdout_and_speed_to_stderr(target, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Tell me a story", encoding="utf-8")
    args = [str(target), "--prompt-file", str(prompt), "--chat", "--max-tokens", "4", "--temperature", "0.9"]
    args += ["--seed", "3", "--device", "cpu"]
    done = run(*args)
    assert done.returncode == 0, done.stderr
    again = run(*args, "--quiet")
    assert again.stdout == done.stdout and again.stderr == ""  # seeded: the same text; quiet: nothing else
    assert done.stdout.endswith("\n")
    assert "loading" in done.stderr and "tok/s" in done.stderr and "qwen3_5" in done.stderr


def test_bad_input_is_one_line_or_one_json_document(target, tmp_path):
    done = run(str(target), "--max-tokens", "4", "--json")
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert error["error"]["file"] == "--prompt" and "exactly one of --prompt" in error["error"]["problem"]
    drafter = build_dflash(tmp_path / "drafter", target_layer_ids=[1, 2])
    done = run(str(drafter), "--prompt", "hi", "--device", "cpu")
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr.count("\n") == 1
        and "is a dflash drafter, not a target model: `specpair run` takes the target" in done.stderr
    )


def test_a_model_too_big_for_the_gpu_is_told_what_it_needs_and_what_fits(target):
    from specpair.app.memory import does_not_fit, needs
    from specpair.compat.memory import OVERHEAD_PER_GPU

    plan = plan_load(open_model(str(target)), "cpu")  # float32 weights: 32 bits each
    needed = needs(plan, 100)
    message = does_not_fit(plan, 100, needed - 1, "1 GB are free")
    assert message.startswith(f"needs {round(needed / 1e9, 1)} GB on the GPU (") and "cache for 100 tokens" in message
    assert message.endswith(f"at 8.5 bits it would fit: specpair convert {target} hf-fp8 --to fp8")
    convert = message.rpartition(": ")[2].split()  # runs as pasted (planned here: --dry-run writes nothing)
    planned = subprocess.run(
        [sys.executable, "-m", "specpair", *convert[1:], "--dry-run"], capture_output=True, text=True, timeout=300
    )
    assert planned.returncode == 0, planned.stderr
    message = does_not_fit(plan, 100, OVERHEAD_PER_GPU, "2 GB are free")
    assert message.endswith("a smaller layout would not fit this GPU either (`specpair check` names multi-GPU stacks)")


def test_bad_arguments_are_refused_before_loading(target, tmp_path):
    from typer.testing import CliRunner

    from specpair.cli import app
    from specpair.errors import BadInput

    cases = {
        ("--prompt", "x", "--device", "tpu"): "'tpu' is not cuda, cuda:N or cpu",
        ("--prompt", "x", "--prompt-file", "p.txt"): "exactly one of --prompt TEXT and --prompt-file FILE",
        ("--prompt-file", str(tmp_path / "missing.txt")): "cannot be read as UTF-8 text",
        ("--prompt", "x", "--top-p", "0", "--device", "cpu"): "0 keeps no token",
        ("--prompt", "x", "--chat-template-kwargs", "{"): "is not JSON (",
        ("--prompt", "x", "--chat-template-kwargs", "[1]"): "is a JSON list, not an object of variables",
        ("--prompt", "x", "--no-chat", "--chat-template-kwargs", '{"enable_thinking": false}'): "chat template only",
    }
    for args, problem in cases.items():
        result = CliRunner().invoke(app, ["run", str(target), *args])
        assert isinstance(result.exception, BadInput) and problem in str(result.exception), (args, result.exception)


def test_the_chat_templates_variables_reach_it_and_the_report(tmp_path):
    """--chat-template-kwargs renders the template with its variables, as vLLM's and SGLang's do: Qwen3.5's writes an
    empty think block where enable_thinking is false (a drafter trained on one mode is accepted less in the other,
    z-lab/dflash#60), and the report says what it was rendered with."""
    target = save(tiny_model("qwen3_5", vocab_size=len(vocabulary("qwen3_5").tokens)), tmp_path / "hf", "qwen3_5")
    tokenizer = open_model(str(target)).tokenizer()
    chat = [{"role": "user", "content": "Hello"}]
    reports = {}
    for variables in ({}, {"enable_thinking": False}):
        args = ["--chat-template-kwargs", json.dumps(variables)] if variables else []
        done = run(str(target), "--prompt", "Hello", "--max-tokens", "2", "--device", "cpu", "--json", *args)
        assert done.returncode == 0, done.stderr
        reports[bool(variables)] = report = json.loads(done.stdout)["prompt"]
        assert report["chat"] and report["chat_template_kwargs"] == variables
        rendered = tokenizer.apply_chat_template(chat, **variables)
        assert rendered.endswith("<think>\n\n</think>\n\n" if variables else "<think>\n")
        assert report["tokens"] == len(tokenizer.encode(rendered, add_special_tokens=False))
    assert reports[True]["tokens"] > reports[False]["tokens"]


def test_a_repo_in_the_hf_cache_reports_its_commit(target, tmp_path, monkeypatch):
    import shutil

    from typer.testing import CliRunner

    from specpair.cli import app

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny--qwen3_5"
    shutil.copytree(target, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    result = CliRunner().invoke(
        app, ["run", "tiny/qwen3_5", "--prompt", "hi", "--max-tokens", "2", "--device", "cpu", "--json", "--quiet"]
    )
    assert result.exception is None, result.exception
    assert json.loads(result.stdout)["target"]["revision"] == commit


def test_a_prompt_file_that_is_not_utf8_is_one_line_naming_it(target, tmp_path):
    """`printf '\xff\xfe bad' > p.txt; specpair run MODEL --prompt-file p.txt` once printed a traceback (exit 1)."""
    bad = tmp_path / "p.txt"
    bad.write_bytes(b"\xff\xfe bad")
    problem = "cannot be read as UTF-8 text (invalid start byte: byte 0xff at offset 0)"
    done = run(str(target), "--prompt-file", str(bad), "--device", "cpu")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {bad}: {problem}\n")
    done = run(str(target), "--prompt-file", str(bad), "--device", "cpu", "--json")
    assert done.returncode == 2 and done.stderr == ""
    assert json.loads(done.stdout)["error"] == {"file": str(bad), "problem": problem}


def test_a_prompt_file_reads_as_text_mode_would(tmp_path):
    from specpair.app.prompts import read_prompt

    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes("é\r\nline\rend".encode())
    with open(crlf, encoding="utf-8") as f:
        assert read_prompt(None, str(crlf)) == f.read() == "é\nline\nend"


def test_help_code_and_readme_give_the_same_max_tokens():
    """`run --help` said 128 where the README said 64: the defaults are the code's constants, named in both."""
    import re

    from typer.testing import CliRunner

    from specpair.app.gate import GATE_MAX_TOKENS
    from specpair.app.generation import MAX_TOKENS
    from specpair.app.pair import DEMO_CPU_MAX_TOKENS
    from specpair.cli import app

    shown = " ".join(CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).stdout.split())
    option = re.search(r"--max-tokens <int range> (.*?) --temperature", shown).group(1)
    assert option.startswith(
        f"Most tokens to generate (default: {MAX_TOKENS}; with a drafter {GATE_MAX_TOKENS} per prompt and setting, "
        f"{DEMO_CPU_MAX_TOKENS} for --demo on a CPU)."
    ), option
    assert "default: 128]" not in option  # no second default beside the sentence
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert f"`--max-tokens N` ({MAX_TOKENS})" in readme
    assert f"`--max-tokens N` ({GATE_MAX_TOKENS}; {DEMO_CPU_MAX_TOKENS} for `--demo` on a CPU)" in readme

"""Every --json document specpair prints validates against its published JSON Schema (docs/schemas/), errors
included: real output of every command, on catalog, local, GGUF and fake-Hub checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hubserver import FakeHub
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from test_download import cache, files_of, pair_dirs, specpair  # noqa: F401 (fixtures)

from specpair.checkpoint.families import WINDOW_SOURCES

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "docs" / "schemas"
BY_NAME = {
    "specpair.check/1": "check",
    "specpair.inspect/1": "inspect",
    "specpair.catalog/1": "catalog",
    "specpair.download/1": "download",
    "specpair.verify/1": "verify",
    "specpair.convert/1": "convert",
    "specpair.convert.plan/1": "convert-plan",
    "specpair.convert.pickle/1": "convert-pickle",
    "specpair.error/1": "error",
    "specpair.run/1": "run",
    "specpair.bench/1": "bench",
}


def registry() -> Registry:
    resources = [(p.name, Resource.from_contents(json.loads(p.read_text()))) for p in SCHEMAS.glob("*.schema.json")]
    return Registry().with_resources(resources)


def validate(document: dict) -> None:
    """Against the schema its own `schema` field names."""
    name = BY_NAME[document["schema"]]
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    errors = sorted(Draft202012Validator(schema, registry=registry()).iter_errors(document), key=lambda e: e.path)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


def run(*args: str, cwd: Path | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "specpair", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )
    assert done.stderr == "" or "--json" not in args or done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_schema_is_published_and_well_formed() -> None:
    names = {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")}
    assert set(BY_NAME.values()) | {"checkpoint"} == names
    for p in SCHEMAS.glob("*.schema.json"):
        Draft202012Validator.check_schema(json.loads(p.read_text()))


def test_the_checkpoint_schemas_window_sources_are_the_table_rows() -> None:
    """A window's declaration in documents is one of families.WINDOW_SOURCES' rows, or none: the schema lists them."""
    rope = json.loads((SCHEMAS / "checkpoint.schema.json").read_text())["properties"]["rope"]
    assert rope["properties"]["window_source"]["enum"] == [*WINDOW_SOURCES, None]


def test_check_inspect_and_catalog_documents(tmp_path: Path) -> None:
    from fixtures import build_dflash, build_gguf_dflash, build_gguf_target, build_target

    gguf_target = build_gguf_target(tmp_path / "t.gguf", "qwen35moe", layers=8, nextn=1)
    fork = build_gguf_dflash(tmp_path / "fork.gguf", "dflash-draft", tokenizer=False)
    target = build_target(tmp_path / "target", "qwen3_5_moe", layers=4)
    draft = build_dflash(tmp_path / "draft")
    for args in (
        ["Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--gpu", "a100"],
        ["Qwen/Qwen3.5-122B-A10B", "--gpu", "h200", "--gpus", "2"],  # MTP, tensor parallel
        ["Qwen/Qwen3-8B"],  # no MTP head: no memory, blocked fixes
        ["unsloth/Qwen3.6-35B-A3B-GGUF", "Anbeeld/Qwen3.6-35B-A3B-DFlash-GGUF"],
        [str(gguf_target), str(fork)],  # a weights-only drafter: vocab_size null
        [str(target), str(draft)],
    ):
        validate(run("check", *args, "--offline", "--json"))
    for ref in ("Qwen/Qwen3.6-35B-A3B", "UnstableLlama/Qwen3.6-35B-A3B-exl3-4.00bpw"):
        validate(run("inspect", ref, "--offline", "--json"))
    for ref in (str(target), str(fork), str(gguf_target)):
        validate(run("inspect", ref, "--json"))
    validate(run("catalog", "--json"))


def test_convert_documents(tmp_path: Path) -> None:
    import torch
    from fixtures import build_eagle3, build_gguf_target, build_target
    from safetensors.torch import load_file

    source = build_target(tmp_path / "src", "qwen3", layers=1, hidden=64, intermediate=128)
    gguf = build_gguf_target(tmp_path / "m.gguf", "llama", layers=1, hidden=64, intermediate=128)
    for src, dst, to in (
        (source, tmp_path / "fp8", "fp8"),
        (source, tmp_path / "q8.gguf", "gguf:Q8_0"),
        (gguf, tmp_path / "bf16", "bf16"),
    ):
        validate(run("convert", str(src), str(dst), "--to", to, "--dry-run", "--json"))
        validate(run("convert", str(src), str(dst), "--to", to, "--json"))
    pickled = build_eagle3(tmp_path / "eagle3")
    torch.save(load_file(str(pickled / "model.safetensors")), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    validate(run("convert", str(pickled), str(tmp_path / "copy"), "--from-pickle", "--json"))
    validate(run("convert", str(pickled), str(tmp_path / "copy"), "--from-pickle", "--json"))  # exists: an error


def test_bench_document(tmp_path: Path) -> None:
    """In this process (a subprocess would spend most of the test importing torch), on one torch thread."""
    import torch
    from fixtures import build_draft_model, build_target
    from typer.testing import CliRunner

    from specpair.cli import app

    target, draft = build_target(tmp_path / "t", "qwen3", layers=2), build_draft_model(tmp_path / "d")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        done = CliRunner().invoke(
            app,
            [
                "bench",
                str(target),
                str(draft),
                "--depth",
                "0,9",
                "--users",
                "1,2",
                "--tokens",
                "16",
                "--device",
                "cpu",
                "--json",
                "--quiet",
                "--plot",
                str(tmp_path / "depth.png"),
            ],
        )
    finally:
        torch.set_num_threads(threads)
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    validate(report)
    assert report["identical"] is True and [r["users"] for r in report["users"]] == [1, 2]
    assert [r["depth"] for r in report["depth"]] == [0, 9] and report["depth"][1]["prompt_tokens"] == 9
    assert all(
        r["drafted"]["identical"] and r["drafted"]["first_difference"] is None
        for r in report["users"] + report["depth"]
    )
    assert report["draft"]["kind"] == "draft_model" and report["plot"] == str(tmp_path / "depth.png")


def test_error_documents(tmp_path: Path) -> None:
    for args in (
        ["check", "nobody/nothing", "--offline", "--json"],
        ["check", "--json"],
        ["inspect", str(tmp_path / "missing"), "--json"],
        ["verify", str(tmp_path), "--json"],
        ["catalog", "--no-such-option", "--json"],
        ["convert", str(tmp_path), str(tmp_path / "o"), "--to", "q9", "--json"],
        ["download", "not a repo", "--json"],
    ):
        done = subprocess.run([sys.executable, "-m", "specpair", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr == "", (args, done.stderr)
        document = json.loads(done.stdout)
        assert document["exit_code"] == 2
        validate(document)


def test_download_and_verify_documents(
    fake_hub: FakeHub,
    cache: Path,
    pair_dirs,
    specpair,  # noqa: F811
    tmp_path: Path,
) -> None:
    target = fake_hub.add("org/schema-target", files_of(pair_dirs[0]))
    draft = fake_hub.add("org/schema-draft", files_of(pair_dirs[1]))
    refs = [f"org/schema-target@{target.commit}", f"org/schema-draft@{draft.commit}"]
    for extra in (["--dry-run"], [], ["--local-dir", "pair"], ["--local-dir", "pair"]):  # the last: all present
        result = specpair("download", *refs, *extra, "--json")
        assert result.code == 0, result.err
        validate(result.json())
    for lock in ("specpair.lock", "pair"):
        result = specpair("verify", lock, "--json")
        assert result.code == 0, result.err
        validate(result.json())
    (tmp_path / "pair" / "schema-target" / "config.json").write_text("{}")
    result = specpair("verify", "pair", "--json")
    assert result.code == 1 and {f["status"] for r in result.json()["repos"] for f in r["files"]} == {
        "ok",
        "size_differs",
    }
    validate(result.json())


@pytest.mark.parametrize("stack", ["sglang", "vllm", "llama.cpp", "exllamav3", "tensorfold", "specpair"])
def test_values_are_json_and_carry_the_numbers_of_each_message(stack: str) -> None:
    """Each reason's `values` are the numbers and names its message was rendered from."""
    report = run(
        "check",
        "Qwen/Qwen3.6-35B-A3B",
        "z-lab/Qwen3.5-122B-A10B-DFlash",
        "--offline",
        "--json",
        "--gpu",
        "rtx4090",
        "--stack",
        stack,
    )
    for reason in report["verdicts"][stack]["reasons"]:
        for value in reason["values"].values():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert (
                    f"{value}" in reason["message"]
                    or f"{value:.1f}" in reason["message"]
                    or f"{value:.0%}" in reason["message"]
                ), (reason["rule"], value)

"""`specpair check` end to end: realistic pairs from the catalog and from real configs, JSON schema, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REAL_CONFIGS = ROOT.parent / "shared" / "real-configs"
STACKS = ["specpair", "sglang", "vllm", "llama.cpp", "exllamav3", "tensorfold"]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specpair", *args], capture_output=True, text=True, env=env, timeout=120)


def check_json(*args: str) -> tuple[dict, int]:
    done = run("check", *args, "--offline", "--json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout), done.returncode


def errors(report: dict, stack: str) -> set[str]:
    return {r["rule"] for r in report["verdicts"][stack]["reasons"] if r["severity"] == "error"}


def test_default_catalog_pair_runs_on_sglang_and_vllm():
    report, code = check_json("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash")
    assert code == 0 and report["exit_code"] == 0
    assert report["schema"] == "specpair.check/1" and report["drafter_kind"] == "dflash"
    assert list(report["verdicts"]) == STACKS
    for stack in ("sglang", "vllm"):
        verdict = report["verdicts"][stack]
        assert verdict["status"] == "warn" and verdict["fix"] is None
        assert set(verdict) == {"status", "reasons", "launch", "fix"}
        assert all(set(r) == {"rule", "severity", "message"} for r in verdict["reasons"])
    assert "--speculative-num-draft-tokens 16" in report["verdicts"]["sglang"]["launch"]
    assert '"num_speculative_tokens":15' in report["verdicts"]["vllm"]["launch"]
    assert report["verdicts"]["llama.cpp"]["status"] == "fail"
    assert "--to gguf" in report["verdicts"]["llama.cpp"]["fix"]
    assert report["draft"]["source"] == "catalog" and report["draft"]["revision"] == "c69b185"
    assert any("built-in catalog at revision c69b185" in n for n in report["draft"]["notes"])


def test_taps_past_a_40_layer_target_fail_everywhere():
    report, code = check_json("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.5-122B-A10B-DFlash")
    assert code == 1 and report["exit_code"] == 1
    for stack in STACKS:
        assert report["verdicts"][stack]["status"] == "fail"
        assert {"taps.range", "hidden.match", "base.lineage"} <= errors(report, stack), stack
    message = next(r["message"] for r in report["verdicts"]["vllm"]["reasons"] if r["rule"] == "taps.range")
    assert "45" in message and "40 decoder layers" in message


def test_qwen3_vocabulary_drafter_fails_on_a_qwen35_target():
    report, code = check_json("Qwen/Qwen3.5-27B", "chutesai/Qwen3-32B-FP8-DFLASH")
    assert code == 1
    for stack in STACKS:
        assert {"vocab.rows", "base.lineage"} <= errors(report, stack), stack
    message = next(r["message"] for r in report["verdicts"]["sglang"]["reasons"] if r["rule"] == "vocab.rows")
    assert "151936" in message and "248320" in message


def test_legacy_revision_is_selected_by_commit_prefix():
    report, _ = check_json("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash@42d3b34")
    assert report["draft"]["revision"] == "42d3b34"
    assert report["draft"]["drafter"]["mask_token_id"] == 248070
    pinned = [r["message"] for r in report["verdicts"]["vllm"]["reasons"] if r["rule"] == "revision.pinned"]
    assert pinned and not any(m.startswith("z-lab/") for m in pinned)  # only the unpinned target is flagged


def test_mtp_of_the_target_itself():
    report, code = check_json("Qwen/Qwen3.5-122B-A10B", "--stack", "vllm", "--stack", "sglang")
    assert code == 0 and report["drafter_kind"] == "mtp" and list(report["verdicts"]) == ["vllm", "sglang"]
    assert '"method":"mtp"' in report["verdicts"]["vllm"]["launch"]


def test_memory_fit_on_a_named_gpu():
    report, _ = check_json("Qwen/Qwen3.5-122B-A10B", "z-lab/Qwen3.5-122B-A10B-DFlash", "--gpu", "h200", "--stack", "vllm")
    fit = [r["message"] for r in report["verdicts"]["vllm"]["reasons"] if r["rule"] == "memory.fit"]
    assert fit and "tensor parallelism 2" in fit[0]
    report, _ = check_json("Qwen/Qwen3.5-122B-A10B", "z-lab/Qwen3.5-122B-A10B-DFlash", "--gpu", "h200", "--gpus", "2",
                           "--stack", "vllm")
    assert "memory.fit" not in {r["rule"] for r in report["verdicts"]["vllm"]["reasons"]}
    assert "--tensor-parallel-size 2" in report["verdicts"]["vllm"]["launch"]


def _padded_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Qwen3-8B's real config as target; a DFlash drafter whose vocabulary has 128 more padding rows."""
    target = tmp_path / "Qwen3-8B"
    target.mkdir()
    config = json.loads((REAL_CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    (target / "config.json").write_text(json.dumps(config))
    vocab = {f"t{i}": i for i in range(151643)}
    added = [{"id": 151643 + i, "content": f"<|x{i}|>", "special": True} for i in range(26)]
    (target / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": []},
                                                        "added_tokens": added}))
    draft = tmp_path / "Qwen3-8B-DFlash"
    draft.mkdir()
    taps = [1, 9, 17, 25, 33]
    draft_config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 4096,
                    "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                    "intermediate_size": 12288, "vocab_size": 152064, "max_position_embeddings": 40960,
                    "num_target_layers": 36, "layer_types": ["full_attention"],
                    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                    "dflash_config": {"target_layer_ids": taps, "mask_token_id": 151669, "block_size": 16}}
    (draft / "config.json").write_text(json.dumps(draft_config))
    _sparse_safetensors(draft / "model.safetensors", {"fc.weight": [4096, len(taps) * 4096], "norm.weight": [4096],
                                                       "hidden_norm.weight": [4096]})
    return target, draft


def _sparse_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)  # sparse data section


def test_padded_vocabulary_drafter_warns_with_the_numbers(tmp_path: Path):
    target, draft = _padded_pair(tmp_path)
    report, code = check_json(str(target), str(draft), "--stack", "sglang", "--stack", "tensorfold")
    assert code == 0
    sglang = report["verdicts"]["sglang"]
    assert sglang["status"] == "warn" and not errors(report, "sglang")
    padding = [r["message"] for r in sglang["reasons"] if r["rule"] == "vocab.padding"]
    assert padding and "152064" in padding[0] and "151936" in padding[0] and "151669" in padding[0] and "(128)" in padding[0]
    assert "vocab.rows_equal" in errors(report, "tensorfold")


def test_human_output_lists_verdicts_reasons_and_launch(tmp_path: Path):
    done = run("check", "Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--offline")
    assert done.returncode == 0
    for text in ("sglang", "warn", "Reasons", "Launch", "Fix", "revision.pinned", "python -m sglang.launch_server"):
        assert text in done.stdout, text


def test_quiet_prints_nothing_and_keeps_the_exit_code():
    done = run("check", "Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.5-122B-A10B-DFlash", "--offline", "--quiet")
    assert done.returncode == 1 and done.stdout == ""


def test_bad_arguments_exit_2_with_one_line():
    for args in (["check", "Qwen/Qwen3-8B", "--stack", "tgi", "--offline"],
                 ["check", "Qwen/Qwen3-8B", "--gpu", "tpu-v5", "--offline"],
                 ["check", "nobody/nothing-here", "--offline"],
                 ["check", "z-lab/Qwen3.6-35B-A3B-DFlash", "Qwen/Qwen3.6-35B-A3B", "--offline"]):
        done = run(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        assert "Traceback" not in done.stderr


def test_version_and_module_entry_point():
    done = run("--version")
    assert done.returncode == 0 and done.stdout.startswith("specpair ")


def test_llama_cpp_pair_of_gguf_files_gets_a_launch_line(tmp_path: Path):
    from fixtures import build_gguf_dflash, build_gguf_target

    target = build_gguf_target(tmp_path / "target.gguf", "qwen35moe", layers=8, nextn=1)
    draft = build_gguf_dflash(tmp_path / "draft.gguf", hidden=64)
    report, code = check_json(str(target), str(draft), "--stack", "llama.cpp")
    verdict = report["verdicts"]["llama.cpp"]
    assert code == 0 and verdict["status"] != "fail", verdict["reasons"]
    assert f"-m {target}" in verdict["launch"] and f"-md {draft}" in verdict["launch"]
    assert "--spec-type draft-dflash" in verdict["launch"]

"""`specpair check` end to end: realistic pairs from the catalog and from real configs, JSON schema, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REAL_CONFIGS = ROOT / "catalog" / "sources" / "real-configs"
STACKS = ["specpair", "sglang", "vllm", "llama.cpp", "exllamav3", "tensorfold"]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specpair", *args], capture_output=True, text=True, env=env, timeout=120
    )


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
        assert verdict["status"] == "warn" and verdict["fix"] is None and verdict["blocked_by"] == []
        assert set(verdict) == {"status", "reasons", "launch", "fix", "blocked_by", "memory"}
        assert all(set(r) == {"rule", "severity", "message", "values"} for r in verdict["reasons"])
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
    assert pinned[0].startswith("Qwen/Qwen3.6-35B-A3B is not pinned to a commit")
    # an abbreviation selects the entry but is no pin: the Hub can grow a second commit with the same prefix
    assert pinned[1].startswith("z-lab/Qwen3.6-35B-A3B-DFlash@42d3b34 names the abbreviated commit 42d3b34")


def test_mtp_of_the_target_itself():
    report, code = check_json("Qwen/Qwen3.5-122B-A10B", "--stack", "vllm", "--stack", "sglang")
    assert code == 0 and report["drafter_kind"] == "mtp" and list(report["verdicts"]) == ["vllm", "sglang"]
    assert '"method":"mtp"' in report["verdicts"]["vllm"]["launch"]


def test_memory_fit_on_a_named_gpu():
    report, _ = check_json(
        "Qwen/Qwen3.5-122B-A10B", "z-lab/Qwen3.5-122B-A10B-DFlash", "--gpu", "h200", "--stack", "vllm"
    )
    fit = [r["message"] for r in report["verdicts"]["vllm"]["reasons"] if r["rule"] == "memory.fit"]
    assert fit and "tensor parallelism 2" in fit[0]
    report, _ = check_json(
        "Qwen/Qwen3.5-122B-A10B", "z-lab/Qwen3.5-122B-A10B-DFlash", "--gpu", "h200", "--gpus", "2", "--stack", "vllm"
    )
    assert "memory.fit" not in {r["rule"] for r in report["verdicts"]["vllm"]["reasons"]}
    assert "--tensor-parallel-size 2" in report["verdicts"]["vllm"]["launch"]


def test_moe_pair_too_big_for_the_gpu_fits_llama_cpp_with_experts_in_cpu_memory():
    """UD-Q4_K_M Qwen3.6-35B-A3B (22.0 GB) with its DFlash GGUF needs 25.4 GB; an RTX 4090 has 21.6 usable: the
    routed experts of 8 of 40 layers (19.5 GB / 40 each) in CPU memory bring it to 21.5, and the launch says so."""
    report, code = check_json(
        "unsloth/Qwen3.6-35B-A3B-GGUF",
        "williamliao/Qwen3.6-35B-A3B-DFlash-GGUF",
        "--gpu",
        "rtx4090",
        "--stack",
        "llama.cpp",
        "--stack",
        "vllm",
    )
    verdict = report["verdicts"]["llama.cpp"]
    assert code == 0 and verdict["status"] == "warn" and "memory.fit" not in errors(report, "llama.cpp")
    memory = verdict["memory"]
    assert memory["fits"] is False and memory["per_gpu"] == 25.4 and memory["usable_per_gpu"] == 21.6
    offload = memory["experts_on_cpu"]
    assert offload == {"flag": "--n-cpu-moe", "layers": 8, "of_layers": 40, "cpu": 3.9, "per_gpu": 21.5}
    assert verdict["launch"].endswith(" --n-cpu-moe 8")
    (message,) = [r["message"] for r in verdict["reasons"] if r["rule"] == "memory.offload"]
    assert "first 8 of its 40 layers" in message and "host RAM 3.9 GB" in message and "--gpus 2" in message
    # a stack that cannot keep experts in CPU memory still reports the misfit
    assert report["verdicts"]["vllm"]["memory"]["experts_on_cpu"] is None


def _padded_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Qwen3-8B's real config as target; a DFlash drafter whose vocabulary has 128 more padding rows."""
    target = tmp_path / "Qwen3-8B"
    target.mkdir()
    config = json.loads((REAL_CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    (target / "config.json").write_text(json.dumps(config))
    vocab = {f"t{i}": i for i in range(151643)}
    added = [{"id": 151643 + i, "content": f"<|x{i}|>", "special": True} for i in range(26)]
    (target / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": added})
    )
    draft = tmp_path / "Qwen3-8B-DFlash"
    draft.mkdir()
    taps = [1, 9, 17, 25, 33]
    draft_config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 4096,
        "num_hidden_layers": 1,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 12288,
        "vocab_size": 152064,
        "max_position_embeddings": 40960,
        "num_target_layers": 36,
        "layer_types": ["full_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "dflash_config": {"target_layer_ids": taps, "mask_token_id": 151669, "block_size": 16},
    }
    (draft / "config.json").write_text(json.dumps(draft_config))
    _sparse_safetensors(
        draft / "model.safetensors",
        {"fc.weight": [4096, len(taps) * 4096], "norm.weight": [4096], "hidden_norm.weight": [4096]},
    )
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
    assert (
        padding
        and "152064" in padding[0]
        and "151936" in padding[0]
        and "151669" in padding[0]
        and "(128)" in padding[0]
    )
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
    for args in (
        ["check", "Qwen/Qwen3-8B", "--stack", "tgi", "--offline"],
        ["check", "Qwen/Qwen3-8B", "--gpu", "tpu-v5", "--offline"],
        ["check", "nobody/nothing-here", "--offline"],
        ["check", "z-lab/Qwen3.6-35B-A3B-DFlash", "Qwen/Qwen3.6-35B-A3B", "--offline"],
    ):
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


def _reason(report: dict, stack: str, rule: str) -> dict:
    (reason,) = [r for r in report["verdicts"][stack]["reasons"] if r["rule"] == rule]
    return reason


def test_a_deepspec_dspark_drafter_is_named_and_its_layout_warned(tmp_path: Path):
    """DeepSeek's dspark_qwen3_8b_block7 as DeepSpec writes its config (deepspec/modeling/dspark/qwen3/config.py:
    Qwen3DSparkModel, flat keys, markov_rank) beside Qwen3-8B: no DFlash path loads the class, each stack's error
    names its DSpark path, and the warning says the block's readout is unknown (llm-scaler#620)."""
    target, _ = _padded_pair(tmp_path)
    draft = tmp_path / "dspark_qwen3_8b_block7"
    draft.mkdir()
    config = json.loads((REAL_CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    config.update(
        architectures=["Qwen3DSparkModel"],
        num_target_layers=36,
        num_hidden_layers=5,
        block_size=7,
        tie_word_embeddings=False,
        layer_types=["full_attention"] * 5,
        mask_token_id=151669,
        target_layer_ids=[1, 9, 17, 25, 33],
        num_anchors=512,
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        markov_rank=256,
        markov_head_type="vanilla",
    )
    (draft / "config.json").write_text(json.dumps(config))
    _sparse_safetensors(draft / "model.safetensors", {"fc.weight": [4096, 5 * 4096], "hidden_norm.weight": [4096]})
    report, code = check_json(str(target), str(draft), "--stack", "vllm", "--stack", "sglang")
    assert code == 1 and report["draft"]["drafter"]["dspark_marker"] == "architectures Qwen3DSparkModel"
    for stack, path in (
        ("vllm", 'method "dspark" in --speculative-config'),
        ("sglang", "--speculative-algorithm DSPARK"),
    ):
        assert errors(report, stack) == {"drafter.arch"}, report["verdicts"][stack]["reasons"]
        arch = _reason(report, stack, "drafter.arch")["message"]
        assert f"Qwen3DSparkModel names a DSpark drafter, which {stack} serves with {path}, not as DFlash" in arch
        layout = _reason(report, stack, "drafter.anchor_layout")
        assert layout["severity"] == "warn" and f"if true, serve it with {path}" in layout["message"]


def test_a_dspark_gguf_drafter_on_llama_cpp_is_pointed_at_draft_dspark(tmp_path: Path):
    """A dflash-arch GGUF with DSpark's Markov head (markov_w1, llama.cpp#25173): llama.cpp's draft-dflash drafts from
    the rows after the anchor, its draft-dspark reads dflash.sample_from_anchor (default true). Without the key the
    layout is unknown; with it (the string "true", as llama.cpp reads it too) the launch line's draft-dflash ignores it."""
    from fixtures import build_gguf_dflash, build_gguf_target

    target = build_gguf_target(tmp_path / "target.gguf", "qwen35moe", layers=8, nextn=1)
    for anchor, said in (
        (None, "shows DSpark's lineage (tensor markov_w1.weight) but does not declare"),
        ("true", "sets dflash.sample_from_anchor (DSpark's readout"),
    ):
        draft = build_gguf_dflash(
            tmp_path / f"draft-{anchor}.gguf", hidden=64, markov_rank=4, sample_from_anchor=anchor
        )
        report, code = check_json(str(target), str(draft), "--stack", "llama.cpp")
        verdict = report["verdicts"]["llama.cpp"]
        assert code == 0 and verdict["status"] == "warn" and "--spec-type draft-dflash" in verdict["launch"]
        message = _reason(report, "llama.cpp", "drafter.anchor_layout")["message"]
        assert said in message and "serve it with --spec-type draft-dspark, which reads the key" in message, message


# --- what a new user hits (issue 12) ------------------------------------------------------------------


def test_stack_names_are_case_insensitive():
    report, _ = check_json(
        "Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--stack", "SGLang", "--stack", "vLLM"
    )
    assert list(report["verdicts"]) == ["sglang", "vllm"]


def test_bad_input_under_json_is_a_json_document_on_stdout():
    for args in (
        ["check", "nobody/nothing-here", "--offline", "--json"],
        ["check", "Qwen/Qwen3-8B", "--stack", "tgi", "--offline", "--json"],
        ["check", "--json"],  # a usage error: the missing TARGET
        ["verify", "/no/such/lock", "--json"],
    ):
        done = run(*args)
        assert done.returncode == 2 and done.stderr == "", (args, done.stderr)
        document = json.loads(done.stdout)
        assert document["schema"] == "specpair.error/1" and document["exit_code"] == 2
        assert set(document["error"]) == {"file", "problem"} and document["error"]["problem"], document
    nobody = json.loads(run("check", "nobody/nothing-here", "--offline", "--json").stdout)["error"]
    assert nobody["file"] == "nobody/nothing-here" and "not reachable offline" in nobody["problem"]


def _closed_stdout(*args: str) -> subprocess.CompletedProcess:
    """specpair with a stdout whose reader is gone before it starts, as after `| head -1` returned."""
    import os

    read, write = os.pipe()
    os.close(read)  # every write to `write` now fails with EPIPE
    try:
        return subprocess.run(
            [sys.executable, "-m", "specpair", *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)


def test_a_closed_stdout_is_not_a_failure_of_the_work(tmp_path: Path):
    for args, code in (
        (["check", "Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--offline"], 0),
        (["check", "Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.5-122B-A10B-DFlash", "--offline", "--json"], 1),
        (["catalog"], 0),
    ):
        done = _closed_stdout(*args)
        assert (done.returncode, done.stderr) == (code, ""), (args, done.stderr)
    from fixtures import build_target

    source = build_target(tmp_path / "src", "qwen3", layers=1, hidden=64, intermediate=128)
    done = _closed_stdout("convert", str(source), str(tmp_path / "out"), "--to", "bf16", "--device", "cpu")
    assert done.returncode == 0 and (tmp_path / "out" / "config.json").exists()
    assert all(line.startswith("convert: ") for line in done.stderr.splitlines()), done.stderr  # progress only


def test_piped_output_keeps_every_command_on_one_line():
    args = ["Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--offline", "--gpu", "h200"]
    report, _ = check_json(*args)
    done = run("check", *args)  # stdout is a pipe: no terminal width to wrap to
    lines = done.stdout.splitlines()
    for stack, verdict in report["verdicts"].items():
        for command in filter(None, (verdict["launch"], verdict["fix"])):
            assert f"  {stack}: {command}" in lines, (stack, command)
    for reason in report["verdicts"]["sglang"]["reasons"]:
        if reason["severity"] != "info":
            assert any(line.endswith(reason["message"]) for line in lines), reason["message"]


def test_catalog_never_cuts_or_folds_repo_ids_even_narrow():
    import os

    ids = [e["ref"] for e in json.loads(run("catalog", "--json").stdout)["entries"]]
    for columns in ("60", "120"):
        table = run("catalog", env={**os.environ, "COLUMNS": columns}).stdout
        assert all(f" {repo} " in table for repo in ids), columns
        assert "…" not in table


def test_human_output_shows_errors_and_warnings_and_counts_the_rest():
    args = ["check", "Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--offline"]
    report, _ = check_json(*args[1:])
    infos = {r["message"] for v in report["verdicts"].values() for r in v["reasons"] if r["severity"] == "info"}
    shown, verbose = run(*args).stdout, run(*args, "--verbose").stdout
    assert infos and not any(m in shown for m in infos) and all(m in verbose for m in infos)
    assert f"and {len(infos)} info note(s): --verbose shows them" in shown


def test_target_without_an_mtp_head_is_told_so_with_no_conversion_fix():
    report, code = check_json("Qwen/Qwen3-8B")
    assert code == 1 and report["drafter_kind"] == "mtp"
    for stack, verdict in report["verdicts"].items():
        assert verdict["fix"] is None and "mtp.present" in verdict["blocked_by"], stack
        assert verdict["memory"] is None and not any(r["rule"].startswith("memory.") for r in verdict["reasons"])
    human = run("check", "Qwen/Qwen3-8B", "--offline").stdout
    assert "draft   none: Qwen/Qwen3-8B has no MTP head (give a DRAFT)" in human
    assert "0 layer(s)" not in human and "draft 0.0" not in human and "specpair convert" not in human
    verbose = run("check", "Qwen/Qwen3-8B", "--offline", "--verbose").stdout
    assert "(MTP head)" not in verbose and "specpair run" not in verbose  # nothing for the runtime to verify


def test_fixes_are_offered_only_when_they_clear_every_error_of_the_stack():
    report, _ = check_json("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--gpus", "2")
    tensorfold, exllamav3 = report["verdicts"]["tensorfold"], report["verdicts"]["exllamav3"]
    assert tensorfold["fix"] is None and "format.target" in errors(report, "tensorfold")
    assert {"base.num_target_layers_strict", "drafter.tensor_parallel"} <= set(tensorfold["blocked_by"])
    assert exllamav3["fix"] is None and exllamav3["blocked_by"] == ["drafter.tensor_parallel"]
    llama = report["verdicts"]["llama.cpp"]  # only format errors, which conversion clears
    assert llama["blocked_by"] == [] and llama["fix"].count("specpair convert") == 2


def test_memory_numbers_and_verdict_agree_with_the_same_rounding():
    """The A100 80GB (72.0 GB usable) case: what the message shows decides, sum and comparison on the shown numbers."""
    import re

    report, _ = check_json("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--gpu", "a100", "--stack", "vllm")
    verdict = report["verdicts"]["vllm"]
    memory = verdict["memory"]
    (fit,) = [r for r in verdict["reasons"] if r["rule"] == "memory.fit"]
    shown = re.search(
        r"needs ([\d.]+) GB on one GPU \((.*) = ([\d.]+) GB, plus ([\d.]+) GB runtime overhead", fit["message"]
    )
    usable = re.search(r"have ([\d.]+) GB usable each, so it does not fit", fit["message"])
    parts = [float(x) for x in re.findall(r"([\d.]+)(?: \(|$| )", shown[2].replace(" + ", " "))]
    assert round(sum(parts), 1) == float(shown[3]) == memory["total"]
    assert float(shown[1]) == round(float(shown[3]) + float(shown[4]), 1) == memory["per_gpu"]
    assert float(shown[1]) > float(usable[1]) == memory["usable_per_gpu"] == 72.0 and memory["fits"] is False
    assert memory["smallest_fitting_tensor_parallel"] == 2 and memory["unit"] == "GB"
    roomy, _ = check_json("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--gpu", "h200", "--stack", "vllm")
    assert roomy["verdicts"]["vllm"]["memory"]["fits"] is True


def test_exllamav3_launch_is_a_command_to_paste(tmp_path: Path):
    import shlex

    target, draft = _padded_pair(tmp_path)
    report, _ = check_json(str(target), str(draft), "--stack", "exllamav3")
    words = shlex.split(report["verdicts"]["exllamav3"]["launch"])
    assert words[:2] == ["python", "-c"] and len(words) == 3
    compile(words[2], "<launch>", "exec")  # Python that parses
    assert f'"-m", "{target}"' in words[2] and f'"-dm", "{draft}"' in words[2] and '"-ndt", "15"' in words[2]
    hub, _ = check_json("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--stack", "exllamav3")
    steps = hub["verdicts"]["exllamav3"]["launch"].split(" && ")
    assert steps[0] == (
        "specpair download Qwen/Qwen3.6-35B-A3B z-lab/Qwen3.6-35B-A3B-DFlash --local-dir models --no-require-sha"
    )
    assert '"-m", "models/Qwen3.6-35B-A3B"' in steps[1] and '"-dm", "models/Qwen3.6-35B-A3B-DFlash"' in steps[1]


def test_weights_only_fork_gguf_drafter_is_judged_and_its_fix_runs(tmp_path: Path):
    """A `dflash-draft` GGUF with neither tokenizer nor token_embd: a normal drafter with its target's vocabulary;
    llama.cpp fails on the fork arch and on the missing vocabulary (its mask token is read from it), and the fix it
    names converts it to upstream `dflash` with the target's tokenizer, which passes."""
    import shlex

    from fixtures import build_gguf_dflash, build_gguf_target

    target = build_gguf_target(tmp_path / "target.gguf", "qwen35moe", layers=8, nextn=1)
    draft = build_gguf_dflash(tmp_path / "draft.gguf", "dflash-draft", tokenizer=False)
    report, code = check_json(str(target), str(draft), "--stack", "llama.cpp")
    verdict = report["verdicts"]["llama.cpp"]
    assert code == 1 and report["draft"]["shapes"]["vocab_size"] is None
    assert errors(report, "llama.cpp") == {"drafter.arch", "gguf.draft_tokenizer"} and verdict["blocked_by"] == []
    assert verdict["fix"].startswith(f"specpair convert {draft} ") and f"--target {target}" in verdict["fix"]
    converted = subprocess.run(
        [sys.executable, "-m", *shlex.split(verdict["fix"]), "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert converted.returncode == 0, converted.stderr
    output = tmp_path / shlex.split(verdict["fix"])[3]
    after, code = check_json(str(target), str(output), "--stack", "llama.cpp")
    assert code == 0 and not errors(after, "llama.cpp") and after["draft"]["architecture"] == "dflash"
    assert after["draft"]["tokenizer"]["length"] > 0  # the target's tokenizer went into the drafter's GGUF


def test_a_command_is_built_alone_and_the_app_keeps_every_command(monkeypatch, capsys):
    """main() hands typer only the command it runs (building every command's options costs ~20 ms a run)."""
    from specpair import cli

    every = list(cli.app.registered_commands)
    for argv in (["check", "--help"], ["--help"]):
        monkeypatch.setattr(sys, "argv", ["specpair", *argv])
        try:
            cli.main()
        except SystemExit as done:
            assert done.code == 0
        assert cli.app.registered_commands == every
    shown = capsys.readouterr().out
    assert "specpair check [OPTIONS] {target} [draft]" in shown
    assert all(f"  {c.callback.__name__} " in shown for c in every)  # the group's help still lists them all


def test_a_catalog_answer_says_when_the_hub_was_unreachable(tmp_path: Path):
    """Without --offline and with no network, `check` falls back to the catalog: the human output says why."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed}", HF_HOME=str(tmp_path / "hf"))
    done = run("check", "Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", env=env)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if "was unreachable" in line]
    assert [line.split(": the Hub at ")[0] for line in said] == [
        "offline Qwen/Qwen3.6-35B-A3B",
        "offline z-lab/Qwen3.6-35B-A3B-DFlash",
    ]
    assert all(f"http://127.0.0.1:{closed} was unreachable (" in line for line in said)
    assert all(line.endswith("; read from the built-in catalog") for line in said)
    offline = run("check", "Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "--offline", env=env)
    assert offline.returncode == 0 and "unreachable" not in offline.stdout  # asked for: nothing to explain

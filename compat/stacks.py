"""What each serving stack loads, as data, and the launch command it needs for a pair.

Versions these facts describe: SGLang 0.5.23, vLLM 0.33.0, llama.cpp mid/late 2026 (upstream `dflash`
arch), ExLlamaV3 1.6.5, TensorFold 0.6.x/1.x (shared/spec/dflash.md §7, tensorfold.md).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from specpair import runtime
from specpair.checkpoint import Checkpoint
from specpair.checkpoint.families import families_served_by
from specpair.compat.pair import Pair
from specpair.formats.layouts import layout_of

FLOAT_LAYOUTS = frozenset({"bf16", "f16", "f32", "f64", "int"})
STACK_NAMES = ("specpair", "sglang", "vllm", "llama.cpp", "exllamav3", "tensorfold")


@dataclass(frozen=True)
class Stack:
    name: str
    kinds: tuple[str, ...]  # drafter kinds it can serve
    archs: dict[str, tuple[str, ...]]  # drafter kind -> architecture strings it registers
    file_format: str  # "safetensors" (HF directory) or "gguf"
    # Layout labels and kinds it loads for a target / a separate drafter. Float labels listed: it takes those
    # unquantized weights; none listed: it needs quantized weight matrices (float norms are always fine).
    target_layouts: tuple[str, ...]
    draft_layouts: tuple[str, ...]
    families: tuple[str, ...]
    tensor_parallel_drafts: tuple[str, ...]  # drafter kinds that may run with tensor parallelism
    launch: Callable[[Pair], str]

    @staticmethod
    def unloadable(layouts: set[str], accepted: tuple[str, ...]) -> set[str]:
        """The layouts in `layouts` that `accepted` (labels and kinds, formats/layouts.py) does not cover."""
        return {layout for layout in layouts if not layout_of(layout).matches(accepted)}


def _model_arg(checkpoint_ref: str, revision: str | None) -> tuple[str, str | None]:
    """(repo, revision) as a launch line names them: the revision is a full 40-hex commit (the one the reference
    names, else the one it was resolved to or the catalog records) or none, since a branch, tag or abbreviated
    commit is not a pin."""
    path, _, asked = checkpoint_ref.partition("@")
    return path, next((r for r in (asked, revision) if r and COMMIT.match(r.lower())), None)


def _ref_arg(c: Checkpoint) -> str:
    """A checkpoint as a specpair command names it: a local path as typed, a Hub repo @ a full commit or bare."""
    if c.source == "local":
        return c.ref
    path, commit = _model_arg(c.ref, c.revision)
    return f"{path}@{commit}" if commit else path


def _sglang(p: Pair) -> str:
    target, target_rev = _model_arg(p.target.ref, p.target.revision)
    args = ["python", "-m", "sglang.launch_server", "--model-path", target]
    if target_rev and p.target.source != "local":
        args += ["--revision", target_rev]
    algorithm = {
        "dflash": "DFLASH",
        "dflash2": "DFLASH",
        "mtp": "NEXTN",
        "eagle3": "EAGLE3",
        "draft_model": "STANDALONE",
    }[p.kind]
    args += ["--speculative-algorithm", algorithm]
    if p.kind != "mtp":
        draft, draft_rev = _model_arg(p.draft.ref, p.draft.revision)
        args += ["--speculative-draft-model-path", draft]
        if draft_rev and p.draft.source != "local":
            args += ["--speculative-draft-model-revision", draft_rev]
    if p.kind in ("dflash", "dflash2"):
        args += ["--speculative-num-draft-tokens", str(p.block_size)]
    else:
        steps = p.block_size - 1
        args += [
            "--speculative-num-steps",
            str(steps),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(steps + 1),
        ]
    if p.kind != "mtp" and p.target.quantization and not p.draft.quantization:
        args += ["--speculative-draft-model-quantization", "unquant"]
    if p.target.is_hybrid:
        args += ["--mamba-scheduler-strategy", "extra_buffer"]
    if p.deployment.gpus > 1:
        args += ["--tp", str(p.deployment.gpus)]
    args += ["--context-length", str(p.context)]
    return shlex.join(args)


def _vllm(p: Pair) -> str:
    target, target_rev = _model_arg(p.target.ref, p.target.revision)
    args = ["vllm", "serve", target]
    if target_rev and p.target.source != "local":
        args += ["--revision", target_rev]
    method = {"dflash": "dflash", "dflash2": "dflash", "mtp": "mtp", "eagle3": "eagle3", "draft_model": "draft_model"}[
        p.kind
    ]
    spec: dict[str, object] = {"method": method}
    if p.kind != "mtp":
        draft, draft_rev = _model_arg(p.draft.ref, p.draft.revision)
        spec["model"] = draft
        if draft_rev and p.draft.source != "local":
            spec["revision"] = draft_rev
    spec["num_speculative_tokens"] = p.block_size - 1
    args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    if p.deployment.gpus > 1:
        args += ["--tensor-parallel-size", str(p.deployment.gpus)]
    # A DFlash decode step runs max_num_seqs x block tokens in one pass (vllm#53970): size the budget for it.
    max_seqs = p.deployment.concurrency if p.deployment.concurrency > 1 else 64
    args += [
        "--max-model-len",
        str(p.context),
        "--max-num-seqs",
        str(max_seqs),
        "--max-num-batched-tokens",
        str(max(8192, max_seqs * p.block_size)),
    ]
    return shlex.join(args)


def _llama_cpp(p: Pair) -> str:
    args = ["llama-server", "-m", _gguf_path(p.target), "-c", str(p.context), "-ngl", "99"]
    if p.kind != "mtp":
        args += ["-md", _gguf_path(p.draft), "-ngld", "99"]
    if p.kind == "draft_model":
        return shlex.join(args + ["--draft-max", str(p.block_size - 1)])
    if p.kind in ("dflash", "dflash2", "mtp"):
        args += ["--spec-type", "draft-mtp" if p.kind == "mtp" else "draft-dflash"]
    return shlex.join(args + ["--spec-draft-n-max", str(p.block_size - 1)])


def _gguf_path(c: Checkpoint) -> str:
    """The GGUF file llama.cpp opens: the local path, or the repo's file once downloaded."""
    if c.ref.endswith(".gguf"):
        return c.ref
    name = next((f.path for f in c.files if f.path.endswith(".gguf")), "model.gguf")
    return os.path.join(c.ref, name) if c.source == "local" else name


def _exllamav3(p: Pair) -> str:
    """ExLlamaV3 has no server of its own: its model_init arguments (-m, -dm or -mtp, -cs, -ndt; the draft cache
    gets the target cache's size) and Generator, in a `python -c` over local directories. Hub checkpoints are
    downloaded first, each into its own folder."""
    checkpoints = [p.target] if p.kind == "mtp" else [p.target, p.draft]
    steps, paths = [], []
    remote = [c for c in checkpoints if c.source != "local"]
    if remote:
        refs = [_ref_arg(c) for c in remote]
        pinned = all("@" in ref for ref in refs)
        command = [
            "specpair",
            "download",
            *refs,
            "--local-dir",
            EXLLAMAV3_DIR if len(remote) == 2 else f"{EXLLAMAV3_DIR}/{_repo_name(remote[0].ref)}",
        ]
        steps.append(shlex.join(command + ([] if pinned else ["--no-require-sha"])))
    for c in checkpoints:
        paths.append(c.ref if c.source == "local" else f"{EXLLAMAV3_DIR}/{_repo_name(c.ref)}")
    args = ["-m", paths[0], "-cs", str(p.context), "-ndt", str(p.block_size - 1)]
    args += ["-mtp"] if p.kind == "mtp" else ["-dm", paths[1]]
    code = "; ".join(
        [
            "import argparse",
            "from exllamav3 import Generator, model_init",
            "parser = argparse.ArgumentParser()",
            "model_init.add_args(parser, cache=True, add_draft_model_args=True)",
            f"args = parser.parse_args({json.dumps(args)})",
            "model, config, cache, tokenizer, draft_model, draft_config, draft_cache = model_init.init(args)",
            "generator = Generator(model=model, cache=cache, tokenizer=tokenizer, draft_model=draft_model, "
            "draft_cache=draft_cache, num_draft_tokens=args.num_draft_tokens)",
            'print(generator.generate(prompt="Hello", max_new_tokens=128))',
        ]
    )
    steps.append(shlex.join(["python", "-c", code]))
    return " && ".join(steps)


EXLLAMAV3_DIR = "models"
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _repo_name(ref: str) -> str:
    return ref.partition("@")[0].rsplit("/", 1)[-1]


def _tensorfold(p: Pair) -> str:
    args = ["tensorfold", "serve", p.target.ref.partition("@")[0] if p.target.source != "local" else p.target.ref]
    if p.kind == "mtp":
        args += ["--mtp-drafts", str(min(p.block_size - 1, 3))]
    else:
        args += [
            "--drafter",
            p.draft.ref.partition("@")[0] if p.draft.source != "local" else p.draft.ref,
            "--drafter-bits",
            "0",
        ]
    args += ["--context", str(p.context)]
    if p.deployment.gpus > 1 and p.kind == "dflash2":
        args += ["--tp", "2"]
    return shlex.join(args)


def _specpair(p: Pair) -> str:
    args = ["specpair", "run", _ref_arg(p.target)]
    args += ["--mtp"] if p.kind == "mtp" else [_ref_arg(p.draft)]
    args += ["--block-size", str(p.block_size)]
    return shlex.join(args)


DFLASH_ARCHS = ("DFlashDraftModel", "MuseGlimmerAssistantModel", "DFlashLagunaForCausalLM")

STACKS: dict[str, Stack] = {
    s.name: s
    for s in [
        Stack(
            name="specpair",
            kinds=runtime.AVAILABLE.drafter_kinds,
            archs={
                "dflash": DFLASH_ARCHS[:2] + ("DFlashMuseGlimmerAssistantModel",),
                "dflash2": ("DFlash2DraftModel",),
                "eagle3": ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"),
            },
            file_format="any",
            target_layouts=("bf16", "f16", "f32", "fp8", "nvfp4", "affine", "exl3", "gguf"),
            draft_layouts=("bf16", "f16", "f32", "fp8", "nvfp4", "affine", "exl3", "gguf"),
            families=runtime.AVAILABLE.families,
            tensor_parallel_drafts=(),
            launch=_specpair,
        ),
        Stack(
            name="sglang",
            kinds=("dflash", "dflash2", "mtp", "eagle3", "draft_model"),
            archs={
                "dflash": DFLASH_ARCHS,
                "dflash2": ("DFlash2DraftModel", "DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel"),
                "eagle3": ("LlamaForCausalLMEagle3",),
            },
            file_format="safetensors",
            target_layouts=("bf16", "f16", "f32", "fp8", "nvfp4-modelopt", "nvfp4-ct", "int4-ct", "int8"),
            draft_layouts=("bf16", "f16", "f32"),
            families=families_served_by("sglang"),
            tensor_parallel_drafts=("dflash", "dflash2", "mtp", "eagle3", "draft_model"),
            launch=_sglang,
        ),
        Stack(
            name="vllm",
            kinds=("dflash", "dflash2", "mtp", "eagle3", "draft_model"),
            archs={
                "dflash": DFLASH_ARCHS + ("DFlashMuseGlimmerAssistantModel", "DFlashQwen3XPressModel"),
                "dflash2": ("DFlash2DraftModel", "DFlash2BeamDraftModel"),
                "eagle3": ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"),
            },
            file_format="safetensors",
            target_layouts=("bf16", "f16", "f32", "fp8", "nvfp4-modelopt", "nvfp4-ct", "int4-ct", "int8"),
            draft_layouts=("bf16", "f16", "f32", "fp8", "int8", "int4-ct"),
            families=families_served_by("vllm"),
            tensor_parallel_drafts=("dflash", "dflash2", "mtp", "eagle3", "draft_model"),
            launch=_vllm,
        ),
        Stack(
            name="llama.cpp",
            kinds=("dflash", "dflash2", "mtp", "eagle3", "draft_model"),
            archs={"dflash": ("dflash",), "dflash2": ("dflash",), "eagle3": ("eagle3",)},
            file_format="gguf",
            target_layouts=("gguf", "f32", "f16", "bf16", "nvfp4-gguf"),
            draft_layouts=("gguf", "f32", "f16", "bf16", "nvfp4-gguf"),
            families=families_served_by("llama.cpp"),
            tensor_parallel_drafts=("dflash", "dflash2", "mtp", "eagle3", "draft_model"),
            launch=_llama_cpp,
        ),
        Stack(
            name="exllamav3",
            kinds=("dflash", "dflash2", "mtp", "draft_model"),
            archs={"dflash": DFLASH_ARCHS, "dflash2": ("DFlash2DraftModel",)},
            file_format="safetensors",
            target_layouts=("exl3", "bf16", "f16", "f32"),
            draft_layouts=("exl3", "bf16", "f16", "f32"),
            families=families_served_by("exllamav3"),
            tensor_parallel_drafts=("draft_model",),
            launch=_exllamav3,
        ),
        Stack(
            name="tensorfold",
            kinds=("dflash", "dflash2", "mtp"),
            archs={"dflash": ("DFlashDraftModel",), "dflash2": ("DFlash2DraftModel",)},
            file_format="safetensors",
            target_layouts=("affine", "nvfp4-modelopt", "fp8", "exl3"),
            draft_layouts=("bf16",),
            families=families_served_by("tensorfold"),
            tensor_parallel_drafts=("dflash2",),
            launch=_tensorfold,
        ),
    ]
}

"""The stack table: what each serving stack loads (file format, layouts; the families and drafter kinds it serves
come from their rows in checkpoint/families.py), and the launch command it needs for a pair.

Versions these facts describe: SGLang 0.5.23, vLLM 0.33.0, llama.cpp mid/late 2026 (upstream `dflash`
arch), ExLlamaV3 1.6.5, TensorFold 0.6.x/1.x (shared/spec/dflash.md §7, tensorfold.md).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from specpair.checkpoint import Checkpoint
from specpair.checkpoint.families import BLOCK, OWN_STACK, families_served_by, kinds_served_by
from specpair.checkpoint.tensor_parallel import EVEN, GROUPS, SPLITS
from specpair.compat.memory import MemoryPlan
from specpair.compat.pair import Pair
from specpair.formats.layouts import AFFINE, NVFP4, layout_of

FLOAT_LAYOUTS = frozenset({"bf16", "f16", "f32", "f64", "int"})
LOCAL_SOURCES = ("local", "gguf")  # Checkpoint.source of files on this machine (a directory, a .gguf file)


@dataclass(frozen=True)
class Stack:
    name: str
    file_format: str  # "safetensors" (HF directory), "gguf", or "any"
    # Layout labels and kinds it loads for a target / a separate drafter. Float labels listed: it takes those
    # unquantized weights; none listed: it needs quantized weight matrices (float norms are always fine).
    target_layouts: tuple[str, ...]
    draft_layouts: tuple[str, ...]
    launch: Callable[[Pair], str]
    # The `specpair convert --to` spec that makes a target / a drafter loadable on it where no lossless repack does
    # (compat/fixes.py); "bf16" where none is given.
    convert_to: dict[str, str] = field(default_factory=dict)
    # Layout kinds it runs only on GPUs with tensor cores for them (LayoutKind.native_capability) -> why, in its words
    native_only: dict[str, str] = field(default_factory=dict)
    moe_layouts: dict[str, tuple[str, ...]] = field(default_factory=dict)  # layout kind -> the only labels of it it
    # loads for a target with routed experts
    # The flag, followed by N, that keeps the routed experts of the first N layers in CPU memory; None: it cannot
    expert_offload: str | None = None
    head_split: str | None = None  # how its tensor parallelism splits heads (checkpoint/tensor_parallel.py SPLITS);
    # None: not established

    @property
    def draft_whole(self) -> bool:
        """Under tensor parallelism every GPU holds the whole drafter and its KV, where its way of splitting says so
        (else they split across the GPUs as the target does)."""
        return self.head_split is not None and not SPLITS[self.head_split][1]

    def unsplit(self, p: Pair, gpus: int) -> list[tuple[str, str]]:
        """(checkpoint, why) for each model of the pair that `gpus` GPUs cannot split the way this stack splits heads
        ([] where they can, or where its way is not established)."""
        if self.head_split is None or gpus == 1:
            return []
        why, drafter_too = SPLITS[self.head_split]
        models = [p.target] + ([p.draft] if p.separate and drafter_too else [])
        return [(m.ref, reason) for m in models for reason in why(m.shapes, gpus)]

    def launch_line(self, p: Pair, memory: MemoryPlan | None) -> str:
        """The launch command, with the experts it keeps in CPU memory where the pair fits only that way."""
        line = self.launch(p)
        offload = memory.experts_on_cpu if memory else None
        return line if offload is None else f"{line} {offload.flag} {offload.layers}"

    @property
    def kinds(self) -> tuple[str, ...]:
        """The drafter kinds it serves (their rows' `serving`)."""
        return kinds_served_by(self.name)

    @property
    def families(self) -> tuple[str, ...]:
        """The target families it loads (their rows' `stacks`)."""
        return families_served_by(self.name)

    @staticmethod
    def unloadable(layouts: set[str], accepted: tuple[str, ...]) -> set[str]:
        """The layouts in `layouts` that `accepted` (labels and kinds, formats/layouts.py) does not cover."""
        return {layout for layout in layouts if not layout_of(layout).matches(accepted)}


COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a pin: a branch, tag or abbreviation names whatever it points to then
ABBREVIATED = re.compile(r"^[0-9a-f]{7,39}$")  # a commit's prefix, as catalogs and model cards quote them


def _model_arg(c: Checkpoint) -> tuple[str, str | None]:
    """The path or repo a stack loads, and the full commit to pass with it (None: none known, for an abbreviation,
    branch or tag is no pin and a stack given one loads whatever it names then)."""
    return c.ref if c.source in LOCAL_SOURCES else c.ref.partition("@")[0], commit_of(c)


def commit_of(c: Checkpoint) -> str | None:
    """The 40-hex commit a Hub checkpoint was read at: the one its reference names, else the one its branch
    resolved to (or the catalog recorded); None for local files and where only an abbreviation is known."""
    if c.source in LOCAL_SOURCES:
        return None
    asked = c.ref.partition("@")[2].lower()
    for commit in (asked, (c.revision or "").lower()):
        if COMMIT.match(commit):
            return commit
    return None


def fetch_step(c: Checkpoint, include: str | None = None, local_dir: str | None = None) -> str | None:
    """The `specpair download` that puts a Hub checkpoint where `convert` and the stacks read it (the HF cache,
    or `local_dir`), at the commit checked where it is known; None when it is on this machine already. No lockfile:
    a step before another command must not replace the specpair.lock a pair's download wrote."""
    if c.source in LOCAL_SOURCES or (c.source == "hf-cache" and local_dir is None):
        return None
    command = ["specpair", "download", pinned_ref(c)]
    command += ["--include", include] if include else []
    command += ["--local-dir", local_dir] if local_dir else []
    return shlex.join(command + ["--no-lock"])


def pinned_ref(c: Checkpoint) -> str:
    """The reference at the commit checked where one is known; else as typed, but bare where it names an abbreviated
    commit (no pin, and a printed command passes a full commit or none)."""
    commit = commit_of(c)
    repo, _, asked = c.ref.partition("@")
    if commit:
        return f"{repo}@{commit}"
    return repo if ABBREVIATED.match(asked.lower()) else c.ref


def _sglang(p: Pair) -> str:
    target, target_rev = _model_arg(p.target)
    args = ["python", "-m", "sglang.launch_server", "--model-path", target]
    if target_rev:
        args += ["--revision", target_rev]
    args += ["--speculative-algorithm", p.serves("sglang").method]
    if p.separate:
        draft, draft_rev = _model_arg(p.draft)
        args += ["--speculative-draft-model-path", draft]
        if draft_rev:
            args += ["--speculative-draft-model-revision", draft_rev]
    if p.kind_row.drafting == BLOCK:
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
    if p.separate and p.target.quantization and not p.draft.quantization:
        args += ["--speculative-draft-model-quantization", "unquant"]
    if p.target.is_hybrid:
        args += ["--mamba-scheduler-strategy", "extra_buffer"]
    if p.deployment.gpus > 1:
        args += ["--tp", str(p.deployment.gpus)]
    args += ["--context-length", str(p.context)]
    return shlex.join(args)


def _vllm(p: Pair) -> str:
    if _serves_pinned(p):  # `vllm serve DRAFT`: the verifier it pins is the target, its proposal sets the tokens
        draft, draft_rev = _model_arg(p.draft)
        args = ["vllm", "serve", draft]
        if draft_rev:
            args += ["--revision", draft_rev]
    else:
        target, target_rev = _model_arg(p.target)
        args = ["vllm", "serve", target]
        if target_rev:
            args += ["--revision", target_rev]
        spec: dict[str, object] = {"method": p.serves("vllm").method}
        if p.separate:
            draft, draft_rev = _model_arg(p.draft)
            spec["model"] = draft
            if draft_rev:
                spec["revision"] = draft_rev
        spec["num_speculative_tokens"] = p.block_size - 1
        if p.kind_row.samples:  # vLLM drafts its argmax unless told (field failure syv-ai/qwen38-27b-rtx3090#73)
            spec["draft_sample_method"] = "probabilistic"
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


def _serves_pinned(p: Pair) -> bool:
    """A speculators-format drafter of a kind vLLM reads in that format, pinning this very target reference:
    `vllm serve DRAFT` loads the pinned one. A pin naming the target otherwise (a local copy of the pinned repo)
    keeps the target form, which serves the user's target (vLLM reads the drafter's format there too)."""
    d, schema = p.draft.drafter, p.kind_row.speculators
    pinned = d is not None and d.verifier == _model_arg(p.target)[0]
    return pinned and schema is not None and "vllm" in schema.readers


# A draft model stops drafting at a token it gives less than this probability. llama.cpp's default was 0.75 until
# b9235 (#23269) made it 0.0: every round then drafts the full --spec-draft-n-max, and acceptance fell from 0.94 to
# 0.30 with the throughput (llama.cpp#25792's bisect; 0.75 passed again gave 0.94).
LLAMA_CPP_DRAFT_P_MIN = "0.75"


def _llama_cpp(p: Pair) -> str:
    """llama-server over local GGUF files; a Hub checkpoint's file is downloaded first, into a folder of its own."""
    steps = []
    paths = []
    for c in [p.target, p.draft] if p.separate else [p.target]:
        path = _gguf_path(c)
        if c.source not in LOCAL_SOURCES:
            folder = f"{MODELS_DIR}/{_repo_name(c.ref)}"
            steps.append(fetch_step(c, path, folder))
            path = f"{folder}/{path}"
        paths.append(path)
    args = ["llama-server", "-m", paths[0], "-c", str(p.context), "-ngl", "99"]
    if p.separate:
        args += ["-md", paths[1], "-ngld", "99"]
    # every kind's llama.cpp row names its --spec-type (common_speculative_type_from_name_map)
    args += ["--spec-type", p.serves("llama.cpp").method, "--spec-draft-n-max", str(p.block_size - 1)]
    if p.kind_row.plain:
        args += ["--spec-draft-p-min", LLAMA_CPP_DRAFT_P_MIN]
    return " && ".join([*steps, shlex.join(args)])


def _gguf_path(c: Checkpoint) -> str:
    """The GGUF file llama.cpp opens: the local path, or the name of the repo's file."""
    if c.ref.endswith(".gguf"):
        return c.ref
    name = next((f.path for f in c.files if f.path.endswith(".gguf")), "model.gguf")
    return os.path.join(c.ref, name) if c.source == "local" else name


def _exllamav3(p: Pair) -> str:
    """ExLlamaV3 has no server of its own: its model_init arguments (-m, -dm or -mtp, -cs, -ndt; the draft cache
    gets the target cache's size) and Generator, in a `python -c` over local directories. Hub checkpoints are
    downloaded first, each into its own folder."""
    checkpoints = [p.target, p.draft] if p.separate else [p.target]
    steps, paths = [], []
    remote = [c for c in checkpoints if c.source != "local"]
    if remote:
        pinned = all(commit_of(c) for c in remote)
        command = [
            "specpair",
            "download",
            *(pinned_ref(c) for c in remote),
            "--local-dir",
            MODELS_DIR if len(remote) == 2 else f"{MODELS_DIR}/{_repo_name(remote[0].ref)}",
        ]
        steps.append(shlex.join(command + ([] if pinned else ["--no-require-sha"])))
    for c in checkpoints:
        paths.append(c.ref if c.source == "local" else f"{MODELS_DIR}/{_repo_name(c.ref)}")
    args = ["-m", paths[0], "-cs", str(p.context), "-ndt", str(p.block_size - 1)]
    args += ["-dm", paths[1]] if p.separate else ["-mtp"]
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


MODELS_DIR = "models"  # where launch lines download Hub checkpoints a stack reads from local files only


def _repo_name(ref: str) -> str:
    return ref.partition("@")[0].rsplit("/", 1)[-1]


def _tensorfold(p: Pair) -> str:
    args = ["tensorfold", "serve", p.target.ref.partition("@")[0] if p.target.source != "local" else p.target.ref]
    if not p.separate:
        args += ["--mtp-drafts", str(min(p.block_size - 1, 3))]
    else:
        args += [
            "--drafter",
            p.draft.ref.partition("@")[0] if p.draft.source != "local" else p.draft.ref,
            "--drafter-bits",
            "0",
        ]
    args += ["--context", str(p.context)]
    tensor_parallel = p.serves("tensorfold").tensor_parallel
    if p.deployment.gpus > 1 and tensor_parallel != 1:
        args += ["--tp", str(tensor_parallel)]
    return shlex.join(args)


def _specpair(p: Pair) -> str:
    """specpair reads weights from local files only: Hub checkpoints are downloaded into the HF cache first."""
    steps = [step for c in p.checkpoints if (step := fetch_step(c))]
    args = ["specpair", "run", pinned_ref(p.target)]
    args += [pinned_ref(p.draft)] if p.separate else ["--mtp"]
    args += ["--block-size", str(p.block_size)]
    if p.deployment.gpus > 1:
        args += ["--tp", str(p.deployment.gpus)]
    return " && ".join([*steps, shlex.join(args)])


STACKS: dict[str, Stack] = {
    s.name: s
    for s in [
        Stack(
            OWN_STACK,
            "any",
            ("bf16", "f16", "f32", "fp8", "nvfp4", "affine", "exl3", "gguf"),
            ("bf16", "f16", "f32", "fp8", "nvfp4", "affine", "exl3", "gguf"),
            _specpair,
            head_split=GROUPS,  # runtime/parallel.py
        ),
        Stack(
            "sglang",
            "safetensors",
            ("bf16", "f16", "f32", "fp8", "nvfp4-modelopt", "nvfp4-ct", "int4-ct", "int8"),
            ("bf16", "f16", "f32"),
            _sglang,
            native_only={
                NVFP4: '"FP4 is not available on this device" (sglang#40022, sglang#28256): use an FP8 or BF16 checkpoint'
            },
            head_split=EVEN,  # its DFlashAttention asserts it for the drafter too
        ),
        Stack(
            "vllm",
            "safetensors",
            ("bf16", "f16", "f32", "fp8", "nvfp4-modelopt", "nvfp4-ct", "int4-ct", "int8"),
            ("bf16", "f16", "f32", "fp8", "int8", "int4-ct"),
            _vllm,
            head_split=EVEN,
        ),
        Stack(
            "llama.cpp",
            "gguf",
            ("gguf", "f32", "f16", "bf16", "nvfp4-gguf"),
            ("gguf", "f32", "f16", "bf16", "nvfp4-gguf"),
            _llama_cpp,
            convert_to={"target": "gguf:Q8_0", "draft": "gguf:BF16"},
            # common/arg.cpp: "keep the Mixture of Experts (MoE) weights of the first N layers in the CPU" (-ncmoe)
            expert_offload="--n-cpu-moe",
        ),
        Stack(
            "exllamav3",
            "safetensors",
            ("exl3", "bf16", "f16", "f32"),
            ("exl3", "bf16", "f16", "f32"),
            _exllamav3,
            convert_to={"target": "exl3:4"},  # ExLlamaV3's own layout, at its usual 4 bits
        ),
        Stack(
            "tensorfold",
            "safetensors",
            ("affine", "nvfp4-modelopt", "fp8", "exl3"),
            ("bf16",),
            _tensorfold,
            convert_to={"target": "affine4"},
            # its Qwen3.6-MoE CUDA engine reads MLX affine weights only as 4-bit g64 (8-bit routers)
            moe_layouts={AFFINE: ("affine4-g64", "affine8-g64")},
        ),
    ]
}
STACK_NAMES = tuple(STACKS)

"""llama.cpp specifics for GGUF drafters and targets."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.fixes import convert_command
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_KINDS, BLOCK_DRAFTERS, SELECTOR_DRAFTERS, Values, rule
from specpair.formats.layouts import NVFP4, layout_of


@rule(
    "gguf.dflash2_build",
    "info",
    ("llama.cpp",),
    SELECTOR_DRAFTERS,
    title="DFlash2 GGUFs need a llama.cpp build that has DFlash2.",
    message="{draft} is a DFlash2 drafter: llama.cpp loads it only in builds with PR #27342; older builds and forks fail with a tensor-count mismatch.",
    example={},
)
def _dflash2_build(p: Pair, stack: str) -> Iterable[Values]:
    yield {}


@rule(
    "gguf.draft_tokenizer",
    "error",
    ("llama.cpp",),
    BLOCK_DRAFTERS,
    title="A DFlash GGUF carries the target's tokenizer (upstream's converter copies it).",
    message="{draft} carries no tokenizer: llama.cpp takes a DFlash drafter's mask token from its vocabulary "
    "(llama_vocab_mask in common/speculative.cpp), so without one every masked slot drafts token -1 and decoding "
    "fails (llama.cpp#26761), and some loaders refuse weights-only files (ROCmFPX#96). Upstream converts DFlash "
    "drafters with --target-model-dir, so the GGUF holds {target}'s vocabulary.",
    example={},
    fix=lambda p, stack: convert_command(p.draft, stack, "draft", p.target),
)
def _draft_tokenizer(p: Pair, stack: str) -> Iterable[Values]:
    if p.draft.format == "gguf" and p.draft.tokenizer is None:
        yield {}


@rule(
    "gguf.nvfp4_build",
    "info",
    ("llama.cpp",),
    ALL_KINDS,
    title="NVFP4 GGUF tensors (type 40) load only in recent llama.cpp builds.",
    message="{name} stores NVFP4 (ggml type 40) tensors: only recent llama.cpp builds load them; older ones stop at an unknown type.",
    example={"name": "target.gguf"},
)
def _nvfp4(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint in p.checkpoints:
        if checkpoint.format == "gguf" and any(layout_of(layout).kind == NVFP4 for layout in checkpoint.layouts_of()):
            yield {"name": checkpoint.ref}


@rule(
    "gguf.dflash2_split",
    "info",
    ("llama.cpp",),
    SELECTOR_DRAFTERS,
    title="A DFlash2 drafter across several GPUs on llama.cpp: which split mode runs it.",
    message="{draft} is a DFlash2 drafter, and --gpus {gpus} splits {target} across GPUs: llama.cpp's default layer split runs it, slowly (80 to 18 tok/s in llama.cpp#27819's report); --split-mode tensor stops at an assertion in builds without PR #27858, whose candidate selector reads a vocabulary-split lm_head.",
    example={"gpus": 2},
)
def _dflash2_split(p: Pair, stack: str) -> Iterable[Values]:
    if p.deployment.gpus > 1:
        yield {"gpus": p.deployment.gpus}


@rule(
    "gguf.image_prompts",
    "info",
    ("llama.cpp",),
    BLOCK_DRAFTERS,
    title="A block drafter beside a target that takes images: the llama.cpp build its image prompts need.",
    message="{target} takes images (M-RoPE positions; llama.cpp loads its vision tower from an mmproj file): with "
    "--mmproj, {kind_name} drafting on image prompts needs a llama.cpp build with PR #28587 (before it, the first "
    "image fails the request, HTTP 500, beside a sliding-window drafter: llama.cpp#27408) and PR #28715 (merged "
    "2026-09-10; before it, drafts after an image sit at the text's positions: DFlash2 acceptance 0.02 against 0.35, "
    "51 against 152 tok/s).",
    example={"kind_name": "DFlash"},
)
def _image_prompts(p: Pair, stack: str) -> Iterable[Values]:
    if p.target.rope.mrope:
        yield {"kind_name": p.kind_row.title}

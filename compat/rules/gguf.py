"""llama.cpp specifics for GGUF drafters and targets."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint import Checkpoint
from specpair.checkpoint.families import OWN_STACK
from specpair.checkpoint.gguf_arch import GGUF_KEYS
from specpair.compat.fixes import convert_command
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_KINDS, BLOCK_DRAFTERS, SELECTOR_DRAFTERS, Values, rule
from specpair.formats.layouts import NVFP4, layout_of
from specpair.sources.catalog import drafters_named


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


def _shape(c: Checkpoint) -> tuple[object, ...]:
    """What a conversion keeps of a drafter and its revisions differ in (z-lab's Qwen3.6-35B-A3B: 8 full layers, then
    6 mostly sliding ones with other taps)."""
    s, d = c.shapes, c.drafter
    taps = d.taps.layers if d.taps else None
    return d.kind, s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size, taps


def _trained_window(draft: Checkpoint) -> list[Checkpoint]:
    """The published drafters a GGUF drafter may have been converted from, where they were trained with a sliding
    window: the catalog's drafters of a name the file gives, of its kind, shapes and taps. Empty unless every one
    of them has sliding layers, so a repo whose revisions differ in attention but not in shapes says nothing."""
    sources = [c for c in drafters_named(tuple(draft.drafter.names)) if _shape(c) == _shape(draft)]
    if all(c.rope.sliding_window and "sliding" in c.shapes.layer_types for c in sources):
        return sources
    return []


@rule(
    "gguf.draft_swa",
    "warn",
    ("llama.cpp", OWN_STACK),
    BLOCK_DRAFTERS,
    title="A GGUF drafter trained with a sliding window carries the window keys (else it runs with full attention).",
    message="{draft} has no {key}, but the published drafter of its name and shapes ({sources}) was trained with a "
    "{window}-token sliding window on {sliding} of {layers} layers: {stack} then runs every layer with full "
    "attention, and acceptance falls once the context passes the window (ik_llama.cpp#2021: up to 17.4 points of "
    "acceptance on Qwen3.6-35B-A3B past 4096 tokens). Convert {source} again with `{command}`: specpair's converter "
    "keeps the window.",
    example={
        "draft": "Qwen3.6-35B-A3B-DFlash-Q8_0.gguf",
        "key": "dflash.attention.sliding_window",
        "sources": "z-lab/Qwen3.6-35B-A3B-DFlash",
        "source": "z-lab/Qwen3.6-35B-A3B-DFlash",
        "window": 4096,
        "sliding": 5,
        "layers": 6,
        "command": "specpair download z-lab/Qwen3.6-35B-A3B-DFlash --no-lock && specpair convert "
        "z-lab/Qwen3.6-35B-A3B-DFlash Qwen3.6-35B-A3B-DFlash-bf16.gguf --to gguf:BF16 "
        "--target Qwen3.6-35B-A3B-UD-Q4_K_M.gguf",
    },
)
def _draft_swa(p: Pair, stack: str) -> Iterable[Values]:
    # llama.cpp (src/models/dflash.cpp) and specpair (checkpoint/gguf_arch.py) read the window from this key alone
    key = f"{p.draft.architecture}.{GGUF_KEYS['sliding_window']}"
    if p.draft.format != "gguf" or key in p.draft.drafter.config_keys:
        return
    sources = _trained_window(p.draft)
    if sources:
        source = sources[0]
        yield {
            "key": key,
            "sources": ", ".join(dict.fromkeys(c.ref for c in sources)),
            "source": source.ref,
            "window": source.rope.sliding_window,
            "sliding": source.shapes.count("sliding"),
            "layers": source.shapes.num_layers,
            "command": " && ".join(convert_command(source, stack, "draft", p.target)),
        }


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

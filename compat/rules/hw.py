"""GPU capability, memory fit and tensor parallelism, and recurrent-state rollback on hybrid targets."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.memory import TP_SIZES
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_KINDS, ALL_STACKS, Values, rule
from specpair.compat.stacks import STACKS
from specpair.formats.layouts import LAYOUT_KINDS, NVFP4, layout_of


def _layouts(p: Pair) -> set[str]:
    return p.target.layouts_of() | (p.draft.layouts_of() if p.separate else set())


def _sm(cap: tuple[int, int]) -> str:
    return f"sm_{cap[0]}{cap[1]}"


@rule(
    "hw.capability",
    "error",
    ("sglang", "exllamav3", "tensorfold"),
    ALL_KINDS,
    title="The GPU's compute capability runs the pair's kernels (NVFP4 needs Blackwell on SGLang; TensorFold needs 8.9+; DFlash2 on ExLlamaV3 needs BF16 hardware).",
    message="{stack} cannot run {what} on the {gpu} ({sm}): {why}.",
    example={
        "what": "NVFP4 weights of Qwen/Qwen3.6-35B-A3B-NVFP4",
        "gpu": "H100 80GB",
        "sm": "sm_90",
        "why": '"FP4 is not available on this device" (sglang#40022, sglang#28256): use the FP8 or BF16 checkpoint',
    },
)
def _capability(p: Pair, stack: str) -> Iterable[Values]:
    gpu = p.deployment.gpu
    if gpu is None:
        return
    values = {"gpu": gpu.name, "sm": _sm(gpu.capability)}
    for kind, why in STACKS[stack].native_only.items():
        row = LAYOUT_KINDS[kind]
        if gpu.capability < row.native_capability and _any_kind(_layouts(p), kind):
            yield {**values, "what": f"{row.title} weights", "why": why}
    if stack == "tensorfold" and gpu.capability < (8, 9):
        yield {
            **values,
            "what": "anything",
            "why": "TensorFold refuses NVIDIA GPUs below compute capability 8.9 at startup",
        }
    serves = p.serves(stack)
    if serves and serves.min_capability and gpu.capability < serves.min_capability:
        yield {
            **values,
            "what": f"{p.kind_row.title} drafters",
            "why": f"{p.kind_row.title} residuals exceed FP16 range and need BF16 hardware (exl3#334)",
        }


@rule(
    "hw.kernels",
    "warn",
    ("vllm",),
    ALL_KINDS,
    title="Quantized layouts that fall back to slower weight-only kernels on this GPU.",
    message="On the {gpu} ({sm}) vLLM runs {layout} weights with weight-only fallback kernels (Marlin), not native {native}: it works, slower.",
    example={
        "gpu": "H100 80GB",
        "sm": "sm_90",
        "layout": LAYOUT_KINDS[NVFP4].title,
        "native": LAYOUT_KINDS[NVFP4].native,
    },
)
def _kernels(p: Pair, stack: str) -> Iterable[Values]:
    gpu = p.deployment.gpu
    if gpu is None:
        return
    layouts = _layouts(p)
    # newest tensor cores first
    native = sorted((k for k in LAYOUT_KINDS.values() if k.native_capability), key=lambda k: k.native_capability)
    for row in reversed(native):
        if gpu.capability < row.native_capability and _any_kind(layouts, row.name):
            yield {"gpu": gpu.name, "sm": _sm(gpu.capability), "layout": row.title, "native": row.native}


def _any_kind(layouts: set[str], kind: str) -> bool:
    return any(layout_of(layout).kind == kind for layout in layouts)


@rule(
    "hw.tensor_parallel_split",
    "error",
    ALL_STACKS,
    ALL_KINDS,
    title="The GPUs asked for split the pair's heads the way the stack splits them (compat/stacks.py head_split).",
    message="{stack} cannot split {found} over --gpus {gpus}; {instead}.",
    example={
        "found": "org/target: 4 attention heads do not divide by 8",
        "gpus": 8,
        "instead": "--gpus 4 splits it",
    },
)
def _tensor_parallel_split(p: Pair, stack: str) -> Iterable[Values]:
    gpus, row = p.deployment.gpus, STACKS[stack]
    found = row.unsplit(p, gpus)
    if found:
        splits = [n for n in TP_SIZES if 1 < n < gpus and not row.unsplit(p, n)]
        yield {
            "found": "; ".join(f"{ref}: {why}" for ref, why in found),
            "gpus": gpus,
            "instead": f"--gpus {splits[-1]} splits it" if splits else "serve it on one GPU",
        }

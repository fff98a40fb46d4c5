"""GPU capability, memory fit and tensor parallelism, and recurrent-state rollback on hybrid targets."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules import ALL_KINDS, Values, rule
from specpair.formats.layouts import layout_of


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
    if stack == "sglang" and gpu.capability < (10, 0) and _any_kind(_layouts(p), "nvfp4"):
        yield {
            **values,
            "what": "NVFP4 weights",
            "why": '"FP4 is not available on this device" (sglang#40022, sglang#28256): use an FP8 or BF16 checkpoint',
        }
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
    example={"gpu": "H100 80GB", "sm": "sm_90", "layout": "NVFP4", "native": "FP4 tensor cores (Blackwell)"},
)
def _kernels(p: Pair, stack: str) -> Iterable[Values]:
    gpu = p.deployment.gpu
    if gpu is None:
        return
    layouts = _layouts(p)
    if gpu.capability < (10, 0) and _any_kind(layouts, "nvfp4"):
        yield {"gpu": gpu.name, "sm": _sm(gpu.capability), "layout": "NVFP4", "native": "FP4 tensor cores (Blackwell)"}
    if gpu.capability < (8, 9) and _any_kind(layouts, "fp8"):
        yield {"gpu": gpu.name, "sm": _sm(gpu.capability), "layout": "FP8", "native": "FP8 tensor cores (Ada/Hopper)"}


def _any_kind(layouts: set[str], kind: str) -> bool:
    return any(layout_of(layout).kind == kind for layout in layouts)

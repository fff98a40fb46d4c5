"""GPU capability, memory fit and tensor parallelism, and recurrent-state rollback on hybrid targets."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint import Shapes
from specpair.compat.memory import TP_SIZES
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_KINDS, Values, rule
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


def _undivided(shapes: Shapes, gpus: int) -> list[str]:
    """The head counts of a model that `gpus`-way tensor parallelism as SGLang and vLLM build it cannot split: query
    heads and Gated DeltaNet heads evenly, KV heads evenly or, when fewer than the GPUs, copied to a whole share
    each (their QKVParallelLinear)."""
    found = [f"{shapes.num_heads} attention heads"] if shapes.num_heads % gpus else []
    kv = shapes.num_kv_heads
    if (kv >= gpus and kv % gpus) or (kv < gpus and gpus % kv):
        found.append(f"{kv} KV heads")
    for heads, what in (
        (shapes.linear_key_heads, "Gated DeltaNet key heads"),
        (shapes.linear_value_heads, "value heads"),
    ):
        if heads and heads % gpus:
            found.append(f"{heads} {what}")
    return found


@rule(
    "hw.tensor_parallel_heads",
    "error",
    ("sglang", "vllm"),
    ALL_KINDS,
    title="The GPUs asked for divide the target's and the drafter's heads, as the stack's tensor parallelism needs.",
    message="{stack} splits heads evenly over --gpus {gpus} (the KV heads may be copied where fewer), and {which} has {heads}; {instead}.",
    example={
        "gpus": 4,
        "which": "org/drafter",
        "heads": "6 attention heads",
        "instead": "--gpus 2 divides them",
    },
)
def _tensor_parallel_heads(p: Pair, stack: str) -> Iterable[Values]:
    gpus = p.deployment.gpus
    if gpus == 1:
        return
    models = [(p.target.ref, p.target.shapes)] + ([(p.draft.ref, p.draft.shapes)] if p.separate else [])
    for ref, shapes in models:
        found = _undivided(shapes, gpus)
        if found:
            fits = [n for n in TP_SIZES if 1 < n < gpus and all(not _undivided(s, n) for _, s in models)]
            yield {
                "gpus": gpus,
                "which": ref,
                "heads": " and ".join(found),
                "instead": f"--gpus {fits[-1]} divides them" if fits else "serve it on one GPU",
            }

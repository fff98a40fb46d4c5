"""GPU capability, memory fit and tensor parallelism, and recurrent-state rollback on hybrid targets."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.memory import GB, TP_SIZES, USABLE_FRACTION, estimate
from specpair.compat.pair import Pair
from specpair.compat.rules import ALL_KINDS, ALL_STACKS, Values, rule
from specpair.compat.stacks import STACKS


def _layouts(p: Pair) -> set[str]:
    return p.target.layouts_of() | (p.draft.layouts_of() if p.kind != "mtp" else set())


def _sm(cap: tuple[int, int]) -> str:
    return f"sm_{cap[0]}{cap[1]}"


@rule(
    "hw.capability", "error", ("sglang", "exllamav3", "tensorfold"), ALL_KINDS,
    title="The GPU's compute capability runs the pair's kernels (NVFP4 needs Blackwell on SGLang; TensorFold needs 8.9+; DFlash2 on ExLlamaV3 needs BF16 hardware).",
    message="{stack} cannot run {what} on the {gpu} ({sm}): {why}.",
    example={"what": "NVFP4 weights of Qwen/Qwen3.6-35B-A3B-NVFP4", "gpu": "H100 80GB", "sm": "sm_90",
             "why": "\"FP4 is not available on this device\" (sglang#40022, sglang#28256): use the FP8 or BF16 checkpoint"},
)
def _capability(p: Pair, stack: str) -> Iterable[Values]:
    gpu = p.deployment.gpu
    if gpu is None:
        return
    values = {"gpu": gpu.name, "sm": _sm(gpu.capability)}
    if stack == "sglang" and gpu.capability < (10, 0) and any(layout.startswith("nvfp4") for layout in _layouts(p)):
        yield {**values, "what": "NVFP4 weights",
               "why": "\"FP4 is not available on this device\" (sglang#40022, sglang#28256): use an FP8 or BF16 checkpoint"}
    if stack == "tensorfold" and gpu.capability < (8, 9):
        yield {**values, "what": "anything", "why": "TensorFold refuses NVIDIA GPUs below compute capability 8.9 at startup"}
    if stack == "exllamav3" and p.kind == "dflash2" and gpu.capability < (8, 0):
        yield {**values, "what": "DFlash2 drafters", "why": "DFlash2 residuals exceed FP16 range and need BF16 hardware (exl3#334)"}


@rule(
    "hw.kernels", "warn", ("vllm",), ALL_KINDS,
    title="Quantized layouts that fall back to slower weight-only kernels on this GPU.",
    message="On the {gpu} ({sm}) vLLM runs {layout} weights with weight-only fallback kernels (Marlin), not native {native}: it works, slower.",
    example={"gpu": "H100 80GB", "sm": "sm_90", "layout": "NVFP4", "native": "FP4 tensor cores (Blackwell)"},
)
def _kernels(p: Pair, stack: str) -> Iterable[Values]:
    gpu = p.deployment.gpu
    if gpu is None:
        return
    layouts = _layouts(p)
    if gpu.capability < (10, 0) and any(layout.startswith("nvfp4") for layout in layouts):
        yield {"gpu": gpu.name, "sm": _sm(gpu.capability), "layout": "NVFP4", "native": "FP4 tensor cores (Blackwell)"}
    if gpu.capability < (8, 9) and any(layout.startswith("fp8") for layout in layouts):
        yield {"gpu": gpu.name, "sm": _sm(gpu.capability), "layout": "FP8", "native": "FP8 tensor cores (Ada/Hopper)"}


def _plan(p: Pair, stack: str) -> tuple[object, int | None, int]:
    """(estimate, smallest tensor-parallel size that fits or None, largest size this stack allows)."""
    e = estimate(p.target, p.draft, p.kind, p.context, p.deployment.concurrency)
    gpu = p.deployment.gpu
    max_tp = max(TP_SIZES) if p.kind in STACKS[stack].tensor_parallel_drafts else 1
    if stack == "tensorfold":
        max_tp = 2 if p.kind == "dflash2" else 1
    fits = None
    if gpu is not None:
        budget = gpu.memory * USABLE_FRACTION
        fits = next((tp for tp in TP_SIZES if tp <= max_tp and e.per_gpu(tp, draft_sharded=tp > 1) <= budget), None)
    return e, fits, max_tp


def _breakdown(e) -> str:
    return (f"target {e.target_weights / GB:.1f} GB + draft {e.draft_weights / GB:.1f} GB + KV {e.kv / GB:.1f} GB"
            f" + recurrent state {e.state / GB:.2f} GB + draft KV {e.draft_kv / GB:.2f} GB = {e.total / GB:.1f} GB")


@rule(
    "memory.fit", "error", ALL_STACKS, ALL_KINDS,
    title="Target + draft weights, KV cache, recurrent state and draft KV fit the GPUs given (--gpu, --gpus, --context).",
    message="{target} with {draft} needs {breakdown} at {context} tokens x {concurrency} sequence(s); that does not fit {gpus} x {gpu} ({usable:.0f} GB usable each) on {stack}{needed}.",
    example={"breakdown": "target 69.3 GB + draft 0.9 GB + KV 0.7 GB + recurrent state 0.06 GB + draft KV 0.02 GB = 71.0 GB",
             "context": 32768, "concurrency": 1, "gpus": 1, "gpu": "RTX 4090", "usable": 21.6,
             "needed": "; it needs tensor parallelism 4"},
)
def _memory_fit(p: Pair, stack: str) -> Iterable[Values]:
    gpu = p.deployment.gpu
    if gpu is None or not p.target.groups:
        return
    e, fits, max_tp = _plan(p, stack)
    if fits is not None and fits <= p.deployment.gpus:
        return
    if fits is not None:
        needed = f"; it needs tensor parallelism {fits} (pass --gpus {fits})"
    elif max_tp == 1:
        needed = f"; {stack} cannot split this pair across GPUs"
    else:
        needed = f"; not even at tensor parallelism {max_tp}"
    yield {"breakdown": _breakdown(e), "context": p.context, "concurrency": p.deployment.concurrency,
           "gpus": p.deployment.gpus, "gpu": gpu.name, "usable": gpu.memory * USABLE_FRACTION / GB, "needed": needed}


@rule(
    "memory.plan", "info", ALL_STACKS, ALL_KINDS,
    title="The memory estimate and the tensor parallelism that fits.",
    message="Memory at {context} tokens x {concurrency} sequence(s): {breakdown}; {verdict}.",
    example={"context": 32768, "concurrency": 1,
             "breakdown": "target 20.8 GB + draft 0.9 GB + KV 0.7 GB + recurrent state 0.06 GB + draft KV 0.02 GB = 22.5 GB",
             "verdict": "fits one H200 (126.9 GB usable)"},
)
def _memory_plan(p: Pair, stack: str) -> Iterable[Values]:
    if not p.target.groups:
        return
    e, fits, _ = _plan(p, stack)
    gpu = p.deployment.gpu
    if gpu is None:
        verdict = "pass --gpu (h100, h200, b200, gb10, rtx4090, ...) to check the fit"
    elif fits is None or fits > p.deployment.gpus:
        return  # memory.fit reports it
    else:
        usable = gpu.memory * USABLE_FRACTION / GB
        verdict = f"fits one {gpu.name} ({usable:.1f} GB usable)" if fits == 1 else f"fits at tensor parallelism {fits} on {gpu.name} ({usable:.1f} GB usable each)"
    yield {"context": p.context, "concurrency": p.deployment.concurrency, "breakdown": _breakdown(e), "verdict": verdict}


@rule(
    "hybrid.rollback", "info", ("specpair", "sglang", "vllm", "exllamav3"), ALL_KINDS,
    title="How the stack rolls back recurrent (Gated DeltaNet) state after a partly rejected draft.",
    message="{target} is hybrid ({linear} Gated DeltaNet + {full} attention layers): after a partly accepted draft the recurrent state must roll back; {how}.",
    example={"linear": 30, "full": 10, "how": "SGLang needs --mamba-scheduler-strategy extra_buffer (in the launch line)"},
)
def _rollback(p: Pair, stack: str) -> Iterable[Values]:
    if not p.target.is_hybrid:
        return
    how = {
        "specpair": "specpair snapshots the state before verify and re-runs the accepted prefix",
        "sglang": "SGLang needs --mamba-scheduler-strategy extra_buffer (in the launch line)",
        "vllm": "vLLM keeps one state slot per draft position and resumes from the last accepted one",
        "exllamav3": "ExLlamaV3 checkpoints the recurrent state per draft round",
    }[stack]
    yield {"linear": p.target.shapes.count("linear"), "full": p.target.shapes.count("full"), "how": how}


@rule(
    "hybrid.rollback_build", "warn", ("llama.cpp",), ALL_KINDS,
    title="llama.cpp rolls back hybrid state only in builds with the hybrid-state fallback.",
    message="{target} is hybrid ({linear} recurrent layers): llama.cpp rewinds its state after rejected drafts only in builds with the hybrid-state fallback (PRs #19493, #22227); older builds cannot speculate on it.",
    example={"linear": 30},
)
def _rollback_build(p: Pair, stack: str) -> Iterable[Values]:
    if p.target.is_hybrid:
        yield {"linear": p.target.shapes.count("linear")}

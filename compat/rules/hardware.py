"""GPU capability, memory fit and tensor parallelism, and recurrent-state rollback on hybrid targets."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.memory import TP_SIZES, MemoryPlan, estimate, plan
from specpair.compat.pair import Pair
from specpair.compat.rules.table import ALL_KINDS, ALL_STACKS, Values, rule
from specpair.compat.stacks import STACKS
from specpair.formats.layouts import layout_of


def _layouts(p: Pair) -> set[str]:
    return p.target.layouts_of() | (p.draft.layouts_of() if p.kind != "mtp" else set())


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
    if stack == "exllamav3" and p.kind == "dflash2" and gpu.capability < (8, 0):
        yield {
            **values,
            "what": "DFlash2 drafters",
            "why": "DFlash2 residuals exceed FP16 range and need BF16 hardware (exl3#334)",
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


def memory_plan(p: Pair, stack: str) -> MemoryPlan | None:
    """The pair's memory on this stack at the deployment asked for; None when there is nothing to size (no
    tensor headers, or an MTP pair whose target has no MTP head)."""
    if not p.target.groups or (p.kind == "mtp" and (p.target.mtp is None or p.target.mtp.tensors == 0)):
        return None
    max_tp = max(TP_SIZES) if p.kind in STACKS[stack].tensor_parallel_drafts else 1
    if stack == "tensorfold":
        max_tp = 2 if p.kind == "dflash2" else 1
    e = estimate(p.target, p.draft, p.kind, p.context, p.deployment.concurrency)
    return plan(e, p.context, p.deployment.concurrency, p.deployment.gpu, p.deployment.gpus, max_tp)


def _breakdown(p: Pair, m: MemoryPlan) -> str:
    """'target 70.2 + draft 0.8 + KV 0.7 + recurrent state 0.1 + draft KV 0.2 = 72.0 GB' (rounded parts, their sum)."""
    parts = m.parts
    if p.kind == "mtp":
        terms = [
            f"target {parts['target_weights']:.1f} (its MTP head included)",
            f"KV {parts['kv']:.1f}",
            f"recurrent state {parts['recurrent_state']:.1f}",
            f"MTP KV {parts['draft_kv']:.1f}",
        ]
    else:
        terms = [
            f"target {parts['target_weights']:.1f}",
            f"draft {parts['draft_weights']:.1f}",
            f"KV {parts['kv']:.1f}",
            f"recurrent state {parts['recurrent_state']:.1f}",
            f"draft KV {parts['draft_kv']:.1f}",
        ]
    return " + ".join(terms) + f" = {m.total:.1f} GB"


def _on(m: MemoryPlan) -> str:
    return "on one GPU" if m.tensor_parallel == 1 else f"per GPU at tensor parallelism {m.tensor_parallel}"


@rule(
    "memory.fit",
    "error",
    ALL_STACKS,
    ALL_KINDS,
    title="Target + draft weights, KV cache, recurrent state and draft KV fit the GPUs given (--gpu, --gpus, --context).",
    message="{target} with {draft} needs {per_gpu:.1f} GB {on} ({breakdown}, plus {overhead:.1f} GB runtime overhead per GPU) at {context} tokens x {concurrency} sequence(s); the {gpus} x {gpu} given have {usable:.1f} GB usable each, so it does not fit on {stack}{needed}.",
    example={
        "per_gpu": 73.9,
        "on": "on one GPU",
        "breakdown": "target 70.2 + draft 0.8 + KV 0.7 + recurrent state 0.1 + draft KV 0.2 = 72.0 GB",
        "overhead": 2.0,
        "context": 32768,
        "concurrency": 1,
        "gpus": 1,
        "gpu": "A100 80GB",
        "usable": 72.0,
        "needed": "; it needs tensor parallelism 2 (pass --gpus 2)",
    },
)
def _memory_fit(p: Pair, stack: str) -> Iterable[Values]:
    m = memory_plan(p, stack)
    if m is None or m.fits is not False:
        return
    if m.smallest_fitting_tensor_parallel is not None:
        needed = (
            f"; it needs tensor parallelism {m.smallest_fitting_tensor_parallel} "
            f"(pass --gpus {m.smallest_fitting_tensor_parallel})"
        )
    elif m.max_tensor_parallel == 1:
        needed = f"; {stack} cannot split this pair across GPUs"
    else:
        needed = f"; not even at tensor parallelism {m.max_tensor_parallel}"
    yield {
        "per_gpu": m.per_gpu,
        "on": _on(m),
        "breakdown": _breakdown(p, m),
        "overhead": m.overhead_per_gpu,
        "context": m.context,
        "concurrency": m.concurrency,
        "gpus": p.deployment.gpus,
        "gpu": m.gpu,
        "usable": m.usable_per_gpu,
        "needed": needed,
    }


@rule(
    "memory.plan",
    "info",
    ALL_STACKS,
    ALL_KINDS,
    title="The memory estimate and the tensor parallelism that fits.",
    message="Memory at {context} tokens x {concurrency} sequence(s): {breakdown}, plus {overhead:.1f} GB runtime overhead per GPU; {verdict}.",
    example={
        "context": 32768,
        "concurrency": 1,
        "overhead": 2.0,
        "breakdown": "target 20.8 + draft 0.9 + KV 0.7 + recurrent state 0.1 + draft KV 0.0 = 22.5 GB",
        "verdict": "24.5 GB on one GPU fits the 126.9 GB usable on an H200",
    },
)
def _memory_plan(p: Pair, stack: str) -> Iterable[Values]:
    m = memory_plan(p, stack)
    if m is None or m.fits is False:  # memory.fit reports it
        return
    if m.fits is None:
        verdict = f"{m.per_gpu:.1f} GB {_on(m)}; pass --gpu (h100, h200, b200, gb10, rtx4090, ...) to check the fit"
    else:
        verdict = f"{m.per_gpu:.1f} GB {_on(m)} fits the {m.usable_per_gpu:.1f} GB usable on each {m.gpu}"
    yield {
        "context": m.context,
        "concurrency": m.concurrency,
        "breakdown": _breakdown(p, m),
        "overhead": m.overhead_per_gpu,
        "verdict": verdict,
    }


@rule(
    "hybrid.rollback",
    "info",
    ("specpair", "sglang", "vllm", "exllamav3"),
    ALL_KINDS,
    title="How the stack rolls back recurrent (Gated DeltaNet) state after a partly rejected draft.",
    message="{target} is hybrid ({linear} Gated DeltaNet + {full} attention layers): after a partly accepted draft the recurrent state must roll back; {how}.",
    example={
        "linear": 30,
        "full": 10,
        "how": "SGLang needs --mamba-scheduler-strategy extra_buffer (in the launch line)",
    },
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
    "hybrid.rollback_build",
    "warn",
    ("llama.cpp",),
    ALL_KINDS,
    title="llama.cpp rolls back hybrid state only in builds with the hybrid-state fallback.",
    message="{target} is hybrid ({linear} recurrent layers): llama.cpp rewinds its state after rejected drafts only in builds with the hybrid-state fallback (PRs #19493, #22227); older builds cannot speculate on it.",
    example={"linear": 30},
)
def _rollback_build(p: Pair, stack: str) -> Iterable[Values]:
    if p.target.is_hybrid:
        yield {"linear": p.target.shapes.count("linear")}

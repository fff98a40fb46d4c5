"""What every Triton kernel here shares: the import guard, whether kernels run in Triton's interpreter, how
kernels are launched (programmatic dependent launch), and the store that rounds to the output dtype.

Triton decides at decoration time whether a kernel is compiled or interpreted (TRITON_INTERPRET=1), so
`INTERPRETED` is read when this module is imported, beside the kernels it describes. The interpreter computes
bf16 wrongly (its float32 -> bf16 cast truncates, and bf16 arithmetic goes through numpy), so kernels load
bf16, widen to float32 at once, compute in float32 and round only at the store, through `rounded`, which
rounds to nearest even in integer arithmetic: the same bits as the GPU's conversion, in both modes.
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton on this platform: the torch references still run
    triton = None
    tl = None

from specpair.errors import BadInput

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
# Constexprs the kernels are given an interpreter-only value for under TRITON_INTERPRET (float32 dots and weight
# values, its bf16 being wrong), by name, with the value the GPU gives them for bf16 operands (a tl dtype by
# name): tools/compile_kernels.py compiles a launch the checks record with these too, the GPU's own code path
GPU_CONSTEXPRS = {"F32": False, "WDT": "bfloat16"}

# Programmatic dependent launch (Hopper and later): a kernel may be launched while the one before it in the stream
# still runs, so its launch and scheduling overlap that kernel's tail instead of following it. Each kernel here
# first waits for the previous kernel's writes to be visible (griddepcontrol.wait), then lets the next one launch
# (launch_dependents): its arithmetic and its bits are those of a plain launch, only its start moves. Mode 2 also
# has a matmul ask L2 for its program's rows of an unrouted weight before it waits (a weight is no kernel's
# output), so the stream of a step's next weight starts during the previous kernel (linear.py: every layout but
# the GGUF Q8_0 and Q6_K bytes the older kernel realigns; GGUF planes by their code plane), and a MoE router asks
# for its chosen experts' bytes as soon as it has chosen them (experts.py). A decode step is ~900 short
# kernels whose fixed costs, not their bytes, set its time (benchmarks/results/step_profile.md);
# benchmarks/pdl_gpu.py measures each mode against plain launches (results/pdl_gpu.md, H200, CUDA graphs, the same
# logits in every mode): PDL 0.90-0.98x plain launches' step time on Qwen3-8B and Qwen3.6-35B-A3B (BF16, NVFP4) at
# 1-16 tokens; the prefetch 0.93-1.54x, slower than PDL alone everywhere. So PDL (mode 1) is the default where it
# compiles (a Hopper or later GPU, compiled Triton 3.5 or later), plain launches elsewhere; SPECPAIR_PDL=0, 1 or 2
# at start, or `use_pdl`, asks for a mode.
PDL_MODES = {0: "plain launches", 1: "PDL", 2: "PDL and weight prefetch"}
try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # no Triton, or one before 3.5
    gdc_wait = gdc_launch_dependents = None
PDL_AVAILABLE = gdc_wait is not None and not INTERPRETED


def _mode_asked() -> int | None:
    """SPECPAIR_PDL's mode; None when it is not set (the default, decided at the first launch)."""
    value = os.environ.get("SPECPAIR_PDL", "").strip()
    if not value:
        return None
    if value not in ("0", "1", "2"):
        raise BadInput("SPECPAIR_PDL", f"is {value!r}: give 0 (plain launches), 1 (PDL) or 2 (PDL and weight prefetch)")
    return int(value)


def default_pdl_mode() -> int:
    """PDL where it compiles (a Hopper or later GPU, compiled Triton 3.5 or later), else plain launches."""
    import torch

    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
    return 1 if PDL_AVAILABLE and hopper else 0


_pdl = {"mode": _mode_asked(), "checked": False}  # checked: use_pdl has accepted the mode for this process


def use_pdl(mode: int) -> None:
    """Launch the kernels in PDL_MODES[mode] from now on (CUDA graphs captured before keep the launches they
    captured)."""
    if mode not in PDL_MODES:
        raise BadInput("SPECPAIR_PDL", f"{mode} is not one of {', '.join(map(str, PDL_MODES))}")
    if mode:
        import torch

        if not PDL_AVAILABLE:
            raise BadInput("SPECPAIR_PDL", "programmatic dependent launch needs compiled Triton 3.5 or later")
        if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
            raise BadInput("SPECPAIR_PDL", "programmatic dependent launch needs a Hopper or later GPU")
    _pdl["mode"], _pdl["checked"] = mode, True


def pdl_mode() -> int:
    if _pdl["mode"] is None:
        use_pdl(default_pdl_mode())
    return _pdl["mode"]


def launch_options() -> dict:
    """Every kernel launch's options: the launch itself, and the kernel's PDL mode (compiled in: its waits).
    SPECPAIR_PDL's mode is checked at the first launch (use_pdl refuses it where it cannot compile)."""
    mode = pdl_mode()
    if not mode:
        return {"PDL": 0}
    if not _pdl["checked"]:
        use_pdl(mode)
    return {"launch_pdl": True, "PDL": mode}


def require_triton(what: str) -> None:
    if triton is None:
        raise BadInput(what, "needs Triton for CUDA tensors, and it is not installed")


def dot_in_float32(*dtypes) -> bool:
    """Whether tl.dot must take float32 operands (IEEE products) rather than bf16 ones: in the interpreter
    (whose bf16 is wrong), and whenever an operand is not exactly a bf16 value."""
    import torch

    return INTERPRETED or any(dtype != torch.bfloat16 for dtype in dtypes)


def tl_dtype(dtype) -> object:
    """Triton's element type for a torch float dtype (a kernel's constexpr for what it rounds to)."""
    import torch

    return {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


def device_function(fn):
    """@triton.jit for the functions kernels call. Under the interpreter, a plain function: the interpreter
    re-patches triton.language on every call of a jitted helper (some 5 ms each, most of a small kernel's
    run), and the kernel's own launch has patched it already."""
    return fn if INTERPRETED else triton.jit(fn)


if triton is not None:
    _INTERPRETED = tl.constexpr(INTERPRETED)

    if gdc_wait is not None:

        @device_function
        def after_previous_kernel(PDL: tl.constexpr):
            """A kernel's first statement. Launched with PDL: the previous kernel's writes are visible past it,
            and the next kernel may launch once every program of this one has passed it."""
            if PDL > 0:
                gdc_wait()
                gdc_launch_dependents()

    else:

        @device_function
        def after_previous_kernel(PDL: tl.constexpr):
            """No PDL in this Triton: launches are plain (use_pdl refuses to turn it on)."""
            pass

    @device_function
    def prefetch_to_l2(first, nbytes):
        """Ask L2 for `nbytes` [R] bytes from each pointer of `first` [R] (Hopper's bulk prefetch, widened to whole
        16-byte units, which stay inside the allocation: torch's are 512-byte aligned and sized). A hint: it
        changes no value, only where the bytes wait."""
        tl.inline_asm_elementwise(
            """{
            .reg .u64 %start, %end;
            .reg .u32 %size;
            and.b64 %start, $1, -16;
            add.u64 %end, $1, $2;
            add.u64 %end, %end, 15;
            and.b64 %end, %end, -16;
            sub.u64 %end, %end, %start;
            cvt.u32.u64 %size, %end;
            cp.async.bulk.prefetch.L2.global [%start], %size;
            mov.u32 $0, 0;
            }""",
            "=r,l,l",
            [first, nbytes],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @device_function
    def rounded(x, dtype: tl.constexpr):
        """float32 `x` as `dtype`, rounded to nearest even (NaN stays NaN)."""
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            bits = tl.where(x != x, 0x7FC0, bits)
            return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            return x.to(dtype)

    @device_function
    def split_sum(ptr, plane, SPLITS: tl.constexpr, offsets, mask):
        """The float32 sum of a split-K product's partials at `offsets` of each of its SPLITS planes (`plane`
        elements apart), from zero, in split order: every kernel that adds a product's partials adds them here,
        so the sum's bits are the same whichever kernel adds it (linear.SplitSums). The planes' loads are in
        flight together (SPLITS is a constexpr: the loop unrolls)."""
        total = tl.zeros(offsets.shape, tl.float32)
        plane64 = tl.cast(plane, tl.int64)  # not plane.to: a plane of 1 element reaches the kernel as the int 1
        for s in tl.static_range(SPLITS):
            total += tl.load(ptr + s * plane64 + offsets, mask=mask, other=0.0)
        return total

    @device_function
    def summed_values(base, offsets, mask, plane, SPLITS: tl.constexpr, dtype: tl.constexpr):
        """A product's values at `offsets` from `base`: as stored (SPLITS 0), or its SPLITS float32 partials added
        as split_sum adds them and rounded to dtype, the bits linear.SplitSums.summed gives."""
        if SPLITS > 0:
            values = rounded(split_sum(base, plane, SPLITS, offsets, mask), dtype)
        else:
            values = tl.load(base + offsets, mask=mask, other=0.0)
        return values

    @device_function
    def dot(a, b, F32: tl.constexpr):
        """a @ b with float32 accumulation; operands are exact bf16 values unless F32 (see dot_in_float32).

        The interpreter's tl.dot is numpy's BLAS matmul, which treats rows differently by their position in
        the tile (a row's bits change when it moves from slot 0 to slot 8); the GPU's tensor cores treat every
        row alike. So the interpreter sums the products itself, in the same order for every element.
        """
        if _INTERPRETED:
            return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
        elif F32:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))

    @device_function
    def dot3_acc(a, b, acc, F32: tl.constexpr):
        """acc + `dot3`(a, b), accumulated by the dot itself on the GPU."""
        if _INTERPRETED:
            return acc + tl.sum(a.to(tl.float32)[:, :, :, None] * b.to(tl.float32)[:, None, :, :], axis=2)
        elif F32:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)

    @device_function
    def dot3(a, b, F32: tl.constexpr):
        """`dot` of batches: a [B, M, K] @ b [B, K, N], each batch entry as `dot` computes it (on the GPU a
        batched dot, which Triton lowers to the tensor cores' synchronous mma rather than Hopper's wgmma)."""
        if _INTERPRETED:
            return tl.sum(a.to(tl.float32)[:, :, :, None] * b.to(tl.float32)[:, None, :, :], axis=2)
        elif F32:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))

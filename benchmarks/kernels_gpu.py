"""The runtime's kernels (runtime/kernels/) on the GPU at decode shapes: each against its reference, bitwise
batch invariance, and the speed of few-row calls against two baselines measured in the same run: torch's
bf16 `x @ w.T` (cuBLAS) on the same shape, and the device's copy bandwidth (the ceiling for streaming).

    mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/specpair       # the repository root is the package
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/wheels/*.whl   # gguf, for formats/
    PYTHONPATH=/tmp/pkgs:/tmp/site python3 benchmarks/kernels_gpu.py --out benchmarks/results/kernels_gpu.md
    TRITON_INTERPRET=1 python benchmarks/kernels_gpu.py --smoke   # tiny shapes, no timing: the script's logic

--layouts picks matmul layouts (a rerun of a few); --tiles overrides fields of every matmul's tile
configuration (linear.Tiles, e.g. --tiles block_n=128,stages=4) to compare candidates in one run.

Checks (a failed one is printed as FAIL and the exit status is 1):
- matmul in every layout with a Triton kernel (linear.KERNEL_LAYOUTS) on Qwen3-8B's projections (q/o 4096x4096,
  gate/up 12288x4096, down 4096x12288), and matmul_experts in every layout on Qwen3.6-35B-A3B's routed
  experts (256 of [512, 2048] and of [2048, 512], top-8; 32 distinct experts quantized, repeated 8 times in
  memory). K-quants are quantized by round to nearest: faster than the search, and as fast to read. `err` is
  the worst error against the float64 product with Packed.dequantize() over the bound
  1e-5·Σ|x||w| + 2^-7·|y| (a bf16 result rounded once from a float32 sum): <= 1 passes. `bits`: each row
  alone (M=1), in blocks of 4 and 16 and among 64 rows give the same bits (experts: each token alone, 4 and
  16 tokens, and the sorted tile table equal to the in-kernel window). FP8 weights of subnormal codes only
  check that the decode (through bf16 subnormals) keeps them.
- attention (Qwen3.6-35B-A3B: 16 query / 2 KV heads of 256; Qwen3-8B: 32 / 8 of 128) over a 32768-position
  cache against float64, verify blocks of 16 at four depths; `bits`: each query alone and each sequence
  alone vs the batch of 4.
- gdn_recurrent (Qwen3.6: 16 key / 32 value heads of 128) against the CPU reference; `bits`: a verify block of
  16 vs 16 decode steps, each sequence alone vs the batch of 4, and the per-token states.
- rms_norm (4096 wide) and gated_rms_norm (128 wide) against the float64 formula without intermediate
  roundings: the kernels round to bf16 once (zero-centred), twice (plain: x̂, then w·x̂) or three times
  (gated: x̂, w·x̂, then ·silu(gate)), each rounding within half an ulp, 2^-8 relative, so the bound is
  ((1 + 2^-8)^roundings − 1 + 2^-16)·|y| (2^-16 for float32 arithmetic). A bound on the difference from the
  CPU reference would not hold: where the GPU's float32 x̂ differs from the CPU's in its last bits (sum order,
  rsqrt), a rounding can go the other way and the difference compounds through the later roundings.

Speed, per call, from CUDA graphs of calls that rotate over enough copies of the weights (cache, state) to
defeat the L2 (autotuning off: one tile configuration per weight shape, linear._config): bytes of weights
read / time for M = 1, 4, 16 rows (tokens), its ratio to the copy bandwidth, and torch bf16's time over the
kernel's (x @ w.T on the same [N, K]; for experts on the touched experts' rows stacked, the same rows read in
bf16). The copy bandwidth is (bytes read + written) / time of a 1 GiB device-to-device copy, the better of
torch's copy_ and a Triton copy kernel, timed with CUDA events over 20 copies.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
import time
from dataclasses import dataclass, field, replace

import torch
import triton
import triton.language as tl

from specpair.formats.codecs import codec
from specpair.formats.packed import Packed
from specpair.runtime.kernels import attention, gdn, linear, norm

L2_BYTES = 60 << 20  # an H200 has 50 MB of L2; rotating over 4x this reads from HBM
COPY_BYTES = 1 << 30
FULL = {
    "projections": [("q/o_proj", 4096, 4096), ("gate/up_proj", 12288, 4096), ("down_proj", 4096, 12288)],
    "experts": [("experts gate/up", 256, 512, 2048), ("experts down", 256, 2048, 512)],
    "distinct": 32,
    "attention": [("Qwen3.6 full attn", 16, 2, 256), ("Qwen3-8B attn", 32, 8, 128)],
    "cache": 32768,
    "depths": [100, 4000, 20000, 32752],
    "decode_depths": [4096, 32768],
    "gdn": (16, 32, 128, 128),
    "norm": (4096, 32, 128),
}
SMOKE = {
    "projections": [("small", 72, 512)],
    "experts": [("experts", 12, 128, 256)],
    "distinct": 4,
    "attention": [("attn", 4, 2, 32)],
    "cache": 300,
    "depths": [3, 60, 200, 280],
    "decode_depths": [128],
    "gdn": (2, 4, 32, 48),
    "norm": (96, 4, 64),
}
SMOKE_LAYOUTS = ["bf16", "fp8-block", "nvfp4-modelopt", "gguf-Q8_0"]  # the interpreter is slow: --layouts for others
ROWS = (1, 4, 16)
TOP_K = 8


@dataclass
class Speed:
    label: str
    seconds: float
    nbytes: float
    baseline: float | None = None  # torch bf16's seconds for the same call


@dataclass
class Row:
    kernel: str
    case: str
    layout: str
    err: float = float("nan")  # worst error / bound
    bits: bool = True
    speeds: list[Speed] = field(default_factory=list)
    tiles: str = "-"  # the matmul's tile configuration
    checked: bool = True  # False for a baseline's row: nothing to check

    @property
    def ok(self) -> bool:
        return not self.checked or (self.err <= 1.0 and self.bits)

    def verdict(self, bold: bool = False) -> tuple[str, str]:
        if not self.checked:
            return "-", "-"
        return f"{self.err:.3f}", "yes" if self.bits else "**NO**" if bold else "NO"


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, mask=i < n), mask=i < n)


class Bench:
    def __init__(self, device: str, timing: bool) -> None:
        self.device = device
        self.timing = timing
        self.copies = self.copy_bandwidths() if timing else {}
        self.copy = max(self.copies.values(), default=float("nan"))

    def seconds_per_call(self, fn, calls: int) -> float:
        """fn(i) for i < calls, captured in a CUDA graph and replayed: the best of 5 replays, per call."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (and compilation) off the capture, as torch's graph docs do
            for i in range(calls):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(i)
        best = math.inf
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / calls)
        del graph
        return best

    def copy_bandwidths(self) -> dict[str, float]:
        """(bytes read + written) / time of a 1 GiB copy, plainly launched (no graph), over 20 copies after
        3 of warm-up, by torch's copy_ (cudaMemcpyAsync) and by a Triton copy kernel."""
        src = torch.randint(0, 1 << 30, (COPY_BYTES // 4,), dtype=torch.int32, device=self.device)
        dst = torch.empty_like(src)
        block = 4096
        ways = {
            "torch copy_": lambda: dst.copy_(src),
            "triton copy": lambda: _copy_kernel[(triton.cdiv(src.numel(), block),)](
                src, dst, src.numel(), BLOCK=block, num_warps=8
            ),
        }
        rates = {}
        for name, fn in ways.items():
            for _ in range(3):
                fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                fn()
            end.record()
            end.synchronize()
            rates[name] = 2 * COPY_BYTES * 20 / (start.elapsed_time(end) / 1e3)
            assert torch.equal(dst, src), f"{name} did not copy"
        return rates

    def speed(self, label: str, fn, nbytes: float, copies: int) -> Speed:
        seconds = self.seconds_per_call(fn, max(16, copies)) if self.timing else float("nan")
        return Speed(label, seconds, nbytes)


def copies_for(nbytes: int) -> int:
    return max(1, min(64, math.ceil(4 * L2_BYTES / max(nbytes, 1))))


def clone(w: torch.Tensor | Packed) -> torch.Tensor | Packed:
    if isinstance(w, Packed):
        return Packed(w.name, w.layout, w.shape, {k: v.clone() for k, v in w.parts.items()}, w.col_order)
    return w.clone()


DENSE = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def encoder(layout: str):
    """The layout's quantizer; K-quants round to nearest (the search only changes which codes are written)."""
    return codec(layout, "rtn" if layout.endswith("_K") else None)


def weight(layout: str, w: torch.Tensor, name: str = "model.layers.0.mlp.up_proj.weight") -> torch.Tensor | Packed:
    """Dense layouts as plain tensors (as a model holds them), the others as the project's quantizers store them."""
    if layout in DENSE:
        return w.to(DENSE[layout])
    return Packed(name, layout, tuple(w.shape), encoder(layout).encode(w, name))


def expert_stack(layout: str, w: torch.Tensor, experts: int) -> torch.Tensor | Packed:
    """[experts, N, K] from the distinct experts w [D, N, K], repeated in memory (every expert its own bytes).
    Experts with their own per-tensor scales are quantized one by one; the layouts whose rows (FP8's 128-row
    tiles) quantize independently as one [D·N, K] matrix, reshaped."""
    name = "model.layers.0.mlp.experts.gate_proj.weight"
    distinct, repeats = w.shape[0], experts // w.shape[0]
    if layout in DENSE:
        return w.to(DENSE[layout]).repeat(repeats, 1, 1)
    if encoder(layout).tensor_amax:
        ones = [encoder(layout).encode(w[e], name) for e in range(distinct)]
        parts = {k: torch.stack([p[k] for p in ones]) for k in ones[0]}
    else:
        flat = encoder(layout).encode(w.reshape(-1, w.shape[-1]), name)
        parts = {k: v.reshape(distinct, v.shape[0] // distinct, *v.shape[1:]) for k, v in flat.items()}
    parts = {k: v.repeat(repeats, *[1] * (v.ndim - 1)) for k, v in parts.items()}
    return Packed(name, layout, (experts, *w.shape[1:]), parts)


def dequantized(w: torch.Tensor | Packed) -> torch.Tensor:
    return w.dequantize() if isinstance(w, Packed) else w.float()


def error_over_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    """Worst |y − x·wᵀ| / (1e-5·|x|·|w|ᵀ + 2^-7·|x·wᵀ|), in float64, over row chunks of w."""
    worst = 0.0
    xd = x.double()
    for n0 in range(0, w.shape[0], 16384):
        wd = w[n0 : n0 + 16384].double()
        exact = xd @ wd.T
        bound = 1e-5 * (xd.abs() @ wd.abs().T) + 2.0**-7 * exact.abs() + 1e-30
        worst = max(worst, ((y[:, n0 : n0 + 16384].double() - exact).abs() / bound).max().item())
    return worst


def torch_bf16(bench: Bench, n: int, k: int, rows: tuple[int, ...] = ROWS) -> dict[int, float]:
    """Seconds per call of torch's x @ w.T in bf16 for each row count: the named baseline."""
    if not bench.timing:
        return {}
    w = torch.randn(n, k, device=bench.device).bfloat16()
    copies = [w] + [w.clone() for _ in range(copies_for(w.numel() * 2) - 1)]
    x = torch.randn(max(rows), k, device=bench.device).bfloat16()
    seconds = {}
    for m in rows:
        xm = x[:m].clone()
        seconds[m] = bench.seconds_per_call(lambda i, xm=xm: xm @ copies[i % len(copies)].T, max(16, len(copies)))
    return seconds


def baseline_row(case: str, n: int, k: int, seconds: dict[int, float]) -> Row:
    """torch's own row: the bf16 weight's bytes over its time."""
    return Row(
        "torch x @ w.T",
        f"{case} {n}x{k}",
        "bf16",
        speeds=[Speed(f"M={m}", seconds.get(m, float("nan")), 2 * n * k, seconds.get(m)) for m in ROWS],
        checked=False,
    )


def tiles_for(w: torch.Tensor | Packed, overrides: dict[str, int]) -> linear.Tiles:
    return replace(linear.tiles_of(w), **overrides)


def tiles_label(t: linear.Tiles) -> str:
    return f"{t.block_n}x{t.step}/{t.splits} w{t.warps} s{t.stages}"


def bench_projection(
    bench: Bench, case: str, n: int, k: int, layout: str, baseline: dict[int, float], overrides: dict[str, int]
) -> Row:
    torch.manual_seed(n + k)
    w = weight(layout, torch.randn(n, k, device=bench.device) * 0.02)
    tiles = tiles_for(w, overrides)

    def mm(x: torch.Tensor, w: torch.Tensor | Packed) -> torch.Tensor:
        return linear.matmul_triton(x, w, tiles)

    x = torch.randn(64, k, device=bench.device).bfloat16()
    y64 = mm(x, w)
    y16 = mm(x[:16], w)
    bits = torch.equal(y64[:16], y16) and torch.equal(mm(x[:4], w), y16[:4])
    bits = bits and all(torch.equal(mm(x[i : i + 1], w)[0], y16[i]) for i in range(16))
    row = Row(
        "matmul", f"{case} {n}x{k}", layout, error_over_bound(y64, x, dequantized(w)), bits, tiles=tiles_label(tiles)
    )
    copies = [w] + [clone(w) for _ in range(copies_for(w.nbytes) - 1)]
    for m in ROWS:
        xm = x[:m].clone()
        speed = bench.speed(f"M={m}", lambda i, xm=xm: mm(xm, copies[i % len(copies)]), w.nbytes, len(copies))
        speed.baseline = baseline.get(m)
        row.speeds.append(speed)
    return row


def bench_fp8_subnormals(bench: Bench, layout: str) -> Row:
    """E4M3 codes with a zero exponent only (|value| < 2^-6, every sign), which the kernel decodes through
    bf16 subnormals: a flush to zero would lose them, too small among normal codes for `err` to notice."""
    torch.manual_seed(8)
    n, k, dev = 256, 512, bench.device
    codes = torch.randint(0, 8, (n, k), dtype=torch.uint8, device=dev)
    codes |= torch.randint(0, 2, (n, k), dtype=torch.uint8, device=dev) << 7
    base = weight(layout, torch.randn(n, k, device=dev))
    w = Packed(base.name, layout, base.shape, {**base.parts, ".weight": codes.view(torch.float8_e4m3fn)})
    x = torch.randn(16, k, device=dev).bfloat16()
    y = linear.matmul_triton(x, w)
    bits = all(torch.equal(linear.matmul_triton(x[i : i + 1], w)[0], y[i]) for i in (0, 15))
    return Row(
        "matmul",
        f"subnormal codes {n}x{k}",
        layout,
        error_over_bound(y, x, w.dequantize()),
        bits,
        tiles=tiles_label(linear.tiles_of(w)),
    )


def routings(tokens: int, experts: int, count: int, device: str) -> list[torch.Tensor]:
    return [torch.rand(tokens, experts, device=device).argsort(-1)[:, :TOP_K].contiguous() for _ in range(count)]


def bench_experts(
    bench: Bench, case: str, experts: int, n: int, k: int, layout: str, distinct: int, overrides: dict[str, int]
) -> Row:
    torch.manual_seed(experts + n)
    w = expert_stack(layout, torch.randn(distinct, n, k, device=bench.device) * 0.02, experts)
    tiles = tiles_for(w, overrides)

    def mm(x: torch.Tensor, ids: torch.Tensor, window: bool | None = None) -> torch.Tensor:
        return linear.matmul_experts_triton(x, w, ids, tiles, window)

    x = torch.randn(16, k, device=bench.device).bfloat16()
    ids = routings(16, experts, 1, bench.device)[0]
    y = mm(x, ids)
    bits = torch.equal(mm(x, ids, window=False), y) and torch.equal(mm(x[:4], ids[:4]), y[:4])
    bits = bits and all(torch.equal(mm(x[t : t + 1], ids[t : t + 1])[0], y[t]) for t in range(16))
    first = {e: dequantized(w.expert(e) if isinstance(w, Packed) else w[e]) for e in range(distinct)}
    err = max(
        error_over_bound(y[t, s : s + 1], x[t : t + 1], first[int(ids[t, s]) % distinct])
        for t in range(16)
        for s in range(ids.shape[1])
    )
    row = Row("matmul_experts", f"{case} {experts}x{n}x{k}", layout, err, bits, tiles=tiles_label(tiles))
    per_expert = w.nbytes / experts
    for tokens in ROWS:
        routes = routings(tokens, experts, 16, bench.device)
        touched = sum(r.unique().numel() for r in routes) / len(routes)
        xt = x[:tokens].clone()
        speed = bench.speed(
            f"T={tokens}", lambda i, xt=xt, routes=routes: mm(xt, routes[i % len(routes)]), touched * per_expert, 16
        )
        if bench.timing:  # torch bf16 reading the same expert rows: x @ w.T over the touched experts stacked
            speed.baseline = torch_bf16(bench, round(touched) * n, k, (tokens,))[tokens]
        row.speeds.append(speed)
    return row


def attention_exact(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, end: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention in float64, sequence by sequence (q [B, T, Hq, D], rows attending to 0 <= p < end),
    and Σ p·|v|, the scale of the error that bf16 probabilities bring."""
    group = q.shape[2] // k.shape[2]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    magnitude = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b in range(q.shape[0]):
        top = int(end[b].max())
        keys = k[b, :top].double().repeat_interleave(group, 1).transpose(0, 1)  # [Hq, L, D]
        values = v[b, :top].double().repeat_interleave(group, 1).transpose(0, 1)
        scores = q[b].double().transpose(0, 1) @ keys.transpose(1, 2) * scale  # [Hq, T, L]
        inside = torch.arange(top, device=q.device)[None, :] < end[b][:, None]
        probs = torch.softmax(scores.masked_fill(~inside[None], float("-inf")), -1)
        out[b] = (probs @ values).transpose(0, 1)
        magnitude[b] = (probs @ values.abs()).transpose(0, 1)
    return out, magnitude


def bench_attention(bench: Bench, case: str, q_heads: int, kv_heads: int, head_dim: int, shapes: dict) -> Row:
    torch.manual_seed(q_heads + head_dim)
    dev, cache, depths = bench.device, shapes["cache"], shapes["depths"]
    k = torch.randn(len(depths), cache, kv_heads, head_dim, device=dev).bfloat16()
    v = torch.randn(len(depths), cache, kv_heads, head_dim, device=dev).bfloat16()
    q = torch.randn(len(depths), 16, q_heads, head_dim, device=dev).bfloat16()
    pos = torch.tensor(depths, device=dev)[:, None] + torch.arange(16, device=dev)[None, :]
    start, end = torch.zeros_like(pos).int(), (pos + 1).clamp_max(cache).int()
    scale = head_dim**-0.5
    out = attention.attention_triton(q, k, v, start, end, scale)
    exact, magnitude = attention_exact(q, k, v, end, scale)
    err = ((out.double() - exact).abs() / (2.0**-7 * magnitude + 2.0**-8 * exact.abs())).max().item()

    def alone(b: int, t: slice) -> torch.Tensor:
        one = slice(b, b + 1)
        return attention.attention_triton(q[one, t], k[one], v[one], start[one, t], end[one, t], scale)[0]

    bits = all(torch.equal(alone(b, slice(t, t + 1))[0], out[b, t]) for b in range(len(depths)) for t in range(16))
    bits = bits and all(torch.equal(alone(b, slice(0, 16)), out[b]) for b in range(len(depths)))
    row = Row("attention", f"{case} {q_heads}/{kv_heads}x{head_dim}", "bf16", err, bits)
    for depth in shapes["decode_depths"]:
        kv_bytes = 2 * depth * kv_heads * head_dim * 2
        caches = [
            tuple(torch.randn(1, depth, kv_heads, head_dim, device=dev).bfloat16() for _ in "kv")
            for _ in range(copies_for(kv_bytes))
        ]
        for tokens in (1, 16):
            qt = q[:1, :tokens].clone()
            p = depth - tokens + torch.arange(tokens, device=dev)[None, :]
            s, e = torch.zeros_like(p).int(), (p + 1).int()

            def call(i: int, qt=qt, caches=caches, s=s, e=e) -> torch.Tensor:
                return attention.attention_triton(qt, *caches[i % len(caches)], s, e, scale)

            row.speeds.append(bench.speed(f"ctx {depth} T={tokens}", call, kv_bytes, len(caches)))
    return row


def bench_gdn(bench: Bench, shapes: dict) -> Row:
    key_heads, value_heads, key_dim, value_dim = shapes["gdn"]
    dev, batch, tokens = bench.device, 4, 16
    torch.manual_seed(key_dim)
    q = torch.randn(batch, tokens, key_heads, key_dim, device=dev).bfloat16()
    k = torch.randn(batch, tokens, key_heads, key_dim, device=dev).bfloat16()
    v = torch.randn(batch, tokens, value_heads, value_dim, device=dev).bfloat16()
    g = -torch.nn.functional.softplus(torch.randn(batch, tokens, value_heads, device=dev))
    beta = torch.sigmoid(torch.randn(batch, tokens, value_heads, device=dev)).bfloat16()
    state0 = torch.randn(batch, value_heads, key_dim, value_dim, device=dev) * 0.1

    def run(b: slice, t: slice, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        steps = torch.empty(state.shape[0], t.stop - t.start, *state.shape[1:], device=dev)
        out = gdn.gdn_recurrent_triton(q[b, t], k[b, t], v[b, t], g[b, t], beta[b, t], state, steps)
        return out, state, steps

    out, state, steps = run(slice(0, batch), slice(0, tokens), state0.clone())
    ref_state = state0.cpu().clone()
    ref_steps = torch.empty(steps.shape)
    ref = gdn.gdn_recurrent_reference(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), ref_state, ref_steps)
    ref = ref.float()
    err = max(
        ((out.cpu().float() - ref).abs() / (1e-3 * ref.abs().amax() + 2.0**-7 * ref.abs())).max().item(),
        ((steps.cpu() - ref_steps).abs() / (1e-4 * ref_steps.abs().amax())).max().item(),
    )
    bits = torch.equal(steps[:, -1], state)
    decoded = state0.clone()
    for i in range(tokens):
        o, decoded, s = run(slice(0, batch), slice(i, i + 1), decoded)
        bits = bits and torch.equal(o[:, 0], out[:, i]) and torch.equal(s[:, 0], steps[:, i])
    for b in range(batch):
        o, st, s = run(slice(b, b + 1), slice(0, tokens), state0[b : b + 1].clone())
        bits = bits and torch.equal(o[0], out[b]) and torch.equal(st[0], state[b]) and torch.equal(s[0], steps[b])
    row = Row("gdn_recurrent", f"Qwen3.6 GDN {key_heads}/{value_heads}x{key_dim}", "fp32 state", err, bits)
    state_bytes = value_heads * key_dim * value_dim * 4
    states = [state0[:1].clone() for _ in range(copies_for(state_bytes))]
    for t in (1, 16):
        args = [a[:1, :t].clone() for a in (q, k, v, g, beta)]
        per_token = torch.empty(1, t, value_heads, key_dim, value_dim, device=dev)
        row.speeds.append(
            bench.speed(
                f"T={t}",
                lambda i, args=args, per_token=per_token: gdn.gdn_recurrent_triton(
                    *args, states[i % len(states)], per_token
                ),
                state_bytes * (2 + t),
                len(states),
            )
        )
    return row


def norm_error(y: torch.Tensor, exact: torch.Tensor, roundings: int) -> float:
    """Worst |y − exact| over ((1 + 2^-8)^roundings − 1 + 2^-16)·|exact|: each rounding to bf16 errs by at most
    half an ulp (2^-8 relative), and float32 arithmetic (the sum of squares, rsqrt, exp) by far less."""
    bound = ((1 + 2.0**-8) ** roundings - 1 + 2.0**-16) * exact.abs() + 1e-30
    return ((y.double() - exact).abs() / bound).max().item()


def bench_norms(bench: Bench, shapes: dict) -> list[Row]:
    width, heads, head_width = shapes["norm"]
    torch.manual_seed(width)
    rows = []
    x = torch.randn(64, width, device=bench.device).bfloat16()
    w = (torch.randn(width, device=bench.device) * 0.1).bfloat16()
    xd = x.double()
    normed = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    for zero_centred in (True, False):
        y = norm.rms_norm_triton(x, w, 1e-6, zero_centred)
        exact = normed * (1 + w.double()) if zero_centred else w.double() * normed
        err = norm_error(y, exact, 1 if zero_centred else 2)
        bits = all(torch.equal(norm.rms_norm_triton(x[i : i + 1], w, 1e-6, zero_centred)[0], y[i]) for i in (0, 17, 63))
        rows.append(Row("rms_norm", f"{64}x{width}", "zero-centred" if zero_centred else "plain", err, bits))
    xg = torch.randn(64 * heads, head_width, device=bench.device).bfloat16()
    gate = torch.randn(64 * heads, head_width, device=bench.device).bfloat16()
    wg = torch.randn(head_width, device=bench.device).bfloat16()
    y = norm.gated_rms_norm_triton(xg, gate, wg, 1e-6)
    xd = xg.double()
    normed = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    exact = wg.double() * normed * torch.nn.functional.silu(gate.double())
    bits = all(
        torch.equal(norm.gated_rms_norm_triton(xg[i : i + 1], gate[i : i + 1], wg, 1e-6)[0], y[i]) for i in (0, 100)
    )
    rows.append(Row("gated_rms_norm", f"{64 * heads}x{head_width}", "plain w", norm_error(y, exact, 3), bits))
    return rows


def cells(speed: Speed, copy: float) -> list[str]:
    """GB/s, its ratio to the copy bandwidth, torch bf16's time over this one, and the time per call."""
    if math.isnan(speed.seconds):
        return ["-"] * 4
    rate = speed.nbytes / speed.seconds
    versus = f"{speed.baseline / speed.seconds:.2f}" if speed.baseline else "-"
    return [f"{rate / 1e9:.0f}", f"{rate / copy:.2f}", versus, f"{speed.seconds * 1e6:.1f}"]


def matmul_table(rows: list[Row], copy: float) -> list[str]:
    head = ["kernel", "case", "layout", "tiles", "err", "bits"]
    for m in ROWS:
        head += [f"M={m} GB/s", "/copy", "vs bf16", "µs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        fields = [row.kernel, row.case, row.layout, row.tiles, *row.verdict(bold=True)]
        for speed in row.speeds:
            fields += cells(speed, copy)
        fields += ["-"] * (len(head) - len(fields))
        lines.append("| " + " | ".join(fields) + (" **FAIL** |" if not row.ok else " |"))
    return lines


def other_table(rows: list[Row], copy: float) -> list[str]:
    lines = ["| kernel | case | layout | err | bits | speeds: GB/s, /copy, µs |", "|---|---|---|---|---|---|"]
    for row in rows:
        speeds = "; ".join(f"{s.label}: {c[0]} GB/s {c[1]} {c[3]} µs" for s in row.speeds for c in [cells(s, copy)])
        err, bits = row.verdict(bold=True)
        lines.append(
            f"| {row.kernel} | {row.case} | {row.layout} | {err} | {bits} "
            f"| {speeds or '-'}{' **FAIL**' if not row.ok else ''} |"
        )
    return lines


def print_row(row: Row, copy: float, elapsed: float) -> None:
    speeds = " | ".join(
        f"{s.label} {c[0]:>5} GB/s {c[1]:>4} x{c[2]:>4} {c[3]:>7}us" for s in row.speeds for c in [cells(s, copy)]
    )
    err, bits = row.verdict()
    print(
        f"{row.kernel:<15} {row.case:<30} {row.layout:<15} {row.tiles:<18} {err:>6} {bits:<4} "
        f"{speeds}{'' if row.ok else '  FAIL'}  [{elapsed:.0f}s]",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and no timing: checks the script itself")
    parser.add_argument(
        "--layouts",
        help="comma-separated matmul layouts (default: every one in linear.KERNEL_LAYOUTS; with --smoke, four of them)",
    )
    parser.add_argument(
        "--tiles",
        default="",
        help="matmul tile fields to override, e.g. block_n=128,stages=4 "
        "(the others, splits included, keep each weight's own)",
    )
    parser.add_argument("--out", help="write the results as markdown to this path")
    args = parser.parse_args()
    shapes = SMOKE if args.smoke else FULL
    layouts = args.layouts.split(",") if args.layouts else SMOKE_LAYOUTS if args.smoke else list(linear.KERNEL_LAYOUTS)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    began = time.perf_counter()
    bench = Bench(device, timing=device == "cuda" and not args.smoke)
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    copies = ", ".join(f"{k} {v / 1e12:.2f} TB/s" for k, v in bench.copies.items()) or "not measured"
    header = (
        f"{name}: torch {torch.__version__}, triton {triton.__version__}; copy bandwidth (bytes read + "
        f"written / time, 1 GiB, 20 copies): {copies}; ceiling {bench.copy / 1e12:.2f} TB/s"
    )
    print(f"# kernels on {header}")
    print(
        "speeds per M: GB/s of weights (KV, state) read, its ratio to the copy ceiling, torch bf16 x @ w.T's time "
        "over the kernel's, time per call\n"
    )
    rows: list[Row] = []

    def report(result: Row | list[Row]) -> None:
        for row in result if isinstance(result, list) else [result]:
            rows.append(row)
            print_row(row, bench.copy, time.perf_counter() - began)
        if device == "cuda":
            torch.cuda.empty_cache()

    overrides = {key: int(value) for key, value in (kv.split("=") for kv in args.tiles.split(",") if kv)}
    for case, n, k in shapes["projections"]:
        baseline = torch_bf16(bench, n, k)
        report(baseline_row(case, n, k, baseline))
        for layout in layouts:
            report(bench_projection(bench, case, n, k, layout, baseline, overrides))
    for layout in [layout for layout in layouts if layout.startswith("fp8")]:
        report(bench_fp8_subnormals(bench, layout))
    for case, experts, n, k in shapes["experts"]:
        for layout in layouts:
            report(bench_experts(bench, case, experts, n, k, layout, shapes["distinct"], overrides))
    for case in shapes["attention"]:
        report(bench_attention(bench, *case, shapes))
    report(bench_gdn(bench, shapes))
    report(bench_norms(bench, shapes))
    failed = sum(not row.ok for row in rows)
    print(f"\n{'all checks passed' if not failed else f'{failed} FAILED'} in {time.perf_counter() - began:.0f} s")
    if args.out:
        matmuls = [r for r in rows if r.kernel.startswith(("matmul", "torch"))]
        lines = [
            "# Runtime kernels on one GPU (benchmarks/kernels_gpu.py)",
            "",
            f"{datetime.date.today()}, {header}.",
            "",
            f"Command: `python3 benchmarks/kernels_gpu.py {' '.join(sys.argv[1:])}`; "
            f"{'all checks passed' if not failed else f'{failed} FAILED'}; {time.perf_counter() - began:.0f} s.",
            "",
            "tiles: weight rows per program x K values per step / splits of K, warps, pipeline stages. "
            "err: worst error over its bound (<= 1 passes; the bounds are in the script's docstring); bits: "
            "bitwise batch invariance. Per M (rows, or tokens for experts): GB/s of weights read, its ratio to "
            "the copy ceiling, torch bf16 x @ w.T's time over the kernel's (> 1: faster than torch), µs per call.",
            "",
            *matmul_table(matmuls, bench.copy),
            "",
            *other_table([r for r in rows if r not in matmuls], bench.copy),
            "",
        ]
        with open(args.out, "w") as f:
            f.write("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

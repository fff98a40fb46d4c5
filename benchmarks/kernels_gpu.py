"""The runtime's kernels (runtime/kernels/) on the GPU at real shapes: each against its reference, bitwise
batch invariance, and the effective bandwidth of few-row calls against the device's copy bandwidth measured
in the same run.

    mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/specpair       # the repository root is the package
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/wheels/*.whl   # gguf, for formats/
    PYTHONPATH=/tmp/pkgs:/tmp/site python3 benchmarks/kernels_gpu.py
    TRITON_INTERPRET=1 python benchmarks/kernels_gpu.py --smoke   # tiny shapes: the script's logic, on any machine

Checks (a failed one is printed as FAIL and the exit status is 1):
- matmul on Qwen3-8B's projections (4096x4096, 12288x4096) in every layout with a kernel, and lm_head
  (248320x2048) in BF16, NVFP4 and Q6_K; matmul_experts on Qwen3.6-35B-A3B's routed experts (256 of
  [512, 2048] and of [2048, 512], top-8) in the layouts its checkpoints use. `err` is the worst error against
  the float64 product with Packed.dequantize() over the bound 1e-5·Σ|x||w| + 2^-7·|y| (a bf16 result rounded
  once from a float32 sum): <= 1 passes. `bits` is whether each row alone (M=1), in a verify block (M=16) and
  among 64 rows (or each token alone and in a block of 16 tokens) gives the same bits.
- attention (Qwen3.6-35B-A3B: 16 query / 2 KV heads of 256; Qwen3-8B: 32 / 8 of 128) over a 32768-position
  cache, against float64, with verify blocks of 16 at four depths; `bits`: each query alone and each sequence
  alone vs the batch of 4.
- gdn_recurrent (Qwen3.6: 16 key / 32 value heads of 128) against the CPU reference; `bits`: a verify block of
  16 vs 16 decode steps, each sequence alone vs the batch of 4, and the per-token states.
- rms_norm (4096 wide) and gated_rms_norm (128 wide) against the CPU reference.
Speed, per call, from CUDA graphs of calls that rotate over enough copies of the weights (cache, state) to
defeat the L2: bytes of weights read / time for M = 1, 4, 16 rows (tokens), and its ratio to the copy
bandwidth (a 2 GiB torch copy_: bytes read + written / time). Attention counts the KV bytes of the range
read, GDN the state read and written (and the per-token states).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from dataclasses import dataclass, field

import torch
import triton

from specpair.formats.codecs import codec
from specpair.formats.packed import Packed
from specpair.runtime.kernels import attention, gdn, linear, norm

L2_BYTES = 60 << 20  # an H200 has 50 MB of L2; rotating over 4x this reads from HBM
FULL = {
    "projections": [("q/o_proj", 4096, 4096), ("gate/up_proj", 12288, 4096), ("lm_head", 248320, 2048)],
    "experts": [("experts gate/up", 256, 512, 2048), ("experts down", 256, 2048, 512)],
    "attention": [("Qwen3.6 full attn", 16, 2, 256), ("Qwen3-8B attn", 32, 8, 128)],
    "cache": 32768, "depths": [100, 4000, 20000, 32752], "decode_depths": [4096, 32768],
    "gdn": (16, 32, 128, 128), "norm": (4096, 32, 128),
}
SMOKE = {
    "projections": [("small", 72, 512), ("lm_head", 200, 256)],
    "experts": [("experts", 10, 128, 256)],
    "attention": [("attn", 4, 2, 32)],
    "cache": 300, "depths": [3, 60, 200, 280], "decode_depths": [128],
    "gdn": (2, 4, 32, 48), "norm": (96, 4, 64),
}
LAYOUTS = ["bf16", "f16", "fp8-tensor", "fp8-block", "nvfp4-modelopt", "affine4-g64", "affine8-g64",
           "gguf-Q8_0", "gguf-Q4_K", "gguf-Q5_K", "gguf-Q6_K"]
LM_HEAD_LAYOUTS = ["bf16", "nvfp4-modelopt", "gguf-Q6_K"]
EXPERT_LAYOUTS = ["bf16", "fp8-block", "nvfp4-modelopt", "affine4-g64", "gguf-Q4_K"]
TOP_K = 8


@dataclass
class Row:
    kernel: str
    case: str
    layout: str
    err: float = float("nan")  # worst error / bound
    bits: bool = True
    speeds: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.err <= 1.0 and self.bits


class Bench:
    def __init__(self, device: str, timing: bool) -> None:
        self.device = device
        self.timing = timing
        self.copy = self.copy_bandwidth() if timing else float("nan")

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

    def copy_bandwidth(self) -> float:
        src = torch.empty(2 << 30, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        seconds = self.seconds_per_call(lambda i: dst.copy_(src), 4)
        return 2 * src.numel() / seconds

    def speed(self, fn, bytes_per_call: float, copies: int) -> str:
        if not self.timing:
            return "-"
        seconds = self.seconds_per_call(fn, max(16, copies))
        rate = bytes_per_call / seconds
        return f"{rate / 1e12:5.2f} TB/s {rate / self.copy:4.2f} {seconds * 1e6:7.1f}us"


def copies_for(nbytes: int) -> int:
    return max(1, min(64, math.ceil(4 * L2_BYTES / max(nbytes, 1))))


def nbytes(w: torch.Tensor | Packed) -> int:
    parts = w.parts.values() if isinstance(w, Packed) else [w]
    return sum(p.numel() * p.element_size() for p in parts)


def clone(w: torch.Tensor | Packed) -> torch.Tensor | Packed:
    if isinstance(w, Packed):
        return Packed(w.name, w.layout, w.shape, {k: v.clone() for k, v in w.parts.items()}, w.col_order)
    return w.clone()


def weight(layout: str, w: torch.Tensor, name: str = "model.layers.0.mlp.up_proj.weight") -> torch.Tensor | Packed:
    """Dense layouts as plain tensors (as a model holds them), the others as the project's quantizers store them."""
    if layout in ("bf16", "f16"):
        return w.to(torch.bfloat16 if layout == "bf16" else torch.float16)
    return Packed(name, layout, tuple(w.shape), codec(layout).encode(w, name))


def expert_stack(layout: str, w: torch.Tensor) -> torch.Tensor | Packed:
    """[E, N, K]: experts with their own per-tensor scales are quantized one by one; the layouts whose rows
    (FP8's 128-row tiles) quantize independently as one [E·N, K] matrix, reshaped."""
    name = "model.layers.0.mlp.experts.gate_proj.weight"
    experts = w.shape[0]
    if layout == "bf16":
        return w.to(torch.bfloat16)
    if codec(layout).tensor_amax:
        ones = [codec(layout).encode(w[e], name) for e in range(experts)]
        parts = {k: torch.stack([p[k] for p in ones]) for k in ones[0]}
    else:
        flat = codec(layout).encode(w.reshape(-1, w.shape[-1]), name)
        parts = {k: v.reshape(experts, v.shape[0] // experts, *v.shape[1:]) for k, v in flat.items()}
    return Packed(name, layout, tuple(w.shape), parts)


def dequantized(w: torch.Tensor | Packed) -> torch.Tensor:
    return w.dequantize() if isinstance(w, Packed) else w.float()


def error_over_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    """Worst |y − x·wᵀ| / (1e-5·|x|·|w|ᵀ + 2^-7·|x·wᵀ|), in float64, over column chunks of w."""
    worst = 0.0
    xd = x.double()
    for n0 in range(0, w.shape[0], 16384):
        wd = w[n0:n0 + 16384].double()
        exact = xd @ wd.T
        bound = 1e-5 * (xd.abs() @ wd.abs().T) + 2.0 ** -7 * exact.abs() + 1e-30
        worst = max(worst, ((y[:, n0:n0 + 16384].double() - exact).abs() / bound).max().item())
    return worst


def bench_projection(bench: Bench, case: str, n: int, k: int, layout: str) -> Row:
    torch.manual_seed(n + k)
    w = weight(layout, torch.randn(n, k, device=bench.device) * 0.02)
    x = torch.randn(64, k, device=bench.device).bfloat16()
    y64 = linear.matmul_triton(x, w)
    y16 = linear.matmul_triton(x[:16], w)
    bits = torch.equal(y64[:16], y16) and torch.equal(linear.matmul_triton(x[:4], w), y16[:4])
    bits = bits and all(torch.equal(linear.matmul_triton(x[i:i + 1], w)[0], y16[i]) for i in range(16))
    row = Row("matmul", f"{case} {n}x{k}", layout, error_over_bound(y64, x, dequantized(w)), bits)
    copies = [w] + [clone(w) for _ in range(copies_for(nbytes(w)) - 1)]
    for m in (1, 4, 16):
        xm = x[:m].clone()
        row.speeds.append(bench.speed(lambda i: linear.matmul_triton(xm, copies[i % len(copies)]), nbytes(w),
                                      len(copies)))
    return row


def routings(tokens: int, experts: int, count: int, device: str) -> list[torch.Tensor]:
    return [torch.rand(tokens, experts, device=device).argsort(-1)[:, :TOP_K].contiguous() for _ in range(count)]


def bench_experts(bench: Bench, case: str, experts: int, n: int, k: int, layout: str) -> Row:
    torch.manual_seed(experts + n)
    w = expert_stack(layout, torch.randn(experts, n, k, device=bench.device) * 0.02)
    x = torch.randn(16, k, device=bench.device).bfloat16()
    ids = routings(16, experts, 1, bench.device)[0]
    y = linear.matmul_experts_triton(x, w, ids)
    bits = torch.equal(linear.matmul_experts_triton(x[:4], w, ids[:4]), y[:4])
    bits = bits and all(torch.equal(linear.matmul_experts_triton(x[t:t + 1], w, ids[t:t + 1])[0], y[t])
                        for t in range(16))
    touched = {e: dequantized(w.expert(e) if isinstance(w, Packed) else w[e]) for e in ids.unique().tolist()}
    err = max(error_over_bound(y[t, s:s + 1], x[t:t + 1], touched[int(ids[t, s])])
              for t in range(16) for s in range(ids.shape[1]))
    row = Row("matmul_experts", f"{case} {experts}x{n}x{k}", layout, err, bits)
    per_expert = nbytes(w) / experts
    for tokens in (1, 4, 16):
        routes = routings(tokens, experts, 16, bench.device)
        xt = x[:tokens].clone()
        read = sum(r.unique().numel() for r in routes) / len(routes) * per_expert
        row.speeds.append(bench.speed(lambda i: linear.matmul_experts_triton(xt, w, routes[i % len(routes)]), read, 16))
    return row


def attention_exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, end: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
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
    scale = head_dim ** -0.5
    out = attention.attention_triton(q, k, v, start, end, scale)
    exact, magnitude = attention_exact(q, k, v, end, scale)
    err = ((out.double() - exact).abs() / (2.0 ** -7 * magnitude + 2.0 ** -8 * exact.abs())).max().item()
    def alone(b: int, t: slice) -> torch.Tensor:
        one = slice(b, b + 1)
        return attention.attention_triton(q[one, t], k[one], v[one], start[one, t], end[one, t], scale)[0]

    bits = all(torch.equal(alone(b, slice(t, t + 1))[0], out[b, t]) for b in range(len(depths)) for t in range(16))
    bits = bits and all(torch.equal(alone(b, slice(0, 16)), out[b]) for b in range(len(depths)))
    row = Row("attention", f"{case} {q_heads}/{kv_heads}x{head_dim}", "bf16", err, bits)
    for depth in shapes["decode_depths"]:
        kv_bytes = 2 * depth * kv_heads * head_dim * 2
        caches = [tuple(torch.randn(1, depth, kv_heads, head_dim, device=dev).bfloat16() for _ in "kv")
                  for _ in range(copies_for(kv_bytes))]
        for tokens in (1, 16):
            qt = q[:1, :tokens].clone()
            p = depth - tokens + torch.arange(tokens, device=dev)[None, :]
            s, e = torch.zeros_like(p).int(), (p + 1).int()
            speed = bench.speed(lambda i: attention.attention_triton(qt, *caches[i % len(caches)], s, e, scale),
                                kv_bytes, len(caches))
            row.speeds.append(f"ctx {depth} T={tokens}: {speed}")
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
    err = max(((out.cpu().float() - ref).abs() / (1e-3 * ref.abs().amax() + 2.0 ** -7 * ref.abs())).max().item(),
              ((steps.cpu() - ref_steps).abs() / (1e-4 * ref_steps.abs().amax())).max().item())
    bits = torch.equal(steps[:, -1], state)
    decoded = state0.clone()
    for i in range(tokens):
        o, decoded, s = run(slice(0, batch), slice(i, i + 1), decoded)
        bits = bits and torch.equal(o[:, 0], out[:, i]) and torch.equal(s[:, 0], steps[:, i])
    for b in range(batch):
        o, st, s = run(slice(b, b + 1), slice(0, tokens), state0[b:b + 1].clone())
        bits = bits and torch.equal(o[0], out[b]) and torch.equal(st[0], state[b]) and torch.equal(s[0], steps[b])
    row = Row("gdn_recurrent", f"Qwen3.6 GDN {key_heads}/{value_heads}x{key_dim}", "fp32 state", err, bits)
    state_bytes = value_heads * key_dim * value_dim * 4
    states = [state0[:1].clone() for _ in range(copies_for(state_bytes))]
    for t in (1, 16):
        args = [x[:1, :t].clone() for x in (q, k, v, g, beta)]
        per_token = torch.empty(1, t, value_heads, key_dim, value_dim, device=dev)
        speed = bench.speed(lambda i: gdn.gdn_recurrent_triton(*args, states[i % len(states)], per_token),
                            state_bytes * (2 + t), len(states))
        row.speeds.append(f"T={t}: {speed}")
    return row


def bench_norms(bench: Bench, shapes: dict) -> list[Row]:
    width, heads, head_width = shapes["norm"]
    torch.manual_seed(width)
    rows = []
    x = torch.randn(64, width, device=bench.device).bfloat16()
    w = (torch.randn(width, device=bench.device) * 0.1).bfloat16()
    for zero_centred in (True, False):
        y = norm.rms_norm_triton(x, w, 1e-6, zero_centred)
        ref = norm.rms_norm_reference(x.cpu(), w.cpu(), 1e-6, zero_centred)
        err = ((y.cpu().float() - ref.float()).abs() / (2.0 ** -7 * ref.float().abs() + 1e-30)).max().item()
        bits = all(torch.equal(norm.rms_norm_triton(x[i:i + 1], w, 1e-6, zero_centred)[0], y[i]) for i in (0, 17, 63))
        rows.append(Row("rms_norm", f"{64}x{width}", "zero-centred" if zero_centred else "plain", err, bits))
    xg = torch.randn(64 * heads, head_width, device=bench.device).bfloat16()
    gate = torch.randn(64 * heads, head_width, device=bench.device).bfloat16()
    wg = torch.randn(head_width, device=bench.device).bfloat16()
    y = norm.gated_rms_norm_triton(xg, gate, wg, 1e-6)
    ref = norm.gated_rms_norm_reference(xg.cpu(), gate.cpu(), wg.cpu(), 1e-6)
    err = ((y.cpu().float() - ref.float()).abs() / (2.0 ** -7 * ref.float().abs() + 1e-30)).max().item()
    bits = all(torch.equal(norm.gated_rms_norm_triton(xg[i:i + 1], gate[i:i + 1], wg, 1e-6)[0], y[i]) for i in (0, 100))
    rows.append(Row("gated_rms_norm", f"{64 * heads}x{head_width}", "plain w", err, bits))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and no timing: checks the script itself")
    args = parser.parse_args()
    shapes = SMOKE if args.smoke else FULL
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bench = Bench(device, timing=device == "cuda" and not args.smoke)
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    print(f"# kernels on {name}: torch {torch.__version__}, triton {triton.__version__}; "
          f"copy bandwidth {bench.copy / 1e12:.2f} TB/s (read + written)")
    print("speed columns: effective TB/s of weights (KV, state) read, its ratio to the copy bandwidth, time per call\n")
    print(f"{'kernel':<15} {'case':<34} {'layout':<15} {'err':>6} {'bits':<5} speeds (M=1 | 4 | 16)")
    failed = 0
    cases = [(bench_projection, (bench, case, n, k, layout)) for case, n, k in shapes["projections"]
             for layout in (LM_HEAD_LAYOUTS if case == "lm_head" else LAYOUTS)]
    cases += [(bench_experts, (bench, case, e, n, k, layout)) for case, e, n, k in shapes["experts"]
              for layout in EXPERT_LAYOUTS]
    cases += [(bench_attention, (bench, *case, shapes)) for case in shapes["attention"]]
    cases += [(bench_gdn, (bench, shapes)), (bench_norms, (bench, shapes))]
    for fn, fn_args in cases:
        result = fn(*fn_args)
        for row in result if isinstance(result, list) else [result]:
            failed += not row.ok
            print(f"{row.kernel:<15} {row.case:<34} {row.layout:<15} {row.err:6.3f} {'yes' if row.bits else 'NO':<5} "
                  f"{' | '.join(row.speeds)}{'' if row.ok else '  FAIL'}", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"\n{'all checks passed' if not failed else f'{failed} FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

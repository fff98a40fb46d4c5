"""GPU table and the memory a pair needs: target + draft weights, KV, recurrent state, draft KV."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from specpair.checkpoint import Checkpoint
from specpair.checkpoint.families import HEAD_GROUPS

GB = 1e9


@dataclass(frozen=True)
class Gpu:
    name: str
    memory: float  # bytes
    capability: tuple[int, int]  # CUDA compute capability
    bandwidth: float | None = None  # memory bandwidth, bytes/s, nominal (the vendor's datasheet figure)


GPUS: dict[str, Gpu] = {
    "a100": Gpu("A100 80GB", 80 * GB, (8, 0), 2039 * GB),  # SXM; "NVIDIA A100 80GB PCIe" (1.935 TB/s) matches it too
    "a100-40": Gpu("A100 40GB", 40 * GB, (8, 0), 1555 * GB),
    "a6000": Gpu("RTX A6000", 48 * GB, (8, 6), 768 * GB),
    "rtx3090": Gpu("RTX 3090", 24 * GB, (8, 6), 936 * GB),
    "rtx4090": Gpu("RTX 4090", 24 * GB, (8, 9), 1008 * GB),
    "l4": Gpu("L4", 24 * GB, (8, 9), 300 * GB),
    "l40s": Gpu("L40S", 48 * GB, (8, 9), 864 * GB),
    "rtx6000-ada": Gpu("RTX 6000 Ada", 48 * GB, (8, 9), 960 * GB),
    "h100": Gpu("H100 80GB", 80 * GB, (9, 0), 3350 * GB),  # SXM (HBM3); "NVIDIA H100 PCIe" (2.0 TB/s) matches no entry
    "h200": Gpu("H200", 141 * GB, (9, 0), 4800 * GB),
    "gh200": Gpu("GH200 144GB", 144 * GB, (9, 0), 4900 * GB),
    "b200": Gpu("B200", 180 * GB, (10, 0), 8000 * GB),
    "gb200": Gpu("GB200", 186 * GB, (10, 0), 8000 * GB),
    "b300": Gpu("B300", 288 * GB, (10, 3), 8000 * GB),
    "rtx5090": Gpu("RTX 5090", 32 * GB, (12, 0), 1792 * GB),
    "rtx6000-pro": Gpu("RTX PRO 6000 Blackwell", 96 * GB, (12, 0), 1792 * GB),
    "gb10": Gpu("GB10 (DGX Spark, unified)", 128 * GB, (12, 1), 273 * GB),
}
USABLE_FRACTION = 0.9  # vLLM's gpu_memory_utilization default; SGLang's mem fraction is similar
OVERHEAD_PER_GPU = 2 * GB  # activations, verify scratch, CUDA graphs, allocator slack
TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Estimate:
    target_weights: float
    draft_weights: float
    kv: float  # target KV over the context, all sequences
    state: float  # recurrent (GDN) state, all sequences
    draft_kv: float
    experts: float = 0.0  # the target's routed experts (in target_weights), spread over `expert_layers` layers
    expert_layers: int = 0


@dataclass(frozen=True)
class ExpertOffload:
    """A stack that keeps the routed experts of the first `layers` layers in CPU memory (llama.cpp --n-cpu-moe N):
    the smallest such `layers` that fits, in GB rounded as MemoryPlan's figures."""

    flag: str  # the stack's flag, given `layers`
    layers: int
    of_layers: int
    cpu: float  # expert weights in host memory
    per_gpu: float  # what one GPU holds then

    def to_json(self) -> dict:
        return {
            "flag": self.flag,
            "layers": self.layers,
            "of_layers": self.of_layers,
            "cpu": self.cpu,
            "per_gpu": self.per_gpu,
        }


@dataclass(frozen=True)
class MemoryPlan:
    """The memory a pair needs and whether it fits, in GB rounded to 0.1: every sum and comparison is made on
    the rounded numbers, so what the message shows and what it concludes cannot disagree."""

    context: int
    concurrency: int
    parts: dict[str, float]  # target_weights, draft_weights, kv, recurrent_state, draft_kv
    overhead_per_gpu: float
    tensor_parallel: int  # the size the launch line uses: --gpus, capped at what the stack can split
    max_tensor_parallel: int
    per_gpu: float  # what one GPU holds at `tensor_parallel`
    gpu: str | None = None
    usable_per_gpu: float | None = None
    smallest_fitting_tensor_parallel: int | None = None
    fits: bool | None = None  # None: no GPU to size for; False: not with every weight on the GPUs
    experts_on_cpu: ExpertOffload | None = None  # where it does not fit but fits with routed experts in CPU memory

    @property
    def total(self) -> float:
        return round(sum(self.parts.values()), 1)

    def to_json(self) -> dict:
        return {
            "context": self.context,
            "concurrency": self.concurrency,
            "unit": "GB",
            "parts": self.parts,
            "total": self.total,
            "overhead_per_gpu": self.overhead_per_gpu,
            "gpu": self.gpu,
            "usable_per_gpu": self.usable_per_gpu,
            "tensor_parallel": self.tensor_parallel,
            "max_tensor_parallel": self.max_tensor_parallel,
            "per_gpu": self.per_gpu,
            "smallest_fitting_tensor_parallel": self.smallest_fitting_tensor_parallel,
            "fits": self.fits,
            "experts_on_cpu": self.experts_on_cpu.to_json() if self.experts_on_cpu else None,
        }


def gb(value: float) -> float:
    """Bytes to GB, rounded as every memory figure is shown."""
    return round(value / GB, 1)


def plan(
    e: Estimate,
    context: int,
    concurrency: int,
    gpu: Gpu | None,
    gpus: int,
    max_tp: int,
    expert_offload: str | None = None,
    draft_whole: bool = False,
    splits: tuple[int, ...] = TP_SIZES,
) -> MemoryPlan:
    """`expert_offload`: the stack's flag that keeps the routed experts of the first N layers in CPU memory (None:
    it cannot); tried where the weights do not fit the GPUs given. `draft_whole`: every GPU holds the whole drafter
    and its KV under tensor parallelism, where otherwise they split with the target. `splits`: the sizes that split
    the pair's heads the stack's way, the only ones a fit is looked for at."""
    parts = {
        "target_weights": gb(e.target_weights),
        "draft_weights": gb(e.draft_weights),
        "kv": gb(e.kv),
        "recurrent_state": gb(e.state),
        "draft_kv": gb(e.draft_kv),
    }
    overhead = gb(OVERHEAD_PER_GPU)

    def per_gpu(tp: int) -> float:
        target = parts["target_weights"] + parts["kv"] + parts["recurrent_state"]
        draft = parts["draft_weights"] + parts["draft_kv"]
        return round(target / tp + (draft if draft_whole else draft / tp) + overhead, 1)

    tp = min(gpus, max_tp)
    if gpu is None:
        return MemoryPlan(context, concurrency, parts, overhead, tp, max_tp, per_gpu(tp))
    usable = gb(gpu.memory * USABLE_FRACTION)
    smallest = next((n for n in splits if n <= max_tp and per_gpu(n) <= usable), None)
    fits = smallest is not None and smallest <= gpus
    offload = None
    if not fits and expert_offload and e.experts and e.expert_layers:
        offload = _experts_on_cpu(per_gpu(tp), usable, tp, gb(e.experts), e.expert_layers, expert_offload)
    return MemoryPlan(
        context,
        concurrency,
        parts,
        overhead,
        tp,
        max_tp,
        per_gpu(tp),
        gpu.name,
        usable,
        smallest,
        fits,
        offload,
    )


def _experts_on_cpu(
    per_gpu: float, usable: float, tp: int, experts: float, layers: int, flag: str
) -> ExpertOffload | None:
    """The fewest layers whose routed experts, moved to CPU memory, bring a GPU's share under `usable`. The experts
    are taken as spread evenly over the layers: the header summary has their bytes per layout, not per layer, so a
    GGUF that gives some layers Q6_K and others Q4_K can need a layer more or fewer than this says."""
    per_layer = experts / layers
    for n in range(1, layers + 1):
        cpu = round(n * per_layer, 1)
        on_gpu = round(per_gpu - cpu / tp, 1)
        if on_gpu <= usable:
            return ExpertOffload(flag, n, layers, cpu, on_gpu)
    return None


def local_gpu() -> Gpu | None:
    """The first local NVIDIA GPU, from nvidia-smi (no torch import); None when there is none."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
            .stdout.strip()
            .splitlines()
        )
        name, mib, cap = (x.strip() for x in out[0].split(","))
        major, minor = cap.split(".")
        return Gpu(name, float(mib) * 2**20, (int(major), int(minor)))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def gpu_named(device_name: str) -> Gpu | None:
    """The table's entry for a device name as the driver reports it ("NVIDIA H200", "NVIDIA H100 80GB HBM3",
    "NVIDIA GeForce RTX 4090"): the entry whose name's words (before any parenthesis) all appear in it, in order,
    the most specific one when several do ("H200" is not "GH200 144GB", "H100 80GB" is not "H100 PCIe")."""
    words = _words(device_name)
    found = [g for g in GPUS.values() if _in_order(_words(g.name.split("(")[0]), words)]
    return max(found, key=lambda g: len(_words(g.name.split("(")[0])), default=None)


def _words(name: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() else " " for c in name).split()


def _in_order(wanted: list[str], words: list[str]) -> bool:
    remaining = iter(words)
    return all(w in remaining for w in wanted)


def kv_bytes(c: Checkpoint, context: int, dtype_bytes: int = 2) -> float:
    """KV bytes per sequence over `context` tokens: full layers keep every token, sliding ones a window."""
    s = c.shapes
    per_token_layer = 2 * s.num_kv_heads * s.head_dim * dtype_bytes
    window = c.rope.sliding_window or context
    tokens = sum(context if t == "full" else min(window, context) if t == "sliding" else 0 for t in s.layer_types)
    return per_token_layer * tokens


def recurrent_state_bytes(c: Checkpoint) -> float:
    """Gated DeltaNet state per sequence: fp32 [Hv, dk, dv] plus the bf16 conv window per linear layer."""
    s = c.shapes
    linear = s.count("linear")
    if not linear or not (s.linear_value_heads and s.linear_key_head_dim and s.linear_value_head_dim):
        return 0.0
    state = s.linear_value_heads * s.linear_key_head_dim * s.linear_value_head_dim * 4
    conv_channels = (
        2 * (s.linear_key_heads or 0) * s.linear_key_head_dim + s.linear_value_heads * s.linear_value_head_dim
    )
    conv = conv_channels * ((s.linear_conv_kernel or 4) - 1) * 2
    return linear * (state + conv)


def estimate(target: Checkpoint, draft: Checkpoint, head: str | None, context: int, concurrency: int) -> Estimate:
    """`head`: the tensor group of the drafter when it is a head inside the target (None: a checkpoint of its
    own); the target's other heads are not loaded."""
    target_weights = target.total_bytes - target.bytes_of(*(g for g in HEAD_GROUPS if g != head))
    if head:
        draft_weights = 0.0  # the MTP head is part of the target's weights
        mtp_layers = target.mtp.layers if target.mtp else 1
        s = target.shapes
        draft_kv = 2 * s.num_kv_heads * s.head_dim * 2 * context * mtp_layers
    else:
        draft_weights = float(draft.total_bytes)
        draft_kv = kv_bytes(draft, context)
    # Routed experts sit in every decoder layer of the MoE families the tables hold (no dense-first layers).
    expert_layers = target.shapes.num_layers if target.shapes.num_experts else 0
    return Estimate(
        target_weights=float(target_weights),
        draft_weights=draft_weights,
        kv=kv_bytes(target, context) * concurrency,
        state=recurrent_state_bytes(target) * concurrency,
        draft_kv=draft_kv * concurrency,
        experts=float(target.bytes_of("experts")),
        expert_layers=expert_layers,
    )

"""Tensor parallelism (Megatron's split, gpt-fast's tp.py habit: the model files do not change) on torch.distributed:
NCCL between GPUs, gloo between CPU processes.

    parallel = Parallel.from_environment()          # RANK / WORLD_SIZE as torchrun or `specpair run --tp N` set them
    model = load(plan_load(model, device), parallel=parallel)

What each of N ranks holds (`region`; heads split in whole KV groups, widths as evenly as they go, `config`):
  - column-parallel (a contiguous 1/N of the output rows): q/k/v (whole heads and KV heads), gate/up (dense, shared
    expert, and each routed expert's rows), the Gated DeltaNet's input projections, conv and per-head parameters
    (q, k and v channels each split by heads);
  - row-parallel (1/N of the input columns): o_proj, down_proj (dense, shared and routed), out_proj; their outputs
    are partial sums, added across ranks by `reduce` once per mixer and once per MLP (DecoderLayer);
  - vocabulary-parallel: embedding rows (a token's row lives on one rank: the others add zeros) and lm_head rows
    (the logits of each rank's slice, gathered: every rank then has the whole vocabulary, so samplers and DFlash2's
    candidate selector see all of it, llama.cpp #27819);
  - replicated: norms, the router, the shared expert's gate; drafters (small beside the target, and they read
    the replicated residual stream and full logits, so every rank drafts the same tokens).
Experts are split by tensor, not by expert: every rank reads each touched expert's slice, so the bytes a step reads
divide evenly whatever the routing, and a token's sum over its experts needs no exchange beyond the MLP's reduce.

Reading. Each rank reads only the stored bytes of its region of every weight (runtime/loading.py, formats/regions.py):
rows as contiguous runs, columns as a positioned read per run per row where a rank's runs lie a page or more apart
(narrower rows are read whole and the columns taken in memory: the OS reads whole pages anyway). Quantized weights
are cut along whole blocks and stay packed. A region that would end inside a quantization block (an FP8 128x128 scale
tile, an NVFP4 group of 16, an affine group, a GGUF block of 32 or 256) is not refused: that weight is read whole,
decoded and cut (`LoadPlan.read_whole` counts them). The result is the same bits either way, and uneven KV-group
splits make such cuts common on small models, where a refusal would leave no TP size that runs.
Measured (benchmarks/tp_reads.py, the kernel's count of read syscalls; benchmarks/results/tp_reads.md), the most any
rank reads over the checkpoint's weight bytes at TP 2 / TP 4, against the ideal (replicated + 1/N of the split):
  - a medium random Qwen3 (row-parallel rows 8192 wide), BF16, FP8 block and GGUF Q8_0: 0.500 / 0.250, the ideal;
    GGUF Q4_K (rows of 4608 bytes, read whole): 0.680 / 0.519;
  - SmolLM2-135M's Q4_1 GGUF (heads 6 + 3 at TP 2, narrow rows): 0.637 against 0.501 at TP 2;
  - a tiny Qwen3 (rows of 128 bytes): BF16 0.608 / 0.413; FP8 block, where every split weight falls back (no rank
    holds whole 128x128 tiles), 0.695 / 0.542.

Exactness. `reduce` does not use all_reduce, whose algorithm (ring, tree, NCCL's choice by message size) and so
summation order can change with the number of rows a step carries (vLLM disabled its custom all-reduce for this,
landscape.md §5): it gathers every rank's partial and sums them in rank order in float32, so a row's bits depend on
nothing but that row, and drafted == undrafted holds at every N. A gather moves N times the bytes of an all-reduce's
result; a decode row is a few KB, where latency, not bytes, is the cost. Measured on gloo (benchmarks/tp_reduce.py,
benchmarks/results/tp_reduce.md; 2 shared CPU cores, messages of 1, 8 and 16 rows at hidden 576 to 4096): the
ordered reduce takes 1.17-1.43x all_reduce's time with 2 processes, and 0.59-0.81x with 4 (gloo's all_reduce
exchanges in more rounds than its all_gather, and there rounds cost). NCCL is not measured: it needs 2 GPUs.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.checkpoint.tensor_parallel import unsplittable
from specpair.errors import BadInput
from specpair.formats.regions import Region
from specpair.runtime.kernels.experts import ExpertTerms
from specpair.runtime.kernels.linear import SplitSums

# outputs of row-parallel projections are partial sums: their bias is added once, on rank 0
ROW_PARALLEL_BIASES = ("o_proj.bias", "down_proj.bias", "out_proj.bias")
# weights whose split dim holds sections split each on its own: the Gated DeltaNet's q, k and v channels
SECTIONED = ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight")

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class Parallel:
    rank: int = 0
    size: int = 1

    @classmethod
    def from_environment(cls, device: torch.device | str = "cpu") -> Parallel:
        """This process's place in a group started by torchrun or `specpair run --tp N` (one process: rank 0 of 1);
        the process group is initialised here, NCCL on CUDA, gloo on the CPU."""
        size = int(os.environ.get("WORLD_SIZE", "1"))
        if size == 1:
            return cls()
        for key, value in MULTICAST_OFF.items():
            os.environ.setdefault(key, value)
        rank = int(os.environ["RANK"])
        if torch.device(device).type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))  # "cuda" is then this rank's GPU
        if not dist.is_initialized():
            backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
            dist.init_process_group(backend, rank=rank, world_size=size)
            # closed before the interpreter tears down: a group left open can abort a rank at exit
            atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        return cls(rank, size)

    def slice(self, total: int, what: str) -> slice:
        """This rank's contiguous 1/size of `total` (heads, rows, columns)."""
        if total % self.size:
            raise ValueError(f"{what} ({total}) do not split evenly over {self.size} ranks")
        part = total // self.size
        return slice(self.rank * part, (self.rank + 1) * part)

    def reduce(self, partial: Tensor | SplitSums | ExpertTerms) -> Tensor | SplitSums | ExpertTerms:
        """The sum of every rank's `partial`, in rank order, in float32, cast back: the same bits on every rank, and
        for every row whatever else the tensor holds. Alone, a product's split-K partials and a MoE's terms stay
        as they are (the next kernel adds them); across ranks they are added first."""
        if self.size == 1:
            return partial
        if isinstance(partial, SplitSums):
            partial = partial.summed()
        elif isinstance(partial, ExpertTerms):
            partial = partial.combined()
        parts = [torch.empty_like(partial) for _ in range(self.size)]
        dist.all_gather(parts, partial.contiguous())
        total = parts[0].float()
        for part in parts[1:]:
            total = total + part.float()
        return total.to(partial.dtype)

    def gather(self, part: Tensor) -> Tensor:
        """Every rank's `part` side by side along the last dim, in rank order (vocabulary slices of logits)."""
        if self.size == 1:
            return part
        parts = [torch.empty_like(part) for _ in range(self.size)]
        dist.all_gather(parts, part.contiguous())
        return torch.cat(parts, dim=-1)

    def share(self, total: int, rank: int | None = None) -> int:
        """A rank's count of `total` units split as evenly as they go (the first total % size ranks take one more:
        SmolLM2's 3 KV heads at TP 2 are 2 and 1)."""
        rank = self.rank if rank is None else rank
        return total // self.size + (rank < total % self.size)

    def config(self, config: ModelConfig, where: str, rank: int | None = None) -> ModelConfig:
        """The config of a rank's shard (default: this one's): KV heads split as evenly as they go and each keeps its
        query heads, Gated DeltaNet key heads likewise with their value heads, MLP widths split; head_dim, the hidden
        size and the vocabulary stay (the vocabulary splits evenly: embed and head). A model a rank would hold
        nothing of is refused."""
        if self.size == 1:
            return config
        refused = unsplittable(config.vocab_size, config.num_kv_heads, config.linear_num_key_heads, self.size)
        if refused:
            raise BadInput(where, refused[0])
        groups = {"num_kv_heads": ("num_heads", config.num_kv_heads)}
        if config.linear_num_key_heads is not None:
            groups["linear_num_key_heads"] = ("linear_num_value_heads", config.linear_num_key_heads)
        changed: dict[str, int] = {}
        for key, (follower, total) in groups.items():
            changed[key] = self.share(total, rank)
            changed[follower] = changed[key] * (getattr(config, follower) // total)
        for key in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
            if getattr(config, key) is not None:
                changed[key] = self.share(getattr(config, key), rank)
        return replace(config, **changed)

    def region(
        self, name: str, whole: tuple[int, ...], shapes: Sequence[tuple[int, ...]], config: ModelConfig
    ) -> Region | None:
        """This rank's part of weight `name` (of shape `whole`; `config` the whole model's), given the shape every
        rank's model asks for (`shapes`, by rank): along the one dim where they differ from the whole, the ranks'
        slices follow one another in rank order, section by section where that dim holds sections; None where the
        rank holds all of it."""
        local = tuple(shapes[self.rank])
        if tuple(whole) == local:
            return None
        dims = [d for d, (w, part) in enumerate(zip(whole, local)) if w != part]
        if len(dims) != 1 or len(whole) != len(local):
            raise ValueError(f"{name} is {list(whole)}; a shard of {list(local)} is not a slice of one dim")
        dim = dims[0]
        if name.endswith(SECTIONED):  # per rank: its q, k and v channels
            ranks = [self.config(config, name, r) for r in range(self.size)]
            sizes = [[c.linear_num_key_heads * c.linear_key_head_dim] * 2 for c in ranks]
            sizes = [k + [c.linear_num_value_heads * c.linear_value_head_dim] for k, c in zip(sizes, ranks)]
        else:
            sizes = [[shape[dim]] for shape in shapes]
        sections = [sum(rank[i] for rank in sizes) for i in range(len(sizes[0]))]
        if sum(sections) != whole[dim]:
            raise ValueError(f"{name}: the ranks' shards {sizes} do not add up to its {whole[dim]} along dim {dim}")
        runs, base = [], 0
        for i, section in enumerate(sections):
            start = base + sum(rank[i] for rank in sizes[: self.rank])
            runs.append((start, start + sizes[self.rank][i]))
            base += section
        return Region(dim - len(whole), tuple(runs))

    def held(self, name: str, value: Tensor) -> Tensor:
        """What this rank keeps of `value`, its region of weight `name`: a row-parallel output's bias is added once,
        by rank 0 (the others hold zeros)."""
        return torch.zeros_like(value) if self.rank and name.endswith(ROW_PARALLEL_BIASES) else value


SINGLE = Parallel()


RANK0_GRACE_S = 3.0


def launch(command: Sequence[str], size: int) -> tuple[int, int | None, str | None]:
    """Run `command` as ranks 0..size-1 of one group on this machine (torchrun's environment: RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR/PORT; NVLink multicast off): rank 0 keeps this process's stdout and stderr, the others
    print nothing. A rank that fails ends the others. Returns (0, None, None), or (its exit code, the rank, a line
    naming the rank and the last line it wrote to stderr: rank 0 wrote its own)."""
    # This process hosts the group's store on a port the OS picks and holds, as torchrun's agent does: a port
    # chosen free and handed on could be taken by another process before rank 0 binds it.
    store = dist.TCPStore("127.0.0.1", 0, world_size=size, is_master=True, wait_for_workers=False)
    logs = [tempfile.TemporaryFile() for _ in range(size)]
    ranks = []
    for rank in range(size):
        env = {
            **os.environ,
            **MULTICAST_OFF,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(size),
            "LOCAL_WORLD_SIZE": str(size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
        quiet = rank > 0
        ranks.append(
            subprocess.Popen(
                list(command),
                env=env,
                stdout=subprocess.DEVNULL if quiet else None,
                stderr=logs[rank] if quiet else None,
            )
        )
    try:
        while True:
            codes = [r.poll() for r in ranks]
            failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                if failed > 0 and ranks[0].poll() is None:
                    # rank 0 reports an error every rank meets (a bad shape, a missing file) itself: a moment
                    # for it to do so, so that the user reads one error, not one per rank
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        ranks[0].wait(timeout=RANK0_GRACE_S)
                    if ranks[0].returncode not in (None, 0):
                        failed = 0
                        codes[0] = ranks[0].returncode
                for r in ranks:
                    if r.poll() is None:
                        r.terminate()
                for r in ranks:
                    r.wait()
                line = f"rank {failed} of {size} exited with {codes[failed]}{_last_line(logs[failed])}"
                return codes[failed], failed, line
            if all(c == 0 for c in codes):
                return 0, None, None
            time.sleep(0.05)
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
                r.wait()
        for log in logs:
            log.close()


def _last_line(log) -> str:
    log.seek(0)
    lines = [line for line in log.read().decode("utf-8", "replace").splitlines() if line.strip()]
    return f": {lines[-1].strip()}" if lines else ""

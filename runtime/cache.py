"""The static cache: every buffer a step reads or writes, preallocated for a fixed batch and context.

Row b of every buffer is sequence b of the batch; positions are explicit (a step passes them), so a token at
position p always sits in KV row p, sliding layers included (their window is where attention starts reading,
kv_start = p - window + 1, not a ring buffer: a position is never wrapped, rollback never unwraps).
  - full and sliding attention layers: k, v [batch, context, kv_heads, head_dim] in the model dtype (views of
    one buffer `kv` [2, layers, ...], which commit rewrites in one op);
  - Gated DeltaNet layers: the conv window [batch, K-1, C] (the last K-1 pre-conv projections, model dtype)
    and the recurrent state [batch, Hv, dk, dv] float32.

Rollback. A step run with `verify=True` is provisional: it returns a `Pending`, which the caller decides before
any other step runs: `pending.commit(accepted)` keeps, per sequence, the first accepted[b] of its T tokens, 0 and
T included, and leaves KV, conv windows and states exactly (bitwise) as if the step had only had those tokens
(`pending.discard()` keeps none). KV needs nothing but zeroing the rejected rows (positions, not a
length, decide what attention reads; zeroing makes the cache a function of the kept tokens alone). The conv
window after a kept tokens is columns a .. a+K-2 of [old window | step projections], which the step keeps.
For the recurrent state there are two designs (runtime.md §2):
  (a) per-position slots, as vLLM does: the step writes the state after every token, [B, T, Hv, dk, dv], and
      commit picks slot a-1 (plus the state before the step, for a = 0);
  (b) replay, chosen here: the step reads the state and leaves it unwritten (gdn_recurrent's `write_state`),
      and keeps its recurrence inputs (q, k, v, g, beta and the conv columns); commit reruns the recurrence
      alone over each sequence's kept tokens from that state (no projection, no other layer: the inputs are
      kept), one call per GDN layer whose shapes do not depend on the counts (gdn_recurrent's `lengths`), so
      the whole rollback is a CUDA graph (runtime/graphs.py: the Pending of a graphed verify step carries it)
      and never reads the counts. (Until stop 48 the step wrote the state after a copy into a snapshot buffer,
      which commit copied back: two copies of the state a layer a round, and a buffer its size.)
Why (b): memory, and traffic that does not grow with T or the batch. At Qwen3.6-35B-A3B's shape (30 GDN layers,
32 value heads of 128 x 128 fp32: 60 MiB of state per sequence) and a verify block of 16, (a) adds 1020 MiB per
sequence (17 states a layer) and writes 960 MiB of it on every verify step, whatever is accepted (~0.25 ms of the
H200's bandwidth per sequence, 4x that at batch 4); (b) adds the 16.5 MiB of kept inputs per sequence and moves
120 MiB and one short kernel per layer at commit (the replay's read and write of the state). Its cost: the replay
reruns the kept tokens' recurrence. Measured on the CPU at half the shape, with the snapshot copies then (30
layers, 8/16 heads of 64, T = 16, one thread, the torch reference kernels, where the recurrence is compute-bound;
benchmarks/gdn_rollback.py, benchmarks/results/gdn_rollback.md), against a verify step that cannot roll back
(155-170 ms; two runs, ~15 % noise on this shared machine): (a) +4..44 % at every accepted count; (b) within the
noise of the baseline when 0, 1 or all 16 are kept, +48..65 % at 8 and +100..113 % at 15 (the replayed tokens).
On the H200, with the rollback captured as a graph, the steps of a Qwen3.6-35B-A3B round timed alone are 93-97 % of it
(benchmarks/results/bench_gpu_35b.md). Both designs are exact: the recurrence is sequential, so T tokens are T
one-token updates in one order, and a replay of a kept prefix recomputes the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.kernels import gdn


@dataclass
class GDNInputs:
    """What a verify step keeps of one Gated DeltaNet layer to replay a prefix of it."""

    columns: Tensor  # [B, K-1+T, C] the conv window before the step, then the step's projections
    q: Tensor
    k: Tensor
    v: Tensor
    g: Tensor
    beta: Tensor


@dataclass(eq=False)
class Pending:
    """A verify step awaiting its decision, returned by the step (StepOutput.pending): `commit(accepted)` keeps the
    first accepted[b] of its T tokens for each sequence b; `discard()` keeps none. Until one of them, the cache
    refuses every other step. `rollback`: how to roll back these buffers when not eagerly (a CUDA graph of
    Cache.roll_back, runtime/graphs.py)."""

    cache: Cache
    positions: Tensor  # [B, T]
    gdn: dict[int, GDNInputs] = field(default_factory=dict)
    rollback: Callable[[Tensor], None] | None = None

    def commit(self, accepted: Tensor, counts: Sequence[int] | None = None) -> None:
        """`counts`: the same numbers on the host, checked against the step's shape where the caller has them (the
        rollback itself never reads them: its shapes do not depend on them)."""
        self.cache.commit(self, accepted, counts)

    def discard(self) -> None:
        batch = self.positions.shape[0]
        self.commit(torch.zeros(batch, dtype=torch.int64, device=self.positions.device), [0] * batch)


class Cache:
    def __init__(
        self, config: ModelConfig, batch: int, context: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        self.batch, self.context = batch, context
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        self.conv: dict[int, Tensor] = {}
        self.state: dict[int, Tensor] = {}
        attention = [i for i, kind in enumerate(config.layer_types) if kind != "linear"]
        # every attention layer's K and V are views of one buffer, so that commit zeroes them all in one op
        self.kv = torch.zeros(
            2, len(attention), batch, context, config.num_kv_heads, config.head_dim, dtype=dtype, device=device
        )
        self.slots = {i: j for j, i in enumerate(attention)}
        for i, j in self.slots.items():
            self.k[i], self.v[i] = self.kv[0, j], self.kv[1, j]
        for i, kind in enumerate(config.layer_types):
            if kind == "linear":
                hv, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
                self.conv[i] = torch.zeros(
                    batch, config.linear_conv_kernel - 1, config.linear_conv_dim, dtype=dtype, device=device
                )
                self.state[i] = torch.zeros(batch, hv, dk, dv, dtype=torch.float32, device=device)
        self.open: Pending | None = None  # the verify step awaiting its decision, which every other step waits for

    @property
    def nbytes(self) -> int:
        buffers = [
            *self.k.values(),
            *self.v.values(),
            *self.conv.values(),
            *self.state.values(),
        ]
        return sum(t.nbytes for t in buffers)

    def reorder(self, order: Tensor) -> None:
        """Row b of every buffer becomes what row order[b] holds, between steps (the speculative loop puts its
        finished sequences behind its live ones, which then run as a prefix of the batch: a step over B rows reads
        and writes rows 0..B-1)."""
        if self.open is not None:
            raise RuntimeError("reorder() between steps: decide the open verify step first")
        self.kv.copy_(self.kv[:, :, order])
        for buffers in (self.conv, self.state):
            for buffer in buffers.values():
                buffer.copy_(buffer[order])

    # -------------------------------------------------------------------------------------- used by a step

    def begin(self, positions: Tensor, verify: bool) -> Pending | None:
        """A step over `positions` [B, T] starts: a verify step gets its Pending, which the caller must decide."""
        if positions.shape[0] > self.batch:
            raise ValueError(f"a step of {positions.shape[0]} sequences on a cache for {self.batch}")
        step = Pending(self, positions) if verify else None
        self.hold(step)
        return step

    def hold(self, step: Pending | None) -> None:
        """Make `step` the open verify step (None: check only that none is open); a replayed graph's verify step
        holds the Pending over the graph's buffers this way."""
        if self.open is not None:
            raise RuntimeError("the last verify step was neither committed nor discarded: decide it first")
        self.open = step

    def release(self, step: Pending) -> None:
        """Forget `step` without rolling anything back: a step whose work never ran (a CUDA-graph capture records
        the ops of a step and runs none)."""
        if self.open is not step:
            raise RuntimeError("release() takes the open verify step")
        self.open = None

    def store(self, layer: int, positions: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v [B, T, kv_heads, head_dim] at their positions; the layer's caches for rows 0..B-1 (the
        drafters' attention writes its K and V this way; the target's goes through kernels.qk, fused with rotary)."""
        batch = positions.shape[0]
        rows = torch.arange(batch, device=positions.device)[:, None].expand_as(positions)
        slot = self.slots[layer]
        # one write into the shared buffer, and views of it taken after (autograd, which tests train drafters
        # through, refuses in-place writes into views taken before another write to their buffer)
        self.kv[:, slot, rows, positions] = torch.stack((k, v))
        return self.kv[0, slot, :batch], self.kv[1, slot, :batch]

    def gdn_state(self, layer: int, batch: int) -> tuple[Tensor, Tensor]:
        """The conv window and recurrent state of rows 0..batch-1 (views: a decode step updates both in place; a
        verify step only the window, whose columns it keeps, and leaves the state for its commit to replay from)."""
        return self.conv[layer][:batch], self.state[layer][:batch]

    # -------------------------------------------------------------------------------------- after a verify step

    def commit(self, step: Pending, accepted: Tensor, counts: Sequence[int] | None = None) -> None:
        """Pending.commit: keep the first accepted[b] tokens of `step` for each sequence b (0 <= accepted[b] <= T)."""
        if step.cache is not self or self.open is not step:
            raise RuntimeError("commit() takes the open verify step of this cache: this one was decided already")
        batch, steps = step.positions.shape
        if accepted.shape != (batch,):
            raise ValueError(f"accepted must be {batch} counts in 0..{steps}, got a tensor of {list(accepted.shape)}")
        if counts is None and not accepted.is_cuda:
            counts = accepted.tolist()  # free on the CPU; on CUDA a host read, which the rollback does not need
        if counts is not None and (len(counts) != batch or any(not 0 <= c <= steps for c in counts)):
            raise ValueError(f"accepted must be {batch} counts in 0..{steps}, got {list(counts)}")
        self.open = None
        if step.rollback is not None:
            step.rollback(accepted)
        else:
            self.roll_back(step, accepted)

    def roll_back(self, step: Pending, accepted: Tensor) -> None:
        """Leave the cache as if `step` had only had its first accepted[b] tokens, in ops whose shapes do not
        depend on the counts (no host read, no boolean index: a CUDA graph captures it)."""
        batch, steps = step.positions.shape
        accepted = accepted.to(step.positions.device, torch.int64)
        if self.k:
            # every row of the step is rewritten, the kept ones with their own values
            rows = torch.arange(batch, device=accepted.device)[:, None].expand(batch, steps)
            kept = torch.arange(steps, device=accepted.device)[None, :] < accepted[:, None]
            cells = self.kv[:, :, rows, step.positions]
            self.kv[:, :, rows, step.positions] = torch.where(kept[:, :, None, None], cells, 0)
        windows: dict[tuple[int, ...], Tensor] = {}  # the columns each window keeps, by columns' shape: one index
        for layer, x in step.gdn.items():
            if x.columns.shape not in windows:
                taps = x.columns.shape[1] - steps
                index = accepted[:, None] + torch.arange(taps, device=accepted.device)[None, :]
                windows[x.columns.shape] = index[:, :, None].expand(-1, -1, x.columns.shape[2])
            torch.gather(x.columns, 1, windows[x.columns.shape], out=self.conv[layer][:batch])
            # every sequence's state through its kept tokens, from the state before the step (which the step left
            # unwritten), in one call: the step's own recurrence over its first tokens, the same bits
            gdn.gdn_recurrent(x.q, x.k, x.v, x.g, x.beta, self.state[layer][:batch], lengths=accepted)

"""Steps under CUDA graphs: a step function of fixed input shapes over static buffers, captured once and replayed
(gpt-fast's shape: static caches, explicit positions, one captured step).

    decode = ForwardGraph(model, cache, batch=4, tokens=1)      # model.forward for [4, 1] on this cache
    decode.prepare(tokens, positions)                           # warm up and capture; the cache is left as it was
    out = decode(tokens, positions)                             # copy in, replay: a StepOutput

A `StepGraph` copies its inputs into static buffers and on CUDA runs its step once eagerly (Triton compiles the
kernels, torch initialises what it initialises lazily), captures it into a torch.cuda.CUDAGraph and from then
on replays it: one launch for the whole step instead of a Python call and a launch per op. Its outputs are the
graph's own buffers, which the next replay overwrites: the caller consumes or copies them first. On the CPU the
same object runs the step eagerly on the same static buffers, so CI tests the logic (what is copied in, what
comes out, a verify step's Pending and its decision); what it cannot test is the capture itself.

What a captured step must not do, and the runtime's steps do not: read a tensor on the host (.item(),
.tolist(), bool(tensor), a Python branch on a value), give an op an output size that depends on values
(nonzero, boolean indexing, bincount), copy from host memory (torch.tensor(list, device="cuda") waits for the
stream), or change a shape between calls. Positions and the ranges attention reads (kv_end = positions + 1)
are device tensors; the MoE dispatch builds its tile tables on the device for any T·k (kernels/linear.py); the
CPU reference kernels read routing and ranges on the host, which costs nothing there and is never captured.
A verify step's commit is a graph of its own (the Pending a ForwardGraph returns rolls back through it: the
rollback's shapes do not depend on the accepted counts). A block or chain drafter's proposal is one graph, its draws
and DFlash2's candidate walk included (keyed draws depend on positions, device tensors, not on a host RNG). What a round
keeps is a graph as well (runtime/speculative.py `_decided`: the target's choices, the exact rule, the cut at
max_tokens and stop ids, the next anchors). Left outside the graphs, eager: prefill (its chunk widths vary), the
rejection rule's draws, a draft model's draws between its steps, and a hybrid draft model's rollback of its own
state.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from specpair.runtime.cache import Cache, Pending
from specpair.runtime.model import StepOutput, Transformer


class StepGraph:
    """`step(*inputs)` for inputs of the shapes and dtypes of `like`, run over static input buffers."""

    def __init__(self, step: Callable[..., Any], like: Sequence[Tensor]) -> None:
        self.step = step
        self.inputs = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in like)
        self.captures = self.inputs[0].is_cuda
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self.warm = False  # the step has run once: its kernels are compiled
        self.ran_python = False  # the last call ran the step's Python (eagerly, or to capture it)

    def load(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        """Copy `inputs` into the static buffers (which it returns)."""
        if len(inputs) != len(self.inputs) or any(
            x.shape != s.shape or x.dtype != s.dtype for x, s in zip(inputs, self.inputs)
        ):
            raise ValueError(
                f"a step graph for {[(list(s.shape), s.dtype) for s in self.inputs]} was called with "
                f"{[(list(x.shape), x.dtype) for x in inputs]}"
            )
        for static, x in zip(self.inputs, inputs):
            static.copy_(x)
        return self.inputs

    def __call__(self, *inputs: Tensor) -> Any:
        self.load(*inputs)
        self.ran_python = self.graph is None
        if self.graph is None and self.warm:
            self.record()
        if self.graph is None:
            self.warm = True
            return self.step(*self.inputs)
        self.graph.replay()
        return self.outputs

    def record(self) -> None:
        """Capture the step after its warm-up (a capture runs none of its work); nothing to do on the CPU."""
        self.warm = True
        if not self.captures:
            return
        graph = torch.cuda.CUDAGraph()
        # no cyclic collection while capturing: freeing an unreachable graph destroys it, which CUDA refuses
        # during a capture and which invalidates the capture (torch.cuda.graph collects once, before it begins)
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph):
                self.outputs = self.step(*self.inputs)
        finally:
            if collecting:
                gc.enable()
        self.graph = graph


class StepGraphs:
    """One step function under a StepGraph per input shape (and keyword arguments, which stay Python values), or
    called as it is when `enabled` is false. A caller sends it only the calls whose shapes recur."""

    def __init__(self, step: Callable[..., Any], enabled: bool) -> None:
        self.step, self.enabled = step, enabled
        self.graphs: dict[tuple, StepGraph] = {}

    def __call__(self, *inputs: Tensor, **fixed: Any) -> Any:
        if not self.enabled:
            return self.step(*inputs, **fixed)
        key = (tuple((x.shape, x.dtype) for x in inputs), tuple(sorted(fixed.items())))
        if key not in self.graphs:
            self.graphs[key] = StepGraph(functools.partial(self.step, **fixed), inputs)
        return self.graphs[key](*inputs)


class ForwardGraph:
    """`model.forward(tokens, positions, cache, ...)` for tokens and positions of [batch, tokens], on one cache.

    A verify step's Pending (runtime/cache.py: the positions and the Gated DeltaNet inputs its commit reads) is made
    by the forward's Python, which a replay does not run: the graph keeps the one its capture made, whose tensors
    are the graph's own buffers, and every replay returns a Pending over those buffers, held by the cache, whose
    rollback is a graph of its own (the same ops on the same buffers every round: its shapes do not depend on the
    counts)."""

    def __init__(
        self,
        model: Transformer,
        cache: Cache,
        batch: int,
        tokens: int,
        *,
        taps: Sequence[int] = (),
        hidden: bool = False,
        logits: bool = True,
        verify: bool = False,
    ) -> None:
        if batch > cache.batch:
            raise ValueError(f"a step of {batch} sequences on a cache for {cache.batch}")
        self.model, self.cache, self.verify = model, cache, verify
        self.options = {"taps": tuple(taps), "hidden": hidden, "logits": logits}
        like = torch.zeros(batch, tokens, dtype=torch.int64, device=model.device)
        self.graph = StepGraph(self._step, (like, like))
        self.traced: Pending | None = None  # the Pending of the last run of the step's Python
        self.rollback: StepGraph | None = None  # cache.roll_back of `traced`, over the graph's own buffers

    def _step(self, tokens: Tensor, positions: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        out = self.model.forward(tokens, positions, self.cache, verify=self.verify, **self.options)
        self.traced = out.pending
        return out.logits, out.taps, out.hidden

    def prepare(self, tokens: Tensor, positions: Tensor) -> StepOutput:
        """Warm the step up and capture it before its first use, leaving the cache as it was: the step runs once,
        provisionally (a verify step, then discarded), at positions it may write. Returns that run's output (the
        warm-up of a drafter that observes it needs its taps)."""
        out = self.model.forward(*self.graph.load(tokens, positions), self.cache, verify=True, **self.options)
        out.pending.discard()
        self.graph.record()
        if self.graph.graph is not None and self.traced is not None:
            self.cache.release(self.traced)  # the capture opened a verify step and ran none of its work
        return out

    def _roll_back(self, accepted: Tensor) -> None:
        if self.rollback is None:
            self.rollback = StepGraph(functools.partial(self.cache.roll_back, self.traced), (accepted,))
        self.rollback(accepted)

    def __call__(self, tokens: Tensor, positions: Tensor) -> StepOutput:
        self.cache.hold(None)  # refuse a step while a verify step is undecided, before touching any buffer
        logits, taps, hidden = self.graph(tokens, positions)
        pending = None
        if self.verify and self.graph.ran_python:
            pending = self.traced  # the forward's Python opened it on the cache
        elif self.verify:
            pending = Pending(self.cache, self.traced.positions, dict(self.traced.gdn), rollback=self._roll_back)
            self.cache.hold(pending)
        return StepOutput(logits, taps, hidden, pending)

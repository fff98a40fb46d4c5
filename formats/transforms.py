"""Tensor maps between naming schemes (HF, GGUF, MLX): which source tensors build an output tensor, and how.

A `TensorMap` says: output tensor `name` of logical (float) shape `shape` is `steps` applied to the
logical source tensors `sources`. Logical tensors are weights as a model holds them, [..., out, in],
whatever layout stores them. Each step is one named operation from OPS with plain-data arguments, so a
plan prints, serializes and compares. An operation's `kind` says where it is exact without float:
  "rows"   moves whole rows (last-axis vectors) or stacks tensors: exact on any row-wise stored layout
           (floats, GGUF blocks), so same-layout conversions apply it to the stored bytes;
  "shape"  moves single values (reshape, transpose, column gather): exact on float layouts only;
  "value"  changes values (norm +1, -exp): computed in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specpair.errors import BadInput

if TYPE_CHECKING:  # the ops import torch when they run: `check` reads tensor maps (gguf_arch) without it
    from torch import Tensor

Args = tuple[int | float | tuple[int, ...], ...]


@dataclass(frozen=True)
class Op:
    kind: str  # "rows" | "shape" | "value"
    apply: Callable[[list[Tensor], Args], Tensor]  # first step of a map gets all sources, later steps one tensor
    many: bool = False  # takes several tensors (only as a map's first step)


@dataclass(frozen=True)
class Step:
    op: str
    args: Args = ()

    def __str__(self) -> str:
        return f"{self.op}({', '.join(map(str, self.args))})" if self.args else self.op


@dataclass(frozen=True)
class TensorMap:
    name: str
    shape: tuple[int, ...]
    sources: tuple[str, ...]
    steps: tuple[Step, ...] = ()

    @property
    def kind(self) -> str:
        """The strictest kind among the steps: "rows" when there are none."""
        order = ("rows", "shape", "value")
        return max((OPS[s.op].kind for s in self.steps), key=order.index, default="rows")

    def apply(self, tensors: Sequence[Tensor]) -> Tensor:
        """Run the steps on the source tensors (float, or stored form where `kind` allows it)."""
        if not self.steps:
            (only,) = tensors
            return only
        first, *rest = self.steps
        if not OPS[first.op].many and len(tensors) != 1:
            raise ValueError(f"{self.name}: step {first} takes one tensor, got {len(tensors)}")
        x = OPS[first.op].apply(list(tensors), first.args)
        for step in rest:
            x = OPS[step.op].apply([x], step.args)
        return x


def identity(name: str, shape: tuple[int, ...], source: str | None = None) -> TensorMap:
    return TensorMap(name, tuple(shape), (source or name,))


def _stack(xs: list[Tensor], args: Args) -> Tensor:
    import torch

    return torch.stack(xs)


def _cat_rows(xs: list[Tensor], args: Args) -> Tensor:
    import torch

    return torch.cat(xs, dim=-2)


def _select(xs: list[Tensor], args: Args) -> Tensor:
    """Index `args[0]` of the leading axis (one expert of a stack)."""
    return xs[0][args[0]]


def _rows(xs: list[Tensor], args: Args) -> Tensor:
    """Rows start:stop of the second-to-last axis."""
    start, stop = args
    return xs[0][..., start:stop, :]


def _take_rows(xs: list[Tensor], args: Args) -> Tensor:
    """Rows in the order of the index tuple args[0] (head reorders)."""
    import torch

    index = torch.tensor(args[0], dtype=torch.long, device=xs[0].device)
    return xs[0].index_select(-2, index)


def _take_cols(xs: list[Tensor], args: Args) -> Tensor:
    import torch

    index = torch.tensor(args[0], dtype=torch.long, device=xs[0].device)
    return xs[0].index_select(-1, index)


def _take(xs: list[Tensor], args: Args) -> Tensor:
    """Entries of a 1-D tensor in the order of args[0]."""
    import torch

    index = torch.tensor(args[0], dtype=torch.long, device=xs[0].device)
    return xs[0].index_select(0, index)


def _reshape(xs: list[Tensor], args: Args) -> Tensor:
    return xs[0].reshape(args[0])


def _transpose(xs: list[Tensor], args: Args) -> Tensor:
    """Swap axes args[0] and args[1] (MLX's channels-last conv1d)."""
    return xs[0].transpose(args[0], args[1]).contiguous()


def _add(xs: list[Tensor], args: Args) -> Tensor:
    return xs[0].float() + args[0]


def _neg_exp(xs: list[Tensor], args: Args) -> Tensor:
    import torch

    return -torch.exp(xs[0].float())


def _log_neg(xs: list[Tensor], args: Args) -> Tensor:
    import torch

    return torch.log(-xs[0].float())


def _values(xs: list[Tensor], args: Args) -> Tensor:
    """A tensor computed from the config, not from sources: the float values args[0] (Llama 3 rope factors)."""
    import torch

    return torch.tensor(args[0], dtype=torch.float32)


OPS: dict[str, Op] = {
    "stack": Op("rows", _stack, many=True),
    "cat_rows": Op("rows", _cat_rows, many=True),
    "select": Op("rows", _select),
    "rows": Op("rows", _rows),
    "take_rows": Op("rows", _take_rows),
    "take_cols": Op("shape", _take_cols),
    "take": Op("shape", _take),
    "reshape": Op("shape", _reshape),
    "transpose": Op("shape", _transpose),
    "add": Op("value", _add),  # zero-centred RMSNorm gains: stored w, effective 1 + w
    "neg_exp": Op("value", _neg_exp),  # A_log -> ssm_a = -exp(A_log)
    "log_neg": Op("value", _log_neg),  # ssm_a -> A_log
    "values": Op("value", _values, many=True),  # takes no sources
}


# ------------------------------------------------------------------------------------------------ composition

TRAILING_OPS = ("rows", "take_rows", "take_cols", "add", "neg_exp", "log_neg")  # work on the last axes only


def compose(
    first: list[TensorMap], second: list[TensorMap], source_shapes: Mapping[str, tuple[int, ...]] | None = None
) -> list[TensorMap]:
    """`second` (over the names `first` produces) as maps over `first`'s sources. Given the sources' shapes, a
    map that concatenates sources only to take rows of one of them reads that one alone (`narrowed`)."""
    by_name = {m.name: m for m in first}
    out = []
    for m in second:
        inner = [by_name[s] for s in m.sources]
        if all(not i.steps and len(i.sources) == 1 for i in inner):
            composed = TensorMap(m.name, m.shape, tuple(i.sources[0] for i in inner), m.steps)
        elif len(inner) == 1:
            composed = TensorMap(m.name, m.shape, inner[0].sources, inner[0].steps + m.steps)
        elif (restacked := _restacked(inner, m)) is not None:
            composed = restacked
        else:
            raise BadInput(m.name, "cannot be built in one pass between these namings; convert to bf16 first")
        out.append(simplify(narrowed(composed, source_shapes) if source_shapes is not None else composed))
    return out


def narrowed(m: TensorMap, source_shapes: Mapping[str, tuple[int, ...]]) -> TensorMap:
    """cat_rows of sources then rows within one of them is that source's rows: a GGUF's ffn_gate_exps and
    ffn_up_exps concatenated as gate_up_proj and cut again into gate_proj would otherwise read both for each
    half (and count both as its bytes)."""
    if len(m.steps) < 2 or m.steps[0].op != "cat_rows" or m.steps[1].op != "rows":
        return m
    if any(s not in source_shapes for s in m.sources):
        return m
    start, stop = m.steps[1].args
    first = 0
    for source in m.sources:
        rows = source_shapes[source][-2]
        if first <= start and stop <= first + rows:
            cut = () if (start, stop) == (first, first + rows) else (Step("rows", (start - first, stop - first)),)
            return TensorMap(m.name, m.shape, (source,), cut + m.steps[2:])
        first += rows
    return m


def _restacked(inner: list[TensorMap], m: TensorMap) -> TensorMap | None:
    """stack(tail(select(e)(prefix(x))) for e in 0..E-1) is tail(prefix(x)) when tail works on trailing axes."""
    if not (m.steps and m.steps[0].op == "stack" and len({i.sources for i in inner}) == 1):
        return None
    first = inner[0].steps
    at = next((k for k, s in enumerate(first) if s.op == "select"), None)
    if at is None:
        return None
    prefix, tail = first[:at], first[at + 1 :]
    for e, i in enumerate(inner):
        if i.steps != (*prefix, Step("select", (e,)), *tail):
            return None
    if any(s.op not in TRAILING_OPS for s in tail):
        return None
    return TensorMap(m.name, m.shape, inner[0].sources, (*prefix, *tail, *m.steps[1:]))


INVERSE_PAIRS = {("transpose", "transpose"), ("add", "add")}


def simplify(m: TensorMap) -> TensorMap:
    """Drop adjacent steps that undo each other (norm -1 then +1, a transpose and its inverse) and merge
    consecutive row gathers into one."""
    steps: list[Step] = []
    for step in m.steps:
        if steps and (steps[-1].op, step.op) in INVERSE_PAIRS and _undoes(steps[-1], step):
            steps.pop()
            continue
        if steps and steps[-1].op == step.op == "take_rows":
            outer = steps.pop().args[0]
            steps.append(Step("take_rows", (tuple(outer[i] for i in step.args[0]),)))
            continue
        steps.append(step)
    return TensorMap(m.name, m.shape, m.sources, tuple(steps))


def _undoes(a: Step, b: Step) -> bool:
    if a.op == "add":
        return a.args[0] + b.args[0] == 0
    return sorted(a.args) == sorted(b.args)

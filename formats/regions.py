"""Parts of a weight and the stored bytes that hold them: what a tensor-parallel rank reads of each weight.

A `Region` is some of a logical weight's rows (axis -2) or columns (axis -1), as runs [start, stop) concatenated in
order (a rank's shard, runtime/parallel.py: one run, or one per section). `trace` follows a region back through a
map's steps (formats/transforms.py: stacks and concatenations of sources, row ranges and gathers, a final column
order) to the rows or columns of each stored source it takes, a `Cut`, and rewrites the map over the cut sources.
`part_cut` says which bytes of one stored part hold a cut, from the layout's `Grain` for that part (one table per
codec, formats/codecs.py; GGUF planes in formats/gguf_planes.py): rows are runs of whole stored rows (contiguous
bytes), columns runs of whole blocks in every row (strided bytes). A cut that would end inside a block (an FP8
128x128 scale tile, an NVFP4 group of 16, an affine group, a GGUF block of 32 or 256) is `Unaligned`.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from specpair.formats.transforms import Step, TensorMap

Runs = tuple[tuple[int, int], ...]  # [start, stop) ranges, in order
# A hole between two runs of a column cut narrower than this is read, not skipped: the OS reads whole pages anyway,
# and one read of whole rows beats a read per run per row. So a rank's columns save bytes where a row's runs are
# pages apart (in features of 4096 and up in bf16, at TP 2), and cost whole rows where rows are narrower.
PAGE = 4096


@dataclass(frozen=True)
class Grain:
    """How a stored part covers its weight [..., out, in]: each entry along the part's second-to-last axis holds
    `rows` weight rows, and its last axis holds the weight's columns in blocks of `values` (what one block's bytes
    hold: one value of a float, two FP4 codes in a byte, a GGUF block, one scale of a group)."""

    rows: int = 1
    values: int = 1


class Unaligned(ValueError):
    """A cut that would end inside a block of a stored part."""


@dataclass(frozen=True)
class Region:
    """Rows (axis -2) or columns (axis -1) of a logical weight: `runs` concatenated in order."""

    axis: int
    runs: Runs

    @property
    def size(self) -> int:
        return sum(stop - start for start, stop in self.runs)

    def indices(self) -> list[int]:
        return [i for start, stop in self.runs for i in range(start, stop)]

    def narrow(self, x: Tensor) -> Tensor:
        """This region of a whole float tensor."""
        pieces = [x.narrow(self.axis, start, stop - start) for start, stop in self.runs]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=self.axis)


@dataclass(frozen=True)
class Cut:
    """Rows and columns of one stored weight [..., out, in] (None: all of them), each as sorted runs: the same ones
    in every matrix of a stack."""

    rows: Runs | None = None
    cols: Runs | None = None

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        rows = shape[-2] if self.rows is None else _count(self.rows)
        cols = shape[-1] if self.cols is None else _count(self.cols)
        return (*shape[:-2], rows, cols)


@dataclass(frozen=True)
class Traced:
    """A region of a map's output as cuts of its sources: `map` over the cut sources (fewer than the original's
    where a concatenation loses some) gives the region."""

    map: TensorMap
    cuts: dict[str, Cut]


def trace(m: TensorMap, shapes: list[tuple[int, ...]], region: Region) -> Traced | None:
    """The cuts of `m`'s sources (of logical `shapes`) that `region` of its output takes, and the map that builds
    the region from them; None where a step is not one that moves whole rows, or a final column order."""
    steps = list(m.steps)
    if len(m.shape) < 2 or region.axis not in (-1, -2):
        return None
    tail = [steps.pop()] if steps and steps[-1].op == "take_cols" else []
    if any(s.op not in ("stack", "cat_rows", "rows", "take_rows") for s in steps) or any(
        s.op in ("stack", "cat_rows") for s in steps[1:]
    ):
        return None
    if not (steps and steps[0].op in ("stack", "cat_rows")) and len(m.sources) != 1:
        return None
    axis = len(m.shape) + region.axis
    shape = (*m.shape[:axis], region.size, *m.shape[axis + 1 :])
    rows = region.indices() if region.axis == -2 else list(range(m.shape[-2]))
    sources, row_cuts, row_steps = _rows(m, steps, shapes, rows)
    if region.axis == -2:
        cuts = {s: Cut(rows=runs) for s, runs in row_cuts.items()}
        return Traced(TensorMap(m.name, shape, sources, (*row_steps, *tail)), cuts)
    # columns: row moves leave them where they are, so every source used gives the same ones (and the rows used)
    want = region.indices()
    if tail:
        want = [tail[0].args[0][c] for c in want]
    keep = sorted(set(want))
    full = {s: ((0, shape[-2]),) for s, shape in zip(m.sources, shapes)}
    cuts = {s: Cut(rows=None if runs == full[s] else runs, cols=runs_of(keep)) for s, runs in row_cuts.items()}
    return Traced(TensorMap(m.name, shape, sources, (*row_steps, *_gather("take_cols", keep, want))), cuts)


def _rows(
    m: TensorMap, steps: list[Step], shapes: list[tuple[int, ...]], want: list[int]
) -> tuple[tuple[str, ...], dict[str, Runs], list[Step]]:
    """The sources that rows `want` of the row steps' output come from, the runs of rows each gives, and the steps
    that make those rows, in order, from the cut sources."""
    first = steps[0].op if steps and steps[0].op in ("stack", "cat_rows") else None
    for step in reversed(steps[1:] if first else steps):
        want = [step.args[0] + r for r in want] if step.op == "rows" else [step.args[0][r] for r in want]
    if first != "cat_rows":  # one source, or a stack: each source gives the same rows
        keep = sorted(set(want))
        lead = steps[:1] if first else []
        return m.sources, dict.fromkeys(m.sources, runs_of(keep)), [*lead, *_gather("take_rows", keep, want)]
    bounds = list(itertools.accumulate(s[-2] for s in shapes[:-1]))
    picked: dict[int, set[int]] = {}
    for r in want:
        k = bisect.bisect_right(bounds, r)
        picked.setdefault(k, set()).add(r - (bounds[k - 1] if k else 0))
    order, base = {}, 0
    for k in sorted(picked):
        for i, r in enumerate(sorted(picked[k])):
            order[(bounds[k - 1] if k else 0) + r] = base + i
        base += len(picked[k])
    positions = [order[r] for r in want]
    lead = [Step("cat_rows")] if len(picked) > 1 else []
    gather = [] if positions == list(range(base)) else [Step("take_rows", (tuple(positions),))]
    cuts = {m.sources[k]: runs_of(sorted(picked[k])) for k in sorted(picked)}
    return tuple(cuts), cuts, [*lead, *gather]


def _gather(op: str, keep: list[int], want: list[int]) -> list[Step]:
    """The gather of `want` from the kept indices, in order (none where they are already in that order)."""
    if keep == want:
        return []
    at = {index: i for i, index in enumerate(keep)}
    return [Step(op, (tuple(at[w] for w in want),))]


def runs_of(indices: list[int]) -> Runs:
    """Sorted distinct indices as maximal runs."""
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return tuple(out)


def _count(runs: Runs) -> int:
    return sum(stop - start for start, stop in runs)


@dataclass(frozen=True)
class PartCut:
    """The bytes of one stored part that a cut takes, the part seen as bytes [lead, entries, row_bytes]: runs of
    entries, runs of bytes within each entry (None: whole entries), and the cut part's shape (in the units of the
    part's own shape: elements, or a GGUF block tensor's values)."""

    lead: int
    entries: int
    row_bytes: int
    entry_runs: Runs
    byte_runs: Runs | None
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        width = self.row_bytes if self.byte_runs is None else _count(self.byte_runs)
        return self.lead * _count(self.entry_runs) * width

    @property
    def whole_rows(self) -> bool:
        """Whether the reader reads its entries whole and takes the runs in memory: some hole between runs, within
        a row or from one row to the next, is narrower than a PAGE."""
        if self.byte_runs is None:
            return True
        ends = [x for run in self.byte_runs for x in run]
        holes = [b - a for a, b in zip(ends[1::2], ends[2::2])]
        return min([*holes, self.row_bytes - ends[-1] + ends[0]]) < PAGE

    @property
    def read_nbytes(self) -> int:
        """The bytes the reader asks the file for: the cut's, or its entries whole (`whole_rows`)."""
        return self.lead * _count(self.entry_runs) * self.row_bytes if self.whole_rows else self.nbytes

    def spans(self) -> list[tuple[int, int]]:
        """(offset, length) of each run of bytes of a cut that is not read as whole rows, in order."""
        return [
            ((lead * self.entries + entry) * self.row_bytes + x, y - x)
            for lead in range(self.lead)
            for a, b in self.entry_runs
            for entry in range(a, b)
            for x, y in self.byte_runs or ()
        ]

    def ranges(self) -> list[tuple[int, int]]:
        """(offset, length) of each contiguous piece of its whole entries, in order; entries that follow each other
        are one piece."""
        merged: list[tuple[int, int]] = []
        for lead in range(self.lead):
            for a, b in self.entry_runs:
                offset, length = (lead * self.entries + a) * self.row_bytes, (b - a) * self.row_bytes
                if merged and sum(merged[-1]) == offset:
                    merged[-1] = (merged[-1][0], merged[-1][1] + length)
                else:
                    merged.append((offset, length))
        return merged

    def of(self, data: Tensor) -> Tensor:
        """The cut's bytes (uint8, flat) out of the whole part held in memory (`data`, any dtype and device): what a
        positioned read of the cut gives."""
        entries = data.contiguous().view(torch.uint8).reshape(self.lead, self.entries, self.row_bytes)
        rows = torch.cat([entries[:, a:b] for a, b in self.entry_runs], dim=1)
        return torch.cat([rows[:, :, x:y] for x, y in self.byte_runs or ((0, self.row_bytes),)], dim=2).reshape(-1)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The cut's bytes (flat) out of its entries read whole (`ranges`: uint8, flat, in order)."""
        rows = rows.reshape(self.lead, _count(self.entry_runs), self.row_bytes)
        runs = self.byte_runs or ((0, self.row_bytes),)
        return np.concatenate([rows[:, :, x:y] for x, y in runs], axis=-1).reshape(-1)


def part_cut(
    shape: tuple[int, ...], nbytes: int, weight: tuple[int, ...], grain: Grain | None, cut: Cut, what: str
) -> PartCut | None:
    """Which bytes of a stored part of `shape` and `nbytes` (of a weight of logical shape `weight`) hold `cut`;
    None for a per-tensor part (no grain: read whole). Unaligned where the cut ends inside a block."""
    if grain is None:
        return None
    if len(shape) < 2 or len(weight) < 2:
        raise ValueError(f"{what}: shape {list(shape)} has no rows to cut")
    rows, cols = weight[-2], weight[-1]
    entries, lead = shape[-2], math.prod(shape[:-2])
    blocks = -(-cols // grain.values)
    row_bytes = nbytes // max(1, lead * entries)
    if entries != -(-rows // grain.rows) or row_bytes * lead * entries != nbytes or row_bytes % blocks:
        raise ValueError(f"{what}: shape {list(shape)} ({nbytes} bytes) does not hold {list(weight)} in {grain}")
    if shape[-1] % blocks:
        raise ValueError(f"{what}: shape {list(shape)} is not {blocks} blocks a row")
    entry_runs = _units(cut.rows, grain.rows, rows, what, "row") if cut.rows is not None else ((0, entries),)
    block_runs = _units(cut.cols, grain.values, cols, what, "column") if cut.cols is not None else None
    block_bytes, per_block = row_bytes // blocks, shape[-1] // blocks
    byte_runs = None if block_runs is None else tuple((a * block_bytes, b * block_bytes) for a, b in block_runs)
    last = shape[-1] if block_runs is None else _count(block_runs) * per_block
    return PartCut(lead, entries, row_bytes, entry_runs, byte_runs, (*shape[:-2], _count(entry_runs), last))


def _units(runs: Runs, size: int, total: int, what: str, axis: str) -> Runs:
    """Runs of weight rows or columns as runs of whole blocks of `size` (the last may end with the weight)."""
    out = []
    for start, stop in runs:
        if start % size or (stop % size and stop != total):
            raise Unaligned(f"{axis}s {start}:{stop} of {what} end inside a block of {size} {axis}s")
        out.append((start // size, -(-stop // size)))
    return tuple(out)

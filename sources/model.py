"""`open_model`: one checkpoint, whatever its file format, layout and naming, as a typed config and canonical
logical weights — what the runtime and the converter are written against.

Opening reads headers and small files only. Every canonical weight (checkpoint/names.py) is a `TensorMap`
over the source's stored weights: HF names directly, MLX names through checkpoint/mlx_names.py, GGUF names
through checkpoint/gguf_arch.py, then to canonical names; the maps carry every value transform (a GGUF's
1 + w norms, -exp(A_log), tiled value heads, llama's interleaved rope rows), so `load` gives the same
float tensor from every source, within each layout's error. `load_packed` keeps quantized blocks as
stored wherever moving stored rows is exact (stacking experts, splitting fused gate/up rows, head reorders
of row-wise layouts) and carries what is not (a column order) as data. `stream` reads each stored byte once,
in file order, holding only the sources of the weights still to come; given a region of a weight (a tensor-parallel
rank's shard), it reads only the bytes that hold it (`reading`, formats/regions.py).
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from specpair.checkpoint import Checkpoint, speculators
from specpair.checkpoint.config import ModelConfig, parse_config
from specpair.checkpoint.hf import WEIGHT_PICKLE, from_pickle_command
from specpair.checkpoint.names import canonical_maps
from specpair.errors import BadInput
from specpair.formats import TensorTable
from specpair.formats.codecs import FLOAT_LAYOUTS, TORCH_DTYPES, codec, grains
from specpair.formats.gguf import GGUFHeader
from specpair.formats.layouts import EXL3, layout_of
from specpair.formats.packed import Packed
from specpair.formats.regions import Cut, Region, Unaligned, part_cut, trace
from specpair.formats.transforms import Step, TensorMap, compose, identity
from specpair.formats.weights import TensorReader, Weight, gguf_weights, hf_weights, read_cut, read_parts
from specpair.sources.reading import RepoFiles

MAX_SMALL_FILE = 256 * 1024 * 1024


class ModelFiles(RepoFiles, TensorReader, Protocol):
    """A checkpoint's files as `open_model` reads them: LocalFiles (sources/local.py), or any source serving the
    same files and tensors (a benchmark's generated checkpoint)."""

    def sha256(self, path: str) -> str | None:
        """A file's sha256; None where the source makes the file rather than holds it."""


@dataclass(frozen=True)
class Reading:
    """How `stream` makes one weight: `map` over what it reads of each source (a cut, or None: all of it), then
    `rest` cut from the result in memory (a region whose sources could not be cut: they are read whole)."""

    map: TensorMap
    reads: tuple[tuple[str, Cut | None], ...]
    rest: Region | None = None


@dataclass
class Model:
    ref: str  # what the user typed
    root: str  # the directory holding the files
    file_format: str  # "safetensors" | "gguf"
    naming: str  # how the source names tensors: "hf" | "mlx" | "gguf"
    config: ModelConfig
    hf_config: dict[str, Any]  # config.json (made from the header for a GGUF)
    weights: dict[str, Weight]  # stored weights by source name, in file order
    maps: dict[str, TensorMap]  # canonical name -> how it is made from `weights`
    hf: list[TensorMap] = field(default_factory=list)  # the stored weights in HF names (what HF targets write)
    files: list[str] = field(default_factory=list)  # files of an HF directory (relative), or the GGUF file
    header: GGUFHeader | None = None
    notes: list[str] = field(default_factory=list)
    reader: ModelFiles | None = None  # where the files and tensor bytes come from: sources.local.LocalFiles over `root`
    weights_only: bool = False  # a drafter GGUF with no tokenizer and no embedding: its vocabulary is its
    # target's, and config.vocab_size a placeholder until it is opened with `target_vocab`

    @property
    def names(self) -> list[str]:
        return list(self.maps)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._map(name).shape

    def layout(self, name: str) -> str:
        """The stored layout of a weight's sources ("bf16", "nvfp4-modelopt", "gguf-Q4_K", ...)."""
        layouts = {self.weights[s].layout for s in self._map(name).sources}
        return layouts.pop() if len(layouts) == 1 else "mixed"

    def load(self, name: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Tensor:
        """The canonical float tensor, every transform applied (decoded in float32 on `device`)."""
        m = self._map(name)
        return self.decode(m, [self.read(s) for s in m.sources], device).to(dtype)

    def load_packed(self, name: str, device: str | torch.device = "cpu") -> Packed | None:
        """The weight in its stored layout, when it is quantized and the map moves only whole stored rows
        (None: float, or no exact packed form; `load` it instead)."""
        m = self._map(name)
        return self._packed(m, [self.read(s) for s in m.sources], device)

    def stream(
        self,
        names: Iterable[str] | None = None,
        *,
        packed: Callable[[str], bool] | bool = False,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        progress: Callable[[int], None] | None = None,
        regions: Callable[[str], Region | None] | None = None,
    ) -> Iterator[tuple[str, Tensor | Packed]]:
        """(name, tensor) for `names` (default: all), in file order, each stored byte read once. Weights for
        which `packed` says so come as `Packed` where they have an exact packed form. Where `regions` gives a
        region of a weight, only that region comes, from only the bytes that hold it where they can be told
        (`reading`). `progress` gets the bytes of each stored part as it is read."""
        wanted = []
        for name in names if names is not None else self.maps:
            as_packed = packed(name) if callable(packed) else packed
            wanted.append((name, as_packed, self.reading(name, regions(name) if regions else None)))
        order = {name: i for i, name in enumerate(self.weights)}
        wanted.sort(key=lambda w: min(order[s] for s, _ in w[2].reads))
        users: dict[tuple[str, Cut | None], int] = {}
        for _, _, r in wanted:
            for read in r.reads:
                users[read] = users.get(read, 0) + 1
        held: dict[tuple[str, Cut | None], dict[str, Tensor]] = {}
        for name, as_packed, r in wanted:
            for read in r.reads:
                if read not in held:
                    source, cut = read
                    w = self.weights[source]
                    held[read] = self.read(source) if cut is None else read_cut(w, self.reader, cut)
                    if progress:
                        progress(self.read_nbytes(source, cut))  # what was asked of the files
            stored = [held[read] for read in r.reads]
            weights = [self.weights[s] if cut is None else self._cut(self.weights[s], cut) for s, cut in r.reads]
            value = self._packed(r.map, stored, device, weights) if as_packed and r.rest is None else None
            if value is None:
                value = self.decode(r.map, stored, device, weights).to(dtype)
                # a copy: a view of one run would keep the whole weight alive on this rank
                value = value if r.rest is None else r.rest.narrow(value).clone()
            yield name, value
            for read in r.reads:
                users[read] -= 1
                if not users[read]:
                    del held[read]

    def reading(self, name: str, region: Region | None = None) -> Reading:
        """How `stream` makes weight `name`, or `region` of it: the cuts of its sources that hold the region, where
        its map's steps move whole rows and columns only, every stored part has a grain and no cut ends inside a
        block (formats/regions.py); otherwise its sources whole, decoded, the region cut from the floats (exact
        whatever the cut: the fallback costs bytes read, never values)."""
        m = self._map(name)
        whole = Reading(m, tuple((s, None) for s in m.sources), region)
        if region is None:
            return whole
        traced = trace(m, [self.weights[s].shape for s in m.sources], region)
        if traced is None or any(
            (table := grains(self.weights[s].layout)) is None or not table.keys() >= self.weights[s].parts.keys()
            for s in traced.cuts
        ):
            return whole
        try:
            for source, cut in traced.cuts.items():
                self.read_nbytes(source, cut)  # every part's cut, checked against its blocks
        except Unaligned:
            return whole
        return Reading(traced.map, tuple(traced.cuts.items()))

    @staticmethod
    def _cut(weight: Weight, cut: Cut) -> Weight:
        """The stored weight a cut of `weight` is: its logical shape (its parts are what read_cut read)."""
        return replace(weight, shape=cut.shape(weight.shape))

    def read_nbytes(self, source: str, cut: Cut | None = None, held: bool = False) -> int:
        """Bytes read of a stored weight: all of it, or for `cut` what the reader asks the files for (its rows whole
        where its columns lie under a page apart; `held`: the bytes it keeps). Unaligned if it ends inside a block."""
        w = self.weights[source]
        if cut is None:
            return sum(info.nbytes for info in w.parts.values())
        table = grains(w.layout) or {}
        total = 0
        for key, info in w.parts.items():
            where = part_cut(info.shape, info.nbytes, w.shape, table[key], cut, w.part_name(key))
            total += info.nbytes if where is None else where.nbytes if held else where.read_nbytes
        return total

    def tokenizer(self):
        """The working tokenizer (checkpoint/text_tokenizer.py) of this checkpoint."""
        from specpair.checkpoint.text_tokenizer import TextTokenizer

        if self.header is not None:
            return TextTokenizer.from_gguf(self.header.fields, self.header.path)
        raw = self._small("tokenizer.json")
        if raw is None:
            raise BadInput(self.root, "has no tokenizer.json (a drafter takes its target's tokenizer)")
        template = self._small("chat_template.jinja")
        return TextTokenizer.from_files(
            raw,
            self._json("tokenizer_config.json"),
            self._json("generation_config.json"),
            template.decode("utf-8", "replace") if template is not None else None,
            os.path.join(self.root, "tokenizer.json"),
        )

    # ---------------------------------------------------------------------------------------------------

    def _map(self, name: str) -> TensorMap:
        m = self.maps.get(name)
        if m is None:
            raise BadInput(self.ref, f"has no weight {name!r}")
        return m

    def read(self, source: str) -> dict[str, Tensor]:
        """The stored parts of one stored weight (a name of `weights`)."""
        return read_parts(self.weights[source], self.reader)

    def checkpoint(self) -> Checkpoint:
        """The metadata `specpair check` judges (checkpoint.Checkpoint), read from the same files."""
        from specpair.sources.reading import read_checkpoint

        return read_checkpoint(self.reader, self.ref, "local", self.files[0] if self.header is not None else None)

    def decode(
        self,
        m: TensorMap,
        stored: list[dict[str, Tensor]],
        device: str | torch.device,
        weights: list[Weight] | None = None,
    ) -> Tensor:
        """The float tensor of a map over `weights` (canonical, or the converter's), from its sources' stored
        parts (`weights`: its sources, where they are cuts of the stored ones). Leading row moves (an expert out
        of a stack, gate or up rows of a fused projection) run on the stored parts first wherever that is exact,
        so only the rows asked for are decoded."""
        weights = weights or [self.weights[s] for s in m.sources]
        narrowed = narrow_stored(m, stored, [w.shape for w in weights], {w.layout for w in weights})
        if narrowed is not None:
            parts, shape, rest = narrowed
            w = weights[0]
            x = (
                parts[""].to(device)
                if w.layout == "int"
                else codec(w.layout).decode({k: v.to(device) for k, v in parts.items()}, shape, w.name)
            )
            return TensorMap(m.name, m.shape, (m.name,), rest).apply([x])
        floats = []
        for w, parts in zip(weights, stored):
            if w.layout == "int":
                floats.append(parts[""].to(device))
            else:
                floats.append(codec(w.layout).decode({k: v.to(device) for k, v in parts.items()}, w.shape, w.name))
        return m.apply(floats)

    def _packed(
        self,
        m: TensorMap,
        stored: list[dict[str, Tensor]],
        device: str | torch.device,
        weights: list[Weight] | None = None,
    ) -> Packed | None:
        weights = weights or [self.weights[s] for s in m.sources]
        layouts = {w.layout for w in weights}
        if len(layouts) != 1:
            return None
        layout = layouts.pop()
        if layout in FLOAT_LAYOUTS or layout == "int":
            return None
        moved = move_stored_rows(m, stored, [w.shape for w in weights], layout)
        if moved is None:
            return None
        parts, col_order = moved
        if len(m.shape) == 3:  # one stored stack of experts with one per-tensor value: each expert's (Packed)
            parts = {
                k: v.reshape(()).expand(m.shape[0]).contiguous() if v.numel() == 1 else v for k, v in parts.items()
            }
        return Packed(m.name, layout, m.shape, parts, col_order).to(device)

    def _small(self, name: str) -> bytes | None:
        return self.reader.read(name, MAX_SMALL_FILE) if name in self.files else None

    def _json(self, name: str) -> dict[str, Any] | None:
        from specpair.sources.reading import read_json

        return read_json(self.reader, name) if name in self.files else None


# ------------------------------------------------------------------------------------------------ packed rows

ROW_OPS = ("stack", "select", "rows", "take_rows", "cat_rows")
TILE = 128  # fp8-block scale tiles


def move_stored_rows(
    m: TensorMap, stored: list[dict[str, Tensor]], shapes: list[tuple[int, ...]], layout: str
) -> tuple[dict[str, Tensor], Tensor | None] | None:
    """Apply a map's steps to the stored parts of a quantized layout where that is exact: whole rows of
    row-wise parts (codes and scales of one row stay together), per-tensor scalars carried along (stacked
    into [E] for experts), fp8-block scale tiles when rows move by whole tiles. A final column gather becomes
    a column order. None where no exact form exists."""
    steps = list(m.steps)
    col_order = None
    if steps and steps[-1].op == "take_cols":
        col_order = torch.tensor(steps.pop().args[0], dtype=torch.long)
    if any(s.op not in ROW_OPS for s in steps):
        return None
    if not steps:
        if len(stored) != 1:
            return None
        return dict(stored[0]), col_order
    kinds = [_part_kinds(parts, shape, layout) for parts, shape in zip(stored, shapes)]
    if any(k is None for k in kinds) or len({tuple(sorted(k)) for k in kinds}) != 1:
        return None
    first, *rest = steps
    if first.op in ("stack", "cat_rows"):
        parts = _combine(first.op, stored, kinds, shapes)
        rows = sum(s[-2] for s in shapes) if first.op == "cat_rows" else shapes[0][-2]
    elif len(stored) == 1:
        parts, rows = dict(stored[0]), shapes[0][-2]
        rest = steps
    else:
        return None
    if parts is None:
        return None
    kind = kinds[0]
    stacked = first.op == "stack"
    for step in rest:
        if step.op == "select":
            if not stacked and not all(kind[k] == "rows" for k in parts):
                return None
            parts = {k: v[step.args[0]] for k, v in parts.items()}
            stacked = False
        elif step.op in ("rows", "take_rows"):
            index = tuple(range(*step.args)) if step.op == "rows" else step.args[0]
            parts = _gather_rows(parts, kind, index, rows)
            if parts is None:
                return None
            rows = len(index)
        else:
            return None
    return parts, col_order


def narrow_stored(
    m: TensorMap, stored: list[dict[str, Tensor]], shapes: list[tuple[int, ...]], layouts: set[str]
) -> tuple[dict[str, Tensor], tuple[int, ...], tuple[Step, ...]] | None:
    """(parts, logical shape, remaining steps): the map's leading row moves applied to the stored parts of its
    one layout, where they are exact and leave less to decode than the sources hold; None otherwise."""
    if len(layouts) != 1:
        return None
    layout = layouts.pop()
    lead = 0
    for step in m.steps:
        if step.op not in ROW_OPS:
            break
        lead += 1
    if not lead or m.steps[0].op in ("stack", "cat_rows") and lead == 1:
        return None  # nothing is dropped: decoding the sources costs the same
    prefix = TensorMap(m.name, _shape_after(m.steps[:lead], shapes), m.sources, m.steps[:lead])
    moved = move_stored_rows(prefix, stored, shapes, layout)
    if moved is None or moved[1] is not None:
        return None
    return moved[0], prefix.shape, m.steps[lead:]


def _shape_after(steps: tuple[Step, ...], shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The logical shape row steps leave (the first step takes every source, the others one tensor)."""
    first, *rest = steps
    if first.op == "stack":
        shape = (len(shapes), *shapes[0])
    elif first.op == "cat_rows":
        shape = (*shapes[0][:-2], sum(s[-2] for s in shapes), shapes[0][-1])
    else:
        shape, rest = shapes[0], list(steps)
    for step in rest:
        if step.op == "select":
            shape = shape[1:]
        elif step.op == "rows":
            shape = (*shape[:-2], step.args[1] - step.args[0], shape[-1])
        elif step.op == "take_rows":
            shape = (*shape[:-2], len(step.args[0]), shape[-1])
    return shape


def _part_kinds(parts: dict[str, Tensor], shape: tuple[int, ...], layout: str) -> dict[str, str] | None:
    """Per part: "rows" (one stored row per weight row), "scalar" (per tensor), "tiles" (fp8-block scales)."""
    rows = math.prod(shape[:-1])
    row_blocked = codec(layout).row_block > 1  # its scales are tiles over blocks of rows
    kinds = {}
    for key, part in parts.items():
        if row_blocked and key != ".weight":
            kinds[key] = "tiles"
        elif part.numel() == 1:
            kinds[key] = "scalar"
        elif part.ndim > 1 and math.prod(part.shape[:-1]) == rows:
            kinds[key] = "rows"
        else:
            return None
    return kinds


def _combine(
    op: str, stored: list[dict[str, Tensor]], kinds: list[dict[str, str]], shapes: list[tuple[int, ...]]
) -> dict[str, Tensor] | None:
    out = {}
    for key, kind in kinds[0].items():
        values = [parts[key] for parts in stored]
        if op == "stack":
            out[key] = torch.stack([v.reshape(()) if kind == "scalar" else v for v in values])
        elif kind == "rows":
            out[key] = torch.cat(values, dim=-2)
        elif kind == "scalar" and all(torch.equal(v.reshape(()), values[0].reshape(())) for v in values):
            out[key] = values[0]
        elif kind == "tiles" and all(s[-2] % TILE == 0 for s in shapes[:-1]):
            out[key] = torch.cat(values, dim=-2)
        else:
            return None
    return out


def _gather_rows(
    parts: dict[str, Tensor], kind: dict[str, str], index: tuple[int, ...], rows: int
) -> dict[str, Tensor] | None:
    out = {}
    for key, part in parts.items():
        if kind[key] == "scalar":
            out[key] = part
        elif kind[key] == "rows":
            out[key] = part.index_select(-2, torch.tensor(index, dtype=torch.long))
        else:  # tiles: only a run of whole tiles (the last one may be partial)
            start, count = index[0], len(index)
            if index != tuple(range(start, start + count)) or start % TILE or (count % TILE and start + count != rows):
                return None
            out[key] = part[..., start // TILE : -(-(start + count) // TILE), :]
    return out


# ------------------------------------------------------------------------------------------------ opening


def open_model(ref: str, gguf_file: str | None = None, target_vocab: int | None = None) -> Model:
    """A local checkpoint directory or .gguf file, or a Hub repo already in the HF cache. Headers only.
    `target_vocab`: the vocabulary of a weights-only drafter GGUF (no tokenizer, no embedding), its target's."""
    from specpair.sources.local import LocalFiles

    path = local_path(ref)
    if path.endswith(".gguf") or gguf_file:
        return _open_gguf(ref, os.path.abspath(path if not gguf_file else os.path.join(path, gguf_file)), target_vocab)
    files = LocalFiles(path)
    names = sorted(e.path for e in files.list())
    if "config.json" not in names:
        ggufs = [n for n in names if n.endswith(".gguf")]
        if len(ggufs) == 1:
            return _open_gguf(ref, os.path.join(os.path.abspath(path), ggufs[0]), target_vocab)
        raise BadInput(
            files.where,
            f"has no config.json and {len(ggufs)} GGUF files"
            + (f"; choose one with --gguf-file ({', '.join(ggufs[:6])})" if ggufs else ""),
        )
    return _open_hf(ref, path, files, names)


def open_files(files: ModelFiles) -> Model:
    """An HF-layout checkpoint from any source of its files (`files.where` names it), read as from a directory."""
    return _open_hf(files.where, files.where, files, sorted(e.path for e in files.list()))


def _open_hf(ref: str, path: str, files: ModelFiles, names: list[str]) -> Model:
    from specpair.checkpoint.mlx_names import from_mlx, is_mlx_layout
    from specpair.sources.reading import check_index, read_json, safetensors_shards

    hf_config = read_json(files, "config.json", required=True)
    where = os.path.join(files.where, "config.json")
    speculators_kind = None
    if speculators.is_speculators(hf_config):  # read as the config vLLM builds from it, in the kind's own names
        hf_config, _, speculators_kind = speculators.read(hf_config, where)
    config = parse_config(
        hf_config, where, read_json(files, "generation_config.json") if "generation_config.json" in names else None
    )
    shards, index = safetensors_shards(files, set(names))
    if not shards:
        pickles = [n for n in names if WEIGHT_PICKLE.fullmatch(n)]
        if pickles:
            raise BadInput(
                files.where,
                f"has its weights only as pickles ({', '.join(pickles)}), which specpair never unpickles on its own: "
                f"make a safetensors copy with `{from_pickle_command(ref)}` (torch's weights-only loader)",
            )
        raise BadInput(files.where, "has no .safetensors weights (a metadata-only copy?)")
    tensors = files.safetensors_headers(shards)
    if index is not None:
        check_index(f"{files.where}/{index[0]}", index[1], TensorTable.of(tensors))
    weights = unpadded(hf_weights(tensors, hf_config.get("quantization")), hf_config, files.where)
    for w in weights:
        check_readable(w, files.where)
    shapes = {w.name: w.shape for w in weights}
    notes: list[str] = []
    if is_mlx_layout(config.family, list(shapes)):
        naming, to_hf = "mlx", from_mlx(config.family, shapes)
    elif speculators_kind is not None:
        naming = "hf"
        to_hf, notes = speculators.tensor_maps(speculators_kind, shapes, config.vocab_size, files.where)
    else:
        naming, to_hf = "hf", [identity(n, s) for n, s in shapes.items()]
    maps = compose(to_hf, canonical_maps(config, {m.name: m.shape for m in to_hf}), shapes)
    return Model(
        ref,
        path,
        "safetensors",
        naming,
        config,
        hf_config,
        {w.name: w for w in weights},
        {m.name: m for m in maps},
        to_hf,
        files=names,
        notes=notes,
        reader=files,
    )


def _open_gguf(ref: str, path: str, target_vocab: int | None) -> Model:
    from specpair.checkpoint import gguf_arch
    from specpair.sources.local import LocalFiles

    directory, name = os.path.split(path)
    files = LocalFiles(directory, only=name)
    header = files.gguf_header(name)
    weights = {w.name: w for w in gguf_weights(header)}
    rope = weights.get("rope_freqs.weight")  # Llama 3 rope scaling lives in this tensor's data
    values = read_parts(rope, files)[""].float().tolist() if rope is not None else None
    fields = header.fields
    weights_only = target_vocab is None and gguf_arch.weights_only_drafter(
        fields, {n: w.shape for n, w in weights.items()}
    )
    with gguf_arch.naming(path):
        plan = gguf_arch.from_gguf(
            fields,
            {n: w.shape for n, w in weights.items()},
            rope_freqs=values,
            target_vocab=WEIGHTS_ONLY_VOCAB if weights_only else target_vocab,
        )
    config = parse_config(plan.config, path)
    maps = compose(
        plan.tensors,
        canonical_maps(config, {m.name: m.shape for m in plan.tensors}),
        {n: w.shape for n, w in weights.items()},
    )
    return Model(
        ref,
        directory,
        "gguf",
        "gguf",
        config,
        plan.config,
        weights,
        {m.name: m for m in maps},
        plan.tensors,
        files=[name],
        header=header,
        notes=list(plan.notes),
        reader=files,
        weights_only=weights_only,
    )


WEIGHTS_ONLY_VOCAB = 1  # config.vocab_size of a weights-only drafter opened without its target's


def unpadded(weights: list[Weight], config: dict[str, Any], where: str) -> list[Weight]:
    """EXL3 pads both dims to 128: the real shapes come from the model the config describes."""
    import dataclasses

    padded = {w.name for w in weights if layout_of(w.layout).kind == EXL3}
    if not padded:
        return weights
    from specpair.checkpoint import gguf_arch

    with gguf_arch.naming(os.path.join(where, "config.json")):
        expected = gguf_arch.hf_shapes(config, {w.name: w.shape for w in weights})
    out = []
    for w in weights:
        shape = expected.get(w.name, w.shape)
        if w.name in padded and tuple(-(-d // 128) * 128 for d in shape) != w.shape:
            raise BadInput(
                f"{where}/{w.module}.trellis",
                f"holds a padded {list(w.shape)} weight, which does not fit the {list(shape)} the config gives it",
            )
        out.append(dataclasses.replace(w, shape=shape) if w.name in padded else w)
    return out


def check_readable(weight: Weight, where: str) -> None:
    """A tensor whose dtype torch cannot hold, or a layout without a codec, is refused by name up front."""
    for key, info in weight.parts.items():
        if info.dtype not in TORCH_DTYPES:
            raise BadInput(
                os.path.join(where, info.file),
                f"tensor {weight.part_name(key)!r} has dtype {info.dtype}, which specpair cannot read",
            )
    if weight.layout != "int":
        try:
            codec(weight.layout)
        except BadInput:
            raise BadInput(
                os.path.join(where, weight.parts[next(iter(weight.parts))].file),
                f"weight {weight.name!r} is stored as {weight.layout}, which specpair cannot read",
            ) from None


def local_path(ref: str) -> str:
    """A path as typed, or the snapshot of a Hub repo `org/name[@revision]` in the HF cache."""
    path = os.path.expanduser(ref)
    if os.path.exists(path):
        return path
    from specpair.sources.reading import REPO_ID

    repo, _, revision = ref.partition("@")
    if REPO_ID.match(repo):
        from specpair.sources.hub import CachedFiles
        from specpair.sources.settings import settings_from_env

        cached = CachedFiles.find(repo, revision or None, settings_from_env(True).cache_dir)
        if cached is not None:
            return cached.snapshot
        # download refuses a branch unless told to lock the commit it points to now
        pinned = re.fullmatch(r"[0-9a-f]{40}", revision.lower()) is not None
        fetch = shlex.join(["specpair", "download", ref] + ([] if pinned else ["--no-require-sha"]))
        raise BadInput(
            ref,
            f"is not in the Hugging Face cache; fetch it first with `{fetch}` (specpair reads weights from local "
            "files only)",
        )
    raise BadInput(ref, "no such file or directory")

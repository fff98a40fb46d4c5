"""`specpair convert SRC DST --from-pickle`: a safetensors copy of a checkpoint published with pickled weights only
(pytorch_model.bin, as the EAGLE authors publish EAGLE-3 heads), or of a drafter that ships its learned mask
embedding as a pickle beside safetensors weights (mask_embedding.pt, as SGLang and vLLM load it), read through
torch's restricted weights-only loader and never otherwise.

Each weight pickle must unpickle, under torch.load(weights_only=True), to a state dict: names mapped to dense
tensors. A mask embedding pickle (its drafter kind's MaskEmbedding row names the file) must hold the vector
[hidden_size], bare or as SGLang's {"embedding": ..., "mask_token_id": ...} with the config's mask token id; it
becomes the tensor the row names, in a safetensors file of its own (added to the index when there is one).
Anything else (a payload that would run code, another object, a wrong shape, a truncated file) is refused with one
line naming the file, before anything is written. The copy is built under DST.specpair-partial and renamed at the
end; an error or SIGTERM/SIGINT removes it. The checkpoint's other files are copied as they are, its other pickles
(training_args.bin, ...) left out.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from safetensors.torch import save_file

from specpair.checkpoint import speculators
from specpair.checkpoint.config import parse_config
from specpair.checkpoint.families import DRAFTER_KINDS, MaskEmbedding
from specpair.checkpoint.hf import PICKLE_SUFFIXES, WEIGHT_PICKLE
from specpair.convert.converter import PARTIAL_SUFFIX, ConvertFailed, signals_interrupt
from specpair.errors import BadInput
from specpair.sources.local import LocalFiles
from specpair.sources.model import local_path
from specpair.sources.reading import read_json, safetensors_shards

PICKLE_INDEX = "pytorch_model.bin.index.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class PickleReport:
    destination: str
    written: list[str]  # safetensors files, one per pickle converted
    tensors: int
    nbytes: int
    left_out: list[str]  # pickles that hold no weights, not copied

    def to_json(self) -> dict[str, object]:
        return {
            "destination": self.destination,
            "written": self.written,
            "tensors": self.tensors,
            "bytes": self.nbytes,
            "left_out": self.left_out,
        }


def from_pickle(source: str, destination: str, note: Callable[[str], None] = print) -> PickleReport:
    """Write `destination`: the checkpoint at `source` with each weight pickle as a safetensors file; `note` hears
    each stage."""
    path = local_path(source)
    if not os.path.isdir(path):
        raise BadInput(source, "--from-pickle converts a checkpoint directory (config.json beside pytorch_model.bin)")
    files = LocalFiles(path)
    names = [e.path for e in files.list()]
    pickles = sorted(n for n in names if WEIGHT_PICKLE.fullmatch(os.path.basename(n)) and os.sep not in n)
    has_safetensors = any(n.endswith(".safetensors") for n in names)
    mask = _mask_row(files, names)
    if has_safetensors and (pickles or mask is None):
        raise BadInput(
            files.where,
            "already has .safetensors weights: --from-pickle is for checkpoints with none, or a drafter's "
            "mask_embedding.pt beside them",
        )
    if not pickles and mask is None:
        raise BadInput(files.where, "has no weight pickle (pytorch_model*.bin) or drafter mask_embedding.pt to convert")
    if os.path.lexists(destination):
        raise BadInput(destination, "already exists; remove it or choose another destination")
    # every pickle is read and checked before anything is written
    converted = {}
    for name in pickles:
        note(f"reading {name} with torch's weights-only loader")
        out = "model" + os.path.basename(name).removeprefix("pytorch_model").removeprefix("model")
        converted[name] = (out.removesuffix(".bin") + ".safetensors", _state_dict(files.inside(name)))
    if mask is not None:
        row, hidden, mask_token_id = mask
        _refuse_shipped_tensor(files, names, row)
        note(f"reading {row.pickle} with torch's weights-only loader")
        vector = _mask_embedding(files.inside(row.pickle), hidden, mask_token_id)
        converted[row.pickle] = (_mask_file(row), {row.tensor: vector})
    with signals_interrupt():
        return _write(files, names, converted, destination)


def _mask_row(files: LocalFiles, names: list[str]) -> tuple[MaskEmbedding, int, int | None] | None:
    """(the kind's MaskEmbedding row, hidden_size, mask_token_id) of a drafter whose mask embedding pickle lies
    beside its weights; None for any other checkpoint."""
    pickled = {k.mask_embedding.pickle for k in DRAFTER_KINDS.values() if k.mask_embedding}
    if not pickled & set(names) or "config.json" not in names:
        return None
    config = read_json(files, "config.json", required=True)
    where = os.path.join(files.where, "config.json")
    if speculators.is_speculators(config):
        config, _, _ = speculators.read(config, where)
    model = parse_config(config, where)
    row = DRAFTER_KINDS[model.drafter.kind].mask_embedding if model.drafter else None
    if row is None or row.pickle not in names:
        return None
    return row, model.hidden_size, model.drafter.mask_token_id


def _refuse_shipped_tensor(files: LocalFiles, names: list[str], row: MaskEmbedding) -> None:
    """The copy holds one mask embedding: none among the weights already, no file of the name it is written to."""
    if _mask_file(row) in names:
        raise BadInput(files.inside(_mask_file(row)), "exists already: the mask embedding's copy would overwrite it")
    shards, _ = safetensors_shards(files, set(names))
    if row.tensor in files.safetensors_table(shards).names:
        raise BadInput(
            files.where, f"holds a {row.tensor!r} weight and {row.pickle} beside it: which one is meant is unclear"
        )


def _mask_file(row: MaskEmbedding) -> str:
    return f"{row.tensor}.safetensors"


def _unpickled(full: str) -> object:
    """What torch's weights-only unpickler builds from the file; BadInput for what it refuses or cannot read."""
    try:
        with warnings.catch_warnings():  # its notes on pickle protocols are not the user's business
            warnings.simplefilter("ignore")
            return torch.load(full, map_location="cpu", weights_only=True, mmap=False)
    except pickle.UnpicklingError as e:  # what the weights-only unpickler refuses to build
        raise BadInput(full, f"refused by torch's weights-only loader: {_reason(e)}") from None
    except Exception as e:  # noqa: BLE001 - whatever else reading it raises, the file is refused in one line
        raise BadInput(full, f"not a complete torch.save file, refused ({_reason(e)})") from None


def _mask_embedding(full: str, hidden: int, mask_token_id: int | None) -> torch.Tensor:
    """The vector [hidden] of a mask embedding pickle: the bare tensor (vLLM reads it so) or SGLang's dict, whose
    mask_token_id must be the config's (SGLang and vLLM refuse a mismatch); BadInput for anything else."""
    loaded = _unpickled(full)
    if isinstance(loaded, dict):
        saved = loaded.get("mask_token_id", mask_token_id)
        if saved != mask_token_id or isinstance(saved, bool):
            raise BadInput(full, f"was saved for mask_token_id {saved!r}, but the drafter's config has {mask_token_id}")
        if loaded.get("per_position"):
            raise BadInput(full, "holds per-position mask embeddings (per_position), which no stack drafts with")
        if "embedding" not in loaded:
            raise BadInput(full, f"has no 'embedding' entry (keys: {', '.join(map(repr, loaded))})")
        loaded = loaded["embedding"]
    if not isinstance(loaded, torch.Tensor) or loaded.layout != torch.strided or not loaded.is_floating_point():
        kind = (
            type(loaded).__name__ if not isinstance(loaded, torch.Tensor) else f"{loaded.dtype} {loaded.layout} tensor"
        )
        raise BadInput(full, f"holds a {kind} where the mask embedding belongs: a float tensor [{hidden}]")
    if tuple(loaded.shape) not in ((hidden,), (1, hidden)):
        raise BadInput(
            full,
            f"holds a {list(loaded.shape)} tensor, where the mask embedding is [{hidden}] (the drafter's hidden_size)",
        )
    return loaded.reshape(hidden)


def _state_dict(full: str) -> dict[str, torch.Tensor]:
    """The file's tensors by name, through torch's weights-only unpickler; BadInput for anything else."""
    loaded = _unpickled(full)
    if not isinstance(loaded, dict):
        raise BadInput(full, f"holds a {type(loaded).__name__}, not a state dict (names mapped to tensors)")
    for key, value in loaded.items():
        if not isinstance(key, str):
            raise BadInput(full, f"has a {type(key).__name__} key {key!r}, not a tensor name")
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.is_quantized:
            kind = type(value).__name__ if not isinstance(value, torch.Tensor) else f"{value.layout} tensor"
            raise BadInput(full, f"holds a {kind} at {key!r}: only dense tensors are converted")
    return loaded


def _reason(error: Exception) -> str:
    """The informative line of a torch.load error (its messages run over many lines of advice)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    line = next((x for x in lines if x.startswith(("Trying to load", "Unsupported"))), lines[0] if lines else "")
    return (line.split(". ")[0].rstrip(".") or type(error).__name__)[:300]


def _write(
    files: LocalFiles, names: list[str], converted: dict[str, tuple[str, dict[str, torch.Tensor]]], destination: str
) -> PickleReport:
    """`converted`: pickle -> (the safetensors file it becomes, its tensors)."""
    partial = destination.rstrip("/") + PARTIAL_SUFFIX
    try:
        shutil.rmtree(partial, ignore_errors=True)  # a run killed earlier leaves only this name behind
        os.makedirs(partial)
    except OSError as e:
        raise BadInput(destination, f"cannot create {partial} ({e.strerror or e})") from None
    try:
        written, weight_map, nbytes = [], {}, 0
        for out, state in converted.values():
            # safetensors stores each tensor's own bytes: views and tied weights become copies
            save_file(
                {k: v.contiguous().clone() for k, v in state.items()}, os.path.join(partial, out), {"format": "pt"}
            )
            written.append(out)
            weight_map.update(dict.fromkeys(state, out))
            nbytes += sum(v.numel() * v.element_size() for v in state.values())
        index = _index(files, names, weight_map, nbytes) if SAFETENSORS_INDEX in names or len(written) > 1 else None
        if index is not None:
            with open(os.path.join(partial, SAFETENSORS_INDEX), "w") as f:
                json.dump(index, f, indent=2)
        left_out = []
        for name in names:
            if name in converted or name in (PICKLE_INDEX, SAFETENSORS_INDEX) or name.startswith("."):
                continue
            if name.endswith(PICKLE_SUFFIXES):
                left_out.append(name)
                continue
            target = os.path.join(partial, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(files.inside(name), target)  # a symlink out of the checkpoint is refused
        os.replace(partial, destination)
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise ConvertFailed(destination, f"writing failed ({e.strerror or e}); nothing was left behind") from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return PickleReport(destination, written, len(weight_map), nbytes, left_out)


def _index(files: LocalFiles, names: list[str], weight_map: dict[str, str], nbytes: int) -> dict[str, object]:
    """The copy's safetensors index: the source's, if it has one, with the converted tensors added."""
    index = read_json(files, SAFETENSORS_INDEX, required=True) if SAFETENSORS_INDEX in names else {}
    kept = index.get("weight_map") if isinstance(index.get("weight_map"), dict) else {}
    metadata = index.get("metadata") if isinstance(index.get("metadata"), dict) else {}
    total = metadata.get("total_size") if isinstance(metadata.get("total_size"), int) else 0
    return {
        **index,
        "metadata": {**metadata, "total_size": total + nbytes},
        "weight_map": dict(sorted({**kept, **weight_map}.items())),
    }

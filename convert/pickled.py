"""`specpair convert SRC DST --from-pickle`: a safetensors copy of a checkpoint published with pickled weights only
(pytorch_model.bin, as the EAGLE authors publish EAGLE-3 heads), read through torch's restricted weights-only
loader and never otherwise.

Each weight pickle must unpickle, under torch.load(weights_only=True), to a state dict: names mapped to dense
tensors. Anything else (a payload that would run code, another object, a truncated file) is refused with one line
naming the file, before anything is written. The copy is built under DST.specpair-partial and renamed at the end;
an error or SIGTERM/SIGINT removes it. The checkpoint's other files are copied as they are, its other pickles
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

from specpair.checkpoint.hf import PICKLE_SUFFIXES, WEIGHT_PICKLE
from specpair.convert.converter import PARTIAL_SUFFIX, ConvertFailed, signals_interrupt
from specpair.errors import BadInput
from specpair.sources.local import LocalFiles
from specpair.sources.model import local_path

PICKLE_INDEX = "pytorch_model.bin.index.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class PickleReport:
    destination: str
    written: list[str]  # safetensors files, one per weight pickle
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
    if any(n.endswith(".safetensors") for n in names):
        raise BadInput(files.where, "already has .safetensors weights: --from-pickle is for checkpoints with none")
    if not pickles:
        raise BadInput(files.where, "has no weight pickle (pytorch_model*.bin) to convert")
    if os.path.lexists(destination):
        raise BadInput(destination, "already exists; remove it or choose another destination")
    # every pickle is read and checked before anything is written
    states = {}
    for name in pickles:
        note(f"reading {name} with torch's weights-only loader")
        states[name] = _state_dict(files.inside(name))
    with signals_interrupt():
        return _write(files, names, states, destination)


def _state_dict(full: str) -> dict[str, torch.Tensor]:
    """The file's tensors by name, through torch's weights-only unpickler; BadInput for anything else."""
    try:
        with warnings.catch_warnings():  # its notes on pickle protocols are not the user's business
            warnings.simplefilter("ignore")
            loaded = torch.load(full, map_location="cpu", weights_only=True, mmap=False)
    except pickle.UnpicklingError as e:  # what the weights-only unpickler refuses to build
        raise BadInput(full, f"refused by torch's weights-only loader: {_reason(e)}") from None
    except Exception as e:  # noqa: BLE001 - whatever else reading it raises, the file is refused in one line
        raise BadInput(full, f"not a complete torch.save file, refused ({_reason(e)})") from None
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
    files: LocalFiles, names: list[str], states: dict[str, dict[str, torch.Tensor]], destination: str
) -> PickleReport:
    partial = destination.rstrip("/") + PARTIAL_SUFFIX
    try:
        shutil.rmtree(partial, ignore_errors=True)  # a run killed earlier leaves only this name behind
        os.makedirs(partial)
    except OSError as e:
        raise BadInput(destination, f"cannot create {partial} ({e.strerror or e})") from None
    try:
        written, weight_map, nbytes = [], {}, 0
        for name, state in states.items():
            out = "model" + os.path.basename(name).removeprefix("pytorch_model").removeprefix("model")
            out = out.removesuffix(".bin") + ".safetensors"
            # safetensors stores each tensor's own bytes: views and tied weights become copies
            save_file(
                {k: v.contiguous().clone() for k, v in state.items()}, os.path.join(partial, out), {"format": "pt"}
            )
            written.append(out)
            weight_map.update(dict.fromkeys(state, out))
            nbytes += sum(v.numel() * v.element_size() for v in state.values())
        if len(written) > 1:
            index = {"metadata": {"total_size": nbytes}, "weight_map": dict(sorted(weight_map.items()))}
            with open(os.path.join(partial, SAFETENSORS_INDEX), "w") as f:
                json.dump(index, f, indent=2)
        left_out = []
        for name in names:
            if name in states or name == PICKLE_INDEX or name.startswith("."):
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

"""From a `Model` (sources/model.py) to a runtime `Transformer` on a device.

`plan_load` checks, from headers alone, that the runtime can run this checkpoint (family, layer types, rope,
activation; every weight a layer needs is there with the shape the config gives it) and says what loading
will cost: stored bytes to read and resident bytes on the device. `load` then streams the weights in file
order, each stored byte read once, each weight moved to the device as it is decoded (host memory holds the
sources of the weights still to come, never the model). Weights that only feed a matmul stay `Packed` where
the kernels multiply that layout directly (on CUDA by default); everything else is dequantized at load.
Under tensor parallelism each rank reads only the bytes of its region of each weight (runtime/parallel.py,
formats/regions.py), quantized weights cut along whole blocks and kept packed; a region that would cut a block is
cut from the decoded weight, read whole (`LoadPlan.read_whole`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specpair.checkpoint.config import ModelConfig
from specpair.errors import BadInput
from specpair.formats.packed import Packed
from specpair.formats.regions import Region
from specpair.runtime.blocks import fused_projections
from specpair.runtime.kernels import linear
from specpair.runtime.model import Transformer
from specpair.runtime.models import FAMILIES
from specpair.runtime.parallel import SINGLE, Parallel
from specpair.runtime.rope import ROPE_TYPES, rope_type
from specpair.sources.model import Model

ACTIVATIONS = ("silu", "swish")
UNUSED = ("mtp.",)  # weights a target carries for a drafter, its MTP head: the MTP drafter loads them itself


@dataclass(frozen=True)
class Need:
    shape: tuple[int, ...]
    matmul: bool
    fp32: bool


@dataclass(frozen=True)
class LoadPlan:
    model: Model
    needs: dict[str, Need]  # canonical name -> how the model uses it
    packed: frozenset[str]  # names kept in their stored layout
    dtype: torch.dtype
    device: torch.device
    stored_bytes: int  # read from the files (by this rank)
    resident: dict[str, int]  # name -> bytes held on the device once loaded (a packed weight: its stored parts)
    parallel: Parallel = SINGLE  # this rank's place under tensor parallelism
    regions: dict[str, Region] = field(default_factory=dict)  # name -> this rank's part of it, where not all
    # weights whose region this rank cannot read alone (a cut through a quantization block, a vector, a step that
    # mixes rows): their sources are read whole and the region cut after decoding
    read_whole: frozenset[str] = frozenset()

    @property
    def resident_bytes(self) -> int:
        return sum(self.resident.values())

    def weights_read(self, tokens: int) -> float:
        """Bytes of weights a step over `tokens` tokens (a decode step of that many sequences) reads: each weight
        once, but the embedding table (a row per token, unless the head reads it whole: tied embeddings) and the
        routed experts (the share the tokens touch, expected under uniform routing: 1 - (1 - k/E)^tokens)."""
        config = self.model.config
        total = 0.0
        for name, nbytes in self.resident.items():
            if name == "embed_tokens.weight" and not config.tie_word_embeddings:
                total += nbytes * min(tokens, config.vocab_size) / config.vocab_size
            elif ".mlp.experts." in name:
                total += nbytes * config.experts_touched(tokens)
            else:
                total += nbytes
        return total


def plan_load(
    model: Model,
    device: str | torch.device,
    dtype: torch.dtype | None = None,
    packed: bool | None = None,
    parallel: Parallel = SINGLE,
) -> LoadPlan:
    """What loading `model` on `device` takes; BadInput naming what is missing where the runtime cannot run it.
    dtype: bfloat16 on CUDA, float32 on CPU by default (transformers' float32 bits: what a run serves in is the app's
    choice, app/device.place_runtime); packed: on CUDA by default. Under tensor parallelism a
    weight whose region this rank cannot read alone is read whole, decoded and cut, and not kept packed
    (`read_whole`: exact either way, so a split that cuts a quantization block costs bytes, not a refusal; uneven
    KV-group splits make such cuts common on small models)."""
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    packed = device.type == "cuda" if packed is None else packed
    config = supported(model)
    needs: dict[str, Need] = {}

    def record(name: str, shape: tuple[int, ...], matmul: bool = False, fp32: bool = False) -> torch.Tensor:
        if name not in model.maps:
            raise BadInput(model.ref, f"has no weight {name!r}, which a {config.family} model needs")
        if tuple(model.shape(name)) != tuple(shape):
            raise BadInput(
                model.ref, f"weight {name!r} is {list(model.shape(name))}, where its config makes it {list(shape)}"
            )
        needs[name] = Need(tuple(shape), matmul, fp32)
        return torch.empty(shape, device="meta")

    Transformer.build(config, FAMILIES[config.family].decoder_layer, record, dtype, torch.device("meta"))
    unused = [
        n
        for n in model.names
        if n not in needs and not n.startswith(UNUSED) and not (n == "lm_head.weight" and config.tie_word_embeddings)
    ]
    if unused:
        raise BadInput(
            model.ref,
            f"has weights a {config.family} model does not use: {', '.join(unused[:4])}"
            + (f" and {len(unused) - 4} more" if len(unused) > 4 else ""),
        )
    regions = _regions(model, config, needs, parallel)
    readings = {n: model.reading(n, regions.get(n)) for n in needs}
    read_whole = frozenset(n for n, r in readings.items() if r.rest is not None)
    kept = (
        frozenset(n for n, need in needs.items() if packed and need.matmul and linear.reads_packed(model.layout(n)))
        - read_whole
    )
    reads = {read for r in readings.values() for read in r.reads}  # a fused source feeds two weights
    stored = sum(model.read_nbytes(*read) for read in reads)
    resident = {
        n: sum(model.read_nbytes(*read, held=True) for read in readings[n].reads)
        if n in kept
        else math.prod(_held_shape(need.shape, regions.get(n))) * (4 if need.fp32 else dtype.itemsize)
        for n, need in needs.items()
    }
    return LoadPlan(model, needs, kept, dtype, device, stored, resident, parallel, regions, read_whole)


def _regions(model: Model, config: ModelConfig, needs: dict[str, Need], parallel: Parallel) -> dict[str, Region]:
    """Each weight's region on this rank, where it holds part of it, from the shapes every rank's model asks for
    (the ranks' slices follow one another: an uneven split's slices depend on every rank's size)."""
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for rank in range(parallel.size if parallel.size > 1 else 0):

        def record(name: str, shape: tuple[int, ...], matmul: bool = False, fp32: bool = False) -> torch.Tensor:
            shapes.setdefault(name, []).append(tuple(shape))
            return torch.empty(shape, device="meta")

        ranked = Parallel(rank, parallel.size)
        Transformer.build(
            ranked.config(config, model.ref),
            FAMILIES[config.family].decoder_layer,
            record,
            torch.float32,
            torch.device("meta"),
            ranked,
        )
    regions = {n: parallel.region(n, need.shape, shapes[n], config) for n, need in needs.items() if n in shapes}
    return {n: r for n, r in regions.items() if r is not None}


def _held_shape(shape: tuple[int, ...], region: Region | None) -> tuple[int, ...]:
    if region is None:
        return shape
    return (*shape[: len(shape) + region.axis], region.size, *shape[len(shape) + region.axis + 1 :])


def load(plan: LoadPlan, progress: Callable[[int], None] | None = None) -> Transformer:
    """Stream the planned weights onto the device and build the model; `progress` gets stored bytes as read."""
    model, config, parallel = plan.model, plan.model.config, plan.parallel
    loaded: dict[str, torch.Tensor] = {}
    for name, value in model.stream(
        plan.needs,
        packed=lambda n: n in plan.packed,
        dtype=torch.float32,
        device=plan.device,
        progress=progress,
        regions=plan.regions.get,
    ):
        if isinstance(value, Packed):
            loaded[name] = linear.to_kernel_layout(value)
            continue
        value = parallel.held(name, value)
        loaded[name] = value if plan.needs[name].fp32 else value.to(plan.dtype)

    def take(name: str, shape: tuple[int, ...], matmul: bool = False, fp32: bool = False):
        return loaded.pop(name)  # the model holds it now: a weight fused with others is freed once they are

    with fused_projections():  # a target's weights are never trained in place
        return Transformer.build(
            parallel.config(config, model.ref),
            FAMILIES[config.family].decoder_layer,
            take,
            plan.dtype,
            plan.device,
            parallel,
        )


def supported(model: Model) -> ModelConfig:
    """The model's config, when the runtime runs its family, layer types, rope and activation."""
    config = model.config
    if config.drafter is not None:
        raise BadInput(
            model.ref, f"is a {config.drafter.kind} drafter, not a target model: `specpair run` takes the target"
        )
    family = FAMILIES.get(config.family)
    if family is None:
        raise BadInput(
            model.ref, f"family {config.family!r} has no runtime model (runtime/models: {', '.join(FAMILIES)})"
        )
    odd = sorted(set(config.layer_types) - set(family.layer_types))
    if odd:
        raise BadInput(
            model.ref,
            f"has {', '.join(odd)} layers, which the {config.family} runtime does not build "
            f"(it builds {', '.join(family.layer_types)})",
        )
    if rope_type(config) not in ROPE_TYPES:
        raise BadInput(
            model.ref, f"rope type {rope_type(config)!r} is not one the runtime computes ({', '.join(ROPE_TYPES)})"
        )
    if config.hidden_act not in ACTIVATIONS:
        raise BadInput(model.ref, f"hidden_act {config.hidden_act!r} is not one the runtime computes (silu)")
    return config

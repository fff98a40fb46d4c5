"""A drafter's weights from any layout `open_model` reads, checked from headers first, then streamed once.

`load_weights(model, build, ...)` calls `build(fetch)` twice, as runtime/loading.py does for targets: once with a
recording `fetch` that checks every weight the drafter needs is there with the shape its config gives it,
once with the loaded weights, which the drafter then holds by canonical name in `weights` on the CPU (tests
train drafters through them; on CUDA the blocks fuse projections into new weights and `weights` is left empty,
so that no weight is held twice); `resident_bytes`: what they occupy on the device. `fetch(name, shape, matmul=False, fp32=False)` as in runtime/blocks.py.

`bits=4` quantizes the drafter at load as TensorFold does (tensorfold.md §2.3): every weight that only feeds a
matmul and whose rows split into groups of 64 becomes affine-4 in groups of 64 with TensorFold's min/max rule
(formats/affine.py "minmax": bf16 scale and bias per group, round half to even), kept packed; norms, the
DFlash2 conv kernels and the selector codebooks stay as they are. Weights stored quantized are kept packed on
CUDA where a kernel reads their layout, dequantized otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

from specpair.errors import BadInput
from specpair.formats.codecs import codec
from specpair.formats.packed import Packed
from specpair.runtime.kernels import linear
from specpair.sources.model import Model

Built = TypeVar("Built")
AFFINE_GROUP = 64
AFFINE_LAYOUT = "affine4-g64"


def load_weights(
    model: Model,
    build: Callable[..., Built],
    device: torch.device,
    dtype: torch.dtype,
    bits: int | None = None,
    prefix: str = "",
    ignored: Iterable[str] = (),
) -> Built:
    """`build(fetch)` over `model`'s weights named `prefix + name`; every weight under `prefix` must be used, but
    for `ignored` ones. bits: None keeps the stored layout, 4 quantizes to affine-4 at load."""
    if bits not in (None, 4):
        raise BadInput(model.ref, f"drafters load as stored or quantized to 4 bits at load, not {bits}")
    needs: dict[str, tuple[tuple[int, ...], bool, bool]] = {}

    def record(name: str, shape: tuple[int, ...], matmul: bool = False, fp32: bool = False) -> torch.Tensor:
        full = prefix + name
        if full not in model.maps:
            raise BadInput(
                model.ref,
                f"has no weight {full!r}, which its {model.config.drafter.kind if model.config.drafter else 'drafter'} "
                "layers need",
            )
        if tuple(model.shape(full)) != tuple(shape):
            raise BadInput(
                model.ref, f"weight {full!r} is {list(model.shape(full))}, where its config makes it {list(shape)}"
            )
        needs[full] = (tuple(shape), matmul, fp32)
        return torch.empty(shape, device="meta")

    build(record)
    skipped = set(ignored)
    unused = [n for n in model.names if n.startswith(prefix) and n not in needs and n not in skipped]
    if unused:
        raise BadInput(
            model.ref,
            f"has weights the drafter does not use: {', '.join(unused[:4])}"
            + (f" and {len(unused) - 4} more" if len(unused) > 4 else ""),
        )
    keep_packed = device.type == "cuda"
    loaded: dict[str, torch.Tensor | Packed] = {}
    stored_packed = {
        n for n, (_, matmul, _) in needs.items() if keep_packed and matmul and linear.reads_packed(model.layout(n))
    }
    for name, value in model.stream(needs, packed=lambda n: n in stored_packed, dtype=torch.float32, device=device):
        shape, matmul, fp32 = needs[name]
        if isinstance(value, Packed):
            loaded[name] = linear.to_kernel_layout(value)
        elif bits == 4 and matmul and _quantizable(shape):
            loaded[name] = quantize_affine4(name, value)
        else:
            loaded[name] = value if fp32 else value.to(dtype)

    resident_bytes = sum(w.nbytes for w in loaded.values())

    def take(name: str, shape: tuple[int, ...], matmul: bool = False, fp32: bool = False):
        # on CUDA blocks fuse projections into new weights (blocks.Projections): the loaded ones are let go
        return loaded.pop(prefix + name) if device.type == "cuda" else loaded[prefix + name]

    built = build(take)
    built.weights = loaded
    built.resident_bytes = resident_bytes
    return built


def quantize_affine4(name: str, w: torch.Tensor) -> Packed:
    """TensorFold's affine-4 of a float weight [out, in]: codes, bf16 scales and biases, kept packed."""
    parts = codec(AFFINE_LAYOUT, "minmax").encode(w, name)
    return Packed(name, AFFINE_LAYOUT, tuple(w.shape), parts)


def _quantizable(shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and shape[1] % AFFINE_GROUP == 0 and math.prod(shape) > 0

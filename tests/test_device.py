"""app/device.py's dtype and runtime/kernels/cpu_rows.py's reading of the CPU: a run serves in bf16 on a GPU and on a
CPU whose bf16 products are native, float32 on other CPUs, and what --dtype asks above both."""

from __future__ import annotations

import pytest
import torch

from specpair.app.device import place_runtime
from specpair.errors import BadInput
from specpair.runtime.kernels import cpu_rows


@pytest.mark.parametrize(
    "flags, native",
    [
        ({"avx512f", "avx512_bf16"}, True),
        ({"amx_tile", "amx_bf16"}, True),
        ({"avx512f", "avx2"}, False),
        (set(), False),
    ],
)
def test_native_bf16_is_read_from_the_cpus_flags(monkeypatch: pytest.MonkeyPatch, flags: set[str], native: bool):
    monkeypatch.setattr(cpu_rows, "cpu_flags", lambda: frozenset(flags))
    assert cpu_rows.native_bf16() == (native and torch.backends.mkldnn.is_available())


@pytest.mark.parametrize("native", [True, False])
def test_a_cpu_serves_bf16_where_its_products_are_native(monkeypatch: pytest.MonkeyPatch, native: bool):
    before = torch.get_num_threads()
    monkeypatch.setattr(cpu_rows, "native_bf16", lambda: native)
    try:
        assert place_runtime("cpu", 1).dtype == (torch.bfloat16 if native else torch.float32)
        assert place_runtime("cpu", 1, "float32").dtype == torch.float32
        assert place_runtime("cpu", 1, "bfloat16").dtype == torch.bfloat16
        with pytest.raises(BadInput, match="'float16' is not one of bfloat16, float32"):
            place_runtime("cpu", 1, "float16")
    finally:
        torch.set_num_threads(before)

"""Fixtures shared by test modules: the fake Hub (Hub, download and verify tests), torch at one thread, or at 1 then 2."""

import pytest
from hubserver import VALID_TOKENS, FakeHub


@pytest.fixture(scope="module")
def fake_hub():
    """Our fake Hub on 127.0.0.1, one per test module, accepting the test tokens."""
    hub = FakeHub().start()
    hub.valid_tokens |= VALID_TOKENS
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch at one thread for a module (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): tests of many
    small ops (reference kernels, the speculative loop, the EXL3 search's ~1500 ops a tile) on a shared 2-core machine
    only wait on a second thread, whose pool stalls at every barrier when another process holds its core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=[1, 2], ids=lambda n: f"{n}-threads")
def threads(request):
    """Each test that asks for it at 1 and at 2 torch threads (a row's bits must not depend on the split)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)

"""Fixtures shared by the Hub, download and verify tests."""

import pytest
from hubserver import VALID_TOKENS, FakeHub


@pytest.fixture(scope="module")
def fake_hub():
    """Our fake Hub on 127.0.0.1, one per test module, accepting the test tokens."""
    hub = FakeHub().start()
    hub.valid_tokens |= VALID_TOKENS
    yield hub
    hub.stop()

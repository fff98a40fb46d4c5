"""specpair's own speculative-decoding runtime (PyTorch + Triton), built from the same readers as `check`.

It is not in this release: `specpair run` and the model files arrive with the runtime issues. `check`
reads `AVAILABLE` so that its `specpair` verdict says so instead of promising a command that is missing.
"""

AVAILABLE = False

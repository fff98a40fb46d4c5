"""Where the GPU tier's model tests run: cuda; SPECPAIR_GPU_TIER_DEVICE=cpu runs their logic on the CPU (eagerly,
graphs not captured), to check the tests themselves on a machine without a GPU."""

import os

DEVICE = os.environ.get("SPECPAIR_GPU_TIER_DEVICE", "cuda")

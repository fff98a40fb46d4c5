"""A model the runtime runs: loaded with progress (and checked against the GPU's free memory first), and what
identifies it in a report (revision, file hashes, layouts)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specpair.app.progress import SILENT, Progress

if TYPE_CHECKING:
    from specpair.runtime.loading import LoadPlan
    from specpair.runtime.model import Transformer
    from specpair.sources.lockfile import LockedRepo
    from specpair.sources.model import Model

SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})(/|$)")
FLOAT_LAYOUTS = ("bf16", "f16", "f32")


@dataclass
class LoadedTarget:
    model: Model
    plan: LoadPlan
    runtime: Transformer
    seconds: float  # reading and placing the weights

    @property
    def dtype(self) -> str:
        return dtype_name(self.plan)


def load_target(
    plan: LoadPlan, progress: Progress = SILENT, context: int | None = None, loaded: LoadedTarget | None = None
) -> LoadedTarget:
    """What `plan` (runtime.loading.plan_load) says, loaded. With `context` (tokens) on CUDA: refused first,
    saying what would fit, when the weights, the cache for that context and working memory exceed the free
    memory. `loaded`: that load made before, returned as it is (a pair's gate and bench in one process, where a
    load draws a generated 124 GB checkpoint again); it must be of the same opened checkpoint and placement."""
    import torch

    from specpair.app.memory import check_fits, out_of_memory
    from specpair.runtime import loading

    model, where = plan.model, plan.device
    if loaded is not None:
        made = loaded.plan
        if made.model is not model or (made.device, made.dtype, made.parallel) != (where, plan.dtype, plan.parallel):
            raise ValueError(f"{made.model.ref} was loaded on {made.device} as {made.dtype}: not what this run asks")
        return loaded
    if where.type == "cuda" and context is not None:
        check_fits(plan, context)
    progress.stage(f"loading {size_label(plan.stored_bytes)} from {model.ref} onto {where} ({dtype_name(plan)})")
    start = time.perf_counter()
    with progress.meter("loading", plan.stored_bytes) as advance:
        try:
            runtime = loading.load(plan, advance)
        except torch.cuda.OutOfMemoryError:
            raise out_of_memory(plan, context or 0, "while loading") from None
    seconds = time.perf_counter() - start
    progress.note(f"loaded in {seconds:.1f} s ({plan.stored_bytes / seconds / 1e9:.2f} GB/s)" if seconds else "loaded")
    return LoadedTarget(model, plan, runtime, seconds)


def dtype_name(plan: LoadPlan) -> str:
    return str(plan.dtype).removeprefix("torch.")


def size_label(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def revision(model: Model) -> str | None:
    """The commit of a Hub repo read from the HF cache; None for a local path."""
    if os.path.exists(os.path.expanduser(model.ref)):
        return None
    found = SNAPSHOT.search(model.root.replace(os.sep, "/") + "/")
    return found.group(1) if found else None


def layouts(plan: LoadPlan) -> dict[str, int]:
    """Stored layout -> number of weights in it, as the runtime holds them (packed, or dequantized from it)."""
    counts: dict[str, int] = {}
    for name in plan.needs:
        stored = plan.model.layout(name)
        layout = stored + ("" if name in plan.packed or stored in FLOAT_LAYOUTS else " (dequantized)")
        counts[layout] = counts.get(layout, 0) + 1
    return dict(sorted(counts.items()))


def describe(model: Model, locked: LockedRepo | None = None) -> dict[str, Any]:
    """ref, revision (the lock's commit, else the HF cache's), family and every file's sha256."""
    return {
        "ref": model.ref,
        "revision": locked.commit if locked else revision(model),
        "family": model.config.family,
        "files": file_hashes(model, locked),
    }


def file_hashes(model: Model, locked: LockedRepo | None = None) -> dict[str, str]:
    """sha256 of each file of the checkpoint: from its specpair.lock, else as its source gives them (the HF cache's
    blob names, or hashed; a source that makes its files, none for those)."""
    if locked is not None:
        return {f.path: f.sha256 for f in locked.files}
    return {name: digest for name in model.files if (digest := model.reader.sha256(name)) is not None}

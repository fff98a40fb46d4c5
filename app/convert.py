"""`specpair convert SRC DST --to LAYOUT`: the conversion planned, then run with progress (EXL3 work estimated
first, on the device it runs on)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import TYPE_CHECKING

from specpair.app.device import choose_device
from specpair.app.progress import SILENT, Progress, duration
from specpair.errors import BadInput
from specpair.formats.layouts import layout_of

if TYPE_CHECKING:
    from specpair.convert.converter import Plan, Report
    from specpair.convert.pickled import PickleReport

GPU_TILES_PER_S = 44_000  # the Triton search on one H200 (benchmarks/results/exl3_encode.md)


def plan_conversion(
    source: str,
    destination: str,
    to: str,
    *,
    keep: list[str] | None = None,
    target: str | None = None,
    gguf_file: str | None = None,
    writing: bool = True,
) -> Plan:
    """What converting `source` into `destination` in layout `to` writes: every output tensor, its layout and why.
    `keep`: GLOB=LAYOUT overrides; `target`: the model a drafter belongs to (its tokenizer goes into a GGUF);
    `writing`: the plan is to be run, so an existing destination is refused before the source is read."""
    from specpair.convert import converter as conv
    from specpair.convert.policy import parse_keep

    goal = conv.parse_target(to)
    if goal.file_format == "gguf" and not destination.endswith(".gguf"):
        raise BadInput(destination, f"--to {to} writes one GGUF file: name it *.gguf")
    if goal.file_format == "safetensors" and destination.endswith(".gguf"):
        raise BadInput(destination, f"--to {to} writes a safetensors directory, not a .gguf file")
    if writing:
        conv.check_destination(destination)
    rules = [parse_keep(rule, conv.parse_layout) for rule in keep or []]
    src = conv.open_source(source, gguf_file)
    donor = conv.open_source(target) if target else None
    return conv.plan(src, goal, rules, donor)


def unpickle_weights(
    source: str, destination: str, to: str | None, from_pickle: bool, progress: Progress = SILENT
) -> PickleReport:
    """`--from-pickle`: a safetensors copy of a checkpoint whose weights are pickles (convert/pickled.py); refused
    without the flag (then --to is missing) and beside --to (convert the copy afterwards)."""
    from specpair.convert.pickled import from_pickle as convert_pickles

    if not from_pickle:
        raise BadInput("--to", "missing: name the layout to convert to (or --from-pickle for pickled weights)")
    if to is not None:
        raise BadInput("--from-pickle", f"writes the weights as stored: drop --to {to}, then convert the copy")
    report = convert_pickles(source, destination, progress.note)
    progress.note(f"{report.tensors} tensors written to {destination}")
    return report


def run_conversion(
    plan: Plan,
    destination: str,
    *,
    device: str | None = None,
    workers: int = 2,
    shard_bytes: int | None = None,
    progress: Progress = SILENT,
) -> Report:
    """Write `plan` at `destination` (under a temporary name, renamed at the end): its error report."""
    import torch

    from specpair.convert import converter as conv
    from specpair.formats import exl3

    where = choose_device(device)
    tiles = exl3_tiles(plan)
    if tiles:
        progress.note(estimate_exl3(plan, tiles, str(where)))
    count, done = len(plan.outputs), [0]
    lock = threading.Lock()

    def tensors() -> str:
        return f"{done[0]} of {count} tensors"

    progress.note(
        f"{count} tensors, {size_label(plan.nbytes)} to write" + (f", {tiles:,} EXL3 tiles to encode" if tiles else "")
    )
    started, threads = time.perf_counter(), torch.get_num_threads()
    if where.type == "cpu":  # the workers share the cores: more torch threads than that only contend (16 cores, 2.2
        # GB to Q8_0: 8 workers x 16 threads 17.4 s, x 2 threads 13.1 s; 2 workers x 16 threads 15.3 s, x 8 11.9 s)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    try:
        unit = "tiles" if tiles else "bytes"
        with progress.meter("converting", tiles or plan.nbytes, unit=unit, detail=tensors, tenths=True) as advance:

            def on_tensor(output: object, nbytes: int) -> None:
                with lock:
                    done[0] += 1
                if not tiles:
                    advance(nbytes)

            with exl3.counting_tiles(advance) if tiles else contextlib.nullcontext():
                report = conv.execute(
                    plan, destination, device=str(where), workers=workers, shard_bytes=shard_bytes, progress=on_tensor
                )
    finally:
        torch.set_num_threads(threads)  # as it was, for a caller in the same process
    progress.note(f"all {count} tensors written in {time.perf_counter() - started:.1f} s")
    return report


def exl3_tiles(plan: Plan) -> int:
    """Tiles of 256 weights the EXL3 search encodes for `plan` (0 when it writes no EXL3 weight)."""
    from specpair.formats import exl3

    return sum(
        exl3.tiles_of(o.stored) for o in plan.outputs if o.mode == "float" and layout_of(o.layout).kind == "exl3"
    )


def estimate_exl3(plan: Plan, tiles: int, where: str) -> str:
    """How long the EXL3 search takes here, from its rate measured on this device now."""
    from specpair.formats import exl3

    first = next(o for o in plan.outputs if o.mode == "float" and layout_of(o.layout).kind == "exl3")
    bits = int(layout_of(first.layout).bits)
    return exl3_estimate(tiles, exl3.measured_rate(bits, first.method or "mul1", where), where)


def exl3_estimate(tiles: int, rate: float, where: str) -> str:
    """The estimate line for `tiles` at `rate` tiles/s on `where`; on the CPU, past a minute, what a GPU would take."""
    line = (
        f"EXL3 encodes {tiles:,} tiles of 256 weights at {rate:,.3g} tiles/s measured on {where} now: "
        f"{duration(tiles / rate)}"
    )
    if where == "cpu" and tiles / rate > 60:
        line += (
            f"; a CUDA GPU would take {duration(tiles / GPU_TILES_PER_S)} (an H200 encodes "
            f"~{GPU_TILES_PER_S:,} tiles/s): --device cuda on a machine with one"
        )
    return line


def size_label(n: float) -> str:
    """'393.22 KB', '1.20 GB': bytes in the largest unit under 1000."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"

"""`specpair convert SRC DST --to LAYOUT`: stream a checkpoint into another layout or file format."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Annotated

import typer

from specpair.cli import app
from specpair.cli._options import GgufFileOpt, JsonOpt, QuietOpt, VerboseOpt
from specpair.cli._output import console, print_json, print_prose, print_table
from specpair.formats.layouts import layout_of

EXAMPLES = """\b
Examples:
  specpair convert ./Qwen3.6-35B-A3B ./Qwen3.6-35B-A3B-Q4_K.gguf --to gguf:Q4_K
  specpair convert ./Qwen3.6-35B-A3B-DFlash draft.gguf --to gguf:bf16 --target ./Qwen3.6-35B-A3B
  specpair convert ./Qwen3.6-27B ./Qwen3.6-27B-affine4 --to affine4          # MLX / TensorFold layout
  specpair convert ./Qwen3.6-35B-A3B-NVFP4 ./nvfp4-ct --to nvfp4:ct          # bit-lossless repack
  specpair convert model.gguf ./model-bf16 --to bf16                          # GGUF back to transformers
  specpair convert ./Qwen3.6-35B-A3B-DFlash ./draft-exl3 --to exl3:4         # ExLlamaV3, encoded on the GPU
  specpair convert ./Qwen3-8B ./Qwen3-8B-fp8 --to fp8 --keep 'lm_head.weight=bf16' --dry-run

\b
Exit codes: 0 written; 1 the conversion did not complete (a write failed, the disk filled up): nothing was left
behind, run it again; 2 bad input (refused before anything was written)."""


@app.command(epilog=EXAMPLES)
def convert(
    source: Annotated[
        str,
        typer.Argument(
            help="Checkpoint: local directory, .gguf file, or a Hub repo org/name[@revision] already in the HF cache."
        ),
    ],
    destination: Annotated[
        str, typer.Argument(help="Output: a directory (safetensors layouts) or a .gguf file; must not exist.")
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="Target layout: bf16 | f16 | f32 | fp8[:block|tensor] | nvfp4[:modelopt|ct|mlx] | affine4 | affine:BITS:GROUP[:mlx|minmax] | gguf:TYPE[:search|rtn] | exl3:BITS[:mul1|mcg|3inst].",
        ),
    ],
    target: Annotated[
        str | None,
        typer.Option(
            "--target", help="The target model a drafter belongs to: its tokenizer goes into the drafter's GGUF."
        ),
    ] = None,
    keep: Annotated[
        list[str] | None,
        typer.Option(
            "--keep",
            help="GLOB=LAYOUT: tensors whose output name matches get this layout (repeatable), e.g. 'output.weight=gguf:Q6_K'.",
        ),
    ] = None,
    device: Annotated[
        str | None, typer.Option("--device", help="Where quantization runs: cpu or cuda (default: cuda when present).")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Tensors converted at once.")] = 2,
    max_shard_size: Annotated[
        str,
        typer.Option("--max-shard-size", help="Largest safetensors shard, e.g. 5GB or 500MB (an index joins them)."),
    ] = "5GB",
    gguf_file: GgufFileOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the plan (every output tensor, its layout and why) and write nothing."),
    ] = False,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Convert SOURCE into DESTINATION in another layout, tensor by tensor, with an error report."""
    from specpair.convert import converter as conv
    from specpair.convert.policy import parse_keep
    from specpair.errors import BadInput

    goal = conv.parse_target(to)
    shard_bytes = _bytes(max_shard_size)
    if goal.file_format == "gguf" and not destination.endswith(".gguf"):
        raise BadInput(destination, f"--to {to} writes one GGUF file: name it *.gguf")
    if goal.file_format == "safetensors" and destination.endswith(".gguf"):
        raise BadInput(destination, f"--to {to} writes a safetensors directory, not a .gguf file")
    if not dry_run:
        conv.check_destination(destination)
    rules = [parse_keep(rule, conv.parse_layout) for rule in keep or []]
    src = conv.open_source(source, gguf_file)
    donor = conv.open_source(target) if target else None
    plan = conv.plan(src, goal, rules, donor)
    if dry_run:
        if json_output:
            print_json({"schema": "specpair.convert.plan/1", **plan.to_json()})
        elif not quiet:
            _print_plan(plan)
        return
    import torch

    where = device or ("cuda" if torch.cuda.is_available() else "cpu")
    human = not json_output and not quiet
    tiles = _exl3_tiles(plan)
    if tiles and not quiet:
        _say(_exl3_estimate(plan, tiles, where))
    threads = torch.get_num_threads()
    if where == "cpu":  # the workers share the cores: more torch threads than that only contend (16 cores, 2.2 GB
        # to Q8_0: 8 workers x 16 threads 17.4 s, x 2 threads 13.1 s; 2 workers x 16 threads 15.3 s, x 8 11.9 s)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    try:
        with _progress(
            plan, tiles, "bar" if human and sys.stderr.isatty() else "lines" if not quiet else None
        ) as on_tensor:
            report = conv.execute(
                plan, destination, device=where, workers=workers, shard_bytes=shard_bytes, progress=on_tensor
            )
    finally:
        torch.set_num_threads(threads)  # as it was, for a caller in the same process
    if json_output:
        print_json({"schema": "specpair.convert/1", "plan": plan.to_json(), "report": report.to_json()})
    elif not quiet:
        _print_report(plan, report, verbose)


def _say(line: str) -> None:
    sys.stderr.write(f"convert: {line}\n")
    sys.stderr.flush()


def _exl3_tiles(plan) -> int:
    from specpair.formats import exl3

    return sum(
        exl3.tiles_of(o.stored) for o in plan.outputs if o.mode == "float" and layout_of(o.layout).kind == "exl3"
    )


GPU_TILES_PER_S = 44_000  # the Triton search on one H200 (benchmarks/results/exl3_encode.md)


def _exl3_estimate(plan, tiles: int, where: str) -> str:
    """How long the EXL3 search takes here, from its rate measured on this device now."""
    from specpair.formats import exl3

    first = next(o for o in plan.outputs if o.mode == "float" and layout_of(o.layout).kind == "exl3")
    bits = int(layout_of(first.layout).bits)
    return exl3_estimate(tiles, exl3.measured_rate(bits, first.method or "mul1", where), where)


def exl3_estimate(tiles: int, rate: float, where: str) -> str:
    """The estimate line for `tiles` at `rate` tiles/s on `where`; on the CPU, past a minute, what a GPU would take."""
    line = (
        f"EXL3 encodes {tiles:,} tiles of 256 weights at {rate:,.3g} tiles/s measured on {where} now: "
        f"{_duration(tiles / rate)}"
    )
    if where == "cpu" and tiles / rate > 60:
        line += (
            f"; a CUDA GPU would take {_duration(tiles / GPU_TILES_PER_S)} (an H200 encodes "
            f"~{GPU_TILES_PER_S:,} tiles/s): --device cuda on a machine with one"
        )
    return line


def _duration(seconds: float) -> str:
    """'about 12 s', 'about 4.2 h', 'under a second'."""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 5400:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"


@contextlib.contextmanager
def _progress(plan, tiles: int, mode: str | None) -> Iterator[Callable[[object, int], None]]:
    """Progress on stderr: a bar with rate and ETA on a terminal; else one line per tenth of the work (and at the
    start and end). EXL3 work is counted in tiles as the search finishes them, so the rate and ETA move within a
    tensor; other work in bytes written."""
    from specpair.formats import exl3

    if mode is None:
        yield lambda output, nbytes: None
        return
    if mode == "bar":
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        columns = (
            [
                BarColumn(),
                TaskProgressColumn(),
                "{task.completed:,.0f}/{task.total:,.0f} tiles",
                "{task.fields[rate]}",
                TimeRemainingColumn(),
            ]
            if tiles
            else [MofNCompleteColumn(), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()]
        )
        with Progress("converting", *columns, console=Console(stderr=True), transient=True) as bar:
            started = time.perf_counter()
            task = bar.add_task("work", total=tiles or plan.nbytes, rate="")
            if tiles:

                def on_tiles(n: int) -> None:
                    bar.advance(task, n)
                    done = bar.tasks[0].completed
                    bar.update(task, rate=f"{done / max(time.perf_counter() - started, 1e-9):,.1f} tiles/s")

                with exl3.counting_tiles(on_tiles):
                    yield lambda output, nbytes: None
            else:
                yield lambda output, nbytes: bar.advance(task, nbytes)
        return
    lines = _Lines(plan, tiles)
    _say(
        f"{len(plan.outputs)} tensors, {_size(plan.nbytes)} to write"
        + (f", {tiles:,} EXL3 tiles to encode" if tiles else "")
    )
    if tiles:
        with exl3.counting_tiles(lines.tiles):
            yield lines.tensor
    else:
        yield lines.tensor
    _say(f"all {len(plan.outputs)} tensors written in {time.perf_counter() - lines.started:.1f} s")


class _Lines:
    """One stderr line at each further tenth of the work: done, rate, ETA."""

    def __init__(self, plan, tiles: int) -> None:
        self.total, self.unit = (tiles, "tiles") if tiles else (plan.nbytes, "bytes")
        self.done = self.tensors = self.tenths = 0
        self.count = len(plan.outputs)
        self.started = time.perf_counter()
        self.lock = threading.Lock()

    def tiles(self, n: int) -> None:
        self._advance(n)

    def tensor(self, output: object, nbytes: int) -> None:
        with self.lock:
            self.tensors += 1
        if self.unit == "bytes":
            self._advance(nbytes)

    def _advance(self, n: int) -> None:
        with self.lock:
            self.done += n
            tenths = min(10, self.done * 10 // max(self.total, 1))
            if tenths <= self.tenths:
                return
            self.tenths = tenths
            elapsed = time.perf_counter() - self.started
            rate = self.done / max(elapsed, 1e-9)
            left = (self.total - self.done) / rate if rate else 0.0
            shown = f"{rate:,.1f} tiles/s" if self.unit == "tiles" else f"{rate / 1e6:,.1f} MB/s"
            _say(
                f"{tenths * 10}% ({self.tensors} of {self.count} tensors), {shown}, {elapsed:.0f} s elapsed, "
                f"{_duration(left)} left"
            )


def _print_plan(plan) -> None:
    from rich.table import Table

    out = console()
    print_prose(out, f"{plan.source.ref} -> {plan.target.spec}: {len(plan.outputs)} tensors, {_size(plan.nbytes)}")
    table = Table()
    for column in ("tensor", "shape", "layout", "how", "why"):
        table.add_column(column, no_wrap=column in ("tensor", "shape", "layout"))
    for o in plan.outputs:
        how = o.mode + (f" [{', '.join(map(str, o.map.steps))}]" if o.map.steps else "")
        table.add_row(o.map.name, "×".join(map(str, o.map.shape)), o.layout, how, o.reason)
    print_table(out, table)
    for note in plan.notes:
        print_prose(out, f"note: {note}")
    for fallback in plan.fallbacks:
        print_prose(out, f"warning: {fallback}")


def _print_report(plan, report, verbose: bool) -> None:
    """Totals per model part, the 10 tensors with the largest error (every tensor with --verbose), then the
    overall figure: one row per tensor is ~94,000 rows for a MoE that stores its experts apart."""
    from rich.table import Table

    out = console()
    groups = Table(
        "part",
        "tensors",
        "lossy",
        "layouts",
        "size",
        "rel. error",
        "max abs",
        title="error by part (relative Frobenius and max abs, float32 reference)",
    )
    for column in groups.columns:  # part names are ids (linear_attention) and figures: never folded or cut
        column.no_wrap = column.header != "layouts"
    for g in report.groups():
        groups.add_row(
            g["group"],
            f"{g['tensors']:,}",
            f"{g['lossy']:,}",
            ", ".join(g["layouts"]),
            _size(g["bytes"]),
            f"{g['rel_error']:.5f}",
            f"{g['max_abs_error']:.3g}",
        )
    print_table(out, groups)
    rows = sorted(report.lossy, key=lambda t: -t.rel_error) if verbose else report.worst()
    if rows:
        title = "every lossy tensor" if verbose else f"the {len(rows)} tensors with the largest error (--verbose: all)"
        table = Table("tensor", "layout", "rel. error", "max abs", title=title)
        for column in table.columns:
            column.no_wrap = True
        for t in rows:
            table.add_row(t.name, t.layout, f"{t.rel_error:.5f}", f"{t.max_abs_error:.3g}")
        print_table(out, table)
    exact = len(report.tensors) - len(report.lossy)
    rate = report.source_bytes / report.seconds / 1e9 if report.seconds else 0.0
    print_prose(
        out,
        f"wrote {report.destination}: {len(report.tensors):,} tensors ({exact:,} exact), "
        f"{_size(report.nbytes)} from {_size(report.source_bytes)} in {report.seconds:.1f} s "
        f"({rate:.2f} GB/s); overall relative error {report.rel_error:.5f} over the "
        f"{len(report.lossy):,} lossy tensors",
    )
    for fallback in report.fallbacks:
        print_prose(out, f"warning: {fallback}")
    for note in plan.notes:
        print_prose(out, f"note: {note}")


UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}


def _bytes(text: str) -> int:
    """'5GB', '500MB', '2GiB' -> bytes (the units transformers' max_shard_size takes)."""
    from specpair.errors import BadInput

    value = text.strip().upper()
    for unit, factor in UNITS.items():
        number = value.removesuffix(unit)
        if number != value and number.replace(".", "", 1).isdigit() and float(number) > 0:
            return int(float(number) * factor)
    raise BadInput(f"--max-shard-size {text}", "expected a size such as 5GB, 500MB or 2GiB")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"

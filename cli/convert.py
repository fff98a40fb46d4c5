"""`specpair convert SRC DST --to LAYOUT`: stream a checkpoint into another layout or file format."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Annotated

import typer

from specpair.cli import app
from specpair.cli._options import GgufFileOpt, JsonOpt, QuietOpt
from specpair.cli._output import console, fail, print_json

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
    source: Annotated[str, typer.Argument(help="Checkpoint: local directory, .gguf file, or a Hub repo org/name[@revision] already in the HF cache.")],
    destination: Annotated[str, typer.Argument(help="Output: a directory (safetensors layouts) or a .gguf file; must not exist.")],
    to: Annotated[str, typer.Option("--to", help="Target layout: bf16 | f16 | f32 | fp8[:block|tensor] | nvfp4[:modelopt|ct|mlx] | affine4 | affine:BITS:GROUP[:mlx|minmax] | gguf:TYPE[:search|rtn] | exl3:BITS[:mul1|mcg|3inst].")],
    target: Annotated[str | None, typer.Option("--target", help="The target model a drafter belongs to: its tokenizer goes into the drafter's GGUF.")] = None,
    keep: Annotated[list[str] | None, typer.Option("--keep", help="GLOB=LAYOUT: tensors whose output name matches get this layout (repeatable), e.g. 'output.weight=gguf:Q6_K'.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Where quantization runs: cpu or cuda (default: cuda when present).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Tensors converted at once.")] = 2,
    max_shard_size: Annotated[str, typer.Option("--max-shard-size", help="Largest safetensors shard, e.g. 5GB or 500MB (an index joins them).")] = "5GB",
    gguf_file: GgufFileOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (every output tensor, its layout and why) and write nothing.")] = False,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Convert SOURCE into DESTINATION in another layout, tensor by tensor, with an error report."""
    from specpair.errors import BadInput
    from specpair.formats import convert as conv
    from specpair.formats.policy import parse_keep

    goal = conv.parse_target(to)
    shard_bytes = _bytes(max_shard_size)
    if goal.file_format == "gguf" and not destination.endswith(".gguf"):
        raise BadInput(destination, f"--to {to} writes one GGUF file: name it *.gguf")
    if goal.file_format == "safetensors" and destination.endswith(".gguf"):
        raise BadInput(destination, f"--to {to} writes a safetensors directory, not a .gguf file")
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
    threads = torch.get_num_threads()
    if where == "cpu":  # the workers share the cores: more torch threads than that only contend (16 cores, 2.2 GB
        # to Q8_0: 8 workers x 16 threads 17.4 s, x 2 threads 13.1 s; 2 workers x 16 threads 15.3 s, x 8 11.9 s)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    try:
        with _progress(plan, human and sys.stderr.isatty()) as on_tensor:
            report = conv.execute(plan, destination, device=where, workers=workers, shard_bytes=shard_bytes,
                                  progress=on_tensor)
    except conv.ConvertFailed as e:
        fail(str(e), 1)
    finally:
        torch.set_num_threads(threads)  # as it was, for a caller in the same process
    if json_output:
        print_json({"schema": "specpair.convert/1", "plan": plan.to_json(), "report": report.to_json()})
    elif not quiet:
        _print_report(plan, report)


@contextlib.contextmanager
def _progress(plan, enabled: bool) -> Iterator[Callable[[object, int], None]]:
    """Tensors, bytes, rate and ETA on stderr when it is a terminal; nothing otherwise."""
    if not enabled:
        yield lambda output, nbytes: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress("converting", MofNCompleteColumn(), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        tensors = bar.add_task("tensors", total=len(plan.outputs), visible=False)
        task = bar.add_task("bytes", total=plan.nbytes)

        def advance(output: object, nbytes: int) -> None:
            bar.advance(tensors)
            bar.update(task, advance=nbytes, completed=None)

        yield advance


def _print_plan(plan) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=f"{plan.source.ref} -> {plan.target.spec}: {len(plan.outputs)} tensors, {_size(plan.nbytes)}")
    for column in ("tensor", "shape", "layout", "how", "why"):
        table.add_column(column)
    for o in plan.outputs:
        how = o.mode + (f" [{', '.join(map(str, o.map.steps))}]" if o.map.steps else "")
        table.add_row(o.map.name, "×".join(map(str, o.map.shape)), o.layout, how, o.reason)
    out.print(table)
    for note in plan.notes:
        out.print(f"note: {note}")


def _print_report(plan, report) -> None:
    from rich.table import Table

    out = console()
    lossy = [t for t in report.tensors if t.mode == "float"]
    table = Table(title="error report (float32 reference; exact paths omitted)")
    for column in ("tensor", "layout", "rel. Frobenius", "max abs"):
        table.add_column(column, justify="left" if column in ("tensor", "layout") else "right")
    for t in sorted(lossy, key=lambda t: -t.rel_error):
        table.add_row(t.name, t.layout, f"{t.rel_error:.5f}", f"{t.max_abs_error:.3g}")
    if lossy:
        out.print(table)
    exact = len(report.tensors) - len(lossy)
    rate = report.source_bytes / report.seconds / 1e9 if report.seconds else 0.0
    out.print(f"wrote {report.destination}: {len(report.tensors)} tensors ({exact} exact), {_size(report.nbytes)} "
              f"from {_size(report.source_bytes)} in {report.seconds:.1f} s ({rate:.2f} GB/s); "
              f"overall relative error {report.rel_error:.5f}")
    for note in plan.notes:
        out.print(f"note: {note}")


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

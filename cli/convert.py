"""`specpair convert SRC DST --to LAYOUT`: stream a checkpoint into another layout or file format."""

from __future__ import annotations

from typing import Annotated

import typer

from specpair.app.convert import size_label
from specpair.cli._options import DeviceOpt, DryRunOpt, GgufFileOpt, JsonOpt, QuietOpt, VerboseOpt
from specpair.cli._output import Output, console, print_prose, print_table

EXAMPLES = """\b
Examples:
  specpair convert ./Qwen3.6-35B-A3B ./Qwen3.6-35B-A3B-Q4_K.gguf --to gguf:Q4_K
  specpair convert ./Qwen3.6-35B-A3B-DFlash draft.gguf --to gguf:bf16 --target ./Qwen3.6-35B-A3B
  specpair convert ./Qwen3.6-27B ./Qwen3.6-27B-affine4 --to affine4          # MLX / TensorFold layout
  specpair convert ./Qwen3.6-35B-A3B-NVFP4 ./nvfp4-ct --to nvfp4:ct          # bit-lossless repack
  specpair convert model.gguf ./model-bf16 --to bf16                          # GGUF back to transformers
  specpair convert ./Qwen3.6-35B-A3B-DFlash ./draft-exl3 --to exl3:4         # ExLlamaV3, encoded on the GPU
  specpair convert ./Qwen3-8B ./Qwen3-8B-fp8 --to fp8 --keep 'lm_head.weight=bf16' --dry-run
  specpair convert yuhuili/EAGLE3-LLaMA3.1-Instruct-8B ./eagle3-safetensors --from-pickle  # pytorch_model.bin
  specpair convert ./Qwen3-8B-DFlash ./Qwen3-8B-DFlash-speculators --to speculators --target Qwen/Qwen3-8B

\b
Output: the error report (per model part, the worst tensors, the overall figure), progress on stderr (a line per
tenth of the work when not on a terminal); --dry-run: the plan (every output tensor, its layout, how and why);
--quiet: nothing (the exit code tells); --json:
one document (schemas specpair.convert/1, specpair.convert.plan/1, specpair.convert.pickle/1).

\b
--from-pickle: a checkpoint whose weights are pickles only (pytorch_model*.bin) becomes a safetensors copy, each
pickle read by torch's weights-only loader (torch.load(weights_only=True): tensors and plain containers only) and
refused unless it holds names mapped to tensors; the other files are copied, other pickles left out. A DFlash
drafter's mask_embedding.pt beside safetensors weights becomes the tensor mask_embedding (mask_embedding.safetensors),
which specpair drafts with; it must hold one vector [hidden_size] for the config's mask token. Never done without
this flag.

\b
Exit codes: 0 written; 1 the conversion did not complete (a write failed, the disk filled up): nothing was left
behind, run it again; 2 bad input (refused before anything was written)."""

SourceArg = Annotated[
    str,
    typer.Argument(
        help="Checkpoint: local directory, .gguf file, or a Hub repo org/name[@revision] already in the HF cache."
    ),
]
DestinationArg = Annotated[
    str, typer.Argument(help="Output: a directory (safetensors layouts) or a .gguf file; must not exist.")
]
ToOpt = Annotated[
    str | None,
    typer.Option(
        "--to",
        help="Target layout: bf16 | f16 | f32 | fp8[:block|tensor] | nvfp4[:modelopt|ct|mlx] | affine4 | affine:BITS:GROUP[:mlx|minmax] | gguf:TYPE[:search|rtn] | exl3:BITS[:mul1|mcg|3inst] | speculators[:bf16|f16|f32] (a drafter, with --target).",
    ),
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="The target model a drafter belongs to: its tokenizer goes into the drafter's GGUF; --to speculators pins it as the verifier.",
    ),
]
KeepOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--keep",
        help="GLOB=LAYOUT: tensors whose output name matches get this layout (repeatable), e.g. 'output.weight=gguf:Q6_K'.",
    ),
]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="Tensors converted at once.")]
FromPickleOpt = Annotated[
    bool,
    typer.Option(
        "--from-pickle",
        help="SOURCE's weights (pytorch_model*.bin) or a drafter's mask_embedding.pt are pickles: write them as safetensors, read through torch's weights-only loader.",
    ),
]
MaxShardSizeOpt = Annotated[
    str, typer.Option("--max-shard-size", help="Largest safetensors shard, e.g. 5GB or 500MB (an index joins them).")
]


def convert(
    source: SourceArg,
    destination: DestinationArg,
    to: ToOpt = None,
    from_pickle: FromPickleOpt = False,
    target: TargetOpt = None,
    keep: KeepOpt = None,
    device: DeviceOpt = None,
    workers: WorkersOpt = 2,
    max_shard_size: MaxShardSizeOpt = "5GB",
    gguf_file: GgufFileOpt = None,
    dry_run: DryRunOpt = False,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Convert SOURCE into DESTINATION in another layout, tensor by tensor, with an error report."""
    from specpair.app.convert import plan_conversion, run_conversion, unpickle_weights

    out = Output(json_output, quiet, prefix="convert: ")
    if from_pickle or to is None:
        report = unpickle_weights(source, destination, to, from_pickle, out)
        out.result(lambda: {"schema": "specpair.convert.pickle/1", **report.to_json()}, lambda: print_pickled(report))
        return
    shard_bytes = parse_size(max_shard_size)
    plan = plan_conversion(source, destination, to, keep=keep, target=target, gguf_file=gguf_file, writing=not dry_run)
    if dry_run:
        out.result(lambda: {"schema": "specpair.convert.plan/1", **plan.to_json()}, lambda: print_plan(plan))
        return
    report = run_conversion(plan, destination, device=device, workers=workers, shard_bytes=shard_bytes, progress=out)
    out.result(
        lambda: {"schema": "specpair.convert/1", "plan": plan.to_json(), "report": report.to_json()},
        lambda: print_report(plan, report, verbose),
    )


def print_pickled(report) -> None:
    out = console()
    print_prose(
        out,
        f"wrote {report.destination}: {report.tensors:,} tensors, {size_label(report.nbytes)} in "
        f"{', '.join(report.written)} (read with torch's weights-only loader)",
    )
    if report.left_out:
        print_prose(out, f"note: pickles holding no weights left out: {', '.join(report.left_out)}")


def print_plan(plan) -> None:
    from rich.table import Table

    out = console()
    print_prose(out, f"{plan.source.ref} -> {plan.target.spec}: {len(plan.outputs)} tensors, {size_label(plan.nbytes)}")
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


def print_report(plan, report, verbose: bool) -> None:
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
            size_label(g["bytes"]),
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
        f"{size_label(report.nbytes)} from {size_label(report.source_bytes)} in {report.seconds:.1f} s "
        f"({rate:.2f} GB/s); overall relative error {report.rel_error:.5f} over the "
        f"{len(report.lossy):,} lossy tensors",
    )
    for fallback in report.fallbacks:
        print_prose(out, f"warning: {fallback}")
    for note in plan.notes:
        print_prose(out, f"note: {note}")


UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB' -> bytes (the units transformers' max_shard_size takes)."""
    from specpair.errors import BadInput

    value = text.strip().upper()
    for unit, factor in UNITS.items():
        number = value.removesuffix(unit)
        if number != value and number.replace(".", "", 1).isdigit() and float(number) > 0:
            return int(float(number) * factor)
    raise BadInput(f"--max-shard-size {text}", "expected a size such as 5GB, 500MB or 2GiB")

"""`specpair check TARGET [DRAFT]`: can they run together, on which stack, with which flags."""

from __future__ import annotations

from typing import Annotated

import typer

from specpair.cli._options import DraftGgufFileOpt, GgufFileOpt, JsonOpt, OfflineOpt, QuietOpt, VerboseOpt
from specpair.cli._output import Output, console, print_command, print_prose, print_table

EXAMPLES = """\b
Examples:
  specpair check Qwen/Qwen3.6-35B-A3B z-lab/Qwen3.6-35B-A3B-DFlash
  specpair check ./Qwen3.6-27B ./Qwen3.6-27B-DFlash --gpu h200 --context 65536
  specpair check Qwen/Qwen3.5-122B-A10B            # the target's own MTP head
  specpair check target.gguf draft.gguf --stack llama.cpp --json
  specpair check specpair.lock                     # the pair `specpair download` fetched

\b
Output: what was read, a verdict per stack, the reasons, launch commands and fixes; --quiet: nothing (the exit
code tells); --json: one document (schema specpair.check/1).
Exit codes: 0 at least one stack asked is ok or warn; 1 every one fails; 2 bad input."""

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}
SEVERITY_STYLE = {"error": "red", "warn": "yellow", "info": "dim"}

TargetArg = Annotated[
    str,
    typer.Argument(
        help="Target: local directory, .gguf file, Hub repo org/name[@revision], or a specpair.lock (its pair)."
    ),
]
DraftArg = Annotated[str | None, typer.Argument(help="Drafter or draft model; omit to use the target's MTP head.")]
StackOpt = Annotated[
    list[str] | None, typer.Option("--stack", "-s", help="Stack to judge, any case (repeatable; default: all).")
]
GpuOpt = Annotated[
    str | None,
    typer.Option(
        "--gpu", help="GPU to size memory for: h100, h200, b200, gb10, rtx4090, ... (default: the local GPU, if any)."
    ),
]
GpusOpt = Annotated[int, typer.Option("--gpus", min=1, help="Number of GPUs available for tensor parallelism.")]
ContextOpt = Annotated[
    int | None, typer.Option("--context", min=1, help="Context length to serve (default: min(target max, 32768)).")
]
ConcurrencyOpt = Annotated[
    int, typer.Option("--concurrency", min=1, help="Sequences served at once, for KV and state memory.")
]


def check(
    target: TargetArg,
    draft: DraftArg = None,
    stack: StackOpt = None,
    gpu: GpuOpt = None,
    gpus: GpusOpt = 1,
    context: ContextOpt = None,
    concurrency: ConcurrencyOpt = 1,
    gguf_file: GgufFileOpt = None,
    draft_gguf_file: DraftGgufFileOpt = None,
    offline: OfflineOpt = False,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Check from metadata alone whether TARGET and DRAFT run together on each serving stack."""
    from specpair.app.check import check_pair

    result = check_pair(
        target,
        draft,
        stacks=stack,
        gpu=gpu,
        gpus=gpus,
        context=context,
        concurrency=concurrency,
        gguf_file=gguf_file,
        draft_gguf_file=draft_gguf_file,
        offline=offline,
    )
    Output(json_output, quiet).result(result.to_json, lambda: print_human(result, verbose))
    raise typer.Exit(result.exit_code)


def _describe(c, kind: str | None = None) -> str:
    from specpair.checkpoint.families import HEAD_KIND

    where = c.source + (f" @ {c.revision[:12]}" if c.revision else "")
    s = c.shapes
    layers = f"{s.num_layers} layer{'' if s.num_layers == 1 else 's'}"
    what = f"{c.family}, {layers}, hidden {s.hidden_size}"
    if c.drafter:
        taps = len(c.drafter.taps.layers) if c.drafter.taps else 0
        tapped = f"{taps or 'no'} tap{'' if taps == 1 else 's'}"
        what = f"{c.drafter.kind}, {layers}, hidden {s.hidden_size}, {tapped}, block {c.drafter.block_size}"
        if c.drafter.verifier:
            what += f", speculators format pinning {c.drafter.verifier}"
    elif kind == HEAD_KIND.name:
        if c.mtp is None:
            return f"none: {c.ref} has no MTP head (give a DRAFT)"
        what = f"its MTP head, {c.mtp.layers} layer(s)" + (", its tensors absent" if c.mtp.tensors == 0 else "")
    return f"{c.ref} ({where}; {what})"


def print_human(result, verbose: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    pair, verdicts = result.pair, result.verdicts
    out = console()
    print_prose(out, f"[bold]target[/bold]  {escape(_describe(pair.target))}")
    print_prose(out, f"[bold]draft[/bold]   {escape(_describe(pair.draft, pair.kind))}  [dim]as {pair.kind}[/dim]")
    for ref, why in result.fallbacks:  # said here: otherwise only --json's notes tell why the catalog answered
        print_prose(out, f"[yellow]offline[/yellow] {escape(ref)}: {escape(why)}")
    table = Table("stack", "status", "reasons")
    for stack, v in verdicts.items():
        rules = ", ".join(dict.fromkeys(f.rule for f in v.reasons if f.severity != "info")) or "-"
        table.add_row(stack, f"[{STATUS_STYLE[v.status]}]{v.status}[/]", rules)
    table.columns[0].no_wrap = True
    print_table(out, table)
    _print_reasons(out, verdicts, verbose)
    _print_commands(out, verdicts)


def _print_reasons(out, verdicts, verbose: bool) -> None:
    """One paragraph per distinct finding, with the stacks it applies to; info only with --verbose."""
    from rich.markup import escape

    seen: dict[tuple[str, str, str], list[str]] = {}
    for stack, v in verdicts.items():
        for f in v.reasons:
            seen.setdefault((f.severity, f.rule, f.message), []).append(stack)
    order = {"error": 0, "warn": 1, "info": 2}
    shown = sorted(
        (item for item in seen.items() if verbose or item[0][0] != "info"), key=lambda item: order[item[0][0]]
    )
    hidden = len(seen) - len(shown)
    if shown:
        out.print("[bold]Reasons[/bold]")
    for (severity, rule_id, message), stacks in shown:
        where = "all stacks" if len(stacks) == len(verdicts) and len(verdicts) > 1 else ", ".join(stacks)
        print_prose(
            out,
            f"[{SEVERITY_STYLE[severity]}]{severity:5}[/] {rule_id} [dim]({where})[/dim]: {escape(message)}",
            indent=2,
        )
    if hidden:
        print_prose(out, f"[dim]and {hidden} info note(s): --verbose shows them, --json has every one[/dim]", indent=2)


def _print_commands(out, verdicts) -> None:
    """Each stack's launch line, then the fixes (or what no specpair command clears)."""
    launches = [(s, v.launch) for s, v in verdicts.items() if v.launch]
    if launches:
        out.print("[bold]Launch[/bold]")
        for stack, launch in launches:
            print_command(out, f"{stack}: {launch}")
    blocked: dict[str, list[str]] = {}  # what blocks -> the stacks it blocks
    fixes = [(s, v.fix) for s, v in verdicts.items() if v.fix]
    for stack, v in verdicts.items():
        if v.status == "fail" and not v.fix:
            blocked.setdefault(", ".join(v.blocked_by), []).append(stack)
    if fixes or blocked:
        out.print("[bold]Fix[/bold]")
    for stack, fix in fixes:
        print_command(out, f"{stack}: {fix}")
    for rules, stacks in blocked.items():
        print_prose(out, f"{', '.join(stacks)}: no specpair command clears {rules}", indent=2)

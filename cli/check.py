"""`specpair check TARGET [DRAFT]`: can they run together, on which stack, with which flags."""

from __future__ import annotations

from typing import Annotated

import typer

from specpair.cli import app
from specpair.cli._options import GgufFileOpt, JsonOpt, OfflineOpt, QuietOpt, VerboseOpt
from specpair.cli._output import console, print_command, print_json, print_prose, print_table

EXAMPLES = """\b
Examples:
  specpair check Qwen/Qwen3.6-35B-A3B z-lab/Qwen3.6-35B-A3B-DFlash
  specpair check ./Qwen3.6-27B ./Qwen3.6-27B-DFlash --gpu h200 --context 65536
  specpair check Qwen/Qwen3.5-122B-A10B            # the target's own MTP head
  specpair check target.gguf draft.gguf --stack llama.cpp --json
  specpair check specpair.lock                     # the pair `specpair download` fetched"""

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}
SEVERITY_STYLE = {"error": "red", "warn": "yellow", "info": "dim"}


@app.command(epilog=EXAMPLES)
def check(
    target: Annotated[
        str,
        typer.Argument(
            help="Target: local directory, .gguf file, Hub repo org/name[@revision], or a specpair.lock (its pair)."
        ),
    ],
    draft: Annotated[
        str | None, typer.Argument(help="Drafter or draft model; omit to use the target's MTP head.")
    ] = None,
    stack: Annotated[
        list[str] | None, typer.Option("--stack", "-s", help="Stack to judge, any case (repeatable; default: all).")
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            help="GPU to size memory for: h100, h200, b200, gb10, rtx4090, ... (default: the local GPU, if any).",
        ),
    ] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="Number of GPUs available for tensor parallelism.")] = 1,
    context: Annotated[
        int | None, typer.Option("--context", min=1, help="Context length to serve (default: min(target max, 32768)).")
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Sequences served at once, for KV and state memory.")
    ] = 1,
    gguf_file: GgufFileOpt = None,
    draft_gguf_file: Annotated[
        str | None, typer.Option("--draft-gguf-file", help="Which .gguf file of DRAFT to read.")
    ] = None,
    offline: OfflineOpt = False,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Check from metadata alone whether TARGET and DRAFT run together on each serving stack."""
    from specpair.compat.memory import GPUS, local_gpu
    from specpair.compat.pair import Deployment
    from specpair.compat.stacks import STACK_NAMES
    from specpair.compat.verdict import exit_code, judge, report
    from specpair.errors import BadInput
    from specpair.sources import open_checkpoint

    stacks = []
    for name in stack or STACK_NAMES:
        known = next((s for s in STACK_NAMES if s == name.lower()), None)
        if known is None:
            raise BadInput(f"--stack {name}", f"unknown stack (stacks: {', '.join(STACK_NAMES)})")
        stacks.append(known)
    if gpu is not None and gpu.lower() not in GPUS:
        raise BadInput(f"--gpu {gpu}", f"unknown GPU (known: {', '.join(GPUS)})")
    deployment = Deployment(
        gpu=GPUS[gpu.lower()] if gpu else local_gpu(),
        gpus=gpus,
        context=context,
        concurrency=concurrency,
    )
    if draft is None and target.endswith(".lock"):  # the pair `specpair download` wrote, read where it lies
        from specpair.sources.lockfile import open_locked_pair

        target_checkpoint, draft_checkpoint = open_locked_pair(target, gguf_file, draft_gguf_file)
    else:
        target_checkpoint = open_checkpoint(target, gguf_file, offline or None)
        draft_checkpoint = open_checkpoint(draft, draft_gguf_file, offline or None) if draft else None
    pair, verdicts = judge(target_checkpoint, draft_checkpoint, deployment, list(dict.fromkeys(stacks)))
    code = exit_code(verdicts)
    if json_output:
        print_json(report(pair, verdicts))
    elif not quiet:
        _print_human(pair, verdicts, verbose)
    raise typer.Exit(code)


def _describe(c, kind: str | None = None) -> str:
    where = c.source + (f" @ {c.revision[:12]}" if c.revision else "")
    s = c.shapes
    what = f"{c.family}, {s.num_layers} layers, hidden {s.hidden_size}"
    if c.drafter:
        taps = len(c.drafter.taps.layers) if c.drafter.taps else "no"
        what = f"{c.drafter.kind}, {s.num_layers} layers, hidden {s.hidden_size}, {taps} taps, block {c.drafter.block_size}"
    elif kind == "mtp":
        if c.mtp is None:
            return f"none: {c.ref} has no MTP head (give a DRAFT)"
        what = f"its MTP head, {c.mtp.layers} layer(s)" + (", its tensors absent" if c.mtp.tensors == 0 else "")
    return f"{c.ref} ({where}; {what})"


def _print_human(pair, verdicts, verbose: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console()
    print_prose(out, f"[bold]target[/bold]  {escape(_describe(pair.target))}")
    print_prose(out, f"[bold]draft[/bold]   {escape(_describe(pair.draft, pair.kind))}  [dim]as {pair.kind}[/dim]")
    table = Table("stack", "status", "reasons")
    for stack, v in verdicts.items():
        rules = ", ".join(dict.fromkeys(f.rule for f in v.reasons if f.severity != "info")) or "-"
        table.add_row(stack, f"[{STATUS_STYLE[v.status]}]{v.status}[/]", rules)
    table.columns[0].no_wrap = True
    print_table(out, table)
    # One paragraph per distinct finding, with the stacks it applies to; info only with --verbose.
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

"""`specpair bench TARGET [DRAFT]`: decode speed as users post it, on specpair's own runtime: tok/s by number of users
and by context depth, undrafted and drafted, with τ, each row against the weights roofline of the GPU; every
drafted run compared token for token with the undrafted one."""

from __future__ import annotations

import os
import re
import shlex
import sys
from typing import Annotated

import typer

from specpair.cli._options import (
    BlockSizeOpt,
    ChatKwargsOpt,
    ChatOpt,
    DeviceOpt,
    DraftBitsOpt,
    DraftGgufFileOpt,
    DtypeOpt,
    GgufFileOpt,
    GraphsOpt,
    JsonOpt,
    MtpOpt,
    ProfileOpt,
    PromptsOpt,
    QuietOpt,
    ThreadsOpt,
    TpOpt,
)
from specpair.cli._output import Output, console, print_prose, print_table
from specpair.errors import BadInput

EXAMPLES = """\b
Examples:
  specpair bench ./Qwen3-8B ./Qwen3-0.6B --md                     # a draft model sharing the tokenizer
  specpair bench Qwen/Qwen3.6-35B-A3B --mtp --users 1,4 --depth 0,4k,32k --plot depth.png
  specpair bench ./Qwen3-8B --tokens 256 --json                   # no drafter: the undrafted columns only
  specpair bench ./Qwen3-8B ./draft --no-graphs --depth 0 --users 1   # eager, for debugging
  specpair bench ./Qwen3-8B ./Qwen3-8B-EAGLE3 --prompts builtin --depth 0 --users 4 --profile profile.json
  specpair bench ./random-35B --mtp --users 1,4 --depth 0 --at-tau 3.5     # random weights, priced at a real τ

\b
Rows: users N runs the built-in prompts (prose and code, cycled) as N concurrent sequences, or with --prompts FILE
every prompt of the file, N at a time; through the target's chat template when it has one (--no-chat: raw text).
Depth D runs one sequence whose prompt is D tokens of the built-in prompts' text (depth 0: one token). Every
sequence generates --tokens tokens, greedy, stop ids ignored. tok/s counts decoding only (no prefill, no graph
capture), summed over the users. Each figure is the median of 3 runs, undrafted and drafted in turn (AB BA AB); a
row whose runs disagree by more than 1.25x (max/min) is marked UNRELIABLE.
The weights roofline is users x the GPU's nominal memory bandwidth / the bytes of weights one decode step reads
(routed experts: the share the users' tokens touch under uniform routing; KV and recurrent state not counted).
predicted is the speedup of a loop that cost only its steps: τ x the decode step / (the drafter's round + the
verify step), each timed alone on the row's prompts (the verify step on the block a round verifies: the anchor and
the drafter's proposal); speedup / predicted shows what the loop itself costs. --at-tau T adds the drafted tok/s
those steps give at τ T: users x T / (draft round + verify step).
Output: a header (GPU, versions, the command line) and the two tables on stdout (--md: as Markdown), progress on
stderr; --quiet: the same on stdout, nothing on stderr; --json: one document (schema specpair.bench/1).
--profile F.json: the users rows' acceptance as ModelOpt's speculation_profile.json (schema 1.0).
Exit codes: 0 measured (every drafted run identical to the undrafted one); 1 a drafted run differed (its
sequence, token position and both tokens are reported); 2 bad input; 3 inconclusive: a drafted row compared
fewer than 16 generated tokens (--tokens), so it proves nothing."""
COUNT = re.compile(r"(\d+)(k?)")
GREEDY_NOTE = "greedy, stop ids ignored"
PLOT_TITLE = "specpair bench: decode tok/s by context depth"
COLORS = {"undrafted": (31, 119, 180), "drafted": (255, 127, 14), "roofline": (150, 150, 150)}


def parse_counts(option: str, text: str, least: int) -> list[int]:
    """'0,512,1k,32k' -> [0, 512, 1024, 32768]; a one-line BadInput naming the option for anything else."""
    counts = []
    for item in text.split(","):
        found = COUNT.fullmatch(item.strip().lower())
        if found is None:
            raise BadInput(
                option,
                f"{item.strip()!r} is not a count: give integers or multiples of 1024 written "
                f"like 4k, separated by commas (got {text!r})",
            )
        count = int(found[1]) * (1024 if found[2] else 1)
        if count < least:
            raise BadInput(option, f"{count} is below {least}: give counts of at least {least}")
        counts.append(count)
    return counts


def count_label(n: int) -> str:
    return f"{n // 1024}k" if n and n % 1024 == 0 else str(n)


TargetArg = Annotated[
    str,
    typer.Argument(
        help="Checkpoint: local directory, .gguf file, or a Hub repo org/name[@revision] already in the HF cache."
    ),
]
DraftArg = Annotated[
    str | None,
    typer.Argument(
        help="Drafter (DFlash, DFlash2, EAGLE-3) or a draft model sharing the tokenizer: adds the drafted columns."
    ),
]
DepthOpt = Annotated[
    str, typer.Option("--depth", help="Context depths of the depth sweep, in prompt tokens (1k = 1024).")
]
UsersOpt = Annotated[str, typer.Option("--users", help="Concurrent sequences of the users sweep.")]
TokensOpt = Annotated[int, typer.Option("--tokens", min=2, help="Tokens generated per sequence.")]
BandwidthOpt = Annotated[
    float | None,
    typer.Option(
        "--bandwidth",
        min=0.001,
        help="Memory bandwidth in GB/s for the roofline (default: the GPU table's figure for this GPU).",
    ),
]
AtTauOpt = Annotated[
    float | None,
    typer.Option(
        "--at-tau",
        min=1.0,
        help="Also give each drafted row's tok/s at this τ (tokens a round), from its steps timed alone: what a "
        "drafter accepting that many would reach, where the one given accepts fewer (random weights: 1).",
    ),
]
MdOpt = Annotated[bool, typer.Option("--md", help="Print the tables as Markdown.")]
PlotOpt = Annotated[
    str | None, typer.Option("--plot", help="Write a PNG of the depth sweep (tok/s by depth) to this file.")
]


def bench(
    target: TargetArg,
    draft: DraftArg = None,
    mtp: MtpOpt = False,
    depth: DepthOpt = "0,512,1k,2k,4k,8k,32k",
    users: UsersOpt = "1,2,4,8",
    tokens: TokensOpt = 512,
    prompts: PromptsOpt = None,
    chat: ChatOpt = None,
    chat_template_kwargs: ChatKwargsOpt = None,
    profile: ProfileOpt = None,
    block_size: BlockSizeOpt = None,
    device: DeviceOpt = None,
    threads: ThreadsOpt = None,
    dtype: DtypeOpt = None,
    tp: TpOpt = 1,
    gguf_file: GgufFileOpt = None,
    draft_gguf_file: DraftGgufFileOpt = None,
    draft_bits: DraftBitsOpt = 0,
    graphs: GraphsOpt = None,
    bandwidth: BandwidthOpt = None,
    at_tau: AtTauOpt = None,
    json_output: JsonOpt = False,
    md: MdOpt = False,
    plot: PlotOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Measure decode tok/s by users and by depth, undrafted and (with DRAFT or --mtp) drafted, with τ and the
    weights roofline of the GPU."""
    from specpair.app.bench import run_bench
    from specpair.app.device import start_ranks
    from specpair.app.profile import check_writable, write_profile
    from specpair.app.prompts import read_prompts, template_kwargs

    ended = start_ranks(tp)
    if ended is not None:
        raise typer.Exit(ended)
    depths = parse_counts("--depth", depth, 0)
    user_counts = parse_counts("--users", users, 1)
    if json_output and md:
        raise BadInput("--md", "give at most one of --json and --md")
    if plot is not None and not os.path.isdir(os.path.dirname(os.path.abspath(plot))):
        raise BadInput(plot, "its directory does not exist")
    if profile is not None:
        if draft is None and not mtp:
            raise BadInput("--profile", "measures a drafter's acceptance: give DRAFT or --mtp")
        check_writable(profile)
    out = Output(json_output, quiet)
    report = run_bench(
        target,
        draft,
        command="specpair " + shlex.join(sys.argv[1:]),
        mtp=mtp,
        depths=depths,
        user_counts=user_counts,
        tokens=tokens,
        prompts=read_prompts(prompts, chat) if prompts is not None else None,
        chat=chat,
        chat_kwargs=template_kwargs(chat_template_kwargs),
        block_size=block_size,
        device=device,
        threads=threads,
        dtype=dtype,
        gguf_file=gguf_file,
        draft_gguf_file=draft_gguf_file,
        draft_bits=draft_bits or None,
        graphs=graphs,
        bandwidth=bandwidth,
        at_tau=at_tau,
        progress=out,
    )
    if plot is not None:
        write_plot(plot, report.depth)
        report.plot = plot
    if profile is not None:
        write_profile(profile, report.profile())
    document = report.to_json()
    out.result(document, lambda: print_report(document, md), quiet=lambda: print_report(document, md))
    raise typer.Exit(report.exit_code)


def write_plot(path: str, rows: list[dict]) -> None:
    """The depth sweep's tok/s as a PNG, written beside `path` and renamed onto it (never half a file)."""
    from specpair.cli._plot import line_chart

    series = [("undrafted", [r["undrafted"]["tokens_per_s"] for r in rows])]
    if rows and rows[0]["drafted"] is not None:
        series.append(("drafted", [r["drafted"]["tokens_per_s"] for r in rows]))
    if rows and rows[0]["roofline"]["tokens_per_s"] is not None:
        series.append(("roofline", [r["roofline"]["tokens_per_s"] for r in rows]))
    png = line_chart(
        [count_label(r["depth"]) for r in rows],
        [(COLORS[name], values) for name, values in series],
        title=PLOT_TITLE,
        x_label="context depth (prompt tokens)",
        y_label="tok/s",
        names=[name for name, _ in series],
    )
    partial = path + ".specpair-partial"
    try:
        with open(partial, "wb") as f:
            f.write(png)
        os.replace(partial, path)
    except OSError as e:
        if os.path.exists(partial):
            os.remove(partial)
        raise BadInput(path, f"cannot be written ({e.strerror})") from None


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _spread(timing: dict) -> str:
    """The worst max/min of a row's repeats, and UNRELIABLE past the limit."""
    known = [x for x in timing["spread"].values() if x is not None]
    if not known:
        return "—"
    return f"{max(known):.2f}×" + ("" if timing["reliable"] else " UNRELIABLE")


def tables(doc: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the users table and the depth table."""
    drafted = doc["draft"] is not None
    tables = []
    for key in ("users", "depth"):
        header = [key, "undrafted tok/s"]
        if drafted:
            header += ["drafted tok/s", "speedup", "predicted", "speedup / predicted", "τ", "identical"]
            if doc["at_tau"] is not None:
                header.append(f"tok/s at τ {doc['at_tau']:g}")
        header += ["roofline tok/s", "undrafted / roofline"] + (["drafted / roofline"] if drafted else [])
        header.append("repeats max/min")
        rows = []
        for r in doc[key]:
            cells = [
                str(r["users"]) if key == "users" else count_label(r["depth"]),
                _rate(r["undrafted"]["tokens_per_s"]),
            ]
            if drafted:
                d = r["drafted"]
                cells += [
                    _rate(d["tokens_per_s"]),
                    f"{r['speedup']:.2f}×",
                    f"{d['predicted_speedup']:.2f}×",
                    _share(d["of_predicted"]),
                    f"{d['tau']:.2f}",
                    {True: "yes", False: "NO", None: "inconclusive"}[d["identical"]],
                ]
                if d["at_tau"] is not None:
                    cells.append(f"{_rate(d['at_tau']['tokens_per_s'])} ({d['at_tau']['speedup']:.2f}×)")
            cells += [_rate(r["roofline"]["tokens_per_s"]), _share(r["of_roofline"]["undrafted"])]
            if drafted:
                cells.append(_share(r["of_roofline"]["drafted"]))
            rows.append(cells + [_spread(r["timing"])])
        title = (
            "Users: the prompts as concurrent sequences"
            if key == "users"
            else "Depth: one sequence after a prompt of that many tokens"
        )
        tables.append((title, header, rows))
    return tables


def header_lines(doc: dict) -> list[str]:
    v = doc["versions"]
    draft = doc["draft"]
    bandwidth = doc["bandwidth"]
    lines = [
        f"GPU: {doc['gpu'] or 'none (' + doc['device'] + ')'} · torch {v['torch']} · triton {v['triton'] or '—'} · "
        f"CUDA {v['cuda'] or '—'} · specpair {v['specpair']} · CUDA graphs {'on' if doc['graphs'] else 'off'}",
        f"command: `{doc['command']}`",
        f"target: {doc['target']['ref']} ({doc['target']['family']}, {doc['target']['resident_bytes'] / 1e9:.2f} GB "
        f"as loaded, {doc['dtype']}) · "
        + (
            f"draft: {draft['ref'] or 'its MTP head'} ({draft['kind']}, block {draft['block_size']})"
            if draft
            else "no draft"
        )
        + f" · {doc['tokens']} tokens per sequence, {GREEDY_NOTE}",
        "weights roofline: users × "
        + (
            f"{bandwidth['bytes_per_s'] / 1e12:.3f} TB/s ({bandwidth['source']})"
            if bandwidth["bytes_per_s"]
            else "the bandwidth (unknown here: --bandwidth)"
        )
        + " / bytes of weights a decode step reads",
    ]
    runs = [r for key in ("users", "depth") for r in doc[key]]
    if runs:
        timing = runs[0]["timing"]
        unreliable = [r for r in runs if not r["timing"]["reliable"]]
        lines.append(
            f"each figure the median of {timing['repeats']} runs"
            + (", undrafted and drafted in turn" if doc["draft"] else "")
            + f"; runs that disagree by more than {timing['limit']:.2f}× (max/min) make a row UNRELIABLE"
            + (
                f": {len(unreliable)} of {len(runs)} rows are (the machine's speed moved: rerun it idle)"
                if unreliable
                else ""
            )
        )
    if doc["draft"] is not None:
        lines.append(
            "predicted: the speedup of a loop that cost only its steps, τ × decode step / (draft round + verify "
            "step), each step timed alone on the same prompts; speedup / predicted is what the loop's own work leaves"
        )
        if doc["at_tau"] is not None:
            lines.append(
                f"tok/s at τ {doc['at_tau']:g}: users × {doc['at_tau']:g} / (draft round + verify step), the same "
                "steps alone, and the speedup it gives: what a drafter accepting that many tokens a round would reach"
            )
        lines.append(
            "drafted == undrafted, token for token: "
            f"{sum(r['drafted']['identical'] is True for r in runs)}/{len(runs)} runs"
        )
        lines += [f"INCONCLUSIVE {reason}" for reason in doc["inconclusive"]]
        for key in ("users", "depth"):
            for r in doc[key]:
                d = r["drafted"]["first_difference"]
                if d:
                    lines.append(
                        f"DIVERGED {key} {r[key]}: sequence {d['user']} at token {d['position']}: undrafted "
                        f"{d['undrafted']} vs drafted {d['drafted']}"
                    )
    if doc["plot"]:
        lines.append(f"plot: {doc['plot']} (tok/s by depth: blue undrafted, orange drafted, grey roofline)")
    return lines


def print_report(doc: dict, md: bool) -> None:
    if md:
        out = ["# specpair bench", ""] + [line + "  " for line in header_lines(doc)]
        for title, header, rows in tables(doc):
            out += ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            out += ["| " + " | ".join(cells) + " |" for cells in rows]
        sys.stdout.write("\n".join(out) + "\n")
        return
    from rich.markup import escape
    from rich.table import Table

    term = console()
    for line in header_lines(doc):
        print_prose(term, escape(line))
    for title, header, rows in tables(doc):
        table = Table(*header, title=title)
        for cells in rows:
            table.add_row(*cells)
        print_table(term, table)

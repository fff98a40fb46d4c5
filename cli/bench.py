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

from specpair.cli import app
from specpair.cli._options import GgufFileOpt, JsonOpt
from specpair.cli._output import console, print_json, print_prose, print_table
from specpair.errors import BadInput

SCHEMA = "specpair.bench/1"
EXAMPLES = """\b
Examples:
  specpair bench ./Qwen3-8B ./Qwen3-0.6B --md                     # a draft model sharing the tokenizer
  specpair bench Qwen/Qwen3.6-35B-A3B --mtp --users 1,4 --depth 0,4k,32k --plot depth.png
  specpair bench ./Qwen3-8B --tokens 256 --json                   # no drafter: the undrafted columns only
  specpair bench ./Qwen3-8B ./draft --no-graphs --depth 0 --users 1   # eager, for debugging

\b
Rows: users N runs the built-in prompts (prose and code, cycled) as N concurrent sequences; depth D runs one
sequence whose prompt is D tokens of the built-in prompts' text (depth 0: one token). Every sequence generates
--tokens tokens, greedy, stop ids ignored. tok/s counts decoding only (no prefill, no graph capture), summed
over the users.
The weights roofline is users x the GPU's nominal memory bandwidth / the bytes of weights one decode step reads
(routed experts: the share the users' tokens touch under uniform routing; KV and recurrent state not counted).
predicted is the speedup of a loop that cost only its steps: τ x the decode step / (the drafter's round + the
verify step), each timed alone on the row's prompts; speedup / predicted shows what the loop itself costs.
Exit codes: 0 measured (every drafted run identical to the undrafted one); 1 a drafted run differed (its
sequence, token position and both tokens are reported); 2 bad input."""
COUNT = re.compile(r"(\d+)(k?)")
GREEDY_NOTE = "greedy, stop ids ignored"
COLORS = {"baseline": (31, 119, 180), "drafted": (255, 127, 14), "roofline": (150, 150, 150)}


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


@app.command(epilog=EXAMPLES)
def bench(
    target: Annotated[
        str,
        typer.Argument(
            help="Checkpoint: local directory, .gguf file, or a Hub repo org/name[@revision] already in the HF cache."
        ),
    ],
    draft: Annotated[
        str | None,
        typer.Argument(
            help="Drafter (DFlash, DFlash2, EAGLE-3) or a draft model sharing the tokenizer: adds the drafted columns."
        ),
    ] = None,
    mtp: Annotated[bool, typer.Option("--mtp", help="Draft with the target's own MTP head.")] = False,
    depth: Annotated[
        str, typer.Option("--depth", help="Context depths of the depth sweep, in prompt tokens (1k = 1024).")
    ] = "0,512,1k,2k,4k,8k,32k",
    users: Annotated[str, typer.Option("--users", help="Concurrent sequences of the users sweep.")] = "1,2,4,8",
    tokens: Annotated[int, typer.Option("--tokens", min=2, help="Tokens generated per sequence.")] = 512,
    block_size: Annotated[
        int | None, typer.Option("--block-size", min=1, help="Tokens verified per round (default: the drafter's).")
    ] = None,
    device: Annotated[str | None, typer.Option("--device", help="cuda or cpu (default: cuda when present).")] = None,
    gguf_file: GgufFileOpt = None,
    draft_gguf_file: Annotated[
        str | None, typer.Option("--draft-gguf-file", help="Which .gguf file of DRAFT to read.")
    ] = None,
    draft_bits: Annotated[
        int, typer.Option("--draft-bits", help="4: quantize the drafter to affine-4 at load; 0: as stored.")
    ] = 0,
    graphs: Annotated[
        bool | None,
        typer.Option(
            "--graphs/--no-graphs",
            help="Decode and verify steps as CUDA graphs (default: on CUDA); --no-graphs runs them eagerly, for debugging.",
        ),
    ] = None,
    bandwidth: Annotated[
        float | None,
        typer.Option(
            "--bandwidth",
            min=0.001,
            help="Memory bandwidth in GB/s for the roofline (default: the GPU table's figure for this GPU).",
        ),
    ] = None,
    json_output: JsonOpt = False,
    md: Annotated[bool, typer.Option("--md", help="Print the tables as Markdown.")] = False,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Write a PNG of the depth sweep (tok/s by depth) to this file.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines on stderr.")] = False,
) -> None:
    """Measure decode tok/s by users and by depth, undrafted and (with DRAFT or --mtp) drafted, with τ and the
    weights roofline of the GPU."""
    depths = parse_counts("--depth", depth, 0)
    user_counts = parse_counts("--users", users, 1)
    if json_output and md:
        raise BadInput("--md", "give at most one of --json and --md")
    if mtp and draft is not None:
        raise BadInput("--mtp", "drafts with the target's own MTP head: give no DRAFT with it")
    if plot is not None and not os.path.isdir(os.path.dirname(os.path.abspath(plot))):
        raise BadInput(plot, "its directory does not exist")
    code = _bench(
        target,
        draft,
        mtp=mtp,
        depths=depths,
        user_counts=user_counts,
        tokens=tokens,
        block_size=block_size,
        device=device,
        gguf_file=gguf_file,
        draft_gguf_file=draft_gguf_file,
        draft_bits=draft_bits or None,
        graphs=graphs,
        bandwidth=bandwidth,
        json_output=json_output,
        md=md,
        plot=plot,
        quiet=quiet,
    )
    raise typer.Exit(code)


def _bench(
    target_ref: str,
    draft_ref: str | None,
    *,
    mtp: bool,
    depths: list[int],
    user_counts: list[int],
    tokens: int,
    block_size: int | None,
    device: str | None,
    gguf_file: str | None,
    draft_gguf_file: str | None,
    draft_bits: int | None,
    graphs: bool | None,
    bandwidth: float | None,
    json_output: bool,
    md: bool,
    plot: str | None,
    quiet: bool,
) -> int:
    import torch

    from specpair.cli._gate import BUILTIN_PROMPTS
    from specpair.cli.run import DEVICE, _check_fits, _dtype, _progress, _size
    from specpair.compat.memory import gpu_named
    from specpair.runtime import loading
    from specpair.runtime.drafters.loading import drafter_kind, load_drafter
    from specpair.sources.model import open_model

    if device is not None and not DEVICE.fullmatch(device):
        raise BadInput("--device", f"{device!r} is not cuda, cuda:N or cpu")
    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if where.type == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device", "cuda asked, but torch sees no CUDA GPU here")
    graphs = where.type == "cuda" if graphs is None else graphs
    notes = _Notes(not quiet)
    target_model = open_model(target_ref, gguf_file)
    draft_model = open_model(draft_ref, draft_gguf_file) if draft_ref is not None else None
    drafted = draft_model is not None or mtp
    plan = loading.plan_load(target_model, where)
    tokenizer = target_model.tokenizer()
    user_prompts = [tokenizer.encode(text) for _, text in BUILTIN_PROMPTS]
    text = tokenizer.encode("\n\n".join(text for _, text in BUILTIN_PROMPTS) + "\n\n")
    if not text or not all(user_prompts):
        raise BadInput(target_ref, "its tokenizer encodes the built-in prompts to no tokens")
    if where.type == "cuda":
        _check_fits(plan, max(depths + [len(p) for p in user_prompts]) + tokens + (block_size or 16))

    with _progress(plan.stored_bytes, not quiet and sys.stderr.isatty()) as advance:
        notes.line(f"loading {_size(plan.stored_bytes)} from {target_ref} onto {where} ({_dtype(plan)})")
        target = loading.load(plan, advance)
    drafter = None
    if drafted:
        notes.line(f"loading the {drafter_kind(draft_model)} drafter" + (f" from {draft_ref}" if draft_ref else ""))
        drafter = load_drafter(draft_model, target_model, target, draft_bits)
    block = block_size or (drafter.block_size if drafter else None)
    gpu = torch.cuda.get_device_name(where) if where.type == "cuda" else None
    known = gpu_named(gpu) if gpu else None
    bytes_per_s = bandwidth * 1e9 if bandwidth else (known.bandwidth if known else None)

    notes.line("warming up (kernels compile on first use)")
    _warm_up(target, drafter, user_prompts[0], block, graphs)
    runs = _Runs(target, drafter, plan, tokens, block, graphs, bytes_per_s, notes)
    user_rows = [runs.row([user_prompts[i % len(user_prompts)] for i in range(n)], f"users {n}") for n in user_counts]
    depth_rows = [
        {"depth": d, **runs.row([(text * (max(d, 1) // len(text) + 1))[: max(d, 1)]], f"depth {d}")} for d in depths
    ]

    document = {
        "schema": SCHEMA,
        "command": "specpair " + shlex.join(sys.argv[1:]),
        "gpu": gpu,
        "device": str(where),
        "dtype": _dtype(plan),
        "graphs": graphs,
        "versions": _versions(),
        "bandwidth": {
            "bytes_per_s": bytes_per_s,
            "source": "--bandwidth" if bandwidth else (f"table: {known.name}" if known else None),
        },
        "target": {"ref": target_ref, "family": target_model.config.family, "resident_bytes": plan.resident_bytes},
        "draft": None
        if drafter is None
        else {"ref": draft_ref, "kind": drafter.kind, "resident_bytes": drafter.resident_bytes, "block_size": block},
        "tokens": tokens,
        "users": user_rows,
        "depth": depth_rows,
        "identical": None if drafter is None else all(r["drafted"]["identical"] for r in user_rows + depth_rows),
        "plot": plot,
    }
    if plot is not None:
        _write_plot(plot, depth_rows)
    if json_output:
        print_json(document)
    else:
        _print(document, md)
    return 1 if document["identical"] is False else 0


class _Notes:
    """A line on stderr per stage, and each row's result."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def line(self, what: str) -> None:
        if self.enabled:
            sys.stderr.write(what + "\n")
            sys.stderr.flush()


def _warm_up(target, drafter, ids: list[int], block: int | None, graphs: bool) -> None:
    """A short run each way, so that what is compiled or initialised on first use is not in a timed run."""
    from specpair.runtime.generate import generate
    from specpair.runtime.sampling import Sampling
    from specpair.runtime.speculative import speculative_generate

    generate(target, [ids], 2, Sampling(), graphs=graphs)
    if drafter is not None:
        speculative_generate(target, drafter, [ids], block + 1, Sampling(), block_size=block, graphs=graphs)


class _Runs:
    """One row: the prompts undrafted, then drafted and compared, against the weights roofline."""

    def __init__(
        self,
        target,
        drafter,
        plan,
        tokens: int,
        block: int | None,
        graphs: bool,
        bytes_per_s: float | None,
        notes: _Notes,
    ) -> None:
        self.target, self.drafter, self.plan, self.tokens, self.block = target, drafter, plan, tokens, block
        self.graphs, self.bytes_per_s, self.notes = graphs, bytes_per_s, notes

    def row(self, prompts: list[list[int]], name: str) -> dict:
        from specpair.runtime.generate import generate
        from specpair.runtime.sampling import Sampling
        from specpair.runtime.speculative import acceptance_by_position, speculative_generate, step_times

        self.notes.line(
            f"{name}: undrafted, {len(prompts)} x {self.tokens} tokens after "
            f"{'/'.join(str(len(p)) for p in prompts)} prompt tokens"
        )
        undrafted, u = generate(self.target, prompts, self.tokens, Sampling(), graphs=self.graphs)
        u_rate = u.decode_tokens_per_s
        weights = self.plan.weights_read(len(prompts))
        roofline = len(prompts) * self.bytes_per_s / weights if self.bytes_per_s else None
        row = {
            "users": len(prompts),
            "prompt_tokens": sum(len(p) for p in prompts),
            "undrafted": {
                "tokens_per_s": u_rate,
                "seconds": {"prefill": u.prefill_s, "decode": u.decode_s, "capture": u.capture_s},
            },
            "drafted": None,
            "speedup": None,
            "roofline": {"weights_bytes_per_step": weights, "tokens_per_s": roofline},
            "of_roofline": {"undrafted": u_rate / roofline if roofline else None, "drafted": None},
        }
        result = f"  {u_rate:.1f} tok/s undrafted"
        if self.drafter is not None:
            self.notes.line(f"{name}: drafted ({self.drafter.kind}, block {self.block})")
            drafted, d = speculative_generate(
                self.target, self.drafter, prompts, self.tokens, Sampling(), block_size=self.block, graphs=self.graphs
            )
            rounds = sum(len(r.committed) for r in drafted)
            d_rate = d.generated_tokens / (d.draft_s + d.verify_s)
            tau = sum(sum(r.committed) for r in drafted) / rounds
            difference = _first_difference([g.tokens for g in undrafted], [r.tokens for r in drafted])
            steps = step_times(self.target, self.drafter, prompts, self.block, graphs=self.graphs)
            predicted = steps.predicted_speedup(tau)
            row["drafted"] = {
                "tokens_per_s": d_rate,
                "tau": tau,
                "acceptance_by_position": acceptance_by_position(drafted, self.block - 1),
                "rounds": rounds,
                "identical": difference is None,
                "first_difference": difference,
                "seconds": {"prefill": d.prefill_s, "draft": d.draft_s, "verify": d.verify_s, "capture": d.capture_s},
                "step_seconds": {"decode": steps.decode_s, "verify": steps.verify_s, "draft": steps.draft_s},
                "predicted_speedup": predicted,
                "of_predicted": d_rate / u_rate / predicted,
            }
            row["speedup"] = d_rate / u_rate
            row["of_roofline"]["drafted"] = d_rate / roofline if roofline else None
            result += (
                f" · {d_rate:.1f} drafted ({row['speedup']:.2f}×, {predicted:.2f}× predicted) · τ {tau:.2f} · "
                + ("identical" if difference is None else "DIVERGED")
            )
        self.notes.line(result + (f" · roofline {roofline:.1f}" if roofline else ""))
        return row


def _first_difference(undrafted: list[list[int]], drafted: list[list[int]]) -> dict | None:
    for user, (u, d) in enumerate(zip(undrafted, drafted)):
        if u != d:
            at = next((i for i, (a, b) in enumerate(zip(u, d)) if a != b), min(len(u), len(d)))
            return {
                "user": user,
                "position": at,
                "undrafted": u[at] if at < len(u) else None,
                "drafted": d[at] if at < len(d) else None,
            }
    return None


def _versions() -> dict:
    import torch

    from specpair import __version__

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"specpair": __version__, "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda}


def _write_plot(path: str, rows: list[dict]) -> None:
    """The depth sweep's tok/s as a PNG, written beside `path` and renamed onto it (never half a file)."""
    from specpair.cli._plot import line_chart

    series = [(COLORS["baseline"], [r["undrafted"]["tokens_per_s"] for r in rows])]
    if rows and rows[0]["drafted"] is not None:
        series.append((COLORS["drafted"], [r["drafted"]["tokens_per_s"] for r in rows]))
    if rows and rows[0]["roofline"]["tokens_per_s"] is not None:
        series.append((COLORS["roofline"], [r["roofline"]["tokens_per_s"] for r in rows]))
    partial = path + ".specpair-partial"
    try:
        with open(partial, "wb") as f:
            f.write(line_chart([count_label(r["depth"]) for r in rows], series))
        os.replace(partial, path)
    except OSError as e:
        if os.path.exists(partial):
            os.remove(partial)
        raise BadInput(path, f"cannot be written ({e.strerror})") from None


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _tables(doc: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the users table and the depth table."""
    drafted = doc["draft"] is not None
    tables = []
    for key, label, base in (("users", "users", "undrafted"), ("depth", "depth", "baseline")):
        header = [label, f"{base} tok/s"]
        if drafted:
            header += ["drafted tok/s", "speedup", "predicted", "speedup / predicted", "τ", "identical"]
        header += ["roofline tok/s", f"{base} / roofline"] + (["drafted / roofline"] if drafted else [])
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
                    "yes" if d["identical"] else "NO",
                ]
            cells += [_rate(r["roofline"]["tokens_per_s"]), _share(r["of_roofline"]["undrafted"])]
            if drafted:
                cells.append(_share(r["of_roofline"]["drafted"]))
            rows.append(cells)
        title = (
            "Users: the built-in prompts as concurrent sequences"
            if key == "users"
            else "Depth: one sequence after a prompt of that many tokens"
        )
        tables.append((title, header, rows))
    return tables


def _header(doc: dict) -> list[str]:
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
    if doc["identical"] is not None:
        lines.append(
            "predicted: the speedup of a loop that cost only its steps, τ × decode step / (draft round + verify "
            "step), each step timed alone on the same prompts; speedup / predicted is what the loop's own work leaves"
        )
        runs = [r for key in ("users", "depth") for r in doc[key]]
        lines.append(
            f"drafted == undrafted, token for token: {sum(r['drafted']['identical'] for r in runs)}/{len(runs)} runs"
        )
        for key in ("users", "depth"):
            for r in doc[key]:
                d = r["drafted"]["first_difference"]
                if d:
                    lines.append(
                        f"DIVERGED {key} {r[key]}: sequence {d['user']} at token {d['position']}: undrafted "
                        f"{d['undrafted']} vs drafted {d['drafted']}"
                    )
    if doc["plot"]:
        lines.append(f"plot: {doc['plot']} (tok/s by depth: blue baseline, orange drafted, grey roofline)")
    return lines


def _print(doc: dict, md: bool) -> None:
    if md:
        out = ["# specpair bench", ""] + [line + "  " for line in _header(doc)]
        for title, header, rows in _tables(doc):
            out += ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            out += ["| " + " | ".join(cells) + " |" for cells in rows]
        sys.stdout.write("\n".join(out) + "\n")
        return
    from rich.markup import escape
    from rich.table import Table

    term = console()
    for line in _header(doc):
        print_prose(term, escape(line))
    for title, header, rows in _tables(doc):
        table = Table(*header, title=title)
        for cells in rows:
            table.add_row(*cells)
        print_table(term, table)

"""Long fuzzing run over every parser (not part of CI): counts outcomes and writes docs/reliability.md.

    /work/venv/bin/python tests/fuzzing/run.py --inputs 100000 --seed 1 --jobs 2
    /work/venv/bin/python tests/fuzzing/run.py --replay /tmp/specpair-crashes/gguf-structured-3.json

Each (parser, mode) pair gets its parser's share of the inputs (Target.share: the parsers that run real
conversions get fewer) and runs in worker processes, each with its own copy of the base checkpoints. Hypothesis generates the inputs (generate phase only: no shrinking, no
example database), seeded so that a run is repeatable. A crash (an exception other than BadInput, or
a broken property: slow, memory-hungry, or a bad error line) is counted, its input saved as JSON,
and the run goes on.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import multiprocessing
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fixtures.py and this package

from fuzzing.targets import (
    HANG_LIMIT_S,
    MEMORY_BASE,
    MEMORY_PER_INPUT_BYTE,
    MODES,
    TARGETS,
    TIME_LIMIT_S,
    Case,
    Workspace,
    case_input,
    cases,
    exercise,
    remove_workspace,
    temporary_workspace,
)

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "docs" / "reliability.md"
START, END = "<!-- fuzz-results:start -->", "<!-- fuzz-results:end -->"

_workspace: Workspace | None = None  # one per worker process


@dataclass
class Tally:
    target: str
    mode: str
    inputs: int = 0
    accepted: int = 0
    rejected: int = 0
    crashes: int = 0
    seconds: float = 0.0
    slowest_s: float = 0.0
    slowest_case: dict | None = None  # case_input() of the slowest input, to replay
    peak_bytes: int = 0
    faults: collections.Counter = field(default_factory=collections.Counter)
    reasons: collections.Counter = field(default_factory=collections.Counter)
    crash_files: list[str] = field(default_factory=list)


def reason(problem: str) -> str:
    """A rejection message with its numbers, quoted values and path dropped, for counting by kind."""
    text = problem.split(": ", 1)[1] if ": " in problem else problem
    text = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "…", text)
    return re.sub(r"-?\d+(\.\d+)?", "N", text)[:100]


def run_task(task: tuple[str, str, int, int, str, str]) -> Tally:
    name, mode, count, run_seed, crash_dir, scratch = task
    global _workspace
    if _workspace is None:  # removed with `scratch` by the parent: pool workers skip atexit
        _workspace = Workspace(Path(tempfile.mkdtemp(dir=scratch)))
    workspace = _workspace
    tally = Tally(name, mode)

    @seed(run_seed)
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases(workspace, TARGETS[name], mode))
    def fuzz(case: Case) -> None:
        tally.inputs += 1
        tally.faults.update(case.faults)
        try:
            outcome = exercise(workspace, case)
        except Exception:  # noqa: BLE001  (a crash is what we count)
            tally.crashes += 1
            path = Path(crash_dir) / f"{name}-{mode}-{run_seed}-{tally.crashes}.json"
            path.write_text(json.dumps({**case_input(case), "error": traceback.format_exc()}, indent=1))
            tally.crash_files.append(str(path))
            return
        tally.seconds += outcome.seconds
        tally.peak_bytes = max(tally.peak_bytes, outcome.peak_bytes)
        if outcome.seconds > tally.slowest_s:
            tally.slowest_s, tally.slowest_case = outcome.seconds, case_input(case)
        if outcome.accepted:
            tally.accepted += 1
        else:
            tally.rejected += 1
            tally.reasons[reason(outcome.problem or "")] += 1

    fuzz()
    return tally


def replay(path: str) -> int:
    saved = json.loads(Path(path).read_text())
    workspace = temporary_workspace()
    try:
        case = Case(
            saved["base"],
            {k: v.encode("latin-1") for k, v in saved["files"].items()},
            saved["command"],
            tuple(saved["faults"]),
            tuple(tuple(op) for op in saved.get("layout", [])),
        )
        outcome = exercise(workspace, case)
        print(
            f"no crash: {'accepted' if outcome.accepted else 'rejected: ' + str(outcome.problem)} "
            f"in {outcome.seconds:.3f} s"
        )
        return 0
    finally:
        remove_workspace(workspace)


def write_report(tallies: list[Tally], args: argparse.Namespace, wall_s: float) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    by_target: dict[str, list[Tally]] = collections.defaultdict(list)
    for t in tallies:
        by_target[t.target].append(t)
    total = sum(t.inputs for t in tallies)
    lines = [
        START,
        (
            f"Generated by `tests/fuzzing/run.py` on {datetime.date.today()} at commit {commit or 'unknown'}"
            f"{' plus uncommitted changes' if dirty else ''}: {total} inputs in {wall_s / 60:.1f} min "
            f"({args.jobs} worker processes, Python {sys.version.split()[0]})."
        ),
        "",
        "Reproduce:",
        "",
        "```",
        f"python tests/fuzzing/run.py --inputs {args.inputs} --seed {args.seed} --jobs {args.jobs}",
        "```",
        "",
        (
            f"Per input: under {TIME_LIMIT_S:g} s of CPU time (and no hang: an alarm stops an input after {HANG_LIMIT_S:g} s), "
            f"peak resident memory growth under {MEMORY_BASE >> 20} MiB + "
            f"{MEMORY_PER_INPUT_BYTE} x the input bytes, nothing opened outside the checkpoint (nor a pickle or code file "
            "of it), a conversion leaving its destination or nothing, and either accepted or refused with one `BadInput` "
            "line that names a file of the checkpoint (convert: or a tensor of it; a lockfile: or the directory it names). "
            "A crash is anything else."
        ),
        "",
        "| parser | mode | inputs | accepted | rejected (BadInput) | crashes | slowest input (CPU) | peak memory growth |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for name, parts in by_target.items():
        for t in parts:
            case = t.slowest_case or {"files": {}, "faults": []}
            size = sum(len(text) for text in case["files"].values())
            slowest = (
                f"{t.slowest_s * 1000:.0f} ms ({size} bytes; {', '.join(sorted(set(case['faults']))) or 'no fault'})"
            )
            lines.append(
                f"| {name} | {t.mode} | {t.inputs} | {t.accepted} | {t.rejected} | {t.crashes} | {slowest} | "
                f"{t.peak_bytes / 2**20:.1f} MiB |"
            )
    lines += ["", "What each parser is fed (the code under test):", ""]
    lines += [f"- **{name}**: {TARGETS[name].parser}; bases {', '.join(TARGETS[name].bases)}." for name in by_target]
    lines += ["", "Faults injected (one input usually carries several):", ""]
    for name, parts in by_target.items():
        counts: collections.Counter = collections.Counter()
        for t in parts:
            counts.update(t.faults)
        lines.append(f"- **{name}**: " + ", ".join(f"{kind} {n}" for kind, n in counts.most_common()))
    lines += ["", "Most frequent rejections (numbers shown as N, quoted values as …):", ""]
    for name, parts in by_target.items():
        counts = collections.Counter()
        for t in parts:
            counts.update(t.reasons)
        lines.append(f"- **{name}**: " + "; ".join(f"“{text}” {n}" for text, n in counts.most_common(4)))
    crash_files = [f for t in tallies for f in t.crash_files]
    if crash_files:
        lines += ["", f"Crash inputs ({len(crash_files)}), replay with `--replay FILE`:", ""]
        lines += [f"- `{f}`" for f in crash_files[:20]]
    lines.append(END)
    text = REPORT.read_text() if REPORT.exists() else f"# Reliability\n\n{START}\n{END}\n"
    before, rest = text.split(START, 1)
    REPORT.write_text(before + "\n".join(lines) + rest.split(END, 1)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs in total, shared by every parser and mode")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--only", help="comma-separated parsers to run (default: all)")
    parser.add_argument("--no-report", action="store_true", help="print the tallies, leave docs/reliability.md alone")
    parser.add_argument("--replay", metavar="FILE", help="run one saved crash input and print what happens")
    args = parser.parse_args()
    if args.replay:
        return replay(args.replay)
    names = args.only.split(",") if args.only else list(TARGETS)
    pairs = [(name, mode) for name in names for mode in MODES]
    shares = sum(TARGETS[name].share for name, _ in pairs)
    crash_dir = tempfile.mkdtemp(prefix="specpair-crashes-")
    scratch = tempfile.mkdtemp(prefix="specpair-fuzz-")
    tasks = []
    for i, (name, mode) in enumerate(pairs):
        per_pair = math.ceil(args.inputs * TARGETS[name].share / shares)
        # Chunks of at most 2000 inputs keep each Hypothesis run small and spread the work over the workers.
        chunks = -(-per_pair // 2000)
        tasks += [
            (name, mode, -(-per_pair // chunks), args.seed * 1_000_003 + i * 101 + k, crash_dir, scratch)
            for k in range(chunks)
        ]
    start = time.perf_counter()
    merged: dict[tuple[str, str], Tally] = {}
    try:
        with multiprocessing.Pool(args.jobs) as pool:
            for tally in pool.imap_unordered(run_task, tasks):
                key = (tally.target, tally.mode)
                merged[key] = merge(merged.get(key), tally)
                done = sum(t.inputs for t in merged.values())
                print(
                    f"{done} inputs, {sum(t.crashes for t in merged.values())} crashes, "
                    f"{time.perf_counter() - start:.0f} s",
                    flush=True,
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - start
    tallies = [merged[pair] for pair in pairs]
    for t in tallies:
        print(json.dumps({k: v for k, v in asdict(t).items() if k not in ("faults", "reasons", "slowest_case")}))
        if t.slowest_case:  # kept for --replay beside any crash inputs
            (Path(crash_dir) / f"slowest-{t.target}-{t.mode}.json").write_text(json.dumps(t.slowest_case))
    if not args.no_report:
        write_report(tallies, args, wall)
    print(f"crash inputs (if any) and the slowest input of each parser and mode in {crash_dir}")
    return 1 if any(t.crashes for t in tallies) else 0


def merge(a: Tally | None, b: Tally) -> Tally:
    if a is None:
        return b
    slow = a if a.slowest_s >= b.slowest_s else b
    return Tally(
        a.target,
        a.mode,
        a.inputs + b.inputs,
        a.accepted + b.accepted,
        a.rejected + b.rejected,
        a.crashes + b.crashes,
        a.seconds + b.seconds,
        slow.slowest_s,
        slow.slowest_case,
        max(a.peak_bytes, b.peak_bytes),
        a.faults + b.faults,
        a.reasons + b.reasons,
        a.crash_files + b.crash_files,
    )


if __name__ == "__main__":
    sys.exit(main())

"""`specpair run TARGET DRAFT`: the gate. The same prompts run undrafted and drafted, greedy and seeded, solo and
concurrent, and every drafted reply must equal the undrafted one token for token (the exact rule makes that
the contract: runtime/speculative.py). Also measured: tau, acceptance per draft position, the draft/verify time
split, tok/s and the speedup; the report carries revisions, file hashes and prompt hashes so it can be rerun.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass, field

from specpair.cli._output import print_json
from specpair.errors import BadInput

# Built-in prompts: two of prose, two of code (the concurrent batch is these four).
BUILTIN_PROMPTS = (
    ("prose", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
    ("prose", "Explain to a ten-year-old why the sky is blue and sunsets are red."),
    ("code", "Write a Python function that returns the n-th Fibonacci number, with a docstring and a unit test."),
    ("code", "Write a C function that reverses a singly linked list in place, and explain each step."),
)
GATE_TEMPERATURES = ((0.0, 0, 1.0, 0), (0.7, 0, 1.0, 1), (1.0, 40, 0.95, 2))  # (temperature, top_k, top_p, seed)
CONCURRENT = 4
SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Cell:
    """One setting of the gate: a sampling and a batch size, all prompts."""

    sampling: object
    batch: int
    block: int
    prompts: list[dict] = field(default_factory=list)
    identical: bool = True
    drafted_tokens: int = 0
    undrafted_tokens: int = 0
    drafted_s: float = 0.0
    undrafted_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    rounds: int = 0
    committed: int = 0
    accepted: list[int] = field(default_factory=list)


def run_gate(
    target_ref: str | None,
    draft_ref: str | None,
    *,
    mtp: bool,
    demo: str | None,
    prompt_text: str | None,
    max_tokens: int,
    sampling_given: tuple | None,
    chat: bool,
    device: str | None,
    gguf_file: str | None,
    draft_gguf_file: str | None,
    block_size: int | None,
    batch: int | None,
    draft_bits: int | None,
    rule: str,
    graphs: bool | None,
    json_output: bool,
    quiet: bool,
) -> int:
    import torch

    from specpair.cli.run import _progress, _revision, _size
    from specpair.compat.pair import Deployment
    from specpair.compat.stacks import STACK_NAMES
    from specpair.compat.verdict import judge
    from specpair.runtime import loading
    from specpair.runtime.drafters.loading import drafter_kind, load_drafter
    from specpair.runtime.speculative import RULES
    from specpair.sources import open_checkpoint
    from specpair.sources.model import open_model

    if rule not in RULES:
        raise BadInput("--rule", f"{rule!r} is not one of {', '.join(RULES)}")
    stages = _Notes(not quiet and not json_output)
    locked = {}
    if demo:
        from specpair.convert.demo import demo_pair, drafter

        if target_ref or draft_ref or mtp:
            raise BadInput("--demo", "runs the built-in SmolLM2 pair: give no TARGET, DRAFT or --mtp with it")
        stages.begin(f"setting up the demo pair (SmolLM2-135M-Instruct, {drafter(demo).describe})")
        target_ref, draft_ref = demo_pair(demo)
        chat = True
    elif target_ref is None:
        raise BadInput("TARGET", "give a target checkpoint (or --demo for the built-in pair)")
    elif target_ref.endswith(".lock") and draft_ref is None:
        from specpair.sources.lockfile import read_lock

        repos = read_lock(target_ref)
        locked = {r.role: r for r in repos}
        target_ref = locked["target"].directory
        draft_ref = locked["draft"].directory if "draft" in locked else None
    if mtp and draft_ref is not None:
        raise BadInput("--mtp", "drafts with the target's own MTP head: give no DRAFT with it")
    if draft_ref is None and not mtp:
        raise BadInput("DRAFT", "give a drafter or draft model, or --mtp for the target's own MTP head")

    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if where.type == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device", "cuda asked, but torch sees no CUDA GPU here")
    target_model = open_model(target_ref, gguf_file)
    draft_model = open_model(draft_ref, draft_gguf_file) if draft_ref is not None else None
    kind = drafter_kind(draft_model)
    tokenizer = target_model.tokenizer()
    named = [("prompt", prompt_text)] if prompt_text is not None else list(BUILTIN_PROMPTS)
    encoded = []
    for name, text in named:
        wrapped = tokenizer.apply_chat_template([{"role": "user", "content": text}]) if chat else text
        ids = tokenizer.encode(wrapped, add_special_tokens=not chat)
        if not ids:
            raise BadInput("--prompt", "the prompt encodes to no tokens")
        encoded.append((name, text, ids))

    # check first: what the specpair stack refuses is not run; its warnings are shown
    target_checkpoint = open_checkpoint(target_ref, gguf_file, True)
    draft_checkpoint = open_checkpoint(draft_ref, draft_gguf_file, True) if draft_ref is not None else None
    context = max(len(ids) for _, _, ids in encoded) + max_tokens
    _, verdicts = judge(target_checkpoint, draft_checkpoint, Deployment(context=context), list(STACK_NAMES))
    verdict = verdicts["specpair"]
    if verdict.status == "fail":
        errors = [f for f in verdict.reasons if f.severity == "error"]
        raise BadInput(
            target_ref,
            f"`specpair check` refuses this pair on the specpair stack: {errors[0].rule}: "
            f"{errors[0].message}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
        )
    warnings = [f"{f.rule}: {f.message}" for f in verdict.reasons if f.severity == "warn"]

    plan = loading.plan_load(target_model, where)
    with _progress(plan.stored_bytes, not quiet and not json_output and sys.stderr.isatty()) as advance:
        stages.begin(f"loading {_size(plan.stored_bytes)} from {target_model.ref} onto {where}")
        target = loading.load(plan, advance)
    stages.begin(
        f"loading the {kind} drafter"
        + (f" from {draft_model.ref}" if draft_model else "")
        + (", quantized to affine-4" if draft_bits == 4 else "")
    )
    drafter = load_drafter(draft_model, target_model, target, draft_bits)
    block = block_size or drafter.block_size
    if drafter.max_positions and context + block > drafter.max_positions:
        warnings.append(
            f"context: {context + block} positions exceed the drafter's max_position_embeddings "
            f"{drafter.max_positions}: acceptance may fall past it, the output does not change"
        )
    for w in warnings:
        if not quiet and not json_output:
            sys.stderr.write(f"warning: {w}\n")

    stops = sorted(set(tokenizer.stop_ids) | set(target_model.config.eos_token_ids))
    settings = [sampling_given] if sampling_given is not None else list(GATE_TEMPERATURES)
    sizes = [batch] if batch else [1, CONCURRENT]
    _warm_up(target, drafter, encoded[0][2], stops, block, rule, graphs)
    cells = []
    for temperature, top_k, top_p, seed in settings:
        from specpair.runtime.sampling import Sampling

        sampling = Sampling(temperature, top_k, top_p, seed)
        for size in sizes:
            stages.begin(f"{_describe(sampling)}, {'solo' if size == 1 else f'{size} concurrent'}")
            cell = _run_cell(target, drafter, encoded, sampling, size, max_tokens, stops, block, rule, graphs)
            cells.append(cell)
            if not quiet and not json_output:
                sys.stderr.write(_cell_line(cell, rule) + "\n")

    compared = [c for c in cells if _compared(c, rule)]
    overall = _totals(cells)
    summary = (
        f"identical {sum(c.identical for c in compared)}/{len(compared)} · τ {overall['tau']:.2f} · "
        f"{overall['speedup']:.2f}× ({overall['tokens_per_s']['drafted']:.1f} vs "
        f"{overall['tokens_per_s']['undrafted']:.1f} tok/s) · {kind} block {block} · "
        f"{target_model.config.family} on {where} · "
        + " ".join(f"{stack} {v.status}" for stack, v in verdicts.items() if stack != "specpair")
    )
    failed = any(not c.identical for c in compared)
    if json_output:
        print_json(
            {
                "schema": "specpair.run/1",
                "target": _describe_model(target_model, locked.get("target"), _revision),
                "draft": {
                    **(
                        _describe_model(draft_model, locked.get("draft"), _revision)
                        if draft_model
                        else {"ref": target_model.ref, "mtp": True}
                    ),
                    "kind": kind,
                    "resident_bytes": drafter.resident_bytes,
                    "bits": draft_bits,
                },
                "device": str(where),
                "dtype": str(plan.dtype).removeprefix("torch."),
                "block_size": block,
                "max_tokens": max_tokens,
                "rule": rule,
                "chat": chat,
                "prompts": [
                    {"name": n, "sha256": hashlib.sha256(t.encode("utf-8")).hexdigest(), "tokens": len(ids)}
                    for n, t, ids in encoded
                ],
                "check": {
                    "status": verdict.status,
                    "warnings": warnings,
                    "stacks": {stack: v.status for stack, v in verdicts.items()},
                },
                "runs": [_cell_json(c, rule) for c in cells],
                "identical": not failed,
                **overall,
                "summary": summary,
            }
        )
    elif not quiet:
        for c in cells:
            for p in c.prompts:
                if p["identical"] is False:
                    d = p["first_difference"]
                    sys.stdout.write(
                        f"DIVERGED {_describe(c.sampling)} batch {c.batch} prompt {p['prompt']}: at token "
                        f"{d['position']} undrafted {d['undrafted']} vs drafted {d['drafted']}\n"
                    )
        sys.stdout.write(summary + "\n")
    return 1 if failed else 0


class _Notes:
    """What the gate is doing, a line on stderr per stage (the cells' results go there too)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def begin(self, what: str) -> None:
        if self.enabled:
            sys.stderr.write(what + " ...\n")
            sys.stderr.flush()


def _warm_up(target, drafter, ids, stops, block, rule, graphs) -> None:
    """A few tokens each way first, so that one-time costs (kernel compilation, allocator) are not timed."""
    from specpair.runtime.generate import generate
    from specpair.runtime.sampling import Sampling
    from specpair.runtime.speculative import speculative_generate

    generate(target, [ids], 2, Sampling(), stops, graphs=graphs)
    speculative_generate(
        target, drafter, [ids], block + 1, Sampling(), stops, block_size=block, rule=rule, graphs=graphs
    )


def _run_cell(target, drafter, encoded, sampling, size, max_tokens, stops, block, rule, graphs) -> Cell:
    from specpair.runtime.generate import generate
    from specpair.runtime.speculative import acceptance_by_position, speculative_generate

    cell = Cell(sampling, size, block)
    groups = [[i] for i in range(len(encoded))] if size == 1 else [[i % len(encoded) for i in range(size)]]
    for group in groups:
        prompts = [encoded[i][2] for i in group]
        undrafted, u_timing = generate(target, prompts, max_tokens, sampling, stops, graphs=graphs)
        drafted, d_timing = speculative_generate(
            target, drafter, prompts, max_tokens, sampling, stops, block_size=block, rule=rule, graphs=graphs
        )
        u_s, d_s = u_timing.prefill_s + u_timing.decode_s, d_timing.prefill_s + d_timing.draft_s + d_timing.verify_s
        cell.undrafted_tokens += u_timing.generated_tokens
        cell.drafted_tokens += d_timing.generated_tokens
        cell.undrafted_s += u_s
        cell.drafted_s += d_s
        cell.draft_s += d_timing.draft_s
        cell.verify_s += d_timing.verify_s
        cell.rounds += sum(len(r.committed) for r in drafted)
        cell.committed += sum(sum(r.committed) for r in drafted)
        for i, u, d in zip(group, undrafted, drafted):
            cell.accepted += d.accepted
            same = u.tokens == d.tokens
            at = next(
                (j for j, (a, b) in enumerate(zip(u.tokens, d.tokens)) if a != b), min(len(u.tokens), len(d.tokens))
            )
            compared = _compared(cell, rule)
            cell.identical &= same or not compared
            cell.prompts.append(
                {
                    "prompt": encoded[i][0],
                    "identical": same if compared else None,
                    "first_difference": None
                    if same or not compared
                    else {
                        "position": at,
                        "undrafted": u.tokens[at] if at < len(u.tokens) else None,
                        "drafted": d.tokens[at] if at < len(d.tokens) else None,
                    },
                    "tokens": len(d.tokens),
                    "tau": d.tau,
                    "acceptance_by_position": acceptance_by_position([d], block - 1),
                    "tokens_per_s": {"drafted": d_timing.tokens_per_s, "undrafted": u_timing.tokens_per_s},
                    "speedup": d_timing.tokens_per_s / u_timing.tokens_per_s if u_timing.tokens_per_s else None,
                }
            )
    return cell


def _compared(cell: Cell, rule: str) -> bool:
    """The exact rule's output is the undrafted run's at every temperature; the rejection rule's only greedy."""
    return rule == "exact" or cell.sampling.greedy


def _rates(c: Cell) -> tuple[float, float]:
    return (
        c.drafted_tokens / c.drafted_s if c.drafted_s else 0.0,
        c.undrafted_tokens / c.undrafted_s if c.undrafted_s else 0.0,
    )


def _totals(cells: list[Cell]) -> dict:
    drafted_tokens, undrafted_tokens = sum(c.drafted_tokens for c in cells), sum(c.undrafted_tokens for c in cells)
    drafted_s, undrafted_s = sum(c.drafted_s for c in cells), sum(c.undrafted_s for c in cells)
    rounds, committed = sum(c.rounds for c in cells), sum(c.committed for c in cells)
    drafted = drafted_tokens / drafted_s if drafted_s else 0.0
    undrafted = undrafted_tokens / undrafted_s if undrafted_s else 0.0
    accepted = [a for c in cells for a in c.accepted]
    block = cells[0].block
    draft_s, verify_s = sum(c.draft_s for c in cells), sum(c.verify_s for c in cells)
    return {
        "tau": committed / rounds if rounds else 0.0,
        "acceptance_by_position": [
            sum(a >= i for a in accepted) / len(accepted) if accepted else 0.0 for i in range(1, block)
        ],
        "tokens_per_s": {"drafted": drafted, "undrafted": undrafted},
        "speedup": drafted / undrafted if undrafted else 0.0,
        "seconds": {"draft": draft_s, "verify": verify_s, "drafted": drafted_s, "undrafted": undrafted_s},
    }


def _cell_json(c: Cell, rule: str) -> dict:
    totals = _totals([c])
    return {
        "sampling": {
            "temperature": c.sampling.temperature,
            "top_k": c.sampling.top_k,
            "top_p": c.sampling.top_p,
            "seed": c.sampling.seed,
        },
        "batch": c.batch,
        "identical": c.identical if _compared(c, rule) else None,
        "prompts": c.prompts,
        **totals,
    }


def _cell_line(c: Cell, rule: str) -> str:
    t = _totals([c])
    same = ("identical" if c.identical else "DIVERGED") if _compared(c, rule) else "not compared (rejection rule)"
    accept = " ".join(f"{a:.2f}" for a in t["acceptance_by_position"])
    spent = t["seconds"]["draft"] + t["seconds"]["verify"]
    split = (
        f"draft {100 * t['seconds']['draft'] / spent:.0f}% / verify {100 * t['seconds']['verify'] / spent:.0f}%"
        if spent
        else ""
    )
    return (
        f"  {same} · τ {t['tau']:.2f} · accepted by position {accept} · {t['tokens_per_s']['drafted']:.1f} vs "
        f"{t['tokens_per_s']['undrafted']:.1f} tok/s ({t['speedup']:.2f}×) · {split}"
    )


def _describe(sampling) -> str:
    if sampling.greedy:
        return "greedy"
    extra = (f" top-k {sampling.top_k}" if sampling.top_k else "") + (
        f" top-p {sampling.top_p}" if sampling.top_p < 1 else ""
    )
    return f"temperature {sampling.temperature}{extra} seed {sampling.seed}"


def _describe_model(model, locked, revision) -> dict:
    return {
        "ref": model.ref,
        "revision": locked.commit if locked else revision(model),
        "family": model.config.family,
        "files": file_hashes(model, locked),
    }


def file_hashes(model, locked=None) -> dict[str, str]:
    """sha256 of each file of the checkpoint: from its specpair.lock, from the HF cache's blob names (an LFS
    file's blob is named by its sha256), else hashed here."""
    from specpair.sources.lockfile import hash_file

    if locked is not None:
        return {f.path: f.sha256 for f in locked.files}
    out = {}
    for name in model.files:
        path = os.path.join(model.root, name)
        blob = os.path.basename(os.path.realpath(path))
        if os.path.islink(path) and SHA256.match(blob):
            out[name] = blob
            continue
        digest = hashlib.sha256()
        hash_file(path, [digest])
        out[name] = digest.hexdigest()
    return out

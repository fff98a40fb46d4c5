"""`specpair run TARGET DRAFT`: the gate. The same prompts run undrafted and drafted, greedy and seeded, solo and
concurrent, and every drafted reply must equal the undrafted one token for token (the exact rule makes that the
contract: runtime/speculative.py). Also measured: tau, acceptance per draft position, the draft/verify time split,
tok/s and the speedup; the report carries revisions, file hashes and prompt hashes so it can be rerun.

A setting that compared fewer than MIN_COMPARED generated tokens proves nothing (an instruct target given raw text
can stop at once): the gate then says inconclusive and why, never identical, and exits INCONCLUSIVE_EXIT.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specpair.app.device import place_runtime
from specpair.app.generation import SCHEMA, SamplingArgs
from specpair.app.models import LoadedTarget, describe, load_target
from specpair.app.pair import GatePair, gate_pair, metadata, opened
from specpair.app.progress import SILENT, Progress
from specpair.app.prompts import BUILTIN_PROMPTS, Prompt, chat_by_default, encode_prompt, prompt_text
from specpair.app.timing import Spread, in_turn
from specpair.errors import INCONCLUSIVE_EXIT, BadInput

if TYPE_CHECKING:
    import torch

    from specpair.compat.verdict import Verdict
    from specpair.runtime.sampling import Sampling
    from specpair.sources.model import Model

GATE_TEMPERATURES = ((0.0, 0, 1.0, 0), (0.7, 0, 1.0, 1), (1.0, 40, 0.95, 2))  # (temperature, top_k, top_p, seed)
CONCURRENT = 4
GATE_MAX_TOKENS = 64  # per prompt and setting, unless --max-tokens says otherwise
CONTEXT = (12, 6)  # tokens shown before and from a first difference
MIN_COMPARED = 16  # generated tokens a compared setting needs (each prompt once) before its verdict means anything
# greedy rounds that keep almost no draft: τ below NO_AGREEMENT_TAU over at least NO_AGREEMENT_ROUNDS is a warning
NO_AGREEMENT_TAU = 1.1
NO_AGREEMENT_ROUNDS = 20


@dataclass
class GatePrompt:
    name: str  # "prose", "code", "prompt" for --prompt, a --prompts record's category or "line N"
    text: str  # the prompt, or a chat's JSON
    ids: list[int]


@dataclass
class Cell:
    """One setting of the gate: a sampling and a batch size, all prompts."""

    sampling: Sampling
    batch: int
    block: int
    prompts: list[dict] = field(default_factory=list)  # per prompt run, as the JSON report holds it
    indices: list[int] = field(default_factory=list)  # which of the gate's prompts each prompt run is
    outputs: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (undrafted, drafted) per prompt run
    identical: bool = True
    drafted_tokens: int = 0
    undrafted_tokens: int = 0
    drafted_s: float = 0.0
    undrafted_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    undrafted_decode_s: float = 0.0  # after the prefill stage, which yields the undrafted run's first token
    undrafted_decode_tokens: int = 0
    accepted: list[int] = field(default_factory=list)  # drafts kept in each measured round (Drafted.measured)
    requests: list[list[int]] = field(default_factory=list)  # the same, per prompt run
    # per prompt run, repeats of one measurement (app/timing.py): undrafted decode tok/s, drafted rounds per second
    decode_rates: list[float | None] = field(default_factory=list)
    round_rates: list[float | None] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{describe_sampling(self.sampling)}, {'solo' if self.batch == 1 else f'{self.batch} concurrent'}"

    def replies(self) -> dict[int, list[int]]:
        """The undrafted reply to each of the gate's prompts this setting ran (a concurrent batch repeats some)."""
        first: dict[int, list[int]] = {}
        for i, (undrafted, _) in zip(self.indices, self.outputs):
            first.setdefault(i, undrafted)
        return first

    @property
    def compared_tokens(self) -> int:
        """Generated tokens compared, each prompt counted once."""
        return sum(len(r) for r in self.replies().values())


@dataclass
class Divergence:
    """Where a drafted reply first left the undrafted one, with the text around it both ways."""

    setting: str
    batch: int
    prompt: str
    position: int
    undrafted: int | None  # the token there, None past the reply's end
    drafted: int | None
    before: str  # the text both replies share just before the position
    undrafted_after: str
    drafted_after: str


@dataclass
class GateReport:
    target: Model
    draft: Model | None  # None: the target's MTP head
    pair: GatePair
    kind: str
    device: torch.device
    dtype: str
    block: int
    max_tokens: int
    rule: str
    chat: bool
    chat_kwargs: dict[str, Any]  # the chat template's variables (--chat-template-kwargs)
    prompts: list[GatePrompt]
    verdicts: dict[str, Verdict]
    warnings: list[str]
    cells: list[Cell]
    acceptance_warning: str | None  # no_agreement's
    drafter_bytes: int
    draft_bits: int | None
    tokenizer: Any
    stops: list[int]

    @property
    def block_label(self) -> str:
        """The blocks as the summary says them: "block 4", or each batch's where they differ ("block 4 solo, 2 at 4
        concurrent")."""
        blocks = {c.batch: c.block for c in self.cells}
        if len(set(blocks.values())) == 1:
            return f"block {self.block}"
        return "block " + ", ".join(f"{b} {'solo' if n == 1 else f'at {n} concurrent'}" for n, b in blocks.items())

    @property
    def compared(self) -> list[Cell]:
        return [c for c in self.cells if compared(c, self.rule)]

    def reason(self, cell: Cell) -> str | None:
        return inconclusive(cell, self.stops, self.max_tokens, self.chat) if compared(cell, self.rule) else None

    @property
    def inconclusive(self) -> list[str]:
        """Why each compared setting that held too few tokens proves nothing, by label."""
        return [f"{c.label}: {why}" for c in self.compared if (why := self.reason(c))]

    @property
    def identical(self) -> bool | None:
        """False when a drafted reply differed; else None when a setting was inconclusive; else True."""
        if not all(c.identical for c in self.compared):
            return False
        return None if self.inconclusive else True

    @property
    def outcome(self) -> str:
        return {True: "identical", False: "diverged", None: "inconclusive"}[self.identical]

    @property
    def exit_code(self) -> int:
        return {True: 0, False: 1, None: INCONCLUSIVE_EXIT}[self.identical]

    @property
    def timing(self) -> Spread:
        """How far the prompt runs of each batch size, repeats of one decode step and one drafted round, disagree."""
        batches = sorted({c.batch for c in self.cells})
        return Spread.across(
            [
                (
                    [r for c in self.cells if c.batch == b for r in c.decode_rates],
                    [r for c in self.cells if c.batch == b for r in c.round_rates],
                )
                for b in batches
            ]
        )

    @property
    def summary(self) -> str:
        overall = totals(self.cells)
        reasons = self.inconclusive
        more = len(reasons) - 1
        verdict = (
            f"inconclusive ({reasons[0]}" + (f"; {more} more setting{'s' if more > 1 else ''}" if more else "") + ")"
            if self.identical is None
            else f"identical {sum(c.identical for c in self.compared)}/{len(self.compared)}"
        )
        speed = (
            f"{overall['speedup']:.2f}× ({overall['tokens_per_s']['drafted']:.1f} vs "
            f"{overall['tokens_per_s']['undrafted']:.1f} tok/s"
            + (f"; after the prefill {overall['decode_speedup']:.2f}×)" if overall["decode_speedup"] else ")")
        )
        timing = self.timing
        return (
            f"{verdict} · τ {overall['tau']:.2f} · "
            + (speed if timing.reliable else f"{timing.warning()}: {speed}")
            + f" · {self.kind} {self.block_label} · {self.target.config.family} on {self.device} · "
            + " ".join(f"{stack} {v.status}" for stack, v in self.verdicts.items() if stack != "specpair")
        )

    def described(self, role: str) -> dict[str, Any]:
        """ref, revision, family and file hashes of the target or the draft (the target's, for its MTP head)."""
        model = self.target if role == "target" else self.draft
        if model is None:
            return {"ref": self.target.ref, "mtp": True}
        return describe(model, self.pair.locked.get(role))

    def text(self, tokens: list[int]) -> str:
        """A reply as text, a final stop token not shown."""
        return self.tokenizer.decode(tokens[:-1] if tokens and tokens[-1] in self.stops else tokens)

    def divergences(self) -> list[Divergence]:
        found = []
        for c in self.cells:
            for p, (u, d) in zip(c.prompts, c.outputs):
                if p["identical"] is False:
                    at = p["first_difference"]["position"]
                    before, after = CONTEXT
                    found.append(
                        Divergence(
                            describe_sampling(c.sampling),
                            c.batch,
                            p["prompt"],
                            at,
                            p["first_difference"]["undrafted"],
                            p["first_difference"]["drafted"],
                            self.tokenizer.decode(u[max(0, at - before) : at]),
                            self.tokenizer.decode(u[at : at + after]),
                            self.tokenizer.decode(d[at : at + after]),
                        )
                    )
        return found

    def profile(self) -> dict[str, Any]:
        """The acceptance measured, every setting's prompt runs together, as ModelOpt's speculation profile."""
        from specpair import __version__
        from specpair.app.profile import speculation_profile

        return speculation_profile(
            [(self.prompts[i].name, accepted) for c in self.cells for i, accepted in zip(c.indices, c.requests)],
            self.block - 1,
            kind=self.kind,
            draft={k: v for k, v in self.described("draft").items() if k in ("ref", "revision", "mtp")},
            target={k: v for k, v in self.described("target").items() if k in ("ref", "revision", "family")},
            block_size=self.block,
            conditions={
                "engine": f"specpair {__version__}",
                "command": "specpair run",
                "device": str(self.device),
                "dtype": self.dtype,
                "rule": self.rule,
                "chat": self.chat,
                "chat_template_kwargs": self.chat_kwargs,
                "max_tokens": self.max_tokens,
                "settings": [{**sampling_json(c.sampling), "batch": c.batch} for c in self.cells],
                "prompts": len(self.prompts),
            },
        )

    def to_json(self) -> dict[str, Any]:
        verdict = self.verdicts["specpair"]
        return {
            "schema": SCHEMA,
            "target": self.described("target"),
            "draft": {
                **self.described("draft"),
                "kind": self.kind,
                "resident_bytes": self.drafter_bytes,
                "bits": self.draft_bits,
            },
            "device": str(self.device),
            "dtype": self.dtype,
            "block_size": self.block,
            "max_tokens": self.max_tokens,
            "rule": self.rule,
            "chat": self.chat,
            "chat_template_kwargs": self.chat_kwargs,
            "prompts": [
                {"name": p.name, "sha256": hashlib.sha256(p.text.encode("utf-8")).hexdigest(), "tokens": len(p.ids)}
                for p in self.prompts
            ],
            "check": {
                "status": verdict.status,
                "warnings": self.warnings,
                "stacks": {stack: v.status for stack, v in self.verdicts.items()},
            },
            "runs": [cell_json(c, self.rule, self.reason(c)) for c in self.cells],
            "outcome": self.outcome,
            "identical": self.identical,
            "inconclusive": self.inconclusive,
            "acceptance_warning": self.acceptance_warning,
            **totals(self.cells),
            "timing": self.timing.to_json(),
            "summary": self.summary,
        }


def tile_block(dtype: torch.dtype, sequences: int, most: int) -> int:
    """The block that fills one CPU product tile of `dtype` (cpu_rows.PRODUCTS) with the verify rows of `sequences`,
    at least 2 and at most `most`: their verify step is then one weight pass, as their decode step is."""
    from specpair.runtime.kernels.cpu_rows import PRODUCTS

    return max(2, min(most, PRODUCTS[dtype].generated // sequences))


def run_gate(
    target: str | Model | None,
    draft: str | Model | None,
    *,
    mtp: bool = False,
    demo: bool = False,
    prompt: str | None = None,
    prompts: list[tuple[str, Prompt]] | None = None,
    max_tokens: int = GATE_MAX_TOKENS,
    sampling: SamplingArgs | None = None,
    chat: bool | None = None,
    chat_kwargs: dict[str, Any] | None = None,
    device: str | None = None,
    threads: int | None = None,
    dtype: str | None = None,
    gguf_file: str | None = None,
    draft_gguf_file: str | None = None,
    block_size: int | None = None,
    batch: int | None = None,
    draft_bits: int | None = None,
    rule: str = "exact",
    graphs: bool | None = None,
    progress: Progress = SILENT,
    loaded: LoadedTarget | None = None,
) -> GateReport:
    """The gate on the pair the arguments name (`pair.gate_pair`): `prompt`, `prompts` (name, text or chat) or the
    built-in ones, through the target's chat template (rendered with `chat_kwargs`) unless `chat` is False (None:
    when it has one), `sampling` or the gate's three settings, `batch` or solo and CONCURRENT at once. `target` and `draft`: refs, or checkpoints
    opened already (sources/model.open_files: files from any source); `loaded`: the target loaded already
    (models.load_target)."""
    from specpair.runtime import loading
    from specpair.runtime.drafters.loading import drafter_kind, load_drafter
    from specpair.runtime.speculative import RULES

    if rule not in RULES:
        raise BadInput("--rule", f"{rule!r} is not one of {', '.join(RULES)}")
    pair = gate_pair(target, draft, mtp=mtp, demo=demo, progress=progress)
    placed = place_runtime(device, threads, dtype)
    where, parallel = placed.device, placed.parallel
    sizes = [batch] if batch else [1, CONCURRENT]
    tiled = block_size is None and where.type == "cpu" and pair.tile_block
    chosen = {size: tile_block(placed.dtype, size, pair.tile_block) if tiled else block_size for size in sizes}
    target_model = opened(pair.target, gguf_file)
    draft_model = opened(pair.draft, draft_gguf_file) if pair.draft is not None else None
    kind = drafter_kind(draft_model)
    tokenizer = target_model.tokenizer()
    chat = chat_by_default(tokenizer, chat)
    named = [("prompt", prompt)] if prompt is not None else prompts or list(BUILTIN_PROMPTS)
    gate_prompts = [
        GatePrompt(name, prompt_text(text), encode_prompt(tokenizer, text, chat, name, chat_kwargs))
        for name, text in named
    ]
    context = max(len(p.ids) for p in gate_prompts) + max_tokens
    verdicts, warnings = judged(pair, gguf_file, draft_gguf_file, context)

    plan = loading.plan_load(target_model, where, placed.dtype, parallel=parallel)
    target_run = load_target(plan, progress, context, loaded).runtime
    progress.stage(
        f"loading the {kind} drafter"
        + (f" from {draft_model.ref}" if draft_model else "")
        + (", quantized to affine-4" if draft_bits == 4 else "")
    )
    drafter = load_drafter(draft_model, target_model, target_run, draft_bits)
    blocks = {size: block or drafter.block_size for size, block in chosen.items()}
    block = max(blocks.values())
    if drafter.max_positions and context + block > drafter.max_positions:
        warnings.append(
            f"context: {context + block} positions exceed the drafter's max_position_embeddings "
            f"{drafter.max_positions}: acceptance may fall past it, the output does not change"
        )
    for w in warnings:
        progress.warn(w)

    stops = sorted(set(tokenizer.stop_ids) | set(target_model.config.eos_token_ids))
    runner = CellRunner(target_run, drafter, gate_prompts, max_tokens, stops, blocks, rule, graphs)
    runner.warm_up()
    cells = []
    for setting in [sampling] if sampling is not None else list(GATE_TEMPERATURES):
        for size in sizes:
            cell = runner.run(setting, size, progress)
            cells.append(cell)
            why = inconclusive(cell, stops, max_tokens, chat) if compared(cell, rule) else None
            progress.note(cell_line(cell, rule, why))
    disagreement = no_agreement(cells, target_model.ref)
    if disagreement is not None:
        progress.warn(disagreement)
    return GateReport(
        target_model,
        draft_model,
        pair,
        kind,
        where,
        str(plan.dtype).removeprefix("torch."),
        block,
        max_tokens,
        rule,
        chat,
        chat_kwargs or {},
        gate_prompts,
        verdicts,
        warnings,
        cells,
        disagreement,
        drafter.resident_bytes,
        draft_bits,
        tokenizer,
        stops,
    )


def judged(
    pair: GatePair, gguf_file: str | None, draft_gguf_file: str | None, context: int
) -> tuple[dict[str, Verdict], list[str]]:
    """`specpair check` first: what it refuses on the specpair stack is not run; its warnings are shown."""
    from specpair.compat.pair import Deployment
    from specpair.compat.stacks import STACK_NAMES
    from specpair.compat.verdict import judge

    target_checkpoint = metadata(pair.target, gguf_file)
    draft_checkpoint = metadata(pair.draft, draft_gguf_file) if pair.draft is not None else None
    _, verdicts = judge(target_checkpoint, draft_checkpoint, Deployment(context=context), list(STACK_NAMES))
    verdict = verdicts["specpair"]
    if verdict.status == "fail":
        errors = [f for f in verdict.reasons if f.severity == "error"]
        raise BadInput(
            target_checkpoint.ref,
            f"`specpair check` refuses this pair on the specpair stack: {errors[0].rule}: "
            f"{errors[0].message}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
        )
    return verdicts, [f"{f.rule}: {f.message}" for f in verdict.reasons if f.severity == "warn"]


class CellRunner:
    """Runs the gate's settings on one loaded pair, a setting of N sequences at a time verifying blocks[N] tokens a
    round."""

    def __init__(self, target, drafter, prompts, max_tokens, stops, blocks: dict[int, int], rule, graphs) -> None:
        self.target, self.drafter, self.prompts, self.max_tokens = target, drafter, prompts, max_tokens
        self.stops, self.blocks, self.rule, self.graphs = stops, blocks, rule, graphs
        self.turn = 0  # undrafted first on even turns, drafted first on odd ones

    def warm_up(self) -> None:
        """A few tokens each way first, so that one-time costs (kernel compilation, allocator) are not timed."""
        from specpair.runtime.generate import generate
        from specpair.runtime.sampling import Sampling
        from specpair.runtime.speculative import speculative_generate

        ids = self.prompts[0].ids
        generate(self.target, [ids], 2, Sampling(), self.stops, graphs=self.graphs)
        for block in sorted(set(self.blocks.values())):
            speculative_generate(
                self.target,
                self.drafter,
                [ids],
                block + 1,
                Sampling(),
                self.stops,
                block_size=block,
                rule=self.rule,
                graphs=self.graphs,
            )

    def run(self, setting: SamplingArgs, size: int, progress: Progress) -> Cell:
        from specpair.runtime.sampling import Sampling

        cell = Cell(Sampling(*setting), size, self.blocks[size])
        progress.stage(cell.label)
        count = len(self.prompts)
        # a batch of `size` prompts at a time; fewer prompts than that are repeated to fill one
        groups = (
            [[i % count for i in range(size)]]
            if count < size
            else [list(range(at, min(at + size, count))) for at in range(0, count, size)]
        )
        with progress.meter(cell.label, count, unit="prompts", tenths=count > CONCURRENT) as advance:
            for group in groups:
                self.run_group(cell, group)
                advance(len(set(group)))
        return cell

    def run_group(self, cell: Cell, group: list[int]) -> None:
        from specpair.runtime.generate import generate
        from specpair.runtime.speculative import accepted_by_position, speculative_generate

        prompts = [self.prompts[i].ids for i in group]
        (undrafted, u_timing), (drafted, d_timing) = in_turn(
            lambda: generate(self.target, prompts, self.max_tokens, cell.sampling, self.stops, graphs=self.graphs),
            lambda: speculative_generate(
                self.target,
                self.drafter,
                prompts,
                self.max_tokens,
                cell.sampling,
                self.stops,
                block_size=cell.block,
                rule=self.rule,
                graphs=self.graphs,
            ),
            self.turn,
        )
        self.turn += 1
        group_rounds = sum(len(r.committed) for r in drafted)
        cell.decode_rates.append(u_timing.decode_tokens_per_s)
        cell.round_rates.append(group_rounds / (d_timing.draft_s + d_timing.verify_s) if group_rounds else None)
        u_s, d_s = u_timing.prefill_s + u_timing.decode_s, d_timing.prefill_s + d_timing.draft_s + d_timing.verify_s
        cell.undrafted_tokens += u_timing.generated_tokens
        cell.drafted_tokens += d_timing.generated_tokens
        cell.undrafted_s += u_s
        cell.drafted_s += d_s
        cell.draft_s += d_timing.draft_s
        cell.verify_s += d_timing.verify_s
        cell.undrafted_decode_s += u_timing.decode_s
        cell.undrafted_decode_tokens += u_timing.generated_tokens - u_timing.sequences
        checked = compared(cell, self.rule)
        for i, u, d in zip(group, undrafted, drafted):
            cell.accepted += d.measured
            cell.requests.append(d.measured)
            same = u.tokens == d.tokens
            at = next(
                (j for j, (a, b) in enumerate(zip(u.tokens, d.tokens)) if a != b), min(len(u.tokens), len(d.tokens))
            )
            cell.identical &= same or not checked
            cell.indices.append(i)
            cell.outputs.append((u.tokens, d.tokens))
            cell.prompts.append(
                {
                    "prompt": self.prompts[i].name,
                    "identical": same if checked else None,
                    "first_difference": None
                    if same or not checked
                    else {
                        "position": at,
                        "undrafted": u.tokens[at] if at < len(u.tokens) else None,
                        "drafted": d.tokens[at] if at < len(d.tokens) else None,
                    },
                    "tokens": len(d.tokens),
                    "tau": d.tau,
                    "acceptance_by_position": accepted_by_position(d.measured, cell.block - 1),
                    "tokens_per_s": {"drafted": d_timing.tokens_per_s, "undrafted": u_timing.tokens_per_s},
                    "speedup": d_timing.tokens_per_s / u_timing.tokens_per_s if u_timing.tokens_per_s else None,
                }
            )


def compared(cell: Cell, rule: str) -> bool:
    """The exact rule's output is the undrafted run's at every temperature; the rejection rule's only greedy."""
    return rule == "exact" or cell.sampling.greedy


def inconclusive(cell: Cell, stops: list[int], max_tokens: int, chat: bool) -> str | None:
    """Why a compared setting proves nothing (fewer than MIN_COMPARED generated tokens, each prompt once), or
    None."""
    count = cell.compared_tokens
    if count >= MIN_COMPARED:
        return None
    replies = list(cell.replies().values())
    if all(r and r[-1] in stops for r in replies):
        lengths = ", ".join(str(len(r)) for r in replies)
        why = f"the target stopped after {lengths} token{'' if lengths == '1' else 's'}" + (
            "; the prompts ran without a chat template" if not chat else ""
        )
    else:
        why = f"--max-tokens {max_tokens}"
    return f"{count} generated token{'' if count == 1 else 's'} compared, fewer than {MIN_COMPARED} ({why})"


def no_agreement(cells: list[Cell], target: str) -> str | None:
    """A warning where the greedy settings' rounds keep almost no draft: the output is exact either way, so the
    gate's verdict cannot show a drafter that never agrees, which field reports trace to a drafter made for another
    target, a chat template in the other thinking mode than its training data's, or a wiring fault."""
    greedy = [c for c in cells if c.sampling.greedy]
    rounds = sum(len(c.accepted) for c in greedy)
    if rounds < NO_AGREEMENT_ROUNDS:
        return None
    tau = totals(greedy)["tau"]
    if tau >= NO_AGREEMENT_TAU:
        return None
    return (
        f"acceptance: greedy τ {tau:.2f} over {rounds} rounds: the drafter almost never agrees with {target}. "
        "Field reports trace this to a drafter made for another target, a chat template in the other thinking mode "
        "than its training data's (z-lab/dflash#60), or a wiring fault: the block's first slot, the lm_head, the taps "
        "or the mask token (hipfire#483, vllm-ascend#11374). The output is exact either way"
    )


def totals(cells: list[Cell]) -> dict[str, Any]:
    """tau and acceptance by position over the same rounds (Drafted.measured): tau = 1 + their sum (positions up to
    the largest block of `cells`; a round of a smaller block kept none past its own). Speed end to
    end (the prefill in both runs' seconds, as gpt-fast counts it) and after the prefill (time per output token:
    the undrafted run's tokens after its first over its decode steps, the drafted run's over its rounds, whose
    first verify also takes the prompt's last token, which the undrafted prefill takes)."""
    from specpair.runtime.speculative import accepted_by_position, mean_accept_length

    drafted_tokens, undrafted_tokens = sum(c.drafted_tokens for c in cells), sum(c.undrafted_tokens for c in cells)
    drafted_s, undrafted_s = sum(c.drafted_s for c in cells), sum(c.undrafted_s for c in cells)
    drafted = drafted_tokens / drafted_s if drafted_s else 0.0
    undrafted = undrafted_tokens / undrafted_s if undrafted_s else 0.0
    accepted = [a for c in cells for a in c.accepted]
    block = max(c.block for c in cells)
    draft_s, verify_s = sum(c.draft_s for c in cells), sum(c.verify_s for c in cells)
    decode_s = sum(c.undrafted_decode_s for c in cells)
    decode_drafted = drafted_tokens / (draft_s + verify_s) if draft_s + verify_s else 0.0
    decode_undrafted = sum(c.undrafted_decode_tokens for c in cells) / decode_s if decode_s else 0.0
    return {
        "tau": mean_accept_length(accepted),
        "acceptance_by_position": accepted_by_position(accepted, block - 1),
        "tokens_per_s": {"drafted": drafted, "undrafted": undrafted},
        "speedup": drafted / undrafted if undrafted else 0.0,
        "decode_tokens_per_s": {"drafted": decode_drafted, "undrafted": decode_undrafted},
        "decode_speedup": decode_drafted / decode_undrafted if decode_undrafted else None,
        "seconds": {"draft": draft_s, "verify": verify_s, "drafted": drafted_s, "undrafted": undrafted_s},
    }


def sampling_json(sampling: Sampling) -> dict[str, Any]:
    return {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
    }


def cell_json(c: Cell, rule: str, reason: str | None) -> dict[str, Any]:
    return {
        "sampling": sampling_json(c.sampling),
        "batch": c.batch,
        "block_size": c.block,
        "identical": (c.identical and (None if reason else True)) if compared(c, rule) else None,
        "compared_tokens": c.compared_tokens,
        "inconclusive": reason,
        "prompts": c.prompts,
        **totals([c]),
    }


def cell_line(c: Cell, rule: str, reason: str | None) -> str:
    """One setting's outcome as a progress line."""
    t = totals([c])
    same = (
        ("DIVERGED" if not c.identical else f"inconclusive: {reason}" if reason else "identical")
        if compared(c, rule)
        else "not compared (rejection rule)"
    )
    accept = " ".join(f"{a:.2f}" for a in t["acceptance_by_position"])
    spent = t["seconds"]["draft"] + t["seconds"]["verify"]
    split = (
        f"draft {100 * t['seconds']['draft'] / spent:.0f}% / verify {100 * t['seconds']['verify'] / spent:.0f}%"
        if spent
        else ""
    )
    speed = f"{t['tokens_per_s']['drafted']:.1f} vs {t['tokens_per_s']['undrafted']:.1f} tok/s ({t['speedup']:.2f}×)"
    warning = Spread.of(c.decode_rates, c.round_rates).warning()
    return f"  {same} · τ {t['tau']:.2f} · accepted by position {accept} · " + (
        f"{speed} · {split}" if not warning else f"{warning}: {speed} · {split}"
    )


def describe_sampling(sampling: Sampling) -> str:
    if sampling.greedy:
        return "greedy"
    extra = (f" top-k {sampling.top_k}" if sampling.top_k else "") + (
        f" top-p {sampling.top_p}" if sampling.top_p < 1 else ""
    )
    return f"temperature {sampling.temperature}{extra} seed {sampling.seed}"

"""`specpair bench TARGET [DRAFT]`: decode speed as users post it, on specpair's own runtime: tok/s by number of users
and by context depth, undrafted and drafted, with τ, each row against the weights roofline of the GPU; every
drafted run compared token for token with the undrafted one. The users rows run the built-in prompts, or the user's
(`prompts`: every one, N at a time), through the target's chat template when it has one; their acceptance is what
`profile` writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specpair.app.device import place_runtime
from specpair.app.gate import MIN_COMPARED
from specpair.app.models import LoadedTarget, dtype_name, load_target
from specpair.app.pair import opened
from specpair.app.progress import SILENT, Progress
from specpair.app.prompts import BUILTIN_PROMPTS, Prompt, chat_by_default, encode_prompt
from specpair.app.timing import Spread, alternate
from specpair.errors import INCONCLUSIVE_EXIT, BadInput

if TYPE_CHECKING:
    import torch

    from specpair.runtime.drafters import Drafter
    from specpair.runtime.loading import LoadPlan
    from specpair.runtime.model import Transformer
    from specpair.sources.model import Model

SCHEMA = "specpair.bench/1"
FIT_BLOCK = 16  # verify positions counted in the memory check when the drafter's block is not known yet
REPEATS = 3  # runs behind each figure, undrafted and drafted in turn: the median reported, the spread judged


@dataclass
class BenchReport:
    command: str
    gpu: str | None  # the CUDA device's name
    device: torch.device
    dtype: str
    graphs: bool
    versions: dict[str, str | None]
    bytes_per_s: float | None  # the memory bandwidth the roofline uses
    bandwidth_source: str | None  # "--bandwidth", or the GPU table's row
    target: dict[str, Any]  # ref, family, resident_bytes
    draft: dict[str, Any] | None  # ref, kind, resident_bytes, block_size
    tokens: int
    chat: bool
    chat_kwargs: dict[str, Any]  # the chat template's variables (--chat-template-kwargs)
    prompts: list[str]  # the names of the users rows' prompts
    users: list[dict[str, Any]]  # a row per users count, as the JSON report holds it
    depth: list[dict[str, Any]]  # a row per depth
    requests: list[tuple[str, list[int]]]  # the users rows' sequences: prompt name, drafts kept per measured round
    at_tau: float | None = None  # the τ each drafted row's steps are also priced at (drafted.at_tau)
    plot: str | None = None  # the PNG of the depth sweep, once written

    @property
    def inconclusive(self) -> list[str]:
        """Why each drafted row that compared fewer than MIN_COMPARED generated tokens proves nothing."""
        return [
            f"{key} {r[key]}: {r['drafted']['inconclusive']}"
            for key in ("users", "depth")
            for r in getattr(self, key)
            if r["drafted"] and r["drafted"]["inconclusive"]
        ]

    @property
    def identical(self) -> bool | None:
        """Every drafted run equal to its undrafted run; None without a drafter, or when a row was inconclusive."""
        if self.draft is None or any(r["drafted"]["identical"] is False for r in self.users + self.depth):
            return None if self.draft is None else False
        return None if self.inconclusive else True

    @property
    def exit_code(self) -> int:
        if self.identical is False:
            return 1
        return INCONCLUSIVE_EXIT if self.inconclusive else 0

    def profile(self) -> dict[str, Any]:
        """The users rows' acceptance (greedy, every users count) as ModelOpt's speculation profile."""
        from specpair.app.profile import speculation_profile

        return speculation_profile(
            self.requests,
            self.draft["block_size"] - 1,
            kind=self.draft["kind"],
            draft={"ref": self.draft["ref"]} if self.draft["ref"] else {"ref": self.target["ref"], "mtp": True},
            target={"ref": self.target["ref"], "family": self.target["family"]},
            block_size=self.draft["block_size"],
            conditions={
                "engine": f"specpair {self.versions['specpair']}",
                "command": self.command,
                "device": str(self.device),
                "gpu": self.gpu,
                "dtype": self.dtype,
                "rule": "exact",
                "chat": self.chat,
                "chat_template_kwargs": self.chat_kwargs,
                "max_tokens": self.tokens,
                "stop_ids": "ignored",
                "settings": [
                    {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "batch": r["users"]} for r in self.users
                ],
                "prompts": len(self.prompts),
            },
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": self.command,
            "gpu": self.gpu,
            "device": str(self.device),
            "dtype": self.dtype,
            "graphs": self.graphs,
            "versions": self.versions,
            "bandwidth": {"bytes_per_s": self.bytes_per_s, "source": self.bandwidth_source},
            "target": self.target,
            "draft": self.draft,
            "tokens": self.tokens,
            "chat": self.chat,
            "chat_template_kwargs": self.chat_kwargs,
            "prompts": self.prompts,
            "users": self.users,
            "depth": self.depth,
            "at_tau": self.at_tau,
            "identical": self.identical,
            "inconclusive": self.inconclusive,
            "plot": self.plot,
        }


def run_bench(
    target: str | Model,
    draft: str | Model | None = None,
    *,
    command: str,
    mtp: bool = False,
    depths: list[int],
    user_counts: list[int],
    tokens: int,
    prompts: list[tuple[str, Prompt]] | None = None,
    chat: bool | None = None,
    chat_kwargs: dict[str, Any] | None = None,
    block_size: int | None = None,
    device: str | None = None,
    threads: int | None = None,
    dtype: str | None = None,
    gguf_file: str | None = None,
    draft_gguf_file: str | None = None,
    draft_bits: int | None = None,
    graphs: bool | None = None,
    bandwidth: float | None = None,
    at_tau: float | None = None,
    progress: Progress = SILENT,
    loaded: LoadedTarget | None = None,
) -> BenchReport:
    """Decode tok/s of `target` (and drafted with `draft` or its MTP head) for each users count and depth, greedy,
    `tokens` per sequence; the users rows on `prompts` (name, text or chat; default the built-in ones), through
    the chat template (rendered with `chat_kwargs`) unless `chat` is False (None: when the target has one);
    `bandwidth` in GB/s, else the GPU table's figure for this GPU; `at_tau`: also price each drafted row's steps at
    this τ (what a drafter accepting that many tokens a round would run at: random weights accept 1). `command` is
    the command line the report names. `target` and `draft`: refs, or checkpoints opened already
    (sources/model.open_files: files from any source); `loaded`: the target loaded already (models.load_target)."""
    import torch

    from specpair.compat.memory import gpu_named
    from specpair.runtime import loading
    from specpair.runtime.drafters.loading import drafter_kind, load_drafter

    if mtp and draft is not None:
        raise BadInput("--mtp", "drafts with the target's own MTP head: give no DRAFT with it")
    if at_tau is not None and draft is None and not mtp:
        raise BadInput("--at-tau", "prices a drafter's round: give DRAFT or --mtp")
    if block_size is not None:  # before anything loads; else once the drafter has
        check_tau(at_tau, block_size)
    placed = place_runtime(device, threads, dtype)
    where, parallel = placed.device, placed.parallel
    graphs = where.type == "cuda" if graphs is None else graphs
    target_model = opened(target, gguf_file)
    draft_model = opened(draft, draft_gguf_file) if draft is not None else None
    plan = loading.plan_load(target_model, where, placed.dtype, parallel=parallel)
    tokenizer = target_model.tokenizer()
    chat = chat_by_default(tokenizer, chat)
    named = prompts or list(BUILTIN_PROMPTS)
    user_prompts = [encode_prompt(tokenizer, prompt, chat, name, chat_kwargs) for name, prompt in named]
    text = tokenizer.encode("\n\n".join(text for _, text in BUILTIN_PROMPTS) + "\n\n")
    if not text:
        raise BadInput(target_model.ref, "its tokenizer encodes the built-in prompts to no tokens")
    context = max(depths + [len(p) for p in user_prompts]) + tokens + (block_size or FIT_BLOCK)
    runtime = load_target(plan, progress, context, loaded).runtime
    drafter = None
    if draft_model is not None or mtp:
        progress.stage(
            f"loading the {drafter_kind(draft_model)} drafter" + (f" from {draft_model.ref}" if draft_model else "")
        )
        drafter = load_drafter(draft_model, target_model, runtime, draft_bits)
    block = block_size or (drafter.block_size if drafter else None)
    if block_size is None and drafter is not None:
        check_tau(at_tau, drafter.block_size)
    gpu = torch.cuda.get_device_name(where) if where.type == "cuda" else None
    known = gpu_named(gpu) if gpu else None
    bytes_per_s = bandwidth * 1e9 if bandwidth else (known.bandwidth if known else None)

    progress.stage("warming up (kernels compile on first use)")
    runs = Rows(runtime, drafter, plan, tokens, block, graphs, bytes_per_s, progress, at_tau)
    runs.warm_up(user_prompts[0])
    names = [name for name, _ in named]
    requests: list[tuple[str, list[int]]] = []
    users = [runs.row(batches(len(user_prompts), n), user_prompts, f"users {n}", names, requests) for n in user_counts]
    depth = [
        {"depth": d, **runs.row([[0]], [(text * (max(d, 1) // len(text) + 1))[: max(d, 1)]], f"depth {d}")}
        for d in depths
    ]
    return BenchReport(
        command=command,
        gpu=gpu,
        device=where,
        dtype=dtype_name(plan),
        graphs=graphs,
        versions=versions(),
        bytes_per_s=bytes_per_s,
        bandwidth_source="--bandwidth" if bandwidth else (f"table: {known.name}" if known else None),
        target={"ref": target_model.ref, "family": target_model.config.family, "resident_bytes": plan.resident_bytes},
        draft=None
        if drafter is None
        else {
            "ref": draft_model.ref if draft_model else None,
            "kind": drafter.kind,
            "resident_bytes": drafter.resident_bytes,
            "block_size": block,
        },
        tokens=tokens,
        chat=chat,
        chat_kwargs=chat_kwargs or {},
        prompts=names,
        users=users,
        depth=depth,
        requests=requests,
        at_tau=at_tau,
    )


def check_tau(at_tau: float | None, block: int) -> None:
    if at_tau is not None and not 1 <= at_tau <= block:
        raise BadInput("--at-tau", f"{at_tau:g} is not a τ of block {block}: a round keeps 1 to {block} tokens")


def batches(count: int, size: int) -> list[list[int]]:
    """Indices of `count` prompts, `size` at a time; fewer prompts than that are repeated to fill one batch."""
    if count < size:
        return [[i % count for i in range(size)]]
    return [list(range(at, min(at + size, count))) for at in range(0, count, size)]


class Rows:
    """One row: the prompts undrafted and drafted in turn, compared, against the weights roofline."""

    def __init__(
        self,
        target: Transformer,
        drafter: Drafter | None,
        plan: LoadPlan,
        tokens: int,
        block: int | None,
        graphs: bool,
        bytes_per_s: float | None,
        progress: Progress,
        at_tau: float | None = None,
    ) -> None:
        self.target, self.drafter, self.plan, self.tokens, self.block = target, drafter, plan, tokens, block
        self.graphs, self.bytes_per_s, self.progress, self.at_tau = graphs, bytes_per_s, progress, at_tau

    def warm_up(self, ids: list[int]) -> None:
        """A short run each way, so that what is compiled or initialised on first use is not in a timed run."""
        from specpair.runtime.generate import generate
        from specpair.runtime.sampling import Sampling
        from specpair.runtime.speculative import speculative_generate

        generate(self.target, [ids], 2, Sampling(), graphs=self.graphs)
        if self.drafter is not None:
            speculative_generate(
                self.target, self.drafter, [ids], self.block + 1, Sampling(), block_size=self.block, graphs=self.graphs
            )

    def row(
        self,
        groups: list[list[int]],
        prompts: list[list[int]],
        name: str,
        names: list[str] | None = None,
        requests: list[tuple[str, list[int]]] | None = None,
    ) -> dict[str, Any]:
        """The row of `prompts` run as `groups` of concurrent sequences, one after another (indices into `prompts`):
        REPEATS runs each way, undrafted and drafted in turn, each figure its median run; `requests` gets each
        drafted sequence's prompt name and measured rounds."""
        from specpair.runtime.generate import Timing, generate
        from specpair.runtime.sampling import Sampling
        from specpair.runtime.speculative import SpeculativeTiming, speculative_generate

        users = len(groups[0])
        self.progress.stage(
            f"{name}: {REPEATS} x undrafted"
            + (f" and drafted ({self.drafter.kind}, block {self.block}) in turn" if self.drafter else "")
            + f", {sum(map(len, groups))} x {self.tokens} tokens after "
            f"{'/'.join(str(len(prompts[i])) for i in groups[0])}{' ...' if len(groups) > 1 else ''} prompt tokens"
        )
        batches = REPEATS * len(groups) * (2 if self.drafter else 1)
        with self.progress.meter(name, batches, unit="batches", tenths=batches > 1) as advance:

            def undrafted() -> tuple[list[list[int]], Timing]:
                outputs, total = [], Timing(0.0, 0.0, 0, 0, 0)
                for group in groups:
                    done, t = generate(
                        self.target, [prompts[i] for i in group], self.tokens, Sampling(), graphs=self.graphs
                    )
                    outputs += [g.tokens for g in done]
                    total = Timing(
                        total.prefill_s + t.prefill_s,
                        total.decode_s + t.decode_s,
                        total.prompt_tokens + t.prompt_tokens,
                        total.generated_tokens + t.generated_tokens,
                        total.sequences + t.sequences,
                        total.capture_s + t.capture_s,
                    )
                    advance(1)
                return outputs, total

            def drafted() -> tuple[list, SpeculativeTiming]:
                outputs, total = [], SpeculativeTiming()
                for group in groups:
                    done, t = speculative_generate(
                        self.target,
                        self.drafter,
                        [prompts[i] for i in group],
                        self.tokens,
                        Sampling(),
                        block_size=self.block,
                        graphs=self.graphs,
                    )
                    outputs += done
                    for field in ("prefill_s", "draft_s", "verify_s", "capture_s", "rounds", "generated_tokens"):
                        setattr(total, field, getattr(total, field) + getattr(t, field))
                    advance(1)
                return outputs, total

            if self.drafter is None:
                u_runs, d_runs = [undrafted() for _ in range(REPEATS)], []
            else:
                u_runs, d_runs = alternate(undrafted, drafted, REPEATS)
        u_rates = [t.decode_tokens_per_s for _, t in u_runs]
        d_rates = [t.generated_tokens / (t.draft_s + t.verify_s) for _, t in d_runs]
        timing = Spread.of(u_rates, d_rates)
        outputs, u = u_runs[median_index(u_rates)]
        u_rate = u.decode_tokens_per_s
        weights = self.plan.weights_read(users)
        roofline = users * self.bytes_per_s / weights if self.bytes_per_s else None
        row = {
            "users": users,
            "prompt_tokens": u.prompt_tokens,
            "undrafted": {
                "tokens_per_s": u_rate,
                "seconds": {"prefill": u.prefill_s, "decode": u.decode_s, "capture": u.capture_s},
            },
            "drafted": None,
            "speedup": None,
            "roofline": {"weights_bytes_per_step": weights, "tokens_per_s": roofline},
            "of_roofline": {"undrafted": u_rate / roofline if roofline else None, "drafted": None},
            "timing": timing.to_json(),
        }
        result = f"  {u_rate:.1f} tok/s undrafted"
        if self.drafter is not None:
            line, measured = self.drafted(row, groups, prompts, outputs, d_runs, d_rates, roofline)
            result += line
            if requests is not None and names is not None:
                requests += [(names[i], accepted) for i, accepted in zip(sum(groups, []), measured)]
        if not timing.reliable:
            result += f" · {timing.warning()}"
        self.progress.note(result + (f" · roofline {roofline:.1f}" if roofline else ""))
        return row

    def drafted(
        self,
        row: dict[str, Any],
        groups: list[list[int]],
        prompts: list[list[int]],
        undrafted: list[list[int]],
        runs: list[tuple[list, Any]],
        rates: list[float],
        roofline: float | None,
    ) -> tuple[str, list[list[int]]]:
        """The drafted figures into `row`, from the median of `runs`, every run compared with `undrafted`; what the
        progress line adds for them, and each sequence's measured rounds (Drafted.measured)."""
        from specpair.runtime.speculative import acceptance_by_position, mean_accept_length, step_times

        drafted, d = runs[median_index(rates)]
        measured = [r.measured for r in drafted]
        u_rate = row["undrafted"]["tokens_per_s"]
        d_rate = d.generated_tokens / (d.draft_s + d.verify_s)
        tau = mean_accept_length([a for r in measured for a in r])
        difference = next(
            (found for run, _ in runs if (found := first_difference(undrafted, [r.tokens for r in run]))), None
        )
        compared = sum(len(undrafted[at]) for at in first_runs(groups))
        inconclusive = (
            f"{compared} generated tokens compared, fewer than {MIN_COMPARED} (--tokens {self.tokens})"
            if compared < MIN_COMPARED
            else None
        )
        steps = step_times(self.target, self.drafter, [prompts[i] for i in groups[0]], self.block, graphs=self.graphs)
        predicted = steps.predicted_speedup(tau)
        at_tau = None
        if self.at_tau is not None:  # each of the group's sequences keeps at_tau tokens a round of these steps
            at_tau = {
                "tau": self.at_tau,
                "tokens_per_s": len(groups[0]) * self.at_tau / (steps.draft_s + steps.verify_s),
                "speedup": steps.predicted_speedup(self.at_tau),
            }
        row["drafted"] = {
            "tokens_per_s": d_rate,
            "tau": tau,
            "acceptance_by_position": acceptance_by_position(drafted, self.block - 1),
            "rounds": sum(len(r.committed) for r in drafted),
            "identical": False if difference else (None if inconclusive else True),
            "first_difference": difference,
            "compared_tokens": compared,
            "inconclusive": inconclusive,
            "seconds": {"prefill": d.prefill_s, "draft": d.draft_s, "verify": d.verify_s, "capture": d.capture_s},
            "step_seconds": {"decode": steps.decode_s, "verify": steps.verify_s, "draft": steps.draft_s},
            "predicted_speedup": predicted,
            "of_predicted": d_rate / u_rate / predicted,
            "at_tau": at_tau,
        }
        row["speedup"] = d_rate / u_rate
        row["of_roofline"]["drafted"] = d_rate / roofline if roofline else None
        verdict = "DIVERGED" if difference else f"inconclusive: {inconclusive}" if inconclusive else "identical"
        priced = f" · at τ {self.at_tau:g} {at_tau['tokens_per_s']:.1f}" if at_tau else ""
        return (
            f" · {d_rate:.1f} drafted ({row['speedup']:.2f}×, {predicted:.2f}× predicted) · τ {tau:.2f}{priced} · "
            f"{verdict}",
            measured,
        )


def median_index(rates: list[float | None]) -> int:
    """The run whose rate is the median of `rates` (the lower middle one of an even count)."""
    order = sorted(range(len(rates)), key=lambda i: rates[i] or 0.0)
    return order[(len(order) - 1) // 2]


def first_runs(groups: list[list[int]]) -> list[int]:
    """Where each prompt first runs in the groups' sequences, flattened (a batch filled by repeats counts once)."""
    seen: dict[int, int] = {}
    for at, i in enumerate(sum(groups, [])):
        seen.setdefault(i, at)
    return list(seen.values())


def first_difference(undrafted: list[list[int]], drafted: list[list[int]]) -> dict[str, int | None] | None:
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


def versions() -> dict[str, str | None]:
    import torch

    from specpair import __version__

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"specpair": __version__, "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda}

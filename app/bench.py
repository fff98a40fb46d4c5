"""`specpair bench TARGET [DRAFT]`: decode speed as users post it, on specpair's own runtime: tok/s by number of users
and by context depth, undrafted and drafted, with τ, each row against the weights roofline of the GPU; every
drafted run compared token for token with the undrafted one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specpair.app.device import place_runtime
from specpair.app.models import dtype_name, load_target
from specpair.app.progress import SILENT, Progress
from specpair.app.prompts import BUILTIN_PROMPTS
from specpair.app.timing import Spread, alternate
from specpair.errors import BadInput

if TYPE_CHECKING:
    import torch

    from specpair.runtime.drafters import Drafter
    from specpair.runtime.loading import LoadPlan
    from specpair.runtime.model import Transformer

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
    users: list[dict[str, Any]]  # a row per users count, as the JSON report holds it
    depth: list[dict[str, Any]]  # a row per depth
    plot: str | None = None  # the PNG of the depth sweep, once written

    @property
    def identical(self) -> bool | None:
        """Every drafted run equal to its undrafted run; None without a drafter."""
        return None if self.draft is None else all(r["drafted"]["identical"] for r in self.users + self.depth)

    @property
    def exit_code(self) -> int:
        return 1 if self.identical is False else 0

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
            "users": self.users,
            "depth": self.depth,
            "identical": self.identical,
            "plot": self.plot,
        }


def run_bench(
    target: str,
    draft: str | None = None,
    *,
    command: str,
    mtp: bool = False,
    depths: list[int],
    user_counts: list[int],
    tokens: int,
    block_size: int | None = None,
    device: str | None = None,
    threads: int | None = None,
    gguf_file: str | None = None,
    draft_gguf_file: str | None = None,
    draft_bits: int | None = None,
    graphs: bool | None = None,
    bandwidth: float | None = None,
    progress: Progress = SILENT,
) -> BenchReport:
    """Decode tok/s of `target` (and drafted with `draft` or its MTP head) for each users count and depth, greedy,
    `tokens` per sequence; `bandwidth` in GB/s, else the GPU table's figure for this GPU. `command` is the command
    line the report names."""
    import torch

    from specpair.compat.memory import gpu_named
    from specpair.runtime import loading
    from specpair.runtime.drafters.loading import drafter_kind, load_drafter
    from specpair.sources.model import open_model

    if mtp and draft is not None:
        raise BadInput("--mtp", "drafts with the target's own MTP head: give no DRAFT with it")
    where, parallel = place_runtime(device, threads)
    graphs = where.type == "cuda" if graphs is None else graphs
    target_model = open_model(target, gguf_file)
    draft_model = open_model(draft, draft_gguf_file) if draft is not None else None
    plan = loading.plan_load(target_model, where, parallel=parallel)
    tokenizer = target_model.tokenizer()
    user_prompts = [tokenizer.encode(text) for _, text in BUILTIN_PROMPTS]
    text = tokenizer.encode("\n\n".join(text for _, text in BUILTIN_PROMPTS) + "\n\n")
    if not text or not all(user_prompts):
        raise BadInput(target, "its tokenizer encodes the built-in prompts to no tokens")
    context = max(depths + [len(p) for p in user_prompts]) + tokens + (block_size or FIT_BLOCK)
    runtime = load_target(plan, progress, context).runtime
    drafter = None
    if draft_model is not None or mtp:
        progress.stage(f"loading the {drafter_kind(draft_model)} drafter" + (f" from {draft}" if draft else ""))
        drafter = load_drafter(draft_model, target_model, runtime, draft_bits)
    block = block_size or (drafter.block_size if drafter else None)
    gpu = torch.cuda.get_device_name(where) if where.type == "cuda" else None
    known = gpu_named(gpu) if gpu else None
    bytes_per_s = bandwidth * 1e9 if bandwidth else (known.bandwidth if known else None)

    progress.stage("warming up (kernels compile on first use)")
    runs = Rows(runtime, drafter, plan, tokens, block, graphs, bytes_per_s, progress)
    runs.warm_up(user_prompts[0])
    users = [runs.row([user_prompts[i % len(user_prompts)] for i in range(n)], f"users {n}") for n in user_counts]
    depth = [
        {"depth": d, **runs.row([(text * (max(d, 1) // len(text) + 1))[: max(d, 1)]], f"depth {d}")} for d in depths
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
        target={"ref": target, "family": target_model.config.family, "resident_bytes": plan.resident_bytes},
        draft=None
        if drafter is None
        else {"ref": draft, "kind": drafter.kind, "resident_bytes": drafter.resident_bytes, "block_size": block},
        tokens=tokens,
        users=users,
        depth=depth,
    )


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
    ) -> None:
        self.target, self.drafter, self.plan, self.tokens, self.block = target, drafter, plan, tokens, block
        self.graphs, self.bytes_per_s, self.progress = graphs, bytes_per_s, progress

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

    def row(self, prompts: list[list[int]], name: str) -> dict[str, Any]:
        """The row's figures: REPEATS runs each way, undrafted and drafted in turn, each figure its median run."""
        from specpair.runtime.generate import generate
        from specpair.runtime.sampling import Sampling
        from specpair.runtime.speculative import speculative_generate

        self.progress.stage(
            f"{name}: {REPEATS} x undrafted"
            + (f" and drafted ({self.drafter.kind}, block {self.block}) in turn" if self.drafter else "")
            + f", {len(prompts)} x {self.tokens} tokens after {'/'.join(str(len(p)) for p in prompts)} prompt tokens"
        )

        def undrafted() -> tuple[list, Any]:
            return generate(self.target, prompts, self.tokens, Sampling(), graphs=self.graphs)

        def drafted() -> tuple[list, Any]:
            return speculative_generate(
                self.target, self.drafter, prompts, self.tokens, Sampling(), block_size=self.block, graphs=self.graphs
            )

        if self.drafter is None:
            u_runs, d_runs = [undrafted() for _ in range(REPEATS)], []
        else:
            u_runs, d_runs = alternate(undrafted, drafted, REPEATS)
        u_rates = [t.decode_tokens_per_s for _, t in u_runs]
        d_rates = [t.generated_tokens / (t.draft_s + t.verify_s) for _, t in d_runs]
        timing = Spread.of(u_rates, d_rates)
        outputs, u = u_runs[median_index(u_rates)]
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
            "timing": timing.to_json(),
        }
        result = f"  {u_rate:.1f} tok/s undrafted"
        if self.drafter is not None:
            result += self.drafted(row, prompts, [g.tokens for g in outputs], d_runs, d_rates, roofline)
        if not timing.reliable:
            result += f" · {timing.warning()}"
        self.progress.note(result + (f" · roofline {roofline:.1f}" if roofline else ""))
        return row

    def drafted(
        self,
        row: dict[str, Any],
        prompts: list[list[int]],
        undrafted: list[list[int]],
        runs: list[tuple[list, Any]],
        rates: list[float],
        roofline: float | None,
    ) -> str:
        """The drafted figures into `row`, from the median of `runs`, every run compared with `undrafted`; what the
        progress line adds for them."""
        from specpair.runtime.speculative import acceptance_by_position, step_times

        drafted, d = runs[median_index(rates)]
        u_rate = row["undrafted"]["tokens_per_s"]
        rounds = sum(len(r.committed) for r in drafted)
        d_rate = d.generated_tokens / (d.draft_s + d.verify_s)
        tau = sum(sum(r.committed) for r in drafted) / rounds
        difference = next(
            (found for run, _ in runs if (found := first_difference(undrafted, [r.tokens for r in run]))), None
        )
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
        return f" · {d_rate:.1f} drafted ({row['speedup']:.2f}×, {predicted:.2f}× predicted) · τ {tau:.2f} · " + (
            "identical" if difference is None else "DIVERGED"
        )


def median_index(rates: list[float | None]) -> int:
    """The run whose rate is the median of `rates` (the lower middle one of an even count)."""
    order = sorted(range(len(rates)), key=lambda i: rates[i] or 0.0)
    return order[(len(order) - 1) // 2]


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

"""One rank of a tensor-parallel test: tests/test_parallel.py starts `size` of these through runtime.parallel.launch.

    python tests/tp_worker.py JOB.json OUT.safetensors

JOB: {"logits": {name: target path}} (each target: a prefill, a verify step committed to a prefix, decode steps; the
logits of every step; and per rank, gathered: how many weights it kept packed) and {"speculative":
[[name, target path, drafter path or null], ...]} (undrafted and drafted tokens, greedy and seeded); "packed": true
loads the targets with their quantized weights kept packed. Rank 0 writes what it got."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import generate, prefill
from specpair.runtime.loading import load, plan_load
from specpair.runtime.parallel import Parallel
from specpair.runtime.sampling import Sampling
from specpair.runtime.speculative import speculative_generate
from specpair.sources.model import open_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
TOKENS = 24
SAMPLINGS = {"greedy": Sampling(), "seeded": Sampling(temperature=0.8, top_k=30, seed=5)}


def step_logits(target) -> torch.Tensor:
    """Every logit a prefill, a verify block committed to different prefixes per sequence, and decode steps give."""
    cache = target.new_cache(len(PROMPTS), 64)
    rows = [target.head(prefill(target, cache, PROMPTS))]
    positions = torch.tensor([[len(p)] for p in PROMPTS])
    block = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    out = target.forward(block, positions + torch.arange(4), cache, verify=True)
    out.pending.commit(torch.tensor([1, 4, 0]))
    rows.append(out.logits.reshape(-1, out.logits.shape[-1]))
    positions = positions + torch.tensor([[1], [4], [0]])
    token = block[:, :1]
    for _ in range(3):
        logits = target.forward(token, positions, cache).logits[:, 0]
        rows.append(logits)
        token, positions = logits.argmax(-1, keepdim=True), positions + 1
    return torch.cat(rows)


def main() -> None:
    job, out = json.loads(open(sys.argv[1]).read()), sys.argv[2]
    torch.set_num_threads(1)
    parallel = Parallel.from_environment("cpu")
    packed = job.get("packed")
    results: dict[str, torch.Tensor] = {}
    for name, path in job.get("logits", {}).items():
        plan = plan_load(open_model(path), "cpu", packed=packed, parallel=parallel)
        target = load(plan)
        results[name] = step_logits(target)
        results[f"{name}/packed"] = parallel.gather(torch.tensor([len(plan.packed)]))
    for name, path, draft in job.get("speculative", []):
        model = open_model(path)
        target = load(plan_load(model, "cpu", packed=packed, parallel=parallel))
        drafter = load_drafter(open_model(draft) if draft else None, model, target)
        for label, sampling in SAMPLINGS.items():
            undrafted, _ = generate(target, PROMPTS, TOKENS, sampling)
            drafted, _ = speculative_generate(target, drafter, PROMPTS, TOKENS, sampling)
            for i, (u, d) in enumerate(zip(undrafted, drafted)):
                results[f"{name}/{label}/{i}/undrafted"] = torch.tensor(u.tokens)
                results[f"{name}/{label}/{i}/drafted"] = torch.tensor(d.tokens)
                results[f"{name}/{label}/{i}/committed"] = torch.tensor(d.committed)
    if parallel.rank == 0:
        save_file({k: v.contiguous() for k, v in results.items()}, out)
    if parallel.size > 1:  # leave together: a rank that exits while its peers still talk can abort in gloo's teardown
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

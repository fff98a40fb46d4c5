"""specpair's own runtime (PyTorch + Triton), built from the same readers as `check`, in gpt-fast's shape.

    from specpair.sources.model import open_model
    from specpair.runtime.loading import load, plan_load
    model = load(plan_load(open_model("./Qwen3.6-35B-A3B"), "cuda"))      # runtime/model.py: Transformer
    cache = model.new_cache(batch=4, context=4096)                          # runtime/cache.py: static buffers
    out = model.forward(tokens, positions, cache, taps=(1, 10), hidden=True, verify=True)
    out.pending.commit(accepted)                                            # keep a prefix 0..T of each row
    step = ForwardGraph(model, cache, batch=4, tokens=1)                    # runtime/graphs.py: one captured step

- models/<family>.py: what a decoder layer of each family is made of (llama, qwen3, qwen3_moe, qwen3_next,
  qwen3_5, qwen3_5_moe); blocks.py: the blocks (norms, attention, Gated DeltaNet, MLP, MoE); rope.py;
- model.py: the one step function (decode, verify, prefill chunks), taps and the final normed hidden,
  `embed` and `head` on their own;
- cache.py: KV and GDN state for a fixed batch and context (targets' and drafters'), a verify step's Pending
  that commits any prefix of it or discards it;
- loading.py: a `Model` onto a device, streamed, quantized weights kept packed where the kernels read them;
- sampling.py, generate.py: the sampler, the one chunked prefill and the generation loop of `specpair run TARGET`;
- graphs.py: a step of fixed shapes over static buffers, a CUDA graph on CUDA (eager through the same buffers on
  the CPU): the decode and verify steps of both loops and the drafters' fixed-shape steps;
- kernels/: matmul (dense and packed, projections fused), norms, rotary + cache write, attention, SwiGLU, MoE
  routing and combination, the GDN conv, gates and recurrence; batch-invariant;
- drafters/<kind>.py: DFlash and DFlash2, EAGLE-3, the MTP head, plain draft models; acceptance.py: the
  verify rules; speculative.py: the speculative loop of `specpair run TARGET DRAFT`.

`AVAILABLE` says which target families and drafter kinds this runtime runs (from any layout the model layer
reads): the family and drafter-kind rows that list specpair's own stack (checkpoint/families.py), which `check`
reads for its `specpair` verdict without importing torch; the runtime tests hold it equal to runtime/models and
runtime/drafters.
"""

from dataclasses import dataclass

from specpair.checkpoint.families import OWN_STACK, families_served_by, kinds_served_by


@dataclass(frozen=True)
class Runs:
    families: tuple[str, ...]  # runtime/models FAMILIES: targets, and draft models
    drafter_kinds: tuple[str, ...]  # runtime/drafters/loading.py LOADERS


AVAILABLE = Runs(families=families_served_by(OWN_STACK), drafter_kinds=kinds_served_by(OWN_STACK))

"""Where a drafted run leaves undrafted decoding, one step at a time, on a target at real shape (GPU).

    PYTHONPATH=<a directory holding the repository as specpair> python3 tools/exactness_probe.py TARGET \
        [--taps 1,10,...] [--prompt-tokens 94] [--block 8] [--device cuda]

The gate (`specpair run`) says that drafted and undrafted tokens differ, not where the bits part. Drafted decoding
differs from undrafted in three ways the exactness rests on, each compared here bit for bit on one random prompt:
the prefill with the drafter's taps against without (logits), the prompt's last token through a prefill of the
whole prompt against through row 0 of a verify step of T tokens after a prefill of the rest (T = 1 is a decode
step), and the same with taps. Seen first on an H100 (2026-12-06, benchmarks/results/seed_pairs.md): the 35B
NVFP4 target with the DFlash2 drafter (taps, verify of 8) left undrafted decoding on one gate prompt of four in
every setting, with its MTP head (no taps, verify of 4) it did not. TARGET: a checkpoint directory, as
benchmarks/seed_pairs_gpu.py --only build --keep writes it (its DFlash2 drafter's target_layer_ids are --taps).
"""

from __future__ import annotations

import argparse

import torch

from specpair.runtime.loading import load, plan_load
from specpair.sources.model import open_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target")
    parser.add_argument("--taps", default="", help="target layers the drafter reads (comma-separated)")
    parser.add_argument("--prompt-tokens", type=int, default=94)
    parser.add_argument("--block", type=int, default=8, help="the largest verify step compared")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    taps = tuple(int(k) for k in args.taps.split(",") if k)
    target = load(plan_load(open_model(args.target), args.device))
    generator = torch.Generator().manual_seed(args.seed)
    vocab = target.config.vocab_size
    prompt = torch.randint(0, vocab, (1, args.prompt_tokens), generator=generator).to(args.device)
    drafts = torch.randint(0, vocab, (1, args.block - 1), generator=generator).to(args.device)
    positions = torch.arange(args.prompt_tokens + args.block, device=args.device)[None]
    last = args.prompt_tokens - 1

    def whole(with_taps: tuple[int, ...]) -> torch.Tensor:
        """The last prompt token's logits from a prefill of the whole prompt."""
        cache = target.new_cache(1, args.prompt_tokens + args.block)
        return target.forward(prompt, positions[:, : last + 1], cache, taps=with_taps).logits[0, -1]

    def verified(tokens: int, with_taps: tuple[int, ...]) -> torch.Tensor:
        """Its logits from row 0 of a step of `tokens` (it, then drafts) after a prefill of the rest."""
        cache = target.new_cache(1, args.prompt_tokens + args.block)
        target.forward(prompt[:, :last], positions[:, :last], cache, taps=with_taps)
        block = torch.cat([prompt[:, last:], drafts[:, : tokens - 1]], 1)
        step = positions[:, last : last + tokens]
        return target.forward(block, step, cache, taps=with_taps, verify=tokens > 1).logits[0, 0]

    want = whole(())
    rows = [("prefill with taps", whole(taps))] if taps else []
    for tokens in range(1, args.block + 1):
        rows.append((f"prefill of the rest, then a step of {tokens}", verified(tokens, ())))
        if taps:
            rows.append((f"the same with taps, a step of {tokens}", verified(tokens, taps)))
    for what, got in rows:
        differing = int((got != want).sum())
        largest = float((got.float() - want.float()).abs().max())
        print(f"{what}: {'identical' if differing == 0 else f'{differing} logits differ, by up to {largest:.3g}'}")


if __name__ == "__main__":
    main()

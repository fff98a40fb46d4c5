"""`specpair bench` on one GPU at real shape with random weights, the checkpoints written here:
- `--pair 8b` (the default): a Qwen3-8B target in BF16 (Qwen/Qwen3-8B's config) and a draft model of Qwen3-0.6B's
  width with 2 layers and the same vocabulary;
- `--pair 35b`: Qwen3.6-35B-A3B in NVIDIA's NVFP4 + FP8 layout with its BF16 MTP head, and a DFlash2 drafter of the
  published shape quantized to affine-4 at load (benchmarks/speculative_gpu.py's checkpoints), benched with the
  DFlash2 drafter and with the MTP head.

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/bench_gpu.py [--pair 8b|35b] \
        [--out DIR] [--depth 0,512,1k,2k,4k,8k,32k] [--users 1,2,4,8] [--tokens 512] [--eager-tokens 64] \
        [-- BENCH OPTIONS]

Writes to --out (default $OUT, else the work directory): bench.json (specpair.bench/1), bench.md (its tables, as
`specpair bench --md` renders them), bench_depth.png (the depth sweep), and for the 8b pair the same for a short
eager run (`--no-graphs`, users 1 and depth 0 only): the baseline, measured in the same run, that the graphs are
compared with (the ratios close bench.md); for the 35b pair bench_mtp.* beside them. Options after `--` go to
every `specpair bench` call.

With random weights the draft model agrees with the target only by chance (τ near 1): what this measures is the
speed of the steps (tok/s against the weights roofline, the cost of a round), not what drafting gains; every
drafted run is still compared token for token with the undrafted one. The tokenizer is a byte-level BPE without
merges (one token per byte of the built-in prompts' text): the repository ships no Qwen tokenizer and the GPU
machine has no network, and token ids below 256 read the same embedding rows as any others.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runtime_gpu import CONFIGS, qwen3_tensors, qwen36_tensors, write_checkpoint  # noqa: E402
from speculative_gpu import dflash2_checkpoint, mtp_tensors  # noqa: E402

from specpair.checkpoint.gguf_tokenizer import BYTE_SPELLING  # noqa: E402

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def write_byte_tokenizer(
    directory: Path, vocab_size: int, merges: tuple[tuple[str, str], ...] = (), ids: int | None = None
) -> None:
    """byte_tokenizer's files written into `directory`."""
    for name, raw in byte_tokenizer(vocab_size, merges, ids).items():
        (directory / name).write_bytes(raw)


def byte_tokenizer(
    vocab_size: int, merges: tuple[tuple[str, str], ...] = (), ids: int | None = None
) -> dict[str, bytes]:
    """tokenizer.json (byte-level BPE; `merges` joins tokens of the vocabulary: a GGUF needs at least one),
    tokenizer_config.json and generation_config.json, by name.

    `ids`: the tokenizer's length (default: the 256 byte tokens, the special ones after them, then the merges').
    Past those the vocabulary is filled with strings of two, then three byte-level characters, as a real
    vocabulary's entries that no merge reaches (text encodes as without them)."""
    tokens = sorted(BYTE_SPELLING)  # the byte-level vocabulary's first 256 tokens, in its order
    first_special = len(tokens)
    tokens += list(SPECIAL) + [a + b for a, b in merges]
    ids = len(tokens) if ids is None else ids
    assert len(tokens) <= ids <= vocab_size
    taken = set(tokens)
    fill = (
        "".join(chars)
        for width in (2, 3)
        for chars in itertools.product(BYTE_SPELLING, repeat=width)
        if "".join(chars) not in taken
    )
    tokens += itertools.islice(fill, ids - len(tokens))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    added = [
        {
            "id": first_special + i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL)
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens) if t not in SPECIAL},
            "merges": [[a, b] for a, b in merges],
        },
    }
    stops = [first_special + SPECIAL.index("<|im_end|>"), first_special + SPECIAL.index("<|endoftext|>")]
    config = {
        "tokenizer_class": "TokenizersBackend",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "add_prefix_space": False,
        "model_max_length": 131072,
    }
    return {
        "tokenizer.json": json.dumps(tokenizer).encode(),
        "tokenizer_config.json": json.dumps(config).encode(),
        "generation_config.json": json.dumps({"eos_token_id": stops, "pad_token_id": stops[1]}).encode(),
    }


def build(work: Path) -> tuple[Path, Path]:
    """The Qwen3-8B target and the 2-layer draft model, written once into `work` (kept for later runs)."""
    target_config = json.loads((CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    draft_config = {
        **json.loads((CONFIGS / "Qwen__Qwen3-0.6B.json").read_text()),
        "num_hidden_layers": 2,
        "max_window_layers": 2,
    }
    assert draft_config["vocab_size"] == target_config["vocab_size"]
    out = []
    for name, config in (("qwen3-8b-bf16", target_config), ("qwen3-draft-2l-bf16", draft_config)):
        directory = work / name
        if not (directory / "tokenizer.json").is_file():
            seconds = write_checkpoint(directory, config, qwen3_tensors(config, "bf16"))
            write_byte_tokenizer(directory, config["vocab_size"])
            print(f"wrote {directory} in {seconds:.0f} s", file=sys.stderr)
        out.append(directory)
    return out[0], out[1]


def build_35b(work: Path) -> tuple[Path, Path]:
    """Qwen3.6-35B-A3B NVFP4 + FP8 with its MTP head, and the DFlash2 drafter, written once into `work`."""
    config = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.json").read_text())
    hf_quant = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.hf_quant_config.json").read_text())
    text = config["text_config"]
    target, draft = work / "qwen3.6-35b-a3b-nvfp4-mtp", work / "qwen3.6-dflash2"
    if not (target / "tokenizer.json").is_file():
        tensors = qwen36_tensors(config, hf_quant["quantization"]["quantized_layers"]) + mtp_tensors(config)
        seconds = write_checkpoint(target, config, tensors, {"hf_quant_config.json": hf_quant})
        write_byte_tokenizer(target, text["vocab_size"])
        print(f"wrote {target} in {seconds:.0f} s", file=sys.stderr)
    if not (draft / "config.json").is_file():
        dflash2_checkpoint(draft, text["vocab_size"], text["num_hidden_layers"])
    return target, draft


def bench(target: Path, draft: Path | None, out: Path, name: str, options: list[str]) -> dict:
    """`specpair bench ... --json --plot`: its document, also written as NAME.json and NAME.md."""
    command = [
        sys.executable,
        "-m",
        "specpair",
        "bench",
        str(target),
        *([str(draft)] if draft else []),
        "--json",
        "--plot",
        str(out / f"{name}_depth.png"),
        *options,
    ]
    print("$ " + " ".join(command[1:]), file=sys.stderr)
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if done.returncode not in (0, 1):  # 1: a drafted run differed, which the document reports
        sys.exit(f"specpair bench exited {done.returncode}: {done.stdout[-2000:]}")
    document = json.loads(done.stdout)
    (out / f"{name}.json").write_text(json.dumps(document, indent=2))
    from specpair.cli.bench import print_report

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_report(document, md=True)
    wall = f"\n(wall time of the command: {time.perf_counter() - start:.0f} s)\n"
    (out / f"{name}.md").write_text(text.getvalue() + wall)
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("8b", "35b"), default="8b")
    parser.add_argument("--work", type=Path, default=Path("/tmp/specpair-bench-gpu"))
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    parser.add_argument("--depth", default="0,512,1k,2k,4k,8k,32k")
    parser.add_argument("--users", default="1,2,4,8")
    parser.add_argument("--tokens", default="512")
    parser.add_argument("--eager-tokens", default="64")
    args, rest = parser.parse_known_args()
    rest = [a for a in rest if a != "--"]
    out = args.out or args.work
    out.mkdir(parents=True, exist_ok=True)
    rows = ["--depth", args.depth, "--users", args.users, "--tokens", args.tokens, *rest]
    if args.pair == "35b":
        target, draft = build_35b(args.work)
        bench(target, draft, out, "bench", ["--draft-bits", "4", *rows])
        bench(target, None, out, "bench_mtp", ["--mtp", *rows])
        sys.stdout.write((out / "bench.md").read_text() + (out / "bench_mtp.md").read_text())
        return
    target, draft = build(args.work)
    graphs = bench(target, draft, out, "bench", rows)
    eager = bench(
        target,
        draft,
        out,
        "bench_eager",
        ["--depth", "0", "--users", "1", "--tokens", args.eager_tokens, "--no-graphs", *rest],
    )
    lines = ["", "## CUDA graphs against eager steps (the baseline, same run: users 1, depth 0)", ""]
    for key, label in (("users", "users 1"), ("depth", "depth 0")):
        g = next(r for r in graphs[key] if (r["users"] == 1 if key == "users" else r["depth"] == 0))
        e = eager[key][0]
        for side in ("undrafted", "drafted"):
            if g[side] and e[side]:
                fast, slow = g[side]["tokens_per_s"], e[side]["tokens_per_s"]
                lines.append(f"- {label}, {side}: {fast:.1f} tok/s with graphs, {slow:.1f} eager ({fast / slow:.1f}×)")
    with open(out / "bench.md", "a") as f:
        f.write("\n".join(lines) + "\n")
    sys.stdout.write((out / "bench.md").read_text())


if __name__ == "__main__":
    main()

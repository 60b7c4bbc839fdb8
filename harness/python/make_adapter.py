"""Writes a tiny LoRA adapter for the tiny model of make_model.py into a folder, deterministically.

Usage: python make_adapter.py OUTPUT_DIR

No model hub is reachable, so the adapter vLLM serves beside the base model in the real-engine
suite is made here, in PEFT's format (what `vllm serve --lora-modules NAME=DIR` loads):
`adapter_config.json` and `adapter_model.safetensors` holding `lora_A`/`lora_B` of rank 8 for
`q_proj` and `v_proj` of both layers, random from a fixed seed (~34 kB, float32), written with
torch and safetensors (no `peft` needed). The weights are large beside the base model's
(initializer range 0.02), so greedy text with the adapter differs from the base model's.
Same bytes on every run.
"""

import json
import os
import sys

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

# The seed of the first draw (of a handful tried) whose greedy text on the suite's prompts is printable
# and differs from the base model's: other draws answer bytes that decode to nothing, or newlines.
SEED = 3
RANK = 8
ALPHA = 16
# The tiny model's shape (make_model.py): hidden size 128 = 4 heads x 32, 2 layers.
HIDDEN = 128
LAYERS = 2
TARGETS = ["q_proj", "v_proj"]
# Standard deviation of A and B: their product, scaled by ALPHA / RANK, has entries around
# 2 * sqrt(8) * 0.1 * 0.1 ~ 0.06, above the base weights' 0.02 (0.15 and more make every
# prompt's answer one repeated byte, often not valid UTF-8, i.e. empty text).
STD = 0.1


def adapter_weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    weights = {}
    for layer in range(LAYERS):
        for target in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            a = torch.randn(RANK, HIDDEN, generator=generator) * STD
            b = torch.randn(HIDDEN, RANK, generator=generator) * STD
            weights[f"{prefix}.lora_A.weight"] = a.contiguous()
            weights[f"{prefix}.lora_B.weight"] = b.contiguous()
    return weights


def adapter_config() -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "pinroute-tiny-llama",
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": TARGETS,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_adapter.py OUTPUT_DIR")
    output = sys.argv[1]
    os.makedirs(output, exist_ok=True)
    weights = adapter_weights()
    save_file(weights, os.path.join(output, "adapter_model.safetensors"))
    with open(os.path.join(output, "adapter_config.json"), "w") as f:
        json.dump(adapter_config(), f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote a rank-{RANK} adapter of {len(weights)} tensors to {output}")


if __name__ == "__main__":
    main()

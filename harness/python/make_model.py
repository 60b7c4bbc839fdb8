"""Writes a tiny random-weight Llama model and its tokenizer into a folder, deterministically.

Usage: python make_model.py OUTPUT_DIR

No model hub is reachable from the machines pinroute is tested on, so the model vLLM serves in
the real-engine suite is made here: 2 layers, hidden size 128, 4 heads (head dim 32), bf16
safetensors (~1 MB), random weights from a fixed seed; a byte-level BPE tokenizer trained on a
few sentences (so any text encodes) with a minimal chat template. Same bytes on every run.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

SEED = 20261130
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A prefill worker computes the KV cache of the prompt; a decode worker generates tokens.",
    "Envoy routes each request to the worker that the client pinned, or to a healthy one.",
    "Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump!",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" @ # $ % ^ & _ | ~",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def make_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(vocab_size: int, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py OUTPUT_DIR")
    output = sys.argv[1]
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), tokenizer)
    model.save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)
    print(f"wrote a {model.num_parameters()}-parameter model to {output}")


if __name__ == "__main__":
    main()

"""Offline byte-level tokenizer and tiny seeded random causal LMs for tests and demos."""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

NUM_BYTES = 256
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<pad>", "<s>", "</s>"
PAD_ID, BOS_ID, EOS_ID = NUM_BYTES, NUM_BYTES + 1, NUM_BYTES + 2

# Renders "User: ...\nAssistant: ...</s>\n" turns; the generation prompt is "Assistant: ".
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}"
    "{%- if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ 'Assistant: ' }}{% endif -%}"
)

_ARCHS: dict[str, tuple[type, type]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map (the ByteLevel alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(NUM_BYTES):
        if b not in chars:
            chars[b] = chr(NUM_BYTES + extra)
            extra += 1
    return chars


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Deterministic byte-level tokenizer: ids 0..255 are bytes, then <pad>=256, <s>=257, </s>=258."""
    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([PAD_TOKEN, BOS_TOKEN, EOS_TOKEN])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
        name_or_path="specbench/byte-tokenizer",
    )


def _perturb_norms(model: PreTrainedModel) -> None:
    """Give every norm weight a random non-unit value (uniform in [0.5, 1.5]).

    transformers initialises norm weights to exactly 1, and RMSNorm with weight 1 is nearly idempotent:
    a norm applied twice, or where it does not belong, would then change nothing a test can see.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)


def tiny_random_model(
    arch: str = "llama",
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 64,
    vocab_size: int = 320,
    intermediate_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    initializer_range: float = 0.2,
    **config_overrides: Any,
) -> PreTrainedModel:
    """A seeded random Llama or Qwen3 causal LM (eval mode, float32) matching :func:`byte_tokenizer`.

    ``vocab_size`` defaults to 320 > 259 tokenizer tokens: an intentionally padded LM head whose padded
    rows are zero (logit 0, like untrained padding: some probability mass, practically never the
    argmax). The large ``initializer_range`` makes next-token distributions peaked enough that greedy
    argmax is not decided by float noise. Norm weights are random and non-unit (:func:`_perturb_norms`).
    The global torch RNG state is left untouched.
    """
    if arch not in _ARCHS:
        raise ValueError(f"Unknown tiny model arch {arch!r}: expected one of {sorted(_ARCHS)}.")
    if vocab_size < EOS_ID + 1:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the byte tokenizer ({EOS_ID + 1} tokens).")
    config_cls, model_cls = _ARCHS[arch]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=1024,
        initializer_range=initializer_range,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
        **config_overrides,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
        _perturb_norms(model)
    with torch.no_grad():
        model.lm_head.weight[EOS_ID + 1 :].zero_()
    model.name_or_path = f"specbench/tiny-random-{arch}-L{num_layers}-H{hidden_size}-seed{seed}"
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    return model.eval()

"""Turning a prompt text into verifier input ids (chat template for chat models, else plain)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing transformers costs seconds; config checks import this module
    from transformers import PreTrainedTokenizerBase

PROMPT_FORMATS = ("auto", "chat", "plain")


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, mode: str = "auto") -> tuple[list[int], str]:
    """Token ids of ``text`` as one user turn plus the generation prompt, and the format used.

    ``mode="auto"`` uses the chat template when the tokenizer has one, else plain encoding (with the
    tokenizer's special tokens, e.g. BOS). Returns ``(ids, "chat" | "plain")``.
    """
    if mode not in PROMPT_FORMATS:
        raise ValueError(f"prompt format must be one of {list(PROMPT_FORMATS)}, got {mode!r}")
    use_chat = has_chat_template(tokenizer) if mode == "auto" else mode == "chat"
    if use_chat:
        if not has_chat_template(tokenizer):
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        # The template writes its own special tokens (BOS etc.), as HF's tokenize=True path does.
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"]), "chat"
    return list(tokenizer(text)["input_ids"]), "plain"

"""Prompts: the text given (`--prompt`, `--prompt-file`), the built-in ones the gate and the bench run, and their
tokens."""

from __future__ import annotations

from typing import Any

from specpair.errors import BadInput

# Built-in prompts: two of prose, two of code (the gate's concurrent batch is these four).
BUILTIN_PROMPTS = (
    ("prose", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
    ("prose", "Explain to a ten-year-old why the sky is blue and sunsets are red."),
    ("code", "Write a Python function that returns the n-th Fibonacci number, with a docstring and a unit test."),
    ("code", "Write a C function that reverses a singly linked list in place, and explain each step."),
)


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """The prompt from exactly one of `--prompt TEXT` and `--prompt-file FILE` (UTF-8)."""
    if (prompt is None) == (prompt_file is None):
        raise BadInput("--prompt", "give the prompt with exactly one of --prompt TEXT and --prompt-file FILE")
    if prompt is not None:
        return prompt
    try:
        with open(prompt_file, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadInput(prompt_file, f"cannot be read as UTF-8 text ({e.strerror or e})") from None
    try:  # decoded whole, so that a bad byte's offset is the file's; newlines as text mode reads them
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        raise BadInput(
            prompt_file, f"cannot be read as UTF-8 text ({e.reason}: byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


def encode_prompt(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """The prompt's token ids, wrapped in the model's chat template as a user message when `chat`."""
    wrapped = tokenizer.apply_chat_template([{"role": "user", "content": text}]) if chat else text
    ids = tokenizer.encode(wrapped, add_special_tokens=not chat)
    if not ids:
        raise BadInput("--prompt", "the prompt encodes to no tokens")
    return ids

"""Prompts: the text given (`--prompt`, `--prompt-file`), a file of them (`--prompts`), the built-in ones the gate
and the bench run, and their tokens."""

from __future__ import annotations

import json
import os
from typing import Any

from specpair.errors import BadInput

Messages = list[dict[str, Any]]  # a chat: [{"role": "user", "content": "..."}, ...]
Prompt = str | Messages
SHIPPED = "builtin"  # --prompts builtin: the set written for specpair (workload_prompts.jsonl)
SHIPPED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workload_prompts.jsonl")

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


def read_prompts(path: str, chat: bool | None = None) -> list[tuple[str, Prompt]]:
    """(name, prompt) of each prompt in `path` (`SHIPPED`: the set shipped with specpair): JSONL, a record a line
    with a `prompt` string or chat `messages` and an optional `category` (its name; else "line N"), or else plain
    text, a prompt a line. Blank lines are skipped; anything else malformed is a BadInput naming the line, and so
    are chat messages under `chat` False (--no-chat)."""
    where = SHIPPED_FILE if path == SHIPPED else path
    try:
        with open(where, "rb") as f:
            lines = f.read().decode("utf-8").splitlines()
    except OSError as e:
        raise BadInput(path, f"cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise BadInput(path, f"is not UTF-8 text ({e.reason} at byte {e.start})") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise BadInput(path, "holds no prompt (one a line, or JSONL records with a prompt or messages)")
    if not numbered[0][1].lstrip().startswith("{"):
        return [(f"line {n}", line) for n, line in numbered]
    records = [prompt_record(path, n, line) for n, line in numbered]
    chats = [n for (n, _), (_, prompt) in zip(numbered, records) if isinstance(prompt, list)]
    if chats and chat is False:
        raise BadInput(
            path, f"line {chats[0]}: holds chat messages: they need the target's chat template (not --no-chat)"
        )
    return records


def prompt_record(path: str, n: int, line: str) -> tuple[str, Prompt]:
    """One JSONL record: {"prompt": str} or {"messages": [{"role": str, "content": str}, ...]}, "category"."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadInput(path, f"line {n}: not JSON ({e.msg})") from None
    if not isinstance(record, dict) or ("prompt" in record) == ("messages" in record):
        raise BadInput(path, f"line {n}: a record needs exactly one of a `prompt` string and chat `messages`")
    name = record.get("category", f"line {n}")
    if not isinstance(name, str):
        raise BadInput(path, f"line {n}: `category` is not a string")
    if "prompt" in record:
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise BadInput(path, f"line {n}: `prompt` is not a non-empty string")
        return name, record["prompt"]
    messages = record["messages"]
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise BadInput(path, f"line {n}: `messages` is not a list of {{role, content}} strings")
    return name, messages


def prompt_text(prompt: Prompt) -> str:
    """The prompt as text: itself, or a chat as its JSON (what a report hashes)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, sort_keys=True)


TEMPLATE_KWARGS = "--chat-template-kwargs"


def template_kwargs(text: str | None) -> dict[str, Any]:
    """--chat-template-kwargs JSON: the variables the chat template is rendered with (enable_thinking, ...), a JSON
    object as vLLM and SGLang take it; {} when not given."""
    if text is None:
        return {}
    try:
        variables = json.loads(text)
    except json.JSONDecodeError as e:
        example = '{"enable_thinking": false}'
        raise BadInput(TEMPLATE_KWARGS, f"is not JSON ({e.msg}): give an object such as '{example}'") from None
    if not isinstance(variables, dict):
        raise BadInput(TEMPLATE_KWARGS, f"is a JSON {type(variables).__name__}, not an object of variables")
    return variables


def encode_prompt(
    tokenizer: Any, prompt: Prompt, chat: bool, where: str = "--prompt", variables: dict[str, Any] | None = None
) -> list[int]:
    """The prompt's token ids, wrapped in the model's chat template (as a user message, or the chat it is) when
    `chat`, rendered with `variables` (template_kwargs)."""
    if isinstance(prompt, list) and not chat:
        raise BadInput(where, "holds chat messages: they need the target's chat template (not --no-chat)")
    if variables and not chat:
        raise BadInput(TEMPLATE_KWARGS, "reach the chat template only, and these prompts go in as raw text")
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    wrapped = tokenizer.apply_chat_template(messages, **(variables or {})) if chat else prompt
    ids = tokenizer.encode(wrapped, add_special_tokens=not chat)
    if not ids:
        raise BadInput(where, "the prompt encodes to no tokens")
    return ids


def chat_by_default(tokenizer: Any, chat: bool | None) -> bool:
    """--chat/--no-chat as given; by default the chat template when the target has one (as llama.cpp's
    conversation mode does): an instruct model given raw text often stops at once, and a gate on no tokens
    proves nothing."""
    return bool(tokenizer.chat_template) if chat is None else chat

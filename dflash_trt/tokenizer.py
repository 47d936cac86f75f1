"""Tokenizers from a model folder: tokenizer.json (+ tokenizer_config.json / chat template).

Loaded with `trust_remote_code=False` and `local_files_only=True`: no hub, no checkpoint code.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dflash_trt.errors import CheckpointError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def has_tokenizer(folder: str | Path) -> bool:
    return (Path(folder) / "tokenizer.json").is_file()


def load_tokenizer(folder: str | Path):
    """A transformers fast tokenizer from `folder`; `CheckpointError` if it has none."""
    folder = Path(folder)
    if not has_tokenizer(folder):
        raise CheckpointError(f"{folder}: no tokenizer.json (pass token ids with --prompt-ids instead)")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder}: cannot load tokenizer ({exc})") from None


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of `text`, wrapped in the chat template (one user turn) when `chat`."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise CheckpointError("the tokenizer has no chat template; drop --chat")
        return encode_chat(tokenizer, [{"role": "user", "content": text}])
    return tokenizer.encode(text, add_special_tokens=True)


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat through the tokenizer's chat template, ready for the assistant's turn."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def stop_token_ids(tokenizer, config_eos: tuple[int, ...]) -> frozenset[int]:
    """EOS ids from config.json plus the tokenizer's own eos token."""
    ids = set(config_eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)

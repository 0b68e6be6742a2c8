"""The reference models' chat layout (Qwen style: ``<|im_start|>role\\n ... <|im_end|>\\n``) and reserved tokens.

Why here and not with the tokenizer: the built-in prompt sets (``corpus``, ``workloads``) format text with it,
and they serve the CLI and the live driver without the ``[engine]`` extra.
"""

from __future__ import annotations

from typing import Iterable

PAD_TOKEN = "<|endoftext|>"  # document separator and padding (as in Qwen)
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of a chat turn; the generation EOS
EOS_TOKEN = IM_END
MASK_TOKEN = "<|mask|>"  # the drafter's block filler; never in training text
SYSTEM_ROLE, USER_ROLE, ASSISTANT_ROLE = "system", "user", "assistant"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END, MASK_TOKEN)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def format_chat(messages: Iterable[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """Python twin of :data:`CHAT_TEMPLATE` (used to build training text without jinja)."""
    out = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    if add_generation_prompt:
        out += f"{IM_START}{ASSISTANT_ROLE}\n"
    return out

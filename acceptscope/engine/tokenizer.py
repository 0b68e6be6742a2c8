"""The reference engine's byte-level BPE tokenizer, trained by our own code with the ``tokenizers`` library.

Saved as a ``PreTrainedTokenizerFast`` directory (``tokenizer.json`` + ``tokenizer_config.json`` +
``special_tokens_map.json``) so that ``AutoTokenizer.from_pretrained(dir)`` loads it offline.
Chat formatting follows the Qwen layout (``<|im_start|>role\\n ... <|im_end|>\\n``); the drafter's mask
token is a reserved special token that never occurs in training text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

__all__ = [
    "SPECIAL_TOKENS",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "MASK_TOKEN",
    "IM_START",
    "IM_END",
    "CHAT_TEMPLATE",
    "train_tokenizer",
    "load_tokenizer",
    "format_chat",
    "special_token_ids",
]

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


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, out_dir: str | Path | None = None) -> Any:
    """Train a byte-level BPE on ``texts``; return a ``PreTrainedTokenizerFast`` (saved to ``out_dir``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        additional_special_tokens=[IM_START],
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def load_tokenizer(path: str | Path) -> Any:
    """Load the tokenizer saved next to a model, offline."""
    from transformers import AutoTokenizer

    p = Path(path)
    if not (p / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{p}: no tokenizer.json")
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    """ids of the reserved tokens: pad/document separator, im_start, im_end (eos), mask."""
    ids = {name: tokenizer.convert_tokens_to_ids(t) for name, t in
           (("pad", PAD_TOKEN), ("im_start", IM_START), ("eos", IM_END), ("mask", MASK_TOKEN))}
    unk = getattr(tokenizer, "unk_token_id", None)
    for name, i in ids.items():
        if i is None or (unk is not None and i == unk):
            raise ValueError(f"tokenizer lacks the special token for {name!r}")
    return ids

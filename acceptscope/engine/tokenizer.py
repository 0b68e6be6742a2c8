"""The reference engine's byte-level BPE tokenizer, trained by our own code with the ``tokenizers`` library.

Saved as a ``PreTrainedTokenizerFast`` directory (``tokenizer.json`` + ``tokenizer_config.json`` +
``special_tokens_map.json``) so that ``AutoTokenizer.from_pretrained(dir)`` loads it offline.
The chat layout and the reserved tokens (the drafter's mask token never occurs in training text) are
``acceptscope.domain.chat``: the torch-free prompt sets format text with them too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from acceptscope.domain.chat import CHAT_TEMPLATE, EOS_TOKEN, IM_END, IM_START, MASK_TOKEN, PAD_TOKEN, SPECIAL_TOKENS

__all__ = ["train_tokenizer", "load_tokenizer", "special_token_ids"]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, out_dir: str | Path | None = None) -> Any:
    """Train a byte-level BPE on ``texts``; return a ``PreTrainedTokenizerFast`` (saved to ``out_dir``)."""
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

"""The msgspec fast decoder must agree with Arrow's JSON reader, or decline (None).

`fast_decode.decode_records` is the hot path of /server_info ingest; when it
declines, `server_info_arrow.read_records` (and then the exact per-record path)
takes over. A silent disagreement would corrupt telemetry, so every mutated
record is checked against the reference reader.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acceptscope.ingest import fast_decode, server_info_arrow, synth


def _lines(records: list[dict]) -> list[bytes]:
    return [json.dumps(r).encode() for r in records]


def _both(lines: list[bytes]):
    return fast_decode.decode_records(lines), server_info_arrow.read_records(lines)


@pytest.mark.parametrize("mode", ["cap-accept", "compact", "static"])
def test_agrees_with_arrow_reader_on_sglang_shaped_records(mode):
    records = synth.make_records(n_steps=20, gamma=7, bs=8, mode=mode, seed=3)
    fast, ref = _both(_lines(records))
    assert fast is not None, "regular SGLang records must take the fast path"
    assert ref is not None
    assert fast.equals(ref.cast(fast.schema)), "fast decoder disagrees with Arrow's reader"


_MUTATIONS = {
    "whitespace": lambda s: s.replace(",", " ,\n ").replace(":", " : "),
    "exponent_float": lambda s: re.sub(r"(\d+\.\d+)", r"\1e0", s, count=1),
    "null_confidence": lambda s: s.replace('"confidence": [', '"confidence": null, "x": [', 1),
    "empty_drafts": lambda s: s.replace('"draft_tokens": [', '"draft_tokens": [], "y": [', 1),
    "string_int": lambda s: s.replace('"bs": ', '"bs": "', 1).replace(', "mode"', '", "mode"', 1),
    "huge_int": lambda s: s.replace('"forward_ct": ', '"forward_ct": 99999999999999999999', 1),
    "nested_list": lambda s: s.replace('"survival": [', '"survival": [[', 1).replace("]}", "]]}", 1),
}


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    mutation=st.sampled_from(sorted(_MUTATIONS)),
    which=st.integers(0, 5),
)
def test_mutated_records_agree_or_decline(seed, mutation, which):
    records = synth.make_records(n_steps=6, gamma=5, bs=4, seed=seed)
    lines = _lines(records)
    lines[which] = _MUTATIONS[mutation](lines[which].decode()).encode()
    fast, ref = _both(lines)
    if fast is None:
        return  # declined: the reference reader (or the exact path) handles it
    assert ref is not None, f"{mutation}: fast decoder accepted what Arrow's reader rejects"
    assert fast.equals(ref.cast(fast.schema)), f"{mutation}: fast decoder disagrees with Arrow's reader"

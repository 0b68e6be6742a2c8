"""The fast path's decoder must agree with a plain reference decode, or decline (None).

``server_info_records.CHUNK_DECODER`` + ``server_info_columns.records_table`` are the hot path of /server_info
ingest; when they decline, the exact per-record path takes over. A silent disagreement would
corrupt telemetry, so every mutated record is checked against the reference: Python's json, SGLang's
declared defaults filled in, and Arrow's type-checked conversion into the same schema.
"""

from __future__ import annotations

import json
import re

import msgspec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acceptscope.ingest import synth
from acceptscope.ingest.server_info_records import CHUNK_DECODER as _dec_chunk
from acceptscope.ingest.server_info_columns import RECORD_SCHEMA, records_table
from tests._close import assert_close


def _lines(records: list[dict]) -> list[bytes]:
    return [json.dumps(r).encode() for r in records]


def _reference(lines: list[bytes]):
    """RECORD_SCHEMA table of the records as json + Arrow read them (defaults filled), None when either refuses."""
    rows = []
    for ln in lines:
        r = json.loads(ln)
        full = {k: v for k, v in synth._DEFAULTS.items()}
        full.update(r)
        rows.append(full)
    try:
        return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return None


def _both(lines: list[bytes]):
    try:
        fast = records_table(_dec_chunk.decode(b"[" + b",".join(lines) + b"]"))
    except (msgspec.DecodeError, msgspec.ValidationError):
        fast = None
    return fast, _reference(lines)


@pytest.mark.parametrize("mode", ["cap-accept", "compact", "static"])
def test_agrees_with_reference_on_sglang_shaped_records(mode):
    records = synth.make_records(n_steps=20, gamma=7, bs=8, mode=mode, seed=3)
    fast, ref = _both(_lines(records))
    assert fast is not None, "regular SGLang records must take the fast path"
    assert ref is not None
    assert_close(fast, ref, where="fast decoder disagrees with the reference")


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
        return  # declined: the exact path handles it
    assert ref is not None, f"{mutation}: fast decoder accepted what the reference rejects"
    assert_close(fast, ref, where=f"{mutation}: fast decoder disagrees with the reference")


@pytest.mark.parametrize(
    "texts, value_type, want",
    [
        ([b"[1,2]", b"[]", b"[30]"], pa.int64(), [[1, 2], [], [30]]),
        ([b"[1, 2]", b"[ 3 ]", b"[\n4,5\n]"], pa.int64(), [[1, 2], [3], [4, 5]]),  # pretty-printed
        ([b"[1e-05,0.5]", None, b"[2E+1, 0]"], pa.float64(), [[1e-05, 0.5], None, [20.0, 0.0]]),
        ([b"[0.25]", b"[7]"], pa.float64(), [[0.25], [7.0]]),  # an int is a valid float
        ([b"[1e3]"], pa.int64(), None),  # an exponent is not an int
        ([b"[1.5]"], pa.int64(), None),
        ([b"[1,null]"], pa.int64(), None),
        ([b'["1"]'], pa.int64(), None),
        ([b"[true]"], pa.float64(), None),
        ([b"[[1]]"], pa.int64(), None),
        ([b"[3,-5]"], pa.int64(), None),  # declined (a negative value is invalid here: the exact path names it)
    ],
)
def test_parse_number_lists_parses_or_declines(texts, value_type, want):
    """Compact arrays go through the fast tokenizer, spaced ones through the general one; the rest is declined."""
    from acceptscope.ingest.server_info_columns import parse_number_lists

    got = parse_number_lists(texts, value_type)
    if want is None:
        assert got is None
    else:
        assert got is not None and got.type == pa.list_(value_type)
        assert_close(got.to_pylist(), want)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.one_of(st.none(), st.lists(st.integers(-5, 2**40), max_size=6)),
        min_size=1, max_size=12,
    ),
    floats=st.booleans(),
    spaced=st.booleans(),
)
def test_parse_number_lists_matches_msgspec(rows, floats, spaced):
    """The in-place compact tokenizer (and the spaced fallback) give msgspec's values, or decline.

    Declines only where a value is negative (the exact path names it); empty lists and NULL rows
    anywhere, first and last included, must parse.
    """
    import msgspec

    from acceptscope.ingest.server_info_columns import parse_number_lists

    vt = pa.float64() if floats else pa.int64()
    vals = [None if r is None else [x / 8 if floats else x for x in r] for r in rows]
    enc = (lambda v: json.dumps(v).encode()) if spaced else msgspec.json.encode
    texts = [None if v is None else enc(v) for v in vals]
    got = parse_number_lists(texts, vt)
    negative = any(x < 0 for v in vals if v for x in v)
    if negative:
        if got is not None:
            assert_close(got.to_pylist(), vals)
        return
    assert got is not None, texts
    assert got.type == pa.list_(vt)
    assert_close(got.to_pylist(), vals)

"""Equality for test results that carry floats: floats within a tolerance, everything else exact.

Why: a float computed on another CPU, BLAS build or thread count may differ in its last bits
(issue 31: lstsq output differed by <= 2.5e-15 relative on a fresh machine), so an exact float
comparison tests the machine, not the code. One helper holds every such comparison in tests/.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

RTOL = 1e-9
ATOL = 1e-12


def close(a: float, b: float, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """Two floats agree (NaN equals NaN; infinities must match exactly)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= atol + rtol * abs(b)


def assert_close(got: Any, want: Any, rtol: float = RTOL, atol: float = ATOL, where: str = "value") -> None:
    """Assert got equals want, floats (anywhere inside tables, frames, arrays, dicts, lists) to rtol/atol."""
    if isinstance(want, (pa.Table, pa.RecordBatch)):
        assert isinstance(got, (pa.Table, pa.RecordBatch)), f"{where}: {type(got).__name__} is not an Arrow table"
        assert got.schema.names == want.schema.names, f"{where}: columns {got.schema.names} != {want.schema.names}"
        assert got.num_rows == want.num_rows, f"{where}: {got.num_rows} rows != {want.num_rows}"
        for name in want.schema.names:
            _arrow_column(got.column(name), want.column(name), rtol, atol, f"{where}.{name}")
        return
    if isinstance(want, pd.DataFrame):
        assert isinstance(got, pd.DataFrame), f"{where}: {type(got).__name__} is not a DataFrame"
        assert list(got.columns) == list(want.columns), f"{where}: columns {list(got.columns)} != {list(want.columns)}"
        assert len(got) == len(want), f"{where}: {len(got)} rows != {len(want)}"
        assert got.index.equals(want.index), f"{where}: index differs"
        for name in want.columns:
            assert_close(got[name], want[name], rtol, atol, f"{where}.{name}")
        return
    if isinstance(want, pd.Series):
        assert isinstance(got, pd.Series) and len(got) == len(want), f"{where}: not a Series of {len(want)}"
        if want.dtype.kind == "f" or got.dtype.kind == "f":
            _floats(got.to_numpy(float, na_value=np.nan), want.to_numpy(float, na_value=np.nan), rtol, atol, where)
        elif want.dtype == object or got.dtype == object:
            assert_close(got.tolist(), want.tolist(), rtol, atol, where)
        else:
            assert got.reset_index(drop=True).equals(want.reset_index(drop=True)), f"{where}: values differ"
        return
    if isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
        g, w = np.asarray(got), np.asarray(want)
        assert g.shape == w.shape, f"{where}: shape {g.shape} != {w.shape}"
        if g.dtype.kind in "fc" or w.dtype.kind in "fc":
            _floats(g.astype(float), w.astype(float), rtol, atol, where)
        elif g.dtype == object or w.dtype == object:
            assert_close(g.tolist(), w.tolist(), rtol, atol, where)
        else:
            assert np.array_equal(g, w), f"{where}: values differ"
        return
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{where}: keys {sorted(map(str, got))} != " \
                                                                f"{sorted(map(str, want))}"
        for k in want:
            assert_close(got[k], want[k], rtol, atol, f"{where}[{k!r}]")
        return
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{where}: length differs"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, rtol, atol, f"{where}[{i}]")
        return
    if isinstance(want, (float, np.floating)) and isinstance(got, (int, float, np.integer, np.floating)) \
            and not isinstance(got, bool):
        assert close(float(got), float(want), rtol, atol), f"{where}: {got!r} != {want!r} (rtol {rtol})"
        return
    if _missing(got) or _missing(want):
        assert _missing(got) and _missing(want), f"{where}: {got!r} != {want!r}"
        return
    assert got == want, f"{where}: {got!r} != {want!r}"


def _missing(x: Any) -> bool:
    """None, pandas' NA / NaT, or a float NaN: a missing value, equal only to another missing value."""
    return x is None or x is pd.NA or x is pd.NaT or (isinstance(x, (float, np.floating)) and math.isnan(x))


def assert_json_close(got_text: str, want_text: str, rtol: float = RTOL, atol: float = ATOL,
                      where: str = "json") -> None:
    """Two JSON documents agree, their floats to rtol/atol (not their bytes)."""
    assert_close(json.loads(got_text), json.loads(want_text), rtol, atol, where)


def _floats(g: np.ndarray, w: np.ndarray, rtol: float, atol: float, where: str) -> None:
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True, err_msg=where)


def _arrow_column(g: pa.ChunkedArray, w: pa.ChunkedArray, rtol: float, atol: float, where: str) -> None:
    """Floats (and lists of floats) within tolerance; any other type exactly, nulls in the same places."""
    g, w = g.combine_chunks(), w.combine_chunks()
    assert g.type == w.type, f"{where}: type {g.type} != {w.type}"
    assert np.array_equal(g.is_null().to_numpy(zero_copy_only=False), w.is_null().to_numpy(zero_copy_only=False)), \
        f"{where}: nulls differ"
    t = w.type
    if pa.types.is_floating(t):
        _floats(g.fill_null(0).to_numpy(zero_copy_only=False).astype(float),
                w.fill_null(0).to_numpy(zero_copy_only=False).astype(float), rtol, atol, where)
    elif (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
            and pa.types.is_floating(t.value_type):
        assert g.value_lengths().equals(w.value_lengths()), f"{where}: list lengths differ"
        _arrow_column(pa.chunked_array([g.flatten()]), pa.chunked_array([w.flatten()]), rtol, atol, f"{where}[]")
    else:
        assert g.equals(w), f"{where}: values differ"

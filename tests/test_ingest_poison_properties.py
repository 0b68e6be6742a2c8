"""Hypothesis: a poisoned value anywhere in a real artifact costs at most the unit that holds it.

For every parser, a site (``"key": <scalar>``) of a real SGLang-produced artifact takes one
poisoned JSON value (bench/support/poison_values.py: ints past int64, lone surrogates, nesting past the
recursion limit, NaN/Infinity, wrong types). The parse must not raise, the rows lost must not
exceed those of the line / ring record / response / document holding the site, a loss must come
with a reject, and every reject must be storable text naming its field. bench/fuzz.py runs the
same check over >= 10k cases per parser.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.support.poison_values import CASE_SPECS, check, load_case, poison_text

_CASES: dict = {}


def _case(i: int):
    if i not in _CASES:
        _CASES[i] = load_case(*CASE_SPECS[i])
    return _CASES[i]


@pytest.mark.parametrize("i", range(len(CASE_SPECS)), ids=[f"{k}:{n}" for k, n, _ in CASE_SPECS])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=poison_text())
def test_poisoned_value_costs_at_most_its_unit(i, data, value):
    c = _case(i)
    site = data.draw(st.integers(min_value=0, max_value=len(c.sites) - 1), label="site")
    check(c, site, value)

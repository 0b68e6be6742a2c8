"""Poisoned JSON values (issue 11): what an attacker or a broken writer puts where a number or a
string belongs. Shared by the Hypothesis properties (tests/test_ingest_poison_properties.py) and
the fuzz benchmark (bench/fuzz.py), as JSON *text* so that values no Python encoder writes (lone
surrogate escapes, integers past any width, NaN tokens, nesting past the recursion limit) reach the
parsers exactly as they would from a file or a socket.
"""

from __future__ import annotations

import re

from hypothesis import strategies as st

# (name, JSON text)
FIXED: list[tuple[str, str]] = [
    ("int 2**63", str(2**63)),
    ("int 2**64", str(2**64)),
    ("int 2**70", str(2**70)),
    ("int -2**63-1", str(-(2**63) - 1)),
    ("int 2**31", str(2**31)),
    ("int 10**400", "1" + "0" * 400),
    ("lone surrogate", '"\\ud800"'),
    ("low surrogate", '"\\udfff"'),
    ("surrogate in text", '"req-\\ud83d-x"'),
    ("deep list 5000", "[" * 5000 + "]" * 5000),
    ("deep object 3000", '{"a":' * 3000 + "1" + "}" * 3000),
    ("deep 70", "[" * 70 + "1" + "]" * 70),
    ("NaN", "NaN"),
    ("Infinity", "Infinity"),
    ("-Infinity", "-Infinity"),
    ("1e400", "1e400"),
    ("null", "null"),
    ("true", "true"),
    ("empty string", '""'),
    ("empty object", "{}"),
    ("empty list", "[]"),
    ("string", '"x"'),
    ("negative", "-1"),
    ("float", "0.5"),
    ("script", '"<script>alert(1)</script>"'),
    ("long string", '"' + "a" * 100_000 + '"'),
]


def depth(n: int) -> str:
    return "[" * n + "]" * n


def poison_text() -> st.SearchStrategy[str]:
    """One poisoned JSON value (text)."""
    return st.one_of(
        st.sampled_from([t for _, t in FIXED]),
        st.integers(min_value=2**63, max_value=2**200).map(str),
        st.integers(min_value=-(2**200), max_value=-(2**63) - 1).map(str),
        st.integers(min_value=65, max_value=6000).map(depth),
        st.sampled_from(["\\ud800", "\\udbff", "\\udc00", "\\udfff"]).map(lambda s: f'"a{s}b"'),
    )


_VALUE = re.compile(r'("[A-Za-z_]+":\s*)(-?[0-9][0-9.eE+-]*|"[^"\\]*"|null|true|false)')


def value_sites(text: str) -> list[re.Match]:
    """Every ``"key": <scalar>`` of a JSON text (where one poisoned value can go)."""
    return list(_VALUE.finditer(text))


def replace_site(text: str, m: re.Match, value: str) -> str:
    return text[: m.start(2)] + value + text[m.end(2):]

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


# ---------------------------------------------------------------------------
# one parser, one real artifact, the units one poisoned value may cost
# ---------------------------------------------------------------------------
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable  # noqa: E402

from bench.support import SGLANG_FIXTURES  # noqa: E402

FIXTURES = SGLANG_FIXTURES
_META = {"runs", "gaps", "rejects"}


def _parse_fn(kind: str) -> Callable[[bytes], Any]:
    from acceptscope.ingest.estimator_jsonl import parse_estimator_jsonl
    from acceptscope.ingest.meta_info import parse_responses
    from acceptscope.ingest.server_info import ServerInfoIngestor
    from acceptscope.ingest.sps import parse_sps_table
    from acceptscope.ingest.sps_profile import parse_profile_records, parse_profile_rounds
    from acceptscope.ingest.sts_table import parse_sts_table

    src = f"fuzz.{kind}"
    return {
        "server_info": lambda b: ServerInfoIngestor("fuzz", source="file").feed_bytes(b, source=src, line=1),
        "estimator_jsonl": lambda b: parse_estimator_jsonl(b, source=src, run_id="fuzz", gamma=4),
        "responses": lambda b: parse_responses(b, source=src, run_id="fuzz"),
        "sps_profile_records": lambda b: parse_profile_records(b, source=src, run_id="fuzz"),
        "sps_profile_rounds": lambda b: parse_profile_rounds(b, source=src, run_id="fuzz"),
        "sps_table": lambda b: parse_sps_table(b, source=src, run_id="fuzz"),
        "sts_table": lambda b: parse_sts_table(b, source=src, run_id="fuzz"),
    }[kind]


@dataclass
class Case:
    """A real artifact and the value sites a poisoned value may take, each with the rows of its unit."""

    name: str
    kind: str
    text: str
    unit: str  # line | record | item | document
    sites: list = field(default_factory=list)  # re.Match of "key": <scalar>
    unit_rows: list = field(default_factory=list)  # rows of the unit holding each site (the most it may cost)
    baseline: int = 0  # data rows of the clean artifact

    def parse(self, text: str) -> tuple[int, int, Any]:
        """(data rows, rejects found, batch) of ``text``, converted to Arrow as the store would."""
        batch = _parse_fn(self.kind)(text.encode("utf-8", "surrogatepass"))
        batch.storable(f"fuzz.{self.kind}", "fuzz")
        rows = sum(n for t, n in batch.counts().items() if t not in _META)
        return rows, batch.rejects_total(), batch


CASE_SPECS = [
    # (parser, artifact, unit): the unit is what one poisoned value may cost
    ("server_info", "capacc.server_info.json", "record"),
    ("estimator_jsonl", "capacc.estimator.jsonl", "line"),
    ("responses", "capacc.generate.json", "item"),
    ("responses", "capacc.openai.jsonl", "line"),
    ("sps_profile_records", "spsprof.records.jsonl", "line"),
    ("sps_profile_rounds", "spsprof.rounds.jsonl", "line"),
    ("sps_table", "spsadd.sps_table.json", "document"),
    ("sts_table", "capacc.sts_calibration.json", "document"),
]


def load_case(kind: str, name: str, unit: str, max_records: int | None = None) -> Case:
    """``max_records``: keep the first records of each rank's ring only (a smaller dump, for the fuzz
    benchmark's 10k cases; written back with the fixture's own separators)."""
    text = (FIXTURES / name).read_text()
    if max_records is not None and kind == "server_info":
        import json

        doc = json.loads(text)
        for s in doc["internal_states"]:
            s["dspark_info_record"]["records"] = s["dspark_info_record"]["records"][:max_records]
        text = json.dumps(doc)
    c = Case(name, kind, text, unit)
    c.baseline = c.parse(text)[0]
    if unit == "line":
        starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
        spans = [(a, b) for a, b in zip(starts, starts[1:] + [len(text)])]
    elif unit == "record":  # ring records, located by their own text (payload headers are no record's)
        import json

        spans, pos = [], 0
        for st_ in json.loads(text)["internal_states"]:
            for rec in st_["dspark_info_record"]["records"]:
                piece = json.dumps(rec)
                a = text.index(piece, pos)
                spans.append((a, a + len(piece)))
                pos = a + len(piece)
    elif unit == "item":  # the responses of one JSON array
        marks = [m.start() for m in re.finditer(r'\{"text"', text)]
        spans = [(a, b) for a, b in zip(marks, marks[1:] + [len(text)])]
    else:
        spans = [(0, len(text))]
    rows_of: dict = {}
    for m in value_sites(text):
        span = next((s for s in spans if s[0] <= m.start() < s[1]), None)
        if span is None:  # a payload/state header field: its unit is (at most) the whole payload
            span = (0, len(text))
            rows_of[span] = c.baseline
        if span not in rows_of:
            piece = text[span[0]:span[1]]
            if unit == "line":
                rows_of[span] = c.parse(piece)[0]
            elif unit == "record":
                rows_of[span] = 1 + piece.count('"req_pool_index"')
            elif unit == "item":
                rows_of[span] = 1
            else:
                rows_of[span] = c.baseline
        c.sites.append(m)
        c.unit_rows.append(rows_of[span])
    return c


def check(c: Case, site: int, value: str) -> tuple[int, int]:
    """Poison site ``site`` of ``c`` with ``value``; assert the contract; returns (rows lost, rejects)."""
    m = c.sites[site]
    rows, rejects, batch = c.parse(replace_site(c.text, m, value))
    lost = c.baseline - rows
    assert lost <= c.unit_rows[site], (c.name, m.group(0)[:60], value[:40], lost, c.unit_rows[site])
    if lost > 0:
        assert rejects >= 1, (c.name, m.group(0)[:60], value[:40])
    for r in batch.rejects:  # every reject names where, and is storable text
        assert r["source"] and r["field"] and r["reason"]
        r["reason"].encode("utf-8")
        (r["raw"] or "").encode("utf-8")
    return lost, rejects

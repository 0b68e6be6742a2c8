"""SGLang block-accept estimator JSONL -> ``estimator_rows`` / ``estimator_gather`` / ``estimator_eos``.

Format (reference §5.6, written by ``BlockAcceptEstimateRecorder`` with
``json.dumps`` per line): row records ``{"rid","fct","w","cl","ct"}`` plus
``"trimmed_tokens","q_lp"`` when a block opened and ``"pg": [[block_fct,
offset, p_lp, trimmed_token, realized_token], ...]`` when pending blocks
advanced; and EOS markers ``{"rid", "eos_end": [block_fct, ...]}``.

gamma is not written: it is ``w + len(trimmed_tokens)`` on every opening row,
checked against the run's gamma (the server's, when its dumps were ingested), else against
the value most opening rows of the file agree on (never the first row's: one corrupt block
rejects itself only). ``json.dumps``
may write ``-Infinity`` for a target log-prob of an impossible token; that is a
legal ``p_lp`` (acceptance 0) and is kept, while NaN anywhere is rejected.
Smallest-unit rejects: a bad ``pg`` entry rejects that entry only; a bad row
field rejects the ``estimator_rows`` row but keeps its valid ``pg`` entries;
an unreadable line (or bad rid/fct) rejects the line.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import msgspec

from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.rejects import INT32_MAX, decode_failure, describe_number, find_poison, make_reject

_dec = msgspec.json.Decoder()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _loads(line: bytes) -> Any:
    try:
        return _dec.decode(line)
    except msgspec.DecodeError:
        return json.loads(line)  # accepts NaN / Infinity written by json.dumps


class EstimatorIngestor:
    """Incremental parser of one estimator JSONL file (the live tailer feeds it new lines).

    Keeps the line counter, the file's gamma (the run's when given, else the first
    opening row's) and the keys seen, so duplicates across feeds are rejected too.
    """

    def __init__(self, run_id: str, source: str, gamma: Optional[int] = None):
        self.run_id = run_id
        self.source = source
        self.gamma = gamma
        self.gamma_src = "run" if gamma is not None else "file"
        self.line = 0
        self.seen_rows: set[tuple[str, int]] = set()
        self.seen_pg: set[tuple[str, int, int]] = set()
        self.seen_eos: set[tuple[str, int]] = set()

    def feed_lines(self, lines, *, infer_gamma: bool = True) -> IngestBatch:
        """Parse complete lines (str or bytes, without or with the trailing newline)."""
        batch = IngestBatch()
        if self.gamma is None and infer_gamma:
            lines = list(lines)
            self.gamma = _lines_gamma(lines)
            self.gamma_src = "file (most opening rows)"
        # one line at a time (no list of decoded lines): a file of a million bad lines stays small
        for raw in lines:
            self.line += 1
            if isinstance(raw, str):
                raw = raw.encode()
            if not raw.strip():
                continue
            try:
                o = _loads(raw)
            except (ValueError, UnicodeDecodeError, RecursionError) as e:
                batch.reject(make_reject(self.source, self.line, "$", decode_failure(e).replace("JSON", "JSON line", 1),
                                         raw, self.run_id))
                continue
            poison = find_poison(o)  # a value no column can hold rejects its line alone
            if poison is not None:
                batch.reject(make_reject(self.source, self.line, *poison, raw, self.run_id))
                continue
            self._one(self.line, o, raw, batch)
        return batch

    def _one(self, line: int, o: Any, raw: bytes, batch: IngestBatch) -> None:
        source, run_id = self.source, self.run_id
        rej = lambda f, why: batch.reject(make_reject(source, line, f, why, raw, run_id))  # noqa: E731
        if not isinstance(o, dict):
            rej("$", f"expected a JSON object, got {type(o).__name__}")
            return
        rid = o.get("rid")
        if not isinstance(rid, str) or not rid:
            rej("rid", f"expected a non-empty string, got {rid!r}")
            return
        if "eos_end" in o:
            ends = o["eos_end"]
            if not isinstance(ends, list):
                rej("eos_end", f"expected a list, got {ends!r}")
                return
            for k, b in enumerate(ends):
                if not _is_int(b) or b < 0:
                    rej(f"eos_end[{k}]", f"expected a non-negative int, got {b!r}")
                elif (rid, b) in self.seen_eos:
                    rej(f"eos_end[{k}]", f"duplicate EOS marker for block ({rid!r}, {b})")
                else:
                    self.seen_eos.add((rid, b))
                    batch.add("estimator_eos", {"run_id": run_id, "rid": rid, "block_fct": b})
            return
        fct = o.get("fct")
        if not _is_int(fct) or fct < 0:
            rej("fct", f"expected a non-negative int, got {fct!r}")
            return
        row_problem = _check_row(o, self.gamma, self.gamma_src)
        if row_problem is None and (rid, fct) in self.seen_rows:
            row_problem = ("fct", f"duplicate row record for ({rid!r}, fct={fct})")
        if row_problem is not None:
            rej(*row_problem)
        else:
            self.seen_rows.add((rid, fct))
            tt = o.get("trimmed_tokens")
            batch.add("estimator_rows", {
                "run_id": run_id, "rid": rid, "fct": fct, "w": o["w"], "cl": o["cl"], "ct": o["ct"],
                "trimmed_tokens": tt, "q_lp": [float(x) for x in o["q_lp"]] if tt is not None else None,
                "source_line": line,
            })
        pg = o.get("pg")
        if pg is None:
            return
        if not isinstance(pg, list):
            rej("pg", f"expected a list, got {type(pg).__name__}")
            return
        for k, e in enumerate(pg):
            prob = _check_pg(e, fct, self.gamma)
            if prob is not None:
                rej(f"pg[{k}]" + prob[0], prob[1])
                continue
            key = (rid, e[0], e[1])
            if key in self.seen_pg:
                rej(f"pg[{k}]", f"duplicate gather entry for block ({rid!r}, {e[0]}) offset {e[1]}")
                continue
            self.seen_pg.add(key)
            batch.add("estimator_gather", {
                "run_id": run_id, "rid": rid, "block_fct": e[0], "offset": e[1], "row_fct": fct,
                "p_lp": float(e[2]), "trimmed_token": e[3], "realized_token": e[4],
            })


def _majority_gamma(objs) -> Optional[int]:
    """The gamma most opening rows agree on (``w + len(trimmed_tokens)``): one corrupt block can
    only reject itself, never set the file's gamma and take the good rows down with it."""
    votes: Counter = Counter()
    for o in objs:
        if isinstance(o, dict) and _is_int(o.get("w")) and o["w"] >= 0 and isinstance(o.get("trimmed_tokens"), list) \
                and o["trimmed_tokens"]:
            votes[o["w"] + len(o["trimmed_tokens"])] += 1
    return votes.most_common(1)[0][0] if votes else None


def file_gamma(data: bytes) -> Optional[int]:
    """gamma of an estimator file ingested without its run's: the value most opening rows agree on."""
    return _lines_gamma(_iter_lines(data))


def _iter_lines(data: bytes):
    """The lines of ``data`` one at a time (no list of a million bytes objects); no empty last line."""
    start, n = 0, len(data)
    while start < n:
        nl = data.find(b"\n", start)
        if nl < 0:
            yield data[start:]
            return
        yield data[start:nl]
        start = nl + 1


def _lines_gamma(lines) -> Optional[int]:
    """The gamma most opening rows of ``lines`` agree on; rows with a poisoned value have no vote."""
    def opening_rows():
        for raw in lines:
            if isinstance(raw, str):
                raw = raw.encode("utf-8", "surrogatepass")
            if b'"trimmed_tokens"' not in raw:
                continue
            try:
                o = _loads(raw)
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            if isinstance(o, dict) and _is_int(o.get("w")) and o["w"] <= INT32_MAX and find_poison(o) is None:
                yield o

    return _majority_gamma(opening_rows())


def parse_estimator_jsonl(
    data: bytes,
    *,
    source: str,
    run_id: str,
    gamma: Optional[int] = None,
) -> IngestBatch:
    """Parse a whole estimator JSONL file. ``gamma``: the run's gamma when known."""
    ing = EstimatorIngestor(run_id, source, gamma)
    if gamma is None:
        ing.gamma, ing.gamma_src = file_gamma(data), "file (most opening rows)"
    return ing.feed_lines(_iter_lines(data), infer_gamma=False)  # (file_gamma already looked at every line)


def _check_row(o: dict, gamma: Optional[int], gamma_src: str) -> Optional[tuple[str, str]]:
    for f in ("w", "cl", "ct"):
        v = o.get(f)
        if not _is_int(v):
            return f, f"expected an int, got {v!r}"
        if v < 0:
            return f, f"negative ({v})"
        if v > INT32_MAX:
            return f, f"{v} too large (int32)"
    w, cl, ct = o["w"], o["cl"], o["ct"]
    if cl > w:
        return "cl", f"{cl} > window w={w}"
    if gamma is not None and w > gamma:
        return "w", f"{w} > gamma {gamma} ({gamma_src})"
    if gamma is not None and cl + ct > gamma:
        return "ct", f"cl+ct = {cl + ct} > gamma {gamma} ({gamma_src})"
    tt, q = o.get("trimmed_tokens"), o.get("q_lp")
    if (tt is None) != (q is None):
        return ("q_lp" if q is None else "trimmed_tokens"), "trimmed_tokens and q_lp must come together"
    if tt is None:
        return None
    if not isinstance(tt, list) or not tt:
        return "trimmed_tokens", f"expected a non-empty list, got {tt!r}"
    if not isinstance(q, list):
        return "q_lp", f"expected a list, got {q!r}"
    if cl != w:
        return "trimmed_tokens", f"a block opens only when cl == w (cl={cl}, w={w})"
    g = w + len(tt)
    if gamma is not None and g != gamma:
        return "trimmed_tokens", f"gamma mismatch: w + len(trimmed_tokens) = {g} != {gamma_src} gamma {gamma}"
    if len(q) != len(tt):
        return "q_lp", f"length {len(q)} != len(trimmed_tokens) {len(tt)}"
    for k, t in enumerate(tt):
        if not _is_int(t) or t < 0:
            return f"trimmed_tokens[{k}]", f"expected a token id, got {t!r}"
    for k, v in enumerate(q):
        if not _is_num(v) or not math.isfinite(v):
            return f"q_lp[{k}]", describe_number(v) if _is_num(v) else f"expected a number, got {v!r}"
        if v > 1e-4:
            return f"q_lp[{k}]", f"log-probability {v!r} > 0"
    return None


def _check_pg(e: Any, fct: int, gamma: Optional[int]) -> Optional[tuple[str, str]]:
    if not isinstance(e, list) or len(e) != 5:
        return "", f"expected [block_fct, offset, p_lp, trimmed_token, realized_token], got {e!r}"
    b, off, p, tt, rt = e
    if not _is_int(b) or b < 0:
        return "[0]", f"block_fct: expected a non-negative int, got {b!r}"
    if b > fct:
        return "[0]", f"block_fct {b} > the carrying row's fct {fct}"
    if not _is_int(off) or off < 1 or off > INT32_MAX:
        return "[1]", f"offset: expected an int >= 1, got {off!r}"
    if gamma is not None and off > gamma:
        return "[1]", f"offset {off} > gamma {gamma}"
    if not _is_num(p) or math.isnan(p) or p == math.inf:
        return "[2]", f"p_lp: {describe_number(p) if _is_num(p) else repr(p)}"
    if p > 1e-4:
        return "[2]", f"p_lp: log-probability {p!r} > 0"
    if not _is_int(tt) or tt < 0:
        return "[3]", f"trimmed_token: expected a token id, got {tt!r}"
    if not _is_int(rt) or rt < 0:
        return "[4]", f"realized_token: expected a token id, got {rt!r}"
    return None


def ingest_estimator_file(path: Path, *, run_id: str, gamma: Optional[int] = None) -> IngestBatch:
    return parse_estimator_jsonl(Path(path).read_bytes(), source=str(path), run_id=run_id, gamma=gamma)

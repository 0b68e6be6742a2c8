"""The shapes a /server_info payload takes, and what its payload header must hold, -> one State per rank.

Why apart from the ingestor's walk: a payload is a whole response (``internal_states[i].dspark_info_record``),
one state, or a bare dump, read either from the decoded skeleton (records raw: the fast path's document) or
from builtins (a dict payload, or a document only Python's lenient parser reads: the exact fallback's); a
corrupt header field (gamma, verify_num_draft_tokens, mode, components, simulate_acc_len) is rejected by
name and replaced by what the run already established, or costs its state alone.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import msgspec

from acceptscope import schema
from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.rejects import INT64_MAX, make_reject, safe_text
from acceptscope.ingest.server_info_records import ARG_KEYS, PAYLOAD_DECODER, State, null_raw

__all__ = ["PayloadReader", "PayloadRejected", "SlowPath", "KNOWN_COMPONENTS"]

_MAX_GAMMA = 1024  # far above any draft block SGLang runs; a larger one is a corrupt header, not a setting
_EMPTY_STATES = "empty: no DP rank reported a DSpark dump (is this a DSpark server with SGLANG_DSPARK_DEBUG_DUMP set?)"
KNOWN_COMPONENTS = frozenset(
    {"core", "step_cpu_time", "step_gpu_time", "draft_gpu_time", "target_verify_gpu_time", "reqs"}
)


class PayloadReader:
    """Mixin of :class:`acceptscope.ingest.server_info.ServerInfoIngestor`: payloads -> States.

    Reads and sets the run's ``gamma`` and ``arm`` (what later payloads are checked against) and
    names rejects with ``run_id``.
    """

    run_id: str
    gamma: Optional[int]
    arm: Optional[str]

    # -- payload shapes -----------------------------------------------------
    def _states_from_obj(self, payload: Any, src: str, line: int, batch: IngestBatch):
        """States of a payload given as builtins (a dict, or a document only the lenient parser reads):
        the exact fallback's reading, every irregular shape rejected by field."""
        if not isinstance(payload, dict):
            batch.reject(make_reject(src, line, "$", f"expected a JSON object, got {type(payload).__name__}",
                                     payload, self.run_id))
            raise PayloadRejected
        top_args = {k: payload[k] for k in ARG_KEYS if k in payload}
        if "internal_states" in payload:
            sts = payload["internal_states"]
            if not isinstance(sts, list):
                batch.reject(make_reject(src, line, "internal_states", "expected a list", sts, self.run_id))
                raise PayloadRejected
            items = [(i, f"internal_states[{i}]", s) for i, s in enumerate(sts)]
            if not items:
                batch.reject(make_reject(src, line, "internal_states", _empty_states_reason(None), None, self.run_id))
                raise PayloadRejected
        elif "dspark_info_record" in payload:
            items = [(0, "", payload)]
        elif "records" in payload:
            items = [(0, "", {"dspark_info_record": payload})]
        else:
            batch.reject(make_reject(src, line, "$", "no internal_states / dspark_info_record in payload",
                                     _clip(payload), self.run_id))
            raise PayloadRejected
        states = []
        for i, prefix, s in items:
            if not isinstance(s, dict):
                batch.reject(make_reject(src, line, prefix or "$", "expected an object", s, self.run_id))
                continue
            dump = s.get("dspark_info_record")
            args = dict(top_args)
            args.update({k: s[k] for k in ARG_KEYS if k in s})
            st = self._make_state(i, prefix, dump, args, False, src, line, batch)
            if st is not None:
                states.append(st)
        return states, payload.get("startup_time")

    def _states_from_raw(self, top: Any, data: bytes, src: str, line: int, batch: IngestBatch,
                         chunked: Optional[dict] = None):
        """States of a decoded document (records raw; ``chunked``: the records arrays the stream
        scan cut out of it, by :class:`acceptscope.ingest.stream.Scan` key); raises SlowPath on
        anything irregular."""
        top_args = {k: getattr(top, k) for k in ARG_KEYS if getattr(top, k) is not None}
        if top.internal_states is not None:
            items = []
            for i, st in enumerate(top.internal_states):
                args = dict(top_args)
                args.update({k: getattr(st, k) for k in ARG_KEYS if getattr(st, k) is not None})
                items.append((i, f"internal_states[{i}]", st.dspark_info_record, args))
            if not items:
                batch.reject(make_reject(src, line, "internal_states", _empty_states_reason(data), None, self.run_id))
                raise PayloadRejected
        elif top.dspark_info_record is not None:
            items = [("top", "", top.dspark_info_record, top_args)]
        elif null_raw(top.records) is not None:
            try:
                items = [(None, "", PAYLOAD_DECODER.decode(data), top_args)]
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise SlowPath from None
        else:
            batch.reject(make_reject(src, line, "$", "no internal_states / dspark_info_record in payload",
                                     None, self.run_id))
            raise PayloadRejected
        states = []
        for key, prefix, dump, args in items:
            s = self._make_state(key if isinstance(key, int) else 0, prefix, dump, args, True, src, line, batch)
            if s is not None:
                if chunked and key in chunked:
                    s.records = chunked[key]
                states.append(s)
        return states

    def _make_state(self, i, prefix, dump, args, is_raw, src, line, batch) -> Optional[State]:
        """Validate a payload header; return a State or reject it (whole state)."""
        pfx = (prefix + ".") if prefix else ""
        rej = lambda f, why, raw=None: batch.reject(make_reject(src, line, pfx + f, why, raw, self.run_id))  # noqa: E731
        if dump is None:
            rej("dspark_info_record", "missing (DSpark info dump not enabled: set SGLANG_DSPARK_DEBUG_DUMP)")
            return None
        get = (lambda k: getattr(dump, k)) if is_raw else (lambda k: dump.get(k))
        if not is_raw and not isinstance(dump, dict):
            rej("dspark_info_record", "expected an object", dump)
            return None
        gamma, vndt, mode = get("gamma"), get("verify_num_draft_tokens"), get("mode")
        comps, records, sim = get("components"), get("records"), get("simulate_acc_len")
        # A corrupt payload-level field falls back to what the run (the server's other snapshots,
        # or the store) establishes; the field is rejected, the snapshot's records are kept.
        known = self.gamma
        vndt_ok = _is_int(vndt) and vndt >= 2
        if not _is_int(gamma) or not 1 <= gamma <= _MAX_GAMMA:  # (beyond: a corrupt header, e.g. 2**70)
            shown = _show(gamma)
            if known is None or (vndt_ok and vndt != known + 1):
                rej("gamma", f"expected a positive int up to {_MAX_GAMMA}, got {shown}")
                return None
            rej("gamma", f"expected a positive int up to {_MAX_GAMMA}, got {shown}: using the run's gamma {known}")
            gamma = known
        elif known is not None and gamma != known:
            if not (vndt_ok and vndt == known + 1):
                rej("gamma", f"gamma {gamma} != run {self.run_id!r} gamma {known}")
                return None
            rej("gamma", f"gamma {gamma} != run {self.run_id!r} gamma {known} (verify_num_draft_tokens "
                         f"{vndt} agrees with the run): using {known}")
            gamma = known
        if not _is_int(vndt) or vndt != gamma + 1:
            rej("verify_num_draft_tokens", f"{vndt!r} != gamma+1 ({gamma + 1})" +
                (": using gamma+1" if known is not None else ""))
            if known is None:
                return None
            vndt = gamma + 1
        if mode not in schema.ARMS:
            if self.arm is None:
                rej("mode", f"unknown mode {mode!r} (expected one of {list(schema.ARMS)})")
                return None
            rej("mode", f"unknown mode {mode!r} (expected one of {list(schema.ARMS)}): using the run's "
                        f"mode {self.arm!r}")
            mode = self.arm
        if self.arm is not None and mode != self.arm:
            rej("mode", f"mode {mode!r} != run {self.run_id!r} arm {self.arm!r}")
            return None
        if records is None:
            records = []
        if not isinstance(records, list):
            rej("records", f"expected a list, got {type(records).__name__}")
            return None
        comp_list: list[str] = []
        if comps is not None and not isinstance(comps, list):
            rej("components", f"expected a list, got {comps!r}")
        for k, c in enumerate(comps or []):
            if c not in KNOWN_COMPONENTS:
                rej(f"components[{k}]", f"unknown info-dump component {c!r} (known: {sorted(KNOWN_COMPONENTS)})")
            else:
                comp_list.append(c)
        if sim is not None and not (isinstance(sim, float) and math.isfinite(sim)
                                    or _is_int(sim) and abs(sim) <= INT64_MAX):  # (math.isfinite(10**400) raises)
            rej("simulate_acc_len", f"expected a number or null, got {safe_text(repr(sim))[:80]}"
                if not isinstance(sim, int) or abs(sim) <= INT64_MAX else "integer outside int64")
            sim = None
        self.gamma = gamma
        self.arm = mode
        return State(i, prefix, gamma, vndt, mode, comp_list, sim, args, records, is_raw)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _clip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: ("..." if isinstance(v, (list, dict)) else v) for k, v in list(obj.items())[:20]}
    return obj



def _show(v: Any) -> str:
    """repr of a header value for a reject; an int past int64 as such (its repr may not even exist)."""
    if _is_int(v) and abs(v) > INT64_MAX:
        return "an integer outside int64"
    try:
        return safe_text(repr(v))[:120]
    except (ValueError, RecursionError):
        return f"a {type(v).__name__}"


def _empty_states_reason(data: Optional[bytes]) -> str:
    why = _EMPTY_STATES
    if data is not None and data.count(b'"internal_states"') > 1:
        why += ("; the document repeats the top-level key 'internal_states' and JSON decoders keep the last "
                "(empty) one")
    return why


class PayloadRejected(Exception):
    """The payload is rejected whole (its reject is in the batch)."""


class SlowPath(Exception):
    """The decoded skeleton is irregular: read the document with the lenient parser instead."""

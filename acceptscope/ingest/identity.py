"""Which server wrote an artifact: run identity from ``/server_info``, not from file names.

A run is one SGLang server: the launch fields its ``/server_info`` reports (model and draft
paths, random seed, parallel sizes, host and port, the STS and SPS tables it names) plus the
verify mode of its DSpark dump. Its ``startup_time`` is not part of the identity: a restart
of the same server is a new *epoch* of the same run (the ingestor numbers them). Two servers
that differ in any launch field (the compact arm and the cap-accept audit arm on two ports,
two replicas) are two runs.

Artifacts that carry no server identity (the block-accept estimator JSONL, STS shards,
client responses) join a server run by :func:`assign_runs`: the one ``--run-id`` names; else
the server whose dump shares their file-name stem in the same directory; else the one server
in their directory; else the one server of the whole ingest. Otherwise their stem names the
run and the ingest summary says why.

Example::

    >>> doc = b'{"model_path": "/m/Qwen3-8B", "port": 30000, "startup_time": 5.0,'
    >>> doc += b' "internal_states": [{"dspark_info_record": {"mode": "compact", "gamma": 6, "records": []}}]}'
    >>> ident = identity_from_bytes(doc)
    >>> ident.mode, ident.gamma, ident.startup_time
    ('compact', 6, 5.0)
    >>> ident.run_id().startswith("sglang-compact-Qwen3-8B-")
    True
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import msgspec

from acceptscope import schema
from acceptscope.ingest import stream
from acceptscope.ingest.detect import run_id_for
from acceptscope.ingest.kinds import SERVER_SIDE

# launch fields that tell servers apart (all are resolved server args in /server_info)
IDENTITY_ARGS = (
    "model_path",
    "speculative_draft_model_path",
    "random_seed",
    "tp_size",
    "dp_size",
    "pp_size",
    "ep_size",
    "enable_dp_attention",
    "host",
    "port",
    "speculative_dspark_confidence_sts_path",
    "speculative_dspark_sps_table_path",
)
# artifact kinds that carry no server identity and belong to a server's run (the registry's)
SERVER_SIDE_KINDS = SERVER_SIDE


class _Dump(msgspec.Struct):
    mode: Any = None
    gamma: Any = None


_Args = [(k, Any, None) for k in IDENTITY_ARGS]
_State = msgspec.defstruct("_IdState", [("dspark_info_record", Optional[_Dump], None)] + _Args)
_Top = msgspec.defstruct(
    "_IdTop",
    [("internal_states", Optional[list[msgspec.Raw]], None), ("dspark_info_record", Optional[_Dump], None), ("startup_time", Any, None),
     ("mode", Any, None), ("gamma", Any, None)] + _Args,
)
_dec_top = msgspec.json.Decoder(_Top)
_dec_state = msgspec.json.Decoder(_State)


@dataclass(frozen=True)
class ServerIdentity:
    """The launch fields of one server (``args``), its verify mode, gamma and startup time."""

    args: tuple  # ((name, value), ...) of IDENTITY_ARGS present, JSON-encoded values
    mode: Optional[str]
    gamma: Optional[int]
    startup_time: Optional[float]
    fields: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def server_key(self) -> str:
        """The launch fields alone (no mode): what a document with a corrupt mode still shares."""
        return hashlib.sha256(json.dumps(self.args, sort_keys=True).encode()).hexdigest()

    def run_id(self, mode: Optional[str] = None) -> str:
        """``sglang-<mode>-<model name>-<8 hex>``: readable, and stable across polls and restarts."""
        mode = mode or self.mode or "unknown"
        h = hashlib.sha256((self.server_key + "\x00" + mode).encode()).hexdigest()[:8]
        model = Path(str(self.fields.get("model_path") or "model")).name or "model"
        model = re.sub(r"[^A-Za-z0-9._-]+", "_", model)[:40]
        return f"sglang-{mode}-{model}-{h}"


MAX_RUN_ID = 200  # characters: a run id names an export partition directory and is printed whole


def check_run_id(run_id: str) -> str:
    """``run_id`` when usable as a run id given by a user (``--run-id``), else ValueError in one line.

    Why: a 130 KB run id was accepted and then cost every later command (a report took 240 s and 1.5 GB;
    an export could not name its partition directory)."""
    if not isinstance(run_id, str) or not run_id.strip():
        raise ValueError("run id must be a non-empty string")
    if len(run_id) > MAX_RUN_ID:
        raise ValueError(f"run id of {len(run_id):,} characters: at most {MAX_RUN_ID} ({run_id[:40]!r}...)")
    return run_id


def _valid_mode(v: Any) -> Optional[str]:
    return v if isinstance(v, str) and v in schema.ARMS else None


def _valid_gamma(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


# a JSON string token (escapes included), or a NaN / Infinity token outside strings
_POISON = re.compile(rb'"(?:[^"\\]++|\\.)*+"|(-?Infinity|NaN)')
_LONE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _defused(data: bytes) -> bytes:
    """``data`` with NaN / Infinity tokens as ``null`` and lone surrogate escapes as U+FFFD (invalid UTF-8
    replaced too): a poisoned value in one record must not hide the launch fields the document also
    holds (issue 30: the dump was filed under its file name, a second run). The records themselves are
    rejected by field when the ingestor reads them."""
    def one(m: re.Match) -> bytes:
        if m.group(1) is not None:
            return b"null"
        tok = m.group(0)
        return _LONE.sub(rb"\\ufffd", tok) if b"\\u" in tok else tok
    return _POISON.sub(one, data.decode("utf-8", "replace").encode("utf-8"))


def identity_from_bytes(data: bytes) -> Optional[ServerIdentity]:
    """The identity in one ``/server_info`` document; None when unreadable."""
    try:
        try:
            top = _dec_top.decode(data)
        except (msgspec.DecodeError, UnicodeDecodeError):
            top = _dec_top.decode(_defused(data))  # a NaN or a lone surrogate somewhere: read around it
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
        return None
    args: dict[str, Any] = {k: getattr(top, k) for k in IDENTITY_ARGS if getattr(top, k) is not None}
    modes, gammas = [], []
    dumps = []
    for raw in top.internal_states or []:
        try:
            st = _dec_state.decode(raw)  # records are skipped, not decoded
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue  # a malformed state: the ingestor rejects it with its field path
        for k in IDENTITY_ARGS:
            v = getattr(st, k)
            if v is not None and k not in args:
                args[k] = v
        dumps.append(st.dspark_info_record)
    dumps.append(top.dspark_info_record)
    for d in dumps:
        if d is not None:
            modes.append(_valid_mode(d.mode))
            gammas.append(_valid_gamma(d.gamma))
    modes.append(_valid_mode(top.mode))
    gammas.append(_valid_gamma(top.gamma))
    mode = _majority([m for m in modes if m is not None])
    gamma = _majority([g for g in gammas if g is not None])
    st = top.startup_time
    startup = float(st) if isinstance(st, (int, float)) and not isinstance(st, bool) and math.isfinite(st) else None
    try:
        enc = tuple(sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in args.items()))
    except (TypeError, ValueError):
        return None
    return ServerIdentity(enc, mode, gamma, startup, fields=dict(args))


def identity_of_file(path: Path) -> Optional[ServerIdentity]:
    """The identity of a dump's first document (the whole file, or the first of JSON lines), read through
    its skeleton (:func:`acceptscope.ingest.stream.scan`: the records are not held); a document the scan
    cannot cut is read whole."""
    try:
        _, doc = stream.first_document(path)
        sc = stream.scan(doc)
        return identity_from_bytes(sc.skeleton if sc is not None else doc.read_all())
    except (OSError, OverflowError, ValueError, RecursionError):  # (e.g. startup_time 10**400): no identity
        return None


def _majority(xs: list) -> Any:
    return Counter(xs).most_common(1)[0][0] if xs else None


@dataclass
class Assignment:
    """Run id per file, the server runs found, and why some files could not be placed."""

    run_of: dict[Path, str]
    servers: dict[str, ServerIdentity]  # run id -> identity (the first document seen of it)
    gamma: dict[str, int]  # run id -> gamma the server's documents establish (majority)
    startup: dict[Path, float]
    notes: list[str]


def assign_runs(kinds: list[tuple[Path, str]], run_id: Optional[str] = None) -> Assignment:
    """Group the files of one ingest into runs (see the module docstring)."""
    run_of: dict[Path, str] = {}
    servers: dict[str, ServerIdentity] = {}
    gamma_votes: dict[str, list] = defaultdict(list)
    startup: dict[Path, float] = {}
    notes: list[str] = []
    idents = {f: identity_of_file(f) for f, k in kinds if k == "server_info"}
    # a document whose mode is unreadable takes the mode its server's other documents agree on
    mode_by_server: dict[str, Counter] = defaultdict(Counter)
    for ident in idents.values():
        if ident is not None and ident.mode is not None:
            mode_by_server[ident.server_key][ident.mode] += 1
    for f, ident in idents.items():
        if ident is not None and ident.startup_time is not None:
            startup[f] = ident.startup_time
        if run_id is not None:
            run_of[f] = run_id
        elif ident is None or (not ident.args and ident.mode is None):
            run_of[f] = run_id_for(f)
            notes.append(f"{f}: no server launch fields readable: filed under run {run_of[f]!r} (its name)")
        else:
            mode = ident.mode
            if mode is None and len(mode_by_server[ident.server_key]) == 1:
                mode = next(iter(mode_by_server[ident.server_key]))
            run_of[f] = ident.run_id(mode)
            servers.setdefault(run_of[f], ident)
        if ident is not None and ident.gamma is not None:
            gamma_votes[run_of[f]].append(ident.gamma)
    server_runs_by_dir: dict[Path, set] = defaultdict(set)
    server_run_by_stem: dict[tuple[Path, str], set] = defaultdict(set)
    for f, r in run_of.items():
        server_runs_by_dir[f.parent].add(r)
        server_run_by_stem[(f.parent, run_id_for(f))].add(r)
    all_server_runs = set(run_of.values())
    for f, k in kinds:
        if f in run_of:
            continue
        if run_id is not None:
            run_of[f] = run_id
            continue
        if k not in SERVER_SIDE_KINDS:
            run_of[f] = run_id_for(f)  # tables and SPS profiles: keyed by content / their own profile run
            continue
        by_stem = server_run_by_stem.get((f.parent, run_id_for(f)), set())
        in_dir = server_runs_by_dir.get(f.parent, set())
        if len(by_stem) == 1:
            run_of[f] = next(iter(by_stem))
        elif len(in_dir) == 1:
            run_of[f] = next(iter(in_dir))
        elif len(all_server_runs) == 1:
            run_of[f] = next(iter(all_server_runs))
        else:
            run_of[f] = run_id_for(f)
            why = (f"{len(in_dir)} server runs in its directory" if in_dir else
                   f"{len(all_server_runs)} server runs in this ingest" if all_server_runs else
                   "no /server_info dump in this ingest")
            notes.append(f"{f}: carries no server identity and could not be placed ({why}): filed under run "
                         f"{run_of[f]!r}; pass --run-id to attach it to its server's run")
    gamma = {r: _majority(v) for r, v in gamma_votes.items() if v}
    return Assignment(run_of, servers, gamma, startup, notes)

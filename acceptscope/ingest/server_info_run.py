"""The ``runs`` row of an SGLang server run, from what its /server_info documents say about it."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Optional

from acceptscope import schema
from acceptscope.ingest.rejects import safe_text
from acceptscope.ingest.server_info_records import ARG_KEYS

__all__ = ["run_row_from_server_info", "run_row"]


def _started_at(startup_time: Any) -> Optional[datetime]:
    if isinstance(startup_time, (int, float)) and not isinstance(startup_time, bool):
        try:
            return datetime.fromtimestamp(float(startup_time), tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def run_row_from_server_info(
    run_id: str,
    payload: dict,
    server_args: Optional[dict] = None,
    *,
    source: str = "file",
    audit_group: Optional[str] = None,
) -> dict:
    """The ``runs`` row of an SGLang run from a /server_info response, one state, or a bare dump.

    arm = the dump's ``mode``; gamma = its ``gamma``; target/draft model come from the server args
    (``server_args`` overrides what the payload carries). The STS/SPS table paths the server names are
    recorded as names only (``config_json``): they are paths on the server's disk, never opened here
    (issue 30: a remote peer made us read a 2 GB local file); ``sts_hash`` / ``sps_hash`` are linked
    when the user ingests the table itself (:mod:`acceptscope.ingest.links`). Raises ValueError when the
    payload has no DSpark dump.
    """
    top = payload if isinstance(payload, dict) else {}
    state = top
    if isinstance(top.get("internal_states"), list):
        state = next((s for s in top["internal_states"] if isinstance(s, dict) and "dspark_info_record" in s), {})
    dump = state.get("dspark_info_record", state if "records" in state else None)
    if not isinstance(dump, dict):
        raise ValueError("payload has no dspark_info_record")
    args = {k: top[k] for k in ARG_KEYS if k in top}
    args.update({k: state[k] for k in ARG_KEYS if k in state})
    args.update(server_args or {})
    return run_row(
        run_id,
        mode=dump.get("mode"),
        gamma=dump.get("gamma"),
        vndt=dump.get("verify_num_draft_tokens"),
        components=dump.get("components") or [],
        simulate_acc_len=dump.get("simulate_acc_len"),
        args=args,
        startup_time=top.get("startup_time"),
        source=source,
        audit_group=audit_group,
    )


def run_row(run_id, *, mode, gamma, vndt, components, simulate_acc_len, args, startup_time, source,
             audit_group=None) -> dict:
    config = {
        "engine": "sglang",
        "mode": mode,
        "gamma": gamma,
        "verify_num_draft_tokens": vndt,
        "components": list(components),
        "simulate_acc_len": simulate_acc_len,
        "startup_time": startup_time,
        "server_args": {k: v for k, v in args.items() if v is not None},
    }
    args = {k: safe_text(v) if isinstance(v, str) else v for k, v in args.items()}
    return {
        "run_id": run_id,
        "arm": mode,
        "engine": "sglang",
        "gamma": gamma,
        "temperature": None,
        "target_model": args.get("model_path"),
        "draft_model": args.get("speculative_draft_model_path"),
        "sts_hash": None,  # linked from a table the user hands us, never from the path the server names
        "sps_hash": None,
        "started_at": _started_at(startup_time),
        "config_json": json.dumps(config, sort_keys=True, default=str),
        "source": source if source in schema.SOURCES else "file",
        "audit_group": audit_group,
        "role": schema.run_role(mode, audit_group),  # a served arm is production; cap-accept replays it (audit)
    }


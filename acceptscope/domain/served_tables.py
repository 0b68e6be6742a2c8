"""The STS and SPS tables a DSpark server says it loaded: its ``/server_info`` arguments, as a run records them.

Why here: ingest links a run to the tables by these names (:mod:`acceptscope.ingest.links`), and the
estimators say which table a run's confidences were computed with when the store lacks it; neither
should import the other's package for one rule.
"""

from __future__ import annotations

import json
from typing import Optional

# (runs column, SGLang server argument, the store's table, the table's kind)
TABLE_ARGS = (
    ("sts_hash", "speculative_dspark_confidence_sts_path", "sts_tables", "STS"),
    ("sps_hash", "speculative_dspark_sps_table_path", "sps_tables", "SPS"),
)


def named_tables(config_json: Optional[str]) -> dict[str, str]:
    """``{"sts_hash": path, "sps_hash": path}`` for the tables a run's server args name."""
    try:
        args = (json.loads(config_json or "{}") or {}).get("server_args") or {}
    except (TypeError, ValueError):
        return {}
    return {col: args[key] for col, key, _, _ in TABLE_ARGS if isinstance(args.get(key), str) and args[key]}

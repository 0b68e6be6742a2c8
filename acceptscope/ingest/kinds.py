"""The one registry of artifact kinds: how each is sniffed, in which order an ingest reads it, and
whether it carries a server's identity. :mod:`~acceptscope.ingest.detect` (sniffing),
:func:`acceptscope.ingest.ingest_paths` (order, readers), :mod:`~acceptscope.ingest.identity` (which
kinds join a server's run) and :mod:`~acceptscope.ingest.engines` read it; a new kind is one entry here
and its reader (``acceptscope.ingest`` refuses to import when a kind has none).

Why (issue 29): the kinds were listed three times (``detect.py``, ``_ORDER`` and an if-chain in
``ingest/__init__.py``, ``identity.py``), and a kind added to one list was silently missing from another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["ArtifactKind", "KINDS", "NAMES", "ORDER", "SERVER_SIDE", "ENGINE", "by_name", "kind_of_name",
           "kind_of_head"]


@dataclass(frozen=True)
class ArtifactKind:
    """One artifact kind.

    ``order``: when an ingest reads it (server dumps first: they create the ``runs`` rows the others are
    checked against). ``server_side``: it carries no server identity and joins its server's run.
    ``engine``: another engine's file (:mod:`acceptscope.ingest.engines`). ``suffixes`` / ``prefix``: a
    file name alone says the kind. ``keys``: else, any of these sets of quoted JSON keys in the first
    64 KiB of a ``.json`` / ``.jsonl`` / ``.ndjson`` file says it (kinds are tried in registry order).
    """

    name: str
    order: int
    server_side: bool = False
    engine: bool = False
    suffixes: tuple[str, ...] = ()
    prefix: Optional[str] = None
    keys: tuple[tuple[bytes, ...], ...] = ()

    def named(self, file_name: str) -> bool:
        if not self.suffixes or not file_name.endswith(self.suffixes):
            return False
        return self.prefix is None or file_name.startswith(self.prefix)

    def holds(self, head: bytes) -> bool:
        return any(all(k in head for k in alt) for alt in self.keys)


# registry order = sniffing precedence by content (the first kind whose keys match wins)
KINDS: tuple[ArtifactKind, ...] = (
    ArtifactKind("server_info", 0, keys=((b'"internal_states"',), (b'"dspark_info_record"',),
                                         (b'"verify_num_draft_tokens"', b'"records"'))),
    ArtifactKind("sps_profile_manifest", 6, suffixes=(".manifest.json",), keys=((b'"round_summaries"',),)),
    ArtifactKind("sps_profile_records", 8, suffixes=(".records.jsonl",), keys=((b'"step_time"', b'"dp_rank"'),)),
    ArtifactKind("sps_profile_rounds", 7, suffixes=(".rounds.jsonl",),
                 keys=((b'"steps_per_sec"', b'"batch_tokens"'),)),
    ArtifactKind("sps_table", 5, keys=((b'"sample_batch_tokens"',), (b'"bias_seconds"',))),
    ArtifactKind("sts_table", 4, keys=((b'"temperatures"',),)),
    ArtifactKind("estimator_jsonl", 2, server_side=True, keys=((b'"eos_end"',), (b'"rid"', b'"fct"'))),
    ArtifactKind("aiperf_profile_export", 9, engine=True, suffixes=("profile_export.jsonl",),
                 keys=((b'"spec_decode_steps"', b'"metadata"'),)),
    # vLLM response bodies with per-request spec-decode metrics (before ``responses``: a body is a response too)
    ArtifactKind("vllm_request_metrics", 9, engine=True,
                 keys=((b'"speculative_decoding"', b'"num_spec_steps"'),
                       (b'"speculative_decoding_stats"', b'"num_spec_steps"'))),
    # DSparkRaggedStats.summary() snapshots as JSON (a server log of them is sniffed by detect.py)
    ArtifactKind("trtllm_dspark_stats", 9, engine=True, keys=((b'"steps_no_windows"', b'"trim_regret_rate"'),)),
    ArtifactKind("responses", 1, server_side=True,
                 keys=((b'"meta_info"',), (b'"spec_tokens_details"',), (b'"sglext"',))),
    ArtifactKind("sts_shard", 3, server_side=True, suffixes=(".pt",)),
    ArtifactKind("trtllm_accept_stats", 9, engine=True, suffixes=(".json",), prefix="dflash_accept_stats_rank"),
    # a Prometheus text dump: its name is not enough (detect reads it for ``vllm:spec_decode_``)
    ArtifactKind("vllm_metrics", 9, engine=True),
)
NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
ORDER: dict[str, int] = {k.name: k.order for k in KINDS}
SERVER_SIDE: tuple[str, ...] = tuple(k.name for k in KINDS if k.server_side)
ENGINE: tuple[str, ...] = tuple(k.name for k in KINDS if k.engine)
LAST = max(ORDER.values()) + 1  # where a file of no known kind is read (it only makes a reject)
_BY_NAME = {k.name: k for k in KINDS}

# name rules are checked in this order (the .pt shard first: never read as text)
_NAME_ORDER = ("sts_shard", "sps_profile_manifest", "sps_profile_records", "sps_profile_rounds",
               "trtllm_accept_stats", "aiperf_profile_export")


def by_name(name: str) -> Optional[ArtifactKind]:
    return _BY_NAME.get(name)


def kind_of_name(file_name: str) -> Optional[str]:
    """The kind a file name alone says, or None."""
    for n in _NAME_ORDER:
        if _BY_NAME[n].named(file_name):
            return n
    return None


def kind_of_head(head: bytes) -> str:
    """The kind the first bytes of a JSON / JSONL file say (``unknown`` when none)."""
    for k in KINDS:
        if k.holds(head):
            return k.name
    return "unknown"

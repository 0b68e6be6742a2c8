"""Synthetic SGLang-format DSpark info dumps (for tests and the ingest benchmark).

Produces what ``GET /server_info`` returns in SGLang 0.5.23 — the same keys, the
same ``omit_defaults`` omissions, confidences rounded to 4 dp and survival as
the rounded float32 cumprod of the unrounded confidences — from a seeded toy
acceptance process. It is a format generator, not a model of any server: the
real recorders are exercised in tests/integration (the ``sglang`` tier).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

_DEFAULTS = {
    "bs": -1, "mode": "", "budget": None, "lag_steps": None, "num_running_reqs": -1,
    "num_verify_tokens": -1, "verify_tokens_local": -1, "verify_tokens_dp_synced": -1,
    "verify_tokens_graph_key": -1, "predicted_step_ms": None, "predicted_theta": None,
    "step_cpu_ms": None, "step_gpu_ms": None, "draft_gpu_ms": None, "target_verify_gpu_ms": None,
    "reqs": None,
}


def omit_defaults(record: dict) -> dict:
    """Drop fields equal to SGLang's declared defaults (what msgspec omit_defaults does)."""
    return {k: v for k, v in record.items() if k not in _DEFAULTS or v != _DEFAULTS[k]}


def make_records(
    *,
    n_steps: int,
    gamma: int = 7,
    bs: int = 32,
    mode: str = "cap-accept",
    seed: int = 0,
    first_fct: int = 1,
    rid_prefix: str = "r",
    with_rids: bool = True,
    components: tuple[str, ...] = ("core", "reqs", "step_cpu_time"),
) -> list[dict]:
    """``n_steps`` DecodeStepRecord dicts (builtins, defaults omitted) of one DP rank."""
    rng = np.random.default_rng(seed)
    out: list[dict] = []
    fct = first_fct
    # live requests: rid -> [pool slot, prefix_len, remaining steps]
    live: dict[str, list[int]] = {}
    next_rid = 0
    free_slots = list(range(bs * 4))
    for _ in range(n_steps):
        while len(live) < bs:
            live[f"{rid_prefix}{next_rid}"] = [free_slots.pop(0), int(rng.integers(16, 512)),
                                               int(rng.integers(8, 64))]
            next_rid += 1
        rids = list(live)[:bs]
        n = len(rids)
        p = rng.uniform(0.55, 0.97, size=(n, gamma))
        conf = rng.uniform(0.05, 0.999, size=(n, gamma)).astype(np.float32)
        surv = np.cumprod(conf, axis=1, dtype=np.float32)
        accept = rng.random((n, gamma)) < p
        raw_acc = np.where(accept.all(axis=1), gamma, np.argmin(accept, axis=1))
        if mode == "static":
            vlen = np.full(n, gamma + 1)
        else:
            vlen = 1 + (surv >= 0.3).sum(axis=1)
        window = vlen - 1
        cd = np.minimum(raw_acc, window)
        if mode == "cap-accept":
            ct = raw_acc - cd
        elif mode == "compact":
            ct = ((raw_acc > cd) & (rng.random(n) < 0.5)).astype(int)
        else:
            ct = np.zeros(n, dtype=int)
        drafts = rng.integers(0, 151_000, size=(n, gamma))
        reqs = []
        for i, rid in enumerate(rids):
            slot, prefix, _ = live[rid]
            c = int(cd[i])
            bonus = int(drafts[i, c]) if ct[i] > 0 else int(rng.integers(0, 151_000))
            d = {
                "req_pool_index": slot,
                "prefix_len": prefix,
                "verify_len": int(vlen[i]),
                "acc_len": c + 1,
                "correct_drafts": c,
                "cap_trim": int(ct[i]),
                "bonus_token": bonus,
                "draft_tokens": [int(t) for t in drafts[i]],
            }
            if with_rids:
                d["rid"] = rid
            if mode != "static":
                d["confidence"] = [round(float(x), 4) for x in conf[i]]
                d["survival"] = [round(float(x), 4) for x in surv[i]]
            reqs.append(d)
            live[rid][1] += c + 1
            live[rid][2] -= 1
        for rid in rids:
            if live[rid][2] <= 0:
                free_slots.append(live.pop(rid)[0])
        rec: dict = {"forward_ct": fct}
        if "core" in components:
            nvt = int(vlen.sum()) if mode != "static" else n * (gamma + 1)
            if mode == "compact":
                nvt = int(np.ceil(nvt / 64) * 64)
            rec.update({
                "bs": n, "mode": mode, "num_running_reqs": n, "num_verify_tokens": nvt,
                "verify_tokens_graph_key": nvt,
            })
            if mode != "static":
                rec.update({
                    "budget": int(window.sum()), "lag_steps": 2,
                    "verify_tokens_local": min(n + int(window.sum()), n * (gamma + 1)),
                    "predicted_step_ms": round(float(rng.uniform(8, 30)), 6),
                    "predicted_theta": round(float(rng.uniform(500, 5000)), 6),
                })
        if "step_cpu_time" in components and rng.random() < 0.7:
            rec["step_cpu_ms"] = round(float(rng.uniform(5, 40)), 4)
        if "reqs" in components:
            rec["reqs"] = reqs
        out.append(omit_defaults(rec))
        fct += 1 + (int(rng.integers(1, 4)) if rng.random() < 0.1 else 0)  # prefill passes in between
    return out


def make_payload(
    *,
    gamma: int = 7,
    mode: str = "cap-accept",
    components: tuple[str, ...] = ("core", "reqs", "step_cpu_time"),
    records: list[dict],
    simulate_acc_len: Optional[float] = None,
) -> dict:
    """One ``dspark_info_record`` payload (what ``dump_info_records`` returns)."""
    return {
        "mode": mode,
        "gamma": gamma,
        "verify_num_draft_tokens": gamma + 1,
        "components": sorted(components),
        "records": records,
        "simulate_acc_len": simulate_acc_len,
    }


def make_server_info(
    *,
    ranks: int = 2,
    n_steps: int = 100,
    gamma: int = 7,
    bs: int = 32,
    mode: str = "cap-accept",
    seed: int = 0,
    startup_time: float = 1_767_000_000.0,
    components: tuple[str, ...] = ("core", "reqs", "step_cpu_time"),
    with_rids: bool = True,
) -> dict:
    """A whole ``/server_info`` response with ``ranks`` DP states."""
    states = []
    for k in range(ranks):
        recs = make_records(n_steps=n_steps, gamma=gamma, bs=bs, mode=mode, seed=seed * 100 + k,
                            rid_prefix=f"d{k}-", with_rids=with_rids, components=components)
        states.append({
            "dp_rank_hint": None,
            "avg_spec_accept_length": 3.1,
            "dspark_info_record": make_payload(gamma=gamma, mode=mode, components=components, records=recs),
        })
    return {
        "model_path": "synthetic/target",
        "speculative_algorithm": "DSPARK",
        "speculative_draft_model_path": "synthetic/draft",
        "speculative_num_draft_tokens": gamma + 1,
        "dp_size": ranks,
        "startup_time": startup_time,
        "internal_states": states,
        "version": "0.5.23",
    }

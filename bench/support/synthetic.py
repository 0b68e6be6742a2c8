"""Synthetic telemetry for the store tests and benches.

Vectorised (numpy -> Arrow offsets) so that 300k ``request_steps`` rows build in
well under a second; the values follow the record model's semantics
(``window <= gamma``, ``acc_len = correct_drafts + 1``, ``ceiling >= correct``),
not real model output. ``python -m bench.support.synthetic writer|reader ...`` runs the child
processes of the crash-safety and concurrent-read tests.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from acceptscope import schema

WORKLOADS = ("chat", "code", "math", "summarize")


def _list_array(values: np.ndarray, gamma: int, arrow_type: pa.DataType) -> pa.Array:
    n = values.shape[0]
    offsets = pa.array(np.arange(0, (n + 1) * gamma, gamma, dtype=np.int32))
    flat = pa.array(values.reshape(-1), type=arrow_type.value_type)
    return pa.ListArray.from_arrays(offsets, flat, type=arrow_type)


def request_steps(
    n: int,
    *,
    gamma: int = 7,
    run_id: str = "run-a",
    ranks: int = 2,
    reqs_per_step: int = 8,
    start_forward_ct: int = 0,
    seed: int = 0,
) -> pa.Table:
    """``n`` request_steps rows: ``reqs_per_step`` requests per forward_ct, round-robin over ranks."""
    rng = np.random.default_rng(seed)
    i = np.arange(n, dtype=np.int64)
    step = start_forward_ct + i // reqs_per_step
    slot = (i % reqs_per_step).astype(np.int32)
    rank = (step % ranks).astype(np.int32)
    conf = rng.beta(4, 1.5, size=(n, gamma)).astype(np.float32)
    surv = np.cumprod(conf, axis=1).astype(np.float32)
    ceiling = np.minimum((rng.geometric(0.25, size=n) - 1), gamma).astype(np.int32)
    window = rng.integers(1, gamma + 1, size=n).astype(np.int32)
    correct = np.minimum(ceiling, window).astype(np.int32)
    tgt = np.log(rng.uniform(0.01, 1.0, size=(n, gamma))).astype(np.float32)
    cols = {
        "run_id": pa.array(np.full(n, run_id, dtype=object), pa.string()),
        "rank": pa.array(rank),
        "epoch": pa.array(np.zeros(n, dtype=np.int32)),
        "forward_ct": pa.array(step),
        "rid": pa.array(np.char.add("req-", (slot + 1000 * (step // 64)).astype(str)).astype(object), pa.string()),
        "req_pool_index": pa.array(slot),
        "step_index": pa.array((step % 64).astype(np.int32)),
        "prefix_len": pa.array((100 + 4 * (step % 64)).astype(np.int32)),
        "verify_len": pa.array(window + 1),
        "window": pa.array(window),
        "correct_drafts": pa.array(correct),
        "acc_len": pa.array(correct + 1),
        "cap_trim": pa.array(ceiling - correct),
        "bonus_token": pa.array(rng.integers(0, 150_000, size=n)),
        "draft_tokens": _list_array(rng.integers(0, 150_000, size=(n, gamma)), gamma, schema.I64_LIST),
        "confidence": _list_array(conf, gamma, schema.F32_LIST),
        "survival": _list_array(surv, gamma, schema.F32_LIST),
        "confidence_logit": _list_array(np.log(conf / (1 - conf + 1e-6)).astype(np.float32), gamma, schema.F32_LIST),
        "draft_logprob": _list_array(np.log(rng.uniform(0.05, 1.0, size=(n, gamma))).astype(np.float32), gamma, schema.F32_LIST),
        "target_logprob": _list_array(tgt, gamma, schema.F32_LIST),
        "committed_tokens": _list_array(rng.integers(0, 150_000, size=(n, 2)), 2, schema.I64_LIST),
        "ceiling": pa.array(ceiling),
        "temperature": pa.array(np.zeros(n)),
        "workload": pa.array(np.array(WORKLOADS, dtype=object)[step % len(WORKLOADS)], pa.string()),
        "finished": pa.array((step % 64) == 63),
    }
    return pa.table(cols).cast(schema.REQUEST_STEPS.arrow_schema)


def steps(n: int, *, run_id: str = "run-a", ranks: int = 2, start_forward_ct: int = 0) -> list[dict]:
    """``n`` steps rows as dicts (the row-dict input path)."""
    return [
        {
            "run_id": run_id,
            "rank": (start_forward_ct + k) % ranks,
            "epoch": 0,
            "forward_ct": start_forward_ct + k,
            "bs": 8,
            "mode": "compact",
            "step_gpu_ms": 10.0 + (k % 7),
            "wall_time_s": 0.01 * (start_forward_ct + k),
        }
        for k in range(n)
    ]


def run_row(run_id: str = "run-a", arm: str = "compact", gamma: int = 7) -> dict:
    return {"run_id": run_id, "arm": arm, "engine": "reference", "gamma": gamma, "temperature": 0.0, "source": "live"}


# ---------------------------------------------------------------------------
# child processes for the crash-safety and concurrent-read tests
# ---------------------------------------------------------------------------
CHUNK_ROWS = 400  # request_steps rows per source chunk (50 forward_cts x 8 requests)
CHUNK_STEPS = 50  # steps rows per source chunk


def source_chunk(k: int, run_id: str = "run-crash") -> tuple[pa.Table, list[dict]]:
    """Chunk ``k`` of a deterministic source: request_steps and steps of 50 forward_cts."""
    fct0 = k * CHUNK_STEPS
    rs = request_steps(CHUNK_ROWS, run_id=run_id, start_forward_ct=fct0, seed=k)
    st = steps(CHUNK_STEPS, run_id=run_id, start_forward_ct=fct0)
    return rs, st


def _log(fd: int, line: str) -> None:
    # os.write hands the bytes to the kernel: they survive a SIGKILL of this process.
    import os

    os.write(fd, (line + "\n").encode())


def child_writer(db: str, log_path: str, chunks: int, interval_s: float, flush_interval_s: float) -> None:
    """Stream ``chunks`` source chunks through a TelemetryWriter, logging appends and commits.

    Log lines: ``appended <rows>`` after each append of a chunk, ``committed <rows>
    <flush#> <latency>`` after each flush (from ``on_flush``), ``stats <json>`` at the end.
    """
    import json
    import os
    import time

    from acceptscope.store import Store

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    store = Store(db)

    def on_flush(info: dict) -> None:
        _log(fd, f"committed {info['rows_offered'].get('request_steps', 0)} {info['flush']} {info['duration_s']:.4f}")

    w = store.writer(flush_interval_s=flush_interval_s, on_flush=on_flush)
    _log(fd, "started")
    appended = 0
    t0 = time.monotonic()
    for k in range(chunks):
        rs, st = source_chunk(k)
        w.append_many({"request_steps": rs, "steps": st})  # a chunk's tables land in one flush
        appended += rs.num_rows
        _log(fd, f"appended {appended}")
        due = t0 + (k + 1) * interval_s
        time.sleep(max(0.0, due - time.monotonic()))
    w.close()
    _log(fd, "stats " + json.dumps(w.stats()))


def child_reader(db: str, out_path: str, done_path: str, expected: int, poll_s: float) -> None:
    """Poll ``counts``/``latest_forward_ct`` like a dashboard until the writer is done and all rows are seen."""
    import json
    import os
    import time

    from acceptscope.store import Store

    store = None
    polls: list[list] = []
    errors: list[str] = []
    t_end = time.monotonic() + 60
    while time.monotonic() < t_end:
        t = time.monotonic()
        try:
            if store is None:  # wait until the writer has created the file and its tables
                if not os.path.exists(db):
                    time.sleep(poll_s)
                    continue
                store = Store(db, read_only=True)
            with store.snapshot():  # one read-only connection for both queries
                n = store.counts("run-crash")["request_steps"]
                probe = store.latest_forward_ct("run-crash")
            polls.append([t, n, probe["forward_ct"], time.monotonic() - t])
        except Exception as e:  # noqa: BLE001 - recorded and asserted on by the test
            if store is None and "not an acceptscope store" in str(e):  # writer is creating tables
                time.sleep(poll_s)
                continue
            errors.append(f"{type(e).__name__}: {e}")
        if os.path.exists(done_path) and polls and polls[-1][1] >= expected:
            break
        time.sleep(max(0.0, poll_s - (time.monotonic() - t)))
    with open(out_path, "w") as f:
        json.dump({"polls": polls, "errors": errors, "lock": store.lock_stats.as_dict() if store else {}}, f)


if __name__ == "__main__":
    import sys

    cmd, *args = sys.argv[1:]
    if cmd == "writer":
        child_writer(args[0], args[1], int(args[2]), float(args[3]), float(args[4]))
    elif cmd == "reader":
        child_reader(args[0], args[1], args[2], int(args[3]), float(args[4]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")

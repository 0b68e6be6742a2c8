"""Live SGLang 0.5.23 DSpark: launch or attach, drive traffic, capture telemetry as it happens.

Modules
-------
* ``launcher``  -- arm command lines/environments as data (``ArmSpec``), SGLang's
  launch rules as clear errors, process management (own process group, logs,
  readiness wait, SIGTERM then SIGKILL), sglang/GPU preflight.
* ``driver``    -- the same prompts/seeds/sampling to every arm through ``/generate``
  (meta_info) or ``/v1/chat/completions`` (``sglext.spec_tokens_details``); hard
  caps on requests and time; optional loopback-only guard.
* ``poller``    -- ``/server_info`` polling through the ingest package's
  ``ServerInfoIngestor`` (watermarks, rank fingerprints, overflow / restart /
  clear-loss gaps), optional ring clearing right after a GET.
* ``tailer``    -- estimator JSONL (survives truncation on restart) and STS shard
  (``{stem}.{k}.pt``) tailing.
* ``sink``      -- bounded queue + one writer thread into the store (backpressure).
* ``prometheus_scrape`` -- ``sglang:spec_*`` gauges, kept in memory.
* ``exporter``  -- acceptscope's derived live metrics on a loopback Prometheus port.
* ``sps``       -- SGLang's SPS profiler as a subprocess (command as data) or our
  own sweep over HTTP into the ``sps_profile_*`` tables.
* ``session``   -- ``LiveCapture`` / ``capture`` for one arm and
  ``run_sglang_audit`` for the compact + cap-accept pair into one DuckDB.

What has and has not been run against a real SGLang GPU server
--------------------------------------------------------------
**Nothing in this package has been run against a real SGLang server or on a
GPU.** This machine has neither (sglang is not installed; no CUDA device).
What *has* run, in ``tests/test_live_*.py``:

* every HTTP path (poller, driver, tailers, metrics scrape, exporter, SPS sweep,
  attach/audit sessions, CLI) against ``tests/fake_sglang_server.py``, a real
  loopback HTTP server that simulates a DSpark engine and serves SGLang 0.5.23's
  formats as read from its source (``/server_info`` with ``internal_states`` and
  ``dspark_info_record`` under msgspec ``omit_defaults``, ``/set_internal_state``
  answering per-rank booleans, ``/generate`` meta_info spec_* keys, OpenAI
  ``sglext.spec_tokens_details``, ``sglang:spec_*`` Prometheus gauges, estimator
  JSONL lines and ``torch.save`` STS shards), including ring overflow, a server
  restart, ring clears racing with decode steps, and several DP ranks answering
  in shuffled order;
* the launcher's process management with a real subprocess (the fake server
  started through ``ServerProcess`` with an entry override), and its command
  lines/environments as data;
* payloads produced by SGLang 0.5.23's own recorders/serialisers on CPU
  (``fixtures/sglang/``: ``/server_info`` polls with ranks in arrival order,
  estimator JSONL, STS shards, ``/generate`` responses) served over loopback HTTP:
  the live poller/tailers yield exactly what the file ingest path yields;
* ``sglang`` tier (``.venv-sglang``, CPU): every arm's argv is accepted by SGLang's
  real ``ServerArgs`` CLI parser and every arm's env is read back correctly by
  SGLang's env readers (verify mode, info-dump components, estimator path,
  folded-proposal switch, STS collect path); SGLang's own ``dspark_sps_profiler
  fit`` rebuilds the same SPS table from the rounds file our sweep wrote;
* once, by hand (not a test): ``acceptscope.audit.run_audit(engine="sglang")``
  through :func:`run_audit` with ``ACCEPTSCOPE_SGLANG_URLS`` pointing at two fake
  servers (both arms captured, parity checked, report written).

Not verified: a real server start (model load, readiness timing, SGLang's
server-arg *resolution* hooks beyond the CLI parser, e.g. the compact + DP +
dense-draft refusal we mirror), real payload sizes near the 200 000-record ring,
SGLang's profiler ``run`` subcommand (it needs the full sglang runtime: in
``.venv-sglang`` it stops at missing ``tabulate`` / ``datasets``; only its command
line and its ``fit`` are tested), real DP-attention arrival orders, and token
parity between arms under real sampling kernels. ``--disable-cuda-graph`` is
deprecated in 0.5.23 (SGLang suggests ``--cuda-graph-backend-{decode,prefill}=disabled``)
but still accepted.
"""

from __future__ import annotations

import os
import random
from typing import Any, Sequence

__all__ = ["run_audit"]

# options the reference engine takes that have no meaning for a live server
_IGNORED = {"threads", "per_position"}


def _parse_urls(urls: Any) -> dict[str, str] | None:
    if urls is None:
        urls = os.environ.get("ACCEPTSCOPE_SGLANG_URLS")
    if not urls:
        return None
    if isinstance(urls, dict):
        return {str(k): str(v) for k, v in urls.items()}
    out = {}
    for item in str(urls).split(","):
        arm, sep, url = item.partition("=")
        if not sep:
            raise ValueError(f"urls item {item!r}: expected ARM=URL (e.g. compact=http://127.0.0.1:30000)")
        out[arm.strip()] = url.strip()
    return out


def run_audit(
    db: str,
    audit_group: str,
    arms: Sequence[str] = ("compact", "cap-accept"),
    workload: str = "mixed",
    audit_fraction: float = 1.0,
    sample_seed: int = 0,
    *,
    urls: Any = None,
    target: str | None = None,
    drafter: str | None = None,
    gamma: int | None = None,
    num_requests: int | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    max_running_requests: int | None = None,
    sts: str | None = None,
    sps: str | None = None,
    base_port: int = 30000,
    attn_dp_size: int | None = None,
    log_dir: str = "acceptscope-logs",
    api: str = "generate",
    concurrency: Sequence[int] = (16,),
    entry: Sequence[str] | None = None,
    ready_timeout_s: float = 900.0,
    capture_defaults: dict | None = None,
    **unknown: Any,
) -> dict[str, dict]:
    """``acceptscope audit --engine sglang``: run the arms on real SGLang servers into ``db``.

    Attach mode: ``urls`` = ``{"compact": URL, "cap-accept": URL}`` or the string
    ``"compact=URL,cap-accept=URL"`` (or env ``ACCEPTSCOPE_SGLANG_URLS``).
    Launch mode (no urls): ``target`` and ``drafter`` are required; the arms are
    launched one after the other on ``base_port``, ``base_port + 1`` ... with the
    telemetry env of ``launcher.audit_arms`` (estimator JSONL + STS shards under
    ``log_dir``). With ``audit_fraction < 1`` the audit arms (all but compact) get a
    seeded sample of the same prompts. Returns ``{arm: {"run_id": ..., ...summary}}``;
    run ids are ``f"{audit_group}-{arm}"``.
    """
    # lazy: these need the [live] extra (requests), and acceptscope.audit imports this package on every audit
    from acceptscope.live import launcher
    from acceptscope.live.driver import DriveConfig, load_prompts
    from acceptscope.live.session import run_sglang_audit

    bad = sorted(set(unknown) - _IGNORED)
    if bad:
        raise ValueError(f"run_audit (sglang): unknown option(s) {bad}")
    arms = list(arms)
    prompts = load_prompts(workload, num_requests or 240)
    arm_prompts = None
    if audit_fraction < 1:
        k = max(1, round(audit_fraction * len(prompts)))
        picked = sorted(random.Random(sample_seed).sample(range(len(prompts)), k))
        sample = [prompts[i] for i in picked]
        arm_prompts = {a: sample for a in arms if a != "compact"}
    drive = DriveConfig(base_url="http://127.0.0.1", run_id="", api=api, concurrency=tuple(concurrency),
                        max_new_tokens=max_new_tokens or 64, temperature=0.0 if temperature is None else temperature,
                        seed=seed or 0)
    url_map = _parse_urls(urls)
    if url_map is not None:
        missing = [a for a in arms if a not in url_map]
        if missing:
            raise ValueError(f"no URL for arm(s) {missing}; got {sorted(url_map)}")
        res = run_sglang_audit(db, prompts, urls={a: url_map[a] for a in arms}, drive=drive, audit_group=audit_group,
                               arm_prompts=arm_prompts, capture_defaults=capture_defaults)
    else:
        if not target:
            raise ValueError("--engine sglang needs running servers (urls / ACCEPTSCOPE_SGLANG_URLS) or --target/--drafter to launch")
        compact, cap = launcher.audit_arms(target, drafter, gamma or 7, out_dir=log_dir, base_port=base_port,
                                           sps_table_path=sps, sts_table_path=sts, attn_dp_size=attn_dp_size)
        specs = {"compact": compact, "cap-accept": cap}
        if "static" in arms:
            specs["static"] = launcher.ArmSpec(arm="static", target_model=target, draft_model=drafter, gamma=gamma or 7,
                                               port=base_port + 2, attn_dp_size=attn_dp_size)
        for s in specs.values():
            s.max_running_requests = max_running_requests
        res = run_sglang_audit(db, prompts, specs=[specs[a] for a in arms], drive=drive, log_dir=log_dir, entry=entry,
                               ready_timeout_s=ready_timeout_s, audit_group=audit_group, arm_prompts=arm_prompts,
                               capture_defaults=capture_defaults)
    return {arm: {"run_id": s.run_id, **s.as_dict()} for arm, s in res.arms.items()}

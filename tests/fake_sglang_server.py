"""A loopback HTTP server that speaks SGLang 0.5.23's DSpark surfaces, for tests.

Why: there is no GPU and no SGLang server here, yet the live poller, traffic
driver, tailers, exporter and launcher must be exercised over real HTTP. This
module simulates a DSpark engine (per-DP-rank decode steps with confidence,
capped acceptance and cap_trim) and serves its state in SGLang's formats:

* ``GET /server_info``: resolved server args + ``internal_states`` (one dict per
  DP rank, in arrival order, optionally shuffled) each carrying
  ``dspark_info_record`` = ``{mode, gamma, verify_num_draft_tokens, components,
  records, simulate_acc_len}``; records follow ``DecodeStepRecord``/``ReqDetail``
  with msgspec ``omit_defaults`` (fields equal to their default are absent) and
  the ring is a bounded deque (oldest silently dropped).
* ``POST /set_internal_state``: ``dspark_clear_info_records`` and
  ``dspark_force_budget_frac``; answers a list of per-rank booleans.
* ``POST /generate`` (single or batch, ``meta_info`` with the spec_* keys),
  ``POST /v1/chat/completions`` (``sglext.spec_tokens_details``), ``GET /metrics``
  (``sglang:spec_*`` gauges via prometheus_client), ``GET /health``,
  ``POST /abort_request``, ``POST /flush_cache``.
* Side files like SGLang's: the block-accept estimator JSONL
  (``SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH``, truncated at start) and STS
  shards ``{stem}.{k}.pt`` (``SGLANG_DSPARK_STS_COLLECT_PATH``).

Scripted scenarios for tests (``/_fake/*`` control endpoints): ``restart``
(forward_ct resets, rings cleared, estimator file truncated, shard counter
reset), ``pause``/``resume`` of the engine clock, ``step`` (advance N ticks).

Run as a script it accepts ``sglang.launch_server``-style arguments and the
SGLang env vars, so the launcher can start it as a stand-in for the real server.
It binds to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

INFO_COMPONENTS = ("core", "step_cpu_time", "step_gpu_time", "draft_gpu_time", "target_verify_gpu_time", "reqs")

# DecodeStepRecord defaults (msgspec omit_defaults drops fields equal to these).
_RECORD_DEFAULTS = {
    "bs": -1,
    "mode": "",
    "budget": None,
    "lag_steps": None,
    "num_running_reqs": -1,
    "num_verify_tokens": -1,
    "verify_tokens_local": -1,
    "verify_tokens_dp_synced": -1,
    "verify_tokens_graph_key": -1,
    "predicted_step_ms": None,
    "predicted_theta": None,
    "step_cpu_ms": None,
    "step_gpu_ms": None,
    "draft_gpu_ms": None,
    "target_verify_gpu_ms": None,
    "reqs": None,
}
_REQ_DEFAULTS = {"rid": None, "confidence": None, "survival": None}


def _omit_defaults(d: dict, defaults: dict) -> dict:
    return {k: v for k, v in d.items() if not (k in defaults and v == defaults[k] and type(v) is type(defaults[k]))}


@dataclass
class FakeConfig:
    """Knobs of the simulated server (defaults: one DP rank, gamma 4, cap-accept)."""

    mode: str = "cap-accept"
    gamma: int = 4
    dp_ranks: int = 1
    ring_size: int = 200_000
    tick_s: float = 0.002
    components: tuple[str, ...] = ("core", "reqs", "step_cpu_time")
    shuffle_ranks: bool = False
    seed: int = 0
    vocab: int = 1000
    eos_token_id: int = 2
    startup_delay_s: float = 0.0
    estimator_path: str = ""
    sts_stem: str = ""
    sts_flush_every: int = 256
    estimator_flush_every: int = 16
    enable_metrics: bool = True
    model_path: str = "fake/target"
    tokenizer_path: str | None = None
    draft_model_path: str = "fake/draft"
    sts_path: str | None = None
    sps_path: str | None = None
    port: int = 0
    max_running_requests: int = 48
    simulate_acc_len: float | None = None
    tp_size: int = 1
    attn_dp: bool = False
    step_cost_s_per_token: float = 0.0  # extra clock time per verify token (makes step time grow with load)
    # replay mode: serve payloads produced by SGLang's own serialisers (fixtures/sglang/) instead of the simulation
    replay_server_info: list | None = None  # successive /server_info bodies (the last one repeats)
    replay_generate: list | None = None  # native /generate responses, served round-robin


@dataclass
class _Req:
    rid: str
    rank: int
    pool_index: int
    prompt_tokens: int
    max_new_tokens: int
    temperature: float
    ignore_eos: bool
    base_accept: float
    seq_len: int
    created: float
    done: threading.Event = field(default_factory=threading.Event)
    output_ids: list = field(default_factory=list)
    finish_reason: dict | None = None
    verify_ct: int = 0
    num_correct: int = 0
    num_cap_tokens: int = 0
    num_block_accept: int = 0
    correct_hist: list = field(default_factory=list)
    cap_hist: list = field(default_factory=list)
    prefilled: bool = False
    pending_blocks: list = field(default_factory=list)  # estimator blocks


@dataclass
class _Rank:
    index: int
    forward_ct: int = 0
    ring: deque = field(default_factory=deque)
    active: list = field(default_factory=list)
    waiting: list = field(default_factory=list)
    free_slots: list = field(default_factory=list)
    last_decode_t: float | None = None
    prev_decode_was_step: bool = False
    history: deque = field(default_factory=lambda: deque(maxlen=64))  # recent (acc, verify_len, block, bs)
    verify_calls: int = 0


class FakeEngine:
    """The simulated DSpark scheduler: decode steps per DP rank, info-dump rings, side files."""

    def __init__(self, cfg: FakeConfig):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.lock = threading.RLock()
        self.startup_time = time.time()
        self.t0 = time.monotonic()
        self.force_frac: float | None = None
        self.paused = False
        self.restarts = 0
        self.ranks: list[_Rank] = []
        self.reqs: dict[str, _Req] = {}
        self._rr = 0
        self._est_lines: list[str] = []
        self._est_steps = 0
        self._sts_rows: list[tuple[list[float], list[float]]] = []
        self._sts_steps = 0
        self._sts_shard = 0
        self.last_tick_tokens = 0
        self._replay_i = 0
        self._replay_gen = 0
        self.est_written: list[list[str]] = [[]]  # flushed estimator lines, per incarnation
        self.sts_written: list[list[str]] = [[]]  # shard paths written, per incarnation
        self._reset_ranks()
        if cfg.estimator_path:
            os.makedirs(os.path.dirname(os.path.abspath(cfg.estimator_path)), exist_ok=True)
            open(cfg.estimator_path, "w").close()  # SGLang opens it with "w" at start

    # -- lifecycle -------------------------------------------------------
    def _reset_ranks(self) -> None:
        self.ranks = [
            _Rank(index=i, ring=deque(maxlen=self.cfg.ring_size), free_slots=list(range(self.cfg.max_running_requests)))
            for i in range(self.cfg.dp_ranks)
        ]

    def restart(self) -> None:
        """Simulate a process restart: counters, rings and side files start over."""
        with self.lock:
            for r in self.ranks:
                for q in r.active + r.waiting:
                    q.finish_reason = {"type": "abort", "message": "server restarted", "status_code": 503, "err_type": None}
                    q.done.set()
            self._reset_ranks()
            self.startup_time = time.time()
            self.restarts += 1
            self._est_lines.clear()
            self._est_steps = 0
            if self.cfg.estimator_path:
                open(self.cfg.estimator_path, "w").close()
            self.est_written.append([])
            self.sts_written.append([])
            self._sts_rows.clear()
            self._sts_steps = 0
            self._sts_shard = 0

    def ready(self) -> bool:
        return time.monotonic() - self.t0 >= self.cfg.startup_delay_s

    # -- requests -------------------------------------------------------
    def submit(self, prompt_tokens: int, sp: dict, rid: str | None) -> _Req:
        with self.lock:
            rank = self.ranks[self._rr % len(self.ranks)]
            self._rr += 1
            rid = rid or uuid.uuid4().hex
            seed = sp.get("sampling_seed")
            base = 0.55 + 0.4 * random.Random(hash((rid, seed)) & 0xFFFF).random()
            slot = rank.free_slots.pop(0) if rank.free_slots else self.rng.randrange(10_000)
            req = _Req(
                rid=rid,
                rank=rank.index,
                pool_index=slot,
                prompt_tokens=max(1, prompt_tokens),
                max_new_tokens=int(sp.get("max_new_tokens", 16)),
                temperature=float(sp.get("temperature", 1.0)),
                ignore_eos=bool(sp.get("ignore_eos", False)),
                base_accept=base,
                seq_len=max(1, prompt_tokens),
                created=time.monotonic(),
            )
            req.correct_hist = [0] * (self.cfg.gamma + 1)
            req.cap_hist = [0] * (self.cfg.gamma + 2)
            self.reqs[rid] = req
            rank.waiting.append(req)
            return req

    def abort_all(self) -> int:
        with self.lock:
            n = 0
            for r in self.ranks:
                for q in r.active + r.waiting:
                    self._finish(r, q, {"type": "abort", "message": "Abort all requests.", "status_code": None, "err_type": None})
                    n += 1
                r.active.clear()
                r.waiting.clear()
            return n

    # -- simulation -------------------------------------------------------
    def tick(self) -> None:
        with self.lock:
            if self.paused:
                return
            now = time.monotonic()
            self.last_tick_tokens = 0
            for r in self.ranks:
                if r.waiting:
                    # a prefill pass: forward_ct advances, no record; the CPU clock restarts
                    r.forward_ct += 1
                    r.active.extend(r.waiting)
                    for q in r.waiting:
                        q.prefilled = True
                        q.output_ids.append(self.rng.randrange(3, self.cfg.vocab))
                        q.seq_len += 1
                    r.waiting.clear()
                    r.last_decode_t = None
                    self._note_prefill()
                elif r.active:
                    self._decode_step(r, now)
            self._maybe_flush_sts()

    def _note_prefill(self) -> None:
        if self._est_lines:
            self._flush_estimator()

    def _decode_step(self, r: _Rank, now: float) -> None:
        cfg = self.cfg
        g = cfg.gamma
        r.forward_ct += 1
        fct = r.forward_ct
        reqs = list(r.active)
        bs = len(reqs)
        rows = []
        for q in reqs:
            conf = []
            for k in range(g):
                p = max(0.02, min(0.99, q.base_accept - 0.06 * k + self.rng.uniform(-0.08, 0.08)))
                conf.append(p)
            surv, acc = [], 1.0
            for c in conf:
                acc *= c
                surv.append(acc)
            raw = 0
            while raw < g and self.rng.random() < conf[raw] * 0.97 + 0.02:
                raw += 1
            rows.append((q, conf, surv, raw))
        # budget (lagged in SGLang; here from the current survival) and top-k allocation
        budget = None
        verify_lens = [g + 1] * bs
        if cfg.mode != "static":
            cands = sorted(((s, k, i) for i, (_, _, surv, _) in enumerate(rows) for k, s in enumerate(surv)), key=lambda t: (-t[0], t[1], t[2]))
            if self.force_frac is not None:
                budget = max(0, int(self.force_frac * bs * g))
            else:
                budget = sum(1 for s, _, _ in cands if s > 0.35)
            sel = [0] * bs
            for s, k, i in cands[:budget]:
                sel[i] += 1
            verify_lens = [min(g + 1, 1 + n) for n in sel]
        sum_vl = sum(verify_lens)
        if cfg.mode == "static":
            nvt = bs * (g + 1)
        elif cfg.mode == "cap-accept":
            nvt = sum_vl
        else:
            nvt = int(math.ceil(sum_vl / 8.0) * 8)
        step_cpu = None
        if r.last_decode_t is not None:
            gap = (now - r.last_decode_t) * 1000.0
            if 0 < gap <= 1000.0:
                step_cpu = round(gap, 4)
        r.last_decode_t = now
        details = []
        finished_now = []
        for i, (q, conf, surv, raw) in enumerate(rows):
            vl = verify_lens[i]
            w = vl - 1
            capped = min(raw, w)
            if cfg.mode == "cap-accept":
                trim = raw - capped
            elif cfg.mode == "compact":
                trim = 1 if raw > capped else 0
            else:
                trim = 0
            drafts = [self.rng.randrange(3, cfg.vocab) for _ in range(g)]
            bonus = drafts[capped] if (trim > 0 and capped < g) else self.rng.randrange(3, cfg.vocab)
            committed = drafts[:capped] + [bonus]
            prefix = q.seq_len
            d = {
                "req_pool_index": q.pool_index,
                "prefix_len": prefix,
                "verify_len": vl,
                "acc_len": capped + 1,
                "correct_drafts": capped,
                "cap_trim": trim,
                "bonus_token": bonus,
                "draft_tokens": drafts,
                "rid": q.rid,
            }
            if cfg.mode != "static":
                d["confidence"] = [round(c, 4) for c in conf]
                d["survival"] = [round(s, 4) for s in surv]
            details.append(_omit_defaults(d, _REQ_DEFAULTS))
            # estimator JSONL (TP rank 0 = DP rank 0 here; pure-temperature rows only)
            if cfg.estimator_path and r.index == 0 and q.temperature > 0:
                self._estimator_row(q, fct, prefix, w, capped, trim, drafts, committed)
            if cfg.sts_stem and cfg.mode != "static":
                logits = [math.log(c / (1 - c)) for c in conf]
                mask = [1.0 if k < raw else 0.0 for k in range(g)]
                self._sts_rows.append((logits, mask))
            # request bookkeeping
            q.seq_len += capped + 1
            q.verify_ct += 1
            q.num_correct += capped
            q.num_cap_tokens += vl
            q.num_block_accept += capped + 1 + trim
            q.correct_hist[capped] += 1
            q.cap_hist[vl] += 1
            r.history.append((capped + 1, vl, capped + 1 + trim, capped))
            r.verify_calls += 1
            for t in committed:
                if len(q.output_ids) >= q.max_new_tokens:
                    break
                q.output_ids.append(t)
                if t == cfg.eos_token_id and not q.ignore_eos:
                    q.finish_reason = {"type": "stop", "matched": cfg.eos_token_id}
                    break
            if q.finish_reason is None and len(q.output_ids) >= q.max_new_tokens:
                q.finish_reason = {"type": "length", "length": q.max_new_tokens}
            if q.finish_reason is not None:
                finished_now.append(q)
        rec: dict[str, Any] = {"forward_ct": fct}
        comps = set(cfg.components)
        if "core" in comps:
            rec.update(
                bs=bs,
                mode=cfg.mode,
                budget=budget,
                lag_steps=None if cfg.mode == "static" else 2,
                num_running_reqs=bs,
                num_verify_tokens=nvt,
                verify_tokens_local=-1 if budget is None else min(bs + budget, bs * (g + 1)),
                verify_tokens_graph_key=nvt,
                predicted_step_ms=None if budget is None or self.force_frac is not None else 4.0 + 0.05 * (bs + budget),
                predicted_theta=None if budget is None or self.force_frac is not None else (bs + sum(s for s, *_ in cands[:budget])) / ((4.0 + 0.05 * (bs + budget)) / 1e3),
            )
        if "step_cpu_time" in comps:
            rec["step_cpu_ms"] = step_cpu
        if "step_gpu_time" in comps and step_cpu is not None:
            rec["step_gpu_ms"] = round(step_cpu * 0.9, 4)
        if "reqs" in comps:
            rec["reqs"] = details
        self.last_tick_tokens = max(self.last_tick_tokens, bs * (g + 1) if cfg.mode == "static" else sum_vl)
        if comps:
            r.ring.append(_omit_defaults(rec, _RECORD_DEFAULTS))
        self._est_steps += 1
        if self._est_steps % cfg.estimator_flush_every == 0:
            self._flush_estimator()
        self._sts_steps += 1
        for q in finished_now:
            if q.finish_reason and q.finish_reason.get("type") == "stop" and q.pending_blocks and cfg.estimator_path and r.index == 0:
                self._est_lines.append(json.dumps({"rid": q.rid, "eos_end": [b["fct"] for b in q.pending_blocks]}))
            r.active.remove(q)
            self._finish(r, q, q.finish_reason)

    def _estimator_row(self, q: _Req, fct: int, prefix: int, w: int, cl: int, ct: int, drafts: list, committed: list) -> None:
        g = self.cfg.gamma
        line: dict[str, Any] = {"rid": q.rid, "fct": fct, "w": w, "cl": cl, "ct": ct}
        pg = []
        realized = committed  # drafts[:cl] + [bonus]
        still = []
        for b in q.pending_blocks:  # advance blocks opened in earlier steps
            alive = True
            while b["next"] <= g:
                row = b["anchor"] + b["next"] - prefix
                if row < 0 or row > cl:
                    break
                tok = b["trimmed"][b["next"] - b["w"] - 1]
                real = realized[row]
                pg.append([b["fct"], b["next"], round(-abs(self.rng.gauss(0.3, 0.3)), 6), tok, real])
                b["next"] += 1
                if real != tok:
                    alive = False
                    break
            if alive and b["next"] <= g:
                still.append(b)
        q.pending_blocks = still
        if cl == w and w < g:
            trimmed = drafts[w:]
            line["trimmed_tokens"] = trimmed
            line["q_lp"] = [round(-abs(self.rng.gauss(0.4, 0.3)), 6) for _ in trimmed]
            b = {"fct": fct, "anchor": prefix - 1, "w": w, "trimmed": trimmed, "next": w + 1}
            # first offset uses this step's bonus row
            tok, real = trimmed[0], committed[-1]
            pg.append([fct, w + 1, round(-abs(self.rng.gauss(0.3, 0.3)), 6), tok, real])
            b["next"] += 1
            if real == tok and b["next"] <= g:
                q.pending_blocks.append(b)
        if pg:
            line["pg"] = pg
        self._est_lines.append(json.dumps(line))

    def _flush_estimator(self) -> None:
        if not self.cfg.estimator_path or not self._est_lines:
            self._est_lines.clear()
            return
        with open(self.cfg.estimator_path, "a") as f:
            f.write("\n".join(self._est_lines) + "\n")
        self.est_written[-1].extend(self._est_lines)
        self._est_lines.clear()

    def _maybe_flush_sts(self) -> None:
        if not self.cfg.sts_stem or self._sts_steps < self.cfg.sts_flush_every or not self._sts_rows:
            return
        import torch  # only when collecting, like SGLang

        logits = torch.tensor([r[0] for r in self._sts_rows], dtype=torch.float32)
        mask = torch.tensor([r[1] for r in self._sts_rows], dtype=torch.float32)
        path = f"{self.cfg.sts_stem}.{self._sts_shard}.pt"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        torch.save({"logits": logits, "prefix_mask": mask}, path)
        self.sts_written[-1].append(path)
        self._sts_shard += 1
        self._sts_rows.clear()
        self._sts_steps = 0

    def _finish(self, r: _Rank, q: _Req, reason: dict) -> None:
        q.finish_reason = reason
        if q.pool_index < self.cfg.max_running_requests and q.pool_index not in r.free_slots:
            r.free_slots.append(q.pool_index)
        q.done.set()

    # -- views --------------------------------------------------------------
    def meta_info(self, q: _Req) -> dict:
        g = self.cfg.gamma
        m: dict[str, Any] = {
            "id": q.rid,
            "finish_reason": q.finish_reason,
            "prompt_tokens": q.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(q.output_ids),
            "cached_tokens": 0,
            "e2e_latency": round(time.monotonic() - q.created, 6),
        }
        if q.verify_ct > 0:
            m["spec_accept_rate"] = q.num_correct / (q.verify_ct * g)
            m["spec_accept_length"] = len(q.output_ids) / q.verify_ct
            m["spec_num_correct_drafts"] = q.num_correct
            m["spec_num_proposed_drafts"] = q.verify_ct * g
            m["spec_verify_ct"] = q.verify_ct
            if self.cfg.mode != "static" and q.num_cap_tokens > 0:
                m["spec_cap_length"] = q.num_cap_tokens / q.verify_ct
            if self.cfg.mode == "cap-accept":
                m["spec_block_accept_length"] = q.num_block_accept / q.verify_ct
            if any(q.correct_hist):
                m["spec_correct_drafts_histogram"] = list(q.correct_hist)
            if any(q.cap_hist):
                m["spec_cap_lens_histogram"] = list(q.cap_hist)
        return m

    def server_args(self) -> dict:
        c = self.cfg
        return {
            "model_path": c.model_path,
            "tokenizer_path": c.tokenizer_path or c.model_path,
            "served_model_name": c.model_path,
            "host": "127.0.0.1",
            "port": c.port,
            "tp_size": c.tp_size,
            "dp_size": 1 if c.attn_dp else c.dp_ranks,
            "attn_dp_size": c.dp_ranks if c.attn_dp else 1,
            "enable_dp_lm_head": c.attn_dp,
            "speculative_algorithm": "DSPARK",
            "speculative_draft_model_path": c.draft_model_path,
            "speculative_num_draft_tokens": c.gamma + 1,
            "speculative_num_steps": 1,
            "speculative_eagle_topk": 1,
            "speculative_dspark_block_size": c.gamma,
            "speculative_dspark_sps_table_path": c.sps_path,
            "speculative_dspark_confidence_sts_path": c.sts_path,
            "speculative_dspark_align_verify_tokens_to_graph_tier": False,
            "disable_cuda_graph": False,
            "enable_metrics": c.enable_metrics,
            "max_running_requests": c.max_running_requests,
            "decode_log_interval": 40,
        }

    def server_info(self) -> dict:
        if self.cfg.replay_server_info:
            with self.lock:
                i = min(self._replay_i, len(self.cfg.replay_server_info) - 1)
                self._replay_i += 1
                return json.loads(json.dumps(self.cfg.replay_server_info[i]))
        with self.lock:
            states = []
            for r in self.ranks:
                st = dict(self.server_args())
                st.update(
                    world_size=self.cfg.tp_size,
                    startup_time=self.startup_time,
                    effective_max_running_requests_per_dp=self.cfg.max_running_requests,
                    last_gen_throughput=0.0,
                    memory_usage={"weight": 1.0, "kvcache": 2.0, "token_capacity": 100000, "graph": 0.1},
                    cuda_graph_config={"decode": {"bs": [1, 2, 4, 8, 16, 24, 32, 40, 48]}},
                )
                if r.history:
                    st["avg_spec_accept_length"] = sum(h[0] for h in r.history) / len(r.history)
                comps = set(self.cfg.components)
                if comps:
                    st["dspark_info_record"] = {
                        "mode": self.cfg.mode,
                        "gamma": self.cfg.gamma,
                        "verify_num_draft_tokens": self.cfg.gamma + 1,
                        "components": sorted(comps),
                        "records": [dict(x) for x in r.ring],
                        "simulate_acc_len": self.cfg.simulate_acc_len,
                    }
                states.append(st)
            if self.cfg.shuffle_ranks:
                self.rng.shuffle(states)
            info = dict(self.server_args())
            info.update(
                launch_command="python -m sglang.launch_server (fake)",
                kv_events=None,
                startup_time=self.startup_time,
                internal_states=states,
                version="0.5.23",
                frontend="python",
            )
            return info

    def set_internal_state(self, args: dict) -> list[bool]:
        with self.lock:
            known = {"dspark_clear_info_records", "dspark_force_budget_frac"}
            if any(k not in known for k in args):
                return [False] * len(self.ranks)
            if "dspark_force_budget_frac" in args:
                v = args["dspark_force_budget_frac"]
                if v is not None and not (0.0 < float(v) <= 1.0):
                    return [False] * len(self.ranks)
                self.force_frac = None if v is None else float(v)
            if args.get("dspark_clear_info_records"):
                for r in self.ranks:
                    r.ring.clear()
            return [True] * len(self.ranks)

    def metrics_text(self) -> bytes:
        from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

        reg = CollectorRegistry()
        labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"] + (["dp_rank"] if self.cfg.dp_ranks > 1 else [])
        gauges = {
            n: Gauge(f"sglang:{n}", doc, labels, registry=reg)
            for n, doc in (
                ("spec_accept_length", "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward)."),
                ("spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."),
                ("spec_cap_length", "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when no cap is scheduled)."),
                ("spec_block_accept_length", "Mean uncapped full-block accept length per verify step (accept + cap-trimmed drafts; exact only in DSpark cap-accept mode)."),
                ("spec_num_steps", "Currently active speculative_num_steps."),
                ("spec_num_draft_tokens", "Currently active speculative_num_draft_tokens (decouples from steps under topk>1)."),
            )
        }
        calls = Counter("sglang:spec_verify_calls_total", "Total verify calls.", labels, registry=reg)
        with self.lock:
            for r in self.ranks:
                lv = [self.cfg.model_path, "unified", "0", "0", "0"] + ([str(r.index)] if self.cfg.dp_ranks > 1 else [])
                h = list(r.history)
                n = len(h) or 1
                acc = sum(x[0] for x in h) / n
                gauges["spec_accept_length"].labels(*lv).set(acc if h else 0.0)
                gauges["spec_accept_rate"].labels(*lv).set(sum(x[3] for x in h) / (n * self.cfg.gamma) if h else 0.0)
                cap = sum(x[1] for x in h) / n if (h and self.cfg.mode != "static") else 0.0
                gauges["spec_cap_length"].labels(*lv).set(cap)
                blk = sum(x[2] for x in h) / n if (h and self.cfg.mode == "cap-accept") else 0.0
                gauges["spec_block_accept_length"].labels(*lv).set(blk)
                gauges["spec_num_steps"].labels(*lv).set(1)
                gauges["spec_num_draft_tokens"].labels(*lv).set(self.cfg.gamma + 1)
                calls.labels(*lv).inc(r.verify_calls)
        return generate_latest(reg)


class _Handler(BaseHTTPRequestHandler):
    server: "_HTTPServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keep test output quiet
        if os.environ.get("FAKE_SGLANG_VERBOSE"):
            sys.stderr.write("fake-sglang: " + (fmt % args) + "\n")

    def _send(self, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode())

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else {}

    @property
    def engine(self) -> FakeEngine:
        return self.server.engine

    def do_GET(self):  # noqa: N802
        path = urlparse(self.path).path
        eng = self.engine
        if path in ("/health", "/health_generate", "/ready"):
            return self._send(200 if eng.ready() else 503)
        if not eng.ready():
            return self._send(503)
        if path in ("/server_info", "/get_server_info"):
            self.server.server_info_calls += 1
            return self._json(200, eng.server_info())
        if path == "/metrics":
            if not eng.cfg.enable_metrics:
                return self._send(404)
            return self._send(200, eng.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
        if path == "/model_info":
            return self._json(200, {"model_path": eng.cfg.model_path, "is_generation": True})
        if path == "/flush_cache":
            return self._send(200, b"Cache flushed.\n", "text/plain")
        return self._send(404)

    def do_POST(self):  # noqa: N802
        url = urlparse(self.path)
        path = url.path
        eng = self.engine
        try:
            body = self._body()
        except json.JSONDecodeError:
            return self._json(400, {"error": "invalid JSON"})
        if path.startswith("/_fake/"):
            return self._control(path, parse_qs(url.query), body)
        if not eng.ready():
            return self._send(503)
        if path == "/set_internal_state":
            return self._json(200, eng.set_internal_state(body.get("server_args") or {}))
        if path == "/flush_cache":
            return self._send(200, b"Cache flushed.\n", "text/plain")
        if path == "/abort_request":
            if body.get("abort_all"):
                eng.abort_all()
            return self._send(200)
        if path == "/generate":
            return self._generate(body)
        if path == "/v1/chat/completions":
            return self._chat(body)
        return self._send(404)

    def _control(self, path: str, q: dict, body: dict) -> None:
        eng = self.engine
        if path == "/_fake/restart":
            eng.restart()
        elif path == "/_fake/pause":
            eng.paused = True
        elif path == "/_fake/resume":
            eng.paused = False
        elif path == "/_fake/step":
            n = int((q.get("n") or ["1"])[0])
            was = eng.paused
            eng.paused = False
            for _ in range(min(n, 100_000)):
                eng.tick()
            eng.paused = was
        else:
            return self._send(404)
        return self._json(200, {"ok": True, "forward_ct": [r.forward_ct for r in eng.ranks]})

    def _wait(self, reqs: list[_Req]) -> None:
        deadline = time.monotonic() + 120
        for q in reqs:
            q.done.wait(max(0.0, deadline - time.monotonic()))

    def _generate(self, body: dict) -> None:
        eng = self.engine
        if eng.cfg.replay_generate:
            with eng.lock:
                item = json.loads(json.dumps(eng.cfg.replay_generate[eng._replay_gen % len(eng.cfg.replay_generate)]))
                eng._replay_gen += 1
            if isinstance(body.get("rid"), str):
                item["meta_info"]["id"] = body["rid"]  # the one edit: answer under the caller's rid
            return self._json(200, item)
        sp = body.get("sampling_params") or {}
        if isinstance(sp, list):
            sp = sp[0] if sp else {}
        text, ids, rid = body.get("text"), body.get("input_ids"), body.get("rid")
        if text is None and ids is None:
            return self._json(400, {"error": "Either text or input_ids should be provided."})
        batch = isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list))
        prompts = (text if isinstance(text, list) else ids) if batch else [text if text is not None else ids]
        rids = rid if isinstance(rid, list) else [rid] * len(prompts) if not batch else [None] * len(prompts)
        reqs = [eng.submit(len(p.split()) if isinstance(p, str) else len(p), sp, r) for p, r in zip(prompts, rids)]
        self._wait(reqs)
        outs = [
            {"text": " ".join(f"t{t}" for t in q.output_ids), "output_ids": list(q.output_ids), "meta_info": eng.meta_info(q)}
            for q in reqs
        ]
        return self._json(200, outs if batch else outs[0])

    def _chat(self, body: dict) -> None:
        eng = self.engine
        msgs = body.get("messages") or []
        prompt = " ".join(str(m.get("content", "")) for m in msgs)
        sp = {
            "temperature": body.get("temperature", 1.0),
            "max_new_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or 16,
            "sampling_seed": body.get("seed"),
        }
        q = eng.submit(len(prompt.split()), sp, body.get("rid"))
        self._wait([q])
        meta = eng.meta_info(q)
        fr = (q.finish_reason or {}).get("type")
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": " ".join(f"t{t}" for t in q.output_ids), "reasoning_content": None, "tool_calls": None},
            "logprobs": None,
            "finish_reason": fr,
            "matched_stop": (q.finish_reason or {}).get("matched"),
        }
        if body.get("return_token_ids"):
            choice["response_token_ids"] = list(q.output_ids)
        resp: dict[str, Any] = {
            "id": q.rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or eng.cfg.model_path,
            "choices": [choice],
            "usage": {
                "prompt_tokens": q.prompt_tokens,
                "total_tokens": q.prompt_tokens + len(q.output_ids),
                "completion_tokens": len(q.output_ids),
                "prompt_tokens_details": None,
                "reasoning_tokens": 0,
            },
            "metadata": {"weight_version": "default"},
        }
        if body.get("return_spec_tokens_details") and "spec_verify_ct" in meta:
            keys = (
                ("spec_accept_rate", 0.0), ("spec_accept_length", 0.0), ("spec_cap_length", 0.0),
                ("spec_block_accept_length", 0.0), ("spec_num_correct_drafts", 0), ("spec_num_proposed_drafts", 0),
                ("spec_verify_ct", 0), ("spec_correct_drafts_histogram", []), ("spec_cap_lens_histogram", []),
            )
            resp["sglext"] = {
                "routed_experts": None,
                "cached_tokens_details": None,
                "spec_tokens_details": {k: meta.get(k) or d for k, d in keys},
                "input_ids": None,
                "output_ids": None,
            }
        return self._json(200, resp)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    engine: FakeEngine
    server_info_calls: int = 0


class FakeSGLangServer:
    """Start/stop the fake server in-process: ``with FakeSGLangServer(cfg) as s: s.url``."""

    def __init__(self, cfg: FakeConfig | None = None, host: str = "127.0.0.1"):
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the fake SGLang server binds to loopback only")
        self.cfg = cfg or FakeConfig()
        self.engine = FakeEngine(self.cfg)
        self.httpd = _HTTPServer((host, self.cfg.port), _Handler)
        self.httpd.engine = self.engine
        self.cfg.port = self.httpd.server_address[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.cfg.port}"

    def _clock(self) -> None:
        while not self._stop.is_set():
            if self.cfg.tick_s > 0:
                self.engine.tick()
                time.sleep(self.cfg.tick_s + self.engine.last_tick_tokens * self.cfg.step_cost_s_per_token)
            else:
                time.sleep(0.01)

    def start(self) -> "FakeSGLangServer":
        t1 = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        t2 = threading.Thread(target=self._clock, daemon=True)
        self._threads = [t1, t2]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.engine.abort_all()
        self.httpd.shutdown()
        self.httpd.server_close()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> "FakeSGLangServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def config_from_launch_args(argv: list[str], env: dict[str, str]) -> FakeConfig:
    """Map ``sglang.launch_server`` flags and SGLang env vars onto a FakeConfig."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model-path", default="fake/target")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", default="DSPARK")
    p.add_argument("--speculative-draft-model-path", default="fake/draft")
    p.add_argument("--speculative-dspark-block-size", type=int, default=7)
    p.add_argument("--speculative-dspark-sps-table-path", default=None)
    p.add_argument("--speculative-dspark-confidence-sts-path", default=None)
    p.add_argument("--attn-dp-size", type=int, default=None)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--max-running-requests", type=int, default=48)
    p.add_argument("--tokenizer-path", default=None)
    args, _unknown = p.parse_known_args(argv)
    if args.host not in ("127.0.0.1", "localhost"):
        raise SystemExit("fake SGLang server: loopback hosts only")
    dump = [t.strip() for t in env.get("SGLANG_DSPARK_DEBUG_DUMP", "").split(",") if t.strip()]
    if "all" in dump:
        dump = list(INFO_COMPONENTS)
    bad = [t for t in dump if t not in INFO_COMPONENTS]
    if bad:
        raise SystemExit(f"Invalid SGLANG_DSPARK_DEBUG_DUMP token in {sorted(dump)}")
    if env.get("SGLANG_DSPARK_ENABLE_SPS_RECORD") in ("1", "true", "True"):
        dump = sorted(set(dump) | {"core", "step_cpu_time"})
    mode = env.get("SGLANG_RAGGED_VERIFY_MODE", "static")
    if mode not in ("static", "cap-accept", "compact"):
        raise SystemExit(f"invalid SGLANG_RAGGED_VERIFY_MODE {mode!r}")
    dp = args.attn_dp_size or args.dp_size or 1
    return FakeConfig(
        mode=mode,
        gamma=args.speculative_dspark_block_size,
        dp_ranks=dp,
        attn_dp=bool(args.attn_dp_size),
        tp_size=args.tp_size,
        components=tuple(dump),
        port=args.port,
        model_path=args.model_path,
        tokenizer_path=args.tokenizer_path,
        draft_model_path=args.speculative_draft_model_path,
        sts_path=args.speculative_dspark_confidence_sts_path,
        sps_path=args.speculative_dspark_sps_table_path,
        enable_metrics=args.enable_metrics,
        max_running_requests=args.max_running_requests,
        estimator_path=env.get("SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH", ""),
        sts_stem=env.get("SGLANG_DSPARK_STS_COLLECT_PATH", ""),
        startup_delay_s=float(env.get("FAKE_SGLANG_STARTUP_DELAY_S", "0")),
        ring_size=int(env.get("FAKE_SGLANG_RING_SIZE", "200000")),
        sts_flush_every=int(env.get("FAKE_SGLANG_STS_FLUSH_EVERY", "256")),
        shuffle_ranks=env.get("FAKE_SGLANG_SHUFFLE", "0") == "1",
        simulate_acc_len=float(env["SGLANG_SIMULATE_ACC_LEN"]) if float(env.get("SGLANG_SIMULATE_ACC_LEN", "-1")) > 0 else None,
        tick_s=float(env.get("FAKE_SGLANG_TICK_S", "0.002")),
        step_cost_s_per_token=float(env.get("FAKE_SGLANG_STEP_COST_S", "0")),
    )


def main(argv: list[str] | None = None) -> None:
    cfg = config_from_launch_args(list(sys.argv[1:] if argv is None else argv), dict(os.environ))
    srv = FakeSGLangServer(cfg)
    stopping = threading.Event()

    def _term(signum, frame):
        if os.environ.get("FAKE_SGLANG_IGNORE_SIGTERM") == "1":
            sys.stderr.write("fake-sglang: ignoring SIGTERM\n")
            sys.stderr.flush()
            return
        stopping.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    srv.start()
    sys.stderr.write(f"fake-sglang: serving {cfg.mode} gamma={cfg.gamma} dp={cfg.dp_ranks} on {srv.url}\n")
    sys.stderr.flush()
    print(f"The server is fired up and ready to roll! {srv.url}", flush=True)
    while not stopping.is_set():
        stopping.wait(0.2)
    srv.stop()
    sys.stderr.write("fake-sglang: shut down\n")


if __name__ == "__main__":
    main()

"""Continuous-batching DSpark engine: admission, prefill, and draft -> schedule -> verify -> accept -> commit.

Serving semantics follow SGLang 0.5.23's DSpark worker:

* up to ``max_running_requests`` requests run together; finished requests free their slot
  and waiting ones are admitted by a prefill pass (which, as in SGLang, advances
  ``forward_ct`` without producing a decode ``steps`` row);
* each decode step drafts one gamma-block per request, applies STS (``c_k = sigmoid(z_k/T_k)``),
  sizes the verify budget from survival ``lag_steps`` decode steps back (fresh requests: 1),
  allocates it with the current survival, verifies (``static`` / ``compact`` / ``cap-accept``)
  and commits accepted drafts + one bonus token;
* randomness is per request, never per batch: two ``torch.Generator`` per request, seeded
  from ``(seed, rid)``. The verify generator draws one uniform for the prefill token and
  ``2 * gamma + 1`` per decode step in every mode (acceptance coins for all gamma positions,
  sampling uniforms for all gamma + 1 rows); the draft generator is handed to the drafter
  (one generator per row), which takes exactly the drafter's block size of uniforms from it
  per step. A request's draws therefore do not depend on which requests share its batch, and
  compact and cap-accept consume randomness identically and commit identical tokens for the
  same seed. (A request's tokens still follow its verify windows; those are batch-independent
  whenever the scheduler verifies everything: static, before the lag warms up, or with an
  uninitialised SPS table. With a live budget the windows depend on the batch, as in SGLang.)
* commit at the limits: a step verifies and accepts exactly as SGLang does (``acc_len =
  correct_drafts + 1``; ``bonus_token`` the real token after the accepted drafts); the tokens
  appended to the output (``committed_tokens``) are then cut at the first EOS and at
  ``max_new_tokens``, like SGLang's output check truncates an over-long commit, so they can be
  fewer than ``acc_len`` on a request's last step.

Timings are host wall times (CPU), and with a ``clock_table`` (a cost profile) each step also
gets a *modeled* time (``modeled_step_ms``): the profile's prediction for the verify tokens the
step executed, plus (when the profile's manifest gives its context length and bandwidth) the K/V
reads of the requests' own contexts relative to the profiled one (:class:`profiler.StepClock`),
so throughput on a CPU describes the profiled GPU regime. Wall times: ``draft_gpu_ms`` around ``propose``,
``target_verify_gpu_ms`` around the target verify forward, ``step_gpu_ms`` from draft
start to the end of commit, ``step_cpu_ms`` between consecutive decode-step ends (None
right after a prefill pass or above 1 s, as SGLang records it).
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import torch

from acceptscope import schema
from acceptscope.domain import sts as sts_mod
from acceptscope.domain.scheduler import DEFAULT_LAG_STEPS, LaggedSurvival, schedule_step
from acceptscope.domain.sps import SpsTable, uninitialized_table
from acceptscope.engine.kv import CachedTarget, pack
from acceptscope.engine.profiler import StepClock
from acceptscope.engine.sampling import sample_tokens
from acceptscope.engine.sts_torch import calibrate, temperatures_tensor
from acceptscope.engine.telemetry import TelemetrySink, list_column, ragged_list_column, record_batch
from acceptscope.engine.verify import check_mode, run_verify

MAX_STEP_CPU_S = 1.0


@dataclass
class RequestSpec:
    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    workload: str = ""
    prompt_index: int = 0


@dataclass
class _Req:
    spec: RequestSpec
    gen: torch.Generator  # verify uniforms (prefill token, acceptance coins, residual/bonus samples)
    draft_gen: torch.Generator  # the drafter's sampling uniforms for this request
    slot: int = -1
    state: Any = None
    anchor: int = 0
    prefix_len: int = 0
    output: list = field(default_factory=list)
    step_index: int = 0
    verify_ct: int = 0
    correct_sum: int = 0
    cap_tokens: int = 0
    block_accept_tokens: int = 0
    correct_hist: list = field(default_factory=list)
    cap_hist: list = field(default_factory=list)
    finish_reason: Optional[str] = None
    finish_time: float = 0.0


@dataclass
class RequestResult:
    rid: str
    workload: str
    prompt_index: int
    seed: int
    temperature: float
    prompt_tokens: int
    output_tokens: list[int]
    finish_reason: str
    latency_s: float
    verify_ct: int
    correct_drafts: int


def request_seed(seed: int, rid: str) -> int:
    """Stable per-request seed from the run seed and the request id."""
    return (int(seed) * 1_000_003 + zlib.crc32(rid.encode("utf-8"))) % (2**63 - 1)


def _bump(hist: list, i: int) -> None:
    if len(hist) <= i:
        hist.extend([0] * (i + 1 - len(hist)))
    hist[i] += 1


class Engine:
    """The reference DSpark serving engine over a loaded target and drafter."""

    def __init__(
        self,
        target_model: torch.nn.Module,
        drafter: Any,
        *,
        mode: str = "cap-accept",
        gamma: Optional[int] = None,
        max_running_requests: int = 32,
        max_seq_len: int = 512,
        eos_token_id: Optional[int | Sequence[int]] = None,
        sts: Optional[sts_mod.StsTable] = None,
        sps: Optional[SpsTable] = None,
        lag_steps: int = DEFAULT_LAG_STEPS,
        seed: int = 0,
        per_position: bool = True,
        sink: Optional[TelemetrySink] = None,
        run_id: str = "run",
        window_replay: Optional[Mapping[str, Sequence[int]]] = None,
        clock_table: Optional[SpsTable | StepClock] = None,
    ):
        self.mode = check_mode(mode)
        self.drafter = drafter
        dg = int(drafter.config.gamma)
        self.gamma = dg if gamma is None else int(gamma)
        if not 1 <= self.gamma <= dg:
            raise ValueError(f"gamma {self.gamma} must be in 1..{dg} (the drafter's block size)")
        self.max_running = int(max_running_requests)
        self.target = CachedTarget(target_model, drafter.config.target_layer_ids, self.max_running, int(max_seq_len))
        self.max_seq_len = int(max_seq_len)
        if eos_token_id is None:
            eos = []
        elif isinstance(eos_token_id, int):
            eos = [eos_token_id]
        else:
            eos = list(eos_token_id)
        self.eos = set(int(e) for e in eos)
        self.sts = sts if sts is not None else sts_mod.identity(self.gamma)
        self.sts.check_gamma(self.gamma)
        self.sts_t = temperatures_tensor(self.sts)
        self.sps = sps if sps is not None else uninitialized_table(self.max_running * (self.gamma + 1))
        self.lag = LaggedSurvival(self.gamma, lag_steps)
        self.seed = int(seed)
        # run-level generator for callers that draft whole batches outside serving (profiler);
        # serving uses each request's own draft generator
        self.draft_gen = torch.Generator().manual_seed(self.seed)
        self.per_position = per_position
        self.sink = sink
        self.run_id = run_id
        # rid -> windows of its decode steps in order (another arm's request_steps.window): an audit
        # arm that serves a subset of the traffic replays the production arm's windows, so each
        # request verifies and commits exactly what it did there (the budget is batch-dependent)
        self.window_replay = window_replay
        # virtual clock: each decode step lasts what this cost profile predicts for the verify tokens
        # the step actually executed (compact: sum of verify_len; cap-accept / static: bs * (gamma+1))
        self.clock_table = None if clock_table is None else (
            clock_table if isinstance(clock_table, StepClock) else StepClock(clock_table))
        self.modeled_s = 0.0
        self.forward_ct = 0
        self.decode_steps = 0
        self.results: list[RequestResult] = []
        self._last_decode_end: Optional[float] = None
        self._t0 = time.perf_counter()
        self.executed_tokens = 0
        self.scheduled_tokens = 0
        self.steps_rows = 0
        self.decode_s = 0.0  # total decode-step wall time (draft start .. telemetry emitted)
        self.telemetry_s = 0.0  # part of it spent building telemetry batches

    # ------------------------------------------------------------------ public
    def run(self, specs: Sequence[RequestSpec], progress: Optional[Callable[[int, int], None]] = None) -> list[RequestResult]:
        """Serve all requests (all arrive at t=0); returns per-request results in finish order."""
        for s in specs:
            if len(s.prompt_ids) < 1:
                raise ValueError(f"request {s.rid}: empty prompt")
            need = len(s.prompt_ids) + s.max_new_tokens + self.gamma + 2
            if need > self.max_seq_len:
                raise ValueError(f"request {s.rid}: prompt {len(s.prompt_ids)} + max_new_tokens {s.max_new_tokens} "
                                 f"+ gamma exceeds max_seq_len {self.max_seq_len}")
        waiting = deque(specs)
        running: list[_Req] = []
        self._t0 = time.perf_counter()
        while waiting or running:
            if waiting and len(running) < self.max_running:
                admit = []
                while waiting and len(running) + len(admit) < self.max_running:
                    admit.append(waiting.popleft())
                finished = self._prefill(admit, running)
                if progress and finished:
                    progress(len(finished), sum(len(r.output) for r in finished))
                continue
            finished = self._decode_step(running)
            if progress:
                progress(len(finished), sum(len(r.output) for r in finished))
        if self.sink is not None:
            self.sink.hand_over()
        return self.results

    # --------------------------------------------------------- drafter context
    def extend_contexts(self, states: list, hiddens: list[torch.Tensor]) -> None:
        """Append committed target hidden states to many draft states.

        Uses the drafter's public batched ``extend_contexts`` (``DSparkDrafter``: one projection
        over all requests' new rows); a drafter without it gets per-request ``extend_context``.
        """
        if not states:
            return
        d = self.drafter
        if hasattr(d, "extend_contexts"):
            d.extend_contexts(states, hiddens)
            return
        for st, h in zip(states, hiddens):
            d.extend_context(st, h)

    # ---------------------------------------------------------------- prefill
    def _prefill(self, specs: list[RequestSpec], running: list[_Req]) -> list[_Req]:
        self.forward_ct += 1
        reqs = []
        for s in specs:
            r = _Req(spec=s, gen=torch.Generator().manual_seed(request_seed(s.seed, s.rid)),
                     draft_gen=torch.Generator().manual_seed(request_seed(s.seed, "draft/" + s.rid)))
            r.slot = self.target.cache.alloc()
            r.state = self.drafter.new_state()
            reqs.append(r)
        lens = [len(r.spec.prompt_ids) for r in reqs]
        pb = pack([r.slot for r in reqs], [0] * len(reqs), lens)
        tokens = torch.tensor([t for r in reqs for t in r.spec.prompt_ids], dtype=torch.long)
        last = pb.cu_seqlens[1:] - 1
        logits, hidden = self.target.forward(pb, tokens, logit_rows=last)
        temps = torch.tensor([r.spec.temperature for r in reqs], dtype=torch.float32)
        u = torch.stack([torch.rand(1, generator=r.gen)[0] for r in reqs])
        first = sample_tokens(logits, temps, u).tolist()
        cu = pb.cu_seqlens.tolist()
        self.extend_contexts([r.state for r in reqs], [hidden[cu[i] : cu[i + 1]] for i in range(len(reqs))])
        finished = []
        for i, r in enumerate(reqs):
            r.prefix_len = lens[i]
            r.anchor = int(first[i])
            r.output.append(r.anchor)
            if r.anchor in self.eos:
                self._finish(r, "stop")
            elif len(r.output) >= r.spec.max_new_tokens:
                self._finish(r, "length")
            if r.finish_reason is None:
                running.append(r)
            else:
                finished.append(r)
        self._last_decode_end = None  # a non-decode pass breaks step_cpu_ms
        return finished

    # ----------------------------------------------------------------- decode
    def _decode_step(self, running: list[_Req]) -> list[_Req]:
        self.forward_ct += 1
        running.sort(key=lambda r: r.slot)  # slot order: the target reads a contiguous cache range as a view
        G = self.gamma
        B = len(running)
        t0 = time.perf_counter()
        anchors = torch.tensor([r.anchor for r in running], dtype=torch.long)
        temps = torch.tensor([r.spec.temperature for r in running], dtype=torch.float32)
        prop = self.drafter.propose([r.state for r in running], anchors, temps, [r.draft_gen for r in running])
        d_tok = prop.tokens[:, :G]
        d_lp = prop.logprobs[:, :G]
        z = prop.confidence_logits[:, :G].float()
        t1 = time.perf_counter()

        conf = calibrate(z, self.sts_t)
        surv = torch.cumprod(conf, dim=-1)
        surv_np = surv.numpy()
        rids = [r.spec.rid for r in running]
        if self.mode == "static":
            windows = np.full(B, G, dtype=np.int64)
            budget = pred_s = pred_theta = None
        else:
            sched = schedule_step(surv_np, self.lag.lagged(rids), self.sps, warm=self.decode_steps >= self.lag.lag_steps)
            windows, budget, pred_s, pred_theta = sched.windows, sched.budget, sched.predicted_step_seconds, sched.predicted_theta
            if self.window_replay:
                windows, replayed = windows.copy(), False
                for i, r in enumerate(running):
                    plan = self.window_replay.get(r.spec.rid)
                    if plan is not None and r.step_index < len(plan):
                        windows[i] = min(max(int(plan[r.step_index]), 0), G)
                        replayed = True
                if replayed:  # record the budget actually spent; no prediction was made for it
                    budget, pred_s, pred_theta = int(windows.sum()), None, None
        self.lag.push(rids, surv_np.copy())
        u = torch.stack([torch.rand(2 * G + 1, generator=r.gen) for r in running])
        u_acc, u_samp = u[:, :G], u[:, G:]
        win_t = torch.from_numpy(windows)
        t2 = time.perf_counter()
        vr = run_verify(
            self.target, self.mode, [r.slot for r in running], [r.prefix_len for r in running],
            anchors, d_tok, d_lp, win_t, temps, u_acc, u_samp,
        )
        t3 = time.perf_counter()
        dec = vr.decision
        correct = dec.correct.tolist()
        bonus = dec.bonus.tolist()
        cap_trim = vr.cap_trim.tolist()
        d_tok_l = d_tok.tolist()
        cu = vr.cu_seqlens.tolist()
        verify_len = (windows + 1).tolist()
        layout = budget is not None
        prefix_lens = [r.prefix_len for r in running]
        committed: list[list[int]] = []
        fin_flags = []
        finished = []
        keep = []
        ext_states, ext_hidden = [], []
        for i, r in enumerate(running):
            c = correct[i]
            new = d_tok_l[i][:c] + [bonus[i]]
            room = r.spec.max_new_tokens - len(r.output)
            cut = len(new)
            for k, t in enumerate(new):
                if t in self.eos:
                    cut = k + 1
                    break
            new = new[: min(cut, room)]
            reason = None
            if new[-1] in self.eos:
                reason = "stop"
            elif len(new) >= room:
                reason = "length"
            r.output.extend(new)
            committed.append(new)
            r.verify_ct += 1
            r.correct_sum += c
            _bump(r.correct_hist, c)
            if layout:
                r.cap_tokens += verify_len[i]
                _bump(r.cap_hist, verify_len[i])
            r.block_accept_tokens += c + 1 + cap_trim[i]
            r.step_index += 1
            if reason is not None:
                self._finish(r, reason)
                finished.append(r)
                fin_flags.append(True)
            else:
                ext_states.append(r.state)
                ext_hidden.append(vr.hidden[cu[i] : cu[i] + c + 1])
                r.prefix_len += c + 1
                r.anchor = bonus[i]
                keep.append(r)
                fin_flags.append(False)
        self.extend_contexts(ext_states, ext_hidden)
        t4 = time.perf_counter()
        modeled_ms = None
        if self.clock_table is not None:
            modeled_ms = self.clock_table.step_ms(B, vr.executed_tokens, sum(prefix_lens))
            self.modeled_s += modeled_ms / 1e3
        self.decode_steps += 1
        sched_tokens = int(B + windows.sum())
        self.scheduled_tokens += sched_tokens
        self.executed_tokens += vr.executed_tokens

        if self.sink is not None:
            step_cpu_ms = None
            if self._last_decode_end is not None:
                gap = t4 - self._last_decode_end
                if 0 < gap <= MAX_STEP_CPU_S:
                    step_cpu_ms = round(gap * 1e3, 4)
            num_verify = sched_tokens if self.mode != "static" else B * (G + 1)
            self.sink.add(schema.STEPS, record_batch(schema.STEPS, {
                "run_id": [self.run_id], "rank": [0], "epoch": [0], "forward_ct": [self.forward_ct],
                "bs": [B], "mode": [self.mode], "budget": [budget],
                "lag_steps": [None if self.mode == "static" else self.lag.lag_steps],
                "num_running_reqs": [B], "num_verify_tokens": [num_verify],
                "verify_tokens_local": [None if budget is None else min(B + budget, B * (G + 1))],
                "verify_tokens_graph_key": [num_verify],
                "executed_verify_tokens": [vr.executed_tokens],
                "predicted_step_ms": [None if pred_s is None else pred_s * 1e3],
                "predicted_theta": [pred_theta],
                "step_cpu_ms": [step_cpu_ms],
                "step_gpu_ms": [(t4 - t0) * 1e3],
                "draft_gpu_ms": [(t1 - t0) * 1e3],
                "target_verify_gpu_ms": [(t3 - t2) * 1e3],
                "wall_time_s": [t4 - self._t0],
                "modeled_step_ms": [modeled_ms],
            }, 1))
            self._emit_request_steps(running, prefix_lens, windows, dec, vr, d_tok, d_lp, z, conf, surv, committed, fin_flags, temps)
            self.sink.step_done()
            self.steps_rows += 1
        self._last_decode_end = time.perf_counter()
        self.telemetry_s += self._last_decode_end - t4
        self.decode_s += self._last_decode_end - t0
        running[:] = keep
        return finished

    def _emit_request_steps(self, running, prefix_lens, windows, dec, vr, d_tok, d_lp, z, conf, surv, committed, fin_flags, temps):
        """One ``request_steps`` row per request of this decode step (SGLang ``ReqDetail`` semantics).

        * ``correct_drafts``: accepted drafts after capping at the window; ``acc_len =
          correct_drafts + 1`` always (SGLang's ``commit_lens``), also on a request's last step;
        * ``bonus_token``: the real token after the accepted drafts (residual/bonus sample, the
          target argmax when greedy, or ``d_window`` when ``cap_trim > 0``), never a placeholder,
          even when it is not appended to the output;
        * ``committed_tokens``: the tokens actually appended to the output this step, i.e.
          ``(draft_tokens[:correct_drafts] + [bonus_token])`` cut after the first EOS and at
          ``max_new_tokens`` (SGLang commits ``acc_len`` tokens, then its finish check truncates
          the output). Only a row with ``finished = true`` can have ``len(committed_tokens) <
          acc_len``; ``requests.output_tokens`` is the concatenation of the prefill token and the
          ``committed_tokens`` of the request's steps.
        """
        B = len(running)
        correct = dec.correct.numpy()
        cols: dict[str, Any] = {
            "run_id": pa.array([self.run_id] * B, pa.string()),
            "rank": np.zeros(B, np.int32),
            "epoch": np.zeros(B, np.int32),
            "forward_ct": np.full(B, self.forward_ct, np.int64),
            "rid": [r.spec.rid for r in running],
            "req_pool_index": np.array([r.slot for r in running], np.int32),
            "step_index": np.array([r.step_index - 1 for r in running], np.int32),
            "prefix_len": np.array(prefix_lens, np.int32),
            "verify_len": (windows + 1).astype(np.int32),
            "window": windows.astype(np.int32),
            "correct_drafts": correct.astype(np.int32),
            "acc_len": (correct + 1).astype(np.int32),
            "cap_trim": vr.cap_trim.numpy().astype(np.int32),
            "bonus_token": dec.bonus.numpy().astype(np.int64),
            "ceiling": None if vr.ceiling is None else vr.ceiling.numpy().astype(np.int32),
            "temperature": temps.numpy().astype(np.float64),
            "workload": [r.spec.workload for r in running],
            "finished": np.array(fin_flags, dtype=bool),
        }
        if self.per_position:
            dlp = d_lp.gather(-1, d_tok.unsqueeze(-1)).squeeze(-1)
            cols["draft_tokens"] = list_column(d_tok.numpy().astype(np.int64), schema.I64_LIST)
            cols["confidence"] = list_column(conf.numpy(), schema.F32_LIST)
            cols["survival"] = list_column(surv.numpy(), schema.F32_LIST)
            cols["confidence_logit"] = list_column(z.numpy(), schema.F32_LIST)
            cols["draft_logprob"] = list_column(dlp.numpy().astype(np.float32), schema.F32_LIST)
            cols["target_logprob"] = list_column(dec.target_logprob.numpy().astype(np.float32), schema.F32_LIST, null_nan=True)
            counts = np.array([len(c) for c in committed], np.int64)
            flat = np.fromiter((t for c in committed for t in c), dtype=np.int64, count=int(counts.sum()))
            cols["committed_tokens"] = ragged_list_column(flat, counts, schema.I64_LIST)
        self.sink.add(schema.REQUEST_STEPS, record_batch(schema.REQUEST_STEPS, cols, B))

    # ---------------------------------------------------------------- finish
    def _finish(self, r: _Req, reason: str) -> None:
        r.finish_reason = reason
        r.finish_time = time.perf_counter()
        self.target.cache.free(r.slot)
        self.lag.drop(r.spec.rid)
        r.state = None
        res = RequestResult(
            rid=r.spec.rid, workload=r.spec.workload, prompt_index=r.spec.prompt_index, seed=r.spec.seed,
            temperature=r.spec.temperature, prompt_tokens=len(r.spec.prompt_ids), output_tokens=list(r.output),
            finish_reason=reason, latency_s=r.finish_time - self._t0, verify_ct=r.verify_ct,
            correct_drafts=r.correct_sum,
        )
        self.results.append(res)
        if self.sink is not None:
            self.sink.add_rows(schema.REQUESTS, [self._request_row(r, res)])

    def _request_row(self, r: _Req, res: RequestResult) -> dict:
        row = {
            "run_id": self.run_id, "rid": res.rid, "workload": res.workload, "prompt_index": res.prompt_index,
            "seed": res.seed, "temperature": res.temperature, "prompt_tokens": res.prompt_tokens,
            "completion_tokens": len(res.output_tokens), "finish_reason": res.finish_reason,
            "output_tokens": res.output_tokens, "latency_s": res.latency_s,
        }
        v = r.verify_ct
        if v > 0:  # SGLang computes spec_* only for requests with at least one verify
            proposed = v * self.gamma
            row.update({
                "spec_verify_ct": v,
                "spec_accept_rate": r.correct_sum / proposed,
                "spec_accept_length": len(res.output_tokens) / v,
                "spec_num_correct_drafts": r.correct_sum,
                "spec_num_proposed_drafts": proposed,
                "spec_cap_length": (r.cap_tokens / v) if r.cap_tokens > 0 else None,
                "spec_block_accept_length": (r.block_accept_tokens / v) if self.mode == "cap-accept" else None,
                "spec_correct_drafts_histogram": r.correct_hist or None,
                "spec_cap_lens_histogram": r.cap_hist or None,
            })
        return row

"""Synthetic DSpark traffic with known ground truth, at the engine's telemetry schema.

Why: the tail estimator, the validation harness, STS and the cost/planner audit
need data whose uncapped ceiling, per-position hazards and cost curve are known
exactly, in volume, on a CPU in seconds. This generator simulates a small but
faithful world:

* each request has a latent difficulty; the target's next-token distribution at an
  absolute position depends only on (request, position) (so SGLang's cross-step
  assumption holds exactly), the drafter perturbs the target logits with noise that
  grows with difficulty and block position;
* acceptance follows the DeepSpec/SGLang rule (greedy: argmax match; sampled:
  ``u < p/q``; residual resampling; the capped bonus equals the next draft when it was
  accepted), so the uncapped ceiling is a realized draw, as in a cap-accept run;
* a confidence head predicts ``1 - TV(p, q)`` with noise and over-confidence (STS has
  work to do); the planner sizes a budget from the survival two decode steps back
  (fresh requests at survival 1) with an additive SPS table and allocates it top-k by
  current survival, as SGLang 0.5.23 does;
* step times follow a known additive cost (bias + alpha(N) + theta(N+M) with a tier
  step), with NULL ``step_cpu_ms`` after admission (prefill) passes.

``simulate(...)`` returns the tables of a **cap-accept** run (truth in ``ceiling``);
``compact_view`` hides what a compact run would not have. Example::

    >>> from estimators.synthetic import simulate, compact_view
    >>> sim = simulate(n_requests=40, seed=1)
    >>> rs = sim.tables["request_steps"]
    >>> bool((rs.ceiling >= rs.correct_drafts).all())
    True
    >>> comp = compact_view(rs)
    >>> bool(comp.ceiling.isna().all()) and int(comp.cap_trim.max()) <= 1
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from estimators.frame import BlockFrame

WORKLOADS = {
    # name: (target sharpness lambda, drafter noise sigma, mean completion length)
    "easy": (4.0, 0.45, 90),
    "medium": (3.0, 0.8, 70),
    "hard": (2.2, 1.3, 60),
}


@dataclass
class SpsTruth:
    """The true additive cost (ms): bias + alpha*N + theta(N+M) with a tier step at ``step_at``."""

    bias_ms: float = 8.0
    alpha_ms: float = 0.04
    theta_ms: float = 0.05
    step_at: int = 256
    step_ms: float = 2.0

    def alpha(self, n):
        return self.alpha_ms * np.asarray(n, float)

    def theta(self, b):
        b = np.asarray(b, float)
        return self.theta_ms * b + self.step_ms * (b >= self.step_at)

    def step_ms_(self, n, b):
        return self.bias_ms + self.alpha(n) + self.theta(b)

    def sglang_table(self, max_bs: int, max_tokens: int) -> dict:
        """SGLang additive table (seconds) sampled at int probes (alpha(first probe)=0 folded into bias)."""
        bs = sorted(set([1, 2, 4, 8, 16, 32, 64, 128, max_bs]))
        bs = [b for b in bs if b <= max_bs]
        m = sorted(set(list(range(16, max_tokens + 1, 16)) + [self.step_at - 1, self.step_at]))
        a = self.alpha(bs)
        t = self.theta(m)
        return {"bias_seconds": (self.bias_ms + a[0] + t[0]) / 1e3, "bs_probes": bs,
                "alpha_seconds": list((a - a[0]) / 1e3), "m_probes": m, "theta_seconds": list((t - t[0]) / 1e3)}


@dataclass
class Simulation:
    tables: dict[str, pd.DataFrame]
    gamma: int
    sts_temperatures: np.ndarray
    sps: SpsTruth
    sps_table: dict
    meta: dict = field(default_factory=dict)


def _softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def _sample(probs, u):
    cdf = np.cumsum(probs, -1)
    idx = (cdf < (u * cdf[..., -1])[..., None]).sum(-1)
    return np.minimum(idx, probs.shape[-1] - 1)


def _theta_additive(table: dict, n: int, b: np.ndarray) -> np.ndarray:
    a = np.interp(n, table["bs_probes"], table["alpha_seconds"])
    t = np.interp(b, table["m_probes"], table["theta_seconds"])
    return table["bias_seconds"] + a + t


def simulate(
    n_requests: int = 400,
    gamma: int = 7,
    vocab: int = 32,
    workloads: dict | None = None,
    greedy_frac: float = 0.3,
    temperature: float = 1.0,
    concurrency: tuple[int, ...] = (8, 16, 32, 64),
    phase_steps: int = 60,
    lag_steps: int = 2,
    sts_temperatures=None,
    head_scale: float = 1.6,
    head_bias: float = 0.6,
    head_noise: float = 0.5,
    sps: SpsTruth | None = None,
    trim: bool = True,
    run_id: str = "syn-cap",
    seed: int = 0,
    keep_step_tensors: bool = False,
) -> Simulation:
    """Simulate a cap-accept run; see the module docstring for the world model."""
    rng = np.random.default_rng(seed)
    workloads = workloads or WORKLOADS
    sps = sps or SpsTruth()
    G, V = int(gamma), int(vocab)
    T_sts = np.ones(G) if sts_temperatures is None else np.asarray(sts_temperatures, float)
    names = list(workloads)
    wl = rng.integers(0, len(names), n_requests)
    lam = np.array([workloads[names[i]][0] for i in wl]) * np.exp(0.15 * rng.standard_normal(n_requests))
    sig = np.array([workloads[names[i]][1] for i in wl]) * np.exp(0.3 * rng.standard_normal(n_requests))
    length = np.maximum(8, rng.poisson([workloads[names[i]][2] for i in wl])).astype(np.int64)
    prompt = rng.integers(16, 120, n_requests)
    temp = np.where(rng.random(n_requests) < greedy_frac, 0.0, temperature)
    # world: target logits per (request, absolute position) for positions prompt .. prompt+length+G+2
    span = length + G + 3
    off = np.concatenate([[0], np.cumsum(span)])
    world = (rng.standard_normal((off[-1], V)) * np.repeat(lam, span)[:, None]).astype(np.float32)

    def wpos(r, P):  # flat world row of absolute position P of request r
        return off[r] + (P - prompt[r])

    max_bs = max(concurrency)
    table = sps.sglang_table(max_bs, max_bs * (G + 1))
    # per-request survival history for the lagged planner input
    hist = np.ones((n_requests, 3, G))
    hist_step = np.full((n_requests, 3), -10, np.int64)

    queue = list(range(n_requests))
    active: list[int] = []
    prefix = prompt.copy()
    stepi = np.zeros(n_requests, np.int64)
    cols, steps = [], []
    fct = 0
    dstep = 0
    admitted_this = False
    step_tensors = []
    while queue or active:
        target_c = concurrency[(dstep // phase_steps) % len(concurrency)]
        admitted_this = False
        while queue and len(active) < target_c:
            active.append(queue.pop(0))
            fct += 1  # a prefill pass between decode steps
            admitted_this = True
        fct += 1
        A = np.array(active)
        N = len(A)
        s = prefix[A]
        P = s[:, None] + np.arange(G + 1)[None, :] + 1  # rows 0..G predict positions s+1..s+G+1
        tl = world[wpos(A[:, None], P)]  # (N, G+1, V)
        Tq = np.where(temp[A] > 0, temp[A], 1.0)[:, None, None]
        p = _softmax(tl / Tq)
        xi = rng.standard_normal(N)
        noise_sd = sig[A][:, None] * (1 + 0.15 * np.arange(G))[None, :] * np.exp(0.25 * xi)[:, None]
        dl = tl[:, :G] + rng.standard_normal((N, G, V)) * noise_sd[..., None]
        q = _softmax(dl / Tq)
        greedy = temp[A] <= 0
        d_s = _sample(q, rng.random((N, G)))
        d_g = dl.argmax(-1)
        d = np.where(greedy[:, None], d_g, d_s)
        ii = np.arange(N)[:, None]
        kk = np.arange(G)[None, :]
        pd_ = p[ii, kk, d]
        qd = q[ii, kk, d]
        acc_s = rng.random((N, G)) < pd_ / np.maximum(qd, 1e-8)
        acc_g = d == tl[:, :G].argmax(-1)
        acc = np.where(greedy[:, None], acc_g, acc_s)
        K = np.cumprod(acc, 1).sum(1)
        # confidence head: predicts 1 - TV(p, q), over-confident and noisy
        e = 1 - 0.5 * np.abs(p[:, :G] - q).sum(-1)
        e = np.clip(e, 1e-4, 1 - 1e-4)
        z = head_scale * np.log(e / (1 - e)) + head_bias + head_noise * rng.standard_normal((N, G))
        c = 1 / (1 + np.exp(-z / T_sts[None, :]))
        surv = np.cumprod(c, 1)
        # planner: budget from lagged survival (fresh -> ones), allocation by current survival
        lag_slot = (dstep - lag_steps) % 3
        lag_ok = hist_step[A, lag_slot] == dstep - lag_steps
        S_lag = np.where(lag_ok[:, None], hist[A, lag_slot], 1.0)
        if trim:
            cand = np.sort(S_lag[S_lag >= 1e-6])[::-1]
            tau = N + np.concatenate([[0.0], np.cumsum(cand)])
            Ms = np.arange(len(cand) + 1)
            theta = tau / _theta_additive(table, N, N + Ms)
            budget = int(np.argmax(theta))
            pred_s = float(_theta_additive(table, N, np.array([N + budget]))[0])
            pred_theta = float(theta[budget])
            flat = surv.reshape(-1)
            order = np.lexsort((np.repeat(np.arange(N), G), np.tile(np.arange(G), N), -flat))
            order = order[flat[order] >= 1e-6][:budget]
            sel = np.zeros(N * G, bool)
            sel[order] = True
            w = sel.reshape(N, G).sum(1)
        else:
            budget, pred_s, pred_theta = None, None, None
            w = np.full(N, G)
        slot = dstep % 3
        hist[A, slot] = surv
        hist_step[A, slot] = dstep
        cl = np.minimum(K, w)
        # bonus at row j = cl
        j = cl
        took = K > w
        pj = p[np.arange(N), j]
        qj = np.where((j < G)[:, None], q[np.arange(N), np.minimum(j, G - 1)], 0.0)
        resid = np.maximum(pj - qj, 0)
        resid = np.where((j >= G)[:, None] | (resid.sum(-1, keepdims=True) <= 0), pj, resid)
        samp = _sample(resid, rng.random(N))
        bonus_s = np.where(took, d[np.arange(N), np.minimum(j, G - 1)], samp)
        bonus_g = tl[np.arange(N), j].argmax(-1)
        bonus = np.where(greedy, bonus_g, bonus_s)
        # target log p of each draft under T=1 for greedy (as the engine records), T otherwise
        tlp = np.log(np.maximum(pd_, 1e-45))
        dlp = np.log(np.maximum(qd, 1e-45))
        vl = w + 1
        executed = N * (G + 1)
        true_ms = float(sps.step_ms_(N, executed))
        step_cpu = None if admitted_this else round(true_ms * float(np.exp(0.03 * rng.standard_normal())), 4)
        steps.append(dict(run_id=run_id, rank=0, epoch=0, forward_ct=fct, bs=N, mode="cap-accept",
                          budget=budget, lag_steps=lag_steps, num_running_reqs=N,
                          num_verify_tokens=int(vl.sum()), executed_verify_tokens=executed,
                          predicted_step_ms=None if pred_s is None else pred_s * 1e3,
                          predicted_theta=None if pred_theta is None else pred_theta / 1.0,
                          step_cpu_ms=step_cpu, wall_time_s=None))
        fin = s + cl + 1 >= prompt[A] + length[A]
        if keep_step_tensors:  # what SGLang's block-accept recorder is fed for this verify step
            step_tensors.append(dict(forward_ct=fct, rids=A.copy(), draft_tokens=d, corrected_logits=dl.astype(np.float32),
                                     target_logits=tl.astype(np.float32), temperature=np.where(greedy, 0.0, Tq[:, 0, 0]),
                                     correct_len=cl, cap_trim=K - cl, bonus=bonus, prefix_lens=s, verify_lens=w + 1))
        cols.append(dict(forward_ct=np.full(N, fct), rid_code=A, req_pool_index=np.arange(N), step_index=stepi[A].copy(),
                         prefix_len=s, verify_len=vl, window=w, correct_drafts=cl, acc_len=cl + 1, cap_trim=K - cl,
                         bonus_token=bonus, ceiling=K, temperature=temp[A], workload=wl[A], finished=fin,
                         draft_tokens=d, confidence=np.round(c, 4).astype(np.float32),
                         survival=np.round(surv, 4).astype(np.float32), confidence_logit=z.astype(np.float32),
                         draft_logprob=dlp.astype(np.float32), target_logprob=tlp.astype(np.float32)))
        prefix[A] = s + cl + 1
        stepi[A] += 1
        done = [r for r in active if prefix[r] >= prompt[r] + length[r]]
        for r in done:
            active.remove(r)
        dstep += 1
    rs = _assemble(cols, run_id, names, G)
    st = pd.DataFrame(steps)
    runs = pd.DataFrame([dict(run_id=run_id, arm="cap-accept", engine="reference", gamma=G, temperature=temperature,
                              target_model="synthetic", draft_model="synthetic", source="file",
                              config_json=json.dumps(dict(seed=seed, n_requests=n_requests, vocab=V)))])
    reqs = pd.DataFrame(dict(run_id=run_id, rid=[f"r{r}" for r in range(n_requests)],
                             workload=[names[i] for i in wl], temperature=temp, prompt_tokens=prompt,
                             prompt_index=np.arange(n_requests)))
    sim = Simulation(tables=dict(runs=runs, steps=st, request_steps=rs, requests=reqs), gamma=G,
                     sts_temperatures=T_sts, sps=sps, sps_table=table,
                     meta=dict(world=world, off=off, prompt=prompt, temp=temp, seed=seed, step_tensors=step_tensors))
    sim.tables.update(sglang_estimator_tables(sim))
    sim.tables["sts_samples"] = greedy_label_samples(sim)
    return sim


def _list_col(mat: np.ndarray, lens: np.ndarray | None = None):
    """(n, G) array -> Arrow list column (row i keeps its first lens[i] entries)."""
    n, G = mat.shape
    if lens is None:
        lens = np.full(n, G)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    mask = np.arange(G)[None, :] < lens[:, None]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(mat[mask]))


def _assemble(cols: list[dict], run_id: str, names: list[str], G: int) -> pd.DataFrame:
    cat = {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}
    n = len(cat["rid_code"])
    committed = np.concatenate([cat["draft_tokens"], np.zeros((n, 1), np.int64)], 1)
    committed[np.arange(n), cat["correct_drafts"]] = cat["bonus_token"]
    data = {
        "run_id": pa.array(np.full(n, run_id)), "rank": pa.array(np.zeros(n, np.int32)),
        "epoch": pa.array(np.zeros(n, np.int32)), "forward_ct": pa.array(cat["forward_ct"].astype(np.int64)),
        "rid": pa.array(np.char.add("r", cat["rid_code"].astype(str))),
    }
    for k in ("req_pool_index", "step_index", "prefix_len", "verify_len", "window", "correct_drafts", "acc_len", "cap_trim"):
        data[k] = pa.array(cat[k].astype(np.int32))
    data["bonus_token"] = pa.array(cat["bonus_token"].astype(np.int64))
    for k in ("draft_tokens", "confidence", "survival", "confidence_logit", "draft_logprob", "target_logprob"):
        data[k] = _list_col(cat[k])
    data["committed_tokens"] = _list_col(committed, cat["correct_drafts"] + 1)
    data["ceiling"] = pa.array(cat["ceiling"].astype(np.int32))
    data["temperature"] = pa.array(cat["temperature"].astype(np.float64))
    data["workload"] = pa.array(np.array(names, dtype=object)[cat["workload"]])
    data["finished"] = pa.array(cat["finished"].astype(bool))
    return pa.table(data).to_pandas()


def compact_view(rs: pd.DataFrame, run_id: str | None = None) -> pd.DataFrame:
    """What a compact run records for the same draws: no ceiling, ``cap_trim`` only from the bonus
    row (0/1), target log-probs only for the ``window + 1`` real target rows."""
    out = rs.copy()
    if run_id:
        out["run_id"] = run_id
    K = out["ceiling"].to_numpy()
    w = out["window"].to_numpy()
    cl = out["correct_drafts"].to_numpy()
    out["cap_trim"] = np.minimum(K, w + 1) - cl
    out["ceiling"] = pd.array([pd.NA] * len(out), dtype="Int32")
    tl = np.array(out["target_logprob"].tolist(), dtype=np.float32)
    tl[np.arange(tl.shape[1])[None, :] > w[:, None]] = np.nan
    out["target_logprob"] = list(tl)
    return out


def strip_logprobs(rs: pd.DataFrame) -> pd.DataFrame:
    """SGLang's cheap production telemetry: no draft/target log-probs, no pre-STS logits."""
    out = rs.copy()
    for c in ("draft_logprob", "target_logprob", "confidence_logit"):
        out[c] = None
    return out


def _world_logp(sim: Simulation, r: np.ndarray, P: np.ndarray, tok: np.ndarray) -> np.ndarray:
    m = sim.meta
    rows = m["off"][r] + (P - m["prompt"][r])
    lg = m["world"][rows].astype(np.float64)
    T = np.where(m["temp"][r] > 0, m["temp"][r], 1.0)[..., None]
    lg = lg / T
    mx = lg.max(-1, keepdims=True)
    lse = mx[..., 0] + np.log(np.exp(lg - mx).sum(-1))
    return np.take_along_axis(lg, tok[..., None], -1)[..., 0] - lse


def sglang_estimator_tables(sim: Simulation) -> dict[str, pd.DataFrame]:
    """The rows/``pg``/``eos`` records SGLang's block-accept recorder would write for this run
    (sampled rows only; target log-probs of trimmed tokens gathered from the world, as the
    recorder gathers them from later verify rows on the committed path)."""
    rs = sim.tables["request_steps"]
    bf = BlockFrame.from_request_steps(rs, gamma=sim.gamma)
    G = sim.gamma
    df = bf.df
    samp = ~bf.greedy
    base = pd.DataFrame(dict(run_id=df.run_id, rid=df.rid, fct=df.forward_ct, w=bf.window, cl=bf.correct,
                             ct=bf.cap_trim))[samp].reset_index(drop=True)
    opened = samp & bf.censored
    idx = np.flatnonzero(opened)
    later = bf.later(idx)
    k = np.arange(G)[None, :]
    wv = bf.window[idx][:, None]
    inblock = (k >= wv) & later["valid"]
    match = later["realized"] == bf.draft[idx]
    # emit offsets while all earlier trimmed positions matched (the divergent one included)
    prev_ok = np.cumprod(np.where(k >= wv, match | ~inblock, True), 1)
    prev_ok = np.concatenate([np.ones((len(idx), 1), bool), prev_ok[:, :-1].astype(bool)], 1)
    emit = inblock & prev_ok & np.cumprod(inblock | (k < wv), 1).astype(bool)
    bi, kj = np.nonzero(emit)
    r_code = df.rid.str[1:].astype(int).to_numpy()
    P = bf.prefix[idx][bi] + kj + 1
    tok = bf.draft[idx][bi, kj]
    plp = _world_logp(sim, r_code[idx][bi], P, tok)
    # row_fct: the row covering position P (its forward_ct)
    st = bf.stream()
    cnt = np.minimum(bf.correct + 1, (bf.committed >= 0).sum(1))
    row_of_stream = np.repeat(np.arange(bf.n), cnt)
    seg = bf.segment[idx][bi]
    sidx = st["seg_offset"][seg] + P - st["seg_first_pos"][seg]
    gather = pd.DataFrame(dict(run_id=df.run_id.to_numpy()[idx][bi], rid=df.rid.to_numpy()[idx][bi],
                               block_fct=df.forward_ct.to_numpy()[idx][bi], offset=kj + 1,
                               row_fct=df.forward_ct.to_numpy()[row_of_stream[sidx]], p_lp=plp,
                               trimmed_token=tok, realized_token=later["realized"][bi, kj]))
    rows = base.copy()
    tt = pd.Series([None] * len(rows), dtype=object)
    ql = pd.Series([None] * len(rows), dtype=object)
    sel = np.flatnonzero(opened[samp])
    tt.iloc[sel] = [bf.draft[i, bf.window[i]:].tolist() for i in idx]
    ql.iloc[sel] = [bf.draft_logprob[i, bf.window[i]:].tolist() for i in idx]
    rows["trimmed_tokens"] = tt
    rows["q_lp"] = ql
    rows["source_line"] = np.arange(1, len(rows) + 1)
    eos = pd.DataFrame(columns=["run_id", "rid", "block_fct"])
    return {"estimator_rows": rows, "estimator_gather": gather, "estimator_eos": eos}


def greedy_label_samples(sim: Simulation) -> pd.DataFrame:
    """SGLang STS-collector rows: pre-STS logits with the *greedy argmax-match* prefix label over all gamma rows."""
    rs = sim.tables["request_steps"]
    m = sim.meta
    G = sim.gamma
    r = rs.rid.str[1:].astype(int).to_numpy()
    P = rs.prefix_len.to_numpy()[:, None] + np.arange(G)[None, :] + 1
    rows = m["off"][r][:, None] + (P - m["prompt"][r][:, None])
    argmax = m["world"][rows].argmax(-1)
    d = np.array(rs.draft_tokens.tolist())
    lab = np.cumprod(d == argmax, 1).astype(np.float32)
    z = np.array(rs.confidence_logit.tolist(), np.float32)
    return pd.DataFrame(dict(run_id=rs.run_id, shard=0, row_index=np.arange(len(rs)), logits=list(z),
                             prefix_mask=list(lab), label_kind="greedy-argmax"))

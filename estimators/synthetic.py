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

    >>> from acceptscope.estimators.synthetic import simulate, compact_view
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

from acceptscope.estimators.frame import BlockFrame

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


@dataclass
class _World:
    """The requests and the target's logits: what every arm of the simulated engine decodes against."""

    names: list[str]
    wl: np.ndarray  # workload index per request
    lam: np.ndarray  # target sharpness per request
    sig: np.ndarray  # drafter noise per request
    length: np.ndarray
    prompt: np.ndarray
    temp: np.ndarray  # 0 = greedy
    world: np.ndarray  # target logits, one row per (request, absolute position)
    off: np.ndarray  # first world row of each request

    def rows(self, r, P):
        """Flat world row of absolute position ``P`` of request ``r``."""
        return self.off[r] + (P - self.prompt[r])


def _draw_world(rng, n_requests: int, workloads: dict, greedy_frac: float, temperature: float, G: int,
                V: int) -> _World:
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
    return _World(names, wl, lam, sig, length, prompt, temp, world, off)


def _draft_and_verify(rng, w: _World, A: np.ndarray, s: np.ndarray, G: int, T_sts: np.ndarray, head_scale: float,
                      head_bias: float, head_noise: float) -> dict:
    """One verify step of the active requests ``A`` at prefixes ``s``: the drafts, which the target
    accepts (``K``: the ceiling), and the drafter's confidence head (over-confident and noisy)."""
    N = len(A)
    P = s[:, None] + np.arange(G + 1)[None, :] + 1  # rows 0..G predict positions s+1..s+G+1
    tl = w.world[w.rows(A[:, None], P)]  # (N, G+1, V)
    Tq = np.where(w.temp[A] > 0, w.temp[A], 1.0)[:, None, None]
    p = _softmax(tl / Tq)
    xi = rng.standard_normal(N)
    noise_sd = w.sig[A][:, None] * (1 + 0.15 * np.arange(G))[None, :] * np.exp(0.25 * xi)[:, None]
    dl = tl[:, :G] + rng.standard_normal((N, G, tl.shape[-1])) * noise_sd[..., None]
    q = _softmax(dl / Tq)
    greedy = w.temp[A] <= 0
    d_s = _sample(q, rng.random((N, G)))
    d = np.where(greedy[:, None], dl.argmax(-1), d_s)
    ii, kk = np.arange(N)[:, None], np.arange(G)[None, :]
    pd_, qd = p[ii, kk, d], q[ii, kk, d]
    acc_s = rng.random((N, G)) < pd_ / np.maximum(qd, 1e-8)
    acc = np.where(greedy[:, None], d == tl[:, :G].argmax(-1), acc_s)
    # confidence head: predicts 1 - TV(p, q), over-confident and noisy
    e = np.clip(1 - 0.5 * np.abs(p[:, :G] - q).sum(-1), 1e-4, 1 - 1e-4)
    z = head_scale * np.log(e / (1 - e)) + head_bias + head_noise * rng.standard_normal((N, G))
    c = 1 / (1 + np.exp(-z / T_sts[None, :]))
    return dict(tl=tl, Tq=Tq, p=p, dl=dl, q=q, greedy=greedy, d=d, pd_=pd_, qd=qd, K=np.cumprod(acc, 1).sum(1),
                z=z, c=c, surv=np.cumprod(c, 1))


def _plan_windows(table: dict, S_lag: np.ndarray, surv: np.ndarray, G: int, trim: bool):
    """The planner: a verify budget from the lagged survival, spent on the highest current survivals.
    Returns (budget, predicted step seconds, predicted throughput, window per request)."""
    N = len(surv)
    if not trim:
        return None, None, None, np.full(N, G)
    cand = np.sort(S_lag[S_lag >= 1e-6])[::-1]
    tau = N + np.concatenate([[0.0], np.cumsum(cand)])
    theta = tau / _theta_additive(table, N, N + np.arange(len(cand) + 1))
    budget = int(np.argmax(theta))
    pred_s = float(_theta_additive(table, N, np.array([N + budget]))[0])
    flat = surv.reshape(-1)
    order = np.lexsort((np.repeat(np.arange(N), G), np.tile(np.arange(G), N), -flat))
    order = order[flat[order] >= 1e-6][:budget]
    sel = np.zeros(N * G, bool)
    sel[order] = True
    return budget, pred_s, float(theta[budget]), sel.reshape(N, G).sum(1)


def _bonus_tokens(rng, v: dict, cl: np.ndarray, took: np.ndarray, G: int) -> np.ndarray:
    """The token the target commits after the ``cl`` accepted drafts: the next draft where the
    window cut an accepted one (``took``), else a draw from the residual (greedy: the argmax)."""
    N = len(cl)
    p, q, n = v["p"], v["q"], np.arange(N)
    pj = p[n, cl]
    qj = np.where((cl < G)[:, None], q[n, np.minimum(cl, G - 1)], 0.0)
    resid = np.maximum(pj - qj, 0)
    resid = np.where((cl >= G)[:, None] | (resid.sum(-1, keepdims=True) <= 0), pj, resid)
    samp = _sample(resid, rng.random(N))
    bonus_s = np.where(took, v["d"][n, np.minimum(cl, G - 1)], samp)
    return np.where(v["greedy"], v["tl"][n, cl].argmax(-1), bonus_s)


class _SurvivalHistory:
    """Each request's survival at its last 3 steps; the planner reads it ``lag`` steps late (fresh: ones)."""

    def __init__(self, n_requests: int, G: int, lag: int):
        self.hist = np.ones((n_requests, 3, G))
        self.step = np.full((n_requests, 3), -10, np.int64)
        self.lag = lag

    def lagged(self, A: np.ndarray, dstep: int) -> np.ndarray:
        slot = (dstep - self.lag) % 3
        ok = self.step[A, slot] == dstep - self.lag
        return np.where(ok[:, None], self.hist[A, slot], 1.0)

    def record(self, A: np.ndarray, dstep: int, surv: np.ndarray) -> None:
        self.hist[A, dstep % 3] = surv
        self.step[A, dstep % 3] = dstep


def _request_step_cols(w: _World, v: dict, A, s, win, cl, bonus, fct: int, step_index) -> dict:
    """The request-step columns of one verify step (what the engine records per request)."""
    N, K = len(A), v["K"]
    # target log p of each draft under T=1 for greedy (as the engine records), T otherwise
    tlp = np.log(np.maximum(v["pd_"], 1e-45))
    dlp = np.log(np.maximum(v["qd"], 1e-45))
    return dict(forward_ct=np.full(N, fct), rid_code=A, req_pool_index=np.arange(N), step_index=step_index,
                prefix_len=s, verify_len=win + 1, window=win, correct_drafts=cl, acc_len=cl + 1, cap_trim=K - cl,
                bonus_token=bonus, ceiling=K, temperature=w.temp[A], workload=w.wl[A],
                finished=s + cl + 1 >= w.prompt[A] + w.length[A], draft_tokens=v["d"],
                confidence=np.round(v["c"], 4).astype(np.float32), survival=np.round(v["surv"], 4).astype(np.float32),
                confidence_logit=v["z"].astype(np.float32), draft_logprob=dlp.astype(np.float32),
                target_logprob=tlp.astype(np.float32))


def _recorder_tensors(v: dict, A, s, win, cl, bonus, fct: int) -> dict:
    """What SGLang's block-accept recorder is fed for one verify step."""
    return dict(forward_ct=fct, rids=A.copy(), draft_tokens=v["d"], corrected_logits=v["dl"].astype(np.float32),
                target_logits=v["tl"].astype(np.float32), temperature=np.where(v["greedy"], 0.0, v["Tq"][:, 0, 0]),
                correct_len=cl, cap_trim=v["K"] - cl, bonus=bonus, prefix_lens=s, verify_lens=win + 1)


def _run_tables(w: _World, run_id: str, temperature: float, G: int, V: int, seed: int, cols: list[dict],
                steps: list[dict]) -> dict[str, pd.DataFrame]:
    """The store's tables of the simulated run (request-steps, steps, the run and its requests)."""
    n = len(w.prompt)
    runs = pd.DataFrame([dict(run_id=run_id, arm="cap-accept", engine="reference", gamma=G, temperature=temperature,
                              target_model="synthetic", draft_model="synthetic", source="file",
                              config_json=json.dumps(dict(seed=seed, n_requests=n, vocab=V)))])
    reqs = pd.DataFrame(dict(run_id=run_id, rid=[f"r{r}" for r in range(n)], workload=[w.names[i] for i in w.wl],
                             temperature=w.temp, prompt_tokens=w.prompt, prompt_index=np.arange(n)))
    return dict(runs=runs, steps=pd.DataFrame(steps), request_steps=_assemble(cols, run_id, w.names, G), requests=reqs)


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
    sps = sps or SpsTruth()
    G, V = int(gamma), int(vocab)
    T_sts = np.ones(G) if sts_temperatures is None else np.asarray(sts_temperatures, float)
    w = _draw_world(rng, n_requests, workloads or WORKLOADS, greedy_frac, temperature, G, V)
    max_bs = max(concurrency)
    table = sps.sglang_table(max_bs, max_bs * (G + 1))
    hist = _SurvivalHistory(n_requests, G, lag_steps)
    queue = list(range(n_requests))
    active: list[int] = []
    prefix = w.prompt.copy()
    stepi = np.zeros(n_requests, np.int64)
    cols, steps, step_tensors = [], [], []
    fct = dstep = 0
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
        v = _draft_and_verify(rng, w, A, s, G, T_sts, head_scale, head_bias, head_noise)
        budget, pred_s, pred_theta, win = _plan_windows(table, hist.lagged(A, dstep), v["surv"], G, trim)
        hist.record(A, dstep, v["surv"])
        cl = np.minimum(v["K"], win)
        bonus = _bonus_tokens(rng, v, cl, v["K"] > win, G)
        executed = N * (G + 1)
        true_ms = float(sps.step_ms_(N, executed))
        step_cpu = None if admitted_this else round(true_ms * float(np.exp(0.03 * rng.standard_normal())), 4)
        steps.append(dict(run_id=run_id, rank=0, epoch=0, forward_ct=fct, bs=N, mode="cap-accept",
                          budget=budget, lag_steps=lag_steps, num_running_reqs=N,
                          num_verify_tokens=int((win + 1).sum()), executed_verify_tokens=executed,
                          predicted_step_ms=None if pred_s is None else pred_s * 1e3,
                          predicted_theta=pred_theta, step_cpu_ms=step_cpu, wall_time_s=None))
        if keep_step_tensors:
            step_tensors.append(_recorder_tensors(v, A, s, win, cl, bonus, fct))
        cols.append(_request_step_cols(w, v, A, s, win, cl, bonus, fct, stepi[A].copy()))
        prefix[A] = s + cl + 1
        stepi[A] += 1
        for r in [r for r in active if prefix[r] >= w.prompt[r] + w.length[r]]:
            active.remove(r)
        dstep += 1
    sim = Simulation(tables=_run_tables(w, run_id, temperature, G, V, seed, cols, steps), gamma=G,
                     sts_temperatures=T_sts, sps=sps, sps_table=table,
                     meta=dict(world=w.world, off=w.off, prompt=w.prompt, temp=w.temp, seed=seed,
                               step_tensors=step_tensors))
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

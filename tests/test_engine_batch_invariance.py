"""Per-request randomness and commit semantics of the reference engine.

* a sampled request's output does not depend on which requests share its batch (served alone,
  with 7 companions, with 7 other companions; compact and cap-accept), because every draw
  (drafter samples, acceptance coins, residual/bonus samples) comes from the request's own
  generators;
* at ``max_new_tokens`` a step records SGLang's ``acc_len = correct_drafts + 1`` and the real
  ``bonus_token``; ``committed_tokens`` is only what reached the output.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from acceptscope.engine.runner import Engine, RequestSpec
from acceptscope.domain.sps import SpsTable1D
from acceptscope.engine.telemetry import TelemetrySink
from tests._engine_tiny import single_torch_thread, target  # noqa: F401 (fixtures)
from tests._engine_tiny import TINY_VOCAB, OracleDrafter, tiny_dspark

V = TINY_VOCAB
G = 4
# an initialised table with a flat cost: the scheduler runs (warm budget, allocation), and its
# optimum verifies every draft, so windows do not depend on the batch
FLAT_SPS = SpsTable1D([1, 512], [1.0, 1.0], 512)


pytestmark = pytest.mark.usefixtures("single_torch_thread")


class _Capture:
    """A store stand-in that keeps the Arrow tables the telemetry sink hands over."""

    def __init__(self):
        self.tables: dict[str, list[pa.Table]] = {}

    def append(self, tables):
        for k, t in tables.items():
            self.tables.setdefault(k, []).append(t)

    def df(self, name):
        return pa.concat_tables(self.tables[name]).to_pandas()


def _companions(n: int, seed: int) -> list[RequestSpec]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(0, V, (2 + (i * 3 + seed) % 7,), generator=g).tolist()
        out.append(RequestSpec(rid=f"c{seed}-{i}", prompt_ids=p, max_new_tokens=6 + (i * 5 + seed) % 17,
                               temperature=[1.0, 0.0, 0.7, 1.3][(i + seed) % 4], seed=100 + seed + i))
    return out


def _drafter(kind, target):
    return OracleDrafter(target, gamma=G) if kind == "oracle" else tiny_dspark(target, gamma=G)


@pytest.mark.parametrize("kind", ["oracle", "dspark"])
def test_sampled_request_output_is_independent_of_its_batch(target, kind):
    probes = [RequestSpec(rid=f"x{j}", prompt_ids=[3 + j, 17, 9, 30 - j], max_new_tokens=20, temperature=1.0,
                          seed=5 + j) for j in range(2)]
    batches = {
        "alone": [[p] for p in probes],
        "with_a": [_companions(3, 1)[:2] + [probes[0]] + _companions(7, 1)[2:] + [probes[1]]],
        "with_b": [[probes[1]] + _companions(7, 2)[:4] + [probes[0]] + _companions(7, 2)[4:]],
    }
    seen: dict[tuple, dict] = {}
    correct = 0
    for mode in ("compact", "cap-accept"):
        for name, groups in batches.items():
            out = {}
            for specs in groups:
                eng = Engine(target, _drafter(kind, target), mode=mode, max_running_requests=8, max_seq_len=64,
                             sps=FLAT_SPS, seed=3)
                res = {r.rid: r for r in eng.run(specs)}
                for p in probes:
                    if p.rid in res:
                        out[p.rid] = res[p.rid].output_tokens
                        correct += res[p.rid].correct_drafts
                if name == "alone":
                    assert eng.decode_steps > eng.lag.lag_steps  # the scheduler was warm for most steps
            seen[(mode, name)] = out
    ref = seen[("compact", "alone")]
    assert all(len(v) == 20 for v in ref.values())
    for key, out in seen.items():
        assert out == ref, key
    assert ref["x0"] != ref["x1"]
    if kind == "oracle":
        assert correct > 0  # drafts were accepted: the drafter's samples reached the output


def test_dspark_propose_rows_depend_only_on_their_own_generator(target):
    d = tiny_dspark(target, gamma=G)
    x = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = target(x, output_hidden_states=True)
    from acceptscope.engine.target import target_hidden_for

    feats = target_hidden_for(out, d.config.target_layer_ids)[0]
    states = []
    for n in (5, 9, 12):
        s = d.new_state()
        d.extend_context(s, feats[:n])
        states.append(s)
    anchors = x[0, [5, 9, 11]]
    temps = torch.tensor([1.0, 1.0, 1.0])

    def gens(seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    full = d.propose(states, anchors, temps, gens([1, 2, 3]))
    row1 = d.propose(states[1:2], anchors[1:2], temps[1:2], gens([2]))
    assert torch.equal(full.tokens[1], row1.tokens[0])
    other = d.propose([states[1], states[0]], anchors[[1, 0]], temps[:2], gens([2, 77]))
    assert torch.equal(other.tokens[0], row1.tokens[0])
    # each row takes exactly gamma uniforms from its generator per call, whatever its temperature
    g = torch.Generator().manual_seed(9)
    d.propose(states[:1], anchors[:1], torch.zeros(1), [g])
    ref = torch.Generator().manual_seed(9)
    torch.rand(G, generator=ref)
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=ref))
    with pytest.raises(ValueError, match="3 states but 2 generators"):
        d.propose(states, anchors, temps, gens([1, 2]))
    # a single generator or None still works (batch-wide draw)
    assert d.propose(states, anchors, temps, torch.Generator().manual_seed(1)).tokens.shape == (3, G)
    assert d.propose(states, anchors, torch.zeros(3)).tokens.shape == (3, G)


def _run_capture(target, spec, mode="cap-accept"):
    cap = _Capture()
    sink = TelemetrySink(cap)
    eng = Engine(target, OracleDrafter(target, gamma=G), mode=mode, max_running_requests=2, max_seq_len=96,
                 sps=FLAT_SPS, seed=1, sink=sink)
    res = eng.run([spec])
    sink.close()
    rs = cap.df("request_steps").sort_values("step_index").reset_index(drop=True)
    return res[0], rs


@pytest.mark.parametrize("mode", ["compact", "cap-accept"])
def test_length_limit_records_acc_len_and_the_real_bonus(target, mode):
    prompt = [4, 11, 29, 7, 40]
    long_res, long_rs = _run_capture(target, RequestSpec("L", prompt, max_new_tokens=60, temperature=1.0, seed=8),
                                     mode)
    assert long_res.finish_reason == "length" and len(long_res.output_tokens) == 60
    truncated = 0
    for n in range(2, 26):
        res, rs = _run_capture(target, RequestSpec("L", prompt, max_new_tokens=n, temperature=1.0, seed=8), mode)
        assert res.finish_reason == "length"
        assert res.output_tokens == long_res.output_tokens[:n]  # commit acc_len tokens, then truncate
        last = rs.iloc[-1]
        assert bool(last.finished) and not rs.finished.iloc[:-1].any()
        for i, r in rs.iterrows():  # identical steps up to the limit: same decisions as without it
            lr = long_rs.iloc[i]
            assert (r.correct_drafts, r.acc_len, r.bonus_token, list(r.draft_tokens)) == (
                lr.correct_drafts, lr.acc_len, lr.bonus_token, list(lr.draft_tokens))
            assert r.acc_len == r.correct_drafts + 1
            full = list(r.draft_tokens)[: r.correct_drafts] + [r.bonus_token]
            assert list(r.committed_tokens) == full[: len(r.committed_tokens)]
        assert 1 + sum(len(c) for c in rs.committed_tokens) == n
        if len(last.committed_tokens) < last.acc_len:
            truncated += 1
            assert list(long_rs.iloc[len(rs) - 1].committed_tokens)[-1] == last.bonus_token  # real bonus
    assert truncated >= 3


def test_audit_subset_replaying_production_windows_commits_identical_tokens(target):
    """With a trimming SPS table the windows depend on the batch; a subset audit arm that replays the
    production arm's recorded windows still commits exactly the production tokens."""
    from tests.test_engine_lossless import TRIM_SPS, _prompts

    specs = [RequestSpec(rid=f"r{i}", prompt_ids=p, max_new_tokens=24, temperature=1.0, seed=11)
             for i, p in enumerate(_prompts(16, V, seed=1))]
    cap = _Capture()
    sink = TelemetrySink(cap)
    prod = Engine(target, OracleDrafter(target, gamma=G), mode="compact", max_running_requests=6, max_seq_len=64,
                  sps=TRIM_SPS, seed=11, sink=sink)
    full = {r.rid: r.output_tokens for r in prod.run(specs)}
    sink.close()
    rs = cap.df("request_steps").sort_values(["rid", "step_index"])
    assert (rs.window < G).any()  # windows really trimmed
    plan = {rid: g.window.tolist() for rid, g in rs.groupby("rid")}
    subset = [specs[i] for i in (2, 7, 11)]
    runs = {}
    for replay in (None, plan):
        eng = Engine(target, OracleDrafter(target, gamma=G), mode="cap-accept", max_running_requests=6,
                     max_seq_len=64, sps=TRIM_SPS, seed=11, window_replay=replay)
        runs[replay is not None] = {r.rid: (r.output_tokens, r.verify_ct) for r in eng.run(subset)}
    assert all(runs[True][s.rid] == (full[s.rid], len(plan[s.rid])) for s in subset)
    assert any(runs[False][s.rid][0] != full[s.rid] for s in subset)  # without replay the subset diverges

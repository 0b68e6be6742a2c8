"""The reference engine's models: tokenizer, offline target loading, hidden-state taps, and the DSpark
drafter's API (save/load, KV injection, Markov sampling, confidence head)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from acceptscope.domain import corpus
from acceptscope.engine.drafter import DrafterConfig, DSparkDrafter, Proposal
from acceptscope.engine.target import (
    default_target_layer_ids,
    load_target,
    make_target_config,
    target_hidden_for,
    validate_target_layer_ids,
)
from acceptscope.domain.chat import IM_END, MASK_TOKEN, format_chat
from acceptscope.engine.tokenizer import load_tokenizer, special_token_ids, train_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"
TARGET_DIR, DRAFTER_DIR = FIXTURES / "target", FIXTURES / "drafter"


# ---------------------------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    rng = random.Random(0)
    texts = [format_chat([{"role": "user", "content": corpus.math_problem(rng)[0]},
                          {"role": "assistant", "content": corpus.verse_exchange(rng)[1]}]) for _ in range(60)]
    out = tmp_path_factory.mktemp("tok")
    tok = train_tokenizer(texts, vocab_size=400, out_dir=out)
    return tok, out


def test_tokenizer_round_trip_and_specials(small_tokenizer):
    tok, out = small_tokenizer
    loaded = load_tokenizer(out)
    text = "def f(x):\n    return x * 2  # ünïcödé ✓ 数学\n\tTabs & \\boxed{42}"
    for t in (tok, loaded):
        ids = t.encode(text, add_special_tokens=False)
        assert t.decode(ids) == text
    sp = special_token_ids(loaded)
    assert len(set(sp.values())) == 4
    # special tokens are single ids and never split
    assert loaded.encode(MASK_TOKEN, add_special_tokens=False) == [sp["mask"]]
    assert loaded.eos_token == IM_END and loaded.eos_token_id == sp["eos"]
    chat = loaded.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == format_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True)


# ---------------------------------------------------------------------------------------------- target


def test_layer_id_rules():
    assert default_target_layer_ids(6, 3) == [0, 2, 4]
    assert validate_target_layer_ids([-1, 1], 4) == [-1, 1]
    with pytest.raises(ValueError, match="last decoder layer"):
        validate_target_layer_ids([0, 3], 4)
    with pytest.raises(ValueError, match="strictly increasing"):
        validate_target_layer_ids([2, 1], 4)


def test_target_hidden_for_maps_layer_ids():
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    m = Qwen3ForCausalLM(make_target_config(50, hidden_size=16, num_layers=3, num_heads=2, num_kv_heads=1,
                                            head_dim=8, intermediate_size=32)).eval()
    x = torch.randint(0, 50, (1, 6))
    out = m(x, output_hidden_states=True)
    feats = target_hidden_for(out, [-1, 0, 1])
    assert feats.shape == (1, 6, 48)
    assert torch.equal(feats[..., :16], out.hidden_states[0])  # -1 = embeddings
    assert torch.equal(feats[..., 32:], out.hidden_states[2])  # layer 1 = hidden_states[2]
    # the final entry is the normed state: lm_head of it gives the logits, which is why it is not tappable
    assert torch.allclose(m.lm_head(out.hidden_states[-1]), out.logits, atol=1e-5)


@pytest.mark.skipif(not (TARGET_DIR / "config.json").is_file(), reason="fixture models not trained")
def test_fixture_target_loads_offline_with_auto_classes():
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    model = AutoModelForCausalLM.from_pretrained(str(TARGET_DIR), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(TARGET_DIR), local_files_only=True)
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert model.config.model_type == "qwen3"
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3 * 4?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 8 or tok.eos_token_id in out[0].tolist()
    t = load_target(TARGET_DIR)
    assert next(t.parameters()).dtype == torch.float32 and not t.training


# ---------------------------------------------------------------------------------------------- drafter


def _tiny_pair(gamma: int = 4, head: str = "vanilla"):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    tc = make_target_config(64, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8,
                            intermediate_size=64)
    target = Qwen3ForCausalLM(tc).eval()
    cfg = DrafterConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                        intermediate_size=64, target_layer_ids=[0, 1, 2], target_hidden_size=32, mask_token_id=63,
                        gamma=gamma, markov_rank=8, markov_head_type=head)
    drafter = DSparkDrafter(cfg)
    drafter.load_shared_from_target(target)
    with torch.no_grad():  # make every trainable weight matter (zero-initialised heads included)
        for p in drafter.trainable_parameters():
            p.normal_(0, 0.3)
    return target, drafter.eval()


def _feats(target, ids):
    with torch.no_grad():
        return target_hidden_for(target(ids, output_hidden_states=True), [0, 1, 2])[0]


def test_config_round_trip_and_marker():
    _, d = _tiny_pair()
    raw = d.config.to_dict()
    assert raw["dspark"] is True
    assert DrafterConfig.from_dict(json.loads(json.dumps(raw))) == d.config
    with pytest.raises(ValueError, match="dspark"):
        DrafterConfig.from_dict({k: v for k, v in raw.items() if k != "dspark"})


def test_save_load_round_trip(tmp_path):
    target, d = _tiny_pair()
    d.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dspark"] is True
    with pytest.raises(ValueError, match="target"):
        DSparkDrafter.from_pretrained(tmp_path)  # shared weights not saved and no target given
    d2 = DSparkDrafter.from_pretrained(tmp_path, target=target)
    for (k, a), (_, b) in zip(d.state_dict().items(), d2.state_dict().items()):
        assert torch.equal(a, b), k
    x = torch.randint(0, 60, (1, 10))
    s1, s2 = d.new_state(), d2.new_state()
    d.extend_context(s1, _feats(target, x))
    d2.extend_context(s2, _feats(target, x))
    p1, p2 = d.propose([s1], x[0, -1:]), d2.propose([s2], x[0, -1:])
    assert torch.equal(p1.tokens, p2.tokens) and torch.allclose(p1.logprobs, p2.logprobs)
    # with the shared weights saved it loads stand-alone
    d.save_pretrained(tmp_path / "full", save_shared=True)
    d3 = DSparkDrafter.from_pretrained(tmp_path / "full")
    assert torch.equal(d3.lm_head.weight, d.lm_head.weight)


def test_propose_shapes_greedy_determinism_and_context_sensitivity():
    target, d = _tiny_pair(gamma=5)
    x = torch.randint(0, 60, (1, 14))
    feats = _feats(target, x)
    a, b = d.new_state(capacity=2), d.new_state()
    d.extend_context(a, feats[:6])
    d.extend_context(a, feats[6:12])  # incremental == at once
    d.extend_context(b, feats[:12])
    assert a.length == b.length == 12
    assert torch.allclose(a.k[:, :, :12], b.k[:, :, :12], atol=1e-6)
    # the batched form equals per-request calls
    e1, e2 = d.new_state(), d.new_state()
    d.extend_context(e1, feats[:3])
    d.extend_contexts([e1, e2], [feats[3:12], feats[:7]])
    assert (e1.length, e2.length) == (12, 7)
    assert torch.allclose(e1.k[:, :, :12], b.k[:, :, :12], atol=1e-5)
    assert torch.allclose(e2.v[:, :, :7], b.v[:, :, :7], atol=1e-5)
    anchors = x[0, [12, 12]]
    p = d.propose([a, b], anchors, torch.zeros(2))
    assert isinstance(p, Proposal)
    assert p.tokens.shape == (2, 5) and p.tokens.dtype == torch.long
    assert p.logprobs.shape == (2, 5, 64) and p.confidence_logits.shape == (2, 5)
    assert torch.allclose(p.logprobs.exp().sum(-1), torch.ones(2, 5), atol=1e-4)
    assert torch.equal(p.tokens, p.logprobs.argmax(-1))  # greedy rows take the argmax of q
    assert torch.equal(p.tokens, d.propose([a, b], anchors, torch.zeros(2)).tokens)  # deterministic
    # a different context changes the draft distribution
    c = d.new_state()
    d.extend_context(c, feats[:12].flip(0))
    pc = d.propose([c], anchors[:1], torch.zeros(1))
    assert not torch.allclose(pc.logprobs[0], p.logprobs[0], atol=1e-3)
    # rows of different context lengths batch together and match their single-row proposals
    short = d.new_state()
    d.extend_context(short, feats[:5])
    pb = d.propose([a, short], torch.stack([x[0, 12], x[0, 5]]), torch.zeros(2))
    ps = d.propose([short], x[0, 5:6], torch.zeros(1))
    assert torch.equal(pb.tokens[1], ps.tokens[0])
    assert torch.allclose(pb.logprobs[1], ps.logprobs[0], atol=1e-5)


@pytest.mark.parametrize("head", ["vanilla", "rnn"])
def test_sampling_uses_generator_and_markov_chain(head):
    target, d = _tiny_pair(head=head)
    x = torch.randint(0, 60, (1, 9))
    s = d.new_state()
    d.extend_context(s, _feats(target, x[:, :8]))
    t = torch.ones(1)
    p1 = d.propose([s], x[0, 8:9], t, torch.Generator().manual_seed(5))
    p2 = d.propose([s], x[0, 8:9], t, torch.Generator().manual_seed(5))
    assert torch.equal(p1.tokens, p2.tokens)
    # the logprobs are those of the Markov-corrected chain along the sampled tokens (teacher-forced check)
    seq = torch.cat([x[0, :9], p1.tokens[0]]).unsqueeze(0)
    with torch.no_grad():
        out = d.forward_train(target_hidden_for(target(seq, output_hidden_states=True), [0, 1, 2]), seq,
                              torch.tensor([[8]]))
    assert torch.allclose(out["logits"][0, 0].log_softmax(-1), p1.logprobs[0], atol=1e-4)
    assert torch.allclose(out["confidence_logits"][0, 0], p1.confidence_logits[0], atol=1e-4)
    # the sequential head really conditions on the previous token
    h = torch.randn(1, d.config.hidden_size)
    b1, _ = d.sequential_bias(torch.tensor([1]), h, None)
    b2, _ = d.sequential_bias(torch.tensor([2]), h, None)
    assert not torch.allclose(b1, b2)
    if head == "rnn":  # ... and on its state
        _, st = d.sequential_bias(torch.tensor([1]), h, None)
        b3, _ = d.sequential_bias(torch.tensor([1]), h, st)
        assert d.rnn_proj is not None and not torch.allclose(b1, b3)


def test_confidence_head_reads_hidden_and_markov_embedding():
    _, d = _tiny_pair()
    h = torch.randn(3, d.config.hidden_size)
    prev = torch.tensor([1, 2, 3])
    z = d.confidence_logits(h, prev)
    assert z.shape == (3,)
    w = d.confidence_head.weight[0]
    manual = torch.cat([h, d.markov_w1(prev)], -1) @ w + d.confidence_head.bias
    assert torch.allclose(z, manual, atol=1e-5)
    assert d.confidence_head.in_features == d.config.hidden_size + d.config.markov_rank


@pytest.mark.skipif(not (DRAFTER_DIR / "config.json").is_file(), reason="fixture models not trained")
def test_fixture_pair_drafts_something_the_target_accepts():
    """The shipped drafter, driven through the public API, agrees with the shipped target on a math prompt."""
    from acceptscope.engine.eval_acceptance import greedy_acceptance

    target = load_target(TARGET_DIR)
    drafter = DSparkDrafter.from_pretrained(DRAFTER_DIR)  # embed/lm_head come from ../target
    tok = load_tokenizer(TARGET_DIR)
    assert drafter.config.gamma == 7 and drafter.config.mask_token_id == special_token_ids(tok)["mask"]
    r = greedy_acceptance(target, drafter, tok, corpus.eval_prompts("math", 1), max_new_tokens=24)
    assert r["rounds"] > 0 and r["tau_mean"] > 2.0

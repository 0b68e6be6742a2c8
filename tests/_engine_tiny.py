"""Tiny random models for the engine's property tests (no fixtures, no downloads).

* ``tiny_target``: a random Qwen3 (HF) model with a small vocabulary.
* ``OracleDrafter``: a drafter that honours the engine's drafter protocol and drafts from a
  *perturbed copy of the target* (target logits + a fixed random bigram bias), so drafts are
  often but not always accepted: it exercises multi-token accepts, rejections, residual
  samples and cap trims. It recovers the committed tokens from the layer -1 (embedding)
  features it is given, exactly as a real drafter only sees target hidden states.
* ``tiny_dspark``: the real ``DSparkDrafter`` with random weights (protocol conformance).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from acceptscope.engine.kv import CachedTarget, pack
from acceptscope.engine.sampling import sample_inverse_cdf


def tiny_target(vocab: int = 48, hidden: int = 32, layers: int = 3, seed: int = 0, eos: int | None = None,
                sharpen: float = 8.0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      max_position_embeddings=1024, tie_word_embeddings=True, eos_token_id=eos)
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper distributions than the default init, so argmax is rarely near a tie
        m.lm_head.weight.mul_(sharpen)
    for p in m.parameters():
        p.requires_grad_(False)
    return m


@dataclass
class _Cfg:
    gamma: int
    target_layer_ids: list = field(default_factory=lambda: [-1, 0])


@dataclass
class _State:
    tokens: list = field(default_factory=list)


@dataclass
class _Proposal:
    tokens: torch.Tensor
    logprobs: torch.Tensor
    confidence_logits: torch.Tensor


class OracleDrafter:
    def __init__(self, target, gamma: int = 4, noise: float = 1.5, max_batch: int = 256, max_len: int = 512, seed: int = 1):
        self.config = _Cfg(gamma)
        self.target = target
        self.emb = target.get_input_embeddings().weight.detach()
        self.H = self.emb.shape[1]
        g = torch.Generator().manual_seed(seed)
        V = self.emb.shape[0]
        self.bias = noise * torch.randn(V, V, generator=g)
        self.runner = CachedTarget(target, [0], max_batch, max_len)

    def new_state(self):
        return _State()

    def extend_context(self, state, target_hidden):
        e = target_hidden[:, : self.H]
        ids = torch.cdist(e, self.emb).argmin(-1)
        state.tokens.extend(ids.tolist())

    @torch.no_grad()
    def propose(self, states, anchor_tokens, temperatures, generator=None):
        B, G = len(states), self.config.gamma
        seqs = [s.tokens + [int(a)] for s, a in zip(states, anchor_tokens.tolist())]
        lens = [len(x) for x in seqs]
        slots = list(range(B))
        pb = pack(slots, [0] * B, lens)
        toks = torch.tensor([t for x in seqs for t in x])
        logits, _ = self.runner.forward(pb, toks, logit_rows=pb.cu_seqlens[1:] - 1, want_hidden=False)
        prev = anchor_tokens.clone()
        greedy = temperatures <= 0
        t = torch.where(greedy, torch.ones_like(temperatures), temperatures).unsqueeze(1)
        out_t = torch.empty(B, G, dtype=torch.long)
        out_lp = torch.empty(B, G, logits.shape[-1])
        conf = torch.empty(B, G)
        row_u = None  # one generator per row: G uniforms per row per call, inverse-CDF (as DSparkDrafter)
        if generator is not None and not isinstance(generator, torch.Generator):
            row_u = torch.stack([torch.rand(G, generator=gn) for gn in generator]) if B else torch.empty(0, G)
        for k in range(G):
            ql = logits + self.bias[prev]
            lp = torch.log_softmax(ql / t, -1)
            if row_u is not None:
                tok = torch.where(greedy, ql.argmax(-1), sample_inverse_cdf(lp.exp(), row_u[:, k]))
            elif bool(greedy.all()):
                tok = ql.argmax(-1)
            else:
                samp = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(1)
                tok = torch.where(greedy, ql.argmax(-1), samp)
            out_t[:, k] = tok
            out_lp[:, k] = lp
            pm = lp.exp().max(-1).values.clamp(1e-4, 1 - 1e-4)
            conf[:, k] = torch.log(pm / (1 - pm))
            prev = tok
            if k + 1 < G:
                pb2 = pack(slots, [l + k for l in lens], [1] * B)
                logits, _ = self.runner.forward(pb2, tok, want_hidden=False)
        return _Proposal(out_t, out_lp, conf)


def tiny_dspark(target, gamma: int = 4, layer_ids=(0, 1), seed: int = 0):
    from acceptscope.engine.drafter import DrafterConfig, DSparkDrafter

    torch.manual_seed(seed)
    V, H = target.config.vocab_size, target.config.hidden_size
    cfg = DrafterConfig(vocab_size=V, hidden_size=H, num_layers=1, num_heads=2, head_dim=H // 2,
                        intermediate_size=2 * H, target_layer_ids=list(layer_ids), target_hidden_size=H,
                        mask_token_id=V - 1, gamma=gamma, markov_rank=8)
    d = DSparkDrafter(cfg)
    d.load_shared_from_target(target)
    with torch.no_grad():
        torch.nn.init.normal_(d.markov_w2.weight, std=0.5)
        torch.nn.init.normal_(d.confidence_head.weight, std=0.5)
    return d.eval()


def hf_greedy(target, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """The target's own greedy decoding: a plain full-recompute argmax loop over the HF forward."""
    ids = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = target(torch.tensor([ids])).logits[0, -1]
            t = int(logits.argmax())
            out.append(t)
            ids.append(t)
            if eos is not None and t == eos:
                break
    return out


def save_tiny_pair(root, gamma: int = 4, vocab: int = 320, hidden: int = 32, seed: int = 0):
    """A random target + random DSpark drafter + trained BPE tokenizer on disk (for run_engine tests)."""
    from pathlib import Path

    from acceptscope.domain.corpus import eval_prompts
    from acceptscope.engine.target import make_target_config
    from acceptscope.domain.chat import format_chat
    from acceptscope.engine.tokenizer import special_token_ids, train_tokenizer
    from transformers import Qwen3ForCausalLM

    root = Path(root)
    tdir, ddir = root / "target", root / "drafter"
    texts = [format_chat([{"role": "user", "content": p}, {"role": "assistant", "content": p[::-1]}])
             for w in ("math", "chat", "verse") for p in eval_prompts(w, 40, seed=7)]
    tok = train_tokenizer(texts, vocab_size=vocab, out_dir=tdir)
    ids = special_token_ids(tok)
    V = len(tok)
    torch.manual_seed(seed)
    cfg = make_target_config(V, hidden_size=hidden, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=hidden // 4,
                             intermediate_size=2 * hidden, eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(4.0)
    m.save_pretrained(str(tdir))
    from acceptscope.engine.drafter import DrafterConfig, DSparkDrafter

    dcfg = DrafterConfig(vocab_size=V, hidden_size=hidden, num_layers=1, num_heads=2, head_dim=hidden // 2,
                         intermediate_size=2 * hidden, target_layer_ids=[0, 1], target_hidden_size=hidden,
                         mask_token_id=ids["mask"], gamma=gamma, markov_rank=8, eos_token_id=ids["eos"])
    d = DSparkDrafter(dcfg)
    d.load_shared_from_target(m)
    with torch.no_grad():
        torch.nn.init.normal_(d.markov_w2.weight, std=0.5)
        torch.nn.init.normal_(d.confidence_head.weight, std=0.5)
    d.save_pretrained(str(ddir))
    return tdir, ddir


TINY_VOCAB = 48


@pytest.fixture(scope="module")
def single_torch_thread():
    """Engine tests compare token streams; one thread keeps the float reductions reproducible."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def target():
    """The tiny random target shared by the engine property tests."""
    return tiny_target(vocab=TINY_VOCAB, seed=0)

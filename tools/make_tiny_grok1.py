#!/usr/bin/env python3
"""Makes tests/fixtures/tiny-grok1: a tiny random Grok-1 in the Hugging Face layout SGLang loads
(config.json with Grok-1's fields, sharded bf16 safetensors, the tiny-mixtral tokenizer) and its
float32 reference logits and greedy continuation. transformers has no Grok-1, so the reference is
the small torch model below, written from the semantics of xai-org/grok-1's model.py.

Run with the tools venv (scripts/install-tools): .venv-tools/bin/python tools/make_tiny_grok1.py
"""
import argparse
import json
import math
import pathlib
import shutil

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

PROMPT = "The quick brown fox jumps over the lazy dog. Question: Tom has 3 apples and buys 4 more."
TOKENIZER_FROM = pathlib.Path("tests/fixtures/tiny-mixtral")
SHARD_BYTES = 200_000

# Grok-1's fields at a tiny size. The multipliers and the soft-cap differ from Grok-1's own values on
# purpose: attn_output_multiplier is not 1/sqrt(head_dim) and max_attn_value is small enough to bend
# this model's attention logits, so a forward pass that ignores either fails the logits test.
CONFIG = {
    "architectures": ["Grok1ModelForCausalLM"],
    "model_type": "grok-1",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 4,  # hpcai-tech's name (SGLang's is num_local_experts)
    "num_experts_per_tok": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "embedding_multiplier_scale": 8.0,
    "output_multiplier_scale": 0.5773502691896257,
    "attn_output_multiplier": 0.35,
    "max_attn_value": 2.0,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


# --- Grok-1, float32, one sequence (model.py's semantics; the comments name its pieces) ---------

def rms_norm(x, weight, eps):  # RMSNorm: fp32, x · rsqrt(mean(x²) + eps) · scale
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x, base):  # RotaryEmbedding: x (T, heads, D); rotate_half pairs dims i and i + D/2
    T, _, D = x.shape
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    phase = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    phase = torch.cat([phase, phase], dim=-1)[:, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * torch.cos(phase) + torch.cat([-x2, x1], dim=-1) * torch.sin(phase)


def attention(h, w, p, cfg):  # MultiHeadAttention
    T, D = h.shape[0], cfg["head_dim"]
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    q = rope((h @ w[p + "self_attn.q_proj.weight"].T).view(T, Hq, D), cfg["rope_theta"])
    k = rope((h @ w[p + "self_attn.k_proj.weight"].T).view(T, Hkv, D), cfg["rope_theta"])
    v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, Hkv, D)
    k = k.repeat_interleave(Hq // Hkv, dim=1)  # query head h reads kv head h // (Hq / Hkv)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    logits = torch.einsum("thd,shd->hts", q, k) * cfg["attn_output_multiplier"]
    cap = cfg["max_attn_value"]
    logits = cap * torch.tanh(logits / cap)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    logits = torch.where(causal, logits, torch.tensor(-1e30))
    out = torch.einsum("hts,shd->thd", torch.softmax(logits, dim=-1), v).reshape(T, Hq * D)
    return out @ w[p + "self_attn.o_proj.weight"].T


def moe(h, w, p, cfg, stats):  # Router + MoELayer: softmax over all experts, top-k, not renormalized
    m = p + "block_sparse_moe."
    router_logits = h @ w[m + "gate.weight"].T
    # How close the k-th expert came to losing its place: rounding can flip a near tie.
    k = cfg["num_experts_per_tok"]
    ranked = torch.sort(router_logits, dim=-1, descending=True).values
    stats["router_gap"] = min(stats["router_gap"], float((ranked[:, k - 1] - ranked[:, k]).min()))
    probs = torch.softmax(router_logits, dim=-1)
    gates, experts = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)
    # As model.py's one-hot "slow matmul": every expert on every token, kept where chosen.
    chosen = torch.zeros_like(probs).scatter(-1, experts, gates)  # (T, E)
    out = torch.zeros_like(h)
    for e in range(cfg["num_experts"]):
        x = m + f"experts.{e}."
        # DenseBlock: gelu(linear(x)) * linear_v(x), then linear_1; jax.nn.gelu's default is the
        # tanh approximation.
        act = torch.nn.functional.gelu(h @ w[x + "w1.weight"].T, approximate="tanh")
        out += chosen[:, e:e + 1] * ((act * (h @ w[x + "w3.weight"].T)) @ w[x + "w2.weight"].T)
    return out


def forward(ids, w, cfg, stats=None):  # LanguageModel, Transformer, DecoderLayer: (T) -> (T, V)
    stats = {"router_gap": math.inf} if stats is None else stats
    eps = cfg["rms_norm_eps"]
    h = w["model.embed_tokens.weight"][ids] * cfg["embedding_multiplier_scale"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = attention(rms_norm(h, w[p + "pre_attn_norm.weight"], eps), w, p, cfg)
        h = h + rms_norm(a, w[p + "post_attn_norm.weight"], eps)
        f = moe(rms_norm(h, w[p + "pre_moe_norm.weight"], eps), w, p, cfg, stats)
        h = h + rms_norm(f, w[p + "post_moe_norm.weight"], eps)
    h = rms_norm(h, w["model.norm.weight"], eps)
    return (h @ w["lm_head.weight"].T) * cfg["output_multiplier_scale"]


# --- the checkpoint -----------------------------------------------------------------------------

def random_weights(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    H, I, V, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    Hq, Hkv, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_experts"]

    def normal(*shape):
        return 0.08 * torch.randn(*shape, generator=g)

    def norm():  # away from 1, so that a loader ignoring a norm fails the test
        return 1.0 + 0.2 * torch.randn(H, generator=g)

    w = {"model.embed_tokens.weight": normal(V, H)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name in ("pre_attn_norm", "post_attn_norm", "pre_moe_norm", "post_moe_norm"):
            w[p + name + ".weight"] = norm()
        w[p + "self_attn.q_proj.weight"] = normal(Hq * D, H)
        w[p + "self_attn.k_proj.weight"] = normal(Hkv * D, H)
        w[p + "self_attn.v_proj.weight"] = normal(Hkv * D, H)
        w[p + "self_attn.o_proj.weight"] = normal(H, Hq * D)
        w[p + "block_sparse_moe.gate.weight"] = normal(E, H)
        for e in range(E):
            x = f"{p}block_sparse_moe.experts.{e}."
            w[x + "w1.weight"] = normal(I, H)
            w[x + "w3.weight"] = normal(I, H)
            w[x + "w2.weight"] = normal(H, I)
    w["model.norm.weight"] = norm()
    w["lm_head.weight"] = normal(V, H)
    return {name: t.to(torch.bfloat16) for name, t in w.items()}


def save_sharded(weights, out):
    shards, current, size = [], {}, 0
    for name, t in weights.items():
        if current and size + t.numel() * 2 > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += t.numel() * 2
    shards.append(current)
    weight_map = {}
    for n, shard in enumerate(shards, 1):
        file = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    total = sum(t.numel() * 2 for t in weights.values())
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")


def greedy(ids, w, cfg, steps):
    """The greedy continuation; the smallest top-1 lead over every position it scored; and the
    smallest lead of a chosen expert's router logit over the best unchosen one."""
    ids = list(ids)
    margin = math.inf
    stats = {"router_gap": math.inf}
    for _ in range(steps):
        logits = forward(torch.tensor(ids), w, cfg, stats)
        top2 = torch.topk(logits, 2, dim=-1).values
        margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
        ids.append(int(logits[-1].argmax()))
    return ids[-steps:], margin, stats["router_gap"]


def main():
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="tests/fixtures/tiny-grok1")
    parser.add_argument("--seed", type=int, default=827)
    parser.add_argument("--min-margin", type=float, default=0.01,
                        help="retry seeds until every position's top-1 logit (prompt and greedy "
                             "continuation) leads by this much, so that the argmax comparisons "
                             "test the engine, not rounding noise")
    parser.add_argument("--min-router-gap", type=float, default=0.01,
                        help="and until every chosen expert's router logit leads the best unchosen "
                             "one by this much: a flipped expert moves that position's logits far")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    tok = Tokenizer.from_file(str(TOKENIZER_FROM / "tokenizer.json"))
    assert tok.get_vocab_size() == CONFIG["vocab_size"]
    ids = tok.encode(PROMPT).ids

    seed = args.seed
    with torch.no_grad():
        while True:
            weights = random_weights(CONFIG, seed)
            w = {name: t.float() for name, t in weights.items()}  # the bf16 weights, in float32
            generated, margin, router_gap = greedy(ids, w, CONFIG, 32)
            if margin >= args.min_margin and router_gap >= args.min_router_gap:
                break
            seed += 1
        logits = forward(torch.tensor(ids), w, CONFIG).numpy()

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors"):
        old.unlink()
    save_sharded(weights, out)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_FROM / name, out / name)
    np.save(out.parent / "tiny-grok1-logits.npy", logits.astype(np.float32))
    (out.parent / "tiny-grok1-reference.json").write_text(json.dumps({
        "prompt": PROMPT, "ids": ids, "greedy_32": generated,
        "seed": seed, "min_top1_margin": margin, "min_router_gap": router_gap}, indent=2) + "\n")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({size / 1e6:.2f} MB), {len(ids)} prompt ids, logits {logits.shape}, "
          f"seed {seed}, min top-1 margin {margin:.4f}, min router gap {router_gap:.4f}")


if __name__ == "__main__":
    main()

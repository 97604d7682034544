#!/usr/bin/env python3
"""Trains nibble's demo model: a small Mixtral-architecture MoE (transformers' MixtralForCausalLM, 8
experts, top-2) on the demo corpus (tools/make_demo_corpus.py: arithmetic word problems made on the fly
from a fixed seed, plus the training prose in corpus/prose_train.jsonl), for a fixed wall-clock budget.
Saves it in Hugging Face format (config.json, model.safetensors in bf16, the tokenizer from
models/demo-moe, generation_config.json) and evaluates the saved files in torch: exact-match accuracy
on the held-out problems (greedy) and perplexity on the held-out prose (models/demo-moe/eval/).

GPU (about 4 minutes):  python3 tools/train_demo_moe.py --out models/demo-moe
CPU check (a few steps): .venv-tools/bin/python tools/train_demo_moe.py --smoke --out /tmp/demo-smoke
Evaluate saved files:   python3 tools/train_demo_moe.py --eval-only --out models/demo-moe
"""
import argparse
import json
import math
import multiprocessing
import os
import pathlib
import shutil
import sys
import time
import traceback
import types

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_demo_corpus as corpus  # noqa: E402

BOS, EOS, PAD = 1, 2, 0
SIZE_LIMIT = 25_000_000  # bytes of model.safetensors (issue 8)


def log(*parts):
    print(*parts, flush=True)


# ---- data --------------------------------------------------------------------------------------

_worker = {}


def _worker_init(tokenizer_path, heldout_path):
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker["tok"] = Tokenizer.from_file(tokenizer_path)
    _worker["exclude"] = corpus.load_heldout_problems(heldout_path)[1]


def _arith_chunk(args):
    """Token ids of `count` training problems from seed `seed`: <s> doc </s> <s> doc </s> ..."""
    seed, count = args
    docs = corpus.training_documents(seed, count, _worker["exclude"])
    out = []
    for enc in _worker["tok"].encode_batch(docs):  # the post-processor puts <s> first
        out.extend(enc.ids)
        out.append(EOS)
    return torch.tensor(out, dtype=torch.int16)


def arithmetic_stream(args, tokenizer_path, heldout_path):
    chunk = 20000 if args.arith_docs >= 20000 else args.arith_docs
    jobs = [(corpus.TRAIN_SEED * 1_000_003 + i, min(chunk, args.arith_docs - start))
            for i, start in enumerate(range(0, args.arith_docs, chunk))]
    workers = max(1, min(len(jobs), (os.cpu_count() or 1)))
    if workers == 1:
        _worker_init(tokenizer_path, heldout_path)
        parts = [_arith_chunk(j) for j in jobs]
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers, initializer=_worker_init, initargs=(tokenizer_path, heldout_path)) as pool:
            parts = pool.map(_arith_chunk, jobs)
    return torch.cat(parts).to(torch.int32)


def prose_stream(tok, path, limit=None):
    texts = [json.loads(line)["text"] for line in open(path, encoding="utf-8")]
    if limit:
        texts = texts[:limit]
    out = []
    for enc in tok.encode_batch(texts):
        out.extend(enc.ids)
        out.append(EOS)
    return torch.tensor(out, dtype=torch.int32)


class Batches:
    """Random windows of seq_len + 1 tokens from the two token streams, on the device."""

    def __init__(self, arith, prose, seq_len, device, seed):
        self.arith, self.prose = arith.to(device), prose.to(device)
        self.seq_len, self.device = seq_len, device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.offsets = torch.arange(seq_len + 1, device=device)

    def _windows(self, stream, rows):
        starts = torch.randint(0, stream.numel() - self.seq_len - 1, (rows, 1), device=self.device,
                               generator=self.gen)
        return stream[starts + self.offsets]

    def next(self, batch_size, prose_rows):
        parts = [self._windows(self.arith, batch_size - prose_rows)]
        if prose_rows > 0:
            parts.append(self._windows(self.prose, prose_rows))
        return torch.cat(parts).long()  # (batch_size, seq_len + 1): arithmetic rows first


# ---- model -------------------------------------------------------------------------------------

def make_config(args, vocab_size):
    from transformers import MixtralConfig
    return MixtralConfig(
        vocab_size=vocab_size, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_hidden_layers, num_attention_heads=args.num_attention_heads,
        num_key_value_heads=args.num_key_value_heads,
        head_dim=args.hidden_size // args.num_attention_heads, num_local_experts=args.num_local_experts,
        num_experts_per_tok=2, max_position_embeddings=args.max_position_embeddings,
        rope_theta=10000.0, rms_norm_eps=1e-5, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        tie_word_embeddings=False, initializer_range=0.02, router_aux_loss_coef=args.router_aux_loss_coef,
        output_router_logits=False)


def _grouped_mm(x, w, offsets):
    """x (S, K) rows grouped by expert, w (E, K, N), offsets (E,) int32 ends -> (S, N)."""
    if x.dtype == torch.bfloat16:
        grouped = getattr(F, "grouped_mm", None) or torch._grouped_mm
        return grouped(x, w, offs=offsets)
    out, start = [], 0  # float32 (reload check, CPU): one matmul an expert
    for e, end in enumerate(offsets.tolist()):
        out.append(x[start:end] @ w[e])
        start = end
    return torch.cat(out)


def bf16_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Replacement forward of transformers' MixtralExperts: two grouped GEMMs over the tokens sorted by
    expert, in bf16 under autocast (weights cast like autocast casts nn.Linear's; transformers'
    grouped_mm path runs them in the float32 of the master weights instead).
    hidden_states (N, H), top_k_index (N, k), top_k_weights (N, k) -> (N, H)."""
    n, k = top_k_index.shape
    device_type = hidden_states.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) \
        else hidden_states.dtype
    flat = top_k_index.reshape(-1)  # (S = N k,)
    _, perm = torch.sort(flat, stable=True)
    counts = torch.zeros(self.num_experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)  # (E,) no host sync
    x = hidden_states.to(dtype)[perm // k]  # (S, H) grouped by expert
    gate_up = _grouped_mm(x, self.gate_up_proj.to(dtype).transpose(1, 2), offsets)  # (S, 2 I)
    gate, up = gate_up.chunk(2, dim=-1)
    y = _grouped_mm(self.act_fn(gate) * up, self.down_proj.to(dtype).transpose(1, 2), offsets)  # (S, H)
    weighted = y.float() * top_k_weights.reshape(-1)[perm, None].float()
    combined = torch.zeros_like(weighted).index_copy(0, perm, weighted)  # back to token order
    return combined.view(n, k, -1).sum(dim=1).to(hidden_states.dtype)


def build_model(config, experts_implementation, device):
    """MixtralForCausalLM; experts_implementation "bf16_grouped" is transformers' eager model with
    bf16_experts_forward on every experts module (the weights and their names are unchanged)."""
    from transformers import MixtralForCausalLM
    patch = experts_implementation == "bf16_grouped"
    config._experts_implementation = "eager" if patch else experts_implementation
    config._attn_implementation = "sdpa"
    model = MixtralForCausalLM(config).to(device)
    if patch:
        experts = [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "down_proj")]
        if len(experts) != config.num_hidden_layers:
            raise RuntimeError(f"found {len(experts)} experts modules with gate_up_proj/down_proj")
        for m in experts:
            m.forward = types.MethodType(bf16_experts_forward, m)
    return model


def train_step(model, optimizer, batch, prose_rows, amp, aux_coef):
    """One optimizer step on batch (B, T + 1). Returns (arithmetic loss, prose loss) as tensors."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    with torch.autocast(device_type=batch.device.type, dtype=torch.bfloat16, enabled=amp):
        out = model(input_ids=inputs, output_router_logits=aux_coef > 0, use_cache=False)
    per_token = F.cross_entropy(out.logits.float().flatten(0, 1), targets.flatten(),
                                reduction="none").view(targets.shape)
    loss = per_token.mean()
    if aux_coef > 0 and getattr(out, "aux_loss", None) is not None:
        loss = loss + aux_coef * out.aux_loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    rows = batch.shape[0] - prose_rows
    prose = per_token[rows:].mean().detach() if prose_rows else torch.zeros((), device=batch.device)
    return per_token[:rows].mean().detach(), prose


def pick_experts_implementation(args, config, device, batches, amp):
    """eager (transformers' loop over experts), grouped_mm (transformers' grouped GEMM path) or
    bf16_grouped (bf16_experts_forward), whichever trains fastest here; a candidate that fails or
    disagrees with eager is dropped."""
    if args.experts != "auto":
        return args.experts
    if device.type != "cuda":
        return "eager"
    batch = batches.next(args.batch_size, 0)
    timings, losses = {}, {}
    for impl in ["eager", "grouped_mm", "bf16_grouped"]:
        torch.manual_seed(args.seed)
        try:
            model = build_model(config, impl, device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
            for i in range(4):
                if i == 1:
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                arith, _ = train_step(model, optimizer, batch, 0, amp, args.router_aux_loss_coef)
                losses.setdefault(impl, arith.item())
            torch.cuda.synchronize()
            timings[impl] = (time.perf_counter() - start) / 3
        except Exception as e:  # noqa: BLE001 (any failure means: do not use it)
            log(f"experts: {impl} failed ({type(e).__name__}: {str(e)[:200]})")
        finally:
            model = optimizer = None
            torch.cuda.empty_cache()
    log("experts: " + ", ".join(f"{k} {v * 1e3:.1f} ms/step (loss {losses[k]:.4f})" for k, v in timings.items()))
    if "eager" not in timings:
        return "eager"
    good = [k for k in timings if abs(losses[k] - losses["eager"]) < 1e-2]
    return min(good, key=lambda k: timings[k])


def profile_steps(args, config, experts, device, batches, amp, steps=3):
    """Prints where the GPU time of a training step goes (a throwaway model, learning rate 0)."""
    torch.manual_seed(args.seed)
    model = build_model(config, experts, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    batch = batches.next(args.batch_size, 0)
    for _ in range(2):
        train_step(model, optimizer, batch, 0, amp, args.router_aux_loss_coef)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            train_step(model, optimizer, batch, 0, amp, args.router_aux_loss_coef)
        torch.cuda.synchronize()
    events = prof.key_averages()
    device_time = [getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                   for e in events]
    total = sum(device_time) / steps / 1e3
    log(f"profile: {total:.1f} ms of GPU kernels per step ({len(events)} distinct ops); top:")
    for t, e in sorted(zip(device_time, events), key=lambda te: -te[0])[:14]:
        log(f"profile: {t / steps / 1e3:7.2f} ms  {e.count // steps:4d}x  {e.key[:90]}")


def lr_at(progress, peak, warmup, final_fraction):
    """Linear warm-up over the first `warmup` of the run, then cosine decay to final_fraction * peak."""
    if progress < warmup:
        return peak * max(progress / warmup, 0.01)
    t = min(1.0, (progress - warmup) / max(1e-9, 1.0 - warmup))
    return peak * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def heldout_losses(model, tok, problems, passages, device, amp):
    """Teacher-forced mean loss on held-out problems (whole documents, and only the answer: the
    tokens after "Answer:") and on passages (a cheap progress signal)."""
    model.eval()
    docs = [enc.ids + [EOS] for enc in tok.encode_batch([corpus.document_text(p) for p in problems])]
    prompts = [len(enc.ids) for enc in tok.encode_batch([corpus.prompt_text(p["question"]) for p in problems])]
    nll, count = nll_sum(model, docs, device, amp)
    answer_nll, answer_count = nll_sum(model, docs, device, amp, starts=prompts)
    prose = [enc.ids + [EOS] for enc in tok.encode_batch(passages)]
    prose_nll, prose_count = nll_sum(model, prose, device, amp)
    model.train()
    return nll / count, answer_nll / answer_count, prose_nll / prose_count


def nll_sum(model, sequences, device, amp, batch_size=32, starts=None):
    """(sum of -log p(token | prefix) over every token after the first (or from index starts[i] of
    sequence i), number of such tokens)."""
    total, count = 0.0, 0
    for i in range(0, len(sequences), batch_size):
        chunk = sequences[i:i + batch_size]
        width = max(len(s) for s in chunk)
        ids = torch.full((len(chunk), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        scored = torch.zeros((len(chunk), width), dtype=torch.bool)
        for r, s in enumerate(chunk):
            ids[r, :len(s)] = torch.tensor(s)
            mask[r, :len(s)] = 1
            scored[r, (starts[i + r] if starts else 1):len(s)] = True
        ids, mask, scored = ids.to(device), mask.to(device), scored.to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        token_logp = logp.gather(-1, ids[:, 1:, None])[..., 0]
        valid = scored[:, 1:]
        total += -token_logp[valid].sum().item()
        count += int(valid.sum().item())
    return total, count


# ---- evaluation of the saved files ---------------------------------------------------------------

@torch.no_grad()
def arithmetic_accuracy(model, tok, problems, device, batch_size, max_new_tokens=64, amp=False,
                        by_template=None):
    """Greedy answers to the held-out problems; exact match of the final number. by_template (a dict)
    receives {template: [correct, total]}."""
    correct, samples = 0, []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        prompts = [enc.ids for enc in tok.encode_batch([corpus.prompt_text(p["question"]) for p in chunk])]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(chunk), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, p in enumerate(prompts):  # left padding
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=EOS,
                                 pad_token_id=PAD)
        for problem, row in zip(chunk, out[:, width:].tolist()):
            text = tok.decode([t for t in row if t not in (EOS, PAD)], skip_special_tokens=True)
            ok = corpus.extract_final_number(text) == problem["answer"]
            correct += ok
            if by_template is not None:
                tally = by_template.setdefault(problem["template"], [0, 0])
                tally[0] += int(ok)
                tally[1] += 1
            if len(samples) < 3:
                samples.append({"question": problem["question"], "generated": text, "correct": bool(ok)})
    return correct / len(problems), samples


def evaluate_saved(out_dir, device, limit_problems, limit_passages, eval_dir):
    """Loads out_dir with transformers (bf16) and measures accuracy and perplexity."""
    from transformers import MixtralForCausalLM
    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    problems, _ = corpus.load_heldout_problems(eval_dir / "arithmetic.jsonl")
    passages = [json.loads(line)["text"] for line in open(eval_dir / "prose.jsonl", encoding="utf-8")]
    problems, passages = problems[:limit_problems], passages[:limit_passages]
    model = MixtralForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16).to(device).eval()
    start = time.perf_counter()
    by_template = {}
    accuracy, samples = arithmetic_accuracy(model, tok, problems, device,
                                            batch_size=500 if device.type == "cuda" else 16,
                                            by_template=by_template)
    seconds = time.perf_counter() - start
    prompt = tok.encode("It is a truth universally acknowledged").ids
    continuation = model.generate(input_ids=torch.tensor([prompt], device=device), max_new_tokens=40,
                                  do_sample=False, eos_token_id=EOS, pad_token_id=PAD)[0, len(prompt):]
    samples.append({"prompt": "It is a truth universally acknowledged",
                    "generated": tok.decode(continuation.tolist(), skip_special_tokens=True)})
    ids = [enc.ids for enc in tok.encode_batch(passages)]  # <s> + passage
    nll, count = nll_sum(model, ids, device, amp=False)
    nll32, _ = nll_sum(model.float(), ids, device, amp=False)
    return {"n_problems": len(problems), "accuracy": accuracy, "generate_seconds": round(seconds, 1),
            "accuracy_by_template": {k: round(c / n, 3) for k, (c, n) in sorted(by_template.items())},
            "n_passages": len(passages), "n_tokens": count, "perplexity_bf16": math.exp(nll / count),
            "perplexity_bf16_weights_fp32_math": math.exp(nll32 / count), "samples": samples}


# ---- saving ------------------------------------------------------------------------------------

def canonical_names(path):
    """Rewrites model.safetensors with Mixtral's per-expert tensor names (block_sparse_moe.experts.E.
    w1/w2/w3) if this transformers version saved fused ones (mlp.experts.gate_up_proj/down_proj)."""
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    if any(".block_sparse_moe.experts.0.w1.weight" in k for k in tensors):
        return False
    out = {}
    for name, t in tensors.items():
        name = name.replace(".mlp.", ".block_sparse_moe.")
        if name.endswith(".experts.gate_up_proj"):
            base, inter = name[:-len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.w1.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.w3.weight"] = t[e, inter:].contiguous()
        elif name.endswith(".experts.down_proj"):
            base = name[:-len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.w2.weight"] = t[e].contiguous()
        else:
            out[name] = t
    save_file(out, str(path), metadata=metadata or {"format": "pt"})
    return True


def save_model(model, tokenizer_dir, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("model*.safetensors*"):
        old.unlink()
    model = model.to(torch.bfloat16).eval()
    model.config.output_router_logits = False
    model.generation_config.bos_token_id = BOS
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    model.save_pretrained(out_dir, max_shard_size="1GB")
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        if (tokenizer_dir / name).resolve() != (out_dir / name).resolve():
            shutil.copy(tokenizer_dir / name, out_dir / name)
    weights = out_dir / "model.safetensors"
    if not weights.exists():
        raise SystemExit(f"train_demo_moe: {weights} was not written (sharded?)")
    if canonical_names(weights):
        log("saved: renamed the fused expert tensors to Mixtral's per-expert names")
    return weights.stat().st_size


RELOAD_TOLERANCE = 1e-2  # relative L2: the saved weights are the bf16 rounding of the trained ones


@torch.no_grad()
def check_reload(model, out_dir, device, tok):
    """Relative L2 distance between the logits of the trained model (weights rounded to bf16, as saved)
    and of the saved files loaded by transformers, both in float32 math."""
    from transformers import MixtralForCausalLM
    loaded = MixtralForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
    ids = torch.tensor([tok.encode("Question: Tom has 3 apples and buys 4 more. How many apples does "
                                   "Tom have?\nAnswer:").ids], device=device)
    a = model.float()(input_ids=ids).logits
    b = loaded(input_ids=ids).logits
    model.to(torch.bfloat16)
    return ((a - b).norm() / a.norm()).item()


# ---- main --------------------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--tokenizer-dir", default="models/demo-moe")
    p.add_argument("--eval-dir", default="models/demo-moe/eval")
    p.add_argument("--prose", default="corpus/prose_train.jsonl")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--smoke", action="store_true", help="a few steps on small data (CPU check)")
    p.add_argument("--eval-only", action="store_true", help="evaluate the model already in --out")
    p.add_argument("--train-seconds", type=float, default=165.0, help="wall-clock training budget")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arith-docs", type=int, default=1_000_000, help="training problems made")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--prose-fraction", type=float, default=0.2, help="share of rows from prose at most")
    p.add_argument("--max-prose-epochs", type=float, default=8.0,
                   help="lower the prose share so that prose is seen at most this often")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=float, default=0.03, help="share of the budget")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--router-aux-loss-coef", type=float, default=0.01)
    p.add_argument("--experts", default="auto", choices=["auto", "eager", "grouped_mm", "bf16_grouped"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--cpu-amp", action="store_true", help="bf16 autocast on the CPU too (tests)")
    p.add_argument("--profile", type=int, default=1, help="print a profile of a training step (CUDA)")
    p.add_argument("--accuracy-at", default="0.33,0.67",
                   help="fractions of the budget at which to print held-out greedy accuracy")
    p.add_argument("--accuracy-problems", type=int, default=200, help="problems for those")
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--intermediate-size", type=int, default=192)
    p.add_argument("--num-hidden-layers", type=int, default=7)
    p.add_argument("--num-attention-heads", type=int, default=8)
    p.add_argument("--num-key-value-heads", type=int, default=4)
    p.add_argument("--num-local-experts", type=int, default=8)
    p.add_argument("--max-position-embeddings", type=int, default=1024)
    p.add_argument("--eval-problems", type=int, default=0, help="held-out problems to evaluate (0: all)")
    p.add_argument("--eval-passages", type=int, default=0, help="held-out passages to evaluate (0: all)")
    args = p.parse_args()
    if args.smoke:
        args.arith_docs, args.batch_size, args.seq_len = 2000, 4, 128
        args.max_steps = args.max_steps or 6
        args.eval_problems, args.eval_passages = args.eval_problems or 8, args.eval_passages or 4
        args.accuracy_problems = 4
    return args


def main():
    args = parse_args()
    t0 = time.perf_counter()
    device = torch.device(args.device if args.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    out_dir, eval_dir, tokenizer_dir = pathlib.Path(args.out), pathlib.Path(args.eval_dir), \
        pathlib.Path(args.tokenizer_dir)
    import transformers
    transformers.utils.logging.disable_progress_bar()
    log(f"train_demo_moe: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {device}, {os.cpu_count()} CPUs")
    limit_problems = args.eval_problems or None
    limit_passages = args.eval_passages or None
    if args.eval_only:
        result = evaluate_saved(out_dir, device, limit_problems, limit_passages, eval_dir)
        log(json.dumps(result, indent=2))
        return

    torch.manual_seed(args.seed)
    amp = device.type == "cuda" or args.cpu_amp
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    heldout_path = eval_dir / "arithmetic.jsonl"
    problems, _ = corpus.load_heldout_problems(heldout_path)
    passages = [json.loads(line)["text"] for line in open(eval_dir / "prose.jsonl", encoding="utf-8")]

    arith = arithmetic_stream(args, str(tokenizer_dir / "tokenizer.json"), str(heldout_path))
    prose = prose_stream(tok, args.prose, limit=200 if args.smoke else None)
    batches = Batches(arith, prose, args.seq_len, device, args.seed)
    log(f"data: {arith.numel() / 1e6:.1f} M arithmetic tokens ({args.arith_docs} problems), "
        f"{prose.numel() / 1e6:.2f} M prose tokens, {time.perf_counter() - t0:.1f} s")
    if device.type == "cuda":  # after the data workers are forked: they never touch CUDA
        log(f"GPU: {torch.cuda.get_device_name(device)}")

    config = make_config(args, tok.get_vocab_size())
    torch.backends.cuda.matmul.allow_tf32 = True  # training only: float32 leftovers on tensor cores
    experts = pick_experts_implementation(args, config, device, batches, amp)
    if device.type == "cuda" and args.profile:
        try:
            profile_steps(args, config, experts, device, batches, amp)
        except Exception as e:  # noqa: BLE001 (diagnostics only)
            log(f"profile: failed ({type(e).__name__}: {str(e)[:200]})")
        torch.cuda.empty_cache()
    torch.manual_seed(args.seed)
    model = build_model(config, experts, device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters ({2 * n_params / 1e6:.1f} MB in bf16), "
        f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.num_local_experts} experts "
        f"of {config.intermediate_size}, top-2, vocab {config.vocab_size}; experts {experts}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    step_fn = train_step
    forward_model = torch.compile(model) if args.compile else model
    model.train()

    prose_rows = max(1, round(args.batch_size * args.prose_fraction)) if args.prose_fraction > 0 else 0
    tokens_per_step = args.batch_size * args.seq_len
    start = time.perf_counter()
    step, last_log, last_heldout, tokens, history = 0, start, start, 0, []
    arith_ema = prose_ema = None
    probes = sorted(float(x) for x in args.accuracy_at.split(",") if x.strip())
    accuracy_history = []
    while True:
        elapsed = time.perf_counter() - start
        progress = elapsed / args.train_seconds
        if args.max_steps:
            progress = max(progress, step / args.max_steps) if not args.smoke else step / args.max_steps
        if progress >= 1.0:
            break
        lr = lr_at(progress, args.lr, args.warmup, 0.05)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = batches.next(args.batch_size, prose_rows)
        arith_loss, prose_loss = step_fn(forward_model, optimizer, batch, prose_rows, amp,
                                         args.router_aux_loss_coef)
        step += 1
        tokens += tokens_per_step
        if step == 20 and prose_rows > 0 and not args.smoke:
            # Throughput is known now: cap how often the (small) prose corpus is seen.
            rate = tokens / (time.perf_counter() - start)
            expected = rate * args.train_seconds
            share = min(args.prose_fraction, args.max_prose_epochs * prose.numel() / expected)
            prose_rows = max(1, round(args.batch_size * share))
            log(f"throughput {rate / 1e6:.2f} M tokens/s: prose gets {prose_rows} of {args.batch_size} rows")
        now = time.perf_counter()
        if now - last_log >= (0.0 if args.smoke else 10.0):
            a, p = arith_loss.item(), prose_loss.item()
            arith_ema = a if arith_ema is None else 0.7 * arith_ema + 0.3 * a
            prose_ema = p if prose_ema is None else 0.7 * prose_ema + 0.3 * p
            entry = {"step": step, "seconds": round(now - start, 1), "tokens": tokens, "lr": lr,
                     "arith_loss": round(arith_ema, 4), "prose_loss": round(prose_ema, 4)}
            if now - last_heldout >= 30.0 or args.smoke:
                last_heldout = now
                n = 4 if args.smoke else 64
                ha, hans, hp = heldout_losses(model, tok, problems[:n], passages[:n // 4], device, amp)
                entry.update({"heldout_arith_loss": round(ha, 4), "heldout_answer_loss": round(hans, 4),
                              "heldout_prose_loss": round(hp, 4)})
            history.append(entry)
            log("  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in entry.items())
                + f"  {tokens / (now - start) / 1e6:.2f} M tok/s")
            last_log = now
        if probes and progress >= probes[0]:
            probes.pop(0)
            probe_start = time.perf_counter()
            accuracy_history.append(accuracy_probe(model, tok, problems[:args.accuracy_problems], device,
                                                   amp, step, probe_start - start))
            start += time.perf_counter() - probe_start  # not taken from the training budget
            last_log += time.perf_counter() - probe_start
    train_seconds = time.perf_counter() - start
    log(f"trained {step} steps, {tokens / 1e6:.1f} M tokens in {train_seconds:.1f} s")

    torch.backends.cuda.matmul.allow_tf32 = False
    size = save_model(model, tokenizer_dir, out_dir)  # no model, nothing to report: let it raise
    summary = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "transformers": transformers.__version__,
               "steps": step, "tokens": tokens, "train_seconds": round(train_seconds, 1),
               "experts_implementation": experts, "parameters": n_params, "model_bytes": size,
               "args": vars(args), "accuracy_during_training": accuracy_history, "history": history,
               "problems": []}
    write_summary(out_dir, summary, t0)
    log(f"saved {out_dir} (model.safetensors {size / 1e6:.2f} MB)")
    if size > SIZE_LIMIT:
        summary["problems"].append(f"model.safetensors is {size} bytes, over the {SIZE_LIMIT} limit")
    try:
        rel = check_reload(model, out_dir, device, tok)
        summary["reload_logits_rel_l2"] = rel
        log(f"reloaded by transformers: logits rel L2 {rel:.2e} (float32 math on both sides)")
        if not rel <= RELOAD_TOLERANCE:
            summary["problems"].append(f"reloaded logits differ: rel L2 {rel:.3g} > {RELOAD_TOLERANCE}")
    except Exception:  # noqa: BLE001 (reported in the summary; the files are written)
        summary["problems"].append("reload check failed: " + traceback.format_exc(limit=3))
    model = optimizer = batches = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:
        result = evaluate_saved(out_dir, device, limit_problems, limit_passages, eval_dir)
        summary["heldout"] = result
        log(json.dumps(result, indent=2))
        log(f"held-out (torch bf16): accuracy {result['accuracy'] * 100:.1f}% on {result['n_problems']} "
            f"problems, perplexity {result['perplexity_bf16']:.2f} on {result['n_tokens']} prose tokens")
    except Exception:  # noqa: BLE001
        summary["problems"].append("evaluation failed: " + traceback.format_exc(limit=3))
    write_summary(out_dir, summary, t0)
    for problem in summary["problems"]:
        log(f"PROBLEM: {problem}")
    log(f"train_demo_moe: done in {time.perf_counter() - t0:.0f} s, "
        f"{'no problems' if not summary['problems'] else str(len(summary['problems'])) + ' problem(s)'}")


def write_summary(out_dir, summary, t0):
    summary["total_seconds"] = round(time.perf_counter() - t0, 1)
    (out_dir / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def accuracy_probe(model, tok, problems, device, amp, step, seconds):
    """Greedy held-out accuracy of the model being trained (printed; never stops the run)."""
    start = time.perf_counter()
    try:
        model.eval()
        accuracy, samples = arithmetic_accuracy(model, tok, problems, device, batch_size=len(problems),
                                                amp=amp)
        entry = {"step": step, "seconds": round(seconds, 1), "n_problems": len(problems),
                 "accuracy": accuracy, "sample": samples[0]["generated"] if samples else ""}
        log(f"accuracy at step {step} ({seconds:.0f} s): {accuracy * 100:.1f}% of {len(problems)} held-out "
            f"problems (greedy, {time.perf_counter() - start:.1f} s); e.g. {entry['sample']!r}")
    except Exception as e:  # noqa: BLE001
        entry = {"step": step, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        log(f"accuracy at step {step}: failed ({entry['error']})")
    finally:
        model.train()
    return entry


if __name__ == "__main__":
    main()

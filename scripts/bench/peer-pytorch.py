#!/usr/bin/env python3
"""The PyTorch eager peer of `prefzoo bench`: the same DPO training step (forward, backward, AdamW)
of the same model shape on the same batch, printing the same JSON keys; with --generate, the peer of
`prefzoo bench --generate` (KV-cache decoding, one eager forward per token, multinomial sampling).

The model is a plain-torch Llama block stack written the way Hugging Face's eager modeling code
computes it (RMSNorm, rotate-half RoPE, grouped-query heads repeated to full heads, masked softmax
attention, SwiGLU MLP; Qwen2's q/k/v biases, Qwen3's per-head q/k norms; log-probs by log_softmax
and gather as TRL's DPO trainer does). `--lora R` freezes the base weights and trains rank-R
adapters on every projection, as PEFT's `all-linear` does.

Needs Debian's python3-torch (PyTorch 1.13 with OpenBLAS):
  apt-get install -y python3-torch libopenblas0-pthread
  /usr/bin/python3 scripts/bench/peer-pytorch.py [--preset small|tiny|qwen2.5-0.5b|…] [--steps N] [--threads N] [--lora R]
On a GPU (the peer of `prefzoo bench --device webgpu`, see scripts/bench/gpu):
  python3 scripts/bench/peer-pytorch.py --device cuda [--dtype float32|bfloat16]
bfloat16 runs the step under torch.autocast (float32 master weights and AdamW), as TRL's bf16=True does.
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.utils.checkpoint
import torch.nn as nn
import torch.nn.functional as F

# Shapes of src/models/config.ts presetConfig('llama', ...); tiny's vocabulary is the generated
# tokenizer's (passed with --vocab when it differs).
# The released shapes are those of the models' config.json (as src/models/config.ts RELEASED).
PRESETS = {
    'small': dict(vocab=32000, hidden=512, inter=1376, layers=8, heads=8, kv_heads=4, head_dim=64, tied=False),
    'tiny': dict(vocab=512, hidden=64, inter=172, layers=2, heads=4, kv_heads=2, head_dim=16, tied=True),
    'smollm2-360m': dict(vocab=49152, hidden=960, inter=2560, layers=32, heads=15, kv_heads=5, head_dim=64, tied=True, theta=100000.0, eps=1e-5),
    'qwen2.5-0.5b': dict(vocab=151936, hidden=896, inter=4864, layers=24, heads=14, kv_heads=2, head_dim=64, tied=True, theta=1e6, qkv_bias=True),
    'qwen2.5-1.5b': dict(vocab=151936, hidden=1536, inter=8960, layers=28, heads=12, kv_heads=2, head_dim=128, tied=True, theta=1e6, qkv_bias=True),
    'qwen3-0.6b': dict(vocab=151936, hidden=1024, inter=3072, layers=28, heads=16, kv_heads=8, head_dim=128, tied=True, theta=1e6, qk_norm=True),
}


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LoRALinear(nn.Module):
    """W x (+ b) + (alpha / r) B A x with W frozen (PEFT's LoRA layer: A Kaiming-uniform, B zero)."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, device=base.weight.device).uniform_(-1 / math.sqrt(base.in_features), 1 / math.sqrt(base.in_features)))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, device=base.weight.device))
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h, kv, hd = c['hidden'], c['heads'], c['kv_heads'], c['head_dim']
        eps, bias = c.get('eps', 1e-6), c.get('qkv_bias', False)
        self.h, self.kv, self.hd = h, kv, hd
        self.input_layernorm = RMSNorm(d, eps)
        self.q_proj = nn.Linear(d, h * hd, bias=bias)
        self.k_proj = nn.Linear(d, kv * hd, bias=bias)
        self.v_proj = nn.Linear(d, kv * hd, bias=bias)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, eps) if c.get('qk_norm') else None
        self.k_norm = RMSNorm(hd, eps) if c.get('qk_norm') else None
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.gate_proj = nn.Linear(d, c['inter'], bias=False)
        self.up_proj = nn.Linear(d, c['inter'], bias=False)
        self.down_proj = nn.Linear(c['inter'], d, bias=False)

    def forward(self, x, cos, sin, mask, cache=None):
        """One layer. With `cache` (a list, empty before the prefill), decoding as HF's eager attention
        and DynamicCache do: the new keys/values are concatenated to the layer's cache (kept in the
        list), then repeated to every query head."""
        B, T, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(B, T, self.h, self.hd)
        k = self.k_proj(y).view(B, T, self.kv, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(y).view(B, T, self.kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            if cache:
                k = torch.cat((cache[0], k), 2)
                v = torch.cat((cache[1], v), 2)
            cache[:] = [k, v]
        rep = self.h // self.kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.hd) + mask
        ctx = torch.softmax(scores, dim=-1) @ v
        x = x + self.o_proj(ctx.transpose(1, 2).reshape(B, T, -1))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.checkpointing = False
        self.embed_tokens = nn.Embedding(c['vocab'], c['hidden'])
        self.layers = nn.ModuleList(Block(c) for _ in range(c['layers']))
        self.norm = RMSNorm(c['hidden'], c.get('eps', 1e-6))
        self.lm_head = None if c['tied'] else nn.Linear(c['hidden'], c['vocab'], bias=False)
        hd = c['head_dim']
        self.register_buffer('inv_freq', 1.0 / c.get('theta', 10000.0) ** (torch.arange(0, hd, 2).float() / hd), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, attn):
        B, T = ids.shape
        pos = (attn.cumsum(1) - attn).float()  # real tokens before each token
        freqs = pos[:, :, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), -1)[:, None]  # [B, 1, T, hd]
        cos, sin = emb.cos(), emb.sin()
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        allowed = causal[None, None] & attn.bool()[:, None, None, :]
        mask = torch.zeros(B, 1, T, T, device=ids.device).masked_fill(~allowed, torch.finfo(torch.float32).min)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            if self.checkpointing and torch.is_grad_enabled():
                # prefzoo's gradient_checkpointing=true: each layer's activations recomputed in the backward.
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, mask, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask)
        x = self.norm(x)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return x @ w.t()


    def decode(self, ids, attn, caches):
        """Logits of each row's last new token: `ids` [B, T] new tokens, `attn` [B, past + T]; the
        caches (one [k, v] list per layer, empty before the prefill) are extended in place."""
        B, T = ids.shape
        L = attn.shape[1]
        pos = (attn.cumsum(1) - attn)[:, L - T:].float()
        freqs = pos[:, :, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), -1)[:, None]
        cos, sin = emb.cos(), emb.sin()
        causal = torch.ones(T, L, dtype=torch.bool, device=ids.device).tril(L - T)
        allowed = causal[None, None] & attn.bool()[:, None, None, :]
        mask = torch.zeros(B, 1, T, L, device=ids.device).masked_fill(~allowed, torch.finfo(torch.float32).min)
        x = self.embed_tokens(ids)
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cos, sin, mask, cache)
        x = self.norm(x[:, -1])
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return x @ w.t()


def generate_bench(a, c):
    """The peer of `prefzoo bench --generate`: prefill, then one eager forward per token with a
    key/value cache and multinomial sampling from softmax(logits), B rows of P prompt tokens, N new."""
    torch.set_num_threads(a.threads or os.cpu_count())
    torch.manual_seed(0)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == 'cuda' else (lambda: None)
    model = Llama(c).eval().to(dev)
    params = sum(p.numel() for p in model.parameters())
    B, P, N = a.batch, a.prompt, a.new
    V = c['vocab']
    prompts = torch.tensor([[16 + (i * 7919 + t * 104729) % (min(V, 4096) - 16) for t in range(P)] for i in range(B)], device=dev)
    log = lambda s: print(f'peer: {s}', file=sys.stderr, flush=True)
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {params:,} parameters, generate batch {B}, prompt {P}, {N} new")

    def gen(n):
        caches = [[] for _ in model.layers]
        attn = torch.ones(B, P, dtype=torch.long, device=dev)
        sync()
        t0 = time.perf_counter()
        logits = model.decode(prompts, attn, caches)
        tok = torch.multinomial(torch.softmax(logits, -1), 1)
        for _ in range(n - 1):
            attn = torch.cat((attn, torch.ones(B, 1, dtype=torch.long, device=dev)), 1)
            logits = model.decode(tok, attn, caches)
            tok = torch.multinomial(torch.softmax(logits, -1), 1)
        sync()
        return (time.perf_counter() - t0) * 1000

    load = os.getloadavg()[0]
    with torch.no_grad():
        gen(min(N, 4))
        prefills, steps = [], []
        for r in range(a.runs):
            pre = gen(1)
            total = gen(N)
            prefills.append(pre)
            steps.append(max(1e-3, total - pre) / max(1, N - 1))
            log(f'run {r + 1}/{a.runs}: prefill {pre:.1f} ms, {steps[-1]:.2f} ms/step')
    ms = statistics.median(steps)
    out = {
        'engine': f'pytorch {torch.__version__} eager',
        'device': a.device,
        'preset': a.preset,
        'params': params,
        'threads': torch.get_num_threads(),
        'batch': B,
        'prompt_tokens': P,
        'new_tokens': N,
        'prefill_ms': round(statistics.median(prefills), 1),
        'decode_tokens_per_s': round(B / (ms / 1000), 1),
        'tokens_per_s': round(B / (ms / 1000), 1),
        'ms_per_step': round(ms, 2),
        'step_ms_runs': [round(s, 2) for s in steps],
        'peak_rss_mb': round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        'load_average': round(load, 2),
    }
    print(json.dumps(out))


def sequence_logps(logits, ids, loss_mask):
    """Σ_t loss_mask[t] · log p(ids[t] | ids[<t]) per row."""
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (lp * loss_mask[:, 1:]).sum(-1)


def bench_pairs(vocab, pairs, seq_len, seed=1):
    """The same seeded tokens as scripts/bench/step.ts benchPairs (LCG, ids from 16)."""
    s = seed & 0xFFFFFFFF

    def tok():
        nonlocal s
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        return 16 + s % (vocab - 16)

    half = seq_len // 2
    rows = []
    for _ in range(pairs):
        prompt = [tok() for _ in range(half)]
        rows.append((prompt, [tok() for _ in range(seq_len - half)], [tok() for _ in range(seq_len - half)]))
    # Response-major like collate(): chosen_1..chosen_B, rejected_1..rejected_B.
    seqs = [p + c for p, c, _ in rows] + [p + r for p, _, r in rows]
    ids = torch.tensor(seqs, dtype=torch.long)
    loss_mask = torch.zeros(ids.shape)
    loss_mask[:, half:] = 1
    return ids, torch.ones_like(ids), loss_mask


def matmul_peak(n=2048, runs=10, device='cpu', sync=lambda: None):
    a = torch.rand(n, n, device=device) - 0.5
    b = torch.rand(n, n, device=device) - 0.5
    a @ b
    sync()
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        a @ b
        sync()
        rates.append(2 * n ** 3 / (time.perf_counter() - t0) / 1e9)
    # The fastest run, as prefzoo bench reports: other work on the machine only slows a run.
    return max(rates)


def check_blas():
    """
    Debian's python3-torch multiplies through whatever libblas.so.3 the alternatives system points at;
    with only the reference BLAS installed a product runs at a few GFLOP/s, some 25x under OpenBLAS, and
    every peer figure would measure that. Refused unless PEER_ALLOW_SLOW_BLAS=1.
    """
    rate = matmul_peak(n=512, runs=3)
    if rate < 20 and os.environ.get('PEER_ALLOW_SLOW_BLAS') != '1':
        sys.exit(f'peer-pytorch: matrix products run at {rate:.1f} GFLOP/s: PyTorch multiplies through the reference BLAS '
                 '(on Debian: apt-get install libopenblas0-pthread; update-alternatives --display libblas.so.3-x86_64-linux-gnu); '
                 'PEER_ALLOW_SLOW_BLAS=1 runs it anyway')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--preset', default='small', choices=sorted(PRESETS))
    ap.add_argument('--steps', type=int, default=5)
    ap.add_argument('--warmup', type=int, default=5)  # as prefzoo bench
    ap.add_argument('--pairs', type=int, default=4)
    ap.add_argument('--seq', type=int, default=256)
    ap.add_argument('--threads', type=int, default=0, help='torch threads (default: every core)')
    ap.add_argument('--vocab', type=int, default=0, help='override the preset vocabulary')
    ap.add_argument('--no-peak', action='store_true')
    ap.add_argument('--lora', type=int, default=0, help='rank of LoRA adapters on every projection (alpha = 2 r); 0: full fine-tune')
    ap.add_argument('--device', default='cpu', help='cpu or cuda')
    ap.add_argument('--gradient-checkpointing', action='store_true', help="recompute each layer's activations in the backward (torch.utils.checkpoint), as prefzoo's flag")
    ap.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'], help='bfloat16: autocast around the step')
    ap.add_argument('--generate', action='store_true', help='time KV-cache generation instead (the peer of prefzoo bench --generate)')
    ap.add_argument('--batch', type=int, default=8, help='with --generate: rows decoded together')
    ap.add_argument('--prompt', type=int, default=32, help='with --generate: prompt tokens per row')
    ap.add_argument('--new', type=int, default=64, help='with --generate: new tokens per row')
    ap.add_argument('--runs', type=int, default=3, help='with --generate: timed generations (the median counts)')
    a = ap.parse_args()
    if a.device == 'cpu':
        check_blas()
    if a.generate:
        c = dict(PRESETS[a.preset])
        if a.vocab:
            c['vocab'] = a.vocab
        return generate_bench(a, c)
    dev = torch.device(a.device)
    # GPU work is asynchronous: each timed region ends by waiting for it.
    sync = torch.cuda.synchronize if dev.type == 'cuda' else (lambda: None)
    autocast = (lambda: torch.autocast(device_type=dev.type, dtype=torch.bfloat16)) if a.dtype == 'bfloat16' else (lambda: torch.autocast(device_type=dev.type, enabled=False))
    torch.set_num_threads(a.threads or os.cpu_count())
    torch.manual_seed(0)
    c = dict(PRESETS[a.preset])
    if a.vocab:
        c['vocab'] = a.vocab
    model = Llama(c).to(dev)
    model.checkpointing = a.gradient_checkpointing
    params = sum(p.numel() for p in model.parameters())
    if a.lora:
        for p in model.parameters():
            p.requires_grad_(False)
        for block in model.layers:
            for name in ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'):
                setattr(block, name, LoRALinear(getattr(block, name), a.lora, 2 * a.lora))
    ids, attn, loss_mask = (t.to(dev) for t in bench_pairs(c['vocab'], a.pairs, a.seq))
    tokens = ids.numel()
    log = lambda s: print(f'peer: {s}', file=sys.stderr, flush=True)
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {params:,} parameters")

    eval_times = []
    with torch.no_grad():
        for i in range(max(2, min(a.steps, 5)) + 1):
            t0 = time.perf_counter()
            with autocast():
                ref = sequence_logps(model(ids, attn), ids, loss_mask)
            sync()
            if i > 0:
                eval_times.append(time.perf_counter() - t0)
    ref_c, ref_r = ref[:a.pairs], ref[a.pairs:]

    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    beta = 0.1
    times = []
    load = os.getloadavg()[0]
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            cpu0 = time.process_time()
        t0 = time.perf_counter()
        with autocast():
            lp = sequence_logps(model(ids, attn), ids, loss_mask)
            logits = beta * ((lp[:a.pairs] - ref_c) - (lp[a.pairs:] - ref_r))
            loss = -F.logsigmoid(logits.float()).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        sync()
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
        log(f'step {i + 1}/{a.warmup + a.steps} {dt:.3f} s loss {loss.item():.4f}')

    cpu = (time.process_time() - cpu0) / a.steps
    per_step = statistics.median(times)
    embed = c['vocab'] * c['hidden']
    matmul_params = params - (0 if c['tied'] else embed)
    flops = tokens * (6 * matmul_params + 12 * c['layers'] * c['heads'] * c['head_dim'] * a.seq)
    achieved = flops / per_step / 1e9
    peak = None if a.no_peak else matmul_peak(n=8192 if dev.type == 'cuda' else 2048, device=dev, sync=sync)
    out = {
        'preset': a.preset,
        'gradient_checkpointing': a.gradient_checkpointing,
        'lora_rank': a.lora or None,
        'params': params,
        'matmul_params': matmul_params,
        'tokens_per_step': tokens,
        'threads': torch.get_num_threads(),
        'tokens_per_s': round(tokens / per_step, 1),
        'seconds_per_step': round(per_step, 3),
        'step_seconds': [round(t, 3) for t in times],
        'model_gflop_per_step': round(flops / 1e9, 1),
        'achieved_gflops': round(achieved, 1),
        'matmul_peak_gflops': None if peak is None else round(peak, 1),
        'mfu': None if peak is None else round(achieved / peak, 3),
        'eval_tokens_per_s': round(tokens / statistics.median(eval_times), 1),
        'peak_rss_mb': round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        'cpu_seconds_per_step': round(cpu, 3),
        'load_average': round(load, 2),
        'engine': f'pytorch {torch.__version__} eager',
        'device': a.device,
        'dtype': a.dtype,
    }
    print(json.dumps(out))


if __name__ == '__main__':
    main()

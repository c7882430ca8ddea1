"""Hand-written programs for the coverage benchmark (the `prog/` group).

This file is the place for small programs that exercise Python constructs the torchvision
models do not: loops over time steps, masks built inside the call, random sampling, control
flow on shapes and Python values, containers passed in and returned, and so on. It uses the
same entry format as `corpus_torchvision.py` (see `corpus.py` for every field):

    Program(name, make, inputs, quick=..., calls=..., note=...)

* `name`: unique, "prog/<something>"; `run.py --filter prog/` runs just this file.
* `make()`: returns the callable to compile, an `nn.Module` (put in eval mode by the runner
  unless `train=True`) or a plain function. It runs after `torch.manual_seed(seed)`.
* `inputs()`: returns the positional arguments of one call as a tuple (or `Args(...)` for
  keyword arguments too). It runs once per call, after `torch.manual_seed(seed + 1 + i)`; the
  runner deep-copies the result for the eager and the compiled run.

To add a program: write the module or function at module level, then append a `Program` to
the list in `programs()`. Keep inputs small (the whole `--quick` run should stay within a few
minutes on a 2-core machine) and mark the cheap, representative ones `quick=True`.
"""

import collections
import contextlib
import copy
import dataclasses
import enum
import functools
import itertools
import logging
import math
import operator
import random
import time
import warnings
from collections import namedtuple
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from corpus import Args, Program


class CausalTransformerBlock(nn.Module):
    """Pre-norm transformer block; the causal mask is built inside forward from the length."""

    def __init__(self, dim=32, heads=4, mlp_ratio=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GRULoop(nn.Module):
    """A GRU cell stepped over time in a Python loop; returns all states and the last one."""

    def __init__(self, inp=8, hidden=16):
        super().__init__()
        self.cell = nn.GRUCell(inp, hidden)
        self.out = nn.Linear(hidden, 4)
        self.hidden = hidden

    def forward(self, x, h=None):
        if h is None:
            h = x.new_zeros(x.shape[0], self.hidden)
        states = []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            states.append(h)
        return self.out(torch.stack(states, dim=1)), h


class VAE(nn.Module):
    """Encoder, reparameterisation (z = mu + eps * std, eps drawn inside), decoder."""

    def __init__(self, dim=64, hidden=32, latent=8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.dec = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def reparameterise(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        return mu + torch.randn_like(std) * std

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = self.reparameterise(mu, logvar)
        recon = torch.sigmoid(self.dec(z))
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=-1)
        return {"recon": recon, "mu": mu, "logvar": logvar, "kl": kl}


# --------------------------------------------------------------------------------------------
# transformers: caches, masks, attention variants


class KVCacheAttention(nn.Module):
    """GPT-2 style attention for incremental decoding: a cache dict is read and updated."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def _split_heads(self, x):
        b, t, _ = x.size()
        return x.view(b, t, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x, cache=None, use_cache=True):
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        q, k, v = map(self._split_heads, (q, k, v))
        if cache is not None and "k" in cache:
            k = torch.cat([cache["k"], k], dim=-2)
            v = torch.cat([cache["v"], v], dim=-2)
        if use_cache and cache is not None:
            cache["k"], cache["v"] = k, v
        t_q, t_k = q.size(-2), k.size(-2)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        causal = torch.ones(t_q, t_k, dtype=torch.bool, device=x.device).tril(diagonal=t_k - t_q)
        att = att.masked_fill(~causal, torch.finfo(att.dtype).min)
        att = att.softmax(dim=-1)
        y = (att @ v).permute(0, 2, 1, 3).contiguous()
        return self.c_proj(y.view(y.size(0), y.size(1), -1))


class GPT2Attention(nn.Module):
    def __init__(self, dim, heads, max_pos):
        super().__init__()
        self.n_head = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool))
                             .view(1, 1, max_pos, max_pos))
        self.attn_dropout = nn.Dropout(0.1)

    def _attn(self, q, k, v):
        w = torch.matmul(q, k.transpose(-1, -2)) / (v.size(-1) ** 0.5)
        q_len, k_len = q.size(-2), k.size(-2)
        causal_mask = self.bias[:, :, k_len - q_len:k_len, :k_len]
        mask_value = torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(causal_mask, w, mask_value)
        w = self.attn_dropout(nn.functional.softmax(w, dim=-1))
        return torch.matmul(w, v)

    def forward(self, hidden_states, layer_past=None, use_cache=False):
        b, t, c = hidden_states.size()
        query, key, value = self.c_attn(hidden_states).split(c, dim=2)
        query, key, value = [z.view(b, t, self.n_head, c // self.n_head).permute(0, 2, 1, 3)
                             for z in (query, key, value)]
        if layer_past is not None:
            past_key, past_value = layer_past
            key = torch.cat((past_key, key), dim=-2)
            value = torch.cat((past_value, value), dim=-2)
        present = (key, value) if use_cache is True else None
        out = self._attn(query, key, value)
        out = out.permute(0, 2, 1, 3).contiguous().view(b, t, c)
        return self.c_proj(out), present


class GPT2Block(nn.Module):
    def __init__(self, dim, heads, max_pos):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = GPT2Attention(dim, heads, max_pos)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(0.1))

    def forward(self, x, layer_past=None, use_cache=False):
        attn_out, present = self.attn(self.ln_1(x), layer_past=layer_past, use_cache=use_cache)
        x = x + attn_out
        x = x + self.mlp(self.ln_2(x))
        return x, present


class TinyGPT2(nn.Module):
    """HF GPT-2 shape: past_key_values is a list of (k, v) per layer; presents are returned."""

    def __init__(self, vocab=50, dim=32, heads=4, layers=2, max_pos=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_pos, dim)
        self.h = nn.ModuleList([GPT2Block(dim, heads, max_pos) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        b, t = input_ids.shape
        if past_key_values is None:
            past_length = 0
            past_key_values = tuple([None] * len(self.h))
        else:
            past_length = past_key_values[0][0].size(-2)
        position_ids = torch.arange(past_length, t + past_length, dtype=torch.long,
                                    device=input_ids.device).unsqueeze(0).view(-1, t)
        hidden = self.wte(input_ids) + self.wpe(position_ids)
        presents = () if use_cache else None
        for block, layer_past in zip(self.h, past_key_values):
            hidden, present = block(hidden, layer_past=layer_past, use_cache=use_cache)
            if use_cache is True:
                presents = presents + (present,)
        hidden = self.ln_f(hidden)
        return self.lm_head(hidden), presents


def gpt2_past_inputs(layers=2, heads=4, past=5, head_dim=8):
    past_kv = [(torch.randn(1, heads, past, head_dim), torch.randn(1, heads, past, head_dim))
               for _ in range(layers)]
    return Args(torch.randint(0, 50, (1, 3)), past_key_values=past_kv)


class GreedyGenerator(nn.Module):
    """Greedy decoding for a fixed number of steps, feeding the presents back in."""

    def __init__(self, max_new_tokens=4):
        super().__init__()
        self.model = TinyGPT2()
        self.max_new_tokens = max_new_tokens

    @torch.no_grad()
    def forward(self, input_ids):
        past = None
        generated = input_ids
        next_input = input_ids
        for _ in range(self.max_new_tokens):
            logits, past = self.model(next_input, past_key_values=past)
            next_token = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            generated = torch.cat([generated, next_token], dim=1)
            next_input = next_token
        return generated


class NanoGPTBlock(nn.Module):
    """nanoGPT Block: CausalSelfAttention with the `bias` buffer mask, pre-norm, dropout."""

    def __init__(self, n_embd=32, n_head=4, block_size=8, dropout=0.1):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd),
                                      c_proj=nn.Linear(4 * n_embd, n_embd),
                                      act=nn.GELU(), dropout=nn.Dropout(dropout)))

    def attn(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.dropout(m.c_proj(m.act(m.c_fc(self.ln_2(x)))))


class NanoGPTSampler(nn.Module):
    """nanoGPT `generate`: crop to block size, temperature, top-k filter, multinomial."""

    def __init__(self, vocab=40, dim=32, block_size=8):
        super().__init__()
        self.block_size = block_size
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.block = NanoGPTBlock(dim, 4, block_size)
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def logits(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        return self.head(self.ln_f(self.block(x)))

    @torch.no_grad()
    def forward(self, idx, max_new_tokens=5, temperature=0.8, top_k=5):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.block_size else idx[:, -self.block_size:]
            logits = self.logits(idx_cond)[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


class PaddedEncoder(nn.Module):
    """nn.TransformerEncoderLayer stack with a key padding mask from the pad token, masked mean."""

    def __init__(self, vocab=40, dim=32, heads=4, layers=2, pad_idx=0):
        super().__init__()
        self.dim, self.pad_idx = dim, pad_idx
        self.emb = nn.Embedding(vocab, dim, padding_idx=pad_idx)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(dim, heads, dim_feedforward=64, dropout=0.1,
                                       batch_first=True) for _ in range(layers)])
        self.classifier = nn.Linear(dim, 3)

    def forward(self, tokens):
        pad_mask = tokens.eq(self.pad_idx)
        x = self.emb(tokens) * math.sqrt(self.dim)
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=pad_mask)
        keep = (~pad_mask).unsqueeze(-1).type_as(x)
        pooled = (x * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        return self.classifier(pooled)


def padded_tokens():
    tokens = torch.randint(1, 40, (2, 7))
    tokens[1, 5:] = 0
    return (tokens,)


class CrossAttentionDecoderLayer(nn.Module):
    """Post-norm decoder layer: causal self-attention, then cross-attention over the memory."""

    def __init__(self, dim=32, heads=4, ff=64, dropout=0.1):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, ff), nn.ReLU(), nn.Dropout(dropout),
                                nn.Linear(ff, dim))
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(3)])

    @staticmethod
    def generate_square_subsequent_mask(sz, device=None):
        return torch.triu(torch.full((sz, sz), float("-inf"), device=device), diagonal=1)

    def forward(self, tgt, memory, memory_key_padding_mask=None, need_weights=False):
        tgt_mask = self.generate_square_subsequent_mask(tgt.size(1), tgt.device)
        x = tgt
        sa, _ = self.self_attn(x, x, x, attn_mask=tgt_mask, need_weights=False)
        x = self.norms[0](x + sa)
        ca, weights = self.cross_attn(x, memory, memory,
                                      key_padding_mask=memory_key_padding_mask,
                                      need_weights=need_weights)
        x = self.norms[1](x + ca)
        x = self.norms[2](x + self.ff(x))
        if need_weights:
            return x, weights
        return x


def cross_attention_inputs():
    memory = torch.randn(2, 9, 32)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 7:] = True
    return Args(torch.randn(2, 5, 32), memory, memory_key_padding_mask=mask, need_weights=True)


class T5Attention(nn.Module):
    """T5 self-attention with the bucketed relative position bias computed in forward."""

    def __init__(self, dim=32, heads=4, num_buckets=32, max_distance=128, bidirectional=True):
        super().__init__()
        self.n_heads, self.d_kv = heads, dim // heads
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.relative_attention_bias = nn.Embedding(num_buckets, heads)

    @staticmethod
    def _relative_position_bucket(relative_position, bidirectional=True, num_buckets=32,
                                  max_distance=128):
        relative_buckets = 0
        if bidirectional:
            num_buckets //= 2
            relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
            relative_position = torch.abs(relative_position)
        else:
            relative_position = -torch.min(relative_position,
                                           torch.zeros_like(relative_position))
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        relative_position_if_large = max_exact + (
            torch.log(relative_position.float() / max_exact)
            / math.log(max_distance / max_exact) * (num_buckets - max_exact)
        ).to(torch.long)
        relative_position_if_large = torch.min(
            relative_position_if_large, torch.full_like(relative_position_if_large,
                                                        num_buckets - 1))
        relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
        return relative_buckets

    def compute_bias(self, query_length, key_length, device=None):
        context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        relative_position = memory_position - context_position
        buckets = self._relative_position_bucket(relative_position,
                                                 bidirectional=self.bidirectional,
                                                 num_buckets=self.num_buckets,
                                                 max_distance=self.max_distance)
        values = self.relative_attention_bias(buckets)
        return values.permute([2, 0, 1]).unsqueeze(0)

    def forward(self, hidden_states, mask=None):
        b, t = hidden_states.shape[:2]

        def shape(states):
            return states.view(b, -1, self.n_heads, self.d_kv).transpose(1, 2)

        q, k, v = shape(self.q(hidden_states)), shape(self.k(hidden_states)), \
            shape(self.v(hidden_states))
        scores = torch.matmul(q, k.transpose(3, 2))
        position_bias = self.compute_bias(t, t, device=scores.device)
        if mask is not None:
            position_bias = position_bias + (1.0 - mask[:, None, None, :]) * -1e9
        scores += position_bias
        attn = F.softmax(scores.float(), dim=-1).type_as(scores)
        out = torch.matmul(attn, v).transpose(1, 2).contiguous()
        out = out.view(b, -1, self.n_heads * self.d_kv)
        return self.o(out), position_bias


def t5_inputs():
    mask = torch.ones(2, 12)
    mask[1, 9:] = 0
    return (torch.randn(2, 12, 32), mask)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class LlamaBlock(nn.Module):
    """LLaMA-style block: RMSNorm, rotary embeddings built in forward, a preallocated KV cache
    (a dict of tensors passed in) written in place at `start_pos`, SwiGLU MLP."""

    def __init__(self, dim=32, n_heads=4, hidden=64, base=10000.0):
        super().__init__()
        self.n_heads, self.head_dim, self.base = n_heads, dim // n_heads, base
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)

    def rotary(self, start_pos, seqlen, device):
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, device=device).float()
                                        / self.head_dim))
        t = torch.arange(start_pos, start_pos + seqlen, device=device, dtype=inv_freq.dtype)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]

    def attention(self, x, start_pos, cache, mask):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xv = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(start_pos, seqlen, x.device)
        xq, xk = apply_rotary_pos_emb(xq, xk, cos, sin)
        cache["k"][:bsz, :, start_pos:start_pos + seqlen] = xk
        cache["v"][:bsz, :, start_pos:start_pos + seqlen] = xv
        keys = cache["k"][:bsz, :, :start_pos + seqlen]
        values = cache["v"][:bsz, :, :start_pos + seqlen]
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)

    def forward(self, x, start_pos, cache):
        seqlen = x.shape[1]
        mask = None
        if seqlen > 1:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
            mask = torch.triu(mask, diagonal=1)
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=x.device), mask])
        h = x + self.attention(self.attention_norm(x), start_pos, cache, mask)
        hn = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(hn)) * self.w3(hn))


def llama_inputs():
    cache = {"k": torch.zeros(2, 4, 16, 8), "v": torch.zeros(2, 4, 16, 8)}
    cache["k"][:, :, :3] = torch.randn(2, 4, 3, 8)
    cache["v"][:, :, :3] = torch.randn(2, 4, 3, 8)
    return (torch.randn(2, 4, 32), 3, cache)


def get_alibi_slopes(n_heads):
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio ** i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return get_slopes_power_of_2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return (get_slopes_power_of_2(closest)
            + get_alibi_slopes(2 * closest)[0::2][:n_heads - closest])


class AlibiAttention(nn.Module):
    """Causal attention with ALiBi linear biases (slopes from a Python helper, 6 heads)."""

    def __init__(self, dim=48, heads=6):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        slopes = torch.tensor(get_alibi_slopes(self.heads), device=x.device, dtype=x.dtype)
        pos = torch.arange(t, device=x.device)
        rel = (pos[None, :] - pos[:, None]).to(x.dtype)
        bias = slopes[:, None, None] * rel[None]
        scores = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5 + bias
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.out(out.transpose(1, 2).reshape(b, t, c))


def window_partition(x, window_size):
    b, h, w, c = x.shape
    x = x.view(b, h // window_size, window_size, w // window_size, window_size, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, c)


def window_reverse(windows, window_size, h, w):
    b = int(windows.shape[0] / (h * w / window_size / window_size))
    x = windows.view(b, h // window_size, w // window_size, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, -1)


class SwinBlock(nn.Module):
    """Swin shifted-window block: relative position index buffer, torch.roll, the shift mask
    built in forward with a loop over slices."""

    def __init__(self, dim=32, heads=4, window_size=4, shift_size=2):
        super().__init__()
        self.dim, self.heads, self.ws, self.shift = dim, heads, window_size, shift_size
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.relative_position_bias_table = nn.Parameter(
            torch.randn((2 * window_size - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid([torch.arange(window_size),
                                             torch.arange(window_size)], indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        rel = (coords_flatten[:, :, None] - coords_flatten[:, None, :]).permute(1, 2, 0)
        rel[:, :, 0] += window_size - 1
        rel[:, :, 1] += window_size - 1
        rel[:, :, 0] *= 2 * window_size - 1
        self.register_buffer("relative_position_index", rel.sum(-1))

    def attn_mask(self, h, w, device):
        img_mask = torch.zeros((1, h, w, 1), device=device)
        slices = (slice(0, -self.ws), slice(-self.ws, -self.shift), slice(-self.shift, None))
        cnt = 0
        for hs in slices:
            for wsl in slices:
                img_mask[:, hs, wsl, :] = cnt
                cnt += 1
        mask_windows = window_partition(img_mask, self.ws).view(-1, self.ws * self.ws)
        mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
        return mask.masked_fill(mask != 0, float(-100.0)).masked_fill(mask == 0, float(0.0))

    def forward(self, x, hw):
        h, w = hw
        b, l, c = x.shape
        shortcut = x
        x = self.norm1(x).view(b, h, w, c)
        if self.shift > 0:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
            mask = self.attn_mask(h, w, x.device)
        else:
            mask = None
        windows = window_partition(x, self.ws).view(-1, self.ws * self.ws, c)
        bw, n, _ = windows.shape
        qkv = self.qkv(windows).reshape(bw, n, 3, self.heads, c // self.heads)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        attn = attn + bias.view(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(bw // nw, nw, self.heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        attn = attn.softmax(dim=-1)
        out = self.proj((attn @ v).transpose(1, 2).reshape(bw, n, c))
        x = window_reverse(out.view(-1, self.ws, self.ws, c), self.ws, h, w)
        if self.shift > 0:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        x = shortcut + x.view(b, h * w, c)
        return x + self.mlp(self.norm2(x))


# --------------------------------------------------------------------------------------------
# recurrent networks and sequence-to-sequence decoding


class StackedLSTM(nn.Module):
    """OpenNMT-style stacked LSTM cells with dropout between layers, looped over time."""

    def __init__(self, num_layers=2, input_size=8, hidden=16, dropout=0.2):
        super().__init__()
        self.num_layers, self.hidden = num_layers, hidden
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList()
        for _ in range(num_layers):
            self.layers.append(nn.LSTMCell(input_size, hidden))
            input_size = hidden

    def step(self, input_feed, hidden):
        h_0, c_0 = hidden
        h_1, c_1 = [], []
        for i, layer in enumerate(self.layers):
            h_1_i, c_1_i = layer(input_feed, (h_0[i], c_0[i]))
            input_feed = h_1_i
            if i + 1 != self.num_layers:
                input_feed = self.dropout(input_feed)
            h_1 += [h_1_i]
            c_1 += [c_1_i]
        return input_feed, (torch.stack(h_1), torch.stack(c_1))

    def forward(self, x, hidden=None):
        b = x.size(0)
        if hidden is None:
            zeros = x.new_zeros(self.num_layers, b, self.hidden)
            hidden = (zeros, zeros.clone())
        outputs = []
        for x_t in x.unbind(1):
            out, hidden = self.step(x_t, hidden)
            outputs.append(out)
        return torch.stack(outputs, 1), hidden


class BiRNNTagger(nn.Module):
    """A bidirectional tagger written by hand: forward and backward RNNCell loops, then concat."""

    def __init__(self, vocab=30, emb=12, hidden=16, tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.fwd = nn.RNNCell(emb, hidden, nonlinearity="tanh")
        self.bwd = nn.RNNCell(emb, hidden, nonlinearity="tanh")
        self.hidden = hidden
        self.out = nn.Linear(2 * hidden, tags)

    def forward(self, tokens):
        x = self.embed(tokens)
        b, t, _ = x.shape
        h_f = x.new_zeros(b, self.hidden)
        h_b = x.new_zeros(b, self.hidden)
        fwd_states, bwd_states = [None] * t, [None] * t
        for i in range(t):
            h_f = self.fwd(x[:, i], h_f)
            fwd_states[i] = h_f
        for i in reversed(range(t)):
            h_b = self.bwd(x[:, i], h_b)
            bwd_states[i] = h_b
        states = [torch.cat([f, bb], dim=-1) for f, bb in zip(fwd_states, bwd_states)]
        return F.log_softmax(self.out(torch.stack(states, dim=1)), dim=-1)


class BahdanauAttention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.Wa = nn.Linear(hidden, hidden)
        self.Ua = nn.Linear(hidden, hidden)
        self.Va = nn.Linear(hidden, 1)

    def forward(self, query, keys):
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys)))
        scores = scores.squeeze(2).unsqueeze(1)
        weights = F.softmax(scores, dim=-1)
        context = torch.bmm(weights, keys)
        return context, weights


class Seq2SeqAttn(nn.Module):
    """PyTorch-tutorial seq2seq: GRU encoder, attention decoder; greedy decoding for a fixed
    number of steps, or teacher forcing when a target is given."""

    SOS_token = 1

    def __init__(self, src_vocab=30, tgt_vocab=25, hidden=16, max_length=6):
        super().__init__()
        self.max_length = max_length
        self.enc_embedding = nn.Embedding(src_vocab, hidden)
        self.encoder = nn.GRU(hidden, hidden, batch_first=True)
        self.dec_embedding = nn.Embedding(tgt_vocab, hidden)
        self.attention = BahdanauAttention(hidden)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, tgt_vocab)

    def forward_step(self, input, hidden, encoder_outputs):
        embedded = self.dec_embedding(input)
        query = hidden.permute(1, 0, 2)
        context, attn_weights = self.attention(query, encoder_outputs)
        output, hidden = self.gru(torch.cat((embedded, context), dim=2), hidden)
        return self.out(output), hidden, attn_weights

    def forward(self, src, target_tensor=None, teacher_forcing=True):
        encoder_outputs, encoder_hidden = self.encoder(self.enc_embedding(src))
        batch_size = encoder_outputs.size(0)
        decoder_input = torch.empty(batch_size, 1, dtype=torch.long,
                                    device=src.device).fill_(self.SOS_token)
        decoder_hidden = encoder_hidden
        decoder_outputs, attentions = [], []
        steps = target_tensor.size(1) if target_tensor is not None else self.max_length
        for i in range(steps):
            decoder_output, decoder_hidden, attn_weights = self.forward_step(
                decoder_input, decoder_hidden, encoder_outputs)
            decoder_outputs.append(decoder_output)
            attentions.append(attn_weights)
            if target_tensor is not None and teacher_forcing:
                decoder_input = target_tensor[:, i].unsqueeze(1)
            else:
                _, topi = decoder_output.topk(1)
                decoder_input = topi.squeeze(-1).detach()
        decoder_outputs = F.log_softmax(torch.cat(decoder_outputs, dim=1), dim=-1)
        return decoder_outputs, decoder_hidden, torch.cat(attentions, dim=1)


class EarlyStopGreedyDecoder(nn.Module):
    """Greedy GRU decoder that stops when every sequence has produced EOS: `if finished.all():
    break` branches on a tensor value (a graph break on purpose)."""

    def __init__(self, vocab=12, hidden=16, eos=2, max_len=8):
        super().__init__()
        self.eos, self.max_len = eos, max_len
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.proj = nn.Linear(hidden, vocab)

    def forward(self, h):
        b = h.size(0)
        tok = torch.ones(b, dtype=torch.long, device=h.device)
        finished = torch.zeros(b, dtype=torch.bool, device=h.device)
        out = []
        for _ in range(self.max_len):
            h = self.cell(self.embed(tok), h)
            tok = self.proj(h).argmax(-1)
            tok = tok.masked_fill(finished, self.eos)
            out.append(tok)
            finished |= tok == self.eos
            if finished.all():
                break
        return torch.stack(out, 1)


# --------------------------------------------------------------------------------------------
# generative models: GANs, VAEs, diffusion


class DCGANGenerator(nn.Module):
    def __init__(self, nz=16, ngf=8, nc=3):
        super().__init__()
        self.nz = nz
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf), nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh())

    def forward(self, z):
        if z.dim() == 2:
            z = z.view(z.size(0), self.nz, 1, 1)
        return self.main(z)


class PatchGANDiscriminator(nn.Module):
    """pix2pix PatchGAN; optionally returns the intermediate features (feature-matching loss)."""

    def __init__(self, input_nc=3, ndf=8, n_layers=3):
        super().__init__()
        kw, padw = 4, 1
        blocks = [nn.Sequential(nn.Conv2d(input_nc, ndf, kw, 2, padw), nn.LeakyReLU(0.2, True))]
        nf_mult = 1
        for n in range(1, n_layers):
            nf_mult_prev, nf_mult = nf_mult, min(2 ** n, 8)
            blocks.append(nn.Sequential(
                nn.Conv2d(ndf * nf_mult_prev, ndf * nf_mult, kw, 2, padw, bias=False),
                nn.InstanceNorm2d(ndf * nf_mult), nn.LeakyReLU(0.2, True)))
        blocks.append(nn.Conv2d(ndf * nf_mult, 1, kw, 1, padw))
        self.model = nn.ModuleList(blocks)

    def forward(self, x, return_features=False):
        features = []
        for block in self.model:
            x = block(x)
            features.append(x)
        if return_features:
            return x, features[:-1]
        return x


class GANStep(nn.Module):
    """Hinge losses of one GAN step, a dict of losses and `.item()` logging into a history
    list passed in."""

    def __init__(self):
        super().__init__()
        self.G = DCGANGenerator(nz=16, ngf=4)
        self.D = PatchGANDiscriminator(ndf=4, n_layers=2)

    def forward(self, real, z, history):
        fake = self.G(z)
        d_real = self.D(real)
        d_fake = self.D(fake.detach())
        losses = {
            "d_real": F.relu(1.0 - d_real).mean(),
            "d_fake": F.relu(1.0 + d_fake).mean(),
            "g_adv": -self.D(fake).mean(),
        }
        losses["d_total"] = losses["d_real"] + losses["d_fake"]
        history.append({k: v.item() for k, v in losses.items()})
        return losses


class WGANGPCritic(nn.Module):
    """WGAN-GP critic loss with the gradient penalty (torch.autograd.grad, create_graph)."""

    def __init__(self, dim=16, lambda_gp=10.0):
        super().__init__()
        self.lambda_gp = lambda_gp
        self.critic = nn.Sequential(nn.Linear(dim, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def gradient_penalty(self, real, fake):
        alpha = torch.rand(real.size(0), 1, device=real.device)
        interpolates = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        d_interpolates = self.critic(interpolates)
        gradients = torch.autograd.grad(outputs=d_interpolates, inputs=interpolates,
                                        grad_outputs=torch.ones_like(d_interpolates),
                                        create_graph=True, retain_graph=True,
                                        only_inputs=True)[0]
        return ((gradients.norm(2, dim=1) - 1) ** 2).mean()

    def forward(self, real, fake):
        loss = self.critic(fake).mean() - self.critic(real).mean()
        gp = self.gradient_penalty(real, fake)
        return loss + self.lambda_gp * gp, gp


class AdaIN(nn.Module):
    def __init__(self, style_dim, channels):
        super().__init__()
        self.norm = nn.InstanceNorm2d(channels, affine=False)
        self.style = nn.Linear(style_dim, channels * 2)

    def forward(self, x, w):
        gamma, beta = self.style(w).unsqueeze(-1).unsqueeze(-1).chunk(2, dim=1)
        return (1 + gamma) * self.norm(x) + beta


class StyleGenerator(nn.Module):
    """StyleGAN-flavoured: mapping MLP, constant input, AdaIN per layer, style mixing at a
    crossover layer, per-layer noise drawn with torch.randn."""

    def __init__(self, z_dim=16, w_dim=16, channels=(16, 16, 8)):
        super().__init__()
        layers = []
        for i in range(4):
            layers += [nn.Linear(z_dim if i == 0 else w_dim, w_dim), nn.LeakyReLU(0.2)]
        self.mapping = nn.Sequential(*layers)
        self.const = nn.Parameter(torch.randn(1, channels[0], 4, 4))
        self.convs = nn.ModuleList()
        self.adains = nn.ModuleList()
        self.noise_strength = nn.ParameterList()
        c_in = channels[0]
        for c in channels:
            self.convs.append(nn.Conv2d(c_in, c, 3, padding=1))
            self.adains.append(AdaIN(w_dim, c))
            self.noise_strength.append(nn.Parameter(torch.zeros([])))
            c_in = c
        self.to_rgb = nn.Conv2d(c_in, 3, 1)

    def forward(self, z1, z2=None, crossover=1, truncation=1.0, w_avg=None):
        ws = [self.mapping(z) for z in (z1, z2) if z is not None]
        if truncation != 1.0 and w_avg is not None:
            ws = [w_avg + truncation * (w - w_avg) for w in ws]
        x = self.const.expand(z1.size(0), -1, -1, -1)
        for i, (conv, adain, strength) in enumerate(zip(self.convs, self.adains,
                                                       self.noise_strength)):
            if i > 0:
                x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
            x = conv(x)
            noise = torch.randn(x.size(0), 1, x.size(2), x.size(3), device=x.device)
            x = F.leaky_relu(x + strength * noise, 0.2)
            w = ws[1] if len(ws) > 1 and i >= crossover else ws[0]
            x = adain(x, w)
        return torch.tanh(self.to_rgb(x))


class ConvVAE(nn.Module):
    """Conv VAE: encoder, reparameterisation with randn_like, decoder, and the loss terms."""

    def __init__(self, in_ch=1, latent=8, beta=1.0):
        super().__init__()
        self.beta = beta
        self.encoder = nn.Sequential(
            nn.Conv2d(in_ch, 8, 4, 2, 1), nn.ReLU(),
            nn.Conv2d(8, 16, 4, 2, 1), nn.ReLU(), nn.Flatten())
        self.fc_mu = nn.Linear(16 * 4 * 4, latent)
        self.fc_var = nn.Linear(16 * 4 * 4, latent)
        self.decoder_input = nn.Linear(latent, 16 * 4 * 4)
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(16, 8, 4, 2, 1), nn.ReLU(),
            nn.ConvTranspose2d(8, in_ch, 4, 2, 1), nn.Sigmoid())

    def encode(self, x):
        result = self.encoder(x)
        return [self.fc_mu(result), self.fc_var(result)]

    def decode(self, z):
        return self.decoder(self.decoder_input(z).view(-1, 16, 4, 4))

    @staticmethod
    def reparameterize(mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return eps * std + mu

    def loss_function(self, recons, x, mu, log_var, **kwargs):
        kld_weight = kwargs.get("kld_weight", 1.0)
        recons_loss = F.binary_cross_entropy(recons, x, reduction="sum") / x.size(0)
        kld_loss = torch.mean(-0.5 * torch.sum(1 + log_var - mu ** 2 - log_var.exp(), dim=1))
        loss = recons_loss + self.beta * kld_weight * kld_loss
        return {"loss": loss, "Reconstruction_Loss": recons_loss.detach(),
                "KLD": -kld_loss.detach()}

    def forward(self, x, **kwargs):
        mu, log_var = self.encode(x)
        z = self.reparameterize(mu, log_var)
        recons = self.decode(z)
        return recons, self.loss_function(recons, x, mu, log_var, **kwargs)


class CVAE(nn.Module):
    """Conditional VAE: the label is one-hot encoded (F.one_hot) and concatenated."""

    def __init__(self, dim=32, num_classes=5, latent=4, hidden=32):
        super().__init__()
        self.num_classes = num_classes
        self.enc = nn.Sequential(nn.Linear(dim + num_classes, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.dec = nn.Sequential(nn.Linear(latent + num_classes, hidden), nn.ReLU(),
                                 nn.Linear(hidden, dim))

    def forward(self, x, y, n_samples=2):
        c = F.one_hot(y, self.num_classes).float()
        h = self.enc(torch.cat([x, c], dim=1))
        mu, logvar = self.mu(h), self.logvar(h)
        std = (0.5 * logvar).exp()
        recons = []
        for _ in range(n_samples):
            z = mu + std * torch.randn_like(std)
            recons.append(self.dec(torch.cat([z, c], dim=1)))
        recon = torch.stack(recons).mean(0)
        return recon, mu, logvar


class VectorQuantizer(nn.Module):
    """VQ-VAE codebook lookup: distances, argmin, one-hot scatter, straight-through estimator."""

    def __init__(self, num_embeddings=16, embedding_dim=8, beta=0.25):
        super().__init__()
        self.K, self.D, self.beta = num_embeddings, embedding_dim, beta
        self.embedding = nn.Embedding(self.K, self.D)
        self.embedding.weight.data.uniform_(-1 / self.K, 1 / self.K)

    def forward(self, latents):
        latents = latents.permute(0, 2, 3, 1).contiguous()
        latents_shape = latents.shape
        flat_latents = latents.view(-1, self.D)
        dist = torch.sum(flat_latents ** 2, dim=1, keepdim=True) + \
            torch.sum(self.embedding.weight ** 2, dim=1) - \
            2 * torch.matmul(flat_latents, self.embedding.weight.t())
        encoding_inds = torch.argmin(dist, dim=1).unsqueeze(1)
        encoding_one_hot = torch.zeros(encoding_inds.size(0), self.K, device=latents.device)
        encoding_one_hot.scatter_(1, encoding_inds, 1)
        quantized_latents = torch.matmul(encoding_one_hot, self.embedding.weight)
        quantized_latents = quantized_latents.view(latents_shape)
        commitment_loss = F.mse_loss(quantized_latents.detach(), latents)
        embedding_loss = F.mse_loss(quantized_latents, latents.detach())
        vq_loss = commitment_loss * self.beta + embedding_loss
        quantized_latents = latents + (quantized_latents - latents).detach()
        avg_probs = torch.mean(encoding_one_hot, dim=0)
        perplexity = torch.exp(-torch.sum(avg_probs * torch.log(avg_probs + 1e-10)))
        return quantized_latents.permute(0, 3, 1, 2).contiguous(), vq_loss, perplexity


def extract(a, t, x_shape):
    b, *_ = t.shape
    out = a.gather(-1, t)
    return out.reshape(b, *((1,) * (len(x_shape) - 1)))


def linear_beta_schedule(timesteps, start=1e-4, end=0.02):
    return torch.linspace(start, end, timesteps, dtype=torch.float64)


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        half_dim = self.dim // 2
        emb = math.log(10000) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, device=x.device) * -emb)
        emb = x[:, None] * emb[None, :]
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class TinyUNetEps(nn.Module):
    def __init__(self, ch=8, time_dim=16):
        super().__init__()
        self.time_mlp = nn.Sequential(SinusoidalPosEmb(time_dim), nn.Linear(time_dim, ch),
                                      nn.SiLU())
        self.inp = nn.Conv2d(1, ch, 3, padding=1)
        self.down = nn.Conv2d(ch, ch, 4, 2, 1)
        self.up = nn.ConvTranspose2d(ch, ch, 4, 2, 1)
        self.out = nn.Conv2d(2 * ch, 1, 3, padding=1)

    def forward(self, x, t):
        temb = self.time_mlp(t.float())[:, :, None, None]
        h0 = F.silu(self.inp(x) + temb)
        h = F.silu(self.down(h0))
        h = F.silu(self.up(h))
        return self.out(torch.cat([h, h0], dim=1))


class GaussianDiffusion(nn.Module):
    """denoising-diffusion-pytorch style: schedule buffers, `extract`, q_sample with randn_like
    and the training loss (timesteps drawn with torch.randint)."""

    def __init__(self, timesteps=50):
        super().__init__()
        self.num_timesteps = timesteps
        self.model = TinyUNetEps()
        betas = linear_beta_schedule(timesteps)
        alphas = 1.0 - betas
        alphas_cumprod = torch.cumprod(alphas, dim=0)
        alphas_cumprod_prev = F.pad(alphas_cumprod[:-1], (1, 0), value=1.0)

        def register(name, val):
            self.register_buffer(name, val.to(torch.float32))

        register("betas", betas)
        register("alphas_cumprod", alphas_cumprod)
        register("sqrt_alphas_cumprod", torch.sqrt(alphas_cumprod))
        register("sqrt_one_minus_alphas_cumprod", torch.sqrt(1.0 - alphas_cumprod))
        register("sqrt_recip_alphas", torch.sqrt(1.0 / alphas))
        register("posterior_variance",
                 betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod))

    def q_sample(self, x_start, t, noise=None):
        noise = noise if noise is not None else torch.randn_like(x_start)
        return (extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
                + extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise)

    def p_losses(self, x_start, t, noise=None, loss_type="l2"):
        noise = noise if noise is not None else torch.randn_like(x_start)
        x_noisy = self.q_sample(x_start=x_start, t=t, noise=noise)
        predicted_noise = self.model(x_noisy, t)
        if loss_type == "l1":
            return F.l1_loss(noise, predicted_noise)
        elif loss_type == "l2":
            return F.mse_loss(noise, predicted_noise)
        elif loss_type == "huber":
            return F.smooth_l1_loss(noise, predicted_noise)
        raise NotImplementedError(loss_type)

    def forward(self, img, *args, **kwargs):
        b, c, h, w = img.shape
        t = torch.randint(0, self.num_timesteps, (b,), device=img.device).long()
        return self.p_losses(img * 2 - 1, t, *args, **kwargs)


class DDPMSampler(GaussianDiffusion):
    """The reverse process for a fixed number of steps: `for i in reversed(range(T))`,
    torch.full timesteps, noise only when i > 0."""

    def __init__(self):
        super().__init__(timesteps=6)

    @torch.no_grad()
    def p_sample(self, x, t, t_index):
        betas_t = extract(self.betas, t, x.shape)
        sqrt_one_minus = extract(self.sqrt_one_minus_alphas_cumprod, t, x.shape)
        sqrt_recip = extract(self.sqrt_recip_alphas, t, x.shape)
        model_mean = sqrt_recip * (x - betas_t * self.model(x, t) / sqrt_one_minus)
        if t_index == 0:
            return model_mean
        posterior_variance_t = extract(self.posterior_variance, t, x.shape)
        noise = torch.randn_like(x)
        return model_mean + torch.sqrt(posterior_variance_t) * noise

    @torch.no_grad()
    def forward(self, shape, return_all=False):
        b = shape[0]
        img = torch.randn(shape)
        imgs = []
        for i in reversed(range(0, self.num_timesteps)):
            img = self.p_sample(img, torch.full((b,), i, dtype=torch.long), i)
            imgs.append(img)
        return imgs if return_all else img


# --------------------------------------------------------------------------------------------
# detection post-processing


def box_area(boxes):
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(boxes1, boxes2):
    area1, area2 = box_area(boxes1), box_area(boxes2)
    lt = torch.max(boxes1[:, None, :2], boxes2[:, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[:, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[:, :, 0] * wh[:, :, 1]
    return inter / (area1[:, None] + area2 - inter)


def random_boxes(n, size=64.0):
    xy = torch.rand(n, 2) * size * 0.7
    wh = torch.rand(n, 2) * size * 0.3 + 2.0
    return torch.cat([xy, xy + wh], dim=1)


class AnchorHead(nn.Module):
    """RPN-style head: anchors generated in forward (meshgrid over the feature map), deltas
    decoded as torchvision's BoxCoder does, boxes clipped, low scores masked, top-k kept."""

    def __init__(self, in_ch=16, sizes=(8.0, 16.0), ratios=(0.5, 1.0, 2.0), stride=8,
                 pre_nms_top_n=20, score_thresh=0.05):
        super().__init__()
        self.sizes, self.ratios, self.stride = sizes, ratios, stride
        self.num_anchors = len(sizes) * len(ratios)
        self.conv = nn.Conv2d(in_ch, in_ch, 3, padding=1)
        self.cls_logits = nn.Conv2d(in_ch, self.num_anchors, 1)
        self.bbox_pred = nn.Conv2d(in_ch, self.num_anchors * 4, 1)
        self.pre_nms_top_n, self.score_thresh = pre_nms_top_n, score_thresh
        self.weights = (1.0, 1.0, 1.0, 1.0)
        self.bbox_xform_clip = math.log(1000.0 / 16)

    def cell_anchors(self, device):
        scales = torch.as_tensor(self.sizes, device=device)
        aspect_ratios = torch.as_tensor(self.ratios, device=device)
        h_ratios = torch.sqrt(aspect_ratios)
        w_ratios = 1 / h_ratios
        ws = (w_ratios[:, None] * scales[None, :]).view(-1)
        hs = (h_ratios[:, None] * scales[None, :]).view(-1)
        return (torch.stack([-ws, -hs, ws, hs], dim=1) / 2).round()

    def grid_anchors(self, fh, fw, device):
        shifts_x = torch.arange(0, fw, dtype=torch.int32, device=device) * self.stride
        shifts_y = torch.arange(0, fh, dtype=torch.int32, device=device) * self.stride
        shift_y, shift_x = torch.meshgrid(shifts_y, shifts_x, indexing="ij")
        shift_x, shift_y = shift_x.reshape(-1), shift_y.reshape(-1)
        shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=1)
        return (shifts.view(-1, 1, 4) + self.cell_anchors(device).view(1, -1, 4)).reshape(-1, 4)

    def decode(self, rel_codes, boxes):
        boxes = boxes.to(rel_codes.dtype)
        widths = boxes[:, 2] - boxes[:, 0]
        heights = boxes[:, 3] - boxes[:, 1]
        ctr_x = boxes[:, 0] + 0.5 * widths
        ctr_y = boxes[:, 1] + 0.5 * heights
        wx, wy, ww, wh = self.weights
        dx, dy = rel_codes[:, 0::4] / wx, rel_codes[:, 1::4] / wy
        dw = torch.clamp(rel_codes[:, 2::4] / ww, max=self.bbox_xform_clip)
        dh = torch.clamp(rel_codes[:, 3::4] / wh, max=self.bbox_xform_clip)
        pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
        pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
        pred_w = torch.exp(dw) * widths[:, None]
        pred_h = torch.exp(dh) * heights[:, None]
        c_to_c_h = torch.tensor(0.5, dtype=pred_ctr_y.dtype, device=pred_h.device) * pred_h
        c_to_c_w = torch.tensor(0.5, dtype=pred_ctr_x.dtype, device=pred_w.device) * pred_w
        return torch.stack((pred_ctr_x - c_to_c_w, pred_ctr_y - c_to_c_h,
                            pred_ctr_x + c_to_c_w, pred_ctr_y + c_to_c_h), dim=2).flatten(1)

    def forward(self, features, image_size):
        b, _, fh, fw = features.shape
        t = F.relu(self.conv(features))
        logits = self.cls_logits(t).permute(0, 2, 3, 1).reshape(b, -1)
        deltas = self.bbox_pred(t).view(b, self.num_anchors, 4, fh, fw)
        deltas = deltas.permute(0, 3, 4, 1, 2).reshape(-1, 4)
        anchors = self.grid_anchors(fh, fw, features.device)
        proposals = self.decode(deltas, anchors.repeat(b, 1)).view(b, -1, 4)
        h, w = image_size
        proposals = torch.stack([proposals[..., 0].clamp(0, w), proposals[..., 1].clamp(0, h),
                                 proposals[..., 2].clamp(0, w), proposals[..., 3].clamp(0, h)],
                                dim=-1)
        scores = logits.sigmoid()
        scores = torch.where(scores > self.score_thresh, scores, torch.zeros_like(scores))
        k = min(self.pre_nms_top_n, scores.shape[1])
        top_scores, top_idx = scores.topk(k, dim=1)
        batch_idx = torch.arange(b, device=features.device)[:, None]
        return proposals[batch_idx, top_idx], top_scores


class AnchorMatcher(nn.Module):
    """torchvision Matcher / SSD target assignment: IoU matrix, best gt per anchor, thresholds
    applied with torch.where, each gt's best anchor forced to match, box targets encoded."""

    def __init__(self, high=0.5, low=0.4, allow_low_quality_matches=True):
        super().__init__()
        self.high, self.low = high, low
        self.allow_low_quality_matches = allow_low_quality_matches
        self.BELOW_LOW_THRESHOLD, self.BETWEEN_THRESHOLDS = -1, -2

    def forward(self, anchors, gt_boxes, gt_labels):
        match_quality_matrix = box_iou(gt_boxes, anchors)
        matched_vals, matches = match_quality_matrix.max(dim=0)
        all_matches = matches.clone() if self.allow_low_quality_matches else None
        below = matched_vals < self.low
        between = (matched_vals >= self.low) & (matched_vals < self.high)
        matches = torch.where(below, torch.full_like(matches, self.BELOW_LOW_THRESHOLD), matches)
        matches = torch.where(between, torch.full_like(matches, self.BETWEEN_THRESHOLDS), matches)
        if self.allow_low_quality_matches:
            highest_quality_foreach_gt, best_anchor = match_quality_matrix.max(dim=1)
            forced = torch.zeros_like(matches, dtype=torch.bool)
            forced[best_anchor] = True
            matches = torch.where(forced, all_matches, matches)
        clamped = matches.clamp(min=0)
        labels = gt_labels[clamped]
        labels = torch.where(matches >= 0, labels, torch.zeros_like(labels))
        labels = torch.where(matches == self.BETWEEN_THRESHOLDS, torch.full_like(labels, -1),
                             labels)
        matched_boxes = gt_boxes[clamped]
        aw, ah = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
        gw = matched_boxes[:, 2] - matched_boxes[:, 0]
        gh = matched_boxes[:, 3] - matched_boxes[:, 1]
        targets = torch.stack([
            ((matched_boxes[:, 0] + 0.5 * gw) - (anchors[:, 0] + 0.5 * aw)) / aw,
            ((matched_boxes[:, 1] + 0.5 * gh) - (anchors[:, 1] + 0.5 * ah)) / ah,
            torch.log(gw / aw), torch.log(gh / ah)], dim=1)
        return {"labels": labels, "matches": matches, "box_targets": targets,
                "num_foreground": (labels > 0).sum()}


def matcher_inputs():
    return (random_boxes(40), random_boxes(5), torch.randint(1, 4, (5,)))


class CenterNetDecoder(nn.Module):
    """CenterNet decoding: 3x3 max-pool NMS on the heatmap, top-k over C*H*W, index arithmetic
    (// and %), gather of sizes and offsets at the peaks."""

    def __init__(self, K=10):
        super().__init__()
        self.K = K

    @staticmethod
    def _nms(heat, kernel=3):
        pad = (kernel - 1) // 2
        hmax = F.max_pool2d(heat, (kernel, kernel), stride=1, padding=pad)
        keep = (hmax == heat).float()
        return heat * keep

    @staticmethod
    def _gather_feat(feat, ind):
        dim = feat.size(2)
        ind = ind.unsqueeze(2).expand(ind.size(0), ind.size(1), dim)
        return feat.gather(1, ind)

    def _transpose_and_gather_feat(self, feat, ind):
        feat = feat.permute(0, 2, 3, 1).contiguous()
        feat = feat.view(feat.size(0), -1, feat.size(3))
        return self._gather_feat(feat, ind)

    def forward(self, heat, wh, reg):
        batch, cat, height, width = heat.size()
        heat = self._nms(heat.sigmoid())
        topk_scores, topk_inds = torch.topk(heat.view(batch, cat, -1), self.K)
        topk_inds = topk_inds % (height * width)
        topk_ys = torch.div(topk_inds, width, rounding_mode="floor").float()
        topk_xs = (topk_inds % width).int().float()
        scores, topk_ind = torch.topk(topk_scores.view(batch, -1), self.K)
        clses = torch.div(topk_ind, self.K, rounding_mode="floor").int()
        inds = self._gather_feat(topk_inds.view(batch, -1, 1), topk_ind).view(batch, self.K)
        ys = self._gather_feat(topk_ys.view(batch, -1, 1), topk_ind).view(batch, self.K)
        xs = self._gather_feat(topk_xs.view(batch, -1, 1), topk_ind).view(batch, self.K)
        reg = self._transpose_and_gather_feat(reg, inds)
        xs = xs.view(batch, self.K, 1) + reg[:, :, 0:1]
        ys = ys.view(batch, self.K, 1) + reg[:, :, 1:2]
        wh = self._transpose_and_gather_feat(wh, inds)
        bboxes = torch.cat([xs - wh[..., 0:1] / 2, ys - wh[..., 1:2] / 2,
                            xs + wh[..., 0:1] / 2, ys + wh[..., 1:2] / 2], dim=2)
        return torch.cat([bboxes, scores.unsqueeze(2), clses.float().unsqueeze(2)], dim=2)


class YOLOPostprocess(nn.Module):
    """YOLOv5-style: decode the grid outputs with sigmoid and anchors, then for each image keep
    `x[x[..., 4] > conf_thres]` (boolean indexing: a data-dependent shape, on purpose)."""

    def __init__(self, nc=3, anchors=((10, 13), (16, 30), (33, 23)), stride=8,
                 conf_thres=0.5):
        super().__init__()
        self.nc, self.no, self.na = nc, nc + 5, len(anchors)
        self.stride, self.conf_thres = stride, conf_thres
        self.register_buffer("anchor_grid", torch.tensor(anchors).float().view(1, -1, 1, 1, 2))
        self.m = nn.Conv2d(16, self.no * self.na, 1)

    def _make_grid(self, nx, ny):
        yv, xv = torch.meshgrid([torch.arange(ny), torch.arange(nx)], indexing="ij")
        return torch.stack((xv, yv), 2).view((1, 1, ny, nx, 2)).float()

    def forward(self, feat):
        bs, _, ny, nx = feat.shape
        x = self.m(feat).view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
        grid = self._make_grid(nx, ny)
        y = x.sigmoid()
        xy = (y[..., 0:2] * 2 - 0.5 + grid) * self.stride
        wh = (y[..., 2:4] * 2) ** 2 * self.anchor_grid
        y = torch.cat((xy, wh, y[..., 4:]), -1).view(bs, -1, self.no)
        output = []
        for xi, det in enumerate(y):
            det = det[det[..., 4] > self.conf_thres]
            if not det.shape[0]:
                output.append(torch.zeros((0, 6)))
                continue
            det[:, 5:] *= det[:, 4:5]
            box = torch.cat((det[:, :2] - det[:, 2:4] / 2, det[:, :2] + det[:, 2:4] / 2), 1)
            conf, j = det[:, 5:].max(1, keepdim=True)
            output.append(torch.cat((box, conf, j.float()), 1))
        return output


class RetinaNetPostprocess(nn.Module):
    """torchvision RetinaNet postprocess_detections per level: score threshold with
    torch.nonzero / torch.where, top-k with min(k, n), class and anchor index arithmetic
    (the sizes of data-dependent results flow into topk as numbers read at replay)."""

    def __init__(self, num_classes=3, score_thresh=0.3, topk_candidates=15, detections=10):
        super().__init__()
        self.num_classes = num_classes
        self.score_thresh, self.topk_candidates = score_thresh, topk_candidates
        self.detections_per_img = detections

    def forward(self, cls_logits_per_level, boxes_per_level):
        image_boxes, image_scores, image_labels = [], [], []
        for logits_l, boxes_l in zip(cls_logits_per_level, boxes_per_level):
            num_classes = logits_l.shape[-1]
            scores_per_level = torch.sigmoid(logits_l).flatten()
            keep_idxs = scores_per_level > self.score_thresh
            scores_per_level = scores_per_level[keep_idxs]
            topk_idxs = torch.nonzero(keep_idxs).squeeze(1)
            num_topk = min(self.topk_candidates, topk_idxs.size(0))
            scores_per_level, idxs = scores_per_level.topk(num_topk)
            topk_idxs = topk_idxs[idxs]
            anchor_idxs = torch.div(topk_idxs, num_classes, rounding_mode="floor")
            labels_per_level = topk_idxs % num_classes
            image_boxes.append(boxes_l[anchor_idxs])
            image_scores.append(scores_per_level)
            image_labels.append(labels_per_level)
        boxes = torch.cat(image_boxes, dim=0)
        scores = torch.cat(image_scores, dim=0)
        labels = torch.cat(image_labels, dim=0)
        order = scores.argsort(descending=True)[: self.detections_per_img]
        return {"boxes": boxes[order], "scores": scores[order], "labels": labels[order]}


def retinanet_inputs():
    logits = [torch.randn(48, 3), torch.randn(12, 3)]
    boxes = [random_boxes(48), random_boxes(12)]
    return (logits, boxes)


# --------------------------------------------------------------------------------------------
# losses with Python-side bookkeeping


def sigmoid_focal_loss(inputs, targets, alpha=0.25, gamma=2.0, reduction="none"):
    p = torch.sigmoid(inputs)
    ce_loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce_loss * ((1 - p_t) ** gamma)
    if alpha >= 0:
        alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
        loss = alpha_t * loss
    if reduction == "mean":
        loss = loss.mean()
    elif reduction == "sum":
        loss = loss.sum()
    return loss


class DetectionCriterion(nn.Module):
    """Focal classification + smooth-L1 / GIoU-free box loss over foreground anchors, a dict of
    weighted losses and the total as `sum(losses.values())`."""

    def __init__(self, num_classes=4, weight_dict=None):
        super().__init__()
        self.num_classes = num_classes
        self.weight_dict = weight_dict or {"loss_cls": 1.0, "loss_box": 2.0, "loss_ctr": 0.5}

    def forward(self, outputs, targets):
        cls_logits, box_reg, centerness = outputs["cls"], outputs["box"], outputs["ctr"]
        labels, box_targets = targets["labels"], targets["boxes"]
        foreground = labels > 0
        num_fg = foreground.sum().clamp(min=1).float()
        gt_onehot = F.one_hot(labels, self.num_classes + 1)[..., 1:].float()
        losses = {
            "loss_cls": sigmoid_focal_loss(cls_logits, gt_onehot, reduction="sum") / num_fg,
            "loss_box": (F.smooth_l1_loss(box_reg, box_targets, beta=1.0 / 9, reduction="none")
                         .sum(-1) * foreground).sum() / num_fg,
            "loss_ctr": (F.binary_cross_entropy_with_logits(
                centerness, torch.ones_like(centerness), reduction="none")
                * foreground).sum() / num_fg,
        }
        losses = {k: v * self.weight_dict[k] for k, v in losses.items() if k in self.weight_dict}
        total = sum(losses.values())
        return total, losses


def detection_loss_inputs():
    n = 30
    outputs = {"cls": torch.randn(2, n, 4), "box": torch.randn(2, n, 4), "ctr": torch.randn(2, n)}
    labels = torch.randint(0, 5, (2, n))
    targets = {"labels": labels, "boxes": torch.randn(2, n, 4)}
    return (outputs, targets)


class AverageMeter:
    """The classic ImageNet-example meter, kept in a dict of meters passed in."""

    def __init__(self, name):
        self.name = name
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


class ClassifierTrainStep(nn.Module):
    """Forward + loss + accuracy with `.item()` logging into AverageMeters (loss.item(), the
    top-k accuracy in Python floats)."""

    def __init__(self, in_dim=32, num_classes=10, topk=(1, 5)):
        super().__init__()
        self.topk = topk
        self.net = nn.Sequential(nn.Linear(in_dim, 64), nn.ReLU(), nn.Linear(64, num_classes))
        self.criterion = nn.CrossEntropyLoss()

    def accuracy(self, output, target):
        maxk = max(self.topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in self.topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res

    def forward(self, images, target, meters):
        output = self.net(images)
        loss = self.criterion(output, target)
        acc1, acc5 = self.accuracy(output, target)
        meters["loss"].update(loss.item(), images.size(0))
        meters["top1"].update(acc1[0].item(), images.size(0))
        meters["top5"].update(acc5[0].item(), images.size(0))
        return loss


def train_step_inputs():
    meters = {name: AverageMeter(name) for name in ("loss", "top1", "top5")}
    meters["loss"].update(2.5, 8)
    return (torch.randn(8, 32), torch.randint(0, 10, (8,)), meters)


class LabelSmoothingSeqLoss(nn.Module):
    """Token-level cross entropy with label smoothing and ignore_index; token accuracy and the
    running sums go into a plain `stats` dict passed in (float(), .item())."""

    def __init__(self, vocab=20, dim=16, pad_idx=0, smoothing=0.1):
        super().__init__()
        self.pad_idx = pad_idx
        self.proj = nn.Linear(dim, vocab)
        self.criterion = nn.CrossEntropyLoss(ignore_index=pad_idx, label_smoothing=smoothing)

    def forward(self, hidden, target, stats):
        logits = self.proj(hidden)
        loss = self.criterion(logits.view(-1, logits.size(-1)), target.view(-1))
        non_pad = target.ne(self.pad_idx)
        n_tokens = non_pad.sum().item()
        n_correct = logits.argmax(-1).eq(target).masked_select(non_pad).sum().item()
        stats["n_tokens"] = stats.get("n_tokens", 0) + n_tokens
        stats["n_correct"] = stats.get("n_correct", 0) + n_correct
        stats["loss_sum"] = stats.get("loss_sum", 0.0) + float(loss) * n_tokens
        stats.setdefault("history", []).append(round(loss.item(), 6))
        return loss


def label_smoothing_inputs():
    target = torch.randint(1, 20, (3, 6))
    target[0, 4:] = 0
    return (torch.randn(3, 6, 16), target, {"n_tokens": 10, "n_correct": 3, "loss_sum": 29.0})


class NTXentLoss(nn.Module):
    """SimCLR NT-Xent loss: projection head, cosine similarity matrix, diagonal masked, positive
    pairs found with arange arithmetic."""

    def __init__(self, dim=32, proj=16, temperature=0.5):
        super().__init__()
        self.temperature = temperature
        self.projector = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, proj))

    def forward(self, h_i, h_j):
        z_i = F.normalize(self.projector(h_i), dim=1)
        z_j = F.normalize(self.projector(h_j), dim=1)
        batch_size = z_i.shape[0]
        z = torch.cat([z_i, z_j], dim=0)
        sim = torch.mm(z, z.t()) / self.temperature
        n = 2 * batch_size
        mask = torch.eye(n, dtype=torch.bool, device=z.device)
        sim = sim.masked_fill(mask, float("-inf"))
        targets = torch.arange(n, device=z.device)
        targets = (targets + batch_size) % n
        loss = F.cross_entropy(sim, targets)
        with torch.no_grad():
            acc = (sim.argmax(dim=1) == targets).float().mean()
        return loss, acc


class DiceBCELoss(nn.Module):
    """Segmentation loss: per-class soft dice with class weights (enumerate over a list), plus
    BCE; returns the total and the per-class dice in a dict."""

    def __init__(self, class_weights=(0.2, 1.0, 1.5), smooth=1.0, bce_weight=0.5):
        super().__init__()
        self.class_weights = list(class_weights)
        self.smooth, self.bce_weight = smooth, bce_weight

    def forward(self, logits, target):
        probs = torch.sigmoid(logits)
        one_hot = F.one_hot(target, len(self.class_weights)).permute(0, 3, 1, 2).float()
        dice_per_class = {}
        loss = 0.0
        for c, w in enumerate(self.class_weights):
            p, g = probs[:, c], one_hot[:, c]
            inter = (p * g).sum(dim=(1, 2))
            union = p.sum(dim=(1, 2)) + g.sum(dim=(1, 2))
            dice = ((2 * inter + self.smooth) / (union + self.smooth)).mean()
            dice_per_class[f"dice_{c}"] = dice.detach()
            loss = loss + w * (1 - dice)
        loss = loss / sum(self.class_weights)
        bce = F.binary_cross_entropy_with_logits(logits, one_hot)
        return loss + self.bce_weight * bce, dice_per_class


# --------------------------------------------------------------------------------------------
# vision backbones and blocks


class DoubleConv(nn.Module):
    def __init__(self, in_channels, out_channels, mid_channels=None):
        super().__init__()
        if not mid_channels:
            mid_channels = out_channels
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, mid_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(mid_channels), nn.ReLU(inplace=True),
            nn.Conv2d(mid_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.double_conv(x)


class UNet(nn.Module):
    """U-Net: skips kept in a list, consumed with zip(reversed(...)); odd sizes are fixed with
    F.pad when the upsampled map and the skip differ (a branch on shapes)."""

    def __init__(self, n_channels=3, n_classes=2, features=(8, 16, 32), bilinear=True):
        super().__init__()
        self.bilinear = bilinear
        self.downs = nn.ModuleList()
        ch = n_channels
        for f in features:
            self.downs.append(DoubleConv(ch, f))
            ch = f
        self.bottleneck = DoubleConv(features[-1], features[-1] * 2)
        self.ups = nn.ModuleList()
        self.up_convs = nn.ModuleList()
        ch = features[-1] * 2
        for f in reversed(features):
            if bilinear:
                self.ups.append(nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear",
                                                          align_corners=True),
                                              nn.Conv2d(ch, f, 1)))
            else:
                self.ups.append(nn.ConvTranspose2d(ch, f, 2, stride=2))
            self.up_convs.append(DoubleConv(2 * f, f))
            ch = f
        self.outc = nn.Conv2d(features[0], n_classes, kernel_size=1)

    def forward(self, x):
        skips = []
        for down in self.downs:
            x = down(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottleneck(x)
        for up, conv, skip in zip(self.ups, self.up_convs, reversed(skips)):
            x = up(x)
            if x.shape != skip.shape:
                diff_y = skip.size()[2] - x.size()[2]
                diff_x = skip.size()[3] - x.size()[3]
                x = F.pad(x, [diff_x // 2, diff_x - diff_x // 2, diff_y // 2, diff_y - diff_y // 2])
            x = conv(torch.cat([skip, x], dim=1))
        return self.outc(x)


def conv3x3(in_planes, out_planes, stride=1, groups=1, dilation=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=dilation,
                     groups=groups, bias=False, dilation=dilation)


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, norm_layer=None):
        super().__init__()
        if norm_layer is None:
            norm_layer = nn.BatchNorm2d
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = norm_layer(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, reduction=4):
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(nn.Linear(channels, channels // reduction, bias=False),
                                nn.ReLU(inplace=True),
                                nn.Linear(channels // reduction, channels, bias=False),
                                nn.Sigmoid())

    def forward(self, x):
        b, c, _, _ = x.size()
        y = self.avg_pool(x).view(b, c)
        y = self.fc(y).view(b, c, 1, 1)
        return x * y.expand_as(x)


class SEBottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, reduction=4):
        super().__init__()
        width = planes
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.se = SqueezeExcitation(planes * self.expansion, reduction)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.se(self.bn3(self.conv3(out)))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class SmallResNet(nn.Module):
    """torchvision-style `_make_layer`: a downsample only where stride or width changes; an
    optional dropout before the classifier from a config flag."""

    def __init__(self, block=BasicBlock, layers=(1, 1, 1), num_classes=10, width=8,
                 dropout=0.0):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        stages = []
        for i, n in enumerate(layers):
            stages.append(self._make_layer(block, width * 2 ** i, n, stride=1 if i == 0 else 2))
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.fc = nn.Linear(self.inplanes, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = torch.flatten(self.avgpool(x), 1)
        if self.dropout is not None:
            x = self.dropout(x)
        return self.fc(x)


def drop_path(x, drop_prob: float = 0.0, training: bool = False, scale_by_keep: bool = True):
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        random_tensor.div_(keep_prob)
    return x * random_tensor


class ConvNeXtBlock(nn.Module):
    """ConvNeXt block (timm): depthwise 7x7, channels-last LayerNorm, MLP, layer scale, and
    stochastic depth (drop_path with bernoulli_) in training mode."""

    def __init__(self, dim, drop_path_rate=0.0, layer_scale_init_value=1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale_init_value * torch.ones(dim)) \
            if layer_scale_init_value > 0 else None
        self.drop_path_rate = drop_path_rate

    def forward(self, x):
        shortcut = x
        x = self.dwconv(x).permute(0, 2, 3, 1)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        if self.gamma is not None:
            x = self.gamma * x
        x = x.permute(0, 3, 1, 2)
        return shortcut + drop_path(x, self.drop_path_rate, self.training)


class ConvNeXtStage(nn.Module):
    def __init__(self, dim=16, depth=3, drop_path_rate=0.3):
        super().__init__()
        dp_rates = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]
        self.blocks = nn.Sequential(*[ConvNeXtBlock(dim, dp_rates[j], 0.5) for j in range(depth)])

    def forward(self, x):
        return self.blocks(x)


class FPN(nn.Module):
    """Feature pyramid: lateral convs by list comprehension, top-down pathway with nearest
    interpolation to each size, outputs returned as an OrderedDict-like dict built by a dict
    comprehension, and an auxiliary `sum(... for ...)` generator expression."""

    def __init__(self, in_channels_list=(8, 16, 32), out_channels=16):
        super().__init__()
        self.inner_blocks = nn.ModuleList([nn.Conv2d(c, out_channels, 1) for c in in_channels_list])
        self.layer_blocks = nn.ModuleList([nn.Conv2d(out_channels, out_channels, 3, padding=1)
                                           for _ in in_channels_list])
        self.body = nn.ModuleList()
        prev = 3
        for c in in_channels_list:
            self.body.append(nn.Sequential(nn.Conv2d(prev, c, 3, stride=2, padding=1), nn.ReLU()))
            prev = c

    def forward(self, images):
        feats = []
        x = images
        for stage in self.body:
            x = stage(x)
            feats.append(x)
        inner = [blk(f) for blk, f in zip(self.inner_blocks, feats)]
        last_inner = inner[-1]
        results = [self.layer_blocks[-1](last_inner)]
        for idx in range(len(feats) - 2, -1, -1):
            inner_lateral = inner[idx]
            feat_shape = inner_lateral.shape[-2:]
            inner_top_down = F.interpolate(last_inner, size=feat_shape, mode="nearest")
            last_inner = inner_lateral + inner_top_down
            results.insert(0, self.layer_blocks[idx](last_inner))
        out = {f"p{i + 2}": r for i, r in enumerate(results)}
        out["pool"] = F.max_pool2d(results[-1], 1, 2, 0)
        aux = sum(r.mean() for r in out.values())
        return out, aux


class ViTBlock(nn.Module):
    """Pre-norm encoder block with nn.MultiheadAttention (torchvision's ViT EncoderBlock)."""

    def __init__(self, dim, heads, mlp_ratio=2, dropout=0.0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(mlp_ratio * dim, dim), nn.Dropout(dropout))

    def forward(self, input):
        torch._assert(input.dim() == 3,
                      f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = x + input
        return x + self.mlp(self.ln_2(x))


class VisionTransformerTiny(nn.Module):
    """ViT with a class token; the position embedding is interpolated (bicubic) when the input
    grid differs from the one it was built for: a branch on shapes."""

    def __init__(self, img_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5):
        super().__init__()
        self.patch_size = patch_size
        self.patch_embed = nn.Conv2d(3, dim, patch_size, patch_size)
        num_patches = (img_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([ViTBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def interpolate_pos_encoding(self, x, w, h):
        npatch = x.shape[1] - 1
        N = self.pos_embed.shape[1] - 1
        if npatch == N and w == h:
            return self.pos_embed
        class_pos_embed = self.pos_embed[:, 0]
        patch_pos_embed = self.pos_embed[:, 1:]
        dim = x.shape[-1]
        w0, h0 = w // self.patch_size, h // self.patch_size
        side = int(math.sqrt(N))
        patch_pos_embed = F.interpolate(
            patch_pos_embed.reshape(1, side, side, dim).permute(0, 3, 1, 2),
            size=(w0, h0), mode="bicubic", align_corners=False)
        assert int(w0) == patch_pos_embed.shape[-2] and int(h0) == patch_pos_embed.shape[-1]
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
        return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed), dim=1)

    def forward(self, x):
        B, nc, w, h = x.shape
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls_tokens = self.cls_token.expand(B, -1, -1)
        x = torch.cat((cls_tokens, x), dim=1)
        x = x + self.interpolate_pos_encoding(x, w, h)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class MixerBlock(nn.Module):
    def __init__(self, num_patches, dim, token_dim=16, channel_dim=64):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mix = nn.Sequential(nn.Linear(num_patches, token_dim), nn.GELU(),
                                       nn.Linear(token_dim, num_patches))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mix = nn.Sequential(nn.Linear(dim, channel_dim), nn.GELU(),
                                         nn.Linear(channel_dim, dim))

    def forward(self, x):
        x = x + self.token_mix(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mix(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, image_size=32, patch_size=8, dim=32, depth=2, num_classes=5):
        super().__init__()
        n = (image_size // patch_size) ** 2
        self.patch_size = patch_size
        self.to_patch = nn.Linear(3 * patch_size * patch_size, dim)
        self.mixers = nn.Sequential(*[MixerBlock(n, dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, img):
        b, c, h, w = img.shape
        p = self.patch_size
        x = img.unfold(2, p, p).unfold(3, p, p)
        x = x.permute(0, 2, 3, 1, 4, 5).reshape(b, (h // p) * (w // p), c * p * p)
        x = self.mixers(self.to_patch(x))
        return self.head(self.norm(x).mean(dim=1))


# --------------------------------------------------------------------------------------------
# mixture of experts


class Expert(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class DenseTopKMoE(nn.Module):
    """Top-k routing computed densely: every expert runs on every token and the outputs are
    weighted by the (renormalised) top-k gates scattered back; aux load-balancing loss."""

    def __init__(self, dim=16, hidden=32, num_experts=4, k=2):
        super().__init__()
        self.k, self.num_experts = k, num_experts
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList([Expert(dim, hidden) for _ in range(num_experts)])

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.gate(x)
        probs = logits.softmax(dim=-1)
        topk_w, topk_idx = probs.topk(self.k, dim=-1)
        topk_w = topk_w / topk_w.sum(dim=-1, keepdim=True)
        gates = torch.zeros_like(probs).scatter(1, topk_idx, topk_w)
        expert_out = torch.stack([e(x) for e in self.experts], dim=1)
        y = (gates.unsqueeze(-1) * expert_out).sum(dim=1)
        density = F.one_hot(topk_idx[:, 0], self.num_experts).float().mean(0)
        aux_loss = self.num_experts * (density * probs.mean(0)).sum()
        return y.view(shape), aux_loss


class SparseMoE(nn.Module):
    """Mixtral-style sparse dispatch: one_hot expert mask, `torch.where(mask[i])` per expert,
    index_add_ of the weighted expert outputs (data-dependent shapes that Python never reads)."""

    def __init__(self, dim=16, hidden=32, num_experts=4, top_k=2):
        super().__init__()
        self.top_k, self.num_experts = top_k, num_experts
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList([Expert(dim, hidden) for _ in range(num_experts)])

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final = torch.zeros((batch_size * sequence_length, hidden_dim),
                            dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in range(self.num_experts):
            expert_layer = self.experts[expert_idx]
            idx, top_x = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current = expert_layer(current_state) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, current.to(hidden_states.dtype))
        return final.reshape(batch_size, sequence_length, hidden_dim), router_logits


# --------------------------------------------------------------------------------------------
# Python constructs around the tensors


class SinusoidalPositionalEncoding(nn.Module):
    """The annotated-transformer encoding, but built in forward for the current length (no
    buffer), with in-place strided writes into a zeros tensor."""

    def __init__(self, d_model=32, dropout=0.1, vocab=30):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.dropout = nn.Dropout(p=dropout)

    def positional_encoding(self, length, device):
        pe = torch.zeros(length, self.d_model, device=device)
        position = torch.arange(0, length, device=device).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, self.d_model, 2, device=device)
                             * -(math.log(10000.0) / self.d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        return pe.unsqueeze(0)

    def forward(self, tokens):
        x = self.embed(tokens) * math.sqrt(self.d_model)
        x = x + self.positional_encoding(tokens.size(1), tokens.device).requires_grad_(False)
        return self.dropout(x)


class LayerDropEncoder(nn.Module):
    """fairseq-style LayerDrop and HF-style flags: skip layers with probability `layerdrop`
    in training only, an explicit `skip_layers` set, output_hidden_states / return_dict."""

    def __init__(self, dim=32, layers=4, layerdrop=0.2, skip_layers=(2,)):
        super().__init__()
        self.layers = nn.ModuleList([ViTBlock(dim, heads=4) for _ in range(layers)])
        self.layerdrop = layerdrop
        self.skip_layers = set(skip_layers)
        self.final_norm = nn.LayerNorm(dim)

    def forward(self, x, output_hidden_states=False, return_dict=True):
        all_hidden_states = () if output_hidden_states else None
        for i, layer in enumerate(self.layers):
            if output_hidden_states:
                all_hidden_states = all_hidden_states + (x,)
            if self.training and torch.rand([]) < self.layerdrop:
                continue
            if i in self.skip_layers:
                continue
            x = layer(x)
        x = self.final_norm(x)
        if output_hidden_states:
            all_hidden_states = all_hidden_states + (x,)
        if not return_dict:
            return tuple(v for v in [x, all_hidden_states] if v is not None)
        return {"last_hidden_state": x, "hidden_states": all_hidden_states}


@dataclass
class EncoderConfig:
    in_dim: int = 12
    hidden: int = 24
    num_layers: int = 2
    activation: str = "gelu"
    use_layer_norm: bool = True
    residual: bool = True
    pool: str = "mean"
    num_classes: int = 3


ACT2FN = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


class ConfigurableEncoder(nn.Module):
    """A dataclass config drives the architecture; forward accepts 2-D, 3-D or 4-D inputs and
    branches on x.dim() and on config flags."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.inp = nn.Linear(config.in_dim, config.hidden)
        self.layers = nn.ModuleList([
            nn.Sequential(nn.Linear(config.hidden, config.hidden), ACT2FN[config.activation]())
            for _ in range(config.num_layers)])
        self.norm = nn.LayerNorm(config.hidden) if config.use_layer_norm else nn.Identity()
        self.cls = nn.Linear(config.hidden, config.num_classes)

    def forward(self, x):
        if x.dim() == 4:
            x = x.flatten(2).transpose(1, 2)
        elif x.dim() == 2:
            x = x.unsqueeze(1)
        elif x.dim() != 3:
            raise ValueError(f"expected 2-D, 3-D or 4-D input, got {x.dim()}-D")
        h = self.inp(x)
        for layer in self.layers:
            h = h + layer(h) if self.config.residual else layer(h)
        h = self.norm(h)
        if self.config.pool == "mean":
            h = h.mean(dim=1)
        elif self.config.pool == "max":
            h = h.max(dim=1).values
        else:
            h = h[:, 0]
        return self.cls(h)


class ConfigurableEncoderMulti(nn.Module):
    """The same encoder called on 4-D and 2-D inputs in one forward (two shape branches)."""

    def __init__(self):
        super().__init__()
        self.a = ConfigurableEncoder(EncoderConfig(pool="max", activation="silu"))
        self.b = ConfigurableEncoder(EncoderConfig(in_dim=12, residual=False, pool="first",
                                                   use_layer_norm=False))

    def forward(self, image, vec):
        return self.a(image) + self.b(vec)


class HFStyleConfig:
    """A transformers-style config object: plain attributes, some of them optional."""

    def __init__(self, **kwargs):
        self.hidden_size, self.num_labels = 32, 3
        self.output_hidden_states, self.use_return_dict = False, True
        self.__dict__.update(kwargs)


class HFStyleClassifier(nn.Module):
    """Hugging Face style: optional settings read with getattr(config, name, default), an
    optional pooler tested with hasattr, `x if x is not None else config.x` arguments, and a
    dict or a tuple returned."""

    def __init__(self, config, add_pooler=True):
        super().__init__()
        self.config = config
        self.encoder = nn.Sequential(nn.Linear(16, config.hidden_size), nn.GELU(),
                                     nn.Linear(config.hidden_size, config.hidden_size))
        if add_pooler:
            self.pooler = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size),
                                        nn.Tanh())
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, inputs, attention_mask=None, output_hidden_states=None, return_dict=None):
        return_dict = return_dict if return_dict is not None else self.config.use_return_dict
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        hidden = self.encoder(inputs)
        scale = getattr(self.config, "embedding_multiplier", 1.0)
        hidden = hidden * scale
        if attention_mask is not None:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        else:
            pooled = hidden.mean(1)
        if hasattr(self, "pooler"):
            pooled = self.pooler(pooled)
        if getattr(self.config, "classifier_dropout", None) is not None:
            pooled = F.dropout(pooled, self.config.classifier_dropout, self.training)
        logits = self.classifier(pooled)
        if not return_dict:
            return (logits, hidden) if output_hidden_states else (logits,)
        return {"logits": logits, "hidden_states": hidden if output_hidden_states else None}


class HFModelOutput(collections.OrderedDict):
    """In the manner of transformers' ModelOutput: a dataclass that is also an ordered dict of
    its fields that are not None, readable by name, by key and by position."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def __setattr__(self, name, value):
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclass
class SequenceClassifierOutput(HFModelOutput):
    loss: Optional[torch.Tensor] = None
    logits: torch.Tensor = None
    hidden_states: Optional[torch.Tensor] = None


class HFStyleOutputClassifier(HFStyleClassifier):
    """The classifier above returning a ModelOutput, with a loss when labels are given."""

    def forward(self, inputs, attention_mask=None, labels=None):
        out = super().forward(inputs, attention_mask, output_hidden_states=True, return_dict=True)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(out["logits"], labels)
        return SequenceClassifierOutput(loss=loss, logits=out["logits"],
                                        hidden_states=out["hidden_states"])


@dataclass
class BaseModelOutputWithPoolingAndAttentions(HFModelOutput):
    last_hidden_state: torch.Tensor = None
    pooler_output: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple] = None
    attentions: Optional[tuple] = None


class HFSelfAttentionLayer(nn.Module):
    """A BERT layer in Hugging Face's style: returns a tuple whose tail holds the attention
    probabilities when asked for them."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def transpose_for_scores(self, x):
        return x.view(x.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, hidden, mask, output_attentions=False):
        q, k, v = map(self.transpose_for_scores, self.qkv(hidden).chunk(3, dim=-1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask
        probs = scores.softmax(-1)
        ctx = (probs @ v).permute(0, 2, 1, 3).flatten(2)
        out = self.norm(hidden + self.out(ctx))
        return (out, probs) if output_attentions else (out,)


class HFNestedOutputsEncoder(nn.Module):
    """transformers' BertModel + BertForSequenceClassification: all_hidden_states and
    all_attentions grown as tuples, a ModelOutput from the base model read by position and by
    name in the head, `return_dict=False` turning it into a tuple, and the head's own
    ModelOutput with a loss."""

    def __init__(self, dim=16, layers=2):
        super().__init__()
        self.embed = nn.Embedding(40, dim)
        self.layers = nn.ModuleList([HFSelfAttentionLayer(dim) for _ in range(layers)])
        self.pooler = nn.Linear(dim, dim)
        self.classifier = nn.Linear(dim, 3)

    def base(self, ids, attention_mask, output_hidden_states, output_attentions, return_dict):
        ext = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        hidden = self.embed(ids)
        all_hidden_states = () if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states = all_hidden_states + (hidden,)
            layer_outputs = layer(hidden, ext, output_attentions)
            hidden = layer_outputs[0]
            if output_attentions:
                all_attentions = all_attentions + (layer_outputs[1],)
        if output_hidden_states:
            all_hidden_states = all_hidden_states + (hidden,)
        pooled = torch.tanh(self.pooler(hidden[:, 0]))
        if not return_dict:
            return tuple(v for v in [hidden, pooled, all_hidden_states, all_attentions]
                         if v is not None)
        return BaseModelOutputWithPoolingAndAttentions(
            last_hidden_state=hidden, pooler_output=pooled, hidden_states=all_hidden_states,
            attentions=all_attentions)

    def forward(self, ids, attention_mask, labels=None, output_attentions=True, return_dict=True):
        outputs = self.base(ids, attention_mask, True, output_attentions, return_dict)
        logits = self.classifier(outputs[1])
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        if not return_dict:
            output = (logits,) + outputs[2:]
            return ((loss,) + output) if loss is not None else output
        return SequenceClassifierOutput(loss=loss, logits=logits,
                                        hidden_states=outputs.hidden_states)


def hf_nested_inputs(return_dict=True):
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    return Args(torch.randint(0, 40, (2, 6)), mask, labels=torch.tensor([1, 2]),
                return_dict=return_dict)


class EnvDebugMultiTaskLoss(nn.Module):
    """Research code's knobs: a debug flag and a loss weight read from the environment in the
    forward, and the task losses summed with functools.reduce over a lambda."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.heads = nn.ModuleDict({"cls": nn.Linear(32, 4), "reg": nn.Linear(32, 1)})

    def forward(self, x, targets):
        import os
        h = self.trunk(x)
        if os.environ.get("MAGPY_CORPUS_DEBUG_NAN_CHECK", "0") == "1":
            assert not torch.isnan(h).any(), "NaN in trunk"
        weight = float(os.getenv("MAGPY_CORPUS_REG_WEIGHT", "0.5"))
        losses = {"cls": F.cross_entropy(self.heads["cls"](h), targets["cls"]),
                  "reg": weight * F.mse_loss(self.heads["reg"](h).squeeze(-1), targets["reg"])}
        total = functools.reduce(lambda a, b: a + b, losses.values())
        return total, {k: v.detach() for k, v in losses.items()}


def env_debug_inputs():
    return (torch.randn(5, 16), {"cls": torch.randint(0, 4, (5,)), "reg": torch.randn(5)})


@contextlib.contextmanager
def timed(stats, name):
    """Research code's timer: a @contextmanager recording how long a block took."""
    start = time.perf_counter()
    yield
    stats[name] = stats.get(name, 0.0) + (time.perf_counter() - start)


@contextlib.contextmanager
def maybe_frozen(frozen):
    if frozen:
        with torch.no_grad():
            yield
    else:
        yield


class TimedFrozenBackboneHead(nn.Module):
    """A frozen backbone under a @contextmanager that wraps torch.no_grad, blocks timed by
    another, and a temperature property annealed by its setter in forward."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 5)
        self.freeze_backbone = True
        self.stats = {}
        self._temperature = 2.0

    @property
    def temperature(self):
        return self._temperature

    @temperature.setter
    def temperature(self, value):
        self._temperature = max(0.5, float(value))

    def forward(self, x):
        with timed(self.stats, "backbone"), maybe_frozen(self.freeze_backbone):
            h = self.backbone(x)
        with timed(self.stats, "head"):
            logits = self.head(h) / self.temperature
        self.temperature = self.temperature * 0.9
        return logits.log_softmax(-1)


class swapped_dropout:
    """Research code's context manager class: a module's dropout rate changed for a block and
    put back after."""

    def __init__(self, module, p=0.0):
        self.module, self.p = module, p

    def __enter__(self):
        self.prev = self.module.p
        self.module.p = self.p
        return self.module

    def __exit__(self, exc_type, exc, tb):
        self.module.p = self.prev
        return False


class StepCounter:
    """Counts forward passes and how many are open (a context manager kept on the model)."""

    def __init__(self):
        self.calls = 0
        self.open = 0

    def __enter__(self):
        self.calls += 1
        self.open += 1
        return self.calls

    def __exit__(self, *exc):
        self.open -= 1


class SelfEnsembleHead(nn.Module):
    """A clean and a noisy view of the same features, the clean one under a context manager
    class that switches dropout off; every pass counted by another kept on the model."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(32, 4)
        self.counter = StepCounter()

    def forward(self, x):
        with self.counter as step:
            h = self.body(x)
            with swapped_dropout(self.drop, 0.0) as d:
                clean = self.head(d(h))
            noisy = self.head(self.drop(h))
        warm = min(step, 3) / 3.0
        return clean, warm * noisy + (1 - warm) * clean


class LengthPooledEncoder(nn.Module):
    """NLP pooling over per-sample lengths taken to Python with tolist(): a mean of each
    sequence's valid steps, and the longest length used to trim the batch."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(8, 16, batch_first=True)
        self.out = nn.Linear(16, 4)

    def forward(self, x, lengths):
        h, _ = self.rnn(x)
        pooled = []
        for i, n in enumerate(lengths.tolist()):
            pooled.append(h[i, :n].mean(0))
        longest = max(lengths.tolist())
        return self.out(torch.stack(pooled)), h[:, :longest]


class Box:
    __slots__ = ("label", "score", "coords")

    def __init__(self, label, score, coords):
        self.label, self.score, self.coords = label, score, coords


class PerClassBoxPostprocess(nn.Module):
    """Detection post-processing in plain Python: boxes as __slots__ objects, grouped per class
    in a defaultdict(list), a copy of the config dict adjusted per call."""

    def __init__(self, num_classes=3):
        super().__init__()
        self.cls = nn.Linear(16, num_classes)
        self.reg = nn.Linear(16, 4)
        self.config = {"score_scale": 1.0, "max_per_class": 2}

    def forward(self, feats, labels):
        cfg = self.config.copy()
        cfg["score_scale"] = cfg["score_scale"] * 0.5
        scores = self.cls(feats).softmax(-1) * cfg["score_scale"]
        coords = self.reg(feats)
        groups = collections.defaultdict(list)
        for i, label in enumerate(labels):
            groups[label].append(Box(label, scores[i, label], coords[i]))
        out = {}
        for label, boxes in sorted(groups.items()):
            kept = boxes[:cfg["max_per_class"]]
            out[label] = torch.stack([b.coords * b.score for b in kept])
        return out


def hf_style_inputs():
    mask = torch.ones(2, 5)
    mask[1, 3:] = 0
    return Args(torch.randn(2, 5, 16), attention_mask=mask, output_hidden_states=True)


class DebugPrintBlock(nn.Module):
    """Debug prints left in a forward, as people write them: shapes, a mask count and a
    value read with .item(), in f-strings and with sep= (replayed, not a break)."""

    def __init__(self, dim=16):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        print(f"[{type(self).__name__}] input {tuple(x.shape)} {x.dtype}")
        h = self.norm(self.proj(x))
        active = h[h > 0]
        print("active", active.numel(), "of", h.numel(), sep=" ")
        print(f"  mean={h.mean().item():.3f} max|h|={h.abs().max().item():.3f}")
        return x + h


class GreedyCostMatcher:
    """DETR-style matcher object, made in the criterion's forward with the current cost weights
    and called like a function: each prediction takes the target of lowest weighted cost."""

    def __init__(self, cost_class=1.0, cost_bbox=5.0):
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox

    def __call__(self, logits, boxes, target_labels, target_boxes):
        prob = logits.softmax(-1)                               # (B, Q, C)
        cost_class = -prob.gather(-1, target_labels.unsqueeze(1).expand(-1, prob.shape[1], -1))
        cost_bbox = torch.cdist(boxes, target_boxes, p=1)       # (B, Q, T)
        cost = self.cost_bbox * cost_bbox + self.cost_class * cost_class
        return cost.argmin(-1)                                  # (B, Q)


class SetCriterionDict(nn.Module):
    """A detection criterion in the style of DETR's SetCriterion: the losses named in
    `self.losses` are computed by `getattr(self, "loss_" + name)`, collected in a dict, and
    summed with a weight dict in sorted key order (as logging code does for stable output)."""

    def __init__(self, num_classes=5, losses=("labels", "boxes", "cardinality")):
        super().__init__()
        self.num_classes = num_classes
        self.losses = list(losses)
        self.weight_dict = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_card": 0.1}
        self.register_buffer("empty_weight", torch.ones(num_classes + 1))
        self.empty_weight[-1] = 0.1

    def loss_labels(self, out, tgt, idx):
        labels = tgt["labels"].gather(1, idx)
        return {"loss_ce": F.cross_entropy(out["logits"].transpose(1, 2), labels,
                                           self.empty_weight)}

    def loss_boxes(self, out, tgt, idx):
        matched = tgt["boxes"].gather(1, idx.unsqueeze(-1).expand(-1, -1, 4))
        return {"loss_bbox": F.l1_loss(out["boxes"], matched)}

    def loss_cardinality(self, out, tgt, idx):
        card = (out["logits"].argmax(-1) != out["logits"].shape[-1] - 1).sum(1).float()
        return {"loss_card": F.l1_loss(card, torch.full_like(card, tgt["labels"].shape[1]))}

    def forward(self, out, tgt):
        matcher = GreedyCostMatcher(cost_class=1.0, cost_bbox=self.weight_dict["loss_bbox"])
        idx = matcher(out["logits"][..., :-1], out["boxes"], tgt["labels"], tgt["boxes"])
        losses = {}
        for name in self.losses:
            losses.update(getattr(self, "loss_" + name)(out, tgt, idx))
        total = sum(losses[k] * self.weight_dict[k] for k in sorted(losses)
                    if k in self.weight_dict)
        log = {k: v.detach() for k, v in sorted(losses.items())}
        return total, log


def set_criterion_inputs(b=2, q=6, t=3, c=5):
    out = {"logits": torch.randn(b, q, c + 1), "boxes": torch.rand(b, q, 4)}
    tgt = {"labels": torch.randint(0, c, (b, t)), "boxes": torch.rand(b, t, 4)}
    return out, tgt


class ActivationChoiceBlock(nn.Module):
    """A block that picks its activation in forward as a functools.partial (leaky or tanh-GELU,
    from a flag and a slope attribute), and wraps a method of its own in a partial for a
    residual branch."""

    def __init__(self, dim=16, leaky=True, slope=0.1):
        super().__init__()
        self.leaky, self.slope = leaky, slope
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.norm = nn.LayerNorm(dim)

    def branch(self, x, act, scale=1.0):
        return self.fc2(act(self.fc1(self.norm(x)))) * scale

    def forward(self, x):
        act = (functools.partial(F.leaky_relu, negative_slope=self.slope) if self.leaky
               else functools.partial(F.gelu, approximate="tanh"))
        residual = functools.partial(self.branch, act=act)
        for scale in (1.0, 0.5):
            x = x + residual(x, scale=scale)
        return act(x)


class DeprecatedArgEncoder(nn.Module):
    """Library code that keeps an old keyword alive: passing `head_mask` warns on every call
    (warnings.warn names its caller's file and line), then the mask is applied; the logger
    reports the sequence length at INFO, which is enabled."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.log = logging.getLogger("corpus.deprecated_arg_encoder")
        self.log.setLevel(logging.INFO)
        self.log.propagate = False
        if not self.log.handlers:
            self.log.addHandler(logging.NullHandler())

    def forward(self, x, head_mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)).softmax(-1)
        if head_mask is not None:
            warnings.warn("head_mask is deprecated; use attention_mask", FutureWarning)
            att = att * head_mask.view(1, -1, 1, 1)
        self.log.info("encoded a sequence of length %d", t)
        return x + self.out((att @ v).transpose(1, 2).reshape(b, t, d))


def annotated_subsequent_mask(size):
    """The 2018 Annotated Transformer's mask, with numpy, as uint8 (1 above the diagonal)."""
    attn_shape = (1, size, size)
    return torch.from_numpy(np.triu(np.ones(attn_shape), k=1).astype("uint8"))


class AnnotatedDecoderSelfAttention(nn.Module):
    """Pre-bool-mask attention from the Annotated Transformer era: the subsequent mask is made
    with numpy on every call and combined with a uint8 padding mask, and masked_fill takes the
    uint8 mask (torch's C++ code files a deprecation warning on every call, at this line)."""

    def __init__(self, d_model=16, h=2):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])

    def forward(self, x, pad):
        nbatches, t, _ = x.shape
        mask = annotated_subsequent_mask(t) | (1 - pad).unsqueeze(1)
        query, key, value = [lin(z).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
                             for lin, z in zip(self.linears, (x, x, x))]
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(self.d_k)
        scores = scores.masked_fill(mask.unsqueeze(1), -1e9)
        p_attn = F.softmax(scores, dim=-1)
        out = torch.matmul(p_attn, value).transpose(1, 2).contiguous()
        return self.linears[-1](out.view(nbatches, -1, self.h * self.d_k))


def annotated_inputs():
    t = random.choice([5, 7])
    pad = torch.ones(2, t, dtype=torch.uint8)
    pad[1, t - 2:] = 0
    return (torch.randn(2, t, 16), pad)


class PropertyPartialEncoder(nn.Module):
    """Library-style module: properties for device, dtype and sizes
    (`next(self.parameters()).device`), activations and norms stored as functools.partial,
    position ids made on `self.device`, and a `@property` that builds the causal mask."""

    def __init__(self, dim=16, heads=2, max_len=12):
        super().__init__()
        self.heads, self.max_len = heads, max_len
        self.embed = nn.Linear(dim, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.act = functools.partial(F.gelu, approximate="tanh")
        self.norm = functools.partial(F.layer_norm, normalized_shape=(dim,), eps=1e-6)

    @property
    def device(self):
        return next(self.parameters()).device

    @property
    def dtype(self):
        return next(self.parameters()).dtype

    @property
    def head_dim(self):
        return self.qkv.out_features // 3 // self.heads

    def causal_mask(self, t):
        return torch.ones(t, t, device=self.device, dtype=torch.bool).tril()

    def forward(self, x):
        b, t, d = x.shape
        ids = torch.arange(t, device=self.device)
        h = self.act(self.embed(x.to(self.dtype))) + self.pos(ids)
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        att = att.masked_fill(~self.causal_mask(t), float("-inf")).softmax(-1)
        return h + self.out((att @ v).transpose(1, 2).reshape(b, t, d))


class PrintingClassifier(nn.Module):
    """Debug prints inside forward, as people leave them in: shapes (Python values) and a
    loss value via .item() (I/O and a tensor-to-Python conversion: breaks on purpose)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(4))
        self.fc = nn.Linear(8 * 16, 4)
        self.debug = True

    def forward(self, x, y=None):
        feats = self.features(x)
        if self.debug:
            print(f"[debug] features: {tuple(feats.shape)}")
        logits = self.fc(feats.flatten(1))
        if y is None:
            return logits
        loss = F.cross_entropy(logits, y)
        if self.debug:
            print(f"[debug] loss={loss.item():.4f}")
        return logits, loss


logger = logging.getLogger("magpy.coverage.prog")


class LoggingBlock(nn.Module):
    """`logger.debug(...)` / `logger.info(...)` with lazy %-formatting inside forward; the
    logger is at WARNING level, so nothing is emitted."""

    def __init__(self, dim=16):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, x):
        logger.debug("LoggingBlock input %s dtype=%s", tuple(x.shape), x.dtype)
        h = torch.relu(self.fc1(x))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("activation mean %.4f", h.mean().item())
        out = self.fc2(h) + x
        logger.info("LoggingBlock done")
        return out


class LayerNorm2d(nn.LayerNorm):
    """Channels-first LayerNorm the way many ConvNeXt/SegFormer ports write it: the built-in
    module's forward through super() on a permuted tensor."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = super().forward(x)
        return x.permute(0, 3, 1, 2)


class ConvNeXtStage(nn.Module):
    """Depthwise 7x7 conv, LayerNorm2d, inverted bottleneck MLP and layer scale, stacked; a
    subclass adds a stochastic-depth-free residual through super().forward."""

    def __init__(self, dim=16, depth=2):
        super().__init__()
        self.dw = nn.ModuleList([nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
                                 for _ in range(depth)])
        self.norm = nn.ModuleList([LayerNorm2d(dim, eps=1e-6) for _ in range(depth)])
        self.pw1 = nn.ModuleList([nn.Conv2d(dim, 4 * dim, 1) for _ in range(depth)])
        self.pw2 = nn.ModuleList([nn.Conv2d(4 * dim, dim, 1) for _ in range(depth)])
        self.gamma = nn.Parameter(torch.full((depth, dim, 1, 1), 1e-2))

    def forward(self, x):
        for i, (dw, norm, pw1, pw2) in enumerate(zip(self.dw, self.norm, self.pw1, self.pw2)):
            x = x + self.gamma[i] * pw2(F.gelu(pw1(norm(dw(x)))))
        return x


class ConvNeXtStageWithHead(ConvNeXtStage):
    def __init__(self, dim=16, classes=5):
        super().__init__(dim)
        self.head_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = super().forward(x)
        return self.head(self.head_norm(x.mean(dim=(2, 3))))


class SignDependentBranch(nn.Module):
    """Branches on tensor values: `if x.sum() > 0:` and `while norm > max_norm` style clipping
    (data-dependent control flow: breaks on purpose)."""

    def __init__(self, dim=16, max_norm=5.0):
        super().__init__()
        self.pos = nn.Linear(dim, dim)
        self.neg = nn.Linear(dim, dim)
        self.max_norm = max_norm

    def forward(self, x):
        if x.sum() > 0:
            y = self.pos(x)
        else:
            y = self.neg(x)
        norm = y.norm()
        if norm > self.max_norm:
            y = y * (self.max_norm / norm)
        return y


Detections = namedtuple("Detections", ["boxes", "scores", "labels"])


class NamedTupleHead(nn.Module):
    """Returns a namedtuple (and takes one in): field access, `._replace`, `._asdict()`."""

    def __init__(self, in_dim=16, num_classes=4):
        super().__init__()
        self.cls = nn.Linear(in_dim, num_classes)
        self.box = nn.Linear(in_dim, 4)

    def forward(self, feats, prior=None):
        logits = self.cls(feats)
        scores, labels = logits.softmax(-1).max(-1)
        boxes = self.box(feats).sigmoid()
        det = Detections(boxes=boxes, scores=scores, labels=labels)
        if prior is not None:
            det = det._replace(boxes=(det.boxes + prior.boxes) / 2,
                               scores=det.scores * prior.scores)
        summary = {k: v.shape[0] for k, v in det._asdict().items()}
        return det, summary


def namedtuple_inputs():
    return (torch.randn(6, 16), Detections(torch.rand(6, 4), torch.rand(6), torch.zeros(6)))


class KwargsAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, mask=None, scale=None, return_attn=False, **unused):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scale = scale if scale is not None else (d // self.heads) ** -0.5
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * scale
        if mask is not None:
            dots = dots.masked_fill(~mask[:, None, None, :], -torch.finfo(dots.dtype).max)
        attn = dots.softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", attn, v).transpose(1, 2).reshape(b, n, d)
        out = self.out(out)
        return (out, attn) if return_attn else out


class KwargsBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = KwargsAttention(dim, heads)

    def forward(self, x, **kwargs):
        return x + self.attn(self.norm(x), **kwargs)


class KwargsModel(nn.Module):
    """`**kwargs` forwarded through blocks to the attention (x-transformers style), extra
    keyword arguments ignored by the leaf."""

    def __init__(self, dim=24, heads=3, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([KwargsBlock(dim, heads) for _ in range(depth)])

    def forward(self, x, attention_mask=None, **kwargs):
        mask = attention_mask.bool() if attention_mask is not None else None
        for block in self.blocks:
            x = block(x, mask=mask, **kwargs)
        return x


def kwargs_inputs():
    mask = torch.ones(2, 7)
    mask[0, 5:] = 0
    return Args(torch.randn(2, 7, 24), attention_mask=mask, scale=0.3, layer_id=None)


def get_activation(name="relu", **kwargs):
    if name == "leaky_relu":
        slope = kwargs.get("negative_slope", 0.01)
        return lambda x: F.leaky_relu(x, slope)
    if name == "swish":
        beta = kwargs.get("beta", 1.0)

        def swish(x):
            return x * torch.sigmoid(beta * x)
        return swish
    return getattr(F, name)


def make_norm_fn(eps=1e-5, affine_scale=1.0):
    def norm(x, dims=(-1,), shift=0.0):
        mean = x.mean(dim=dims, keepdim=True)
        var = x.var(dim=dims, keepdim=True, unbiased=False)
        return affine_scale * (x - mean) / torch.sqrt(var + eps) + shift
    return norm


class ClosureMLP(nn.Module):
    """Activations and normalisation as closures from helper functions with default args; a
    closure defined inside forward that reads self and a local."""

    def __init__(self, dim=16, acts=("relu", "leaky_relu", "swish")):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(dim, dim) for _ in acts])
        self.acts = [get_activation(a, negative_slope=0.2, beta=1.5) for a in acts]
        self.norm = make_norm_fn(eps=1e-6)
        self.proj = None

    def forward(self, x, residual_scale=0.5):
        def shortcut(t):
            return t if self.proj is None else self.proj(t)

        for layer, act in zip(self.layers, self.acts):
            x = shortcut(x) * residual_scale + act(layer(self.norm(x)))
        return self.norm(x, shift=0.1)


class TryExceptUnpack(nn.Module):
    """`try: b, c, h, w = x.shape` / `except ValueError:` for unbatched inputs."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x):
        try:
            b, c, h, w = x.shape
            unbatched = False
        except ValueError:
            x = x.unsqueeze(0)
            b, c, h, w = x.shape
            unbatched = True
        y = self.conv(x).view(b, -1, h * w).mean(-1)
        return y.squeeze(0) if unbatched else y


class TryExceptViewFallback(nn.Module):
    """`try: x.view(...)` / `except RuntimeError: x.reshape(...)` on a non-contiguous tensor:
    the exception comes from inside torch."""

    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim * 5, 4)

    def forward(self, x):
        x = x.transpose(1, 2)
        try:
            flat = x.view(x.size(0), -1)
        except RuntimeError:
            flat = x.reshape(x.size(0), -1)
        return self.fc(flat)


class BYOL(nn.Module):
    """BYOL loss: online network with predictor, target network under `with torch.no_grad():`
    and an EMA update of the target weights at the end of forward (state: separate worlds)."""

    def __init__(self, dim=16, proj=8, tau=0.99):
        super().__init__()
        self.tau = tau
        self.online = nn.Sequential(nn.Linear(dim, 32), nn.BatchNorm1d(32), nn.ReLU(),
                                    nn.Linear(32, proj))
        self.predictor = nn.Sequential(nn.Linear(proj, 16), nn.ReLU(), nn.Linear(16, proj))
        self.target = copy.deepcopy(self.online)
        for p in self.target.parameters():
            p.requires_grad = False

    @staticmethod
    def loss_fn(x, y):
        x = F.normalize(x, dim=-1, p=2)
        y = F.normalize(y, dim=-1, p=2)
        return 2 - 2 * (x * y).sum(dim=-1)

    @torch.no_grad()
    def update_moving_average(self):
        for online_p, target_p in zip(self.online.parameters(), self.target.parameters()):
            target_p.data = target_p.data * self.tau + (1 - self.tau) * online_p.data

    def forward(self, view_one, view_two):
        online_one = self.predictor(self.online(view_one))
        online_two = self.predictor(self.online(view_two))
        with torch.no_grad():
            target_one = self.target(view_one).detach()
            target_two = self.target(view_two).detach()
        loss = self.loss_fn(online_one, target_two) + self.loss_fn(online_two, target_one)
        self.update_moving_average()
        return loss.mean()


class MoCo(nn.Module):
    """MoCo v1/v2: momentum update of the key encoder and the dequeue/enqueue of a queue buffer
    at `ptr = int(self.queue_ptr)` (a number read from tensor data, used in a slice)."""

    def __init__(self, dim=8, in_dim=16, K=32, m=0.999, T=0.07):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = nn.Sequential(nn.Linear(in_dim, 32), nn.ReLU(), nn.Linear(32, dim))
        self.encoder_k = nn.Sequential(nn.Linear(in_dim, 32), nn.ReLU(), nn.Linear(32, dim))
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        self.queue[:, ptr:ptr + batch_size] = keys.T
        ptr = (ptr + batch_size) % self.K
        self.queue_ptr[0] = ptr

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            k = F.normalize(self.encoder_k(im_k), dim=1)
        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue.clone().detach()])
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return F.cross_entropy(logits, labels), logits


class Chomp1d(nn.Module):
    def __init__(self, chomp_size):
        super().__init__()
        self.chomp_size = chomp_size

    def forward(self, x):
        return x[:, :, :-self.chomp_size].contiguous()


class TemporalBlock(nn.Module):
    def __init__(self, n_inputs, n_outputs, kernel_size, dilation, dropout=0.2):
        super().__init__()
        padding = (kernel_size - 1) * dilation
        self.net = nn.Sequential(
            nn.Conv1d(n_inputs, n_outputs, kernel_size, padding=padding, dilation=dilation),
            Chomp1d(padding), nn.ReLU(), nn.Dropout(dropout),
            nn.Conv1d(n_outputs, n_outputs, kernel_size, padding=padding, dilation=dilation),
            Chomp1d(padding), nn.ReLU(), nn.Dropout(dropout))
        self.downsample = nn.Conv1d(n_inputs, n_outputs, 1) if n_inputs != n_outputs else None

    def forward(self, x):
        out = self.net(x)
        res = x if self.downsample is None else self.downsample(x)
        return F.relu(out + res)


class TCN(nn.Module):
    """locuslab TCN: dilations 2**i built with enumerate over the channel list, causal padding
    trimmed by Chomp1d; training mode (dropout drawn with the runner's seed)."""

    def __init__(self, num_inputs=4, num_channels=(8, 8, 12), kernel_size=3):
        super().__init__()
        layers = []
        for i, out_ch in enumerate(num_channels):
            in_ch = num_inputs if i == 0 else num_channels[i - 1]
            layers += [TemporalBlock(in_ch, out_ch, kernel_size, dilation=2 ** i)]
        self.network = nn.Sequential(*layers)
        self.linear = nn.Linear(num_channels[-1], 2)

    def forward(self, x):
        return self.linear(self.network(x)[:, :, -1])


class GCN(nn.Module):
    """Kipf & Welling GCN: self-loops added and the adjacency normalised (D^-1/2 A D^-1/2)
    inside forward, inf degrees fixed with masked_fill, dropout between layers."""

    def __init__(self, nfeat=8, nhid=16, nclass=3, dropout=0.5):
        super().__init__()
        self.w1 = nn.Linear(nfeat, nhid)
        self.w2 = nn.Linear(nhid, nclass)
        self.dropout = dropout

    @staticmethod
    def normalize_adj(adj, add_self_loops=True):
        if add_self_loops:
            adj = adj + torch.eye(adj.size(-1), device=adj.device)
        deg = adj.sum(-1)
        deg_inv_sqrt = deg.pow(-0.5)
        deg_inv_sqrt = deg_inv_sqrt.masked_fill(torch.isinf(deg_inv_sqrt), 0.0)
        return deg_inv_sqrt.unsqueeze(-1) * adj * deg_inv_sqrt.unsqueeze(-2)

    def forward(self, x, adj):
        a = self.normalize_adj(adj)
        x = F.relu(a @ self.w1(x))
        x = F.dropout(x, self.dropout, training=self.training)
        return F.log_softmax(a @ self.w2(x), dim=-1)


def gcn_inputs():
    adj = (torch.rand(2, 10, 10) > 0.7).float()
    adj = ((adj + adj.transpose(1, 2)) > 0).float()
    return (torch.randn(2, 10, 8), adj)


class IncrementalDecoder(nn.Module):
    """Prefill with an empty cache dict created inside forward, then fixed decode steps that
    each read and extend it; the cache is returned."""

    def __init__(self, dim=32, steps=3):
        super().__init__()
        self.attn = KVCacheAttention(dim)
        self.norm = nn.LayerNorm(dim)
        self.steps = steps

    def forward(self, prompt):
        cache = {}
        out = self.norm(prompt + self.attn(prompt, cache))
        outs = [out]
        x = out[:, -1:]
        for _ in range(self.steps):
            x = self.norm(x + self.attn(x, cache))
            outs.append(x)
        return torch.cat(outs, dim=1), cache


# --- library idioms: module hooks, weight_norm, torch's own transformer, enums, lambdas ---


class FeatureExtractor(nn.Module):
    """Grad-CAM / perceptual-loss style: forward hooks on chosen layers store their outputs in
    a dict, which forward then reads back in a fixed order."""

    def __init__(self, layers=("1", "4", "7")):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.features = {}
        for name, module in self.backbone.named_children():
            if name in layers:
                module.register_forward_hook(self._save(name))

    def _save(self, name):
        def hook(module, inputs, output):
            self.features[name] = output
        return hook

    def forward(self, x, target):
        self.backbone(x)
        with torch.no_grad():
            self.backbone(target)
        target_feats = dict(self.features)
        self.backbone(x)
        loss = 0.0
        for name in sorted(self.features):
            loss = loss + F.mse_loss(self.features[name], target_feats[name])
        return loss


class WNResBlock(nn.Module):
    """HiFi-GAN style residual block: weight-normalised dilated Conv1d (a forward pre-hook
    recomputes each weight from weight_g and weight_v on every call)."""

    def __init__(self, channels=8, dilations=(1, 3, 5)):
        super().__init__()
        wn = nn.utils.weight_norm
        self.convs1 = nn.ModuleList(wn(nn.Conv1d(channels, channels, 3, dilation=d, padding=d))
                                    for d in dilations)
        self.convs2 = nn.ModuleList(wn(nn.Conv1d(channels, channels, 3, padding=1))
                                    for _ in dilations)

    def forward(self, x):
        for c1, c2 in zip(self.convs1, self.convs2):
            xt = F.leaky_relu(x, 0.1)
            xt = c2(F.leaky_relu(c1(xt), 0.1))
            x = xt + x
        return x


class TorchEncoderClassifier(nn.Module):
    """torch.nn.TransformerEncoder with a key padding mask built from lengths, mean-pooled over
    the real tokens (torch's own modules: fast-path checks, has_torch_function, generators)."""

    def __init__(self, vocab=40, dim=16, heads=2, layers=2, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens, lengths):
        pad = torch.arange(tokens.shape[1])[None, :] >= lengths[:, None]
        h = self.encoder(self.embed(tokens), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


class Pooling(enum.Enum):
    MEAN = "mean"
    MAX = "max"
    CLS = "cls"


_UNSET = object()


class EnumPooledEncoder(nn.Module):
    """Config as an Enum (`if self.pooling is Pooling.MAX`) and a sentinel default argument."""

    def __init__(self, pooling=Pooling.MEAN, dim=16):
        super().__init__()
        self.pooling = pooling
        self.proj = nn.Linear(dim, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x, temperature=_UNSET):
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), self.proj(x)], dim=1)
        if self.pooling is Pooling.CLS:
            out = x[:, 0]
        elif self.pooling == Pooling.MAX:
            out = x.max(dim=1).values
        else:
            out = x.mean(dim=1)
        if temperature is _UNSET:
            return out
        return out / temperature


class MultiScaleLambdaHeads(nn.Module):
    """Heads built as lambdas binding loop variables through default arguments, applied over an
    itertools.product grid of scales and flips; local imports inside forward."""

    def __init__(self, dim=8):
        super().__init__()
        self.conv = nn.Conv2d(3, dim, 3, padding=1)
        self.scales = (1.0, 0.5)

    def forward(self, x):
        import itertools
        import functools
        import operator
        heads = [lambda t, s=s, f=f: (t.flip(-1) if f else t) * s
                 for s, f in itertools.product(self.scales, (False, True))]
        feats = self.conv(x)
        n = functools.reduce(operator.mul, feats.shape[2:], 1)
        outs = [h(feats).flatten(2).sum(-1) / n for h in heads]
        return torch.stack(outs, dim=1)



@functools.lru_cache(maxsize=None)
def sinusoidal_table(n, dim):
    """A positional table cached per (length, width), as fairseq and older transformers do."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n, dim)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)
    return table


class BartEncoderLayer(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x, key_padding_mask):
        a, _ = self.attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)
        x = self.norm1(x + a)
        return self.norm2(x + self.ff(x))


class BartLayerDropEncoder(nn.Module):
    """BART/Wav2Vec2-style encoder of older Hugging Face releases: a random.uniform draw per
    layer for LayerDrop (used only while training), a cached sinusoidal table, a mask from
    lengths, and a dict of outputs built with keywords."""

    def __init__(self, vocab=40, dim=16, layers=3, layerdrop=0.2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([BartEncoderLayer(dim) for _ in range(layers)])
        self.layerdrop = layerdrop
        self.dim = dim

    def forward(self, ids, lengths, output_hidden_states=True):
        T = ids.shape[1]
        x = self.embed(ids) * math.sqrt(self.dim) + sinusoidal_table(T, self.dim)
        pad = torch.arange(T)[None, :] >= lengths[:, None]
        hidden = (x,) if output_hidden_states else None
        for layer in self.layers:
            dropout_probability = random.uniform(0, 1)
            if self.training and dropout_probability < self.layerdrop:
                continue
            x = layer(x, pad)
            if output_hidden_states:
                hidden = hidden + (x,)
        out = dict(last_hidden_state=x)
        out.update(hidden_states=hidden, pooled=x.masked_fill(pad[..., None], 0).sum(1))
        return out


class GradReverse(torch.autograd.Function):
    """Gradient reversal (DANN): identity forward, negated and scaled gradient."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.neg() * ctx.alpha, None


class DANN(nn.Module):
    """Domain-adversarial training: the reversal strength follows a schedule of a Python step
    counter kept on the module (2 / (1 + exp(-10 p)) - 1, p = min(1, step / total))."""

    def __init__(self, dim=16, classes=4, total_steps=100):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU())
        self.classifier = nn.Linear(dim, classes)
        self.domain = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 2))
        self.total_steps = total_steps
        self.step = 0

    def forward(self, x, labels, domains):
        self.step += 1
        p = min(1.0, self.step / self.total_steps)
        alpha = 2.0 / (1.0 + math.exp(-10 * p)) - 1
        f = self.features(x)
        cls_loss = F.cross_entropy(self.classifier(f), labels)
        dom_loss = F.cross_entropy(self.domain(GradReverse.apply(f, alpha)), domains)
        return {"loss": cls_loss + dom_loss, "alpha": alpha, "cls": cls_loss.detach()}


def dann_inputs():
    return (torch.randn(6, 16), torch.randint(0, 4, (6,)), torch.randint(0, 2, (6,)))


class RankedPyramidFusion(nn.Module):
    """FPN-style fusion with Python-side ordering: stages run through a slice of a ModuleList,
    features sorted by resolution with a key function, the finest chosen with max(key=...),
    levels ordered by a name table with list.sort(key=...), and numpy on shapes."""

    LEVEL_ORDER = {"p5": 0, "p4": 1, "p3": 2, "p2": 3}

    def __init__(self, ch=8):
        super().__init__()
        self.stem = nn.Conv2d(3, ch, 3, padding=1)
        self.stages = nn.ModuleList([nn.Conv2d(ch, ch, 3, stride=2, padding=1) for _ in range(4)])
        self.lateral = nn.ModuleDict({f"p{i + 2}": nn.Conv2d(ch, ch, 1) for i in range(3)})
        self.head = nn.Sequential(nn.Conv2d(ch, ch, 3, padding=1), nn.ReLU(), nn.Conv2d(ch, 1, 1))

    def forward(self, x):
        import numpy as np
        x = self.stem(x)
        feats = {}
        for i, stage in enumerate(self.stages[:-1], start=2):
            x = stage(x)
            feats[f"p{i}"] = self.lateral[f"p{i}"](x)
        coarse_first = sorted(feats.items(), key=lambda kv: kv[1].shape[-1])
        top = coarse_first[0][1]
        for name, f in coarse_first[1:]:
            top = f + F.interpolate(top, size=f.shape[-2:], mode="nearest")
        finest = max(feats.values(), key=lambda t: t.shape[-2] * t.shape[-1])
        names = list(feats)
        names.sort(key=lambda n: self.LEVEL_ORDER[n])
        per_level = {n: float(np.prod(feats[n].shape[1:])) for n in names}
        heat = self.head[:2](top + finest)
        return self.head[2:](heat), per_level, names


class WarmupEMAHead(nn.Module):
    """A model that blends a shadow (EMA) head in with a warm-up schedule on a Python counter:
    decay = min(decay, (1 + n) / (10 + n)), as timm's ModelEmaV2 and mean-teacher code do."""

    def __init__(self, dim=16, decay=0.999):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, dim), nn.GELU())
        self.head = nn.Linear(dim, 4)
        self.shadow = nn.Linear(dim, 4)
        self.decay = decay
        self.num_updates = 0

    def forward(self, x):
        self.num_updates += 1
        d = min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        h = self.body(x)
        with torch.no_grad():
            for s, p in zip(self.shadow.parameters(), self.head.parameters()):
                s.mul_(d).add_(p.detach(), alpha=1 - d)
        return self.head(h) * (1 - d) + self.shadow(h) * d, round(d, 6)


class CallbackStep(nn.Module):
    """A training-style step that takes its loss and its feature transform as callbacks, made
    by small factories at every call (as trainers do with `loss_fn=make_loss(cfg)`): each call
    passes new lambda objects with the same code."""

    def __init__(self, dim=12, classes=5):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim, 24), nn.SiLU(), nn.Linear(24, classes))

    def forward(self, x, target, loss_fn, transform=None):
        if transform is not None:
            x = transform(x)
        logits = self.encoder(x)
        return loss_fn(logits, target), logits.argmax(-1)


def make_smoothed_loss(smoothing):
    return lambda logits, target: F.cross_entropy(logits, target, label_smoothing=smoothing)


def make_jitter(scale, shift):
    def jitter(x):
        return x * scale + shift
    return jitter


def callback_step_inputs():
    x = torch.randn(6, 12)
    return (x, torch.arange(6) % 5, make_smoothed_loss(0.1), make_jitter(1.5, x.mean(0)))


class SACActor(nn.Module):
    """A soft actor-critic policy: a Normal over actions from the state, a reparameterised
    sample squashed with tanh, and its log-probability with the tanh correction (the form most
    SAC implementations on GitHub use)."""

    def __init__(self, obs_dim=11, act_dim=3, hidden=64, log_std_min=-20, log_std_max=2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, act_dim)
        self.log_std = nn.Linear(hidden, act_dim)
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def forward(self, obs, deterministic=False):
        h = self.net(obs)
        mu = self.mu(h)
        log_std = torch.clamp(self.log_std(h), self.log_std_min, self.log_std_max)
        dist = torch.distributions.Normal(mu, log_std.exp())
        u = mu if deterministic else dist.rsample()
        log_prob = dist.log_prob(u).sum(dim=-1)
        log_prob -= (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(dim=-1)
        return torch.tanh(u), log_prob


class PPOActorCritic(nn.Module):
    """A PPO / A2C actor-critic: a Categorical over discrete actions from the policy logits, the
    sampled (or replayed) action, its log-probability, the entropy bonus and the value estimate
    (the shape of CleanRL-style agents' get_action_and_value). entropy() reads `probs`, a
    lazy_property of the distribution."""

    def __init__(self, obs_dim=8, n_actions=4, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(),
                                  nn.Linear(hidden, hidden), nn.Tanh())
        self.actor = nn.Linear(hidden, n_actions)
        self.critic = nn.Linear(hidden, 1)

    def forward(self, obs, action=None):
        h = self.body(obs)
        dist = torch.distributions.Categorical(logits=self.actor(h))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(h).squeeze(-1)


class BoxList:
    """A detectron2-style box container made per call; its derived values are
    functools.cached_property, computed on first read and kept on the instance."""

    def __init__(self, boxes):
        self.boxes = boxes

    @functools.cached_property
    def widths(self):
        return (self.boxes[:, 2] - self.boxes[:, 0]).clamp(min=0)

    @functools.cached_property
    def heights(self):
        return (self.boxes[:, 3] - self.boxes[:, 1]).clamp(min=0)

    @functools.cached_property
    def area(self):
        return self.widths * self.heights

    @functools.cached_property
    def centers(self):
        return torch.stack([self.boxes[:, 0] + 0.5 * self.widths,
                            self.boxes[:, 1] + 0.5 * self.heights], dim=-1)


class DIoUBoxLoss(nn.Module):
    """A box-regression head and its distance-IoU loss against matched targets: deltas
    decoded against anchors, both box sets wrapped in BoxList (cached_property areas and
    centers), IoU and the normalised centre distance."""

    def __init__(self, dim=32):
        super().__init__()
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 4))
        self.weights = (10.0, 10.0, 5.0, 5.0)

    def decode(self, anchors, deltas):
        a = BoxList(anchors)
        wx, wy, ww, wh = self.weights
        cx = a.centers[:, 0] + deltas[:, 0] / wx * a.widths
        cy = a.centers[:, 1] + deltas[:, 1] / wy * a.heights
        w = a.widths * torch.exp(deltas[:, 2] / ww).clamp(max=math.exp(4.0))
        h = a.heights * torch.exp(deltas[:, 3] / wh).clamp(max=math.exp(4.0))
        return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)

    def forward(self, feats, anchors, targets):
        pred = BoxList(self.decode(anchors, self.head(feats)))
        gt = BoxList(targets)
        lt = torch.max(pred.boxes[:, :2], gt.boxes[:, :2])
        rb = torch.min(pred.boxes[:, 2:], gt.boxes[:, 2:])
        inter = (rb - lt).clamp(min=0).prod(-1)
        iou = inter / (pred.area + gt.area - inter + 1e-7)
        outer = torch.max(pred.boxes[:, 2:], gt.boxes[:, 2:]) - \
            torch.min(pred.boxes[:, :2], gt.boxes[:, :2])
        dist = ((pred.centers - gt.centers) ** 2).sum(-1) / ((outer ** 2).sum(-1) + 1e-7)
        return (1 - iou + dist).mean(), {"iou": iou.detach().mean(), "n": len(pred.boxes)}


def diou_inputs():
    xy = torch.rand(12, 2) * 50
    anchors = torch.cat([xy, xy + 8 + torch.rand(12, 2) * 20], dim=-1)
    return torch.randn(12, 32), anchors, anchors + torch.randn(12, 4)


class DistributionVAE(nn.Module):
    """A VAE written with torch.distributions: posterior and prior as Normal objects, the KL
    term from kl_divergence, a reparameterised sample, and a Bernoulli likelihood."""

    def __init__(self, dim=64, latent=8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 2 * latent))
        self.dec = nn.Sequential(nn.Linear(latent, 32), nn.ReLU(), nn.Linear(32, dim))

    def forward(self, x):
        mu, log_var = self.enc(x).chunk(2, dim=-1)
        q = torch.distributions.Normal(mu, torch.exp(0.5 * log_var))
        p = torch.distributions.Normal(torch.zeros_like(mu), torch.ones_like(mu))
        kl = torch.distributions.kl_divergence(q, p).sum(-1)
        z = q.rsample()
        logits = self.dec(z)
        recon = F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)
        return (recon + kl).mean(), {"recon": recon.mean(), "kl": kl.mean()}


# -- bookkeeping with the standard library: Counter, itertools, operator, dataclasses --------

@dataclasses.dataclass
class FusedHeadConfig:
    hidden: int = 24
    head_sizes: tuple = (8, 8, 4, 4)
    head_names: tuple = ("cls", "box", "iou", "ctr")
    temperature: float = 1.0


_UNSET_TEMPERATURE = object()


class FusedMultiHead(nn.Module):
    """One fused projection split into named heads at offsets from itertools.accumulate; a
    per-call config from dataclasses.replace; a sentinel made per call for an optional
    argument; heads ranked by size with operator.itemgetter; a Counter of the head kinds; pairs
    of neighbouring levels from itertools.pairwise (detection-neck style code)."""

    def __init__(self, config=FusedHeadConfig()):
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config.hidden, sum(config.head_sizes))
        self.mix = nn.ModuleList([nn.Linear(config.hidden, config.hidden) for _ in range(3)])

    def forward(self, levels, temperature=_UNSET_TEMPERATURE):
        cfg = dataclasses.replace(self.config, temperature=0.5) if self.training else self.config
        missing = object()
        t = cfg.temperature if temperature is _UNSET_TEMPERATURE else temperature
        fused = [m(a) + b.mean(1, keepdim=True) for m, (a, b) in zip(self.mix, itertools.pairwise(levels))]
        h = self.proj(sum(fused) / len(fused))
        offsets = [0] + list(itertools.accumulate(cfg.head_sizes))
        heads = {name: h[..., lo:hi] / t
                 for name, lo, hi in zip(cfg.head_names, offsets, offsets[1:])}
        kinds = collections.Counter(name[0] for name in cfg.head_names)
        widest = max(((n, s) for n, s in zip(cfg.head_names, cfg.head_sizes)),
                     key=operator.itemgetter(1))[0]
        ranked = [n for n, _ in sorted(zip(cfg.head_names, cfg.head_sizes),
                                       key=operator.itemgetter(1), reverse=True)]
        extra = heads.get("mask", missing)
        out = {"logits": heads[widest], "ranked": [heads[n] for n in ranked],
               "repeated_kinds": sum(1 for _, c in kinds.items() if c > 1)}
        if extra is not missing:
            out["mask"] = extra
        return out


def fused_head_inputs():
    return ([torch.randn(2, 6, 24) for _ in range(4)],)


class AliasedConfig:
    """Hugging Face's PretrainedConfig: aliases resolved by a __getattribute__ of its own."""

    attribute_map = {"n_embd": "hidden_size", "n_labels": "num_labels"}

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __init__(self):
        self.hidden_size = 32
        self.num_labels = 5
        self.output_hidden_states = False
        self.return_dict = True
        self.torchscript = False
        self.pad_token_id = 0

    @property
    def use_return_dict(self):
        return self.return_dict and not self.torchscript


def deprecate_kwarg(old, new):
    """A forward decorator in the style of transformers' deprecate_kwarg."""

    def wrap(func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return wrapped

    return wrap


class HFSequenceClassifier(nn.Module):
    """A *ForSequenceClassification head: config reads through __getattribute__, a decorated
    encoder forward, the loss module made in forward, a dict output."""

    class Encoder(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True)

        @deprecate_kwarg("attention_mask", "mask")
        def forward(self, x, mask=None):
            return self.layer(x, src_key_padding_mask=mask)

    def __init__(self):
        super().__init__()
        self.config = AliasedConfig()
        self.embed = nn.Embedding(50, self.config.n_embd)
        self.encoder = self.Encoder(self.config.n_embd)
        self.classifier = nn.Linear(self.config.n_embd, self.config.n_labels)

    def forward(self, input_ids, labels=None, return_dict=None, output_hidden_states=None):
        return_dict = return_dict if return_dict is not None else self.config.use_return_dict
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        mask = input_ids == self.config.pad_token_id
        hidden = self.encoder(self.embed(input_ids), attention_mask=mask)
        logits = self.classifier(hidden[:, 0])
        loss = None
        if labels is not None:
            loss_fct = nn.CrossEntropyLoss()
            loss = loss_fct(logits.view(-1, self.config.n_labels), labels.view(-1))
        if not return_dict:
            return (loss, logits)
        out = {"loss": loss, "logits": logits}
        if output_hidden_states:
            out["hidden_states"] = hidden
        return out


def hf_classifier_inputs():
    ids = torch.randint(1, 50, (3, 7))
    ids[0, 5:] = 0
    return Args(ids, labels=torch.randint(0, 5, (3,)))


class ScheduledTrainStep(nn.Module):
    """A whole training step: forward, backward, gradient clipping over the parameters
    generator, optimizer and scheduler steps, the learning rate logged after them."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        self.lrs = []

    def forward(self, x, y):
        self.opt.zero_grad()
        loss = F.mse_loss(self.net(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
        self.opt.step()
        self.sched.step()
        self.lrs.append(self.opt.param_groups[0]["lr"])
        return loss.detach(), norm


def programs():
    return [
        Program("prog/causal_transformer_block", CausalTransformerBlock,
                lambda: (torch.randn(1, 16, 32),), quick=True,
                note="mask from torch.triu inside forward"),
        Program("prog/gru_cell_loop", GRULoop,
                lambda: Args(torch.randn(2, 10, 8)), quick=True,
                note="10 time steps unrolled; h=None default"),
        Program("prog/vae_reparameterise", VAE,
                lambda: (torch.rand(4, 64),), quick=True,
                note="torch.randn_like inside; seeded identically for eager and magpy"),

        # transformers: caches, masks, attention variants
        Program("prog/kv_cache_dict_step", KVCacheAttention,
                lambda: Args(torch.randn(1, 2, 32),
                             cache={"k": torch.randn(1, 4, 6, 8), "v": torch.randn(1, 4, 6, 8)}),
                quick=True, note="cache dict passed in, extended with torch.cat and written back"),
        Program("prog/kv_cache_prefill_then_decode", IncrementalDecoder,
                lambda: (torch.randn(2, 4, 32),),
                note="empty cache dict made in forward; prefill + 3 decode steps; cache returned"),
        Program("prog/gpt2_past_key_values", TinyGPT2, gpt2_past_inputs, quick=True,
                note="list of (k, v) per layer passed in; presents tuple built with +"),
        Program("prog/gpt2_greedy_generate", GreedyGenerator,
                lambda: (torch.randint(0, 50, (2, 3)),),
                note="@torch.no_grad() forward; 4 greedy steps feeding presents back"),
        Program("prog/nanogpt_topk_sample", NanoGPTSampler,
                lambda: (torch.randint(0, 40, (2, 6)),), quick=True,
                note="crop to block_size, top-k filter by boolean index_put, torch.multinomial"),
        Program("prog/encoder_key_padding_mask", PaddedEncoder, padded_tokens, quick=True,
                note="nn.TransformerEncoderLayer with src_key_padding_mask; masked mean pool"),
        Program("prog/decoder_cross_attention", CrossAttentionDecoderLayer,
                cross_attention_inputs,
                note="nn.MultiheadAttention self (causal) + cross with key_padding_mask"),
        Program("prog/t5_relative_position_bias", T5Attention, t5_inputs, quick=True,
                note="bucketed relative positions (log, where) computed in forward"),
        Program("prog/llama_rotary_kv_cache", LlamaBlock, llama_inputs, quick=True,
                note="RoPE from torch.outer; preallocated cache dict written in place at "
                     "start_pos=3"),
        Program("prog/alibi_attention", AlibiAttention, lambda: (torch.randn(2, 10, 48),),
                note="ALiBi slopes from a recursive Python helper (6 heads: not a power of 2)"),
        Program("prog/swin_shifted_window", SwinBlock,
                lambda: Args(torch.randn(1, 64, 32), (8, 8)),
                note="torch.roll, window partition, shift mask built with a loop over slices"),

        # recurrent networks and decoding
        Program("prog/lstm_stacked_cells", StackedLSTM, lambda: (torch.randn(2, 6, 8),),
                quick=True, note="2 LSTMCell layers x 6 steps; lists of h/c; x.unbind(1) loop"),
        Program("prog/birnn_tagger", BiRNNTagger, lambda: (torch.randint(0, 30, (2, 7)),),
                note="forward and reversed(range(t)) RNNCell loops; list comprehension over zip"),
        Program("prog/seq2seq_greedy_decode", Seq2SeqAttn,
                lambda: (torch.randint(0, 30, (2, 5)),), quick=True,
                note="GRU encoder + Bahdanau attention decoder; 6 greedy steps with topk"),
        Program("prog/seq2seq_teacher_forcing", Seq2SeqAttn,
                lambda: Args(torch.randint(0, 30, (2, 5)), torch.randint(0, 25, (2, 4)),
                             teacher_forcing=True),
                note="target given: the step count comes from target.size(1)"),
        Program("prog/early_stop_greedy_decode", EarlyStopGreedyDecoder,
                lambda: (torch.randn(3, 16),),
                note="`if finished.all(): break` (data-dependent branch, on purpose)"),

        # generative models
        Program("prog/dcgan_generator", DCGANGenerator, lambda: (torch.randn(2, 16),),
                quick=True, note="z.view(b, nz, 1, 1) when 2-D; ConvTranspose2d stack"),
        Program("prog/patchgan_features", PatchGANDiscriminator,
                lambda: Args(torch.randn(1, 3, 32, 32), return_features=True),
                note="intermediate features collected in a list and sliced"),
        Program("prog/gan_hinge_step_logging", GANStep,
                lambda: (torch.randn(2, 3, 32, 32), torch.randn(2, 16), []),
                train=True, separate_worlds=True,
                note="dict of losses; history list passed in gets {k: v.item()} (breaks)"),
        Program("prog/wgan_gradient_penalty", WGANGPCritic,
                lambda: (torch.randn(4, 16), torch.randn(4, 16)), quick=True,
                note="torch.autograd.grad(create_graph=True) inside forward; torch.rand alpha"),
        Program("prog/stylegan_mixing", StyleGenerator,
                lambda: Args(torch.randn(2, 16), torch.randn(2, 16), crossover=1,
                             truncation=0.7, w_avg=torch.zeros(16)),
                note="list comprehension with `if z is not None`; AdaIN; per-layer noise"),
        Program("prog/conv_vae_loss", ConvVAE,
                lambda: Args(torch.rand(2, 1, 16, 16), kld_weight=0.5), quick=True,
                note="randn_like; loss_function(**kwargs) with kwargs.get; dict of losses"),
        Program("prog/cvae_onehot", CVAE, lambda: (torch.randn(4, 32), torch.randint(0, 5, (4,))),
                note="F.one_hot condition; 2 samples drawn in a loop and averaged"),
        Program("prog/vq_vae_quantizer", VectorQuantizer, lambda: (torch.randn(2, 8, 4, 4),),
                note="argmin codebook lookup, scatter_ one-hot, straight-through estimator"),
        Program("prog/ddpm_training_loss", GaussianDiffusion,
                lambda: Args(torch.rand(2, 1, 8, 8), loss_type="huber"), train=True,
                note="torch.randint timesteps, extract() gather, randn_like noise"),
        Program("prog/ddpm_sampling_loop", DDPMSampler,
                lambda: Args((2, 1, 8, 8), return_all=True),
                note="6 reverse steps: reversed(range), torch.full timesteps, noise if i > 0"),

        # detection
        Program("prog/rpn_anchor_decode_topk", AnchorHead,
                lambda: Args(torch.randn(2, 16, 6, 6), (48, 48)), quick=True,
                note="anchors via meshgrid in forward; BoxCoder decode; score mask; topk"),
        Program("prog/anchor_iou_matching", AnchorMatcher, matcher_inputs, quick=True,
                note="pairwise IoU, thresholds by torch.where, low-quality matches forced"),
        Program("prog/centernet_decode", CenterNetDecoder,
                lambda: (torch.randn(1, 3, 16, 16), torch.rand(1, 2, 16, 16) * 4,
                         torch.rand(1, 2, 16, 16)),
                note="max-pool NMS, topk over C*H*W, // and % index arithmetic, gather"),
        Program("prog/yolo_conf_filter", YOLOPostprocess, lambda: (torch.randn(1, 16, 6, 6),),
                note="det[det[..., 4] > conf] per image (data-dependent shape; `if not det.shape[0]` guessed)"),
        Program("prog/retinanet_postprocess_nonzero", RetinaNetPostprocess, retinanet_inputs,
                note="torch.nonzero of the score mask, min(k, n) top-k (sizes read at replay)"),

        # losses with Python-side bookkeeping
        Program("prog/detection_loss_dict", DetectionCriterion, detection_loss_inputs,
                quick=True, note="dicts in and out; dict comprehension; sum(losses.values())"),
        Program("prog/classifier_meters_item", ClassifierTrainStep, train_step_inputs,
                note="AverageMeter objects in a dict passed in, updated with .item() (breaks)"),
        Program("prog/label_smoothing_stats", LabelSmoothingSeqLoss, label_smoothing_inputs,
                note="stats dict passed in: .get, setdefault, float(loss), .item() (breaks)"),
        Program("prog/nt_xent_loss", NTXentLoss, lambda: (torch.randn(4, 32), torch.randn(4, 32)),
                note="SimCLR: eye mask, (arange + b) % n targets; accuracy under no_grad"),
        Program("prog/dice_bce_loss", DiceBCELoss,
                lambda: (torch.randn(2, 3, 8, 8), torch.randint(0, 3, (2, 8, 8))),
                note="per-class dice in an enumerate loop, f-string keys, sum(weights)"),

        # vision backbones and blocks
        Program("prog/unet_skip_list", UNet, lambda: (torch.randn(1, 3, 36, 36),), quick=True,
                note="skips in a list; zip(..., reversed(skips)); F.pad when 9 != 8"),
        Program("prog/resnet_basic_downsample", SmallResNet, lambda: (torch.randn(2, 3, 16, 16),),
                quick=True, note="`if self.downsample is not None`; in-place out += identity"),
        Program("prog/resnet_train_bn_dropout", lambda: SmallResNet(dropout=0.2),
                lambda: (torch.randn(2, 3, 16, 16),), train=True, separate_worlds=True,
                note="training mode: BatchNorm running stats updated, dropout drawn"),
        Program("prog/se_resnet_bottleneck",
                lambda: SmallResNet(block=SEBottleneck, layers=(1, 1), width=8),
                lambda: (torch.randn(2, 3, 16, 16),),
                note="bottleneck + squeeze-excitation; expand_as"),
        Program("prog/convnext_drop_path_train", ConvNeXtStage,
                lambda: (torch.randn(2, 16, 8, 8),), train=True,
                note="timm drop_path: x.new_empty(shape).bernoulli_(keep_prob) in training"),
        Program("prog/fpn_comprehensions", FPN, lambda: (torch.randn(1, 3, 32, 32),),
                note="list/dict comprehensions, results.insert(0, ...), sum of a generator"),
        Program("prog/vit_pos_embed_interpolate", VisionTransformerTiny,
                lambda: (torch.randn(1, 3, 48, 48),),
                note="pos embed built for 32x32, bicubic-interpolated for 48x48; torch._assert"),
        Program("prog/mlp_mixer", MLPMixer, lambda: (torch.randn(2, 3, 32, 32),),
                note="patches with unfold; token mixing via transpose"),

        # mixture of experts
        Program("prog/moe_dense_topk", DenseTopKMoE, lambda: (torch.randn(2, 5, 16),),
                quick=True, note="top-2 gates scattered back; every expert runs; aux loss"),
        Program("prog/moe_sparse_dispatch", SparseMoE, lambda: (torch.randn(2, 5, 16),),
                note="torch.where(mask) per expert + index_add_ (data-dependent, on purpose)"),

        # Python constructs around the tensors
        Program("prog/sinusoidal_posenc_forward", SinusoidalPositionalEncoding,
                lambda: (torch.randint(0, 30, (2, 9)),),
                note="pe[:, 0::2] = sin(...) written in place into zeros built in forward"),
        Program("prog/layerdrop_flags", LayerDropEncoder,
                lambda: Args(torch.randn(2, 6, 32), output_hidden_states=True),
                note="eval: layerdrop short-circuits; skip_layers set; hidden states tuple"),
        Program("prog/layerdrop_train", LayerDropEncoder,
                lambda: Args(torch.randn(2, 6, 32), return_dict=False), train=True,
                note="training: `torch.rand([]) < self.layerdrop` (a tensor branch, on purpose)"),
        Program("prog/config_dataclass_shape_branches", ConfigurableEncoderMulti,
                lambda: (torch.randn(2, 12, 3, 4), torch.randn(2, 12)), quick=True,
                note="@dataclass configs; branches on x.dim() and on config fields"),
        Program("prog/print_in_forward", PrintingClassifier,
                lambda: (torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2,))),
                note="print of shapes and of loss.item() (replayed in the plan)"),
        Program("prog/properties_and_partials", PropertyPartialEncoder,
                lambda: (torch.randn(2, 7, 16),),
                note="@property device/dtype/head_dim via next(self.parameters()); "
                     "functools.partial activations and norms; arange on self.device"),
        Program("prog/debug_print_block", DebugPrintBlock, lambda: (torch.randn(2, 6, 16),),
                note="f-string prints of shapes, a mask count and .item() values; sep="),
        Program("prog/hf_config_getattr", lambda: HFStyleClassifier(HFStyleConfig()),
                hf_style_inputs, quick=True,
                note="getattr(config, name, default); hasattr(self, 'pooler'); `x if x is not "
                     "None else config.x`; dict out"),
        Program("prog/hf_model_output", lambda: HFStyleOutputClassifier(HFStyleConfig()),
                lambda: Args(torch.randn(2, 5, 16), labels=torch.tensor([0, 2])),
                note="returns a transformers-style ModelOutput (an OrderedDict dataclass with "
                     "__post_init__, __setattr__ and __setitem__ of its own)"),
        Program("prog/hf_nested_model_outputs", HFNestedOutputsEncoder, hf_nested_inputs,
                note="BertModel-style ModelOutput read by position and name in the head; "
                     "hidden states and attentions grown as tuples; a ModelOutput with a loss"),
        Program("prog/hf_nested_return_dict_false", HFNestedOutputsEncoder,
                lambda: hf_nested_inputs(return_dict=False),
                note="the same with return_dict=False: tuples sliced and concatenated"),
        Program("prog/env_debug_multitask_loss", EnvDebugMultiTaskLoss, env_debug_inputs,
                train=True, note="os.environ.get / os.getenv knobs in forward; task losses "
                                 "summed with functools.reduce(lambda ...)"),
        Program("prog/contextmanager_frozen_timed_head", TimedFrozenBackboneHead,
                lambda: (torch.randn(4, 16),), separate_worlds=True, calls=6,
                note="@contextmanager timer and a no_grad wrapper around the backbone; a "
                     "temperature property setter annealed in forward"),
        Program("prog/user_context_manager_classes", SelfEnsembleHead,
                lambda: (torch.randn(4, 16),), separate_worlds=True, calls=6,
                note="context manager classes of the user's: dropout switched off for a block, "
                     "a pass counter kept on the model"),
        Program("prog/length_tolist_pooling", LengthPooledEncoder,
                lambda: (torch.randn(3, 6, 8), torch.tensor([6, 2, 4])),
                note="GRU states pooled per sample over lengths.tolist(); max of the lengths"),
        Program("prog/per_class_slots_defaultdict", PerClassBoxPostprocess,
                lambda: (torch.randn(5, 16), [0, 2, 0, 1, 0]),
                note="__slots__ Box objects grouped in a defaultdict(list) per class; "
                     "config.copy() adjusted per call"),
        Program("prog/hf_config_no_pooler_tuple",
                lambda: HFStyleClassifier(HFStyleConfig(use_return_dict=False,
                                                        embedding_multiplier=0.5,
                                                        classifier_dropout=0.1),
                                          add_pooler=False),
                lambda: (torch.randn(2, 5, 16),),
                note="the other branches: no pooler, optional settings present, tuple out"),
        Program("prog/convnext_stage_super_forward", ConvNeXtStageWithHead,
                lambda: (torch.randn(2, 16, 8, 8),), quick=True,
                note="LayerNorm2d(nn.LayerNorm) and a subclass both calling super().forward"),
        Program("prog/logging_in_forward", LoggingBlock, lambda: (torch.randn(3, 16),),
                note="logger.debug / logger.info with %-args; isEnabledFor guard"),
        Program("prog/tensor_value_branch", SignDependentBranch, lambda: (torch.randn(4, 16),),
                quick=True, note="`if x.sum() > 0:` and `if norm > max_norm:` (on purpose)"),
        Program("prog/namedtuple_io", NamedTupleHead, namedtuple_inputs,
                note="namedtuple in and out; _replace, _asdict, dict comprehension"),
        Program("prog/kwargs_forwarding", KwargsModel, kwargs_inputs, quick=True,
                note="**kwargs through two levels; an unused keyword swallowed by **unused"),
        Program("prog/closures_default_args", ClosureMLP,
                lambda: Args(torch.randn(3, 16), residual_scale=0.7),
                note="lambdas/closures from helpers with defaults; a def inside forward"),
        Program("prog/try_except_unpack", TryExceptUnpack, lambda: (torch.randn(3, 8, 8),),
                quick=True, note="unbatched input: `b, c, h, w = x.shape` raises ValueError"),
        Program("prog/try_except_view_fallback", TryExceptViewFallback,
                lambda: (torch.randn(2, 8, 5),),
                note="x.view on a transposed tensor raises RuntimeError; reshape fallback"),
        Program("prog/byol_no_grad_ema", BYOL, lambda: (torch.randn(4, 16), torch.randn(4, 16)),
                train=True, separate_worlds=True,
                note="target under `with torch.no_grad():`; EMA of target params via .data"),
        Program("prog/moco_queue", MoCo, lambda: (torch.randn(4, 16), torch.randn(4, 16)),
                separate_worlds=True,
                note="momentum update; queue write at int(self.queue_ptr) (breaks on purpose)"),
        Program("prog/tcn_train", TCN, lambda: (torch.randn(2, 4, 20),), train=True,
                note="dilated causal Conv1d with Chomp1d slicing; dropout in training"),
        Program("prog/set_criterion_sorted_losses", SetCriterionDict, set_criterion_inputs,
                note="a matcher object made and called in forward; getattr(self, 'loss_' + "
                     "name); losses summed over sorted(losses); a log dict over sorted items"),
        Program("prog/activation_partials_in_forward", ActivationChoiceBlock,
                lambda: (torch.randn(3, 16),), quick=True,
                note="functools.partial activations chosen in forward; a partial of a bound "
                     "method called with keyword overrides"),
        Program("prog/deprecated_kwarg_warning", DeprecatedArgEncoder,
                lambda: Args(torch.randn(2, 5, 16), head_mask=torch.tensor([1.0, 0.5])),
                note="warnings.warn on every call and an enabled logger.info in forward (they "
                     "name the caller's file and line: replayed as steps from that site)"),
        Program("prog/annotated_uint8_subsequent_mask", AnnotatedDecoderSelfAttention,
                annotated_inputs, calls=6,
                note="the Annotated Transformer's np.triu(...).astype('uint8') mask made per call "
                     "and masked_fill with a uint8 mask (a C++ deprecation warning each call)"),
        Program("prog/gcn_normalized_adjacency", GCN, gcn_inputs, train=True,
                note="D^-1/2 (A + I) D^-1/2 in forward; F.dropout(training=self.training)"),
        Program("prog/feature_hooks_perceptual_loss", FeatureExtractor,
                lambda: (torch.randn(1, 3, 16, 16), torch.randn(1, 3, 16, 16)), calls=3,
                note="forward hooks store layer outputs in a dict read back in sorted order; "
                     "dict(self.features) copies it between two backbone runs"),
        Program("prog/weight_norm_resblock", WNResBlock, lambda: (torch.randn(2, 8, 24),),
                quick=True, note="nn.utils.weight_norm: a forward pre-hook per conv"),
        Program("prog/torch_transformer_encoder_mask", TorchEncoderClassifier,
                lambda: (torch.randint(0, 40, (3, 7)), torch.tensor([7, 4, 2])),
                note="torch.nn.TransformerEncoder with a padding mask built from lengths"),
        Program("prog/enum_config_sentinel", lambda: EnumPooledEncoder(Pooling.MAX),
                lambda: (torch.randn(2, 5, 16),),
                note="`is Pooling.CLS` / `== Pooling.MAX` on an Enum; `temperature is _UNSET`"),
        Program("prog/lambda_defaults_itertools", MultiScaleLambdaHeads,
                lambda: (torch.randn(2, 3, 8, 8),),
                note="lambda t, s=s, f=f: ... over itertools.product; imports and "
                     "functools.reduce(operator.mul, shape) inside forward"),
        Program("prog/layerdrop_encoder_lru_table", BartLayerDropEncoder,
                lambda: (torch.randint(0, 40, (2, 7)), torch.tensor([7, 4])),
                note="random.uniform per layer for LayerDrop; an lru_cache'd sinusoidal table; "
                     "dict(name=...) and update(name=...) outputs"),
        Program("prog/layerdrop_encoder_train", BartLayerDropEncoder,
                lambda: (torch.randint(0, 40, (2, 7)), torch.tensor([7, 4])), train=True,
                separate_worlds=True,
                note="training: the LayerDrop branch on a random draw breaks on purpose"),
        Program("prog/dann_gradient_reversal", DANN, dann_inputs, train=True,
                separate_worlds=True,
                note="autograd.Function gradient reversal; alpha from a Python step counter "
                     "through min() and math.exp (dynamic after one recompile)"),
        Program("prog/ranked_pyramid_fusion", RankedPyramidFusion,
                lambda: (torch.randn(1, 3, 32, 32),),
                note="ModuleList/Sequential slices; sorted/max with key functions; "
                     "list.sort(key=...); numpy on shapes; enumerate(start=2)"),
        Program("prog/warmup_ema_counter", WarmupEMAHead, lambda: (torch.randn(3, 16),),
                calls=5, separate_worlds=True,
                note="EMA warm-up min(decay, (1 + n) / (10 + n)) on a Python counter; "
                     "in-place shadow update under no_grad"),
        Program("prog/callback_step_fresh_lambdas", CallbackStep, callback_step_inputs,
                calls=4,
                note="loss and transform callbacks made afresh by factories on every call "
                     "(guarded by their code; a closure tensor read at replay)"),
        Program("prog/sac_actor_normal", SACActor, lambda: (torch.randn(5, 11),), train=True,
                note="torch.distributions.Normal: rsample, then log_prob validates the sample "
                     "(a check after a draw: the generators are put back if it fails)"),
        Program("prog/ppo_actor_critic_sample", PPOActorCritic, lambda: (torch.randn(6, 8),),
                train=True,
                note="Categorical(logits=...): sample, log_prob, entropy (a lazy_property)"),
        Program("prog/ppo_actor_critic_evaluate", PPOActorCritic,
                lambda: (torch.randn(6, 8), torch.randint(0, 4, (6,))), train=True,
                note="the PPO update: log_prob and entropy of stored actions (validated)"),
        Program("prog/sac_actor_deterministic", SACActor,
                lambda: Args(torch.randn(5, 11), deterministic=True),
                note="the same actor at evaluation: log_prob of the mean, argument checks "
                     "replayed as checks"),
        Program("prog/diou_box_loss_cached_property", DIoUBoxLoss, diou_inputs, train=True,
                note="a box container made per call with functools.cached_property widths, "
                     "heights, area and centers (read many times)"),
        Program("prog/vae_distributions_kl", DistributionVAE, lambda: (torch.rand(4, 64),),
                train=True,
                note="Normal posterior and prior, kl_divergence, rsample; checks before the draw"),
        Program("prog/fused_heads_stdlib_bookkeeping", FusedMultiHead, fused_head_inputs,
                note="itertools.accumulate offsets and pairwise levels, dataclasses.replace, "
                     "an object() sentinel, operator.itemgetter sort keys, collections.Counter"),
        Program("prog/fused_heads_stdlib_bookkeeping_train", FusedMultiHead, fused_head_inputs,
                train=True, note="the same in training: a config replaced per call"),
        Program("prog/hf_sequence_classifier", HFSequenceClassifier, hf_classifier_inputs,
                note="config through __getattribute__ and a property, a decorated forward, "
                     "CrossEntropyLoss() made in forward"),
        Program("prog/scheduled_train_step", ScheduledTrainStep,
                lambda: (torch.randn(6, 8), torch.randn(6, 1)), train=True,
                separate_worlds=True, calls=4,
                note="backward, clip_grad_norm_(parameters()), SGD and StepLR steps, the lr "
                     "read after them (a break there)"),
    ]

#!/usr/bin/env python3
"""The PyTorch side of `continuum bench gpu`: the same weights, the same workload.

A plain Hugging Face-style Llama forward (RMSNorm, RoPE with the Llama-3
frequency rule, GQA attention through torch.nn.functional.
scaled_dot_product_attention, SwiGLU MLP), written out here so nothing but
torch is needed: the safetensors files are read by their header. Weights and
activations in the checkpoint's dtype (bf16 for the bench preset), a static
KV cache per batch. Prints one JSON line:

  {"decode_tok_per_s": {"1": ..., "16": ...}, "prefill_tok_per_s": ..., "device": ..., "torch": ...}

and, with --logits-out, writes the float32 last-row logits of --logits-prompt
(token ids, comma-separated) so the caller can check it computes the same
model (the bench compares them with the continuum engine's).

  _torch_llama.py --model DIR [--device cuda] [--dtype auto|f32|bf16|f16]
                  [--batches 1,16] [--prompt 64] [--decode 128] [--prefill 4096]
                  [--logits-prompt 1,2,3 --logits-out FILE] [--check]

--check runs nothing heavy: it parses the arguments, reads the config and the
safetensors headers and exits (the CPU machine's build-only check).

--write-random mistral-7b --like DIR --model OUT writes a model directory
instead: DIR's tokenizer files, a Mistral-7B-shaped config.json (32 layers,
hidden 4096, 32 heads / 8 kv, ffn 14336, DIR's vocabulary) and random bf16
weights drawn on the GPU (the generated presets' scales), ~14.5 GB in 2 GiB
shards: the larger model of native/gpu-serve-check.sh --with-7b, written in
seconds where the JavaScript generator would take many minutes.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

DTYPES = {"F32": 4, "F16": 2, "BF16": 2}


def read_safetensors_headers(model_dir):
    """{name: (path, dtype, shape, start, end)} over model.safetensors or its shards."""
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise SystemExit(f"{model_dir}: no .safetensors files")
    out = {}
    for f in files:
        path = os.path.join(model_dir, f)
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in DTYPES:
                raise SystemExit(f"{path}: {name}: dtype {info['dtype']} not supported")
            s, e = info["data_offsets"]
            out[name] = (path, info["dtype"], info["shape"], base + s, base + e)
    return out


def load_tensors(torch, headers, device, dtype):
    tdtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    tensors = {}
    for name, (path, dt, shape, start, end) in headers.items():
        with open(path, "rb") as fh:
            fh.seek(start)
            buf = bytearray(fh.read(end - start))
        t = torch.frombuffer(buf, dtype=tdtype[dt]).reshape(shape) if buf else torch.zeros(shape, dtype=tdtype[dt])
        tensors[name] = t.to(device=device, dtype=dtype)
    return tensors


def inv_freq(cfg, head_dim):
    """Hugging Face's rotary frequencies, with the Llama-3 rule when rope_scaling says llama3 (in float64)."""
    theta = cfg.get("rope_theta", 10000.0)
    freqs = [1.0 / theta ** (2 * i / head_dim) for i in range(head_dim // 2)]
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        orig = rs["original_max_position_embeddings"]
        low_wl, high_wl = orig / low, orig / high
        out = []
        for f in freqs:
            wl = 2 * math.pi / f
            if wl > low_wl:
                f = f / factor
            elif wl >= high_wl:
                smooth = (orig / wl - low) / (high - low)
                f = (1 - smooth) * f / factor + smooth * f
            out.append(f)
        freqs = out
    return freqs


class Llama:
    def __init__(self, torch, cfg, w, device, dtype):
        self.t, self.cfg, self.w, self.device, self.dtype = torch, cfg, w, device, dtype
        self.L = cfg["num_hidden_layers"]
        self.H = cfg["num_attention_heads"]
        self.KV = cfg.get("num_key_value_heads", self.H)
        self.D = cfg.get("head_dim") or cfg["hidden_size"] // self.H
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.bias = bool(cfg.get("attention_bias", False))
        self.lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        self.inv_freq = torch.tensor(inv_freq(cfg, self.D), dtype=torch.float32, device=device)
        f = torch.nn.functional
        self.sdpa = getattr(f, "scaled_dot_product_attention", None)

    def norm(self, x, weight):
        # LlamaRMSNorm: the statistics in float32, the result in the input dtype.
        xf = x.float()
        xf = xf * self.t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    def rope(self, x, pos):
        # x [B, heads, T, D]; rotate_half convention; angles in float32 as HF computes them.
        ang = pos.float()[:, None] * self.inv_freq[None, :]
        emb = self.t.cat((ang, ang), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        half = x.shape[-1] // 2
        rot = self.t.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def attend(self, q, k, v, causal):
        if self.KV != self.H:
            rep = self.H // self.KV
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if self.sdpa is not None:
            return self.sdpa(q, k, v, is_causal=causal)
        # torch < 2.0 (the CPU machine's Debian build): the same attention written out.
        s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if causal:
            T, S = s.shape[-2], s.shape[-1]
            mask = self.t.ones(T, S, dtype=self.t.bool, device=s.device).tril(S - T)
            s = s.masked_fill(~mask, float("-inf"))
        return (s.softmax(-1) @ v.float()).to(q.dtype)

    def forward(self, ids, start, cache):
        """ids [B, T] at positions start..start+T-1 (every row the same); cache [L] of (k, v) [B, KV, max, D]."""
        t, w = self.t, self.w
        B, T = ids.shape
        pos = t.arange(start, start + T, device=self.device)
        x = w["model.embed_tokens.weight"][ids]
        for i in range(self.L):
            p = f"model.layers.{i}."
            h = self.norm(x, w[p + "input_layernorm.weight"])
            q = h @ w[p + "self_attn.q_proj.weight"].T
            k = h @ w[p + "self_attn.k_proj.weight"].T
            v = h @ w[p + "self_attn.v_proj.weight"].T
            if self.bias:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            q = self.rope(q.view(B, T, self.H, self.D).transpose(1, 2), pos)
            k = self.rope(k.view(B, T, self.KV, self.D).transpose(1, 2), pos)
            v = v.view(B, T, self.KV, self.D).transpose(1, 2)
            kc, vc = cache[i]
            kc[:, :, start : start + T] = k
            vc[:, :, start : start + T] = v
            # Prefill from 0 is causal over its own rows; a decode row sees every key so far.
            a = self.attend(q, kc[:, :, : start + T], vc[:, :, : start + T], causal=T > 1)
            x = x + a.transpose(1, 2).reshape(B, T, self.H * self.D) @ w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, w[p + "post_attention_layernorm.weight"])
            g = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (t.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
        x = self.norm(x[:, -1:], w["model.norm.weight"])
        return (x @ self.lm_head.T)[:, -1].float()

    def cache(self, B, length):
        shape = (B, self.KV, length, self.D)
        return [
            (self.t.zeros(shape, dtype=self.dtype, device=self.device), self.t.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(self.L)
        ]


def sync(torch, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


SHAPES = {
    "mistral-7b": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
                   "max_position_embeddings": 32768, "rope_theta": 1000000.0},
}


def write_random(shape, like, out, device):
    """A random bf16 Llama-family model of `shape` with `like`'s tokenizer (see the module doc)."""
    import shutil

    import torch

    with open(os.path.join(like, "config.json")) as fh:
        base = json.load(fh)
    os.makedirs(out, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(like, f)):
            shutil.copy(os.path.join(like, f), os.path.join(out, f))
    cfg = {k: base[k] for k in ("architectures", "model_type", "hidden_act", "rms_norm_eps", "vocab_size",
                                "bos_token_id", "eos_token_id") if k in base}
    cfg.update(SHAPES[shape])
    cfg.update({"rope_scaling": None, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
                "torch_dtype": "bfloat16", "use_cache": True})
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    L, H, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    q, kv, F = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["intermediate_size"]
    tensors = [("model.embed_tokens.weight", (V, H), 2 / math.sqrt(H)), ("lm_head.weight", (V, H), 2 / math.sqrt(H)),
               ("model.norm.weight", (H,), None)]
    for i in range(L):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", (H,), None), (p + "post_attention_layernorm.weight", (H,), None),
                    (p + "self_attn.q_proj.weight", (q, H), 1 / math.sqrt(H)),
                    (p + "self_attn.k_proj.weight", (kv, H), 1 / math.sqrt(H)),
                    (p + "self_attn.v_proj.weight", (kv, H), 1 / math.sqrt(H)),
                    (p + "self_attn.o_proj.weight", (H, q), 1 / math.sqrt(q * 2 * L)),
                    (p + "mlp.gate_proj.weight", (F, H), 1 / math.sqrt(H)),
                    (p + "mlp.up_proj.weight", (F, H), 1 / math.sqrt(H)),
                    (p + "mlp.down_proj.weight", (H, F), 1 / math.sqrt(F * 2 * L))]
    gen = torch.Generator(device=device).manual_seed(7)
    shards, shard, size, limit = [], [], 0, 2 << 30
    for name, dims, std in tensors:
        n = math.prod(dims) * 2
        if shard and size + n > limit:
            shards.append(shard)
            shard, size = [], 0
        shard.append((name, dims, std))
        size += n
    shards.append(shard)
    index = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {}, 0
        for name, dims, _ in shard:
            header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + math.prod(dims) * 2]}
            offset += math.prod(dims) * 2
            index[name] = fname
        head = json.dumps(header).encode()
        head += b" " * ((8 - len(head) % 8) % 8)
        with open(os.path.join(out, fname), "wb") as fh:
            fh.write(struct.pack("<Q", len(head)) + head)
            for name, dims, std in shard:
                if std is None:
                    t = 1 + 0.1 * (2 * torch.rand(dims, generator=gen, device=device) - 1)
                else:
                    t = torch.randn(dims, generator=gen, device=device) * std
                fh.write(t.to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": index}, fh)
    print(json.dumps({"wrote": out, "shards": len(shards), "tensors": len(tensors)}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="auto", choices=["auto", "f32", "bf16", "f16"])
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--logits-prompt", default="")
    ap.add_argument("--logits-out", default="")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write-random", choices=sorted(SHAPES), default="")
    ap.add_argument("--like", default="")
    a = ap.parse_args()
    if a.write_random:
        write_random(a.write_random, a.like, a.model, a.device)
        return
    batches = [int(b) for b in a.batches.split(",") if b]
    with open(os.path.join(a.model, "config.json")) as fh:
        cfg = json.load(fh)
    headers = read_safetensors_headers(a.model)
    if a.check:
        print(json.dumps({"check": "ok", "tensors": len(headers), "layers": cfg["num_hidden_layers"]}))
        return
    import torch

    stored = {h[1] for h in headers.values()}
    if a.dtype == "auto":
        dtype = torch.bfloat16 if "BF16" in stored else torch.float16 if "F16" in stored else torch.float32
    else:
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    torch.manual_seed(0)
    m = Llama(torch, cfg, load_tensors(torch, headers, a.device, dtype), a.device, dtype)
    vocab = cfg["vocab_size"]
    out = {"device": a.device, "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""), "sdpa": m.sdpa is not None}

    with torch.inference_mode():
        if a.logits_prompt:
            ids = torch.tensor([[int(x) for x in a.logits_prompt.split(",")]], device=a.device)
            logits = m.forward(ids, 0, m.cache(1, ids.shape[1]))
            row = logits[0].cpu().tolist()
            with open(a.logits_out, "wb") as fh:
                fh.write(struct.pack(f"<{len(row)}f", *row))
        gen = torch.Generator(device="cpu").manual_seed(1)
        decode = {}
        for B in batches:
            length = a.prompt + a.decode + 8
            cache = m.cache(B, length)
            ids = torch.randint(0, vocab - 16, (B, a.prompt), generator=gen).to(a.device)
            logits = m.forward(ids, 0, cache)
            nxt = logits.argmax(-1, keepdim=True)
            for s in range(3):  # warm up the decode path
                nxt = m.forward(nxt, a.prompt + s, cache).argmax(-1, keepdim=True)
            sync(torch, a.device)
            t0 = time.perf_counter()
            steps = a.decode - 3
            for s in range(steps):
                nxt = m.forward(nxt, a.prompt + 3 + s, cache).argmax(-1, keepdim=True)
            sync(torch, a.device)
            decode[str(B)] = B * steps / (time.perf_counter() - t0)
            del cache
        out["decode_tok_per_s"] = decode
        if a.prefill > 0:
            cache = m.cache(1, a.prefill)
            ids = torch.randint(0, vocab - 16, (1, a.prefill), generator=gen).to(a.device)
            m.forward(ids, 0, cache)  # warm-up
            sync(torch, a.device)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                m.forward(ids, 0, cache)
                sync(torch, a.device)
                times.append(time.perf_counter() - t0)
            out["prefill_tok_per_s"] = a.prefill / sorted(times)[1]
            del cache
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())

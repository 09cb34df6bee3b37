#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Ground truth for the DeepSeek-V4 attention block (docs/SEMANTICS.md §17, docs/DEVELOPING.md).

Builds a tiny DeepSeek-V4 configuration with the real head shapes (head_dim 512 = 448 + 64 rope, one
shared K = V head) and small everything else, random bf16-exact weights for its three layers (layer 0
sliding window only, layer 1 compressed sparse attention: ratio 4 with the lightning indexer's top-k,
layer 2 heavily compressed attention: ratio 8 here, every causal entry), and runs transformers'
DeepseekV4Attention module of each layer (eager attention, no cache: one sequence of T tokens at
positions 0..T-1, the sliding-window causal mask) in float64 and in bf16.

OUT_DIR (the repository's is tests/fixtures/block_v4) receives:
  checkpoint/config.json        transformers' DeepseekV4Config.to_dict() (DeepseekV4Config::from_file)
  checkpoint/model.safetensors  "model.layers.<L>.self_attn.<name>.weight" (BF16), "...self_attn.sinks"
  io.safetensors     hidden [T, hidden] BF16 (the input of every layer) and per layer L:
    out_ref_<L>      [T, hidden] F64  transformers in float64 with float64 rope tables for q / kv
    out_hf_bf16_<L>  [T, hidden] F32  transformers in bf16 (its own rotary tables)
    compressed_<L>   [N_L, 512]  F64  the compressor's outputs of the float64 run (layers 1, 2)
    topk_<L>         [T, K_L]    I32  compressed entries each token attends, -1 = none (layers 1, 2):
                                      layer 1 the indexer's picks, layer 2 every entry e < (p + 1) / 8
  gen_v4_fixture.log what was run and measured (also io.safetensors' "__metadata__")

transformers keeps its norms in float32 even in a float64 run (a ~1e-7 relative term in out_ref); the
compressor's and the indexer's own rope tables stay transformers' (their outputs are inputs of the C++
block, so only their values matter, not how they were computed).

Run on a machine with torch and a transformers that has deepseek_v4 (no network needed):
  python3 scripts/gen_v4_fixture.py tests/fixtures/block_v4 [--tokens 48] [--device cuda]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_block_fixture  # noqa: E402
from gen_block_fixture import bf16_bits_to_f64, to_bf16_bits, write_safetensors  # noqa: E402

gen_block_fixture.ST_DT.setdefault("I32", 4)  # the top-k rows

HCA_RATIO = 8
LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]


def tiny_config():
    from transformers import DeepseekV4Config
    return DeepseekV4Config(
        vocab_size=256, hidden_size=128, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=512, q_lora_rank=64, num_experts_per_tok=2, n_routed_experts=4,
        n_shared_experts=1, max_position_embeddings=4096, rope_theta=10000.0, layer_types=list(LAYER_TYPES),
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": HCA_RATIO},
        compress_rope_theta=160000.0, hc_mult=2, sliding_window=16, o_groups=2, o_lora_rank=32,
        index_n_heads=2, index_head_dim=128, index_topk=4, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        mlp_layer_types=["moe"] * 3)


def bf16_exact(rng, shape, lo, hi):
    return bf16_bits_to_f64(to_bf16_bits(rng.uniform(lo, hi, size=shape)))


def random_state(attn, rng):
    """Every parameter of the module (compressor and indexer too) bf16-exact; norms near 1."""
    sd = {}
    for name, p in attn.state_dict().items():
        shape = tuple(p.shape)
        if name.endswith("norm.weight"):
            sd[name] = bf16_exact(rng, shape, 0.8, 1.2)
        elif name.endswith("sinks"):
            sd[name] = bf16_exact(rng, shape, -1.0, 1.0)
        elif name.endswith("position_bias"):
            sd[name] = bf16_exact(rng, shape, -0.5, 0.5)
        else:
            a = math.sqrt(3.0 / shape[-1]) if len(shape) > 1 else 1.0
            sd[name] = bf16_exact(rng, shape, -a, a)
    return sd


def inv_freq_f64(conf, layer_type):
    """The layer's inverse frequencies in float64 (plain for 'main', YaRN for 'compress')."""
    rp = conf.rope_parameters[layer_type]
    dim = int(conf.head_dim * rp.get("partial_rotary_factor", conf.partial_rotary_factor))
    base = float(rp["rope_theta"])
    pos_freq = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if rp.get("rope_type", "default") != "yarn":
        return 1.0 / pos_freq
    factor, orig = float(rp["factor"]), float(rp["original_max_position_embeddings"])
    bf, bs = float(rp.get("beta_fast", 32.0)), float(rp.get("beta_slow", 1.0))

    def corr(r):
        return dim * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    return ramp / (factor * pos_freq) + (1 - ramp) / pos_freq


def sliding_mask(T, window, dtype, device):
    q = torch.arange(T, device=device)[:, None]
    k = torch.arange(T, device=device)[None, :]
    ok = (k <= q) & (k > q - window)
    m = torch.zeros((T, T), dtype=dtype, device=device)
    return m.masked_fill(~ok, torch.finfo(dtype).min)[None, None]


def run_layer(m, conf, layer, sd, x, dtype, device, f64_tables, log):
    attn = m.DeepseekV4Attention(conf, layer_idx=layer)
    missing, unexpected = attn.load_state_dict({k: torch.tensor(v) for k, v in sd.items()}, strict=True)
    attn = attn.to(device=device, dtype=dtype).eval()
    T = x.shape[0]
    pos = torch.arange(T, device=device)[None]
    emb = {}
    rot = m.DeepseekV4RotaryEmbedding(conf).to(device)
    hs = torch.tensor(x, dtype=dtype, device=device)[None]
    for lt in ("main", "compress"):
        if f64_tables:
            ang = np.arange(T, dtype=np.float64)[:, None] * inv_freq_f64(conf, lt)[None, :]
            emb[lt] = (torch.tensor(np.cos(ang), dtype=dtype, device=device)[None],
                       torch.tensor(np.sin(ang), dtype=dtype, device=device)[None])
        else:
            emb[lt] = rot(hs, pos, layer_type=lt)
    captured = {}
    if attn.compressor is not None:
        attn.compressor.register_forward_hook(lambda mod, i, o: captured.__setitem__("comp", o[0].detach()))
        if hasattr(attn.compressor, "indexer"):
            attn.compressor.indexer.register_forward_hook(lambda mod, i, o: captured.__setitem__("topk", o.detach()))
    with torch.no_grad():
        out = attn(hs, position_embeddings=emb, position_ids=pos,
                   attention_mask=sliding_mask(T, conf.sliding_window, dtype, device))
    out = out[0] if isinstance(out, (tuple, list)) else out
    res = {"out": out[0].double().cpu().numpy()}
    if "comp" in captured:
        res["compressed"] = captured["comp"][0, 0].double().cpu().numpy()  # [N, head_dim]
    if "topk" in captured:
        res["topk"] = captured["topk"][0].cpu().numpy().astype(np.int32)
    log(f"layer {layer} ({conf.layer_types[layer]}, {dtype}): out rms {np.sqrt((res['out'] ** 2).mean()):.4g}"
        + (f", {res['compressed'].shape[0]} compressed rows" if "compressed" in res else ""))
    return res


def rel_l2(a, b):
    return float(np.sqrt(((a - b) ** 2).sum() / (b ** 2).sum()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=47)
    args = ap.parse_args()
    import transformers
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m
    os.makedirs(args.out, exist_ok=True)
    lines = []

    def log(s):
        print(s)
        lines.append(s)
    log(f"gen_v4_fixture: torch {torch.__version__}, transformers {transformers.__version__}, device {args.device}, "
        f"tokens {args.tokens}, seed {args.seed}")
    conf = tiny_config()
    conf._attn_implementation = "eager"
    rng = np.random.default_rng(args.seed)
    T, H = args.tokens, conf.hidden_size
    x = bf16_exact(rng, (T, H), -1.0, 1.0)
    weights, io, meta = {}, {"hidden": ("BF16", to_bf16_bits(x))}, {}
    for layer in range(len(LAYER_TYPES)):
        sd = random_state(m.DeepseekV4Attention(conf, layer_idx=layer), rng)
        for k, v in sd.items():
            if k.startswith("compressor."):
                continue  # the compressor's outputs are the block's inputs
            name = f"model.layers.{layer}.self_attn.{k}"
            weights[name] = ("BF16", to_bf16_bits(v).reshape(v.shape))
        ref = run_layer(m, conf, layer, sd, x, torch.float64, args.device, True, log)
        hf = run_layer(m, conf, layer, sd, x, torch.bfloat16, args.device, False, log)
        io[f"out_ref_{layer}"] = ("F64", ref["out"])
        io[f"out_hf_bf16_{layer}"] = ("F32", hf["out"].astype(np.float32))
        if "compressed" in ref:
            io[f"compressed_{layer}"] = ("F64", ref["compressed"])
            n = ref["compressed"].shape[0]
            if "topk" in ref:
                topk = ref["topk"]
            else:  # every causal entry: e < (p + 1) / ratio
                ratio = conf.compress_rates[LAYER_TYPES[layer]]
                topk = np.full((T, max(n, 1)), -1, dtype=np.int32)
                for p in range(T):
                    k = min(n, (p + 1) // ratio)
                    topk[p, :k] = np.arange(k)
            io[f"topk_{layer}"] = ("I32", topk.astype(np.int32))
        meta[f"bf16_vs_ref_{layer}"] = f"{rel_l2(hf['out'], ref['out']):.3e}"
        log(f"layer {layer}: transformers bf16 vs float64: rel-L2 {meta[f'bf16_vs_ref_{layer}']}")
    cfg = conf.to_dict()
    cfg["model_type"] = "deepseek_v4"
    os.makedirs(os.path.join(args.out, "checkpoint"), exist_ok=True)
    with open(os.path.join(args.out, "checkpoint", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True, default=str)
    write_safetensors(os.path.join(args.out, "checkpoint", "model.safetensors"), weights)
    meta.update({"torch": torch.__version__, "transformers": transformers.__version__, "device": args.device,
                 "tokens": T, "seed": args.seed})
    write_safetensors(os.path.join(args.out, "io.safetensors"), io, meta)
    with open(os.path.join(args.out, "gen_v4_fixture.log"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

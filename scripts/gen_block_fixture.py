#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Ground truth for the DeepSeek attention block (docs/BLOCK.md "The fixture").

Builds two small random checkpoints in the published forms and runs HuggingFace transformers'
DeepseekV3Attention (the attention module alone, eager attention, causal mask) on them:

  v3_fp8/       DeepSeek-V3 shapes per head (q_lora_rank set, kv_lora 512, nope 128, rope 64, v 128),
                2 heads, hidden 128, fp8 e4m3 weights with 128x128 block scales (weight_scale_inv),
                sharded over two files through model.safetensors.index.json, layer 1
  v2lite_bf16/  DeepSeek-V2-Lite shapes (q_lora_rank null: q_proj), 2 heads, hidden 128, bf16, layer 1

Every Linear weight is made of e4m3 codes times a power-of-two block scale whose block maximum code
is +-448, so the weight is exactly representable both ways: bf16(dequant) is exact, and quantising
the bf16 weight with the usual recipe (scale = block amax / 448) gives back the same codes. Each
checkpoint can therefore be served in the other form too (the C++ tests convert) against the same
reference output.

Per shape, <name>_io.safetensors holds:
  hidden     [T, hidden] BF16   input hidden states (one sequence, positions 0..T-1)
  out_ref    [T, hidden] F32    transformers' attention in float64 with float64 rope tables
  out_hf_bf16 [T, hidden] BF16  transformers' attention in bf16 (bf16 weights, its rotary module)
(transformers' own fp32 rotary tables in float64 give hf_rotary_vs_f64_tables, in the metadata)
  hf_cos, hf_sin [T, R/2] F32   transformers' rotary tables (the unique half of cat(freqs, freqs))
  attn_head  [16, h*v] F32      attention output before o_proj, first 16 tokens (out_ref's run)
and "__metadata__" records the generator (transformers version, device) and the measured distances.

Without transformers (--self), out_ref comes from this script's own float64 implementation (the
absorbed MLA form, checked against transformers on the GPU run); that mode is for testing the
script and never writes the repository's fixture.

Usage: python3 scripts/gen_block_fixture.py OUT_DIR [--self] [--tokens 256]
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------------
# e4m3 (OCP e4m3fn) codes <-> values, without torch's float8 dtypes (torch 1.13 has none)

def e4m3_table():
    vals = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 0xF, b & 7
        if e == 0xF and m == 7:
            v = np.nan
        elif e == 0:
            v = m * 2.0 ** -9
        else:
            v = (8 + m) * 2.0 ** (e - 10)
        vals[b] = -v if s else v
    return vals


E4M3 = e4m3_table()
POS_CODES = np.arange(127)  # 0x00..0x7e: the finite non-negative values, increasing
POS_VALS = E4M3[:127]


def quantise_e4m3(x):
    """Nearest finite e4m3 code of each value (|x| <= 448)."""
    a = np.minimum(np.abs(x), 448.0)
    i = np.clip(np.searchsorted(POS_VALS, a), 1, 126)
    lo, hi = POS_VALS[i - 1], POS_VALS[i]
    idx = np.where(a - lo <= hi - a, i - 1, i)
    return (POS_CODES[idx] | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def block_fp8_weight(rng, out_f, in_f, std, block=128):
    """Random [out, in] weight as e4m3 codes and power-of-two block scales (block max code +-448)."""
    nbr, nbc = -(-out_f // block), -(-in_f // block)
    codes = np.zeros((out_f, in_f), dtype=np.uint8)
    scale = np.zeros((nbr, nbc), dtype=np.float32)
    for br in range(nbr):
        for bc in range(nbc):
            r0, r1 = br * block, min(out_f, (br + 1) * block)
            c0, c1 = bc * block, min(in_f, (bc + 1) * block)
            # Scale 2^k near std / 100 (codes of std ~100), varied per block by a factor 2.
            k = int(round(math.log2(std / 100.0))) + int(rng.integers(-1, 2))
            v = rng.normal(0.0, 100.0, size=(r1 - r0, c1 - c0))
            v = np.clip(v, -440.0, 440.0)
            q = quantise_e4m3(v)
            # One element per block at +-448: amax / 448 recovers the scale exactly.
            rr, cc = int(rng.integers(0, r1 - r0)), int(rng.integers(0, c1 - c0))
            q[rr, cc] = 0x7E | (0x80 if rng.integers(0, 2) else 0)
            codes[r0:r1, c0:c1] = q
            scale[br, bc] = 2.0 ** k
    return codes, scale


def dequant(codes, scale, block=128):
    w = E4M3[codes]
    s = np.repeat(np.repeat(scale.astype(np.float64), block, 0), block, 1)[: codes.shape[0], : codes.shape[1]]
    return w * s


def to_bf16_bits(x):
    """float64 -> bf16 bits (round to nearest even), for values already exact in bf16 or not."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f64(b):
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# ---------------------------------------------------------------------------------------------------
# safetensors writer (header padded with spaces to 8 bytes, tensors in the given order)

ST_DT = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "I64": 8, "F64": 8}


def write_safetensors(path, tensors, metadata=None):
    header, pos, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, (dt, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        assert len(b) == int(np.prod(arr.shape, dtype=np.int64)) * ST_DT[dt], name
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [pos, pos + len(b)]}
        pos += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------------------------------
# Configurations

ROPE_V3 = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
           "original_max_position_embeddings": 4096, "type": "yarn"}
ROPE_V2 = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
           "original_max_position_embeddings": 4096, "type": "yarn"}


def base_config(name):
    c = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "rope_theta": 10000, "rms_norm_eps": 1e-6, "max_position_embeddings": 163840,
        "attention_bias": False, "attention_dropout": 0.0, "num_hidden_layers": 2, "vocab_size": 256,
        "intermediate_size": 256, "moe_intermediate_size": 64, "n_routed_experts": 4, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 2,
        "rope_interleave": True, "torch_dtype": "bfloat16",
    }
    if name == "v3_fp8":
        c.update(q_lora_rank=128, rope_scaling=dict(ROPE_V3),
                 quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                      "weight_block_size": [128, 128]})
    else:
        c.update(q_lora_rank=None, rope_scaling=dict(ROPE_V2), model_type="deepseek_v3")
    return c


LAYER = 1


def make_weights(cfg, rng):
    """Full-precision (float64) weights and their published representation."""
    H, h = cfg["hidden_size"], cfg["num_attention_heads"]
    L, P, R, V = cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    shapes = {}
    if cfg["q_lora_rank"]:
        shapes["q_a_proj"] = (cfg["q_lora_rank"], H)
        shapes["q_b_proj"] = (h * (P + R), cfg["q_lora_rank"])
    else:
        shapes["q_proj"] = (h * (P + R), H)
    shapes["kv_a_proj_with_mqa"] = (L + R, H)
    shapes["kv_b_proj"] = (h * (P + V), L)
    shapes["o_proj"] = (H, h * V)
    lin = {}
    for n, (o, i) in shapes.items():
        codes, scale = block_fp8_weight(rng, o, i, std=1.0 / math.sqrt(i))
        lin[n] = (codes, scale, dequant(codes, scale))
    norms = {}
    if cfg["q_lora_rank"]:
        norms["q_a_layernorm"] = bf16_bits_to_f64(to_bf16_bits(1.0 + 0.1 * rng.normal(size=cfg["q_lora_rank"])))
    norms["kv_a_layernorm"] = bf16_bits_to_f64(to_bf16_bits(1.0 + 0.1 * rng.normal(size=L)))
    return lin, norms


def save_checkpoint(dirname, cfg, lin, norms, fp8):
    os.makedirs(dirname, exist_ok=True)
    with open(os.path.join(dirname, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    pre = f"model.layers.{LAYER}.self_attn."
    tensors = {}
    for n, w in norms.items():
        tensors[pre + n + ".weight"] = ("BF16", to_bf16_bits(w))
    for n, (codes, scale, w) in lin.items():
        if fp8:
            tensors[pre + n + ".weight"] = ("F8_E4M3", codes)
            tensors[pre + n + ".weight_scale_inv"] = ("F32", scale)
        else:
            bits = to_bf16_bits(w)
            assert np.array_equal(bf16_bits_to_f64(bits), w), n  # exact in bf16
            tensors[pre + n + ".weight"] = ("BF16", bits)
    if not fp8:
        write_safetensors(os.path.join(dirname, "model.safetensors"), tensors, {"format": "pt"})
        return
    # Two shards: the kv path in the first, everything else in the second.
    names = list(tensors)
    first = [n for n in names if ".kv_" in n]
    shards = {"model-00001-of-00002.safetensors": first,
              "model-00002-of-00002.safetensors": [n for n in names if n not in first]}
    weight_map, total = {}, 0
    for fname, ns in shards.items():
        write_safetensors(os.path.join(dirname, fname), {n: tensors[n] for n in ns}, {"format": "pt"})
        for n in ns:
            weight_map[n] = fname
            total += tensors[n][1].nbytes
    with open(os.path.join(dirname, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# ---------------------------------------------------------------------------------------------------
# Rope tables in float64 (the YaRN inverse frequencies and attention factor of DeepSeek's code)

def yarn_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_tables_f64(cfg, positions):
    """cos, sin [T, R/2] in float64 (times the YaRN attention factor)."""
    dim, base = cfg["qk_rope_head_dim"], float(cfg["rope_theta"])
    rs = cfg["rope_scaling"]
    factor, orig = float(rs["factor"]), rs["original_max_position_embeddings"]
    bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

    def corr_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr_dim(bf)), 0), min(math.ceil(corr_dim(bs)), dim - 1)
    if low == high:
        high += 0.001
    i = np.arange(dim // 2, dtype=np.float64)
    ramp = np.clip((i - low) / (high - low), 0.0, 1.0)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    inv_freq = inter * ramp + extra * (1.0 - ramp)
    m, mad = rs.get("mscale", 1.0), rs.get("mscale_all_dim", 0.0)
    att = yarn_mscale(factor, m) / yarn_mscale(factor, mad) if (m and mad) else yarn_mscale(factor, 1.0)
    ang = np.outer(positions.astype(np.float64), inv_freq)
    return np.cos(ang) * att, np.sin(ang) * att


def softmax_scale(cfg):
    s = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    mad = cfg["rope_scaling"].get("mscale_all_dim", 0)
    if mad:
        m = yarn_mscale(cfg["rope_scaling"]["factor"], mad)
        s *= m * m
    return s


# ---------------------------------------------------------------------------------------------------
# This script's own float64 reference: the absorbed MLA form with interleaved rope pairs

def own_reference(cfg, lin, norms, x, cos, sin):
    h, L, P, R, V = (cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"],
                     cfg["qk_rope_head_dim"], cfg["v_head_dim"])
    eps = cfg["rms_norm_eps"]
    W = {n: v[2] for n, v in lin.items()}

    def rms(v, w):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * w

    T = x.shape[0]
    if cfg["q_lora_rank"]:
        q = rms(x @ W["q_a_proj"].T, norms["q_a_layernorm"]) @ W["q_b_proj"].T
    else:
        q = x @ W["q_proj"].T
    q = q.reshape(T, h, P + R)
    kv = x @ W["kv_a_proj_with_mqa"].T
    c, kpe = rms(kv[:, :L], norms["kv_a_layernorm"]), kv[:, L:]

    def rope(v, cs, sn):  # v [..., R] pairs (2i, 2i+1)
        a, b = v[..., 0::2], v[..., 1::2]
        out = np.empty_like(v)
        out[..., 0::2] = a * cs - b * sn
        out[..., 1::2] = b * cs + a * sn
        return out

    qpe = rope(q[:, :, P:], cos[:, None, :], sin[:, None, :])
    kpe = rope(kpe, cos, sin)
    wkv = W["kv_b_proj"].reshape(h, P + V, L)
    w_uk, w_uv = wkv[:, :P, :], wkv[:, P:, :]
    ql = np.einsum("thp,hpl->thl", q[:, :, :P], w_uk)
    s = (np.einsum("thl,sl->hts", ql, c) + np.einsum("thr,sr->hts", qpe, kpe)) * softmax_scale(cfg)
    s = s + np.triu(np.full((T, T), -np.inf), 1)[None]
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ol = np.einsum("hts,sl->thl", p, c)
    o = np.einsum("thl,hvl->thv", ol, w_uv).reshape(T, h * V)
    return o @ W["o_proj"].T, o


# ---------------------------------------------------------------------------------------------------
# transformers

def hf_attention(cfg, lin, norms, dtype, device, log):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m
    kw = {k: v for k, v in cfg.items() if k not in ("quantization_config", "architectures", "torch_dtype")}
    try:
        conf = DeepseekV3Config(**kw)
    except Exception as e:  # noqa: BLE001: newer transformers name the rope dict rope_parameters
        log(f"DeepseekV3Config(rope_scaling=...) failed ({e!r}); retrying with rope_parameters")
        rp = dict(kw.pop("rope_scaling"))
        rp["rope_type"] = rp.pop("type")
        rp["rope_theta"] = float(kw.pop("rope_theta"))
        conf = DeepseekV3Config(rope_parameters=rp, **kw)
    try:
        conf._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001
        log(f"could not set eager attention: {e!r}")
    attn = m.DeepseekV3Attention(conf, layer_idx=LAYER)
    rot = m.DeepseekV3RotaryEmbedding(conf)
    sd = {}
    for n, (_, _, w) in lin.items():
        sd[n + ".weight"] = torch.tensor(w)
    for n, w in norms.items():
        sd[n + ".weight"] = torch.tensor(w)
    missing, unexpected = attn.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing} unexpected {unexpected}")
    attn = attn.to(device=device, dtype=dtype).eval()
    rot = rot.to(device=device)
    log(f"attention implementation: {getattr(conf, '_attn_implementation', '?')}; "
        f"rope_interleave={getattr(conf, 'rope_interleave', '?')}; scaling={attn.scaling!r}; "
        f"rotary attention_scaling={getattr(rot, 'attention_scaling', '?')!r}")
    return attn, rot


def run_hf(attn, x, cos, sin, dtype, device):
    T = x.shape[0]
    hs = torch.tensor(x, dtype=dtype, device=device)[None]
    mask = torch.full((T, T), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)[None, None]
    captured = {}

    def hook(mod, inp):
        captured["o"] = inp[0].detach()

    hnd = attn.o_proj.register_forward_pre_hook(hook)
    with torch.no_grad():
        try:
            out = attn(hidden_states=hs, position_embeddings=(cos, sin), attention_mask=mask)
        except TypeError:
            out = attn(hs, (cos, sin), mask)
    hnd.remove()
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out[0].double().cpu().numpy(), captured["o"][0].double().cpu().numpy()


def hf_outputs(cfg, lin, norms, x, positions, cos64, sin64, own_out, own_o, device, log, io):
    """transformers' runs; fills io and returns the measured distances."""
    attn, rot = hf_attention(cfg, lin, norms, torch.float64, device, log)
    c64 = torch.tensor(np.concatenate([cos64, cos64], -1), dtype=torch.float64, device=device)[None]
    s64 = torch.tensor(np.concatenate([sin64, sin64], -1), dtype=torch.float64, device=device)[None]
    ref, ref_o = run_hf(attn, x, c64, s64, torch.float64, device)
    pid = torch.tensor(positions, device=device)[None]
    hcos, hsin = rot(torch.zeros(1, dtype=torch.float64, device=device), pid)
    hf, _ = run_hf(attn, x, hcos, hsin, torch.float64, device)
    attn16, rot16 = hf_attention(cfg, lin, norms, torch.bfloat16, device, log)
    bcos, bsin = rot16(torch.zeros(1, dtype=torch.bfloat16, device=device), pid)
    hf16, _ = run_hf(attn16, x, bcos, bsin, torch.bfloat16, device)
    hc = hcos[0, :, : cfg["qk_rope_head_dim"] // 2].double().cpu().numpy()
    hs_ = hsin[0, :, : cfg["qk_rope_head_dim"] // 2].double().cpu().numpy()
    d = {
        "own_vs_hf_f64": rel_l2(own_out, ref),
        "own_attn_head_vs_hf": rel_l2(own_o[:16], ref_o[:16]),
        "hf_rotary_vs_f64_tables": rel_l2(hf, ref),
        "hf_bf16_vs_ref": rel_l2(hf16, ref),
        "hf_cos_max_abs_diff": float(np.abs(hc - cos64).max()),
        "hf_sin_max_abs_diff": float(np.abs(hs_ - sin64).max()),
    }
    io["out_ref"] = ("F32", ref.astype(np.float32))
    io["out_hf_bf16"] = ("BF16", to_bf16_bits(hf16))
    io["hf_cos"] = ("F32", hc.astype(np.float32))
    io["hf_sin"] = ("F32", hs_.astype(np.float32))
    io["attn_head"] = ("F32", ref_o[:16].astype(np.float32))
    return d


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--self", action="store_true", help="no transformers: this script's own reference")
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "gen_block_fixture.log"), "w")

    def log(s):
        print(s)
        logf.write(s + "\n")
        logf.flush()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    log(f"torch {torch.__version__}, device {device}" + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))
    hf_version = None
    if not args.self:
        import transformers
        hf_version = transformers.__version__
        log(f"transformers {hf_version}")
    T = args.tokens
    positions = np.arange(T, dtype=np.int64)
    failures = []
    for name, seed in (("v3_fp8", 1101), ("v2lite_bf16", 1102)):
        rng = np.random.default_rng(seed)
        cfg = base_config(name)
        lin, norms = make_weights(cfg, rng)
        # The quantisation recipe recovers the codes from the dequantised weight (block amax / 448).
        for n, (codes, scale, w) in lin.items():
            for br in range(scale.shape[0]):
                for bc in range(scale.shape[1]):
                    blk = w[br * 128:(br + 1) * 128, bc * 128:(bc + 1) * 128]
                    assert np.abs(blk).max() / 448.0 == scale[br, bc], (n, br, bc)
        save_checkpoint(os.path.join(args.out, name), cfg, lin, norms, fp8=name.endswith("fp8"))
        x = bf16_bits_to_f64(to_bf16_bits(rng.normal(size=(T, cfg["hidden_size"]))))
        cos64, sin64 = rope_tables_f64(cfg, positions)
        own_out, own_o = own_reference(cfg, lin, norms, x, cos64, sin64)
        meta = {"generator": "scripts/gen_block_fixture.py", "tokens": T, "layer": LAYER}
        io = {"hidden": ("BF16", to_bf16_bits(x))}
        if args.self:
            meta["out_ref"] = "this script's own float64 reference (--self)"
            io["out_ref"] = ("F32", own_out.astype(np.float32))
            io["attn_head"] = ("F32", own_o[:16].astype(np.float32))
        else:
            try:
                d = hf_outputs(cfg, lin, norms, x, positions, cos64, sin64, own_out, own_o, device, log, io)
            except Exception:  # noqa: BLE001: keep the run's other outputs and say why in the log
                import traceback
                log(f"{name}: transformers FAILED:\n{traceback.format_exc()}")
                failures.append(f"{name}: transformers failed (see above); out_ref is the script's own reference")
                meta["out_ref"] = "this script's own float64 reference (transformers failed)"
                io["out_ref"] = ("F32", own_out.astype(np.float32))
                io["attn_head"] = ("F32", own_o[:16].astype(np.float32))
                d = None
            if d is not None:
                meta["out_ref"] = f"transformers {hf_version} DeepseekV3Attention, float64, float64 rope tables, {device}"
                meta.update({k: f"{v:.3e}" for k, v in d.items()})
                log(f"{name}: " + ", ".join(f"{k} {v:.3e}" for k, v in d.items()))
                if d["own_vs_hf_f64"] > 1e-6:
                    failures.append(f"{name}: the script's own reference differs from transformers "
                                    f"({d['own_vs_hf_f64']:.3e})")
        write_safetensors(os.path.join(args.out, f"{name}_io.safetensors"), io, meta)
        log(f"{name}: wrote checkpoint and io; |out_ref| rms {np.sqrt(np.mean(io['out_ref'][1].astype(np.float64) ** 2)):.4f}")
    for f in failures:
        log("WARNING " + f)
    logf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Ground truth for the lightning indexer from HuggingFace transformers (docs/INDEXER.md §7).

Builds a small random DeepSeek-V3.2 indexer with transformers' own module (DeepseekV32Indexer of
transformers.models.deepseek_v32: wq_b, wk, k_norm, weights_proj, non-interleaved rope; it scores in
fp32 without fp8 or the Hadamard rotation, which is orthonormal) and runs it once on random inputs
(B sequences of S tokens, causal mask), capturing its index scores (the tensor it calls .topk on) and
its top-k indices. No network: the weights are the module's random initialisation (k_norm's weight
and bias randomised too). The fixture (an .npz, NumPy alone reads it) holds:

  hidden [B, S, hidden] f32, q_resid [B, S, q_lora_rank] f32     the indexer's inputs
  positions [B, S] i64, cos_sin [P, 64] f32                       rope positions and table (32 cos | 32 sin,
                                                                  the unique half of transformers' cos / sin)
  wq_b [64*128, q_lora_rank], wk [128, hidden], k_norm_weight [128], k_norm_bias [128],
  weights_proj [64, hidden]  (all f32, nn.Linear [out, in])       the indexer's parameters
  scores [B, S, S] f32                                            transformers' index scores (-inf: masked)
  topk [B, S, index_topk] i32                                     transformers' top-k indices
  meta (JSON string)                                              generator, versions, device, distances

The script also computes the scores with its own float64 replica and records the distance
(own_vs_hf): the check that the fixture means what tests/python/test_indexer_hf.py assumes. With
--self (no transformers) scores / topk come from that replica: for testing the script and the test
on a machine without transformers; it never writes the repository's fixture.

Usage: python3 scripts/gen_indexer_fixture.py OUT.npz [--self] [--source-out FILE]
"""
import argparse
import inspect
import json
import os
import sys

import numpy as np

B, S, HIDDEN, Q_LORA, HEADS, D, ROPE, TOPK = 2, 80, 64, 8, 64, 128, 64, 24
POS_OFFSETS = (0, 3)  # sequence b's positions start here (the rope table covers both)
THETA = 10000.0


def own_tables(positions):
    """float64 cos / sin [..., 32] of the default rope at these positions."""
    inv = 1.0 / THETA ** (np.arange(0, ROPE, 2, dtype=np.float64) / ROPE)
    f = positions[..., None].astype(np.float64) * inv
    return np.cos(f), np.sin(f)


def own_scores(fx):
    """The indexer in float64 (DeepSeek's Indexer.forward without fp8; the Hadamard is orthonormal)."""
    x, qr = fx["hidden"].astype(np.float64), fx["q_resid"].astype(np.float64)
    q = (qr @ fx["wq_b"].astype(np.float64).T).reshape(B, S, HEADS, D)
    k = x @ fx["wk"].astype(np.float64).T
    k = (k - k.mean(-1, keepdims=True)) / np.sqrt(k.var(-1, keepdims=True) + 1e-6)
    k = k * fx["k_norm_weight"] + fx["k_norm_bias"]
    cs = fx["cos_sin"].astype(np.float64)[fx["positions"]]  # [B, S, 64]
    c, s = cs[..., :ROPE // 2], cs[..., ROPE // 2:]

    def rope(v, c, s):
        x1, x2 = v[..., :ROPE // 2], v[..., ROPE // 2:ROPE]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, v[..., ROPE:]], -1)

    q = rope(q, c[:, :, None], s[:, :, None])
    k = rope(k, c, s)
    dots = np.maximum(np.einsum("bthd,bjd->bthj", q, k) * D ** -0.5, 0.0)
    w = (x @ fx["weights_proj"].astype(np.float64).T) * HEADS ** -0.5
    sc = np.einsum("bth,bthj->btj", w, dots)
    return np.where(np.tril(np.ones((S, S), bool))[None], sc, -np.inf)


def own_topk(scores, k):
    return np.argsort(-scores, -1, kind="stable")[..., :k].astype(np.int32)


def inputs(rng):
    fx = {
        "hidden": rng.standard_normal((B, S, HIDDEN)).astype(np.float32),
        "q_resid": rng.standard_normal((B, S, Q_LORA)).astype(np.float32),
        "positions": np.stack([o + np.arange(S) for o in POS_OFFSETS]).astype(np.int64),
    }
    c, s = own_tables(np.arange(S + max(POS_OFFSETS)))
    fx["cos_sin"] = np.concatenate([c, s], -1).astype(np.float32)
    return fx


def self_weights(rng):
    u = lambda shape, fan_in: rng.uniform(-fan_in ** -0.5, fan_in ** -0.5, shape).astype(np.float32)  # noqa: E731
    return {"wq_b": u((HEADS * D, Q_LORA), Q_LORA), "wk": u((D, HIDDEN), HIDDEN),
            "k_norm_weight": (1 + 0.2 * rng.standard_normal(D)).astype(np.float32),
            "k_norm_bias": (0.2 * rng.standard_normal(D)).astype(np.float32),
            "weights_proj": u((HEADS, HIDDEN), HIDDEN)}


# ---------------------------------------------------------------------------------------------------
# transformers

def hf_config(log):
    from transformers.models.deepseek_v32 import configuration_deepseek_v32 as cm
    kw = dict(vocab_size=128, hidden_size=HIDDEN, intermediate_size=128, moe_intermediate_size=32,
              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
              n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
              q_lora_rank=Q_LORA, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=ROPE, v_head_dim=32,
              index_n_heads=HEADS, index_head_dim=D, index_topk=TOPK, max_position_embeddings=512)
    try:
        return cm.DeepseekV32Config(rope_parameters={"rope_type": "default", "rope_theta": THETA}, **kw)
    except Exception as e:  # noqa: BLE001: older configs take rope_theta / rope_scaling
        log(f"DeepseekV32Config(rope_parameters=...) failed ({e!r}); retrying with rope_theta")
        return cm.DeepseekV32Config(rope_theta=THETA, **kw)


def find_indexer_class(m):
    import torch
    names = [n for n, v in vars(m).items()
             if isinstance(v, type) and issubclass(v, torch.nn.Module) and "Indexer" in n]
    if not names:
        raise RuntimeError(f"no *Indexer* module class in {m.__name__}")
    return getattr(m, sorted(names, key=len)[0])


def hf_run(fx, device, log, source_out):
    import torch
    import transformers
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    conf = hf_config(log)
    cls = find_indexer_class(m)
    src = inspect.getsource(cls)
    if source_out:
        with open(source_out, "w") as f:
            f.write(f"# transformers {transformers.__version__}: {m.__file__}\n" + src)
    torch.manual_seed(1201)
    idx = cls(conf, 0).float()
    with torch.no_grad():
        idx.k_norm.weight.copy_(1 + 0.2 * torch.randn(D))
        idx.k_norm.bias.copy_(0.2 * torch.randn(D))
    idx = idx.to(device).eval()
    sd = {k: v.detach().float().cpu().numpy() for k, v in idx.state_dict().items()}
    log(f"{cls.__name__} parameters: " + ", ".join(f"{k} {list(v.shape)}" for k, v in sd.items()))
    fx.update({"wq_b": sd["wq_b.weight"], "wk": sd["wk.weight"], "k_norm_weight": sd["k_norm.weight"],
               "k_norm_bias": sd["k_norm.bias"], "weights_proj": sd["weights_proj.weight"]})

    t = lambda a, dt=torch.float32: torch.tensor(a, dtype=dt, device=device)  # noqa: E731
    x, qr, pos = t(fx["hidden"]), t(fx["q_resid"]), t(fx["positions"], torch.int64)
    cos = sin = None
    rot_cls = getattr(m, "DeepseekV32RotaryEmbedding", None)
    if rot_cls is not None:
        try:
            rot = rot_cls(conf).to(device)
            cos, sin = rot(x, pos)
            if cos.shape[-1] != ROPE:
                log(f"rotary tables {list(cos.shape)}: not {ROPE} wide; using the script's tables")
                cos = sin = None
        except Exception as e:  # noqa: BLE001
            log(f"{rot_cls.__name__} failed ({e!r}); using the script's tables")
            cos = sin = None
    if cos is None:
        c, s = own_tables(fx["positions"])
        cos, sin = t(np.concatenate([c, c], -1)), t(np.concatenate([s, s], -1))
        rope_src = "the script's float64 tables in f32"
    else:
        rope_src = f"transformers' {rot_cls.__name__}"
        # The table the fixture carries: transformers' rows at each position (32 unique cos | 32 sin).
        hc, hs = cos.float().cpu().numpy(), sin.float().cpu().numpy()
        assert np.array_equal(hc[..., :ROPE // 2], hc[..., ROPE // 2:]), "cos is not cat(freqs, freqs)"
        table = fx["cos_sin"].copy()
        for b in range(B):
            table[fx["positions"][b]] = np.concatenate([hc[b, :, :ROPE // 2], hs[b, :, :ROPE // 2]], -1)
        log(f"rope: transformers' tables vs float64 max |diff| {np.abs(table - fx['cos_sin']).max():.3e}")
        fx["cos_sin"] = table
    mask = torch.full((S, S), float("-inf"), device=device).triu(1)[None].expand(B, S, S).contiguous()

    captured = {}
    orig_method, orig_fn = torch.Tensor.topk, torch.topk

    def grab(scores, *a, **k):
        captured["scores"] = scores.detach().clone()
        return orig_method(scores, *a, **k)

    params = inspect.signature(idx.forward).parameters
    values = {"hidden_states": x, "x": x, "q_resid": qr, "qr": qr, "position_embeddings": (cos, sin),
              "freqs_cis": (cos, sin), "attention_mask": mask, "mask": mask, "position_ids": pos,
              "past_key_values": None, "cache": None}
    kwargs = {}
    for n, p in params.items():
        if n in values:
            kwargs[n] = values[n]
        elif p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise RuntimeError(f"{cls.__name__}.forward: unknown required argument {n!r} ({list(params)})")
    log(f"{cls.__name__}.forward({', '.join(kwargs)})")
    torch.Tensor.topk = grab
    torch.topk = grab
    try:
        with torch.no_grad():
            out = idx(**kwargs)
    finally:
        torch.Tensor.topk, torch.topk = orig_method, orig_fn
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    ints = [o for o in outs if torch.is_tensor(o) and not o.is_floating_point()]
    if not ints or "scores" not in captured:
        raise RuntimeError(f"no integer top-k output / no .topk call captured: {[type(o) for o in outs]}")
    sc = captured["scores"].float().cpu().numpy()
    if sc.shape != (B, S, S):
        raise RuntimeError(f"captured scores {sc.shape}, expected {(B, S, S)}")
    fx["scores"] = sc
    fx["topk"] = ints[0].cpu().numpy().astype(np.int32).reshape(B, S, -1)
    return {"generator": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
            "device": device + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""),
            "module": f"{m.__name__}.{cls.__name__}", "rope": rope_src, "dtype": "float32 (tf32 off)"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--self", action="store_true", help="no transformers: the script's own float64 reference")
    ap.add_argument("--source-out", help="write transformers' indexer class source here")
    args = ap.parse_args()
    logf = open(os.path.splitext(args.out)[0] + ".log", "w")

    def log(s):
        print(s)
        logf.write(s + "\n")
        logf.flush()

    rng = np.random.default_rng(1200)
    fx = inputs(rng)
    if args.self:
        fx.update(self_weights(rng))
        meta = {"generator": "own float64 replica (--self)"}
        fx["scores"] = own_scores(fx).astype(np.float32)
        fx["topk"] = own_topk(fx["scores"], TOPK)
    else:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        meta = hf_run(fx, device, log, args.source_out)
    own = own_scores(fx)
    hf = fx["scores"].astype(np.float64)
    fin = np.isfinite(own)
    meta.update({
        "script": "scripts/gen_indexer_fixture.py", "B": B, "S": S, "hidden": HIDDEN, "q_lora_rank": Q_LORA,
        "heads": HEADS, "head_dim": D, "index_topk": TOPK,
        "masks_equal": bool(np.array_equal(fin, np.isfinite(hf))),
        "own_vs_hf_max_abs_rel": float(np.abs(own[fin] - hf[fin]).max() / np.abs(hf[fin]).max()),
        "own_topk_sets_equal": int(sum(set(a[np.isfinite(r[a])]) == set(b[np.isfinite(r[b])])
                                       for a, b, r in zip(own_topk(own, TOPK).reshape(-1, TOPK),
                                                          fx["topk"].reshape(-1, TOPK), own.reshape(-1, S)))),
        "rows": B * S,
    })
    log(json.dumps(meta))
    fx["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(args.out, **fx)
    log(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")
    ok = meta["masks_equal"] and meta["own_vs_hf_max_abs_rel"] < 1e-5
    if not ok:
        log("WARNING: the float64 replica disagrees with the fixture's scores")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

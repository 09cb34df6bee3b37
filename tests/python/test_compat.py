# SPDX-License-Identifier: Apache-2.0
"""mla.compat.flash_mla and mla.compat.vllm with the upstream call shapes, against float64 torch
references (FlashMLA's ref.py formulation) with FlashMLA's bf16 tolerance, on every device."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (MLA_SETUP_TORCH=0)")
import mla  # noqa: E402
import mla.compat.flash_mla as flash_mla  # noqa: E402
import mla.compat.vllm as vllm_ops  # noqa: E402
from torch_util import DEVICES, assert_bf16_close, kernel_rows, ref_attention, rows_of  # noqa: E402

DS = mla.CacheFormat.fp8_ds_mla


def paged_cache(device, blocks, page, fp8, g):
    """A cache written through vLLM's concat_and_cache_mla: bf16 [blocks, page, 1, 576] or 656-byte records."""
    n = blocks * page
    kv, pe = torch.randn(n, 512, generator=g).bfloat16().to(device), torch.randn(n, 64, generator=g).bfloat16().to(device)
    if fp8:
        cache = torch.empty(blocks, page, 656, dtype=torch.uint8, device=device)
        vllm_ops.concat_and_cache_mla(kv, pe, cache, torch.arange(n, device=device), "fp8_ds_mla", None)
    else:
        cache = torch.empty(blocks, page, 576, dtype=torch.bfloat16, device=device)
        vllm_ops.concat_and_cache_mla(kv, pe, cache, torch.arange(n, device=device), "auto", None)
    return cache.unsqueeze(2), rows_of(cache, DS if fp8 else mla.CacheFormat.bf16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("s_q,h_q,page", [(1, 16, 64), (2, 128, 64), (1, 5, 16)])
def test_flash_mla_dense(device, fp8, s_q, h_q, page):
    g = torch.Generator().manual_seed(7)
    b, blocks = 3, 10
    k_cache, rows = paged_cache(device, blocks, page, fp8, g)
    table = torch.randperm(blocks, generator=g)[:b * 3].view(b, 3).to(torch.int32).to(device)
    seqlens = torch.tensor([page * 3, 1, page + 5], dtype=torch.int32, device=device)
    q = torch.randn(b, s_q, h_q, 576, generator=g).bfloat16().to(device)
    meta, num_splits = flash_mla.get_mla_metadata(seqlens, s_q * h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, num_splits, causal=True,
                                                is_fp8_kvcache=fp8)
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q) and out.dtype == torch.bfloat16
    # The oracle reads what the kernel reads (exact codes, or their bf16 upconvert), so the LSE keeps its tight
    # fp32 bound on every path.
    rows = kernel_rows(rows, DS if fp8 else mla.CacheFormat.bf16, device, "mqa_decode")
    scale = 576 ** -0.5
    for i in range(b):
        n = int(seqlens[i])
        pos = torch.arange(n)
        k = rows[table[i].cpu().long()[pos // page] * page + pos % page]
        vis = pos.view(1, -1) <= (n - s_q + torch.arange(s_q)).view(-1, 1)
        o, l = ref_attention(q[i].double().cpu(), k.expand(s_q, -1, -1), k[:, :512].expand(s_q, -1, -1), scale, vis)
        assert_bf16_close(out[i], o)
        torch.testing.assert_close(lse[i].cpu().double(), l.transpose(0, 1), rtol=1e-4, atol=1e-4)
    # the same metadata object with inconsistent arguments is refused, as FlashMLA does
    with pytest.raises(ValueError, match="inconsistent"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, None, causal=False, is_fp8_kvcache=fp8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True])
def test_flash_mla_sparse_decode(device, fp8):
    g = torch.Generator().manual_seed(3)
    b, s_q, h_q, topk, page, blocks = 2, 2, 8, 24, 16, 6
    k_cache, rows = paged_cache(device, blocks, page, fp8, g)
    extra_cache, extra_rows = paged_cache(device, 2, page, fp8, g)
    idx = torch.randint(-1, blocks * page, (b, s_q, topk), generator=g, dtype=torch.int32)
    idx[1, 1] = -1  # a query without any key
    extra_idx = torch.randint(0, 2 * page, (b, s_q, 4), generator=g, dtype=torch.int32)
    extra_idx[1, 1] = -1  # ... in neither key set
    topk_len = torch.tensor([topk, 10], dtype=torch.int32)
    sink = torch.randn(h_q, generator=g)
    q = torch.randn(b, s_q, h_q, 576, generator=g).bfloat16().to(device)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, meta, None, softmax_scale=0.07, is_fp8_kvcache=fp8, indices=idx.to(device),
        attn_sink=sink.to(device), extra_k_cache=extra_cache, extra_indices_in_kvcache=extra_idx.to(device),
        topk_length=topk_len.to(device))
    k = torch.cat([rows[idx.clamp_min(0).long()], extra_rows[extra_idx.clamp_min(0).long()]], dim=2)
    k = k.view(b * s_q, topk + 4, 576)
    valid = torch.cat([(idx >= 0) & (torch.arange(topk).view(1, 1, -1) < topk_len.view(b, 1, 1)),
                       extra_idx >= 0], dim=2).view(b * s_q, -1)
    o, l = ref_attention(q.double().cpu().view(b * s_q, h_q, 576), k, k[..., :512], 0.07, valid)
    o = o * torch.sigmoid(l - sink.double().view(1, -1)).unsqueeze(-1)
    assert_bf16_close(out.view(b * s_q, h_q, 512), o)
    torch.testing.assert_close(lse.cpu().double(), l.view(b, s_q, h_q).transpose(1, 2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_mla_sparse_fwd(device):
    g = torch.Generator().manual_seed(5)
    s_q, s_kv, h_q, topk = 6, 200, 16, 32
    q = torch.randn(s_q, h_q, 576, generator=g).bfloat16().to(device)
    kv = torch.randn(s_kv, 1, 576, generator=g).bfloat16().to(device)
    idx = torch.randint(-1, s_kv + 20, (s_q, 1, topk), generator=g, dtype=torch.int32)
    idx[2] = -1
    sink = torch.tensor([float("-inf"), float("inf")] + [0.5] * (h_q - 2))
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, idx.to(device), 0.05, attn_sink=sink.to(device))
    i = idx.squeeze(1)
    valid = (i >= 0) & (i < s_kv)
    k = kv.squeeze(1).double().cpu()[torch.where(valid, i, 0).long()]
    o, l = ref_attention(q.double().cpu(), k, k[..., :512], 0.05, valid)
    o = o * torch.sigmoid(l - sink.double().view(1, -1)).nan_to_num(nan=0.0).unsqueeze(-1)  # row 2: no key, out 0
    assert_bf16_close(out, o)
    assert bool((out[2] == 0).all()) and bool((out[:, 1] == 0).all())
    torch.testing.assert_close(lse.cpu().double(), l, rtol=1e-4, atol=1e-4)
    logits = torch.einsum("thd,tkd->thk", q.double().cpu(), k) * 0.05
    ref_max = logits.masked_fill(~valid.unsqueeze(1), float("-inf")).amax(-1)
    torch.testing.assert_close(max_logits.cpu().double(), ref_max, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_ops(device):
    g = torch.Generator().manual_seed(11)
    page, blocks = 16, 6
    cache, rows = paged_cache(device, blocks, page, True, g)
    cache = cache.squeeze(2)
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32, device=device)
    cu = torch.tensor([0, 20, 30], dtype=torch.int32, device=device)
    starts = torch.tensor([3, 0], dtype=torch.int32, device=device)
    slot = lambda b, p: int(table[b, p // page]) * page + p % page  # noqa: E731
    # gather with dequantisation (bf16 destination)
    dst = torch.full((40, 576), float("nan"), dtype=torch.bfloat16, device=device)
    vllm_ops.gather_and_maybe_dequant_cache(cache, dst, table, cu, None, 30, "fp8_ds_mla", None, starts)
    ref = torch.stack([rows[slot(0, 3 + i)] for i in range(20)] + [rows[slot(1, i)] for i in range(10)])
    assert_bf16_close(dst[:30], ref)
    assert dst[30:].isnan().all()
    # raw records
    raw = torch.zeros(30, 656, dtype=torch.uint8, device=device)
    vllm_ops.cp_gather_cache(cache, raw, table, cu, 2, starts)
    flat = cache.reshape(-1, 656)
    assert torch.equal(raw[0], flat[slot(0, 3)]) and torch.equal(raw[29], flat[slot(1, 9)])
    # upconvert for the sparse prefill workspace
    ws = torch.empty(30, 576, dtype=torch.bfloat16, device=device)
    vllm_ops.cp_gather_and_upconvert_fp8_kv_cache(cache, ws, table, torch.tensor([20, 10], device=device),
                                                  torch.tensor([0, 20], dtype=torch.int32, device=device), 2)
    assert_bf16_close(ws[21], rows[slot(1, 1)])
    # merge
    T, H, D = 5, 4, 8
    p, s = torch.randn(T, H, D, device=device), torch.randn(T, H, D, device=device)
    pl, sl = torch.randn(H, T, device=device), torch.randn(H, T, device=device)
    out, out_lse = torch.empty(T, H, D, device=device), torch.empty(H, T, device=device)
    vllm_ops.merge_attn_states(out, p, pl, s, sl, out_lse, prefill_tokens_with_context=3)
    m = torch.logaddexp(pl, sl)
    ref = p * torch.exp(pl - m).T.unsqueeze(-1) + s * torch.exp(sl - m).T.unsqueeze(-1)
    torch.testing.assert_close(out[:3], ref[:3], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[3:], s[3:])
    torch.testing.assert_close(out_lse[:, 3:], sl[:, 3:])
    # index conversion
    req = torch.tensor([0, 1], dtype=torch.int32, device=device)
    idx = torch.tensor([[0, 17, -1, 47], [5, 48, 33, 2]], dtype=torch.int32, device=device)
    conv, counts = vllm_ops.triton_convert_req_index_to_global_index(req, table, idx, BLOCK_SIZE=page,
                                                                     NUM_TOPK_TOKENS=4, return_valid_counts=True)
    expect = [[slot(0, 0), slot(0, 17), -1, slot(0, 47)], [slot(1, 5), -1, slot(1, 33), slot(1, 2)]]
    assert conv.cpu().tolist() == expect and counts.cpu().tolist() == [3, 3]
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        vllm_ops.concat_and_cache_mla(dst[:1, :512], dst[:1, 512:], cache, req[:1].long(), "int4", None)

# SPDX-License-Identifier: Apache-2.0
"""Type stub of mla._mla, the native extension behind the `mla` package (docs/PYTHON.md).

Generated from the module by `PYTHONPATH=build/python python3 tests/python/test_stub.py --write`;
tests/python/test_stub.py checks it against the module. TensorLike: a torch.Tensor, NumPy array (CPU),
mla.Tensor or any object with __dlpack__ (zero copy)."""
from typing import Any, ClassVar, Dict, List, Optional, Tuple, overload

TensorLike = Any

class BatchDesc:
    """One step's batch as the scheduler gives it: query_start_loc [R + 1] and seq_lens [R] (requests ordered decodes first), num_tokens, decode_seq_len_bound."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def decode_seq_len_bound(self) -> int:
        ...
    @decode_seq_len_bound.setter
    def decode_seq_len_bound(self, value: int) -> None: ...
    @property
    def num_tokens(self) -> int:
        ...
    @num_tokens.setter
    def num_tokens(self, value: int) -> None: ...
    @property
    def query_start_loc(self) -> List[int]:
        ...
    @query_start_loc.setter
    def query_start_loc(self, value: List[int]) -> None: ...
    @property
    def seq_lens(self) -> List[int]:
        ...
    @seq_lens.setter
    def seq_lens(self, value: List[int]) -> None: ...

class CacheFormat:
    """Members:
    
    bf16
    
    fp8
    
    fp8_ds_mla
    
    f64
    
    v4
    
    v41
    
    v41_fp4"""
    bf16: ClassVar[CacheFormat]
    fp8: ClassVar[CacheFormat]
    fp8_ds_mla: ClassVar[CacheFormat]
    f64: ClassVar[CacheFormat]
    v4: ClassVar[CacheFormat]
    v41: ClassVar[CacheFormat]
    v41_fp4: ClassVar[CacheFormat]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class Checkpoint:
    """A checkpoint directory (model.safetensors.index.json or its *.safetensors), read-only."""
    def __init__(self, dir: str) -> None:
        ...
    @property
    def dir(self) -> str:
        ...
    def dtype(self, name: str) -> str:
        """The dtype name of a tensor as stored (e.g. 'bf16', 'fp8_e4m3')."""
    def has(self, name: str) -> bool:
        """Whether the checkpoint has a tensor of this name."""
    def load(self, name: str, dtype: Any) -> Any:
        """A host copy of the tensor converted to dtype (mla.Tensor)."""
    def names(self) -> List[str]:
        """Every tensor name of the checkpoint."""
    def shape(self, name: str) -> List[int]:
        """The shape of a tensor (list of ints)."""

class Communicator:
    """One rank's handle on a DCP group (mla/comm.h). Every rank calls the same collectives in the same order; a rank that fails or stays away makes the others raise ValueError within the group's timeout."""
    def __init__(*args: Any, **kwargs: Any) -> Any:
        """Initialize self.  See help(type(self)) for accurate signature."""

    def all_gather(self, input: TensorLike, output: TensorLike, *, stream: Any = ...) -> None:
        """output [W * n] = every rank's input [n] in rank order (contiguous, one dtype, the group's device)."""
    def all_to_all(self, input: TensorLike, output: TensorLike, *, stream: Any = ...) -> None:
        """input and output [W * n]: block j of rank i's input becomes block i of rank j's output."""
    @property
    def backend(self) -> str:
        ...
    @property
    def device(self) -> Device:
        ...
    @property
    def rank(self) -> int:
        ...
    def reduce_scatter(self, input: TensorLike, output: TensorLike, *, stream: Any = ...) -> None:
        """output [n] = the sum over ranks of block `rank` of their input [W * n]; f32 or bf16 (CPU groups: f64 too)."""
    def synchronize(self, *, stream: Any = ...) -> None:
        """Wait until every collective this rank issued (CUDA: its stream work) completed, or raise ValueError after the group's timeout."""
    @property
    def world_size(self) -> int:
        ...

class ContextChunk:
    """One chunk of chunked-context prefill: per prefill, seq_starts and lens of the context rows it gathers."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def cu_seq_lens(self) -> List[int]:
        ...
    @cu_seq_lens.setter
    def cu_seq_lens(self, value: List[int]) -> None: ...
    @property
    def lens(self) -> List[int]:
        ...
    @lens.setter
    def lens(self, value: List[int]) -> None: ...
    @property
    def max_len(self) -> int:
        ...
    @max_len.setter
    def max_len(self, value: int) -> None: ...
    @property
    def seq_starts(self) -> List[int]:
        ...
    @seq_starts.setter
    def seq_starts(self, value: List[int]) -> None: ...
    @property
    def total(self) -> int:
        ...
    @total.setter
    def total(self, value: int) -> None: ...

class ContextPlan:
    """plan_context_chunks' result: chunk_size and the chunks."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def chunk_size(self) -> int:
        ...
    @chunk_size.setter
    def chunk_size(self, value: int) -> None: ...
    @property
    def chunks(self) -> List[ContextChunk]:
        ...
    @chunks.setter
    def chunks(self, value: List[ContextChunk]) -> None: ...

DECODE_MAX_SPLITS: int

class DType:
    """Members:
    
    f32
    
    f64
    
    bf16
    
    f16
    
    fp8_e4m3
    
    u8
    
    i32
    
    i64"""
    f32: ClassVar[DType]
    f64: ClassVar[DType]
    bf16: ClassVar[DType]
    f16: ClassVar[DType]
    fp8_e4m3: ClassVar[DType]
    u8: ClassVar[DType]
    i32: ClassVar[DType]
    i64: ClassVar[DType]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class DcpExchange:
    """How dcp_mqa_decode combines the ranks' partial outputs (mla/dcp.h).
    
    Members:
    
      all_to_all
    
      allgather_reduce_scatter
    
      all_to_all_overlap"""
    all_to_all: ClassVar[DcpExchange]
    allgather_reduce_scatter: ClassVar[DcpExchange]
    all_to_all_overlap: ClassVar[DcpExchange]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class DcpLayout:
    """This rank's place in a DCP group (mla/dcp.h)."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def interleave(self) -> int:
        ...
    @interleave.setter
    def interleave(self, value: int) -> None: ...
    @property
    def rank(self) -> int:
        ...
    @rank.setter
    def rank(self, value: int) -> None: ...
    @property
    def world_size(self) -> int:
        ...
    @world_size.setter
    def world_size(self, value: int) -> None: ...

class DecodeRun:
    """One run of a decode schedule: requests req_begin .. req_end with s_q query tokens each."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def block_cols(self) -> int:
        ...
    @block_cols.setter
    def block_cols(self, value: int) -> None: ...
    @property
    def num_splits(self) -> int:
        ...
    @num_splits.setter
    def num_splits(self, value: int) -> None: ...
    @property
    def req_begin(self) -> int:
        ...
    @req_begin.setter
    def req_begin(self, value: int) -> None: ...
    @property
    def req_end(self) -> int:
        ...
    @req_end.setter
    def req_end(self, value: int) -> None: ...
    @property
    def s_q(self) -> int:
        ...
    @s_q.setter
    def s_q(self, value: int) -> None: ...
    @property
    def token_begin(self) -> int:
        ...
    @token_begin.setter
    def token_begin(self, value: int) -> None: ...
    @property
    def whole_requests(self) -> bool:
        ...
    @whole_requests.setter
    def whole_requests(self, value: bool) -> None: ...

class DecodeSchedule:
    """plan_decode_schedule's result: the runs of the decode part."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def runs(self) -> List[DecodeRun]:
        ...
    @runs.setter
    def runs(self, value: List[DecodeRun]) -> None: ...

class DeepseekAttention:
    """The whole DeepSeek attention block of one layer (hidden states in, the rank's o_proj output out); docs/BLOCK.md."""
    def __init__(self, config: DeepseekConfig, weights: dict, options: DeepseekOptions = ...) -> None:
        ...
    @property
    def config(self) -> DeepseekConfig:
        ...
    def forward(self, plan: Plan, cache: KVCache, workspace: TensorLike, *, hidden: TensorLike, positions: TensorLike, slot_mapping: TensorLike, block_table: TensorLike, seq_lens: TensorLike, out: TensorLike, topk_indices: TensorLike = ..., metadata: TensorLike = ..., precision: Precision = ...) -> None:
        """Run one step: writes the cache at slot_mapping and out [T, hidden_size] (this rank's o_proj partial sum)."""
    @property
    def layer_options(self) -> LayerOptions:
        ...
    @staticmethod
    def load(checkpoint: Checkpoint, config: DeepseekConfig, layer: int, options: DeepseekOptions = ...) -> DeepseekAttention:
        ...
    def max_workspace_bytes(self, config: PlannerConfig, max_num_tokens: int) -> int:
        """Bytes of a workspace that serves every plan of `config` with at most max_num_tokens tokens."""
    @property
    def options(self) -> DeepseekOptions:
        ...
    def planner_config(self) -> PlannerConfig:
        """Planner settings matching the block (one rank's dims, cache format, sparse; on CUDA the device's SM count and compute capability); set the serving limits (page size, max_model_len, ...) yourself."""
    def projection_is_fp8(self, name: str) -> bool:
        """True when the projection runs w8a8 (fp8_activations and a block-aligned rank slice)."""
    def workspace_bytes(self, plan: Plan) -> int:
        """Bytes of the u8 workspace forward() needs for `plan`."""

class DeepseekConfig:
    """DeepSeek V2 / V3 attention configuration (config.json): from_file, from_json, preset."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    def dims(self, tp: int = ...) -> ModelDims:
        """The MLA ModelDims of one tensor-parallel rank of `tp`."""
    @property
    def fp8_weights(self) -> bool:
        ...
    @fp8_weights.setter
    def fp8_weights(self, value: bool) -> None: ...
    @staticmethod
    def from_file(path: str) -> DeepseekConfig:
        ...
    @staticmethod
    def from_json(text: str) -> DeepseekConfig:
        ...
    @property
    def has_yarn(self) -> bool:
        ...
    @has_yarn.setter
    def has_yarn(self, value: bool) -> None: ...
    @property
    def hidden_size(self) -> int:
        ...
    @hidden_size.setter
    def hidden_size(self, value: int) -> None: ...
    @property
    def index_topk(self) -> int:
        ...
    @index_topk.setter
    def index_topk(self, value: int) -> None: ...
    @property
    def kv_lora_rank(self) -> int:
        ...
    @kv_lora_rank.setter
    def kv_lora_rank(self, value: int) -> None: ...
    @property
    def model_type(self) -> str:
        ...
    @model_type.setter
    def model_type(self, value: str) -> None: ...
    @property
    def num_attention_heads(self) -> int:
        ...
    @num_attention_heads.setter
    def num_attention_heads(self, value: int) -> None: ...
    @staticmethod
    def preset(name: str) -> DeepseekConfig:
        ...
    @property
    def q_lora_rank(self) -> int:
        ...
    @q_lora_rank.setter
    def q_lora_rank(self, value: int) -> None: ...
    @property
    def qk_nope_head_dim(self) -> int:
        ...
    @qk_nope_head_dim.setter
    def qk_nope_head_dim(self, value: int) -> None: ...
    @property
    def qk_rope_head_dim(self) -> int:
        ...
    @qk_rope_head_dim.setter
    def qk_rope_head_dim(self, value: int) -> None: ...
    @property
    def rms_norm_eps(self) -> float:
        ...
    @rms_norm_eps.setter
    def rms_norm_eps(self, value: float) -> None: ...
    @property
    def rope_interleave(self) -> bool:
        ...
    @rope_interleave.setter
    def rope_interleave(self, value: bool) -> None: ...
    @property
    def rope_theta(self) -> float:
        ...
    @rope_theta.setter
    def rope_theta(self, value: float) -> None: ...
    def softmax_scale(self) -> float:
        """qk_head_dim^-0.5 times yarn_mscale(factor, mscale_all_dim)^2 (the correction only when mscale_all_dim is set)."""
    @property
    def v_head_dim(self) -> int:
        ...
    @v_head_dim.setter
    def v_head_dim(self, value: int) -> None: ...
    @property
    def weight_block_cols(self) -> int:
        ...
    @weight_block_cols.setter
    def weight_block_cols(self, value: int) -> None: ...
    @property
    def weight_block_rows(self) -> int:
        ...
    @weight_block_rows.setter
    def weight_block_rows(self, value: int) -> None: ...
    @property
    def yarn_beta_fast(self) -> float:
        ...
    @yarn_beta_fast.setter
    def yarn_beta_fast(self, value: float) -> None: ...
    @property
    def yarn_beta_slow(self) -> float:
        ...
    @yarn_beta_slow.setter
    def yarn_beta_slow(self, value: float) -> None: ...
    @property
    def yarn_factor(self) -> float:
        ...
    @yarn_factor.setter
    def yarn_factor(self, value: float) -> None: ...
    @property
    def yarn_mscale(self) -> float:
        ...
    @yarn_mscale.setter
    def yarn_mscale(self, value: float) -> None: ...
    @property
    def yarn_mscale_all_dim(self) -> float:
        ...
    @yarn_mscale_all_dim.setter
    def yarn_mscale_all_dim(self, value: float) -> None: ...
    @property
    def yarn_original_max_position_embeddings(self) -> int:
        ...
    @yarn_original_max_position_embeddings.setter
    def yarn_original_max_position_embeddings(self, value: int) -> None: ...

class DeepseekOptions:
    """Options of a DeepseekAttention block: tp and rank, cache format, sparse, ds_scale, device, dtype (bf16, f32 or f64; CUDA bf16), fp8_activations, fp8_prefill and fp8_prefill_scales (keyword constructor)."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def cache_format(self) -> CacheFormat:
        ...
    @cache_format.setter
    def cache_format(self, value: CacheFormat) -> None: ...
    @property
    def device(self) -> Device:
        ...
    @device.setter
    def device(self, value: Device) -> None: ...
    @property
    def ds_scale(self) -> DsMlaScale:
        ...
    @ds_scale.setter
    def ds_scale(self, value: DsMlaScale) -> None: ...
    @property
    def dtype(self) -> DType:
        ...
    @dtype.setter
    def dtype(self, value: DType) -> None: ...
    @property
    def fp8_activations(self) -> bool:
        ...
    @fp8_activations.setter
    def fp8_activations(self, value: bool) -> None: ...
    @property
    def fp8_prefill(self) -> bool:
        ...
    @fp8_prefill.setter
    def fp8_prefill(self, value: bool) -> None: ...
    @property
    def fp8_prefill_scales(self) -> tuple:
        ...
    @fp8_prefill_scales.setter
    def fp8_prefill_scales(self, value: tuple) -> None: ...
    @property
    def rank(self) -> int:
        ...
    @rank.setter
    def rank(self, value: int) -> None: ...
    @property
    def sparse(self) -> bool:
        ...
    @sparse.setter
    def sparse(self, value: bool) -> None: ...
    @property
    def tp(self) -> int:
        ...
    @tp.setter
    def tp(self, value: int) -> None: ...

class DeepseekV4Attention:
    """The whole DeepSeek-V4 / V4.1 attention block of one layer (hidden states in, the rank's o_b_proj output out); docs/SEMANTICS.md section 17."""
    def __init__(self, config: DeepseekV4Config, layer: int, weights: dict, options: DeepseekV4Options = ...) -> None:
        ...
    @property
    def compress_ratio(self) -> int:
        ...
    @property
    def config(self) -> DeepseekV4Config:
        ...
    def forward(self, cache: KVCache, extra_cache: Any, workspace: TensorLike, *, hidden: TensorLike, positions: TensorLike, req_id: TensorLike, block_table: TensorLike, slot_mapping: TensorLike, out: TensorLike, extra_kv: TensorLike = ..., extra_slot_mapping: TensorLike = ..., extra_block_table: TensorLike = ..., extra_topk: TensorLike = ..., precision: Precision = ...) -> None:
        """Run one step: writes the window cache at slot_mapping, the extra cache's compressed rows extra_kv at extra_slot_mapping, and out [T, hidden_size] (this rank's o_b_proj partial sum). extra_cache: None for a layer of ratio 0."""
    @property
    def heads(self) -> int:
        ...
    @property
    def layer(self) -> int:
        ...
    @staticmethod
    def load(checkpoint: Checkpoint, config: DeepseekV4Config, layer: int, options: DeepseekV4Options = ...) -> DeepseekV4Attention:
        ...
    @property
    def options(self) -> DeepseekV4Options:
        ...
    def workspace_bytes(self, num_tokens: int, extra_topk: int = ...) -> int:
        """Bytes of the u8 workspace forward() needs for num_tokens tokens with extra_topk rows extra_topk wide."""

class DeepseekV4Config:
    """DeepSeek-V4 / V4.1 attention configuration (config.json): from_file, from_json, preset ('v4-flash', 'v4-pro', 'v41-flash'); docs/SEMANTICS.md section 17."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    def compress_ratio(self, layer: int) -> int:
        """The layer's compression ratio: 0 (sliding window only), 4 (top-k picks), 128 (every causal entry)."""
    @property
    def compress_ratios(self) -> List[int]:
        ...
    @compress_ratios.setter
    def compress_ratios(self, value: List[int]) -> None: ...
    @property
    def compress_rope_theta(self) -> float:
        ...
    @compress_rope_theta.setter
    def compress_rope_theta(self, value: float) -> None: ...
    @property
    def compress_yarn(self) -> bool:
        ...
    @compress_yarn.setter
    def compress_yarn(self, value: bool) -> None: ...
    @property
    def fp8_weights(self) -> bool:
        ...
    @fp8_weights.setter
    def fp8_weights(self, value: bool) -> None: ...
    @staticmethod
    def from_file(path: str) -> DeepseekV4Config:
        ...
    @staticmethod
    def from_json(text: str) -> DeepseekV4Config:
        ...
    @property
    def head_dim(self) -> int:
        ...
    @head_dim.setter
    def head_dim(self, value: int) -> None: ...
    @property
    def hidden_size(self) -> int:
        ...
    @hidden_size.setter
    def hidden_size(self, value: int) -> None: ...
    @property
    def index_topk(self) -> int:
        ...
    @index_topk.setter
    def index_topk(self, value: int) -> None: ...
    @staticmethod
    def is_v4_file(path: str) -> bool:
        """Whether a config.json file describes a DeepSeek-V4 model (model_type deepseek_v4*)."""
    @property
    def model_type(self) -> str:
        ...
    @model_type.setter
    def model_type(self, value: str) -> None: ...
    @property
    def num_attention_heads(self) -> int:
        ...
    @num_attention_heads.setter
    def num_attention_heads(self, value: int) -> None: ...
    @property
    def o_groups(self) -> int:
        ...
    @o_groups.setter
    def o_groups(self, value: int) -> None: ...
    @property
    def o_lora_rank(self) -> int:
        ...
    @o_lora_rank.setter
    def o_lora_rank(self, value: int) -> None: ...
    @staticmethod
    def preset(name: str) -> DeepseekV4Config:
        ...
    @property
    def q_head_norm(self) -> bool:
        ...
    @q_head_norm.setter
    def q_head_norm(self, value: bool) -> None: ...
    @property
    def q_lora_rank(self) -> int:
        ...
    @q_lora_rank.setter
    def q_lora_rank(self, value: int) -> None: ...
    @property
    def qk_rope_head_dim(self) -> int:
        ...
    @qk_rope_head_dim.setter
    def qk_rope_head_dim(self, value: int) -> None: ...
    @property
    def rms_norm_eps(self) -> float:
        ...
    @rms_norm_eps.setter
    def rms_norm_eps(self, value: float) -> None: ...
    @property
    def rope_theta(self) -> float:
        ...
    @rope_theta.setter
    def rope_theta(self, value: float) -> None: ...
    @property
    def sliding_window(self) -> int:
        ...
    @sliding_window.setter
    def sliding_window(self, value: int) -> None: ...
    def softmax_scale(self) -> float:
        """head_dim^-0.5."""
    def validate(self) -> None:
        """Raises on inconsistent dimensions."""
    @property
    def weight_block_cols(self) -> int:
        ...
    @weight_block_cols.setter
    def weight_block_cols(self, value: int) -> None: ...
    @property
    def weight_block_rows(self) -> int:
        ...
    @weight_block_rows.setter
    def weight_block_rows(self, value: int) -> None: ...
    @property
    def yarn_beta_fast(self) -> float:
        ...
    @yarn_beta_fast.setter
    def yarn_beta_fast(self, value: float) -> None: ...
    @property
    def yarn_beta_slow(self) -> float:
        ...
    @yarn_beta_slow.setter
    def yarn_beta_slow(self, value: float) -> None: ...
    @property
    def yarn_factor(self) -> float:
        ...
    @yarn_factor.setter
    def yarn_factor(self, value: float) -> None: ...
    @property
    def yarn_original_max_position_embeddings(self) -> int:
        ...
    @yarn_original_max_position_embeddings.setter
    def yarn_original_max_position_embeddings(self, value: int) -> None: ...

class DeepseekV4Options:
    """Options of a DeepseekV4Attention block: tp and rank, cache_format (the window cache) and extra_cache_format (the compressed cache), device, dtype (bf16, f32 or f64; CUDA bf16) (keyword constructor)."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def cache_format(self) -> CacheFormat:
        ...
    @cache_format.setter
    def cache_format(self, value: CacheFormat) -> None: ...
    @property
    def device(self) -> Device:
        ...
    @device.setter
    def device(self, value: Device) -> None: ...
    @property
    def dtype(self) -> DType:
        ...
    @dtype.setter
    def dtype(self, value: DType) -> None: ...
    @property
    def extra_cache_format(self) -> CacheFormat:
        ...
    @extra_cache_format.setter
    def extra_cache_format(self, value: CacheFormat) -> None: ...
    @property
    def rank(self) -> int:
        ...
    @rank.setter
    def rank(self, value: int) -> None: ...
    @property
    def tp(self) -> int:
        ...
    @tp.setter
    def tp(self, value: int) -> None: ...

class Device:
    """A device: mla.Device('cpu'), mla.Device('cuda:1'); equal to another of the same type and index."""
    def __init__(self, spec: Any) -> None:
        ...
    @property
    def index(self) -> int:
        ...
    @property
    def type(self) -> str:
        ...

class DsMlaScale:
    """Members:
    
    amax
    
    pow2"""
    amax: ClassVar[DsMlaScale]
    pow2: ClassVar[DsMlaScale]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

INDEXER_ENTRY_BYTES: int

INDEXER_HEADS: int

INDEXER_HEAD_DIM: int

INDEXER_TOPK: int

class IndexerKCache:
    """Indexer K cache u8 [num_blocks, page_size, 132] (SoA per block); holds it alive."""
    def __init__(self, data: TensorLike) -> None:
        ...
    @property
    def data(self) -> Any:
        ...
    @property
    def num_blocks(self) -> int:
        ...
    @property
    def num_slots(self) -> int:
        ...
    @property
    def page_size(self) -> int:
        ...
    def validate(self) -> None:
        """Check the descriptor against its tensor; raises ValueError."""

class IndexerScale:
    """How indexer_write_k picks a token's scale (mla/indexer.h)
    
    Members:
    
      ue8m0
    
      amax"""
    ue8m0: ClassVar[IndexerScale]
    amax: ClassVar[IndexerScale]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class KVCache:
    """Descriptor of one layer's paged latent cache; holds its tensor alive."""
    def __init__(self, data: TensorLike, format: CacheFormat = ..., scale: float = ..., d_qk: int = ..., d_rope: int = ...) -> None:
        ...
    @property
    def d_latent(self) -> int:
        ...
    @property
    def d_qk(self) -> int:
        ...
    @property
    def d_rope(self) -> int:
        ...
    @property
    def data(self) -> Any:
        ...
    @property
    def format(self) -> CacheFormat:
        ...
    @property
    def num_blocks(self) -> int:
        ...
    @property
    def num_slots(self) -> int:
        ...
    @property
    def page_size(self) -> int:
        ...
    @property
    def scale(self) -> float:
        ...
    def validate(self) -> None:
        """Check the descriptor against its tensor (shape [blocks, page, row], dtype, strides); raises ValueError."""

class KvScales:
    """Where an fp8 cache's scale comes from (LayerOptions.kv_scales; docs/SEMANTICS.md §16).
    
    Members:
    
      fixed
    
      from_first_batch"""
    fixed: ClassVar[KvScales]
    from_first_batch: ClassVar[KvScales]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class LayerOptions:
    """Options of an MlaAttention layer: dims, sparse, cache format, device, dtype of weights and activations (keyword constructor)."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def batch_invariant(self) -> bool:
        ...
    @batch_invariant.setter
    def batch_invariant(self, value: bool) -> None: ...
    @property
    def cache_format(self) -> CacheFormat:
        ...
    @cache_format.setter
    def cache_format(self, value: CacheFormat) -> None: ...
    @property
    def device(self) -> Device:
        ...
    @device.setter
    def device(self, value: Device) -> None: ...
    @property
    def dims(self) -> ModelDims:
        ...
    @dims.setter
    def dims(self, value: ModelDims) -> None: ...
    @property
    def ds_scale(self) -> DsMlaScale:
        ...
    @ds_scale.setter
    def ds_scale(self, value: DsMlaScale) -> None: ...
    @property
    def dtype(self) -> DType:
        ...
    @dtype.setter
    def dtype(self, value: DType) -> None: ...
    @property
    def fp8_prefill(self) -> bool:
        ...
    @fp8_prefill.setter
    def fp8_prefill(self, value: bool) -> None: ...
    @property
    def fp8_prefill_scales(self) -> tuple:
        ...
    @fp8_prefill_scales.setter
    def fp8_prefill_scales(self, value: tuple) -> None: ...
    @property
    def kv_scales(self) -> KvScales:
        ...
    @kv_scales.setter
    def kv_scales(self, value: KvScales) -> None: ...
    @property
    def out_quant(self) -> OutputQuant:
        ...
    @out_quant.setter
    def out_quant(self, value: OutputQuant) -> None: ...
    @property
    def out_scale(self) -> float:
        ...
    @out_scale.setter
    def out_scale(self, value: float) -> None: ...
    @property
    def sparse(self) -> bool:
        ...
    @sparse.setter
    def sparse(self, value: bool) -> None: ...

class MlaAttention:
    """One MLA attention layer (RoPE'd q, kv_c, k_pe in; attention output before o_proj out)."""
    def __init__(self, options: LayerOptions, kv_b_proj_weight: TensorLike, dcp_comm: Communicator = ...) -> None:
        """dcp_comm: this rank's mla.Communicator of a DCP group (docs/SCALE.md): options.dims.num_heads are the rank's heads, kv_b_proj_weight their rows, and plans come from a PlannerConfig with dcp set."""
    def forward(self, plan: Plan, cache: KVCache, workspace: TensorLike, *, q: TensorLike, kv_c: TensorLike, k_pe: TensorLike, slot_mapping: TensorLike, block_table: TensorLike, seq_lens: TensorLike, out: TensorLike, topk_indices: TensorLike = ..., metadata: TensorLike = ..., out_scales: TensorLike = ..., stream: Any = ..., precision: Precision = ...) -> None:
        """Run one step (mla/layer.h ForwardArgs): writes the cache at slot_mapping and out [T, h_q * V]; with options.out_quant, out holds the codes (fp8_e4m3 / u8 [T_out, h_q * V], nvfp4 u8 [T_out, h_q * V / 2], T_out >= the actual tokens) and out_scales the scales (group keys f32 [h_q * V / G, T_out], nvfp4 e4m3 [T_out, h_q * V / 16])."""
    @property
    def kv_scale(self) -> Optional[float]:
        ...
    def max_workspace_bytes(self, config: PlannerConfig, max_num_tokens: int) -> int:
        """Bytes of a workspace that serves every plan of `config` with at most max_num_tokens tokens."""
    @property
    def options(self) -> LayerOptions:
        ...
    @property
    def w_kv_b(self) -> Any:
        ...
    @property
    def w_uk_t(self) -> Any:
        ...
    @property
    def w_uv(self) -> Any:
        ...
    def workspace_bytes(self, plan: Plan) -> int:
        """Bytes of the u8 workspace forward() needs for `plan`."""

class ModelDims:
    """DeepSeek MLA dimensions for one tensor-parallel rank."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    def d_qk(self) -> int:
        """Query / key width of the absorbed (MQA) path: kv_lora_rank + qk_rope_head_dim (576)."""
    def d_qk_mha(self) -> int:
        """Query / key width of the MHA prefill path: qk_nope_head_dim + qk_rope_head_dim (192)."""
    def d_v(self) -> int:
        """Value width of the absorbed path: kv_lora_rank (512)."""
    @staticmethod
    def deepseek_v2_lite(tp: int = ...) -> ModelDims:
        ...
    @staticmethod
    def deepseek_v3(tp: int = ...) -> ModelDims:
        ...
    @staticmethod
    def deepseek_v32(tp: int = ...) -> ModelDims:
        ...
    @property
    def index_topk(self) -> int:
        ...
    @index_topk.setter
    def index_topk(self, value: int) -> None: ...
    @property
    def kv_lora_rank(self) -> int:
        ...
    @kv_lora_rank.setter
    def kv_lora_rank(self, value: int) -> None: ...
    @property
    def name(self) -> str:
        ...
    @name.setter
    def name(self, value: str) -> None: ...
    @property
    def num_heads(self) -> int:
        ...
    @num_heads.setter
    def num_heads(self, value: int) -> None: ...
    @staticmethod
    def preset(name: str, tp: int = ...) -> ModelDims:
        ...
    @property
    def qk_nope_head_dim(self) -> int:
        ...
    @qk_nope_head_dim.setter
    def qk_nope_head_dim(self, value: int) -> None: ...
    @property
    def qk_rope_head_dim(self) -> int:
        ...
    @qk_rope_head_dim.setter
    def qk_rope_head_dim(self, value: int) -> None: ...
    @property
    def softmax_scale(self) -> float:
        ...
    @softmax_scale.setter
    def softmax_scale(self, value: float) -> None: ...
    @property
    def v_head_dim(self) -> int:
        ...
    @v_head_dim.setter
    def v_head_dim(self, value: int) -> None: ...
    def validate(self) -> None:
        """Check the dimensions; raises ValueError naming the bad one."""

class OutputQuant:
    """Format of the layer's output (LayerOptions.out_quant; docs/SEMANTICS.md §15).
    
    Members:
    
      none
    
      fp8
    
      fp8_group128
    
      fp8_group64
    
      nvfp4"""
    none: ClassVar[OutputQuant]
    fp8: ClassVar[OutputQuant]
    fp8_group128: ClassVar[OutputQuant]
    fp8_group64: ClassVar[OutputQuant]
    nvfp4: ClassVar[OutputQuant]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class Plan:
    """One step's plan (make_plan); read-only. Nested objects (config, split, context, ...) are references: editing them voids the seal and MlaAttention.forward refuses the plan."""
    def __init__(*args: Any, **kwargs: Any) -> Any:
        """Initialize self.  See help(type(self)) for accurate signature."""

    @property
    def config(self) -> PlannerConfig:
        ...
    @property
    def context(self) -> ContextPlan:
        ...
    @property
    def decode(self) -> DecodeSchedule:
        ...
    @property
    def decode_query_len(self) -> int:
        ...
    def has_decode(self) -> bool:
        """Whether the step has decode tokens."""
    def has_prefill(self) -> bool:
        """Whether the step has prefill tokens."""
    @property
    def max_decode_seq_len(self) -> int:
        ...
    @property
    def max_prefill_query_len(self) -> int:
        ...
    @property
    def max_prefill_seq_len(self) -> int:
        ...
    @property
    def metadata(self) -> StepMetadata:
        ...
    @property
    def num_actual_tokens(self) -> int:
        ...
    @property
    def num_reqs(self) -> int:
        ...
    @property
    def num_tokens(self) -> int:
        ...
    @property
    def prefill_context_lens(self) -> List[int]:
        ...
    @property
    def prefill_query_start_loc(self) -> List[int]:
        ...
    @property
    def prefill_request_id(self) -> List[int]:
        ...
    @property
    def prefill_seq_lens(self) -> List[int]:
        ...
    @property
    def prefill_tokens_with_context(self) -> int:
        ...
    @property
    def query_start_loc(self) -> List[int]:
        ...
    @property
    def req_id_per_token(self) -> List[int]:
        ...
    @property
    def seal(self) -> int:
        ...
    @property
    def seq_lens(self) -> List[int]:
        ...
    @property
    def sparse_chunks(self) -> List[SparsePrefillChunk]:
        ...
    @property
    def sparse_mixed_batch(self) -> bool:
        ...
    @property
    def split(self) -> Split:
        ...

class PlannerConfig:
    """What the planner needs to know about the layer and device: dims, cache format, page size, thresholds, num_sms, compute capability, DCP layout (keyword constructor)."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def batch_invariant(self) -> bool:
        ...
    @batch_invariant.setter
    def batch_invariant(self, value: bool) -> None: ...
    @property
    def cache_format(self) -> CacheFormat:
        ...
    @cache_format.setter
    def cache_format(self, value: CacheFormat) -> None: ...
    @property
    def compute_capability(self) -> int:
        ...
    @compute_capability.setter
    def compute_capability(self, value: int) -> None: ...
    @property
    def context_workspace_rows(self) -> int:
        ...
    @context_workspace_rows.setter
    def context_workspace_rows(self, value: int) -> None: ...
    @property
    def dcp(self) -> DcpLayout:
        ...
    @dcp.setter
    def dcp(self, value: DcpLayout) -> None: ...
    @property
    def decode_threshold(self) -> int:
        ...
    @decode_threshold.setter
    def decode_threshold(self, value: int) -> None: ...
    @property
    def dims(self) -> ModelDims:
        ...
    @dims.setter
    def dims(self, value: ModelDims) -> None: ...
    @property
    def max_model_len(self) -> int:
        ...
    @max_model_len.setter
    def max_model_len(self, value: int) -> None: ...
    @property
    def max_num_seqs(self) -> int:
        ...
    @max_num_seqs.setter
    def max_num_seqs(self, value: int) -> None: ...
    @property
    def num_sms(self) -> int:
        ...
    @num_sms.setter
    def num_sms(self, value: int) -> None: ...
    @property
    def page_size(self) -> int:
        ...
    @page_size.setter
    def page_size(self, value: int) -> None: ...
    @property
    def require_uniform(self) -> bool:
        ...
    @require_uniform.setter
    def require_uniform(self, value: bool) -> None: ...
    @property
    def sparse(self) -> bool:
        ...
    @sparse.setter
    def sparse(self, value: bool) -> None: ...
    def sparse_mixed_batch(self) -> bool:
        """Whether sparse prefills run in the mixed batch for this configuration."""
    @property
    def sparse_prefill_mode(self) -> SparsePrefillMode:
        ...
    @sparse_prefill_mode.setter
    def sparse_prefill_mode(self, value: SparsePrefillMode) -> None: ...
    @property
    def sparse_workspace_rows(self) -> int:
        ...
    @sparse_workspace_rows.setter
    def sparse_workspace_rows(self, value: int) -> None: ...
    def validate(self) -> None:
        """Check the configuration; raises ValueError naming the bad field."""

class Precision:
    """Members:
    
    fast
    
    reference"""
    fast: ClassVar[Precision]
    reference: ClassVar[Precision]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class QueryLenSupport:
    """Members:
    
    single_only
    
    uniform
    
    varlen"""
    single_only: ClassVar[QueryLenSupport]
    uniform: ClassVar[QueryLenSupport]
    varlen: ClassVar[QueryLenSupport]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class ReorderResult:
    """reorder_decodes_first's result: order (request indices, decodes first) and moved (whether any request moved)."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def moved(self) -> bool:
        ...
    @moved.setter
    def moved(self, value: bool) -> None: ...
    @property
    def order(self) -> List[int]:
        ...
    @order.setter
    def order(self, value: List[int]) -> None: ...

class RequestRegion:
    """Members:
    
    decode
    
    extend
    
    prefill"""
    decode: ClassVar[RequestRegion]
    extend: ClassVar[RequestRegion]
    prefill: ClassVar[RequestRegion]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class SparsePrefillChunk:
    """One chunk of the separate sparse prefill: requests req_begin .. req_end and their workspace rows."""
    def __init__(*args: Any, **kwargs: Any) -> Any:
        """Initialize self.  See help(type(self)) for accurate signature."""

    @property
    def req_begin(self) -> int:
        ...
    @property
    def req_end(self) -> int:
        ...
    @property
    def token_begin(self) -> int:
        ...
    @property
    def token_end(self) -> int:
        ...
    @property
    def total_rows(self) -> int:
        ...
    @property
    def workspace_starts(self) -> List[int]:
        ...

class SparsePrefillMode:
    """How a sparse fp8_ds_mla step runs its prefill tokens (PlannerConfig.sparse_prefill_mode)
    
    Members:
    
      automatic
    
      mixed_batch
    
      separate"""
    automatic: ClassVar[SparsePrefillMode]
    mixed_batch: ClassVar[SparsePrefillMode]
    separate: ClassVar[SparsePrefillMode]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def value(self) -> int: ...
    @property
    def name(self) -> str: ...

class Split:
    """split_decodes_and_prefills' result: request and token counts of the decode and prefill parts."""
    def __init__(self, **kwargs: Any) -> None:
        ...
    @property
    def num_decode_tokens(self) -> int:
        ...
    @num_decode_tokens.setter
    def num_decode_tokens(self, value: int) -> None: ...
    @property
    def num_decodes(self) -> int:
        ...
    @num_decodes.setter
    def num_decodes(self, value: int) -> None: ...
    @property
    def num_prefill_tokens(self) -> int:
        ...
    @num_prefill_tokens.setter
    def num_prefill_tokens(self, value: int) -> None: ...
    @property
    def num_prefills(self) -> int:
        ...
    @num_prefills.setter
    def num_prefills(self, value: int) -> None: ...

class StepMetadata:
    """The packed int32 metadata of a step (what upload_step_metadata copies to the device)."""
    def __init__(*args: Any, **kwargs: Any) -> Any:
        """Initialize self.  See help(type(self)) for accurate signature."""

    def bytes(self) -> int:
        """Bytes of the packed metadata."""
    @property
    def chunk_cu(self) -> List[int]:
        ...
    @property
    def chunk_starts(self) -> List[int]:
        ...
    @property
    def data(self) -> List[int]:
        ...
    @property
    def prefill_ids(self) -> int:
        ...
    @property
    def prefill_qsl(self) -> int:
        ...
    @property
    def req_id(self) -> int:
        ...
    @property
    def workspace_starts(self) -> int:
        ...

class Tensor:
    """A tensor the library owns (or a view that keeps its owner alive). Zero-copy export: torch.from_dlpack(t), numpy.from_dlpack(t) or t.numpy() (CPU)."""
    def __init__(*args: Any, **kwargs: Any) -> Any:
        """Initialize self.  See help(type(self)) for accurate signature."""

    @property
    def data_ptr(self) -> int:
        ...
    @property
    def device(self) -> Device:
        ...
    @property
    def dtype(self) -> DType:
        ...
    @property
    def nbytes(self) -> int:
        ...
    def numel(self) -> int:
        """Number of elements."""
    def numpy(self) -> Any:
        """Zero-copy NumPy view of a CPU tensor (bf16 as uint16 bits, fp8 as uint8 bits)."""
    @property
    def shape(self) -> tuple:
        ...
    @property
    def strides(self) -> tuple:
        ...

class VariantInfo:
    """One kernel variant: name, min_cc / max_cc (compute capability x 10), description."""
    def __init__(*args: Any, **kwargs: Any) -> Any:
        """Initialize self.  See help(type(self)) for accurate signature."""

    @property
    def description(self) -> str:
        ...
    @property
    def max_cc(self) -> int:
        ...
    @property
    def min_cc(self) -> int:
        ...
    @property
    def name(self) -> str:
        ...

def abs_max(x: TensorLike, out: TensorLike, *, stream: Any = ...) -> None:
    """out [1] f32 = max |x| over x [M, K] (NaN when any element is NaN)."""

def allocate_cache(format: CacheFormat, num_blocks: int, page_size: int, device: Any = ..., scale: float = ..., d_qk: int = ..., d_rope: int = ...) -> KVCache:
    """Allocate a cache (contents undefined); .data is the mla.Tensor holding it."""

def allocate_indexer_cache(num_blocks: int, page_size: int, device: Any = ...) -> IndexerKCache:
    """Allocate an indexer K cache (contents undefined); .data is the mla.Tensor holding it."""

def batch_invariant_splits(config: PlannerConfig, s_q: int) -> int:
    """The split-KV count of every decode run of s_q-token requests in a batch-invariant plan: decode_num_splits for the config's full batch (max_num_seqs requests of max_model_len keys); a function of the config and s_q only."""

def bmm(a: TensorLike, b: TensorLike, c: TensorLike, alpha: float = ..., beta: float = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """Batched c = alpha * a @ b + beta * c: a [batch, m, k], b [batch, k, n], c [batch, m, n] (CUDA: a, b bf16, c bf16 or f32; CPU: any float dtype)."""

def built_with_cuda() -> bool:
    """Whether this build of mla has the CUDA backend."""

def cache_dtype(format: CacheFormat) -> DType:
    """The dtype of a cache tensor of `format` (bf16, fp8_e4m3, u8 for fp8_ds_mla, f64)."""

def cache_entry_bytes(format: CacheFormat, d_qk: int = ..., d_rope: int = ...) -> int:
    """Bytes of one cache row (token) of `format` for d_qk / d_rope (bf16 576 x 2, fp8 576, fp8_ds_mla 656)."""

def cache_entry_elems(format: CacheFormat, d_qk: int = ..., d_rope: int = ...) -> int:
    """Elements of one cache row of `format` in its tensor's dtype."""

def callback_group(impl: Any, rank: int, world_size: int, device: Any, backend: str = ...) -> Communicator:
    """A communicator whose collectives call impl.all_gather(input, output, stream), impl.all_to_all(...), impl.reduce_scatter(...) and impl.synchronize(stream): input / output are mla.Tensor views valid during the call (torch.from_dlpack shares them), stream the CUDA stream as an int (0 on the CPU). mla.dist.torch_group builds one over a torch.distributed process group."""

def chunked_prefill_workspace_rows(max_model_len: int, max_num_seqs: int, page_size: int, sparse_topk: int = ...) -> int:
    """Rows of the chunked-context prefill workspace (vLLM's formula from max_model_len, max_num_seqs, page_size, sparse_topk)."""

def classify_request(num_computed_tokens: int, num_scheduled_tokens: int, decode_threshold: int) -> RequestRegion:
    """RequestRegion of one request: prefill (nothing computed), decode (computed > 0 and scheduled <= decode_threshold) or extend."""

def compute_capability(device: Any) -> int:
    """major * 10 + minor of a CUDA device (0 for the CPU): PlannerConfig.compute_capability"""

def convert_topk_indices(req_id: TensorLike, block_table: TensorLike, indices: TensorLike, out: TensorLike, page_size: int, block_stride_rows: int = ..., prefill_request_ids: TensorLike = ..., prefill_workspace_starts: TensorLike = ..., valid_counts: TensorLike = ..., seq_lens: TensorLike = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """Request-local top-k positions -> global cache rows (block_table[req, i // page_size] * block_stride_rows + i % page_size) or prefill workspace rows. req_id [T], block_table [R, max_blocks], indices [T, topk], out [T, topk], prefill_request_ids [T], prefill_workspace_starts [P], valid_counts [T], seq_lens [R]: all int32; -1 = invalid (positions >= seq_lens[req] too)."""

def copy(dst: TensorLike, src: TensorLike) -> None:
    """Copy src into dst (same shape and dtype; synchronous)."""

def cp_gather_cache(cache: KVCache, dst: TensorLike, block_table: TensorLike, cu_seq_lens: TensorLike, seq_starts: TensorLike = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """Raw copy of each request's cache rows, no conversion: dst [TOT, E] in the cache tensor's dtype and row width; block_table [B, max_blocks], cu_seq_lens [B + 1], seq_starts [B] optional, all int32."""

def cuda_device_count() -> int:
    """CUDA devices this process sees (0 without a driver, a device or a CUDA build)."""

def dcp_compact_topk(req_id: TensorLike, seq_lens: TensorLike, indices: TensorLike, topk_length: TensorLike, out: TensorLike, valid_counts: TensorLike, world_size: int, rank: int, interleave: int = ..., *, stream: Any = ...) -> None:
    """The localize step of the DeepSeek-V4 DCP step for one index list (mla/dcp.h): req_id [T] int32, seq_lens [R] int32 (positions per request in this list's cache), indices [T, topk] int32 request-local positions, topk_length [T] int32 or None; out [T, topk] int32 gets the entries this rank owns as local positions, packed at the front (-1 after them), valid_counts [T] int32 their count."""

def dcp_local_length(length: int, world_size: int, rank: int, interleave: int = ...) -> int:
    """Positions of a request of `length` tokens that rank `rank` holds."""

def dcp_local_position(position: int, world_size: int, rank: int = ..., interleave: int = ...) -> int:
    """Where position p lies in its owner's shard of the request."""

def dcp_local_query_lengths(seq_lens: List[int], s_q: int, causal: bool, world_size: int, rank: int, interleave: int = ...) -> List[int]:
    """Local key counts of a decode batch's rows (r, i) on this rank (mla/dcp.h)."""

def dcp_mqa_decode(comm: Communicator, q: TensorLike, cache: KVCache, block_table: TensorLike, local_lens: TensorLike, out: TensorLike, lse: TensorLike, softmax_scale: float, workspace: TensorLike, num_splits: int = ..., exchange: DcpExchange = ..., *, stream: Any = ...) -> None:
    """This rank's step of a DCP decode (mla/dcp.h): q [b, s_q, h_q, 576] of its heads (bf16 on CUDA), its cache shard, block_table [b, max_blocks] int32 of the shard, local_lens [b * s_q] int32 (dcp_local_query_lengths); out [b, s_q, h_q, 512] / lse [b, s_q, h_q] fp32 of its heads over the whole context; workspace u8 [dcp_mqa_decode_workspace_bytes(...)]."""

def dcp_mqa_decode_workspace_bytes(b: int, s_q: int, h_q: int, max_blocks: int, page_size: int, dtype: Any, world_size: int, device: Any, num_splits: int = ..., exchange: DcpExchange = ...) -> int:
    """Bytes of the u8 workspace dcp_mqa_decode needs for these sizes (the rank's h_q heads) and exchange."""

def dcp_owner(position: int, world_size: int, rank: int = ..., interleave: int = ...) -> int:
    """The rank holding cache position p: (p // interleave) % world_size."""

def dcp_sparse_mqa(comm: Communicator, q: TensorLike, cache: KVCache, indices: TensorLike, topk_length: TensorLike, out: TensorLike, lse: TensorLike, softmax_scale: float, workspace: TensorLike, *, stream: Any = ..., attn_sink: TensorLike = ..., extra_kv: Any = ..., extra_indices: TensorLike = ..., extra_topk_length: TensorLike = ..., values_include_rope: bool = ..., batch_invariant: bool = ...) -> None:
    """This rank's step of a DCP sparse attention: q [T, h_q, d_qk] of its heads, its cache shard, indices [T, topk] int32 rows of the shard (-1: a key another rank holds), topk_length [T] int32 or None; out [T, h_q, d_v] / lse [T, h_q] fp32 over every rank's keys; workspace u8 [dcp_sparse_mqa_workspace_bytes(...)]. DeepSeek-V4 inputs (as sparse_mqa's; mla/dcp.h): attn_sink [h_q] f32 of this rank's heads (folded in once, by the combine), extra_kv / extra_indices [T, k_e] / extra_topk_length [T] (this rank's shard of the compressed cache and its rows), values_include_rope, batch_invariant."""

def dcp_sparse_mqa_workspace_bytes(t: int, h_q: int, dtype: Any, world_size: int, d_qk: int = ..., d_v: int = ...) -> int:
    """Bytes of the u8 workspace dcp_sparse_mqa needs for t tokens and the rank's h_q heads (q's and out's last dims d_qk / d_v: DeepSeek-V4 512 / 512)."""

def decode_num_splits(b: int, s_q: int, h_q: int, max_seq_len: int, num_sms: int) -> int:
    """The planner's split-KV count for a decode of b requests x s_q tokens x h_q heads up to max_seq_len keys on num_sms SMs (1 when num_sms <= 0)."""

def dense_decode_threshold(support: QueryLenSupport, num_speculative_tokens: int, parallel_drafting: bool, dcp_world_size: int, supports_dcp_varlen: bool) -> int:
    """The query length up to which a dense MLA backend treats a request as a decode (vLLM's rule: spec decode, DCP)."""

def dtype_size(dtype: DType) -> int:
    """Bytes per element of an mla.DType."""

def empty(shape: List[int], dtype: Any, device: Any = ...) -> Tensor:
    """A new uninitialised mla.Tensor of `shape` (list of ints), `dtype` (mla.DType or its name: f32, f64, bf16, f16, fp8_e4m3, u8, i32, i64) on `device` ('cpu', 'cuda', 'cuda:N', torch.device or mla.Device); a CUDA device that is not present raises ValueError ('no CUDA device')."""

def fill(dst: TensorLike, value: float) -> None:
    """Set every element of dst (any dtype and device) to value."""

class force_variant:
    """with mla.force_variant(family, variant): ... ("" = automatic)"""
    def __init__(self, family: str, variant: str) -> None:
        ...

def forced_variant(family: str) -> str:
    """The variant forced for the family ('' = automatic selection)."""

def gather_cache(cache: KVCache, dst: TensorLike, block_table: TensorLike, cu_seq_lens: TensorLike, seq_starts: TensorLike = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """Gather each request's cache rows into dst, dequantised: dst [TOT, D] bf16 / f16 / f32 (CPU: f64 too), D = d_qk (whole row) or the latent width; block_table [B, max_blocks] int32; cu_seq_lens [B + 1] int32 (request b fills rows cu[b] .. cu[b + 1]); seq_starts [B] int32 optional (first logical position of each request)."""

def gemm(a: TensorLike, b: TensorLike, c: TensorLike, alpha: float = ..., beta: float = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """c = alpha * a @ b + beta * c: a [m, k], b [k, n], c [m, n] (CUDA: a, b bf16, c bf16 or f32; CPU: any float dtype); fp32 accumulation (fp64 with precision=reference)."""

def indexer_gather_k(cache: IndexerKCache, dst_k: TensorLike, dst_scale: TensorLike, block_table: TensorLike, cu_seq_lens: TensorLike, *, stream: Any = ..., precision: Precision = ...) -> None:
    """Gather each request's first positions into dst_k [TOT, 128] / dst_scale [TOT]."""

def indexer_logits_decode(q: TensorLike, weights: TensorLike, cache: IndexerKCache, block_table: TensorLike, seq_lens: TensorLike, s_q: int, logits: TensorLike, *, stream: Any = ..., precision: Precision = ...) -> None:
    """Decode logits [b * s_q, N] over each request's causal positions in the paged indexer cache."""

def indexer_logits_prefill(q: TensorLike, weights: TensorLike, k: TensorLike, k_scale: TensorLike, row_starts: TensorLike, row_ends: TensorLike, logits: TensorLike, *, stream: Any = ..., precision: Precision = ...) -> None:
    """logits[t, j] = sum_h w[t, h] relu(q[t, h] . k[j] * k_scale[j]) for j in [row_starts[t], row_ends[t]), else -inf."""

def indexer_prepare(q: TensorLike, k: TensorLike, weights_raw: TensorLike, positions: TensorLike, cos_sin: TensorLike, k_norm_weight: TensorLike, k_norm_bias: TensorLike, q_codes: TensorLike, weights: TensorLike, k_out: TensorLike, eps: float = ..., hadamard: bool = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """The indexer's q / k preparation after its projections (k LayerNorm, non-interleaved rope on dims < 64,
    Hadamard, per-head ue8m0 fp8 q with its scale folded into weights): q_codes [T, h, 128] u8/e4m3,
    weights [T, h] f32, k_out [T, 128] (write it with indexer_write_k)."""

def indexer_topk(logits: TensorLike, row_starts: TensorLike, row_ends: TensorLike, out: TensorLike, *, stream: Any = ..., precision: Precision = ...) -> None:
    """Positions of each row's k largest logits in [start, end) (ascending, -1 padded) into out [T, k] int32."""

def indexer_topk_decode(logits: TensorLike, seq_lens: TensorLike, s_q: int, out: TensorLike, *, stream: Any = ..., precision: Precision = ...) -> None:
    """indexer_topk over the decode rows' causal lengths (seq_lens [T / s_q])."""

def indexer_write_k(k: TensorLike, slot_mapping: TensorLike, cache: IndexerKCache, scale: IndexerScale = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """Quantise k [T, 128] per token into the indexer cache at slot_mapping."""

def last_variant(family: str) -> str:
    """The variant that ran the family's last launch in this thread ('' before any)."""

def list_variants(family: str) -> List[VariantInfo]:
    """The variants of a family, best first (name, compute-capability range, description)."""

def local_group(world_size: int, timeout: float = ...) -> List[Communicator]:
    """W communicators of one in-process CPU group: hand communicator r to the Python thread that plays rank r."""

def make_plan(batch: BatchDesc, config: PlannerConfig) -> Plan:
    """Plan one step: BatchDesc and PlannerConfig -> a sealed Plan (host decisions and packed metadata) for MlaAttention.forward."""

def max_step_metadata_bytes(config: PlannerConfig, max_num_tokens: int) -> int:
    """Upper bound of the step metadata's bytes for any plan of `config` with at most max_num_tokens tokens (size the staging buffers once)."""

def merge_attn_states(out: TensorLike, out_lse: TensorLike, prefix: TensorLike, prefix_lse: TensorLike, suffix: TensorLike, suffix_lse: TensorLike, prefill_tokens_with_context: int = ..., output_scale: float = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """out = the LSE-weighted merge of two partial attentions (vLLM merge_attn_states). out, prefix, suffix [T, H, D] (bf16 / f16 / f32; CPU: f64 too); prefix_lse, suffix_lse [H, T] fp32 (a transposed [T, H] view works); out_lse [H, T] fp32 or None. Tokens t >= prefill_tokens_with_context (>= 0) take the suffix; output_scale > 0: out is fp8_e4m3 and receives out / output_scale."""

def mha_prefill(q: TensorLike, k_nope: TensorLike, k_pe: TensorLike, v: TensorLike, cu_seqlens_q: TensorLike, cu_seqlens_k: TensorLike, max_seqlen_q: int, max_seqlen_k: int, out: TensorLike, lse: TensorLike, softmax_scale: float, causal: bool, *, stream: Any = ..., precision: Precision = ..., fp8: bool = ..., q_scale: float = ..., k_scale: float = ..., v_scale: float = ..., workspace: TensorLike = ...) -> None:
    """Varlen MHA prefill over up-projected K/V. q [Tq, h, d_nope + d_rope], k_nope [Tk, h, d_nope], k_pe [Tk, h, d_rope] (head stride 0 allowed: one shared rope row), v [Tk, h, d_v] (CUDA: bf16); cu_seqlens_q / cu_seqlens_k [B + 1] int32; out [Tq, h, d_v]; lse [h, Tq] fp32 or None. causal: bottom-right aligned. fp8: q, k, v quantised with the static q_scale / k_scale / v_scale (code = e4m3(x / scale)) and P as e4m3 (docs/SEMANTICS.md §10.1; CUDA: sm_90, d_nope 128, d_rope 64, d_v 128, workspace u8 [mha_prefill_workspace_bytes(...)]; the CPU computes it in float64 over the codes)."""

def mha_prefill_workspace_bytes(total_q: int, total_k: int, heads: int, batch: int, fp8: bool, device: Any) -> int:
    """Bytes of the u8 workspace an fp8 mha_prefill needs on `device` (0 without fp8 or on the CPU)."""

def mqa_decode(q: TensorLike, cache: KVCache, block_table: TensorLike, seq_lens: TensorLike, out: TensorLike, lse: TensorLike, softmax_scale: float, causal: bool = ..., workspace: TensorLike = ..., num_splits: int = ..., whole_requests: bool = ..., *, stream: Any = ..., precision: Precision = ..., batch_invariant: bool = ..., fp8_compute: bool = ...) -> None:
    """Absorbed MQA decode over the paged cache. q [b, s_q, h_q, d_qk] (d_qk = cache.d_qk = 576; CUDA: bf16, f16 or f32, rounded to bf16), block_table [b, max_blocks] int32, seq_lens [b] int32, out [b, s_q, h_q, d_v] (d_v <= 512, q's dtype family), lse [b, s_q, h_q] fp32 natural log or None (-inf where no key is visible; FlashMLA's is [b, h_q, s_q]). causal: query i sees keys up to seq_len - s_q + i. workspace: u8 [mqa_decode_workspace_bytes(...)] on CUDA, None on the CPU; num_splits 0 = the planner's policy; whole_requests: a hint that the lengths are near-uniform (one CTA per request; same result either way); batch_invariant: each request's result bit-identical whatever else is in the batch (needs num_splits >= 1, e.g. batch_invariant_splits(config, s_q)). fp8_compute: an fp8 per-tensor cache may be read with e4m3 products (q and the softmax weights rounded to e4m3; docs/SEMANTICS.md 14.10's bound); a permission, exact where no such kernel runs."""

def mqa_decode_workspace_bytes(b: int, s_q: int, h_q: int, max_seq_len: int, device: Any, num_splits: int = ...) -> int:
    """Bytes of the u8 workspace mqa_decode needs for these sizes and num_splits on `device` (0 on the CPU)."""

def multiprocessor_count(device: Any) -> int:
    """Streaming multiprocessors of a CUDA device (0 for the CPU): PlannerConfig.num_sms."""

def nccl_available() -> bool:
    """Whether this build has NCCL (CUDA groups)."""

def nccl_group(id: str, world_size: int, rank: int, device: Any, timeout: float = ...) -> Communicator:
    """This rank of an NCCL group on `device` (id from nccl_make_id, the same on every rank)."""

def nccl_group_from(comm: int, device: Any, timeout: float = ...) -> Communicator:
    """This rank of an NCCL communicator the caller owns: comm is the ncclComm_t as an int (it must outlive the result, which never destroys or aborts it); rank and size are the communicator's."""

def nccl_make_id() -> str:
    """A new NCCL unique id as 256 hex digits (hand the same string to every rank)."""

def pinned_buffer(bytes: int) -> Any:
    """Page-locked host staging buffer (u8 [bytes]; ordinary memory without a CUDA device) as an mla.Tensor."""

def plan_context_chunks(context_lens: List[int], workspace_rows: int, page_size: int, round_to_page: bool = ...) -> ContextPlan:
    """Chunks of the prefills' contexts (context_lens [P]) that fit workspace_rows rows each -> ContextPlan."""

def plan_decode_schedule(query_start_loc: List[int], seq_lens: List[int], num_decodes: int, page_size: int, num_heads: int, num_sms: int, seq_len_bound: int = ...) -> DecodeSchedule:
    """The decode part's runs of equal query length: query_start_loc [R + 1], seq_lens [R], the first num_decodes requests -> DecodeSchedule."""

def plan_digest(plan: Plan) -> int:
    """FNV-1a digest of every field of the plan (never 0): the seal forward() checks."""

def prefill_workspace_starts(seq_lens: List[int], chunks: List[Tuple[int, int]]) -> List[int]:
    """Each prefill's first workspace row [P]: the exclusive cumsum of seq_lens, restarted at every chunk."""

def process_group(device: Any = ..., *, peer: bool = ...) -> Communicator:
    """This process's rank from the torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MLA_DCP_RENDEZVOUS or MLA_NCCL_ID, MLA_DCP_TIMEOUT_MS): device None = CPU (socket group), 'cuda' = cuda:LOCAL_RANK, or a device. peer=True (a collective call): small all_gathers / all_to_alls by direct stores into the other GPUs' memory (CUDA IPC; backend 'nccl+peer'), unchanged where the ranks cannot map each other's memory (CPU, other hosts)."""

def process_group_env() -> Any:
    """RANK / WORLD_SIZE / LOCAL_RANK / MLA_DCP_RENDEZVOUS / timeout from the environment as a dict (None if unset)."""

def quantize_output(x: TensorLike, key: Any, codes: TensorLike, scales: TensorLike = ..., scale: float = ..., *, stream: Any = ...) -> None:
    """Quantise x [M, K] into codes / scales in the key's format (docs/SEMANTICS.md §15): fp8 codes [M_pad, K] with the static `scale`; fp8_group128 / fp8_group64 codes [M_pad, K] and f32 scales [K / G, M_pad]; nvfp4 u8 codes [M_pad, K / 2] and e4m3 scales [M_pad, K / 16] with the global `scale`. Rows past M are padding."""

def reorder_decodes_first(num_computed_tokens: List[int], num_scheduled_tokens: List[int], decode_threshold: int) -> ReorderResult:
    """vLLM's batch reorder: per-request counts [R] -> ReorderResult (order with decodes first, and whether anything moved)."""

def req_id_per_token(query_start_loc: List[int]) -> List[int]:
    """query_start_loc [R + 1] -> the request of every token [T]."""

def same_launches(a: Plan, b: Plan) -> bool:
    """Whether two plans make the same launches (every host decision equal; lengths and tables may differ): one captured CUDA graph serves both."""

def socket_group(path: str, world_size: int, rank: int, timeout: float = ...) -> Communicator:
    """This process's rank of a CPU group across processes (rank 0 listens on the Unix socket `path`)."""

def sparse_decode_threshold(num_heads: int, sm100: bool, num_speculative_tokens: int, parallel_drafting: bool, dcp_world_size: int, supports_dcp_varlen: bool) -> int:
    """The query length up to which the sparse backend treats a request as a decode (per head count and device)."""

def sparse_fp8_decode_padded_heads(num_heads: int) -> int:
    """Heads the sparse fp8 decode kernel is padded to: 64 if num_heads <= 64, else a multiple of 128."""

def sparse_mixed_batch_for(mode: SparsePrefillMode, num_heads: int, compute_capability: int = ..., dcp_world_size: int = ...) -> bool:
    """Whether SparsePrefillMode `mode` runs prefills in the mixed batch for num_heads on a device of compute_capability in a DCP group of dcp_world_size."""

def sparse_mqa(q: TensorLike, kv: KVCache, indices: TensorLike, topk_length: TensorLike, out: TensorLike, lse: TensorLike, softmax_scale: float, *, stream: Any = ..., precision: Precision = ..., attn_sink: TensorLike = ..., extra_kv: Any = ..., extra_indices: TensorLike = ..., extra_topk_length: TensorLike = ..., values_include_rope: bool = ..., batch_invariant: bool = ..., out_rotation_positions: TensorLike = ..., out_rotation_inv_freq: TensorLike = ..., out_rotation_dim: int = ...) -> None:
    """Sparse MQA over top-k cache rows (FlashMLA-sparse semantics). q [T, h_q, d_qk] (CUDA: bf16), kv any cache format (row r = block r // page, offset r % page), indices [T, topk] int32 (< 0 invalid), topk_length [T] int32 or None, out [T, h_q, d_v], lse [T, h_q] fp32 or None (no valid index: out 0, lse -inf). DeepSeek-V4 inputs (SEMANTICS §11.8): attn_sink [h_q] f32, extra_kv / extra_indices [T, k_e] / extra_topk_length [T] (a second cache in the same softmax), values_include_rope (d_v up to d_qk), out_rotation_positions [T] int32 / int64 + out_rotation_inv_freq [R / 2] f64 + out_rotation_dim R (the output's last R columns turned pairwise by position * inv_freq before the store: the V4 block's inverse rope). batch_invariant: each token's result bit-identical whatever else is in the call."""

def sparse_prefill_padded_heads(num_heads: int, sm100: bool) -> int:
    """Heads the sparse prefill kernel is padded to (64 / 128, a multiple of 128 beyond)."""

def sparse_prefill_workspace_rows(max_model_len: int) -> int:
    """Rows of the separate sparse prefill's bf16 workspace for max_model_len."""

def sparse_use_mixed_batch(num_heads: int, hisparse: bool = ..., pcp_and_dcp: bool = ...) -> bool:
    """vLLM's rule for running sparse prefills in the mixed batch (by head count, HiSparse, PCP + DCP)."""

def split_decodes_and_prefills(query_start_loc: List[int], decode_threshold: int, require_uniform: bool, num_tokens: int = ...) -> Split:
    """Split a batch ordered decodes first: query_start_loc [R + 1] -> Split (decode / prefill request and token counts); num_tokens -1 = query_start_loc[-1]."""

def split_prefill_chunks(seq_lens: List[int], workspace_rows: int, request_offset: int = ...) -> List[Tuple[int, int]]:
    """Greedy request ranges [(start, end)] whose seq_lens sum to at most workspace_rows (offset added)."""

def upconvert_ds_mla(cache: KVCache, dst: TensorLike, block_table: TensorLike, workspace_starts: TensorLike, seq_starts: TensorLike = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """fp8_ds_mla cache rows -> dst [TOT, 576] bf16 (CUDA: bf16 / f16 / f32; CPU: any float dtype). block_table [B, max_blocks] int32; workspace_starts [B] int32: request b fills rows starts[b] .. starts[b + 1] (the last ends at TOT); seq_starts [B] int32 optional."""

def upload_step_metadata(plan: Plan, staging: TensorLike, device_metadata: TensorLike, *, stream: Any = ...) -> None:
    """Write the plan's metadata into the pinned staging buffer and copy it to device_metadata on the stream."""

def variant_families() -> List[str]:
    """The kernel families that have variants (mqa_decode, sparse_mqa, mha_prefill, indexer_logits)."""

def variant_runs_on_device(family: str, variant: str, device: int) -> bool:
    """Whether the variant can run on CUDA device `device` (its compute capability)."""

def write_cache(kv_c: TensorLike, k_pe: TensorLike, slot_mapping: TensorLike, cache: KVCache, ds_scale: DsMlaScale = ..., *, stream: Any = ..., precision: Precision = ...) -> None:
    """Write kv_c | k_pe rows into the cache at slot_mapping (vLLM concat_and_cache_mla). kv_c [T, L] (L = 512), k_pe [T, R] (R = 64), any float dtype, any row stride; slot_mapping [T'] int64 or int32, T' <= T tokens written, slot < 0 skipped. bf16 cache: exact copy; fp8: x / scale saturated; fp8_ds_mla: per-128 tile scales (ds_scale), rope as bf16."""

def write_step_metadata(plan: Plan, staging: TensorLike) -> None:
    """Write the plan's packed metadata into staging (u8 [>= plan.metadata.bytes()], host memory)."""

def yarn_mscale(factor: float, mscale_all_dim: float) -> float:
    """YaRN attention scale factor: 0.1 * mscale_all_dim * ln(factor) + 1 (1 when factor <= 1)."""

def zeros(shape: List[int], dtype: Any, device: Any = ...) -> Tensor:
    """As empty(shape, dtype, device), filled with zeros."""

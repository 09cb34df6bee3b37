# SPDX-License-Identifier: Apache-2.0
"""Decode context parallelism over an engine's own group: ``torch_group`` makes an ``mla.Communicator``
whose collectives are torch.distributed calls on a process group the engine already has (NCCL on GPUs,
gloo on the CPU), so that ``mla.dcp_mqa_decode`` / ``mla.dcp_sparse_mqa`` run over it (docs/SCALE.md).

Import needs torch. Each rank is one process with ``torch.distributed`` initialised; every rank calls the
same mla ops in the same order, as with mla's own groups. The results equal mla's own groups' bit for bit:
the bytes moved are the same, and a reduce_scatter the backend lacks (gloo) is summed in float64 in rank
order and rounded once, as mla's CPU groups do.
"""
import torch
import torch.distributed as dist

from . import _mla


def _tensor(view):
    """A torch tensor sharing the memory of an mla.Tensor view (DLPack, no copy)."""
    return torch.utils.dlpack.from_dlpack(view)


class TorchCommunicator:
    """The collectives of an ``mla.Communicator`` over a torch.distributed process group.

    ``mla.callback_group`` calls these methods with flat, contiguous mla.Tensor views of one dtype on the
    group's device and the CUDA stream the op runs on (an int, 0 on the CPU):

    - ``all_gather(input [n], output [W * n], stream)``: block r of output = rank r's input.
    - ``all_to_all(input [W * n], output [W * n], stream)``: block j of rank i's input -> block i of rank j's output.
    - ``reduce_scatter(input [W * n], output [n], stream)``: output = sum over ranks of their block ``rank``
      (dtype f32, bf16 or f64).
    - ``synchronize(stream)``: returns when the collectives issued on ``stream`` have completed.

    Use ``torch_group``, which wraps an instance into an ``mla.Communicator``.
    """

    def __init__(self, group=None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.backend = str(dist.get_backend(group))

    def _on_stream(self, stream):
        if stream and torch.cuda.is_available():
            return torch.cuda.stream(torch.cuda.ExternalStream(stream))
        return _NoStream()

    def all_gather(self, input, output, stream):  # noqa: A002  (the Communicator's names)
        src, dst = _tensor(input), _tensor(output)
        with self._on_stream(stream):
            if self.backend == "nccl" and hasattr(dist, "all_gather_into_tensor"):
                dist.all_gather_into_tensor(dst, src, group=self.group)
            else:
                dist.all_gather(list(dst.chunk(self.world_size)), src, group=self.group)

    def all_to_all(self, input, output, stream):  # noqa: A002
        src, dst = _tensor(input), _tensor(output)
        with self._on_stream(stream):
            dist.all_to_all_single(dst, src, group=self.group)

    def reduce_scatter(self, input, output, stream):  # noqa: A002
        src, dst = _tensor(input), _tensor(output)
        with self._on_stream(stream):
            if self.backend == "nccl" and hasattr(dist, "reduce_scatter_tensor"):
                dist.reduce_scatter_tensor(dst, src, group=self.group)
                return
            # No reduce_scatter in the backend (gloo): every rank's block `rank`, summed here in rank order.
            blocks = torch.empty_like(src)
            dist.all_to_all_single(blocks, src, group=self.group)
            acc = torch.zeros(dst.shape, dtype=torch.float64, device=dst.device)
            for b in blocks.chunk(self.world_size):
                acc += b.double()
            dst.copy_(acc if dst.dtype == torch.float64 else acc.float().to(dst.dtype))

    def synchronize(self, stream):
        if stream and torch.cuda.is_available():
            torch.cuda.ExternalStream(stream).synchronize()


class _NoStream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def torch_group(group=None, device=None):
    """This process's rank of a torch.distributed process group as an ``mla.Communicator``.

    group: a ``torch.distributed.ProcessGroup`` (None: the default group). device: where the collectives'
    tensors live, an ``mla.Device``, its name or a ``torch.device`` (None: ``cuda:<current device>`` for an
    NCCL group, else the CPU). The communicator's rank and world_size are the group's; its backend is
    ``"torch:<backend>"`` (e.g. ``"torch:nccl"``). Pass it to ``mla.dcp_mqa_decode`` /
    ``mla.dcp_sparse_mqa`` like any communicator; torch.distributed must stay initialised while it is used.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("mla.dist.torch_group: torch.distributed is not initialised (call "
                         "torch.distributed.init_process_group first)")
    impl = TorchCommunicator(group)
    if device is None:
        device = f"cuda:{torch.cuda.current_device()}" if impl.backend == "nccl" else "cpu"
    elif isinstance(device, torch.device):
        device = str(device) if device.index is not None or device.type == "cpu" else \
            f"cuda:{torch.cuda.current_device()}"
    return _mla.callback_group(impl, impl.rank, impl.world_size, device, "torch:" + impl.backend)

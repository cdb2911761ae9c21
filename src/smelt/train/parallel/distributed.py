"""Process groups, model wrapping (DDP or FSDP2) and the collectives the trainer needs.

Under `torchrun` the launcher sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; a plain
`python` run has none of them and is a world of one, with no process group at all, so the single
process path has no collective overhead and stays bitwise reproducible. NCCL on GPUs, gloo on CPU.

Seeds: ranks must agree on everything that defines the model (the initial weights: FSDP2 shards a
full init, DDP checks and broadcasts it) and must differ on anything that should be independent per
rank (dropout masks, sampling). `rank_seed` derives the second kind from the run seed and the rank,
so a copy-pasted seed can never make two ranks draw the same "random" numbers — the tensor-parallel
same-seed bug that cost one team a restart — and a new world size never changes the initial weights.

Restarts under `torchrun --max-restarts`: torchrun keeps one key-value store for the whole launch
(TORCHELASTIC_USE_AGENT_STORE), and the address each rank of an attempt publishes there to build its
process groups stays after the attempt died. A restarted rank could read a dead rank's address and
fail to connect (`Gloo connectFullMesh failed ... Connection refused`), in the default group or in the
checkpointer's gloo group. So every attempt works under a key prefix of its own, which its ranks agree
on first (attempt_name); torchrun's restart count cannot serve, since it differs between nodes once
one node has restarted and the others only rejoined.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from smelt.errors import ConfigError
from smelt.train.ops.watchdog import die_with_parent, launched
from smelt.train.parallel.collectives import all_reduce_sum

if TYPE_CHECKING:
    from smelt.train.parallel.mesh import TrainMesh

MODES = ("ddp", "fsdp")


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    owns_group: bool  # this module created the process group, so it also destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def env_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the torchrun environment; (0, 1, 0) outside it."""
    return (
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
        int(os.environ.get("LOCAL_RANK", "0")),
    )


def device_for(name: str, local_rank: int) -> torch.device:
    """The device this process trains on: under torchrun "auto"/"cuda" means cuda:LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


GROUP_TIMEOUT = datetime.timedelta(minutes=30)


def init_distributed(device: torch.device) -> DistContext:
    """Join the torchrun process group (nccl on CUDA, gloo on CPU); a no-op for a single process.
    A rank of a launcher (torchrun, the supervisor) ends with it, from here on (watchdog.py)."""
    if launched():
        die_with_parent()
    rank, world_size, local_rank = env_world()
    if world_size <= 1:
        return DistContext(0, 1, 0, owns_group=False)
    if dist.is_initialized():
        return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, owns_group=False)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = attempt_store(rank, world_size)
    where = {"store": store, "rank": rank, "world_size": world_size} if store is not None else {}
    dist.init_process_group(backend=backend, timeout=GROUP_TIMEOUT, **where)
    return DistContext(rank, world_size, local_rank, owns_group=True)


def shutdown(ctx: DistContext) -> None:
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[DistContext]:
    """init_distributed, and shutdown at the end."""
    ctx = init_distributed(device)
    try:
        yield ctx
    finally:
        shutdown(ctx)


def attempt_store(rank: int, world_size: int) -> dist.Store | None:
    """Under torchrun's launch-wide store: that store, under the prefix of this attempt (attempt_name),
    for every process group of the run. None elsewhere (init_process_group then reads the
    environment as usual: a store that rank 0 creates anew for every launch)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = dist.TCPStore(host, port, world_size, is_master=False, timeout=GROUP_TIMEOUT)
    return dist.PrefixStore(f"smelt/attempt/{attempt_name(store, rank, world_size)}", store)


def attempt_name(
    store: dist.Store, rank: int, world_size: int, timeout_s: float | None = None, poll_s: float = 0.01
) -> str:
    """A name that every rank of this launch attempt gets and no earlier attempt used, agreed over
    `store`, where keys of earlier attempts may remain.

    Rank 0 draws the name. Every other rank publishes a fresh random token under its rank and waits
    for the name under that token: only this attempt's rank 0 can have read the token, so a rank never
    takes an earlier attempt's name. Rank 0 keeps answering the tokens it finds, stale ones included
    (nobody waits for those), until every other rank has confirmed under the new name."""
    if rank != 0:
        token = uuid.uuid4().hex
        store.set(f"smelt/join/{rank}", token)
        name = store.get(f"smelt/welcome/{token}").decode()  # waits up to the store's timeout
        store.add(f"smelt/ready/{name}", 1)
        return name
    name = uuid.uuid4().hex
    keys = [f"smelt/join/{r}" for r in range(1, world_size)]
    answered: set[bytes] = set()
    timeout_s = GROUP_TIMEOUT.total_seconds() if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    while keys and store.add(f"smelt/ready/{name}", 0) < len(keys):
        tokens = [t for t in store.multi_get(keys) if t not in answered]  # waits until each joined once
        if tokens:
            store.multi_set([f"smelt/welcome/{t.decode()}" for t in tokens], [name] * len(tokens))
            answered.update(tokens)
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the other ranks of this torchrun attempt did not join rank 0 within {timeout_s:g} s"
            )
        time.sleep(poll_s)
    return name


def from_main(ctx: DistContext, device: torch.device, compute: Callable[[], float | None]) -> float | None:
    """`compute()` run on rank 0 alone and broadcast, so every rank holds the same number (None too).

    For figures that must agree across ranks but that each rank would measure differently: the
    peak FLOP/s that MFU divides by, measured on a CPU by a timed matmul, varies with what the other
    ranks are doing at that moment (two ranks of one run reported MFU 44% and 29%).
    """
    if not ctx.distributed or not dist.is_initialized():
        return compute()
    value = compute() if ctx.is_main else None
    # NCCL only moves CUDA tensors and gloo only CPU ones; NaN carries "unknown" (None).
    where = device if device.type == "cuda" else torch.device("cpu")
    shared = torch.tensor([math.nan if value is None else float(value)], dtype=torch.float64, device=where)
    dist.broadcast(shared, src=0)
    result = float(shared.item())
    return None if math.isnan(result) else result


def rank_seed(seed: int, rank: int, purpose: str) -> int:
    """A per-rank seed for randomness that must differ across ranks, stable across runs and machines."""
    digest = hashlib.sha256(f"{seed}:{purpose}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def wrap_model(
    model: nn.Module, mode: str, ctx: DistContext, device: torch.device, mesh: TrainMesh | None = None
) -> nn.Module:
    """DDP or FSDP2 around `model` for a multi-process run; the model itself for a single process.

    FSDP2 shards each transformer block as its own unit and the rest (embedding, final norm and the
    head, which may be tied to the embedding and must then live in one unit) at the root. A `mesh`
    with a "tp" dimension > 1 shards the model over it first (tensor_parallel.py) and FSDP2 then
    runs on the data-parallel sub-mesh; a "cp" dimension > 1 splits each sequence over it
    (context_parallel.py), with FSDP2 or DDP over the data-parallel x cp ranks.
    """
    if mode not in MODES:
        raise ConfigError(f"train.parallel = {mode!r} is not one of {', '.join(MODES)}.")
    if not ctx.distributed:
        return model
    if mesh is not None and mesh.layout.pp > 1:  # stages of layers over "pp": pipeline_parallel.py
        from smelt.train.parallel.pipeline import wrap_pipeline_parallel

        return wrap_pipeline_parallel(model, mesh, device)
    if mesh is not None and mesh.tensor_parallel:
        from smelt.train.parallel.tensor import wrap_tensor_parallel

        return wrap_tensor_parallel(model, mesh)
    if mesh is not None and mesh.context_parallel:
        from smelt.train.parallel.context import wrap_context_parallel

        return wrap_context_parallel(model, mode, mesh, device)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    from smelt.model.moe_parallel import expert_parameters

    ignored = expert_parameters(model) or None  # expert-parallel experts are sharded already
    for block in model.blocks:  # type: ignore[attr-defined]
        fully_shard(block, ignored_params=ignored)
    fully_shard(model, ignored_params=ignored)
    return model


@contextlib.contextmanager
def grad_sync(model: nn.Module, mode: str, sync: bool) -> Iterator[None]:
    """Synchronise gradients only on the last micro step of an accumulation (the others stay local)."""
    if sync or not dist.is_initialized():
        yield
        return
    # By what the wrapper offers, not by train.parallel: under tensor parallelism "ddp" data parallelism
    # is FSDP2 replicating over its ranks (tensor_parallel.py), whose switch is set_requires_gradient_sync.
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield


def _local(grad: torch.Tensor) -> torch.Tensor:
    # FSDP2 gradients are DTensors sharded over ranks; each rank squares and sums its own shard.
    return grad.to_local() if hasattr(grad, "to_local") else grad


def element_copies(grad: torch.Tensor, world_size: int) -> int:
    """On how many ranks each element of `grad` lives: a DTensor is split over its mesh's Shard
    dimensions and repeated over the rest (tensor-parallel norms are replicated over "tp", say);
    a plain tensor is on every rank."""
    if not hasattr(grad, "placements"):
        return world_size
    # Not `is_shard()`: FSDP2 over TP-sharded rows places a _StridedShard, which is no Shard subclass.
    splits = [i for i, p in enumerate(grad.placements) if not (p.is_replicate() or p.is_partial())]
    return world_size // math.prod(grad.device_mesh.size(i) for i in splits)


def reduce_partial_grads_(params: Iterable[nn.Parameter]) -> None:
    """Sum, in place, the gradients DTensor left as per-rank partial sums.

    Under sequence parallelism a replicated weight (an RMSNorm's) sees only its rank's rows, and
    DTensor defers the sum over "tp" (a Partial placement) until something needs the value; the norm
    and the clip need it now, so each such gradient becomes Replicate here, once.
    """
    for p in params:
        grad = p.grad
        if grad is not None and any(pl.is_partial() for pl in getattr(grad, "placements", ())):
            from torch.distributed.tensor import Replicate

            p.grad = grad.redistribute(
                grad.device_mesh, [Replicate() if pl.is_partial() else pl for pl in grad.placements]
            )


def global_grad_norm(params: Iterable[nn.Parameter], sharded: bool) -> torch.Tensor:
    """The L2 norm of all gradients together, in fp32, identical on every rank.

    Replicated gradients (single process, DDP after its all-reduce) are summed locally; sharded ones
    (FSDP2, tensor parallelism) are summed per shard and then across ranks, so the norm is the full
    model's, each element counted once however many ranks hold it (partial sums are summed first).
    """
    params = list(params)
    if sharded:
        reduce_partial_grads_(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    # vector_norm reduces each tensor in one pass for any thread count; a sum over more than 32,768
    # elements is split into per-thread partial sums, which made the clip depend on train.threads.
    norms = [torch.linalg.vector_norm(_local(g).detach().float()) for g in grads]
    if sharded and dist.is_initialized():
        # Summed over every rank, an element held by k ranks would count k times: divide by k.
        world = dist.get_world_size()
        copies = [element_copies(g, world) for g in grads]
        if any(k != 1 for k in copies):
            norms = [n / math.sqrt(k) for n, k in zip(norms, copies, strict=True)]
    squares = torch.stack(norms).pow(2).sum()
    if sharded:
        all_reduce_sum(squares)
    return squares.sqrt()


def clip_grads_(params: Iterable[nn.Parameter], norm: torch.Tensor, max_norm: float) -> None:
    """Scale all gradients by min(1, max_norm / norm): the global-norm clip, after accumulation."""
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        if p.grad is not None:
            _local(p.grad).mul_(coef.to(_local(p.grad).device, _local(p.grad).dtype))

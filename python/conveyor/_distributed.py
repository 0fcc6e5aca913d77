"""Pipelines across processes: the torch.distributed groups a conveyor.Pipeline
runs over under torchrun, one worker per process, and D data-parallel
replicas of the pipeline (pipeline x data parallelism)."""
import os
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._arguments import _fail, _int

__all__ = ["process_groups"]


def process_groups(workers: int) -> Tuple[dist.ProcessGroup, Optional[dist.ProcessGroup]]:
    """The groups of a job of ``world_size = replicas x workers`` processes,
    made with ``torch.distributed.new_group`` after ``init_process_group``:
    rank ``r`` runs worker ``r % workers`` of replica ``r // workers``.
    Returns ``(process_group, replica_group)`` for ``conveyor.Pipeline``:
    the ranks of this process's replica, and those running its worker in
    every replica (``None`` for one replica). Collective: every rank calls it,
    in the same order relative to its other ``new_group`` calls."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("conveyor.process_groups: call torch.distributed.init_process_group first "
                           "(under torchrun: init_process_group(backend=\"gloo\"))")
    workers = _int("workers", workers, 1)
    pipelines, replica_sets = _C.layout(dist.get_world_size(), workers)  # ValueError unless workers divides it
    if len(pipelines) == 1:
        return dist.group.WORLD, None
    pipeline_group = replica_group = None
    for ranks in pipelines:  # new_group is collective: every rank makes every group
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            pipeline_group = group
    for ranks in replica_sets:
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            replica_group = group
    return pipeline_group, replica_group


def _check_groups(process_group, replica_group, workers):
    """The groups as the C++ side takes them: ProcessGroups (or None), of
    consistent sizes; returns the local rank (LOCAL_RANK) picking the GPU."""
    if process_group is None:
        if replica_group is not None:
            _fail(ValueError, "replica_group", "given with a process_group", replica_group)
        return 0
    for name, group in (("process_group", process_group), ("replica_group", replica_group)):
        if group is not None and not isinstance(group, dist.ProcessGroup):
            _fail(TypeError, name, "a torch.distributed.ProcessGroup (conveyor.process_groups makes them)", group)
    if workers is not None and workers != process_group.size():
        raise ValueError(f"conveyor.Pipeline: workers={workers}, but the process_group holds "
                         f"{process_group.size()} processes: one worker runs in each")
    if dist.is_initialized() and replica_group is not None:
        pipelines, _ = _C.layout(dist.get_world_size(), process_group.size())
        if pipelines[replica_group.rank()][process_group.rank()] != dist.get_rank():
            raise ValueError(
                f"conveyor.Pipeline: rank {dist.get_rank()} is rank {process_group.rank()} of its process_group and "
                f"{replica_group.rank()} of its replica_group; Conveyor's layout runs worker r % workers of replica "
                f"r // workers on rank r: make the groups with conveyor.process_groups(workers)")
    local_rank = os.environ.get("LOCAL_RANK", "0")
    return int(local_rank) if local_rank.isdigit() else 0


def _shard(batch, replica: int, replicas: int, dim: int):
    """The replica's slice of a tensor (conveyor::shard), or of each tensor of a tuple, list or dict."""
    if isinstance(batch, (tuple, list)):
        return type(batch)(_shard(b, replica, replicas, dim) for b in batch)
    if isinstance(batch, dict):  # inputs by name
        return {k: _shard(v, replica, replicas, dim) for k, v in batch.items()}
    return _C.shard(batch, replica, replicas, dim) if isinstance(batch, torch.Tensor) else batch

"""wgrumus.distributed: collectives, process groups and launchers over threads of one process or
MPI processes; the layers built on them are loaded on first use."""
from __future__ import annotations

from ._lazy import lazy_getattr
from .barrier import CollectiveBarrier
from .collectives import (AllReduceStrategy, BroadcastStrategy, CollectiveConfig, ReduceStrategy,
                          TreeRole, child_ranks, compute_role, parent_rank, tree_depth)
from .comm import AllReduceHandle, BufferSlice, CommThread, async_allreduce
from .errors import CollectiveError
from .groups import ProcessGroupManager, RankMapping, ThreeDParallelismConfig
from .launch import init_process_group, spawn
from .process_group import ProcessGroup, Work
from .transport import MPITransport, ThreadTransport, ThreadWorld

_LAZY = {"PipelineStage": ".pipeline", "PipelineExecutor": ".pipeline",
         "ColumnParallelLinear": ".tensor_parallel", "RowParallelLinear": ".tensor_parallel",
         "FSDP": ".fsdp", "DataParallel": ".data_parallel", "AllReduceSync": ".averaging",
         "GradientAverager": ".averaging"}
__getattr__ = lazy_getattr(__name__, _LAZY, globals())

__all__ = ["CollectiveBarrier", "CollectiveError", "CollectiveConfig", "AllReduceStrategy",
           "ReduceStrategy", "BroadcastStrategy", "TreeRole", "compute_role", "parent_rank",
           "child_ranks", "tree_depth", "ProcessGroup", "Work", "ThreeDParallelismConfig",
           "RankMapping", "ProcessGroupManager", "spawn", "init_process_group", "ThreadWorld",
           "ThreadTransport", "MPITransport", "CommThread", "async_allreduce", "AllReduceHandle",
           "BufferSlice", "PipelineStage", "PipelineExecutor", "ColumnParallelLinear",
           "RowParallelLinear", "FSDP", "DataParallel", "AllReduceSync", "GradientAverager"]

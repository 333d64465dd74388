"""Data parallelism: replicas of a module on several devices (or processes) trained in lockstep
with bucketed gradient all-reduce overlapped with backward (DataParallel), and the simple
RUMUS-style averaging of whole gradient stores (AllReduceSync)."""
from .buckets import Bucket, BucketPlan, plan_buckets
from .data_parallel import DataParallel, ReplicaError, replicate, shard_sizes
from .sync import AllReduceSync, Event, EventLog, GradReducer

__all__ = ["DataParallel", "AllReduceSync", "ReplicaError", "Bucket", "BucketPlan",
           "plan_buckets", "replicate", "shard_sizes", "GradReducer", "Event", "EventLog"]

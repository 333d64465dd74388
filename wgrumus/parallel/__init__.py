"""The old import path of data parallelism, which lives in ``wgrumus.distributed``
(data_parallel.py, averaging.py, buckets.py): ``wr.parallel.DataParallel`` keeps working."""
from ..distributed.averaging import AllReduceSync, Event, EventLog, GradientAverager
from ..distributed.buckets import Bucket, BucketPlan, plan_buckets
from ..distributed.data_parallel import DataParallel, ReplicaError, replicate, shard_sizes

__all__ = ["DataParallel", "AllReduceSync", "ReplicaError", "Bucket", "BucketPlan",
           "plan_buckets", "replicate", "shard_sizes", "GradientAverager", "Event", "EventLog"]

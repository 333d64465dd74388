"""Tensor parallelism (Megatron): mappings (collectives inside autograd), the math on shards,
parallel layers, and sharding dense weights to TP shards and back."""
from .functional import (column_parallel_linear, parallel_mlp,
                         parallel_self_attention, row_parallel_linear,
                         vocab_parallel_cross_entropy, vocab_parallel_embedding, vocab_range)
from .mappings import (copy_to_tp_region, gather_from_sequence_parallel_region,
                       gather_from_tp_region, reduce_from_tp_region,
                       reduce_scatter_to_sequence_parallel_region,
                       scatter_to_sequence_parallel_region, scatter_to_tp_region)
from .layers import (ColumnParallelLinear, ParallelMLP, ParallelSelfAttention, RowParallelLinear,
                     VocabParallelEmbedding, dense_name, gather_state_dict, shard_gpt,
                     shard_linear)
from .shard import shard_state_dict, unshard_state_dicts

__all__ = ["copy_to_tp_region", "reduce_from_tp_region", "scatter_to_tp_region",
           "gather_from_tp_region", "scatter_to_sequence_parallel_region",
           "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
           "column_parallel_linear", "row_parallel_linear", "parallel_mlp",
           "parallel_self_attention", "vocab_parallel_embedding",
           "vocab_parallel_cross_entropy", "vocab_range", "ColumnParallelLinear",
           "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention", "VocabParallelEmbedding",
           "shard_linear", "shard_gpt", "dense_name", "gather_state_dict", "shard_state_dict",
           "unshard_state_dicts"]

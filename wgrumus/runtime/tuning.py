"""Overrides of the adapter profile's choices, one object for the whole process: tests, sweeps
and A/B benchmarks set a field (None leaves the choice to the profile and the kernel tables)."""
from __future__ import annotations

import os
from dataclasses import dataclass


def _env_flag(name: str) -> bool | None:
    v = os.environ.get(name, "")
    return None if v == "" else v not in ("0", "false", "no")


@dataclass
class Tuning:
    cpu_matmul: bool | None = None  # True: matmul_cpu.wgsl, False: the tiled matmul.wgsl
    matmul_textures: bool | None = None  # CPU matmul operands read through textures
    matmul_quad_stores: bool | None = None  # False: the CPU matmul stores C per element
    matmul_subgroup_rows: bool | None = None  # False: A's rows not shared over the subgroup
    texture_reads: bool | None = None  # read-heavy CPU kernels' operands through textures
    row_mode: str | None = None  # "wg" or "thread" for the row ops (softmax, layer_norm, ...)
    row_variant: str | None = None  # a rows_gpu.ROW_VARIANTS name run wherever it applies
    subgroup_min: int | None = None  # the adapter's smallest / largest subgroup size
    subgroup_max: int | None = None
    attention_variant: str | None = None  # an attention_gpu.VARIANTS name
    cpu_attention: bool | None = None  # the CPU adapters' attention kernel (attention_cpu.wgsl)
    map_chunk: int | None = None  # outputs per invocation of the map kernel
    update_chunk: int | None = None  # elements per invocation of the multi-tensor update
    submitter: bool | None = None  # the replay submitter thread (runtime/submitter.py)
    # tensor parallel: the row-parallel output all-reduce in this many token chunks, chunk k's
    # all-reduce running while chunk k+1 is multiplied (None: 1, one all-reduce)
    tp_chunks: int | None = None
    # tensor parallel: the column-parallel input gradient's all-reduce started as soon as dX
    # exists and waited after the weight gradient (None: on); False waits for it at once
    tp_overlap: bool | None = None
    # waits for the GPU (maps, synchronize): True a blocking poll, which stalls other threads'
    # submits to the device until it is idle; False non-blocking polls; None: block on CPU
    # adapters (their cores run the kernels), poll on GPUs. WGRUMUS_BLOCKING_WAITS=0/1 sets it.
    blocking_waits: bool | None = _env_flag("WGRUMUS_BLOCKING_WAITS")


TUNING = Tuning()

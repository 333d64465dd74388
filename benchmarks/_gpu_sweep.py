"""Tuning sweep for one GPU session: matmul tile variants, staging strategies, the
cooperative-matrix probe. Prints one JSON line per measurement (kept for re-tuning on new GPUs).

    python3 benchmarks/_gpu_sweep.py [--sizes 1024,4096] [--mb 256]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
os.environ.setdefault("WGRUMUS_DEVICES", "1")


def emit(**kw):
    print(json.dumps(kw), flush=True)


def timeit(fn, sync, min_s=0.3, min_n=3, max_n=200):
    """Seconds per call: one warm-up, one timed probe, then n calls queued back to back."""
    fn(); sync()
    t0 = time.perf_counter(); fn(); sync()
    one = time.perf_counter() - t0
    n = int(min(max_n, max(min_n, min_s / max(one, 1e-6))))
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n


def sweep_matmul(sizes, variants):
    import wgrumus as wr
    mm = importlib.import_module("wgrumus.kernels.matmul_gpu")
    dev = wr.devices()[0]
    emit(what="adapter", info={k: str(v) for k, v in dev.adapter_info.items()},
         features=sorted(dev.adapter.features))
    orig = mm._pick_tile
    for n in sizes:
        a = wr.randn((n, n), seed=1)
        b = wr.randn((n, n), seed=2)
        for layout in ("nn", "tn", "nt"):
            ta = a.transpose(0, 1) if layout[0] == "t" else a
            tb = b.transpose(0, 1) if layout[1] == "t" else b
            for v in variants:
                if layout != "nn" and v != variants[0]:
                    continue
                mm._pick_tile = lambda *x, v=v: v
                try:
                    dt = timeit(lambda: ta @ tb, dev.synchronize)
                    emit(what="matmul", n=n, layout=layout, tile=v, ms=dt * 1e3,
                         gflops=2 * n ** 3 / dt / 1e9)
                except Exception as e:
                    emit(what="matmul", n=n, layout=layout, tile=v, error=str(e)[:500])
        mm._pick_tile = orig
    # the same kernel compiled with wgpu's runtime checks, for the record
    from wgrumus.runtime import device as dmod
    keep = dmod.TRUSTED_FAMILIES
    dmod.TRUSTED_FAMILIES = frozenset()
    dev._pipelines.clear()
    n = sizes[-1]
    a = wr.randn((n, n), seed=1)
    b = wr.randn((n, n), seed=2)
    mm._pick_tile = lambda *x: variants[0]
    dt = timeit(lambda: a @ b, dev.synchronize)
    emit(what="matmul", n=n, layout="nn", tile=variants[0], checked=True, ms=dt * 1e3,
         gflops=2 * n ** 3 / dt / 1e9)
    dmod.TRUSTED_FAMILIES = keep
    dev._pipelines.clear()
    mm._pick_tile = orig
    try:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        for n in sizes:
            x = torch.randn(n, n, device="cuda")
            y = torch.randn(n, n, device="cuda")
            dt = timeit(lambda: x @ y, torch.cuda.synchronize)
            emit(what="torch_matmul", n=n, ms=dt * 1e3, gflops=2 * n ** 3 / dt / 1e9)
    except Exception as e:
        emit(what="torch_matmul", error=str(e)[:300])


def sweep_staging(mb):
    import wgpu

    import wgrumus as wr
    dev = wr.devices()[0]
    nbytes = mb << 20
    host = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    t = wr.zeros((nbytes // 4,))
    buf = t._storage.buffer
    # write_buffer (current path)
    dt = timeit(lambda: dev.write(buf, host), dev.synchronize)
    emit(what="h2d", how="queue.write_buffer", mb=mb, gbps=nbytes / dt / 1e9)
    # mapped MAP_WRITE staging, one buffer, re-mapped after each copy
    st = dev.wgpu.create_buffer(size=nbytes, usage=wgpu.BufferUsage.MAP_WRITE
                                | wgpu.BufferUsage.COPY_SRC, mapped_at_creation=True)

    def up_mapped():
        st.write_mapped(host, 0)
        st.unmap()
        enc = dev.wgpu.create_command_encoder()
        enc.copy_buffer_to_buffer(st, 0, buf, 0, nbytes)
        dev.queue.submit([enc.finish()])
        st.map_sync("WRITE")
    dt = timeit(up_mapped, dev.synchronize)
    emit(what="h2d", how="map_write+copy (sync remap)", mb=mb, gbps=nbytes / dt / 1e9)
    # mapped range via numpy (threaded copy into the mapping)
    def up_threads(nt=8):
        mv = st._experimental_get_mapped_range(0, nbytes)
        dst = np.frombuffer(mv, np.uint8)
        _par_copy(dst, host, nt)
        del dst, mv
        st.unmap()
        enc = dev.wgpu.create_command_encoder()
        enc.copy_buffer_to_buffer(st, 0, buf, 0, nbytes)
        dev.queue.submit([enc.finish()])
        st.map_sync("WRITE")
    for nt in (1, 4, 8):
        dt = timeit(lambda: up_threads(nt), dev.synchronize)
        emit(what="h2d", how=f"map_write threaded memcpy x{nt}", mb=mb, gbps=nbytes / dt / 1e9)
    st.unmap(); st.destroy()
    # download: current read_array
    dt = timeit(lambda: t.numpy(), lambda: None)
    emit(what="d2h", how="tensor.numpy (device.read_array)", mb=mb, gbps=nbytes / dt / 1e9)
    out = np.empty(nbytes, np.uint8)
    rd = dev.wgpu.create_buffer(size=nbytes, usage=wgpu.BufferUsage.MAP_READ
                                | wgpu.BufferUsage.COPY_DST)

    def down(nt, dst):
        enc = dev.wgpu.create_command_encoder()
        enc.copy_buffer_to_buffer(buf, 0, rd, 0, nbytes)
        dev.queue.submit([enc.finish()])
        rd.map_sync("READ_NOSYNC")
        mv = rd.read_mapped(0, nbytes, copy=False)
        _par_copy(dst, np.frombuffer(mv, np.uint8), nt)
        del mv
        rd.unmap()
    for nt in (1, 4, 8):
        dt = timeit(lambda: down(nt, out), lambda: None)
        emit(what="d2h", how=f"map_read threaded memcpy x{nt} prealloc", mb=mb,
             gbps=nbytes / dt / 1e9)

    def down_map_only():
        enc = dev.wgpu.create_command_encoder()
        enc.copy_buffer_to_buffer(buf, 0, rd, 0, nbytes)
        dev.queue.submit([enc.finish()])
        rd.map_sync("READ_NOSYNC")
        rd.unmap()
    dt = timeit(down_map_only, lambda: None)
    emit(what="d2h", how="copy+map only (no memcpy)", mb=mb, gbps=nbytes / dt / 1e9)
    dt = timeit(lambda: _par_copy(out, host, 1), lambda: None)
    emit(what="host", how="numpy memcpy x1", mb=mb, gbps=nbytes / dt / 1e9)
    dt = timeit(lambda: _par_copy(out, host, 8), lambda: None)
    emit(what="host", how="numpy memcpy x8", mb=mb, gbps=nbytes / dt / 1e9)
    try:
        import torch
        g = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        p = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dt = timeit(lambda: g.copy_(p, non_blocking=True), torch.cuda.synchronize)
        emit(what="h2d", how="torch pinned", mb=mb, gbps=nbytes / dt / 1e9)
        dt = timeit(lambda: p.copy_(g, non_blocking=True), torch.cuda.synchronize)
        emit(what="d2h", how="torch pinned", mb=mb, gbps=nbytes / dt / 1e9)
    except Exception as e:
        emit(what="torch_copy", error=str(e)[:300])


_POOL = {}


def _par_copy(dst, src, nt):
    if nt == 1:
        np.copyto(dst, src)
        return
    n = len(src)
    step = -(-n // nt)
    ths = [threading.Thread(target=np.copyto, args=(dst[i:i + step], src[i:i + step]))
           for i in range(0, n, step)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()


def sweep_read_params(mb):
    """Download/upload through the Device paths for several chunk sizes, chunks in flight and
    copy thread counts."""
    import wgrumus as wr
    from wgrumus.runtime import staging as dmod
    dev = wr.devices()[0]
    n = (mb << 20) // 4
    host = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    t = wr.tensor(host)
    buf = t._storage.buffer
    out = np.empty_like(host)
    keep = (dmod.COPY_THREADS, dmod.READ_CHUNK, dmod.READ_INFLIGHT)
    for th in (8, 16):
        dmod.COPY_THREADS = th
        dt = timeit(lambda: dev.write(buf, host), dev.synchronize)
        emit(what="h2d", how="device.write", threads=th, gbps=host.nbytes / dt / 1e9)
        for chunk in (16, 32, 64):
            for inflight in (2, 3, 4):
                dmod.READ_CHUNK, dmod.READ_INFLIGHT = chunk << 20, inflight
                dt = timeit(lambda: dev.read_array(buf, 0, n, np.float32, out=out), lambda: None)
                dt2 = timeit(lambda: t.numpy(), lambda: None)
                emit(what="d2h", how="read_array", threads=th, chunk_mb=chunk,
                     inflight=inflight, prealloc_gbps=host.nbytes / dt / 1e9,
                     fresh_gbps=host.nbytes / dt2 / 1e9)
    assert np.array_equal(out, host)
    dmod.COPY_THREADS, dmod.READ_CHUNK, dmod.READ_INFLIGHT = keep


def sweep_write_params(mb):
    """Uploads through Device.write for several chunk sizes and copy thread counts, each
    repeated to show the run-to-run spread; downloads into a given array likewise."""
    import wgrumus as wr
    from wgrumus.runtime import staging as dmod
    dev = wr.devices()[0]
    n = (mb << 20) // 4
    host = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    t = wr.tensor(host)
    buf = t._storage.buffer
    out = np.empty_like(host)
    keep = (dmod.COPY_THREADS, dmod.WRITE_CHUNK)
    for th in (8, 16):
        dmod.COPY_THREADS = th
        for chunk in (1 << 10, 128, 64, 32):
            dmod.WRITE_CHUNK = chunk << 20
            g = [host.nbytes / timeit(lambda: dev.write(buf, host), dev.synchronize) / 1e9
                 for _ in range(3)]
            emit(what="h2d", how="device.write", threads=th, chunk_mb=chunk, gbps=g)
        g = [host.nbytes / timeit(lambda: dev.read_array(buf, 0, n, np.float32, out=out),
                                  lambda: None) / 1e9 for _ in range(3)]
        emit(what="d2h", how="read_array(out=)", threads=th, gbps=g)
    g = [host.nbytes / timeit(lambda: t.numpy(), lambda: None) / 1e9 for _ in range(3)]
    emit(what="d2h", how="Tensor.numpy zero-copy", gbps=g)
    assert np.array_equal(t.numpy(), host)
    dmod.COPY_THREADS, dmod.WRITE_CHUNK = keep


def small_ops(n_ops=2000):
    import wgrumus as wr
    dev = wr.devices()[0]
    x = wr.ones((1024,))

    def chain():
        y = x
        for _ in range(100):
            y = y + 1.0
        return y
    dt = timeit(chain, dev.synchronize, min_s=1.0)
    emit(what="small_ops", ops_per_s=100 / dt)


COOP = r"""
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> ma: array<f32>;
@group(0) @binding(1) var<storage, read> mb: array<f32>;
@group(0) @binding(2) var<storage, read_write> mc: array<f32>;
@compute @workgroup_size(32, 1, 1)
fn main() {
    var c = coopLoad<coop_mat8x8<f32, C>>(&mc[0], 8u);
    let a = coopLoad<coop_mat8x8<f32, A>>(&ma[0], 8u);
    let b = coopLoad<coop_mat8x8<f32, B>>(&mb[0], 8u);
    c = coopMultiplyAdd(a, b, c);
    coopStore(c, &mc[0], 8u);
}
"""


def coop_probe():
    """Can wgpu-py enable 'cooperative-matrix' and run an 8x8 f32 product? Records each step."""
    import wgpu
    ad = [a for a in wgpu.gpu.enumerate_adapters_sync() if a.info.get("backend_type") == "Vulkan"]
    if not ad:
        emit(what="coop", step="adapter", error="no Vulkan adapter"); return
    ad = ad[0]
    listed = "cooperative-matrix" in ad.features
    emit(what="coop", step="adapter features", listed=listed,
         shader_f16="shader-f16" in ad.features, subgroup="subgroup" in ad.features)
    try:
        d = ad.request_device_sync(required_features=["cooperative-matrix"])
        emit(what="coop", step="request_device", ok=True, features=sorted(d.features))
    except Exception as e:
        emit(what="coop", step="request_device", ok=False, error=str(e)[:800]); return
    try:
        m = d.create_shader_module(code=COOP)
        p = d.create_compute_pipeline(layout="auto", compute={"module": m, "entry_point": "main"})
        emit(what="coop", step="compile", ok=True)
    except Exception as e:
        emit(what="coop", step="compile", ok=False, error=str(e)[:1500]); return
    try:
        a = np.random.rand(8, 8).astype(np.float32)
        b = np.random.rand(8, 8).astype(np.float32)
        U = wgpu.BufferUsage
        ba = d.create_buffer_with_data(data=a, usage=U.STORAGE)
        bb = d.create_buffer_with_data(data=b, usage=U.STORAGE)
        bc = d.create_buffer_with_data(data=np.zeros((8, 8), np.float32),
                                       usage=U.STORAGE | U.COPY_SRC)
        bg = d.create_bind_group(layout=p.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": x}} for i, x in enumerate((ba, bb, bc))])
        enc = d.create_command_encoder()
        cp = enc.begin_compute_pass(); cp.set_pipeline(p); cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(1); cp.end()
        d.queue.submit([enc.finish()])
        c = np.frombuffer(d.queue.read_buffer(bc), np.float32).reshape(8, 8)
        emit(what="coop", step="run", ok=True, max_err=float(np.abs(c - a @ b).max()))
    except Exception as e:
        emit(what="coop", step="run", ok=False, error=str(e)[:800])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1024,2048,4096")
    p.add_argument("--variants", default="8,8,0;8,8,8;4,16,0")
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--only", default="matmul,staging,small,coop")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    variants = [tuple(int(x) for x in v.split(",")) for v in a.variants.split(";")]
    only = a.only.split(",")
    if "coop" in only:  # in a child: an experimental feature may crash the process
        try:
            r = subprocess.run([sys.executable, __file__, "--only", "coopchild"], timeout=120,
                               capture_output=True, text=True)
            print(r.stdout, end="")
            if r.returncode:
                emit(what="coop", step="process", rc=r.returncode, stderr=r.stderr[-1500:])
        except subprocess.TimeoutExpired:
            emit(what="coop", step="process", error="timed out after 120 s")
    if "coopchild" in only:
        coop_probe()
    if "matmul" in only:
        sweep_matmul(sizes, variants)
    if "staging" in only:
        sweep_staging(a.mb)
    if "small" in only:
        small_ops()
    if "writeparams" in only:
        sweep_write_params(a.mb)
    if "readparams" in only:
        sweep_read_params(a.mb)


if __name__ == "__main__":
    main()

// Scatter with a reduction, written as a gather over the index (no atomics, the same bits every
// run): one invocation per destination element (o, a, col) of [outer, A, inner] loops over the
// index entries j of its column and combines SRC[o, j, col] where IDX[o, j, col] == a, in
// ascending j (so plain scatter keeps the last write).
// Defines: T (f32 or i32), COMBINE(x, y) as a T expression.
// Words: 0 n (outer * A * inner), 1 A, 2 J, 3 inner, 4 src off, 5 idx off, 6 j0, 7 j1 (this pass
// takes j0 <= j < j1: long index columns take several passes), 8 accumulate (0: the first pass,
// starting from ACC / CNT as initialised by the caller), 9 assert op code.
@group(0) @binding(1) var<storage, read> SRC: array<{{T}}>;
@group(0) @binding(2) var<storage, read> IDX: array<i32>;
@group(0) @binding(3) var<storage, read_write> ACC: array<{{T}}>;
@group(0) @binding(4) var<storage, read_write> CNT: array<f32>;
@group(0) @binding(5) var<storage, read_write> FLAG: array<atomic<u32>>;

fn combine(x: {{T}}, y: {{T}}) -> {{T}} { return {{COMBINE}}; }

@compute @workgroup_size(256)
fn main(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    let A = pu(1u);
    let J = pu(2u);
    let inner = pu(3u);
    let col = i % inner;
    let a = (i / inner) % A;
    let o = i / (inner * A);
    var acc = ACC[i];
    var cnt = CNT[i];
    for (var j = pu(6u); j < pu(7u); j++) {
        let e = (o * J + j) * inner + col;
        let v = IDX[pu(5u) + e];
        if (a == 0u && (v < 0 || v >= i32(A))) {  // one reporter per index entry
            let r = atomicCompareExchangeWeak(&FLAG[0], 0u, pu(9u));
            if (r.exchanged || r.old_value == 0u) {
                atomicStore(&FLAG[0], pu(9u));
                atomicStore(&FLAG[1], bitcast<u32>(v));
                atomicStore(&FLAG[2], A);
            }
        }
        if (v == i32(a)) {
            acc = select(combine(acc, SRC[pu(4u) + e]), SRC[pu(4u) + e], cnt == 0.0);
            cnt += 1.0;
        }
    }
    ACC[i] = acc;
    CNT[i] = cnt;
}

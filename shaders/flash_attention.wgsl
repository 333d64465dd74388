// Fused attention, one row per invocation (the row kernel): softmax(scale * q k^T [causal]) v
// without the [Tq, Tk] score matrix, no workgroup memory and no barriers (CPU adapters at small
// head sizes, adapters whose workgroup memory holds no flash_attention2.wgsl tile; see
// ops/attention.py). Q, K, V: contiguous [BH, T, D] blocks of storage type T (f32 or f16); all
// math in f32. A workgroup owns WG consecutive rows of one (batch, head): every invocation one
// row, reading the other side (keys in fwd / bwd_q, queries in bwd_kv) from storage in blocks
// of BK rows, with an online softmax in fwd. The block loop nests a loop of BK rows inside one
// of ceil(T / BK) blocks. llvmpipe stops a shader loop after 65,535 iterations per
// invocation, counting every loop it does not unroll: rows are held as D4 = ceil(D / 4) vec4s
// (D4 <= 32: the loops over them unroll) and the BK loop has a constant trip count and no
// break, so only the block loop counts.
// Causal (Tq == Tk): key j is visible to query i iff j <= i.
// Entries:
//   fwd:    O = softmax(s) v and LSE = logsumexp(s) per query row (f32).
//   bwd_q:  DSUM_i = dO_i . O_i, dQ_i = scale * sum_j P_ij (dO_i . V_j - DSUM_i) K_j, with
//           P_ij = exp(s_ij - LSE_i) recomputed from the saved LSE.
//   bwd_kv: dV_j = sum_i P_ij dO_i, dK_j = scale * sum_i P_ij (dO_i . V_j - DSUM_i) Q_i.
// Words: 0 BH, 1 Tq, 2 Tk, 3 q off, 4 k off, 5 v off, 6 W1 off, 7 W2 off, 8 scale,
//        9 causal, 10 row blocks per (batch, head), 11 O off, 12 dO off, 13 LSE off, 14 DSUM off.
@group(0) @binding(1) var<storage, read> Q: array<{{T}}>;
@group(0) @binding(2) var<storage, read> K: array<{{T}}>;
@group(0) @binding(3) var<storage, read> V: array<{{T}}>;
// fwd: O, LSE; bwd_q: dQ, DSUM; bwd_kv: dK, dV
@group(0) @binding(4) var<storage, read_write> W1: array<f32>;
@group(0) @binding(5) var<storage, read_write> W2: array<f32>;
@group(0) @binding(6) var<storage, read> OS: array<f32>;
@group(0) @binding(7) var<storage, read> DO: array<f32>;
@group(0) @binding(8) var<storage, read> LS: array<f32>;
@group(0) @binding(9) var<storage, read> DS: array<f32>;

const WG: u32 = {{WG}}u;
const BK: u32 = {{BK}}u;
const D: u32 = {{D}}u;  // head size, a multiple of 4
const D4: u32 = D / 4u;

struct Rows { bh: u32, i: u32, i0: u32, ok: bool }

// The (batch-head, row) of this invocation among n rows per batch-head.
fn rows_of(ids: Launch, n: u32) -> Rows {
    let g = group_idx(ids);
    let bh = g / pu(10u);
    let i0 = (g % pu(10u)) * WG;
    let i = i0 + ids.lid;
    return Rows(bh, i, i0, bh < pu(0u) && i < n);
}

// Elements 4 c4 .. 4 c4 + 3 of the row at element `base`, as f32 (D is a multiple of 4: the
// caller pads the head size).
fn ldq(b: u32, c4: u32) -> vec4<f32> {
    let x = b + 4u * c4;
    return vec4<f32>(f32(Q[x]), f32(Q[x + 1u]), f32(Q[x + 2u]), f32(Q[x + 3u]));
}
fn ldk(b: u32, c4: u32) -> vec4<f32> {
    let x = b + 4u * c4;
    return vec4<f32>(f32(K[x]), f32(K[x + 1u]), f32(K[x + 2u]), f32(K[x + 3u]));
}
fn ldv(b: u32, c4: u32) -> vec4<f32> {
    let x = b + 4u * c4;
    return vec4<f32>(f32(V[x]), f32(V[x + 1u]), f32(V[x + 2u]), f32(V[x + 3u]));
}
fn ldo(b: u32, c4: u32) -> vec4<f32> {
    let x = b + 4u * c4;
    return vec4<f32>(OS[x], OS[x + 1u], OS[x + 2u], OS[x + 3u]);
}
fn lddo(b: u32, c4: u32) -> vec4<f32> {
    let x = b + 4u * c4;
    return vec4<f32>(DO[x], DO[x + 1u], DO[x + 2u], DO[x + 3u]);
}
fn st1(b: u32, c4: u32, v: vec4<f32>) {
    let x = b + 4u * c4;
    W1[x] = v.x;
    W1[x + 1u] = v.y;
    W1[x + 2u] = v.z;
    W1[x + 3u] = v.w;
}
fn st2(b: u32, c4: u32, v: vec4<f32>) {
    let x = b + 4u * c4;
    W2[x] = v.x;
    W2[x + 1u] = v.y;
    W2[x + 2u] = v.z;
    W2[x + 3u] = v.w;
}

// Keys of query tile [i0, i0 + WG) (causal: up to the tile's last row).
fn key_end(i0: u32) -> u32 {
    if (pu(9u) != 0u) { return min(pu(2u), i0 + WG); }
    return pu(2u);
}

// This row's keys: up to the tile's (uniform) end, or up to its own position when causal.
fn my_key_end(r: Rows, kend: u32) -> u32 {
    return select(min(kend, r.i + 1u), kend, pu(9u) == 0u);
}

@compute @workgroup_size({{WG}})
fn fwd(ids: Launch) {
    let Tq = pu(1u);
    let Tk = pu(2u);
    let r = rows_of(ids, Tq);
    let sc = pf(8u);
    let row = r.bh * Tq + r.i;
    let qb = pu(3u) + select(0u, row * D, r.ok);
    let kb = pu(4u) + r.bh * Tk * D;
    let vb = pu(5u) + r.bh * Tk * D;
    var q: array<vec4<f32>, D4>;
    var acc: array<vec4<f32>, D4>;
    for (var c = 0u; c < D4; c++) {
        q[c] = ldq(qb, c) * sc;
        acc[c] = vec4<f32>(0.0);
    }
    var m = LOWEST_F32;
    var l = 0.0;
    let kend = key_end(r.i0);
    let mine = my_key_end(r, kend);
    for (var t = 0u; t < kend; t += BK) {
        for (var jj = 0u; jj < BK; jj++) {
            let j = t + jj;
            if (r.ok && j < mine) {
                var s = 0.0;
                for (var c = 0u; c < D4; c++) { s += dot(q[c], ldk(kb + j * D, c)); }
                let mn = max(m, s);
                let f = exp(m - mn);
                let p = exp(s - mn);
                l = l * f + p;
                for (var c = 0u; c < D4; c++) { acc[c] = acc[c] * f + p * ldv(vb + j * D, c); }
                m = mn;
            }
        }
    }
    if (!r.ok) { return; }
    let inv = 1.0 / l;
    for (var c = 0u; c < D4; c++) { st1(pu(6u) + row * D, c, acc[c] * inv); }
    W2[pu(7u) + row] = m + log(l);
}

@compute @workgroup_size({{WG}})
fn bwd_q(ids: Launch) {
    let Tq = pu(1u);
    let Tk = pu(2u);
    let r = rows_of(ids, Tq);
    let sc = pf(8u);
    let row = r.bh * Tq + r.i;
    let x = select(0u, row * D, r.ok);
    let kb = pu(4u) + r.bh * Tk * D;
    let vb = pu(5u) + r.bh * Tk * D;
    var q: array<vec4<f32>, D4>;
    var go: array<vec4<f32>, D4>;
    var dq: array<vec4<f32>, D4>;
    var dsum = 0.0;
    for (var c = 0u; c < D4; c++) {
        q[c] = ldq(pu(3u) + x, c) * sc;
        go[c] = lddo(pu(12u) + x, c);
        dsum += dot(go[c], ldo(pu(11u) + x, c));
        dq[c] = vec4<f32>(0.0);
    }
    let lse = LS[pu(13u) + select(0u, row, r.ok)];
    let kend = key_end(r.i0);
    let mine = my_key_end(r, kend);
    for (var t = 0u; t < kend; t += BK) {
        for (var jj = 0u; jj < BK; jj++) {
            let j = t + jj;
            if (r.ok && j < mine) {
                var s = 0.0;
                var dp = 0.0;
                for (var c = 0u; c < D4; c++) {
                    s += dot(q[c], ldk(kb + j * D, c));
                    dp += dot(go[c], ldv(vb + j * D, c));
                }
                let ds = exp(s - lse) * (dp - dsum);
                for (var c = 0u; c < D4; c++) { dq[c] += ds * ldk(kb + j * D, c); }
            }
        }
    }
    if (!r.ok) { return; }
    for (var c = 0u; c < D4; c++) { st1(pu(6u) + row * D, c, dq[c] * sc); }
    W2[pu(7u) + row] = dsum;
}

@compute @workgroup_size({{WG}})
fn bwd_kv(ids: Launch) {
    let Tq = pu(1u);
    let Tk = pu(2u);
    let r = rows_of(ids, Tk);  // r.i: this invocation's key
    let sc = pf(8u);
    let row = r.bh * Tk + r.i;
    let x = select(0u, row * D, r.ok);
    let qb = pu(3u) + r.bh * Tq * D;
    let dob = pu(12u) + r.bh * Tq * D;
    let lb = r.bh * Tq;
    var k: array<vec4<f32>, D4>;
    var v: array<vec4<f32>, D4>;
    var dk: array<vec4<f32>, D4>;
    var dv: array<vec4<f32>, D4>;
    for (var c = 0u; c < D4; c++) {
        k[c] = ldk(pu(4u) + x, c) * sc;
        v[c] = ldv(pu(5u) + x, c);
        dk[c] = vec4<f32>(0.0);
        dv[c] = vec4<f32>(0.0);
    }
    let causal = pu(9u) != 0u;
    // causal: queries i >= j only; the tile loop starts at the tile of this tile's first key
    let first = select(0u, (r.i0 / BK) * BK, causal);
    let mine = select(0u, r.i, causal);
    for (var t = first; t < Tq; t += BK) {
        for (var ii = 0u; ii < BK; ii++) {
            let i = t + ii;
            if (r.ok && i < Tq && i >= mine) {
                var s = 0.0;
                var dp = 0.0;
                for (var c = 0u; c < D4; c++) {
                    s += dot(ldq(qb + i * D, c), k[c]);
                    dp += dot(lddo(dob + i * D, c), v[c]);
                }
                let lse = LS[pu(13u) + lb + i];
                let dsum = DS[pu(14u) + lb + i];
                let p = exp(s - lse);
                let ds = p * (dp - dsum);
                for (var c = 0u; c < D4; c++) {
                    dv[c] += p * lddo(dob + i * D, c);
                    dk[c] += ds * ldq(qb + i * D, c);
                }
            }
        }
    }
    if (!r.ok) { return; }
    for (var c = 0u; c < D4; c++) {
        st1(pu(6u) + row * D, c, dk[c] * sc);
        st2(pu(7u) + row * D, c, dv[c]);
    }
}

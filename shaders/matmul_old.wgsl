// C[b] = A[b] @ B[b] for strided A (M x K) and B (K x N); C contiguous (M x N) per batch.
// Register-blocked: a 16x16 workgroup computes a 64x64 tile, each invocation a 4x4 block, over
// K in steps of 16 staged through workgroup memory. Any strides, so transposed operands
// (Linear's weight, backward's A^T and B^T) need no copy.
// Words: 0 M, 1 N, 2 K, 3..6 A (offset, batch, row, col stride), 7..10 B (same), 11 C offset,
// 12 batch offset (for batches split over several dispatches).
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;

var<workgroup> As: array<vec4<f32>, 256>;  // [16 k][16 m-quads]
var<workgroup> Bs: array<vec4<f32>, 256>;  // [16 k][16 n-quads]

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let M = pu(0u);
    let N = pu(1u);
    let K = pu(2u);
    let bz = wid.z + pu(12u);
    let a0 = pu(3u) + bz * pu(4u);
    let ars = pu(5u);
    let acs = pu(6u);
    let b0 = pu(7u) + bz * pu(8u);
    let brs = pu(9u);
    let bcs = pu(10u);
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let t = lid.y * 16u + lid.x;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < K; k0 += 16u) {
        // Each invocation stages 4 values of A (one m-quad at one k) and 4 of B.
        let kk = t / 16u;
        let q = t % 16u;
        let k = k0 + kk;
        var av = vec4<f32>(0.0);
        var bv = vec4<f32>(0.0);
        if (k < K) {
            for (var e = 0u; e < 4u; e++) {
                let m = row0 + q * 4u + e;
                if (m < M) { av[e] = A[a0 + m * ars + k * acs]; }
                let n = col0 + q * 4u + e;
                if (n < N) { bv[e] = B[b0 + k * brs + n * bcs]; }
            }
        }
        As[kk * 16u + q] = av;
        Bs[kk * 16u + q] = bv;
        workgroupBarrier();
        for (var j = 0u; j < 16u; j++) {
            let a = As[j * 16u + lid.y];
            let b = Bs[j * 16u + lid.x];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    let c0 = pu(11u) + bz * M * N;
    for (var i = 0u; i < 4u; i++) {
        let m = row0 + lid.y * 4u + i;
        if (m >= M) { continue; }
        for (var e = 0u; e < 4u; e++) {
            let n = col0 + lid.x * 4u + e;
            if (n < N) { C[c0 + m * N + n] = acc[i][e]; }
        }
    }
}

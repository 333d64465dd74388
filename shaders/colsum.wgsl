// Column sums of a contiguous [C, L] block of partial sums (second pass of a column
// reduction, e.g. the bias gradient of shaders/linear.wgsl). words: 0 L, 1 C, 2 P offset,
// 3 S offset. Workgroup row y sums block y: P[y * C * L ...] into S[y * L ...].
@group(0) @binding(1) var<storage, read> P: array<f32>;
@group(0) @binding(2) var<storage, read_write> S: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let L = pu(0u);
    let j = gid.x;
    if (j >= L) { return; }
    let C = pu(1u);
    let p0 = pu(2u) + gid.y * C * L + j;
    // eight independent sums: eight loads in flight instead of one dependent chain (C is a
    // few dozen rows, so the loop is latency-bound)
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var c = 0u;
    for (; c + 8u <= C; c += 8u) {
        let q = p0 + c * L;
        s0 += vec4<f32>(P[q], P[q + L], P[q + 2u * L], P[q + 3u * L]);
        s1 += vec4<f32>(P[q + 4u * L], P[q + 5u * L], P[q + 6u * L], P[q + 7u * L]);
    }
    let s2 = s0 + s1;
    var s = (s2.x + s2.y) + (s2.z + s2.w);
    for (; c < C; c++) { s += P[p0 + c * L]; }
    S[pu(3u) + gid.y * L + j] = s;
}

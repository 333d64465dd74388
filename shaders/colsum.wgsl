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
    var s = 0.0;
    for (var c = 0u; c < C; c++) { s += P[p0 + c * L]; }
    S[pu(3u) + gid.y * L + j] = s;
}

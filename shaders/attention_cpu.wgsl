// Attention of short sequences for CPU adapters (llvmpipe), on a packed projection qkv
// [B, T, 3, H, d] (ops/attention_cpu.py): softmax(scale q k^T, causal) v in one dispatch and its
// backward in two, where the unfused composition takes eight (two matmuls and a softmax, and
// their backwards), each paying llvmpipe's ~20 us a dispatch and a texture copy per operand.
// A workgroup is one subgroup of W lanes (llvmpipe: one AVX2 vector) on W rows of one (batch,
// head): queries (fwd, bwd_q) or keys (bwd_kv). The rows that every lane reads (k and v, or q
// and d(out)) are fetched one texel a lane and handed to all lanes by subgroupBroadcast:
// llvmpipe's texel fetch costs about W broadcasts. T is a constant and the code over a row's T
// keys is unrolled on the host (named registers): llvmpipe compiles a dynamically indexed
// private array of n floats into n-way selects per access (seconds per pipeline).
// Operands are read through textures (ops/texread.py; texel q at (q % TEX_W, q / TEX_W)),
// outputs stored a quad at a time where they can be (a storage write costs llvmpipe a loop
// over the lanes per store).
// Words: 0 B*H, 2 H, 3 E (= H * d), 4 scale (f32), 5 causal. P, PT and DST: [B*H, T, Tp] rows,
// Tp = T rounded up to quads; PT / DST hold P's / the score gradients' columns as rows.
{{DECLS}}

const W: u32 = {{W}}u;  // lanes a workgroup (the subgroup)
const T: u32 = {{T}}u;  // tokens
const TP: u32 = {{TP}}u;

struct Rows {
    bh: u32,
    row0: u32,  // the workgroup's first row
    r: u32,  // this lane's row (may be past T: loads clamp, stores skip)
    rc: u32,  // r clamped to T - 1
    qkv: u32,  // texel of (b, t = 0, q, head h) in QKV / DQKV
    k: u32,  // ... of its k
    v: u32,  // ... of its v
    y: u32,  // texel of (b, t = 0, head h) in Y / GO
    e4: u32,  // texels from one token to the next in Y / GO (E / 4)
    s3: u32,  // ... in QKV / DQKV
    pq: u32,  // the quad of row rc in P, PT, DST
    scale: f32,
    causal: bool,
    live: bool,  // the workgroup is one of B * H * ceil(T / W)
}

fn rows_(wid: vec3<u32>, nwg: vec3<u32>, lane: u32) -> Rows {
    let E = pu(3u);
    let nb = (T + W - 1u) / W;
    let g = group_id(wid, nwg);
    let live = g < pu(0u) * nb;
    let bh = select(0u, g / nb, live);
    let b = bh / pu(2u);
    let hd = (bh % pu(2u)) * (E / pu(2u));
    let row0 = (g % nb) * W;
    let r = row0 + lane;
    let rc = min(r, T - 1u);
    let qkv = (b * T * 3u * E + hd) / 4u;
    return Rows(bh, row0, r, rc, qkv, qkv + E / 4u, qkv + E / 2u, (b * T * E + hd) / 4u, E / 4u,
                3u * E / 4u, (bh * T + rc) * (TP / 4u), pf(4u), pu(5u) == 1u, live);
}

// Only the chosen entry is compiled (the others sit in block comments: their bindings differ).
{{ON_FWD}}
@compute @workgroup_size({{W}})
fn fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(subgroup_invocation_id) lane: u32) {
    let x = rows_(wid, nwg, lane);
    if (!x.live) { return; }
    let i = x.r;
    var m = LOWEST_F32;
{{FWD_S}}
    var sum = 0.0;
{{FWD_P}}
    let inv = 1.0 / sum;
{{FWD_STORE_P}}
{{FWD_O}}
    if (i < T) {
        let yq = x.y + i * x.e4;
{{Y_STORE}}
    }
}
{{OFF_FWD}}{{ON_BWD_Q}}
@compute @workgroup_size({{W}})
fn bwd_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(subgroup_invocation_id) lane: u32) {
    let x = rows_(wid, nwg, lane);
    if (!x.live) { return; }
    let i = x.r;
{{BQ_DP}}
{{BQ_DS}}
    if (i < T) {
{{DST_STORE}}
    }
{{BQ_DQ}}
    if (i < T) {
        let oq = x.qkv + i * x.s3;
{{DQ_STORE}}
    }
}
{{OFF_BWD_Q}}{{ON_BWD_KV}}
@compute @workgroup_size({{W}})
fn bwd_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(subgroup_invocation_id) lane: u32) {
    let x = rows_(wid, nwg, lane);
    if (!x.live) { return; }
{{BKV}}
    if (x.r < T) {
        let oq = x.qkv + x.r * x.s3;
{{KV_STORE}}
    }
}
{{OFF_BWD_KV}}

// 2-D convolution / pooling helpers over NCHW tensors. Every entry is one invocation per
// output element (1-D launch folded over (x, y) workgroups); gradients gather from the windows
// that cover an input position instead of scattering, so they need no atomics and are
// deterministic.
// Common words: 0 n (elements of the launch), 1 N, 2 C, 3 H, 4 W, 5 KH, 6 KW, 7 SH, 8 SW,
// 9 PH, 10 PW, 11 DH, 12 DW (dilation), 13 OH, 14 OW, 15..18 strides of the 4-D input (n, c, h, w),
// 19 input offset, 20 flag (avg pool: 1 = count padding in the divisor).
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> ARG: array<i32>;

fn xin(n: u32, c: u32, h: u32, w: u32) -> f32 {
    return A[pu(19u) + n * pu(15u) + c * pu(16u) + h * pu(17u) + w * pu(18u)];
}

// (n, c, oh, ow) of element i of an [N, C, OH, OW] output.
fn out_pos(i: u32) -> vec4<u32> {
    let OH = pu(13u);
    let OW = pu(14u);
    return vec4<u32>(i / (OW * OH * pu(2u)), (i / (OW * OH)) % pu(2u), (i / OW) % OH, i % OW);
}

// (n * C + c, ih, iw) of element i of an [N, C, H, W] input.
fn in_pos(i: u32) -> vec3<u32> {
    let H = pu(3u);
    let W = pu(4u);
    return vec3<u32>(i / (W * H), (i / W) % H, i % W);
}

// Input position (ih, iw) under window tap (kh, kw) of output (oh, ow); may lie in the padding.
fn win_in(oh: u32, ow: u32, kh: u32, kw: u32) -> vec2<i32> {
    return vec2<i32>(i32(oh * pu(7u) + kh * pu(11u)) - i32(pu(9u)),
                     i32(ow * pu(8u) + kw * pu(12u)) - i32(pu(10u)));
}

fn inside(p: vec2<i32>) -> bool {
    return p.x >= 0 && p.x < i32(pu(3u)) && p.y >= 0 && p.y < i32(pu(4u));
}

// im2col: B[(c, kh, kw), (n, oh, ow)] = x[n, c, oh*SH + kh*DH - PH, ow*SW + kw*DW - PW] or 0.
@compute @workgroup_size(256)
fn im2col(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    let OH = pu(13u);
    let OW = pu(14u);
    let NL = pu(1u) * OH * OW;
    let col = i % NL;
    let row = i / NL;
    let kw = row % pu(6u);
    let kh = (row / pu(6u)) % pu(5u);
    let c = row / (pu(6u) * pu(5u));
    let p = win_in((col / OW) % OH, col % OW, kh, kw);
    var v = 0.0;
    if (inside(p)) { v = xin(col / (OW * OH), c, u32(p.x), u32(p.y)); }
    B[i] = v;
}

// The output positions (oh, ow) whose window tap (kh, kw) lands on input (ih, iw): returns
// false when there is none.
fn tap(ih: u32, iw: u32, kh: u32, kw: u32, o: ptr<function, vec2<u32>>) -> bool {
    let th = i32(ih + pu(9u)) - i32(kh * pu(11u));
    let tw = i32(iw + pu(10u)) - i32(kw * pu(12u));
    if (th < 0 || tw < 0) { return false; }
    let sh = pu(7u);
    let sw = pu(8u);
    if (u32(th) % sh != 0u || u32(tw) % sw != 0u) { return false; }
    let oh = u32(th) / sh;
    let ow = u32(tw) / sw;
    if (oh >= pu(13u) || ow >= pu(14u)) { return false; }
    *o = vec2<u32>(oh, ow);
    return true;
}

// Sum over the window taps covering input element p = in_pos(i) of the column entry (col2im,
// avg = false) or of g / divisor at the window's output (avg pool backward, avg = true).
fn gather_taps(p: vec3<u32>, avg: bool) -> f32 {
    let KH = pu(5u);
    let KW = pu(6u);
    let OH = pu(13u);
    let OW = pu(14u);
    let NL = pu(1u) * OH * OW;
    let c = p.x % pu(2u);
    let n = p.x / pu(2u);
    var acc = 0.0;
    for (var kh = 0u; kh < KH; kh++) {
        for (var kw = 0u; kw < KW; kw++) {
            var o: vec2<u32>;
            if (!tap(p.y, p.z, kh, kw, &o)) { continue; }
            if (avg) {
                acc += A[pu(19u) + (p.x * OH + o.x) * OW + o.y] / avg_div(o.x, o.y);
            } else {
                acc += A[pu(19u) + ((c * KH + kh) * KW + kw) * NL + (n * OH + o.x) * OW + o.y];
            }
        }
    }
    return acc;
}

// col2im: dx[n, c, ih, iw] = sum of the column entries that im2col copied from (ih, iw).
@compute @workgroup_size(256)
fn col2im(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    B[i] = gather_taps(in_pos(i), false);
}

// max pool: B = window max, ARG = its flat position ih * W + iw (first max wins).
@compute @workgroup_size(256)
fn maxpool(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    let q = out_pos(i);
    var best = LOWEST_F32;
    var bi = -1;
    for (var kh = 0u; kh < pu(5u); kh++) {
        for (var kw = 0u; kw < pu(6u); kw++) {
            let p = win_in(q.z, q.w, kh, kw);
            if (!inside(p)) { continue; }
            let v = xin(q.x, q.y, u32(p.x), u32(p.y));
            if (v > best || bi < 0) {
                best = v;
                bi = p.x * i32(pu(4u)) + p.y;
            }
        }
    }
    B[i] = best;
    ARG[i] = bi;
}

// max pool backward: dx[n, c, ih, iw] = sum of g over the windows whose argmax is (ih, iw).
// Words as above with 19 = g offset (g contiguous [N, C, OH, OW]).
@compute @workgroup_size(256)
fn maxpool_bwd(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    let p = in_pos(i);
    let me = i32(p.y * pu(4u) + p.z);
    var acc = 0.0;
    for (var kh = 0u; kh < pu(5u); kh++) {
        for (var kw = 0u; kw < pu(6u); kw++) {
            var o: vec2<u32>;
            if (!tap(p.y, p.z, kh, kw, &o)) { continue; }
            let oi = (p.x * pu(13u) + o.x) * pu(14u) + o.y;
            if (ARG[oi] == me) { acc += A[pu(19u) + oi]; }
        }
    }
    B[i] = acc;
}

// Divisor of the average over window (oh, ow): the full window (count_include_pad) or the
// taps inside the input.
fn avg_div(oh: u32, ow: u32) -> f32 {
    if (pu(20u) == 1u) { return f32(pu(5u) * pu(6u)); }
    let h0 = i32(oh * pu(7u)) - i32(pu(9u));
    let w0 = i32(ow * pu(8u)) - i32(pu(10u));
    if (pu(20u) == 2u) {  // ceil_mode with padding counted: windows end at the far padding
        let hp = min(h0 + i32(pu(5u)), i32(pu(3u) + pu(9u)));
        let wp = min(w0 + i32(pu(6u)), i32(pu(4u) + pu(10u)));
        return f32((hp - h0) * (wp - w0));
    }
    let h1 = min(h0 + i32(pu(5u)), i32(pu(3u)));
    let w1 = min(w0 + i32(pu(6u)), i32(pu(4u)));
    return f32((h1 - max(h0, 0)) * (w1 - max(w0, 0)));
}

// avg pool (dilation words are 1).
@compute @workgroup_size(256)
fn avgpool(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    let q = out_pos(i);
    var s = 0.0;
    for (var kh = 0u; kh < pu(5u); kh++) {
        for (var kw = 0u; kw < pu(6u); kw++) {
            let p = win_in(q.z, q.w, kh, kw);
            if (inside(p)) { s += xin(q.x, q.y, u32(p.x), u32(p.y)); }
        }
    }
    B[i] = s / avg_div(q.z, q.w);
}

// avg pool backward (words as maxpool_bwd): dx = sum over covering windows of g / divisor.
@compute @workgroup_size(256)
fn avgpool_bwd(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    B[i] = gather_taps(in_pos(i), true);
}

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

const LOWEST: f32 = -3.4028234663852886e38;

fn xin(n: u32, c: u32, h: u32, w: u32) -> f32 {
    return A[pu(19u) + n * pu(15u) + c * pu(16u) + h * pu(17u) + w * pu(18u)];
}

// im2col: B[(c, kh, kw), (n, oh, ow)] = x[n, c, oh*SH + kh*DH - PH, ow*SW + kw*DW - PW] or 0.
@compute @workgroup_size(256)
fn im2col(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
    if (i >= pu(0u)) { return; }
    let OH = pu(13u);
    let OW = pu(14u);
    let NL = pu(1u) * OH * OW;
    let col = i % NL;
    let row = i / NL;
    let ow = col % OW;
    let oh = (col / OW) % OH;
    let n = col / (OW * OH);
    let kw = row % pu(6u);
    let kh = (row / pu(6u)) % pu(5u);
    let c = row / (pu(6u) * pu(5u));
    let ih = i32(oh * pu(7u) + kh * pu(11u)) - i32(pu(9u));
    let iw = i32(ow * pu(8u) + kw * pu(12u)) - i32(pu(10u));
    var v = 0.0;
    if (ih >= 0 && ih < i32(pu(3u)) && iw >= 0 && iw < i32(pu(4u))) {
        v = xin(n, c, u32(ih), u32(iw));
    }
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

// col2im: dx[n, c, ih, iw] = sum of the column entries that im2col copied from (ih, iw).
@compute @workgroup_size(256)
fn col2im(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
    if (i >= pu(0u)) { return; }
    let H = pu(3u);
    let W = pu(4u);
    let iw = i % W;
    let ih = (i / W) % H;
    let c = (i / (W * H)) % pu(2u);
    let n = i / (W * H * pu(2u));
    let KH = pu(5u);
    let KW = pu(6u);
    let OH = pu(13u);
    let OW = pu(14u);
    let NL = pu(1u) * OH * OW;
    var acc = 0.0;
    for (var kh = 0u; kh < KH; kh++) {
        for (var kw = 0u; kw < KW; kw++) {
            var o: vec2<u32>;
            if (tap(ih, iw, kh, kw, &o)) {
                acc += A[pu(19u) + ((c * KH + kh) * KW + kw) * NL + (n * OH + o.x) * OW + o.y];
            }
        }
    }
    B[i] = acc;
}

// max pool: B = window max, ARG = its flat position ih * W + iw (first max wins).
@compute @workgroup_size(256)
fn maxpool(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
    if (i >= pu(0u)) { return; }
    let OH = pu(13u);
    let OW = pu(14u);
    let ow = i % OW;
    let oh = (i / OW) % OH;
    let c = (i / (OW * OH)) % pu(2u);
    let n = i / (OW * OH * pu(2u));
    var best = LOWEST;
    var bi = -1;
    for (var kh = 0u; kh < pu(5u); kh++) {
        let ih = i32(oh * pu(7u) + kh * pu(11u)) - i32(pu(9u));
        if (ih < 0 || ih >= i32(pu(3u))) { continue; }
        for (var kw = 0u; kw < pu(6u); kw++) {
            let iw = i32(ow * pu(8u) + kw * pu(12u)) - i32(pu(10u));
            if (iw < 0 || iw >= i32(pu(4u))) { continue; }
            let v = xin(n, c, u32(ih), u32(iw));
            if (v > best || bi < 0) {
                best = v;
                bi = ih * i32(pu(4u)) + iw;
            }
        }
    }
    B[i] = best;
    ARG[i] = bi;
}

// max pool backward: dx[n, c, ih, iw] = sum of g over the windows whose argmax is (ih, iw).
// Words as above with 19 = g offset (g contiguous [N, C, OH, OW]).
@compute @workgroup_size(256)
fn maxpool_bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
    if (i >= pu(0u)) { return; }
    let H = pu(3u);
    let W = pu(4u);
    let iw = i % W;
    let ih = (i / W) % H;
    let nc = i / (W * H);
    let OH = pu(13u);
    let OW = pu(14u);
    let me = i32(ih * W + iw);
    var acc = 0.0;
    for (var kh = 0u; kh < pu(5u); kh++) {
        for (var kw = 0u; kw < pu(6u); kw++) {
            var o: vec2<u32>;
            if (tap(ih, iw, kh, kw, &o)) {
                let oi = (nc * OH + o.x) * OW + o.y;
                if (ARG[oi] == me) { acc += A[pu(19u) + oi]; }
            }
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
    let h1 = min(h0 + i32(pu(5u)), i32(pu(3u)));
    let w1 = min(w0 + i32(pu(6u)), i32(pu(4u)));
    return f32((h1 - max(h0, 0)) * (w1 - max(w0, 0)));
}

@compute @workgroup_size(256)
fn avgpool(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
    if (i >= pu(0u)) { return; }
    let OH = pu(13u);
    let OW = pu(14u);
    let ow = i % OW;
    let oh = (i / OW) % OH;
    let c = (i / (OW * OH)) % pu(2u);
    let n = i / (OW * OH * pu(2u));
    var s = 0.0;
    for (var kh = 0u; kh < pu(5u); kh++) {
        let ih = i32(oh * pu(7u) + kh) - i32(pu(9u));
        if (ih < 0 || ih >= i32(pu(3u))) { continue; }
        for (var kw = 0u; kw < pu(6u); kw++) {
            let iw = i32(ow * pu(8u) + kw) - i32(pu(10u));
            if (iw < 0 || iw >= i32(pu(4u))) { continue; }
            s += xin(n, c, u32(ih), u32(iw));
        }
    }
    B[i] = s / avg_div(oh, ow);
}

// avg pool backward (words as maxpool_bwd): dx = sum over covering windows of g / divisor.
@compute @workgroup_size(256)
fn avgpool_bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
    if (i >= pu(0u)) { return; }
    let H = pu(3u);
    let W = pu(4u);
    let iw = i % W;
    let ih = (i / W) % H;
    let nc = i / (W * H);
    let OH = pu(13u);
    let OW = pu(14u);
    var acc = 0.0;
    for (var kh = 0u; kh < pu(5u); kh++) {
        for (var kw = 0u; kw < pu(6u); kw++) {
            var o: vec2<u32>;
            if (tap(ih, iw, kh, kw, &o)) {
                acc += A[pu(19u) + (nc * OH + o.x) * OW + o.y] / avg_div(o.x, o.y);
            }
        }
    }
    B[i] = acc;
}

// One compare-exchange pass of a bitonic sort over rows of P (a power of two) keys, carrying
// each key's original index: invocation t handles the pair (i, i ^ j) of row t / (P / 2). The
// order is by (key, index), so equal keys keep their original order (a stable sort); NaN sorts
// above every number, as in PyTorch. Define T: the key type (f32 or i32).
// Words: 0 pairs (rows * P / 2), 1 P, 2 k (bitonic block), 3 j (distance), 4 descending.
// Padding keys (past the row's length) carry indices >= the length and NaN-or-extreme keys
// chosen by the caller so that they sort last.
@group(0) @binding(1) var<storage, read_write> KEY: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> IDX: array<i32>;

fn nan_key(x: {{T}}) -> bool { return {{ISNAN}}; }

// (a, ia) comes after (b, ib) in the final order: by key (descending: largest first; NaN
// counts as the largest), then by original index.
fn after(a: {{T}}, ia: i32, b: {{T}}, ib: i32) -> bool {
    let na = nan_key(a);
    let nb = nan_key(b);
    let desc = pu(4u) != 0u;
    if (na != nb) { return select(na, nb, desc); }
    if (!na && a != b) { return select(a > b, a < b, desc); }
    return ia > ib;
}

@compute @workgroup_size(256)
fn main(ids: Launch) {
    let t = thread_idx(ids, 256u);
    if (t >= pu(0u)) { return; }
    let P = pu(1u);
    let k = pu(2u);
    let j = pu(3u);
    let half = P / 2u;
    let row = t / half;
    let r = t % half;
    let lo = (r / j) * 2u * j + r % j;  // the r-th position of the row with bit j clear
    let a = row * P + lo;
    let b = a + j;
    let ka = KEY[a];
    let kb = KEY[b];
    let ia = IDX[a];
    let ib = IDX[b];
    let swap = select(after(kb, ib, ka, ia), after(ka, ia, kb, ib), (lo & k) == 0u);
    if (swap) {
        KEY[a] = kb;
        KEY[b] = ka;
        IDX[a] = ib;
        IDX[b] = ia;
    }
}

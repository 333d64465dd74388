// Stream compaction: the linear index of every non-zero entry, in order. POS holds the inclusive
// running count of non-zero entries (a scan), so entry i is non-zero where POS[i] exceeds
// POS[i - 1] and lands at POS[i] - 1. Words: 0 n, 1 pos offset.
@group(0) @binding(1) var<storage, read> POS: array<i32>;
@group(0) @binding(2) var<storage, read_write> OUT: array<i32>;

@compute @workgroup_size(256)
fn main(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    let p = POS[pu(1u) + i];
    let before = select(0, POS[pu(1u) + i - 1u], i > 0u);
    if (p > before) { OUT[p - 1] = i32(i); }
}

"""How an op runs on this adapter: per kernel family its variant table, WGSL generation and
launch, GPU and CPU side by side. Kernels take buffer views (runtime/buffer_view.py: device,
storage buffer, element offset, shape, strides, dtype; a Tensor is one, passed as it is) and
write outputs the caller allocated; their own scratch is a runtime ``View``. They import
nothing from tensor, autograd or ops, and ask the device's adapter profile (runtime/profile.py)
and TUNING (runtime/tuning.py) which way to run."""

"""Linear: act(x @ weight.T + bias + residual) as one autograd node calling the matmul kernel
with its epilogue, so a step records one node instead of views, copies and broadcasts: the bias
gradient is fused with the activation's backward, and the weight gradient comes out [out, in].
"""
from __future__ import annotations

import math

from ..autograd.tape import needs_grad, no_grad, record
from ..kernels import linear as linear_kernels
from ..runtime.errors import ShapeError
from ..tensor import Tensor, check_same_device, float32
from .elementwise import _f32, contiguous, saved_output
from .matmul import linear_2d, matmul
from .precision import autocast_dtype, in_forward_precision
from .shape import reshape, transpose

# activation: (forward expression of z, dz expression of g and z)
ACTIVATIONS = {
    None: ("{z}", "g"),
    "relu": ("max({z}, 0.0)", "select(0.0, g, z > 0.0)"),
    "gelu": ("gelu_({z})", "g * gelu_grad_(z)"),
    "gelu_tanh": ("gelu_tanh_({z})", "g * gelu_tanh_grad_(z)"),
}

def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
           activation: str | None = None, residual: Tensor | None = None,
           input_grad=None) -> Tensor:
    """act(x @ weight.T + bias) with weight [out, in]; ``activation``: None, "relu", "gelu"
    or "gelu_tanh". ``residual`` (no activation) is added in the same kernel as the bias.
    ``input_grad(dx)``: started on the input gradient as soon as it exists, returns a handle
    whose ``wait()`` is the gradient passed on; the weight gradient is computed meanwhile (a
    column-parallel layer's all-reduce over the tensor-parallel ranks, as Megatron's)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {list(ACTIVATIONS)}, "
                         f"got {activation!r}")
    if residual is not None:
        if activation is not None:
            raise ValueError("linear: residual works without an activation (act(z) + r is "
                             "not fused); add the residual separately")
        want = x.shape[:-1] + (weight.shape[0],)
        if tuple(residual.shape) != want:
            raise ShapeError(f"linear: residual shape {residual.shape} != output shape {want}")
        check_same_device(x, residual, op="linear")
    if weight.ndim != 2 or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"linear: input {x.shape} does not match weight {weight.shape} "
                         f"([out, in]: the input's last dim must be {weight.shape[-1]})")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ShapeError(f"linear: bias shape {bias.shape} != ({weight.shape[0]},)")
    check_same_device(x, weight, *([bias] if bias is not None else []), op="linear")
    n_out, n_in = weight.shape
    lead = x.shape[:-1]
    fwd, grad_expr = ACTIVATIONS[activation]
    with no_grad():
        x2 = contiguous(reshape(_f32(x), (math.prod(lead), n_in)))  # (no -1: n_in may be 0)
        b = contiguous(_f32(bias)) if bias is not None else None
        # the backward needs u = x @ W.T itself (relu' reads the output, None reads nothing)
        keep_u = activation not in (None, "relu")
        wt = transpose(weight, 0, 1)
        r2 = (contiguous(reshape(_f32(residual), (math.prod(lead), n_out)))
              if residual is not None else None)
        ub = b  # the bias the backward adds to u (None: u includes it)
        if keep_u:  # (no residual: checked above)
            # the activation in the matmul's epilogue, which also stores its argument u + bias
            # (no pass of its own over the output)
            u, ub = Tensor.empty((x2.shape[0], n_out), x2.device, float32), None
            y = linear_2d(x2, _f32(wt), b, None, fwd, r16=autocast_dtype() is not None, pre=u)
        else:  # bias, residual and relu in the matmul's epilogue
            y = linear_2d(x2, _f32(wt), b, r2, fwd if activation else None,
                          r16=autocast_dtype() is not None)  # autocast: f16 product
    out = reshape(y, lead + (n_out,)) if x.ndim != 2 else y
    if not needs_grad(x, weight, bias, residual):
        return out
    N = x2.shape[0]
    z_saved = u if keep_u else saved_output(y)

    def bw(g):
        g2 = contiguous(reshape(g, (N, n_out)))
        db = None
        if bias is not None or activation is not None:
            dev = g2.device
            dz, db = linear_kernels.epilogue_grad(
                g2, z_saved if activation else None, ub if keep_u else None, grad_expr,
                Tensor.empty((N, n_out), dev, float32) if activation is not None else None,
                Tensor.empty((n_out,), dev, float32)
                if bias is not None and bias.requires_grad else None)
        else:
            dz = g2
        dx = dw = pending = None
        if x.requires_grad:
            dx = matmul(dz, weight)
            dx = reshape(dx, x.shape) if x.ndim != 2 else dx
            if input_grad is not None:
                pending = input_grad(dx)
        if weight.requires_grad:
            dw = matmul(transpose(dz, 0, 1), x2)  # [out, in], contiguous
        if pending is not None:
            dx = pending.wait()
        if residual is None:
            return dx, dw, db
        return dx, dw, db, (g if residual.requires_grad else None)
    record("linear" + (f"_{activation}" if activation else ""), out,
           [x, weight, bias] + ([residual] if residual is not None else []),
           in_forward_precision(bw),
           saved=[x2, weight, z_saved] + ([b] if b is not None else []))
    return out

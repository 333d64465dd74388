"""Tensor: a view (shape, strides, offset) of a Storage on one Device. The methods that run ops
are listed in ``METHODS``; ``wgrumus.composite`` (above ops) attaches them with ``register``.
"""
from __future__ import annotations

import math

import numpy as np

from .runtime import get_device
from .runtime.buffer_slice import BufferSlice
from .runtime.buffer_view import (
    DTYPES,
    Storage,
    check_same_device,
    contiguous_strides,
    float16,
    float32,
    int32,
)
from .runtime.capture import note_grad, paused, refuse
from .runtime.errors import ShapeError, WgrumusError

__all__ = ["DTYPES", "METHODS", "Storage", "Tensor", "activation_leaf", "as_dtype", "as_shape",
           "check_same_device", "contiguous_strides", "float16", "float32", "int32", "register",
           "tensor"]


# Tensor methods implemented by wgrumus.ops and wgrumus.composite: names -> what they do (PyTorch's
# meaning throughout).
METHODS = {name: doc for names, doc in {
    "__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __pow__ "
    "__rpow__ __matmul__ __rmatmul__ __floordiv__ __rfloordiv__ __mod__ __rmod__":
        "arithmetic with a tensor or a number on either side (broadcasting)",
    "__iadd__ __isub__ __imul__ __itruediv__": "in-place arithmetic (refused on a tensor "
                                               "that requires grad, outside no_grad)",
    "__neg__ __abs__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__": "unary ops and comparisons "
                                                                  "(comparisons give 1.0/0.0)",
    "__getitem__ __setitem__": "indexing by ints, slices, None, Ellipsis, index or bool tensors",
    "add sub mul div pow matmul floor_divide remainder maximum minimum eq ne lt le gt ge":
        "the binary operators by name",
    "neg exp log sqrt rsqrt abs tanh sigmoid relu gelu leaky_relu sin cos square reciprocal "
    "clamp": "elementwise functions",
    "sum mean max min argmax argmin var std": "reductions over dim (None: all elements)",
    "softmax log_softmax": "(log-)softmax along dim",
    "reshape view permute transpose expand unsqueeze squeeze flatten split chunk T":
        "views and reshapes (T: all dims reversed, a property)",
    "contiguous clone detach to": "copies: packed, fresh, cut from the graph, on a device/dtype",
    "astype float half int long double bool": "dtype casts (no float64 or int64 on WebGPU; "
                                              "bool gives a 1.0/0.0 mask)",
    "fill_ zero_": "in-place fill",
    "backward": "accumulate d(self) into .grad of every leaf that requires grad",
    "gather": "torch.gather along dim with an int32 index tensor",
    "floor ceil round trunc fix frac sign": "rounding and sign (zero gradient; int32 kept)",
    "cpu": "refused with the way to read a tensor to the host (.numpy())",
    "repeat tile repeat_interleave flip fliplr flipud roll": "repeating and reordering copies",
    "__and__ __or__ __xor__ __invert__ __rand__ __ror__ __rxor__": "logical on masks, "
                                                                     "bitwise on int32",
    "logical_and logical_or logical_xor logical_not bitwise_and bitwise_or bitwise_xor "
    "bitwise_not": "logical (a 1.0/0.0 mask) and bitwise (int32) ops",
    "isnan isinf isfinite isposinf isneginf isclose allclose equal nan_to_num any all":
        "predicates (masks), any / all along dim",
    "masked_fill masked_fill_": "value where a mask is true",
    "tril triu diagonal diag diag_embed trace": "triangles and diagonals",
    "erf erfc log2 log10 exp2 expm1 log1p tan asin acos atan sinh cosh asinh acosh atanh "
    "arcsin arccos arctan arcsinh arccosh arctanh deg2rad rad2deg logit sinc atan2 arctan2 "
    "hypot logaddexp xlogy lerp": "elementwise math",
    "cumsum cumprod": "running sums and products along dim",
    "unflatten": "one dim split into several",
    "unfold": "windows of size every step along a dim, as a new last dim",
    "add_ sub_ mul_ div_ clamp_ clip_ copy_ relu_": "in-place forms (refused on a tensor that "
                                                    "requires grad, outside no_grad)",
    "narrow select movedim moveaxis swapaxes swapdims take_along_dim index_select clamp_min "
    "clamp_max diff outer dot inner ger": "more shape helpers and products",
    "clip expand_as view_as reshape_as type_as mm bmm is_floating_point":
        "PyTorch's other spellings",
    "nonzero argwhere masked_select": "data-sized results (the count is read back)",
    "sort argsort msort topk kthvalue median unique": "sorting along dim (stable, NaN as "
                                                     "PyTorch)",
    "scatter scatter_add scatter_reduce index_add index_copy index_fill":
        "writes at index tensors along dim (torch's semantics, no atomics)",
    "prod amax amin logsumexp norm count_nonzero nansum nanmean": "more reductions over dim",
    "new_zeros new_ones new_full new_empty new_tensor": "new tensors on this tensor's device "
                                                         "and in its dtype",
}.items() for name in names.split()}


def register(impls: dict) -> None:
    """Attach the implementations of ``METHODS`` to Tensor (called once, by
    wgrumus.composite.methods)."""
    missing, unknown = METHODS.keys() - impls.keys(), impls.keys() - METHODS.keys()
    if missing or unknown:
        raise TypeError(f"Tensor methods: missing {sorted(missing)}, not in METHODS "
                        f"{sorted(unknown)}")
    for name, fn in impls.items():
        setattr(Tensor, name, fn)


def as_shape(dims, op: str = "shape", wildcard: bool = False) -> tuple:
    """Dimensions as a tuple of Python ints, refusing floats (which ``int()`` would truncate)
    and negative sizes; ``wildcard`` lets -1 through (reshape / expand resolve it)."""
    out = []
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise ShapeError(f"{op}: dimensions must be ints, got {d!r} in {tuple(dims)}; "
                             f"pass whole numbers (int(...) if they were computed as floats)")
        d = int(d)
        if d < 0 and not (wildcard and d == -1):
            raise ShapeError(f"{op}: negative dimension in shape {tuple(dims)} ({d}); sizes "
                             f"must be >= 0" + (" (-1 infers one size)" if wildcard else ""))
        out.append(d)
    return tuple(out)


def as_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in DTYPES:
        raise WgrumusError(f"dtype {dt} is not supported; use float32, int32 or float16")
    return dt


class Tensor:
    __slots__ = ("storage", "shape", "strides", "offset", "dtype", "requires_grad", "_grad",
                 "_node", "_grad_id", "__weakref__")

    def __init__(self, storage: Storage, shape, strides=None, offset: int = 0,
                 dtype=float32, requires_grad: bool = False):
        self.storage = storage  # public: the layers above bind its buffer, bump its version
        self.shape = tuple(map(int, shape))
        self.strides = contiguous_strides(self.shape) if strides is None else tuple(strides)
        self.offset = int(offset)
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self._grad = None
        self._node = None
        self._grad_id = None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    @staticmethod
    def empty(shape, device=None, dtype=float32) -> Tensor:
        dev = get_device(device)
        dtype = dtype if dtype in DTYPES else as_dtype(dtype)
        shape = as_shape(shape, "tensor shape")
        return Tensor(Storage(dev, math.prod(shape) * dtype.itemsize), shape, dtype=dtype)

    @staticmethod
    def from_numpy(arr, device=None, requires_grad=False, dtype=None) -> Tensor:
        a = np.asarray(arr)
        if dtype is None:
            if a.dtype.kind == "f" and a.dtype != float16:
                dtype = float32
            elif a.dtype.kind in "iub":
                dtype = float32 if a.dtype.kind == "b" else int32
            elif a.dtype == float16:
                dtype = float16
            else:
                raise WgrumusError(f"cannot make a tensor from numpy dtype {a.dtype}; tensors "
                                   f"hold float32, float16 or int32: convert first (.astype)")
        dtype = as_dtype(dtype)
        if dtype == int32 and a.dtype.kind in "iu" and a.size and (
                a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
            raise WgrumusError("integer values do not fit in int32, the only integer dtype")
        a = np.asarray(a, dtype=dtype, order="C")  # (ascontiguousarray would make 0-d 1-d)
        t = Tensor.empty(a.shape, device, dtype)
        t.device.write(t.storage.buffer, a)
        if requires_grad:
            t.requires_grad_(True)
        return t

    @property
    def device(self):
        return self.storage.device

    @property
    def _storage(self) -> Storage:
        """The old spelling of ``storage``."""
        return self.storage

    @_storage.setter
    def _storage(self, storage: Storage) -> None:
        self.storage = storage

    @property
    def buffer(self):
        """The wgpu buffer holding this tensor's storage (kernels bind it at ``offset``)."""
        return self.storage.buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        """Number of elements (a method, as in PyTorch)."""
        return math.prod(self.shape)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def t(self) -> Tensor:
        """PyTorch's t(): the transpose of a 2-D tensor; 0-D and 1-D tensors unchanged."""
        if self.ndim > 2:
            raise ShapeError(f"t() expects a tensor with <= 2 dimensions, got {self.ndim}; use "
                             f"transpose(dim0, dim1) or permute")
        return self.transpose(0, 1) if self.ndim == 2 else self

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    @property
    def grad_id(self):
        """Key of this tensor in a GradientStore (assigned when it first takes part in autograd)."""
        if self._grad_id is None:
            from .autograd.tape import new_grad_id
            self._grad_id = new_grad_id()
        return self._grad_id

    @property
    def grad(self):
        return self._grad

    @grad.setter
    def grad(self, value) -> None:
        note_grad(self)  # a wr.jit capture replays this assignment (runtime/capture.py)
        self._grad = value

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def requires_grad_(self, flag: bool = True) -> Tensor:
        if flag and self.dtype != float32:
            raise WgrumusError(f"only float32 tensors can require grad (this one is {self.dtype})")
        if flag and self._node is not None:
            raise WgrumusError("requires_grad_ is for leaf tensors; this one is an op's output")
        if flag:
            refuse("creating a tensor that requires grad (a new parameter)", "a replay would "
                   "recreate it at every step instead of training it; create parameters before "
                   "the first call")
        self.requires_grad = bool(flag)
        if flag:
            _ = self.grad_id
        return self

    def is_contiguous(self) -> bool:
        exp = 1
        for s, st in zip(reversed(self.shape), reversed(self.strides)):
            if s != 1 and st != exp:
                return False
            exp *= s
        return True

    def _view(self, shape, strides, offset) -> Tensor:
        return Tensor(self.storage, shape, strides, offset, self.dtype)

    def numpy(self) -> np.ndarray:
        if self.is_contiguous():
            t = self
        else:
            from .autograd.tape import no_grad
            with no_grad():  # reading is not part of the graph
                t = self.contiguous()
        n = t.numel()
        if n == 0:
            return np.zeros(self.shape, self.dtype)
        arr = t.device.read_array(t.storage.buffer, t.offset * t.dtype.itemsize, n, t.dtype)
        return arr.reshape(self.shape)

    def item(self) -> float:
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.numpy().reshape(-1)[0].item()

    def tolist(self):
        return self.numpy().tolist()

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def buffer_slice(self):
        """(device, buffer, byte offset, nbytes, dtype) of a contiguous tensor (a BufferSlice,
        what the comm layer moves)."""
        if not self.is_contiguous():
            raise WgrumusError("buffer_slice() needs a contiguous tensor; call .contiguous() first")
        isz = self.dtype.itemsize
        return BufferSlice(self.device, self.storage.buffer, self.offset * isz,
                           self.numel() * isz, self.dtype)

    def __repr__(self):
        try:
            body = np.array2string(self.numpy(), precision=4, separator=", ")
        except Exception as e:  # pragma: no cover - repr must not raise
            body = f"<unreadable: {e}>"
        g = ", requires_grad=True" if self.requires_grad else ""
        dt = "" if self.dtype == float32 else f", dtype={self.dtype}"
        return f"tensor({body}, device={self.device.index}{dt}{g})"

    def __bool__(self):
        if self.numel() != 1:
            raise ShapeError(f"truth value of a tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    __hash__ = object.__hash__
    __array_ufunc__ = None  # `ndarray + tensor` defers to Tensor.__radd__ (a tensor, on device)


def activation_leaf(t: Tensor) -> Tensor:
    """``t`` (fresh, detached) requiring grad: where a received or recomputed graph starts
    (allowed inside a ``wr.jit`` capture, unlike a new parameter)."""
    with paused():
        return t.requires_grad_(True)


def tensor(data, device=None, requires_grad=False, dtype=None) -> Tensor:
    if isinstance(data, Tensor):  # a copy, on the source's device unless told otherwise
        device = data.device if device is None else device
        data = data.numpy()
    return Tensor.from_numpy(data, device=device, requires_grad=requires_grad, dtype=dtype)

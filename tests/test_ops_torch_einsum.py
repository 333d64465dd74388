"""einsum against numpy.einsum: matmuls, batch, outer and inner products, traces and
diagonals, ellipses, implicit outputs, three operands; gradients against finite differences."""
import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr

CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("i,j->ij", [(3,), (4,)]), ("i,i->", [(5,), (5,)]), ("ii->i", [(4, 4)]), ("ii", [(4, 4)]),
    ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]), ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 2)]), ("ij,jk", [(2, 3), (3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]), ("bij,jk->bk", [(2, 3, 4), (4, 5)]),
    ("iij->j", [(3, 3, 2)]), ("ijk,ik->j", [(2, 3, 4), (2, 4)]),
]


@pytest.mark.parametrize("eq,shapes", CASES)
def test_einsum_matches_numpy(rng, eq, shapes):
    xs = [rng.normal(size=s) for s in shapes]
    check_grad(lambda *ts: wr.einsum(eq, *ts), lambda *a: np.asarray(np.einsum(eq, *a)), xs)


def test_einsum_list_form_and_errors(rng):
    a, b = rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)
    got = wr.einsum("ij,j->i", [wr.tensor(a), wr.tensor(b)])
    np.testing.assert_allclose(got.numpy(), a @ b, rtol=1e-5)
    with pytest.raises(wr.ShapeError, match="do not fit"):
        wr.einsum("ijk,j->i", wr.tensor(a), wr.tensor(b))
    with pytest.raises(wr.ShapeError, match="sizes"):
        wr.einsum("ij,i->j", wr.tensor(a), wr.tensor(b))


def test_where_with_one_argument(rng):
    a = (rng.random((3, 4)) > 0.5).astype(np.float32)
    for got, want in zip(wr.where(wr.tensor(a)), np.where(a)):
        np.testing.assert_array_equal(got.numpy(), want)

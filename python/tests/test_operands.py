"""Bad operands raise TypeError/ValueError naming the argument; nothing is copied silently."""

import numpy as np
import pytest

import autokernel

rt = autokernel.Runtime()
A = np.ones((4, 8), np.float32)
B = np.ones((8, 6), np.float32)


def test_wrong_dtype_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="argument 'a' has dtype float64, expected float32"):
        rt.gemm(A.astype(np.float64), B)
    with pytest.raises(TypeError, match="argument 'b'"):
        rt.gemm(A, B.astype(np.int8))
    with pytest.raises(TypeError, match=r"argument 'a' is a list, .*\(pass copy=True"):
        rt.gemm([[1.0] * 8] * 4, B)


def test_copy_true_converts_inputs():
    c = rt.gemm(A.astype(np.float64), [[1.0] * 6] * 8, copy=True)
    np.testing.assert_allclose(c, np.full((4, 6), 8.0))
    np.testing.assert_allclose(rt.gemm(np.asfortranarray(A), B, copy=True), A @ B)


def test_non_contiguous_is_a_value_error():
    with pytest.raises(ValueError, match="argument 'a' .*not C-contiguous"):
        rt.gemm(np.ones((4, 16), np.float32)[:, ::2], B)
    with pytest.raises(ValueError, match="argument 'b' .*not C-contiguous"):
        rt.gemm(A, np.asfortranarray(B))


def test_wrong_shapes_name_the_expected_shape():
    with pytest.raises(ValueError, match=r"argument 'b' has shape \(7, 6\), expected \(8, N\)"):
        rt.gemm(A, np.ones((7, 6), np.float32))
    with pytest.raises(ValueError, match=r"argument 'a' has shape \(8,\), expected a 2-D array"):
        rt.gemm(np.ones(8, np.float32), B)
    q = np.ones((1, 2, 4, 8), np.float32)
    with pytest.raises(ValueError, match=r"argument 'k' has shape \(1, 2, 5, 8\)"):
        rt.attention(q, np.ones((1, 2, 5, 8), np.float32), q)
    with pytest.raises(ValueError, match=r"argument 'q' .*expected \(B, H, S, D\)"):
        rt.attention(q[0], q[0], q[0])
    packed = rt.pack_weight(B)
    with pytest.raises(ValueError, match=r"argument 'x' has shape \(4, 7\), expected \(\.\.\., 8\)"):
        rt.linear(np.ones((4, 7), np.float32), packed)
    with pytest.raises(ValueError, match=r"argument 'bias' has shape \(5,\), expected \(6,\)"):
        rt.linear(A, packed, np.ones(5, np.float32))


def test_out_is_checked_and_never_copied():
    with pytest.raises(ValueError, match=r"argument 'out' has shape \(4, 5\), expected \(4, 6\)"):
        rt.gemm(A, B, out=np.empty((4, 5), np.float32))
    with pytest.raises(TypeError, match="argument 'out' has dtype float64"):
        rt.gemm(A, B, out=np.empty((4, 6), np.float64))
    with pytest.raises(ValueError, match="argument 'out' .*not C-contiguous"):
        rt.gemm(A, B, out=np.empty((6, 4), np.float32).T)
    with pytest.raises(TypeError, match=r"argument 'out' is a list, .*\(written in place: it cannot be a converted copy\)"):
        rt.gemm(A, B, out=[[0.0] * 6] * 4)
    ro = np.empty((4, 6), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="argument 'out' must be writable"):
        rt.gemm(A, B, out=ro)
    square = np.ones((8, 8), np.float32)
    with pytest.raises(ValueError, match="share no memory"):
        rt.gemm(square, square, out=square)


def test_bad_names_are_value_errors():
    with pytest.raises(ValueError, match="unknown act"):
        rt.pack_weight(B, act="swish")
    with pytest.raises(ValueError, match="layout"):
        rt.pack_weight(B, layout="kk")
    with pytest.raises(ValueError, match="ms="):
        rt.pack_weight(B, ms=[])
    with pytest.raises(ValueError, match=r"mask: expected \(1,\) key lengths or a \(1, 4\)"):
        q = np.ones((1, 1, 4, 8), np.float32)
        rt.attention(q, q, q, mask=np.ones((4, 4), np.float32))


def test_an_output_too_big_to_allocate_is_an_error_not_a_crash():
    rt = autokernel.Runtime(threads=1)
    empty = np.ones((2**33, 0), np.float32)
    with pytest.raises(ValueError, match="too big"):
        rt.gemm(empty, np.ones((0, 2**33), np.float32))
    with pytest.raises(MemoryError):  # 2^62 bytes: more than any address space
        rt.gemm(np.ones((2**30, 0), np.float32), np.ones((0, 2**30), np.float32))


def test_copy_true_realigns_a_misaligned_array():
    rt = autokernel.Runtime(threads=1)
    raw = np.zeros(65, np.uint8)
    a = raw[1:].view(np.float32).reshape(4, 4)
    a[:] = np.arange(16, dtype=np.float32).reshape(4, 4)
    b = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="argument 'a' .*aligned"):
        rt.gemm(a, b)
    np.testing.assert_array_equal(rt.gemm(a, b, copy=True), a)


def test_complex_operands_are_refused_even_with_copy():
    rt = autokernel.Runtime(threads=1)
    a = np.ones((2, 2), np.complex64)
    with pytest.raises(TypeError, match="argument 'a' has complex dtype"):
        rt.gemm(a, np.eye(2, dtype=np.float32), copy=True)
    q = np.ones((1, 1, 4, 2), np.float32)
    with pytest.raises(TypeError, match="argument 'mask' has dtype complex"):
        rt.attention(q, q, q, mask=np.array([4 + 1j]))


def test_attention_qkv_of_an_empty_batch_is_empty():
    rt = autokernel.Runtime(threads=1)
    for shape in [(0, 4, 6), (1, 0, 6), (1, 4, 0)]:
        out = rt.attention_qkv(np.ones(shape, np.float32), 1)
        assert out.shape == (shape[0], shape[1], shape[2] // 3)


def test_int8_weights_holding_nan_or_inf_give_non_finite_columns():
    rt = autokernel.Runtime(threads=1, precision="int8")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((8, 16), dtype=np.float32)
    b = rng.standard_normal((16, 8), dtype=np.float32)
    b[0, 0], b[3, 5] = np.nan, np.inf
    c = rt.gemm(a, b)
    assert np.isnan(c[:, 0]).all() and np.isnan(c[:, 5]).all()
    assert np.isfinite(np.delete(c, [0, 5], axis=1)).all()
    packed = rt.pack_weight(b, ms=[8])
    y = rt.linear(a, packed)
    assert np.isnan(y[:, 0]).all() and np.isnan(y[:, 5]).all()


def test_scalar_arguments_name_their_real_range():
    rt = autokernel.Runtime(threads=1)
    x = np.ones((2, 4), np.float32)
    w, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"argument 'eps': 1e-50 is not a positive finite number in float32"):
        rt.add_layer_norm(x, None, w, b, eps=1e-50)
    with pytest.raises(ValueError, match=r"expected \(\.\.\., H\) with H ≥ 1"):
        rt.add_layer_norm(np.ones((2, 0), np.float32), None, w[:0], b[:0])
    with pytest.raises(ValueError, match="heads=0: expected an integer from 1 to 1048576"):
        rt.attention_qkv(np.ones((1, 2, 6), np.float32), 0)

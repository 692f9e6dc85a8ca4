"""autokernel.Runtime on numpy arrays: results against numpy, lookups, reload, counters."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import autokernel

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


def test_gemm_matches_numpy_and_writes_out():
    rt = autokernel.Runtime()
    a, b = rand(8, 64), rand(64, 40)
    c = rt.gemm(a, b)
    assert c.dtype == np.float32 and c.shape == (8, 40)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    out = np.empty((8, 40), dtype=np.float32)
    assert rt.gemm(a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    # Empty operands as numpy: an empty product, or zeros where only the depth is empty.
    for m, k, n in [(0, 3, 4), (3, 4, 0), (3, 0, 4)]:
        np.testing.assert_array_equal(rt.gemm(rand(m, k), rand(k, n)), np.zeros((m, n), np.float32))
    out = np.full((3, 4), np.nan, np.float32)
    rt.gemm(rand(3, 0), rand(0, 4), out=out)
    np.testing.assert_array_equal(out, np.zeros((3, 4), np.float32))
    for shape in [(0, 2, 5, 8), (1, 2, 0, 8), (1, 2, 5, 0)]:
        assert rt.attention(rand(*shape), rand(*shape), rand(*shape)).shape == shape


@pytest.mark.parametrize("act", [None, "relu", "gelu_tanh"])
def test_linear_with_packed_weight_any_rows(act):
    rt = autokernel.Runtime()
    w, bias = rand(48, 24), rand(24)
    packed = rt.pack_weight(w, act=act, ms=[16])
    assert (packed.in_features, packed.out_features) == (48, 24)
    for shape in [(16, 48), (3, 48), (2, 5, 48), (48,)]:
        x = rand(*shape)
        y = rt.linear(x, packed, bias)
        ref = x @ w + bias
        if act == "relu":
            ref = np.maximum(ref, 0)
        elif act == "gelu_tanh":
            ref = 0.5 * ref * (1 + np.tanh(np.sqrt(2 / np.pi) * (ref + 0.044715 * ref**3)))
        assert y.shape == shape[:-1] + (24,)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    # The (out, in) layout of torch.nn.Linear, and no bias.
    packed_nk = rt.pack_weight(np.ascontiguousarray(w.T), act=act, layout="nk")
    x = rand(4, 48)
    np.testing.assert_allclose(rt.linear(x, packed_nk), rt.linear(x, packed, np.zeros(24, np.float32)), rtol=1e-5, atol=1e-5)


def test_linear_refuses_another_act_than_packed():
    rt = autokernel.Runtime()
    packed = rt.pack_weight(rand(8, 8), act="relu")
    with pytest.raises(ValueError, match="packed with act='relu'"):
        rt.linear(rand(2, 8), packed, act="gelu_tanh")
    with pytest.raises(ValueError, match="ambiguous"):
        rt.pack_weight(rand(8, 8), act="gelu")


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_a_reference(causal):
    rt = autokernel.Runtime()
    q, k, v = rand(2, 3, 17, 16), rand(2, 3, 17, 16), rand(2, 3, 17, 16)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(16)
    if causal:
        s = np.where(np.tril(np.ones((17, 17), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(rt.attention(q, k, v, causal=causal), ref, rtol=1e-4, atol=1e-4)


def test_lookup_has_the_cli_json_fields_and_levels(tuned_db):
    rt = autokernel.Runtime(tuned_db)
    assert rt.load_error is None
    hit = rt.lookup("gemm:8x64x64")
    assert set(hit) == {"workload", "dtype", "device", "level", "kernel", "kernel_version", "config",
                        "fingerprint", "source", "rel_err", "precisions", "precision", "served_as", "not_served"}
    assert hit["precision"] == "f32" and hit["served_as"] == "gemm:8x64x64"
    assert 0 <= hit["rel_err"] < 1e-5  # f32 against the f32 problem: rounding noise
    assert hit["level"] == "exact" and hit["fingerprint"] == rt.fingerprint
    assert hit["source"]["workload"] == "gemm:8x64x64"
    miss = rt.lookup("gemm:1000x7x3")
    assert miss["level"] == "default" and miss["source"] is None
    before = rt.lookups()
    rt.gemm(rand(8, 64), rand(64, 64))
    after = rt.lookups()
    assert after["exact"] == before["exact"] + 1
    with pytest.raises(ValueError, match="gemm:0x1x1|dimension|zero"):
        rt.lookup("gemm:0x1x1")
    with pytest.raises(ValueError):
        rt.lookup("conv:1x2")


def test_a_missing_database_serves_defaults_then_reload_picks_it_up(tmp_path, tuned_db):
    path = tmp_path / "later.db"
    rt = autokernel.Runtime(str(path))
    assert rt.load_error and "later.db" in rt.load_error
    assert rt.lookup("gemm:8x64x64")["level"] == "default"
    path.write_bytes(pathlib.Path(tuned_db).read_bytes())
    info = rt.reload()
    assert info["generation"] == 2 and rt.load_error is None
    # Tuned and served at all threads. (At another thread count the record would be served
    # as same_arch only if its config fits that count: a machine- and timing-dependent answer.)
    assert rt.lookup("gemm:8x64x64")["level"] == "exact"


def test_environment_settings_apply_with_or_without_a_database(tmp_path, tuned_db):
    # In a child: the kernels read AUTOKERNEL_LINGER_US once per process.
    log = tmp_path / "untuned.txt"
    script = f"""
import warnings, autokernel
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rt = autokernel.Runtime()
    db = autokernel.Runtime({str(tuned_db)!r})
assert [w.category for w in caught] == [RuntimeWarning, RuntimeWarning], caught
assert "AUTOKERNEL_LINGER_US=soon" in str(caught[0].message)
for r in (rt, db):
    assert "AUTOKERNEL_LINGER_US=soon" in r.settings_error, r.settings_error
    assert "settings_error=" in repr(r)
assert db.load_error is None and db.lookup("gemm:8x64x64")["level"] == "exact"
rt.lookup("gemm:3x4x5")
"""
    env = dict(os.environ, AUTOKERNEL_LINGER_US="soon", AUTOKERNEL_UNTUNED_LOG=str(log))
    subprocess.run([sys.executable, "-c", script], env=env, check=True)
    # The valid setting beside the invalid one applied, on the runtime with no database too.
    assert log.read_text() == "gemm:3x4x5  # default\n"
    assert autokernel.Runtime().settings_error is None


def test_defaults_only_runtime_cannot_reload():
    with pytest.raises(autokernel.AutokernelError, match="no database"):
        autokernel.Runtime().reload()


def test_tune_returns_the_cli_json_and_resumes(tmp_path):
    db = str(tmp_path / "t.db")
    first = autokernel.tune("gemm:4x8x16", db=db, budget=2, strategy="random", isolation="none",
                            finalists=0, progress=False)
    assert len(first) == 1
    r = first[0]
    for key in ["workload", "kernel", "config", "median_s", "gflops", "speedup_vs_default", "trials",
                "failures", "fingerprint", "isolation", "statuses", "winner_reason", "warnings",
                "contended", "cpu_share"]:
        assert key in r, key
    assert r["workload"] == "gemm:4x8x16" and r["isolation"] == "none" and r["median_s"] > 0
    again = autokernel.tune(["gemm:4x8x16"], db=db, budget=2, strategy="random", isolation="none",
                            finalists=0, progress=False)
    assert again[0]["measured_now"] == 0 and again[0]["trials"] == r["trials"]


def test_tune_in_a_worker_process(tmp_path):
    db = str(tmp_path / "w.db")
    (r,) = autokernel.tune(["gemm:4x8x8"], db=db, budget=2, strategy="random", progress=False)
    assert r["isolation"] == "process" and r["kernel"] is not None


def test_tune_in_several_precisions_compares_their_winners_side_by_side(tmp_path):
    import sqlite3
    db = str(tmp_path / "p.db")
    reports = autokernel.tune(["gemm:6x20x9"], db=db, budget=2, precision="f32,int8",
                              strategy="random", progress=False)
    assert [r["workload"] for r in reports] == ["gemm:6x20x9", "gemm:6x20x9:i8"]
    # (Other warnings, such as the machine's speed moving while it tuned, depend on the load.)
    assert not [w for r in reports for w in r["warnings"] if "side by side" in w], reports
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT set_id, median_s FROM side_by_side").fetchall()
    finally:
        conn.close()
    assert len(rows) == 2 and rows[0][0] == rows[1][0], rows
    # Those are the medians 'auto' compares.
    rt = autokernel.Runtime(db, threads=None, precision="auto")
    seen = rt.lookup("gemm:6x20x9")["precisions"]
    assert all(seen[d]["median_from"] == "side_by_side" for d in ("f32", "i8")), seen
    assert sorted(seen[d]["median_s"] for d in ("f32", "i8")) == pytest.approx(
        sorted(m for _, m in rows), rel=1e-12)


def test_tune_refuses_bad_arguments(tmp_path):
    db = str(tmp_path / "x.db")
    with pytest.raises(ValueError):
        autokernel.tune(["gemm:axb"], db=db)
    with pytest.raises(ValueError, match="strategy"):
        autokernel.tune(["gemm:2x2x2"], db=db, strategy="guess")
    with pytest.raises(ValueError, match="isolation"):
        autokernel.tune(["gemm:2x2x2"], db=db, isolation="thread")
    with pytest.raises(ValueError, match="precision"):
        autokernel.tune(["gemm:2x2x2"], db=db, precision="fp8")
    with pytest.raises(ValueError, match="retry_failed=True needs isolation='process'"):
        autokernel.tune(["gemm:2x2x2"], db=db, isolation="none", retry_failed=True)
    with pytest.raises(ValueError, match="timeout_s must be a number of seconds from 0.1"):
        autokernel.tune(["gemm:2x2x2"], db=db, timeout_s=0.01)


def test_threads_and_precision_arguments():
    with pytest.raises(ValueError, match="threads=0"):
        autokernel.Runtime(threads=0)
    with pytest.raises(ValueError, match="threads=100000"):
        autokernel.Runtime(threads=100000)
    with pytest.raises(ValueError, match="unknown precision"):
        autokernel.Runtime(precision="fp8")
    rt = autokernel.Runtime(threads=1, precision="f32")
    assert rt.threads == 1 and rt.precision == "f32"
    assert rt.fingerprint == autokernel.fingerprint(threads=1)


def test_negative_integer_arguments_are_value_errors_naming_them(tmp_path):
    rt = autokernel.Runtime()
    with pytest.raises(ValueError, match=r"threads=-1: this process may use \d+ CPU\(s\); give 1 to"):
        autokernel.Runtime(threads=-1)
    with pytest.raises(ValueError, match="threads=-2"):
        autokernel.fingerprint(threads=-2)
    with pytest.raises(ValueError, match=r"heads=-1: expected an integer from 1 to \d+"):
        rt.attention_qkv(rand(1, 2, 6), -1)
    with pytest.raises(ValueError, match=r"ms=-5: expected an integer from 1 to \d+"):
        rt.pack_weight(rand(4, 4), ms=[8, -5])
    db = str(tmp_path / "n.db")
    for arg, value in (("budget", -1), ("seed", -1), ("finalists", -3), ("threads", -1)):
        with pytest.raises(ValueError, match=f"{arg}={value}: "):
            autokernel.tune("gemm:2x2x2", db=db, progress=False, **{arg: value})
    with pytest.raises(ValueError, match="budget=0: expected an integer from 1 to"):
        autokernel.tune("gemm:2x2x2", db=db, budget=0, progress=False)
    w = {n: rt.pack_weight(rand(8, m), ms=[2]) for n, m in dict(qkv=24, out=8, up=16).items()}
    w["down"] = rt.pack_weight(rand(16, 8), ms=[2])
    z = {n: np.zeros(p.out_features, np.float32) for n, p in w.items()}
    ln = (np.ones(8, np.float32), np.zeros(8, np.float32))
    args = (w["qkv"], z["qkv"], w["out"], z["out"], ln, w["up"], z["up"], w["down"], z["down"], ln)
    with pytest.raises(ValueError, match="heads=-2: expected an integer from 1 to"):
        rt.encoder_layer(*args, heads=-2)
    with pytest.raises(ValueError, match="seq=-1: expected an integer from 1 to"):
        rt.encoder_layer(*args, heads=2).workloads(1, -1)
    for eps in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="argument 'eps'"):
            rt.encoder_layer(*args, heads=2, eps=eps)
    # An empty batch is nothing to compute: an empty output.
    assert rt.encoder_layer(*args, heads=2)(np.zeros((2, 0, 8), np.float32)).shape == (2, 0, 8)
    # Ints past any machine integer, and arguments of the wrong kind, name the argument too.
    with pytest.raises(ValueError, match=r"heads=\(an int ≥ 2\*\*127\): expected an integer from 1"):
        rt.attention_qkv(rand(1, 2, 6), 2**200)
    with pytest.raises(ValueError, match=r"threads=\(an int < -2\*\*127\)"):
        autokernel.Runtime(threads=-(2**300))
    with pytest.raises(TypeError, match="argument 'ln1' is 'ab': expected a \\(weight, bias\\) pair"):
        rt.encoder_layer(*args[:4], "ab", *args[5:], heads=2)
    layer = rt.encoder_layer(*args[:4], list(ln), *args[5:9], [*ln], heads=2)  # lists are pairs too
    x = rand(1, 3, 8)
    np.testing.assert_array_equal(layer(x), rt.encoder_layer(*args, heads=2)(x))
    with pytest.raises(TypeError, match="argument 'layers' is a str: expected a list of EncoderLayers"):
        rt.encoder("ab", x)
    with pytest.raises(TypeError, match="layers\\[1\\] is a int: expected an EncoderLayer"):
        rt.encoder([layer, 5], x)
    np.testing.assert_array_equal(rt.encoder((layer, layer), x), layer(layer(x)))
    # A bool where a number is meant is refused by name (Python counts True as 1).
    for call, name in [
        (lambda: rt.attention_qkv(rand(1, 2, 6), heads=True), "heads"),
        (lambda: autokernel.Runtime(threads=True), "threads"),
        (lambda: autokernel.Runtime(precision="int8", max_rel_err=True), "max_rel_err"),
        (lambda: rt.add_layer_norm(rand(2, 8), None, *ln, eps=True), "eps"),
        (lambda: autokernel.tune("gemm:2x2x2", db=db, budget=True, progress=False), "budget"),
    ]:
        with pytest.raises(TypeError, match=f"argument '{name}' is True: expected .*, not a bool"):
            call()
    # Row counts past one workload's rows are planned as the blocks they run in.
    big = rt.pack_weight(rand(4, 3), ms=[2**20 + 3])
    assert big.workload == "gemm_bias:1048576x3x4"


def test_key_lengths_must_be_integral_and_finite():
    rt = autokernel.Runtime()
    q = rand(2, 1, 16, 8)
    for bad, shown in ((15.5, "15.5"), (np.nan, "NaN"), (np.inf, "inf"), (-0.5, "-0.5")):
        with pytest.raises(ValueError, match=f"mask: key length {shown} is not an integer"):
            rt.attention(q, q, q, mask=np.array([bad, 3.0]))
        with pytest.raises(ValueError, match=f"mask: key length {shown} is not an integer"):
            rt.attention_qkv(rand(2, 16, 24), 1, mask=[bad, 3.0])
    hf = np.ones((2, 16))
    hf[1, 3] = 0.5
    with pytest.raises(ValueError, match="mask: row 1 holds 0.5; expected a 0/1 mask"):
        rt.attention(q, q, q, mask=hf)
    # Integral floats are lengths as any integer is.
    np.testing.assert_array_equal(rt.attention(q, q, q, mask=np.array([16.0, 3.0])),
                                  rt.attention(q, q, q, mask=np.array([16, 3])))


def test_db_paths_may_be_str_bytes_or_pathlike(tmp_path, tuned_db):
    with pytest.raises(TypeError, match="expected str, bytes or os.PathLike object, not int"):
        autokernel.Runtime(5)
    for empty in ("", b""):
        with pytest.raises(ValueError, match="the path is empty: it names no file"):
            autokernel.Runtime(empty)
    for path in (tuned_db, tuned_db.encode(), pathlib.Path(tuned_db)):
        rt = autokernel.Runtime(path)
        assert rt.load_error is None and rt.lookup("gemm:8x64x64")["level"] == "exact"
    log = tmp_path / "fallbacks.txt"
    rt.log_fallbacks_to(bytes(log))
    rt.lookup("gemm:9x64x64")
    rt.gemm(rand(9, 64), rand(64, 64))
    assert "gemm:9x64x64" in log.read_text()


def test_a_one_thread_runtime_computes_on_each_calling_thread():
    """threads=1 runs each call on its caller's thread (no pool to hand it to): results as
    from the main thread, bit for bit, when four threads call at once."""
    import threading

    rt = autokernel.Runtime(threads=1)
    a, b = rand(67, 130), rand(130, 65)
    q, k, v = rand(2, 3, 33, 16), rand(2, 3, 33, 16), rand(2, 3, 33, 16)
    qkv, x, g, beta = rand(2, 200, 3 * 96), rand(2, 200, 96), rand(96), rand(96)  # > one task's rows

    def calls():
        y = x.copy()
        rt.add_layer_norm(y, x, g, beta)
        return [rt.gemm(a, b), rt.attention(q, k, v, mask=np.array([33, 20])),
                rt.attention_qkv(qkv, 6, mask=np.array([200, 7])), y]

    want = calls()
    np.testing.assert_allclose(want[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    got, errors = [], []

    def worker():
        try:
            for _ in range(5):
                got.append(calls())
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(got) == 20
    for results in got:
        for r, w in zip(results, want):
            np.testing.assert_array_equal(r, w)


def test_the_precision_policy_serves_f32_calls_in_int8():
    rt = autokernel.Runtime(precision="int8")
    assert rt.precision == "int8"
    assert rt.lookup("gemm:8x16x32")["served_as"] == "gemm:8x16x32:i8"
    a, b = rand(8, 32), rand(32, 16)
    before = rt.lookups()["by_precision"]
    c = rt.gemm(a, b)
    after = rt.lookups()["by_precision"]
    assert (after["int8"] - before["int8"], after["f32"] - before["f32"]) == (1, 0)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err = np.abs(c - exact).max() / np.abs(exact).max()
    assert 0 < err < 0.05, err  # int8's quantisation, not f32 rounding
    # A budget nothing measured can meet: f32 again.
    rt.set_precision("int8", max_rel_err=1e-3)
    assert rt.lookup("gemm:8x16x32")["served_as"] == "gemm:8x16x32"
    np.testing.assert_allclose(rt.gemm(a, b), exact, rtol=1e-4, atol=1e-4)
    assert rt.lookups()["by_precision"]["f32"] == after["f32"] + 2  # the lookup and the call
    with pytest.raises(ValueError, match="max_rel_err"):
        rt.set_precision("auto", max_rel_err=-1.0)
    with pytest.raises(ValueError, match="unknown precision"):
        rt.set_precision("int4")


@pytest.mark.parametrize("precision,dtype,size", [("int8", "i8", 1), ("bf16", "bf16", 2)])
def test_a_weight_served_in_reduced_precision_only_keeps_no_f32_copy(precision, dtype, size):
    rt = autokernel.Runtime(precision=precision)
    w = rand(65, 67)
    packed = rt.pack_weight(w, act="relu", ms=[16])
    assert (packed.dtypes, packed.layouts, packed.copies) == ([dtype], [], 1)
    assert packed.nbytes < 2 * size * w.size + 4096, packed.nbytes
    # Other row counts, and calls after the policy went back to f32, read the same form.
    rt.set_precision("f32")
    for m in (1, 16, 37):
        x = rand(m, 65)
        want = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)
        before = rt.lookups()["by_precision"]
        y = rt.linear(x, packed)
        after = rt.lookups()["by_precision"]
        assert after[precision] - before[precision] == 1 and after["f32"] == before["f32"]
        err = np.abs(y - want).max() / np.abs(want).max()
        assert 0 < err < 0.05, (m, err)
    f32 = autokernel.Runtime().pack_weight(w, act="relu", ms=[16])
    assert f32.dtypes == ["f32"] and f32.layouts and f32.nbytes >= 4 * w.size


def test_the_gil_is_released_while_a_kernel_runs():
    import threading
    import time

    rt = autokernel.Runtime(threads=1)
    a, b = rand(384, 384), rand(384, 384)
    t0 = time.perf_counter()
    rt.gemm(a, b)
    one = time.perf_counter() - t0
    n = max(1, int(0.3 / one))
    stamps, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.0005)

    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.01)
    start = time.perf_counter()
    for _ in range(n):
        rt.gemm(a, b)
    end = time.perf_counter()
    stop.set()
    t.join()
    during = [s for s in stamps if start <= s <= end]
    # With the GIL held, the ticking thread would stand still for a whole call at a time.
    assert len(during) >= 3, (len(during), n, end - start)
    gaps = np.diff([start] + during + [end])
    assert gaps.max() < max(0.5 * (end - start), 0.05), (gaps.max(), end - start)


def test_attention_with_a_padding_mask_matches_numpy():
    rt = autokernel.Runtime()
    b, h, s, d = 3, 2, 13, 16
    q, k, v = rand(b, h, s, d), rand(b, h, s, d), rand(b, h, s, d)
    lens = [13, 5, 1]
    hf_mask = np.array([[1] * n + [0] * (s - n) for n in lens])
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    keep = (np.arange(s)[None, :] < np.array(lens)[:, None])[:, None, None, :]
    scores = np.where(keep, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v
    for mask in (np.array(lens), hf_mask, hf_mask.astype(bool)):
        np.testing.assert_allclose(rt.attention(q, k, v, mask=mask), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="mask"):
        rt.attention(q, k, v, mask=np.array([1, 0, 1] + [0] * (s - 3))[None].repeat(b, 0))
    with pytest.raises(ValueError, match="mask"):
        rt.attention(q, k, v, mask=np.array([14, 1, 1]))
    with pytest.raises(ValueError, match="mask"):
        rt.attention(q, k, v, mask=np.ones((b, s + 1)))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_qkv_is_attention_on_the_split_heads(causal):
    rt = autokernel.Runtime()
    b, s, h, d = 3, 13, 2, 16
    qkv = rand(b, s, 3 * h * d)
    heads = [qkv[..., i * h * d : (i + 1) * h * d].reshape(b, s, h, d).transpose(0, 2, 1, 3) for i in range(3)]
    q, k, v = (np.ascontiguousarray(t) for t in heads)
    for mask in (None, np.array([13, 5, 0])):
        want = rt.attention(q, k, v, causal=causal, mask=mask).transpose(0, 2, 1, 3).reshape(b, s, h * d)
        got = rt.attention_qkv(qkv, h, causal=causal, mask=mask)
        assert got.shape == (b, s, h * d)
        np.testing.assert_array_equal(got, want)
    out = np.empty((b, s, h * d), np.float32)
    assert rt.attention_qkv(qkv, h, out=out) is out
    with pytest.raises(ValueError, match="multiple of 3·heads"):
        rt.attention_qkv(qkv, 5)
    with pytest.raises(ValueError, match=r"\(B, S, 3·H·D\)"):
        rt.attention_qkv(qkv[0], h)
    with pytest.raises(ValueError, match="mask"):
        rt.attention_qkv(qkv, h, mask=np.array([14, 1, 1]))


def test_add_layer_norm_in_place_matches_numpy():
    rt = autokernel.Runtime()
    x0, r = rand(2, 5, 24), rand(2, 5, 24)
    g, bias = rand(24), rand(24)
    for residual in (r, None):
        v = x0 + (0 if residual is None else residual)
        mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        want = (v - mu) / np.sqrt(var + 1e-5) * g + bias
        x = x0.copy()
        assert rt.add_layer_norm(x, residual, g, bias, eps=1e-5) is x
        np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
    x = x0.copy()
    with pytest.raises(ValueError, match="argument 'x' must be writable and share no memory"):
        rt.add_layer_norm(x, x, g, bias)
    with pytest.raises(ValueError, match="argument 'residual' has shape"):
        rt.add_layer_norm(x, r[:1], g, bias)
    with pytest.raises(ValueError, match="argument 'weight' has shape"):
        rt.add_layer_norm(x, r, g[:3], bias)
    with pytest.raises(TypeError, match="argument 'x' has dtype float64"):
        rt.add_layer_norm(x.astype(np.float64), r, g, bias)
    # An epsilon that is not a positive finite number, x left as it was.
    for eps in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="argument 'eps'"):
            rt.add_layer_norm(x, r, g, bias, eps=eps)
        np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(x, x0)  # refused calls wrote nothing


def test_encoder_layer_is_its_runtime_calls_in_one():
    rt = autokernel.Runtime()
    h, f, heads, b, s = 32, 48, 4, 2, 9
    w = {n: rand(i, o) * 0.2 for n, (i, o) in dict(qkv=(h, 3 * h), out=(h, h), up=(h, f), down=(f, h)).items()}
    bias = {n: rand(m.shape[1]) for n, m in w.items()}
    ln1, ln2 = (rand(h), rand(h)), (rand(h), rand(h))
    packed = {n: rt.pack_weight(m, act="gelu_erf" if n == "up" else None, ms=[b * s]) for n, m in w.items()}
    layer = rt.encoder_layer(packed["qkv"], bias["qkv"], packed["out"], bias["out"], ln1, packed["up"], bias["up"],
                             packed["down"], bias["down"], ln2, heads=heads, eps=1e-5)
    assert (layer.hidden, layer.heads) == (h, heads)
    assert layer.workloads(b, s) == ["gemm_bias:18x96x32", "attention:2x4x9x8", "gemm_bias:18x32x32",
                                     "gemm_bias_gelu_erf:18x48x32", "gemm_bias:18x32x48"]
    # A call past one workload's 2^20 rows runs in row blocks: their workloads, each once.
    big = layer.workloads(2**20 + 1, 1)
    assert big[:4] == ["gemm_bias:1048576x96x32", "gemm_bias:1x96x32", "attention:1048576x4x1x8", "attention:1x4x1x8"]
    assert big[-2:] == ["gemm_bias:1048576x32x48", "gemm_bias:1x32x48"]
    x = rand(b, s, h)
    for mask in (None, np.array([9, 4])):
        want = x.copy()
        ctx = rt.attention_qkv(rt.linear(want, packed["qkv"], bias["qkv"]), heads, mask=mask)
        rt.add_layer_norm(want, rt.linear(ctx, packed["out"], bias["out"]), *ln1, eps=1e-5)
        ffn = rt.linear(want, packed["up"], bias["up"])
        rt.add_layer_norm(want, rt.linear(ffn, packed["down"], bias["down"]), *ln2, eps=1e-5)
        x0 = x.copy()
        np.testing.assert_array_equal(layer(x, mask=mask), want)
        np.testing.assert_array_equal(x, x0)  # the input is not modified
    with pytest.raises(ValueError, match=r"argument 'x' has shape \(2, 9, 31\), expected \(B, S, 32\)"):
        layer(rand(b, s, h - 1))
    with pytest.raises(TypeError, match="copy=True"):
        layer(x.astype(np.float64))
    np.testing.assert_array_equal(layer(x.astype(np.float64), copy=True), layer(x))
    with pytest.raises(ValueError, match="5 heads do not split hidden 32"):
        rt.encoder_layer(packed["qkv"], bias["qkv"], packed["out"], bias["out"], ln1, packed["up"], bias["up"],
                         packed["down"], bias["down"], ln2, heads=5)
    with pytest.raises(ValueError, match="out weight"):
        rt.encoder_layer(packed["qkv"], bias["qkv"], packed["up"], bias["out"], ln1, packed["up"], bias["up"],
                         packed["down"], bias["down"], ln2, heads=heads)


def test_encoder_runs_a_stack_of_layers_in_one_call():
    rt = autokernel.Runtime()
    h, f, heads, b, s = 32, 48, 4, 2, 9

    def layer(seed_scale, h=h, heads=heads):
        w = {n: rand(i, o) * seed_scale for n, (i, o) in dict(qkv=(h, 3 * h), out=(h, h), up=(h, f), down=(f, h)).items()}
        bias = {n: rand(m.shape[1]) for n, m in w.items()}
        packed = {n: rt.pack_weight(m, act="gelu_erf" if n == "up" else None, ms=[b * s]) for n, m in w.items()}
        return rt.encoder_layer(packed["qkv"], bias["qkv"], packed["out"], bias["out"], (rand(h), rand(h)), packed["up"],
                                bias["up"], packed["down"], bias["down"], (rand(h), rand(h)), heads=heads, eps=1e-5)

    layers = [layer(0.2), layer(0.3), layer(0.1)]
    assert all(x.runtime is rt for x in layers)
    x = rand(b, s, h)
    x0 = x.copy()
    for mask in (None, np.array([9, 4])):
        want = x
        for one in layers:
            want = one(want, mask=mask)
        np.testing.assert_array_equal(rt.encoder(layers, x, mask=mask), want)
        out = np.empty_like(x)
        assert rt.encoder(layers, x, mask=mask, out=out) is out
        np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(x, x0)  # the input is not modified
    with pytest.raises(ValueError, match="at least one"):
        rt.encoder([], x)
    with pytest.raises(ValueError, match=r"layers\[1\] was made by another Runtime"):
        other = autokernel.Runtime()
        w = other.pack_weight(rand(h, h))
        rt.encoder([layers[0], other.encoder_layer(other.pack_weight(rand(h, 3 * h)), rand(3 * h), w, rand(h),
                                                   (rand(h), rand(h)), w, rand(h), w, rand(h), (rand(h), rand(h)),
                                                   heads=heads)], x)
    with pytest.raises(ValueError, match=r"layers\[1\]: hidden width 16 differs from layers\[0\]'s 32"):
        rt.encoder([layers[0], layer(0.2, h=16, heads=2)], x)
    with pytest.raises(ValueError, match=r"argument 'x' has shape \(2, 9, 31\), expected \(B, S, 32\)"):
        rt.encoder(layers, rand(b, s, h - 1))
    with pytest.raises(ValueError, match="share no memory"):
        rt.encoder(layers, x, out=x)


def test_encoder_layer_shapes_are_value_errors_and_workloads_check_overflow():
    rt = autokernel.Runtime(threads=1)
    rng = np.random.default_rng(5)
    h, f = 8, 16

    def packed(n_in, n_out, act=None):
        return rt.pack_weight(rng.standard_normal((n_in, n_out), dtype=np.float32), act=act)

    ones, zeros = np.ones(h, np.float32), np.zeros(h, np.float32)
    args = dict(
        qkv=packed(h, 3 * h), qkv_bias=np.zeros(3 * h, np.float32), out=packed(h, h), out_bias=zeros,
        ln1=(ones, zeros), ffn_up=packed(h, f, "gelu_erf"), ffn_up_bias=np.zeros(f, np.float32),
        ffn_down=packed(f, h), ffn_down_bias=zeros, ln2=(ones, zeros), heads=2,
    )
    layer = rt.encoder_layer(**args)
    with pytest.raises(ValueError, match="batch .* overflows"):
        layer.workloads(2**40, 2**40)
    with pytest.raises(ValueError, match="qkv bias has 8 values, expected 24"):
        rt.encoder_layer(**{**args, "qkv_bias": zeros})


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_a_weight_too_large_for_the_memory_left_is_a_memory_error(layout):
    # In a child whose address space ends 256 MiB above what it has mapped: packing a
    # 512 MiB weight must raise, not abort the interpreter (an ordinary Rust allocation
    # failure aborts the process).
    code = """
import resource, numpy as np, autokernel
rt = autokernel.Runtime(None, threads=1)
w = np.ones((2**17, 2**10), np.float32)
vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
try:
    rt.pack_weight(w, ms=[1, 128], layout=LAYOUT)
except MemoryError as e:
    print("MemoryError:", e)
"""
    if not pathlib.Path("/proc/self/status").exists():
        pytest.skip("skipped: no /proc/self/status to size the address-space limit on this OS")
    code = code.replace("LAYOUT", repr(layout))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # 'nk' (the drop-in's layout) first makes a transposed copy as large as the weight.
    assert "MemoryError: out of memory: a " in out.stdout, out.stdout


def test_ctrl_c_stops_a_tune_at_its_next_measurement_and_keeps_its_trials(tmp_path):
    # In a child (a stray SIGINT must not reach pytest): Ctrl-C half a second in, against a
    # budget that takes far longer. The job stops at its next measurement and raises
    # KeyboardInterrupt; every trial measured is in the database, none marked failed.
    db = tmp_path / "t.db"
    code = f"""
import os, signal, sqlite3, threading, time, autokernel
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    autokernel.tune(["gemm:256x256x256"], db={str(db)!r}, budget=100000, isolation="none", progress=False)
    print("finished")
except KeyboardInterrupt:
    print("interrupted after %.1f s" % (time.monotonic() - t0))
print(sqlite3.connect({str(db)!r}).execute("select count(*), sum(status != 'ok') from trials").fetchone())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    assert lines[0].startswith("interrupted after"), out.stdout
    assert float(lines[0].split()[2]) < 30, out.stdout
    trials, failed = eval(lines[1])
    assert trials > 0 and failed == 0, out.stdout


def test_arguments_that_would_be_ignored_are_refused_by_name():
    """A budget without a reduced precision, an empty act, row counts that are not integers
    and numpy masked arrays would each be silently dropped: each is an error naming it."""
    for precision in (None, "f32"):
        with pytest.raises(ValueError, match="max_rel_err applies to a reduced precision"):
            autokernel.Runtime(precision=precision, max_rel_err=1e-2)
    rt = autokernel.Runtime()
    with pytest.raises(ValueError, match="max_rel_err applies to a reduced precision"):
        rt.set_precision("f32", max_rel_err=1e-2)
    w = np.ones((4, 3), np.float32)
    with pytest.raises(ValueError, match="unknown act ''"):
        rt.pack_weight(w, act="")
    for ms, what in [("16", "argument 'ms' is a str"), ([1.7], "argument 'ms' holds 1.7"),
                     ([True], "argument 'ms' holds True"), (16, "argument 'ms' is a int")]:
        with pytest.raises(TypeError, match=what):
            rt.pack_weight(w, ms=ms)
    assert rt.pack_weight(w, ms=np.array([2, 16])).in_features == 4  # numpy integers are integers
    masked = np.ma.masked_array(np.ones((2, 4), np.float32), mask=np.eye(2, 4, dtype=bool))
    with pytest.raises(TypeError, match="argument 'a' is a numpy masked array"):
        rt.gemm(masked, w)
    with pytest.raises(TypeError, match="argument 'x' is a numpy masked array"):
        rt.linear(masked, rt.pack_weight(w), copy=True)
    q = np.ones((2, 1, 3, 4), np.float32)
    with pytest.raises(TypeError, match="argument 'mask' is a numpy masked array"):
        rt.attention(q, q, q, mask=np.ma.masked_array([3, 2], mask=[False, True]))


def test_errors_name_the_argument_in_the_callers_terms():
    rt = autokernel.Runtime()
    w = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="argument 'weight' is a ndarray, expected an autokernel.PackedWeight"):
        rt.linear(np.ones((2, 4), np.float32), w)
    with pytest.raises(TypeError, match="argument 'ffn_up' is a ndarray"):
        p = rt.pack_weight(w)
        rt.encoder_layer(p, w, p, w, (w, w), w, w, p, w, (w, w), 1)
    with pytest.raises(ValueError, match=r"argument 'w' has shape \(0, 5\): in_features is zero"):
        rt.pack_weight(np.zeros((0, 5), np.float32))
    with pytest.raises(ValueError, match=r"argument 'w' has shape \(0, 5\): out_features is zero"):
        rt.pack_weight(np.zeros((0, 5), np.float32), layout="nk")
    q = np.ones((2, 1, 3, 4), np.float32)
    with pytest.raises(ValueError, match="key length 9223372036854775807 is outside"):
        rt.attention(q, q, q, mask=np.array([2**63 - 1, 3]))
    with pytest.raises(autokernel.AutokernelError, match=r"no database \(db_path=None\)"):
        autokernel.Runtime(None).reload()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python ≥ 3.12 warns of threads
def test_a_child_forked_after_use_gets_an_error_not_a_hang():
    """Worker threads do not survive fork(): a child of a process that used the library gets a
    RuntimeError naming the cause (it had waited forever on its first parallel step)."""
    rt = autokernel.Runtime()
    a = np.ones((64, 64), np.float32)
    rt.gemm(a, a)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        try:
            rt.gemm(a, a)
            os._exit(3)
        except RuntimeError as e:
            os._exit(0 if "forked" in str(e) else 4)
        except BaseException:
            os._exit(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    np.testing.assert_array_equal(rt.gemm(a, a), a @ a)

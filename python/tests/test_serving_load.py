"""Serving under load: 8 threads call one Runtime in a loop on mixed workloads while another
thread replaces the database file and reloads it several times. No crash, no error, every
result checked against numpy, and after the last reload the lookups serve the new file."""

import os
import shutil
import threading
import time

import numpy as np

import autokernel

SECONDS = float(os.environ.get("AUTOKERNEL_LOAD_SECONDS", "3"))


def tune(path, workloads):
    autokernel.tune(workloads, db=path, budget=2, strategy="random", isolation="none",
                    finalists=0, progress=False)


def test_eight_threads_and_reloads(tmp_path):
    old, new = str(tmp_path / "old.db"), str(tmp_path / "new.db")
    tune(old, ["gemm:8x64x64", "gemm_bias_relu:16x24x32"])
    tune(new, ["gemm:24x40x32", "attention:1x2x16x8"])
    served = str(tmp_path / "served.db")
    shutil.copy(old, served)
    rt = autokernel.Runtime(served)
    assert rt.lookup("gemm:8x64x64")["level"] == "exact"

    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 24), dtype=np.float32)
    bias = rng.standard_normal(24, dtype=np.float32)
    packed = rt.pack_weight(w, act="relu", ms=[16])
    errors, calls = [], [0] * 8
    stop = threading.Event()

    def attention_ref(q, k, v):
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ v

    def serve(i):
        r = np.random.default_rng(100 + i)
        try:
            while not stop.is_set():
                kind = calls[i] % 5
                if kind == 0:
                    a, b = r.standard_normal((8, 64), dtype=np.float32), r.standard_normal((64, 64), dtype=np.float32)
                    got, ref = rt.gemm(a, b), a @ b
                elif kind == 1:
                    a, b = r.standard_normal((24, 32), dtype=np.float32), r.standard_normal((32, 40), dtype=np.float32)
                    got, ref = rt.gemm(a, b), a @ b
                elif kind == 2:
                    x = r.standard_normal((16, 32), dtype=np.float32)
                    got, ref = rt.linear(x, packed, bias), np.maximum(x @ w + bias, 0)
                elif kind == 3:
                    q, k, v = (r.standard_normal((1, 2, 16, 8), dtype=np.float32) for _ in range(3))
                    got, ref = rt.attention(q, k, v), attention_ref(q, k, v)
                else:
                    # Attention on fused Q|K|V rows: per-thread head buffers under load.
                    qkv = r.standard_normal((1, 16, 3 * 16), dtype=np.float32)
                    q, k, v = (qkv[..., j * 16:(j + 1) * 16].reshape(1, 16, 2, 8).transpose(0, 2, 1, 3) for j in range(3))
                    got = rt.attention_qkv(qkv, 2)
                    ref = attention_ref(q, k, v).transpose(0, 2, 1, 3).reshape(1, 16, 16)
                np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
                calls[i] += 1
        except BaseException as e:  # reported by the main thread
            errors.append(f"thread {i}: {e!r}")
            stop.set()

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    reloads = 0
    deadline = time.monotonic() + SECONDS
    for source in [new, old, new, old, new]:  # ends on the new file
        time.sleep(SECONDS / 6)
        tmp = served + ".tmp"
        shutil.copy(source, tmp)
        os.replace(tmp, served)
        rt.reload()
        reloads += 1
    time.sleep(max(0.0, deadline - time.monotonic()))
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    assert reloads == 5 and all(c > 0 for c in calls), calls
    assert rt.info()["generation"] == 6
    assert rt.lookup("gemm:24x40x32")["level"] == "exact"
    assert rt.lookup("gemm:8x64x64")["level"] != "exact"
    before = rt.lookups()["exact"]
    rt.gemm(np.ones((24, 32), np.float32), np.ones((32, 40), np.float32))
    assert rt.lookups()["exact"] == before + 1

//! `autokernel.Runtime`: the runtime's dispatch from Python.

use std::ops::Range;
use std::path::PathBuf;

use kernels::Workload;
use numpy::{PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime::{PrecisionPolicy, Runtime};

use crate::args::{dim, eps_f32, row_counts, IntArg, PathArg, Real};
use crate::errors::{kernel_err, runtime_err};
use crate::operand::{self, dims, expect_shape, F32Array};
use crate::packed::{packed_arg, parse_act, PyPackedWeight};
use crate::threads::Threads;

/// The policy `precision=` and `max_rel_err=` name (None: 'f32').
pub fn parse_policy(p: Option<&str>, max_rel_err: Option<f64>) -> PyResult<PrecisionPolicy> {
    let policy: PrecisionPolicy = p
        .unwrap_or("f32")
        .parse()
        .map_err(|e: runtime::UnknownPrecision| PyValueError::new_err(e.to_string()))?;
    match max_rel_err {
        None => Ok(policy),
        Some(e) if policy.is_exact() => Err(PyValueError::new_err(format!(
            "max_rel_err={e}: max_rel_err applies to a reduced precision ('bf16', 'int8' or \
             'auto'); precision={} serves f32 only",
            p.map_or("None".to_string(), |p| format!("'{p}'"))
        ))),
        Some(e) => policy
            .with_budget(e)
            .map_err(|e| PyValueError::new_err(format!("max_rel_err: {e}"))),
    }
}

/// Dispatches GEMM, fused linear layers and attention to the best tuned kernel variant for
/// this machine, from a tuning database opened read-only.
///
/// db_path: the tuning database (made by `autokernel tune` or `autokernel.tune`), a str,
///     bytes or os.PathLike path. A missing or unreadable file does not raise: the runtime
///     serves kernel defaults and `load_error` says why; `reload()` picks the file up once
///     it is good. None: no database, kernel defaults only.
///     The AUTOKERNEL_* environment settings (README: Serving) apply either way; one that
///     is invalid is ignored with a RuntimeWarning and reported by `settings_error`.
/// threads: threads the kernels use (None: every CPU this process may use). Part of the
///     hardware fingerprint: records tuned at another thread count are served as
///     `same_arch`, not `exact`. 1 runs each call on the calling thread (no hand-over to a
///     pool; threads calling at once each compute on their own); other counts below the
///     CPUs' get a pool of their own.
/// precision: the element type f32 calls are served in: 'f32' (the default), 'bf16', 'int8'
///     (that type wherever a kernel family serves it) or 'auto' (per workload, the fastest
///     record measured on its shape); see `set_precision`.
/// max_rel_err: error budget: a reduced-precision record is served only if its stored max
///     relative error against the f32 problem is at most this ('auto' defaults to 1e-2).
///     Refused (ValueError) with precision None or 'f32', which it would not change.
///
/// Operands are float32, C-contiguous numpy arrays or CPU torch tensors, read in place; a
/// wrong element type raises TypeError and a wrong layout or shape ValueError, naming the
/// argument (`copy=True` allows a converted copy of an input instead). An `out` is written in
/// place: it must share no memory with any input (compared by address, so two views of one
/// torch storage count) and, as a tensor, must not require grad; both raise ValueError. Integer
/// arguments out of range (a negative `threads`, `heads`, ...) raise ValueError naming them.
/// Kernels run with the GIL released, and one Runtime may be shared by any number of threads.
#[pyclass(name = "Runtime", module = "autokernel", frozen)]
pub struct PyRuntime {
    pub(crate) rt: Runtime,
    pub(crate) threads: Threads,
    db_path: Option<PathBuf>,
}

/// The key length of each sequence from `mask`: (B,) lengths in 0..=S, or a (B, S) 0/1
/// mask of 1s then 0s. Anything else (a fractional or non-finite length included) is a
/// ValueError naming `mask` and the value at fault.
pub(crate) fn key_lengths(
    py: Python<'_>,
    mask: &Bound<'_, PyAny>,
    b: usize,
    s: usize,
) -> PyResult<Vec<i32>> {
    // As float64, not int64: a cast to an integer would truncate 15.5 and turn NaN into
    // i64::MIN before anything could be checked.
    let bad = |why: String| PyValueError::new_err(format!("mask: {why}"));
    let arr = py
        .import("numpy")?
        .call_method1("asarray", (operand::detached(mask, "mask")?,))
        .map_err(|e| bad(format!("not an array of key lengths or a 0/1 mask: {e}")))?;
    let kind = arr.getattr("dtype")?.getattr("kind")?.extract::<String>()?;
    if !matches!(kind.as_str(), "b" | "i" | "u" | "f") {
        return Err(PyTypeError::new_err(format!(
            "argument 'mask' has dtype {}; expected integer, bool or float key lengths or a 0/1 mask",
            arr.getattr("dtype")?.str()?
        )));
    }
    let given = arr.clone();
    // An element as given (an integer exactly, not through float64), for messages.
    let exact = |index: Bound<'_, PyAny>| -> PyResult<String> {
        Ok(given.call_method1("item", (index,))?.str()?.to_string())
    };
    let arr = arr.call_method1("astype", ("float64",))?;
    let view: numpy::PyReadonlyArrayDyn<'_, f64> = arr.extract()?;
    let a = view.as_array();
    match a.shape() {
        [n] if *n == b => a
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                if !l.is_finite() || l.fract() != 0.0 {
                    Err(bad(format!("key length {l} is not an integer")))
                } else if !(0.0..=s as f64).contains(&l) {
                    let l = exact(i.into_pyobject(py)?.into_any())?;
                    Err(bad(format!("key length {l} is outside 0..={s}")))
                } else {
                    Ok(l as i32)
                }
            })
            .collect(),
        [n, m] if (*n, *m) == (b, s) => (0..b)
            .map(|i| {
                let row: Vec<f64> = (0..s).map(|j| a[[i, j]]).collect();
                if let Some(j) = row.iter().position(|&x| x != 0.0 && x != 1.0) {
                    let x = exact((i, j).into_pyobject(py)?.into_any())?;
                    return Err(bad(format!(
                        "row {i} holds {x}; expected a 0/1 mask of 1s then 0s"
                    )));
                }
                let len = row.iter().take_while(|&&x| x == 1.0).count();
                if row[len..].iter().all(|&x| x == 0.0) {
                    Ok(len as i32)
                } else {
                    Err(bad(format!(
                        "row {i} is not 1s then 0s (right padding is what is served)"
                    )))
                }
            })
            .collect(),
        other => Err(bad(format!(
            "expected ({b},) key lengths or a ({b}, {s}) 0/1 mask, got shape {other:?}"
        ))),
    }
}

/// Reads 2-D input `name`, returning it with its (rows, cols).
fn matrix<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    copy: bool,
) -> PyResult<(F32Array<'py>, usize, usize)> {
    let arr = operand::input(obj, name, copy)?;
    match *arr.shape() {
        [r, c] => Ok((arr, r, c)),
        _ => Err(operand::shape_err(&arr, name, "a 2-D array")),
    }
}

/// An operation's output: the array the kernels write, and the `out` argument it views
/// when the caller gave one.
pub(crate) struct Out<'py> {
    pub arr: F32Array<'py>,
    given: Option<Bound<'py, PyAny>>,
}

impl<'py> Out<'py> {
    /// What the operation returns once written: `out` itself when given (a torch tensor
    /// marked as written in place), else the new array.
    pub fn finish(self) -> PyResult<Bound<'py, PyAny>> {
        match self.given {
            Some(given) => {
                operand::mark_written(&given)?;
                Ok(given)
            }
            None => Ok(self.arr.into_any()),
        }
    }
}

/// The output: `out` checked against `shape`, or a new array.
pub(crate) fn out_array<'py>(
    py: Python<'py>,
    out: Option<&Bound<'py, PyAny>>,
    shape: &[usize],
) -> PyResult<Out<'py>> {
    Ok(Out {
        arr: match out {
            Some(o) => operand::output(o, "out", shape)?,
            None => operand::new_output(py, shape)?,
        },
        given: out.cloned(),
    })
}

/// Runs `f(inputs, output)` over read-only views of `inputs` and a writable view of `out`;
/// an `out` that shares memory with an input is refused (ValueError naming both).
pub(crate) fn with_views<R>(
    inputs: &[(&F32Array<'_>, &str)],
    out: &F32Array<'_>,
    f: impl FnOnce(&[&[f32]], &mut [f32]) -> PyResult<R>,
) -> PyResult<R> {
    with_views_named(inputs, (out, "out"), f)
}

/// [`with_views`] with the written operand called `out_name` in errors.
fn with_views_named<R>(
    inputs: &[(&F32Array<'_>, &str)],
    (out, out_name): (&F32Array<'_>, &str),
    f: impl FnOnce(&[&[f32]], &mut [f32]) -> PyResult<R>,
) -> PyResult<R> {
    // Compared as memory ranges: numpy's borrow tracking (below) keys on each array's base
    // object, and every `tensor.numpy()` (or `np.frombuffer` over a tensor) makes a new one,
    // so two views of one torch storage would pass it.
    let written = span(out);
    if let Some((_, name)) = inputs.iter().find(|(a, _)| overlap(&span(a), &written)) {
        return Err(PyValueError::new_err(format!(
            "argument '{out_name}' must be writable and share no memory with the inputs: it overlaps argument '{name}'"
        )));
    }
    let guards = inputs
        .iter()
        .map(|(a, name)| {
            a.try_readonly()
                .map_err(|e| PyValueError::new_err(format!("argument '{name}': {e}")))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let slices = guards
        .iter()
        .map(|g| {
            g.as_slice()
                .map_err(|e| PyValueError::new_err(e.to_string()))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let mut out_guard = out.try_readwrite().map_err(|e| {
        PyValueError::new_err(format!(
            "argument '{out_name}' must be writable and share no memory with the inputs: {e}"
        ))
    })?;
    let out_slice = out_guard
        .as_slice_mut()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    f(&slices, out_slice)
}

/// The bytes `arr` occupies (C-contiguous, as every operand is checked to be).
fn span(arr: &F32Array<'_>) -> Range<usize> {
    let start = arr.data() as usize;
    start..start + arr.len() * size_of::<f32>()
}

/// Whether two byte ranges share a byte (an empty one shares none).
fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
}

#[pymethods]
impl PyRuntime {
    /// Itself: a Runtime is shared, never copied (its database, policy and threads are one) (`copy.deepcopy` of an optimized model shares it).
    fn __copy__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Itself, as `__copy__`.
    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf
    }

    /// Refused with a `TypeError`: a Runtime lives in native memory (save an optimized model's
    /// `state_dict` and optimize the loaded model again).
    fn __reduce__(&self) -> PyResult<Py<PyAny>> {
        Err(crate::errors::not_picklable("autokernel.Runtime"))
    }

    #[new]
    #[pyo3(signature = (db_path=None, threads=None, precision=None, max_rel_err=None))]
    fn new(
        py: Python<'_>,
        db_path: Option<PathArg>,
        threads: Option<IntArg>,
        precision: Option<&str>,
        max_rel_err: Option<Real>,
    ) -> PyResult<Self> {
        let db_path = db_path.map(|p| p.0);
        let policy = parse_policy(
            precision,
            max_rel_err.map(|e| e.get("max_rel_err")).transpose()?,
        )?;
        let (threads, hw) = Threads::new(threads)?;
        let rt = match &db_path {
            // File I/O (a slow network path): other Python threads run meanwhile.
            Some(p) => py.detach(|| Runtime::open_or_defaults_for(p, hw)),
            None => Runtime::defaults_only_for(hw).with_env_settings(),
        };
        if let Some(e) = rt.settings_error() {
            let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
            PyErr::warn(py, &category, &std::ffi::CString::new(e)?, 1)?;
        }
        rt.set_precision(policy);
        Ok(PyRuntime {
            rt,
            threads,
            db_path,
        })
    }

    /// The database this runtime serves (None: defaults only).
    #[getter]
    fn db_path(&self) -> Option<PathBuf> {
        self.db_path.clone()
    }

    /// Threads the kernels use.
    #[getter]
    fn threads(&self) -> usize {
        self.threads.count()
    }

    /// The precision policy in force, e.g. 'f32', 'int8', 'auto (max rel err 1e-2)'.
    #[getter]
    fn precision(&self) -> String {
        self.rt.precision().to_string()
    }

    /// Sets the precision policy of later calls (see the class documentation). A weight
    /// packed before keeps the plans it has.
    #[pyo3(signature = (precision, max_rel_err=None))]
    fn set_precision(&self, precision: &str, max_rel_err: Option<Real>) -> PyResult<()> {
        self.rt.set_precision(parse_policy(
            Some(precision),
            max_rel_err.map(|e| e.get("max_rel_err")).transpose()?,
        )?);
        Ok(())
    }

    /// The id of the hardware fingerprint this runtime serves (CPU, ISA, threads, caches).
    #[getter]
    fn fingerprint(&self) -> String {
        self.rt.fingerprint().id.clone()
    }

    /// Why the database could not be loaded (the runtime then serves kernel defaults), or
    /// None.
    #[getter]
    fn load_error(&self) -> Option<String> {
        self.rt.load_error()
    }

    /// The first AUTOKERNEL_* environment setting that could not be applied (an invalid
    /// AUTOKERNEL_LINGER_US or AUTOKERNEL_FALLBACK_CHECK, an AUTOKERNEL_UNTUNED_LOG path that
    /// cannot be opened), and why, or None. Also warned about (RuntimeWarning) when the
    /// runtime is made; the other settings apply and the database is served either way.
    #[getter]
    fn settings_error(&self) -> Option<String> {
        self.rt.settings_error().map(str::to_string)
    }

    /// C = A·B for a (M, K) and b (K, N) float32 arrays; returns C (M, N), written into
    /// `out` when given (float32, C-contiguous, (M, N), sharing no memory with a or b).
    /// Empty dimensions give what numpy gives (K = 0: zeros).
    #[pyo3(signature = (a, b, out=None, *, copy=false))]
    fn gemm<'py>(
        &self,
        py: Python<'py>,
        a: &Bound<'py, PyAny>,
        b: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (a, m, k) = matrix(a, "a", copy)?;
        let b = operand::input(b, "b", copy)?;
        let n = match *b.shape() {
            [kb, n] if kb == k => n,
            _ => {
                return Err(operand::shape_err(
                    &b,
                    "b",
                    &format!("({k}, N) to match a {}", dims(&[m, k])),
                ))
            }
        };
        let c = out_array(py, out, &[m, n])?;
        with_views(&[(&a, "a"), (&b, "b")], &c.arr, |ins, c_out| {
            if m * n * k == 0 {
                // As numpy's: an empty product, or zeros where only the depth is empty.
                c_out.fill(0.0);
                return Ok(());
            }
            self.threads
                .run(py, || self.rt.gemm(m, n, k, ins[0], ins[1], c_out))?
                .map(drop)
                .map_err(runtime_err)
        })?;
        c.finish()
    }

    /// y = act(x·W + bias) with a weight packed by `pack_weight`: x is (..., in_features),
    /// bias (out_features,) or None, y (..., out_features). `act` may be given to check it:
    /// the activation is the one the weight was packed with.
    #[pyo3(signature = (x, weight, bias=None, act=None, out=None, *, copy=false))]
    #[allow(clippy::too_many_arguments)]
    fn linear<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        weight: &Bound<'py, PyAny>,
        bias: Option<&Bound<'py, PyAny>>,
        act: Option<&str>,
        out: Option<&Bound<'py, PyAny>>,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let weight = packed_arg(weight, "weight")?;
        let weight = weight.get();
        if let Some(name) = act {
            let asked = parse_act(Some(name))?;
            if asked != weight.act {
                return Err(PyValueError::new_err(format!(
                    "act='{name}', but the weight was packed with act='{}' (pack it with act='{name}')",
                    crate::packed::act_name(weight.act)
                )));
            }
        }
        let (n, k) = weight.inner.dims();
        let x = operand::input(x, "x", copy)?;
        let shape = x.shape().to_vec();
        if shape.last() != Some(&k) {
            return Err(operand::shape_err(
                &x,
                "x",
                &format!("(..., {k}) for a weight of in_features {k}"),
            ));
        }
        let m: usize = shape[..shape.len() - 1].iter().product();
        let mut out_shape = shape.clone();
        *out_shape.last_mut().expect("at least 1-D") = n;
        let y = out_array(py, out, &out_shape)?;
        let bias = bias.map(|b| operand::input(b, "bias", copy)).transpose()?;
        if let Some(b) = &bias {
            expect_shape(b, "bias", &[n], &dims(&[n]))?;
        }
        if m == 0 {
            return y.finish();
        }
        let mut inputs = vec![(&x, "x")];
        if let Some(b) = &bias {
            inputs.push((b, "bias"));
        }
        with_views(&inputs, &y.arr, |ins, y_out| {
            let bias = ins.get(1).copied().unwrap_or(&weight.zeros);
            self.threads
                .run(py, || {
                    self.rt
                        .gemm_bias_act_packed(&weight.inner, ins[0], bias, y_out)
                })?
                .map_err(runtime_err)
        })?;
        y.finish()
    }

    /// Packs a constant weight once for `linear`: `w` is (in_features, out_features)
    /// (`layout='kn'`, the GEMM's B) or (out_features, in_features) (`layout='nk'`, as
    /// torch.nn.Linear stores it). `act` (None/'identity'/'none', 'relu', 'gelu_tanh', 'gelu_erf') is
    /// fused into every call; `ms` lists the row counts (integers ≥ 1) to plan for (any other is
    /// served too).
    #[pyo3(signature = (w, act=None, ms=None, layout="kn", *, copy=false))]
    fn pack_weight(
        &self,
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        act: Option<&str>,
        ms: Option<&Bound<'_, PyAny>>,
        layout: &str,
        copy: bool,
    ) -> PyResult<PyPackedWeight> {
        let act = parse_act(act)?;
        let (w, rows, cols) = matrix(w, "w", copy)?;
        let ms = match ms.filter(|m| !m.is_none()) {
            Some(ms) => row_counts("ms", ms)?,
            None => vec![1],
        };
        let transposed = match layout {
            "kn" => false,
            "nk" => true,
            other => {
                return Err(PyValueError::new_err(format!(
                    "layout='{other}': expected 'kn' or 'nk'"
                )))
            }
        };
        let (k, n) = if transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        if k == 0 || n == 0 {
            let which = if k == 0 {
                "in_features"
            } else {
                "out_features"
            };
            return Err(PyValueError::new_err(format!(
                "argument 'w' has shape {}: {which} is zero (layout='{layout}'); a weight needs \
                 at least one input and one output feature",
                dims(&[rows, cols])
            )));
        }
        let guard = w
            .try_readonly()
            .map_err(|e| PyValueError::new_err(format!("argument 'w': {e}")))?;
        let data = guard
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let inner = self
            .threads
            .run(py, || {
                // An empty `w` has nothing to transpose: the runtime refuses its dimensions.
                if transposed && k > 0 {
                    let mut b =
                        kernels::alloc::filled(k * n, 0.0f32, "a transposed copy of the weight")?;
                    for (j, row) in data.chunks_exact(k).enumerate() {
                        for (i, &x) in row.iter().enumerate() {
                            b[i * n + j] = x;
                        }
                    }
                    self.rt.pack_weight_for(n, k, act, &b, &ms)
                } else {
                    self.rt.pack_weight_for(n, k, act, data, &ms)
                }
            })?
            .map_err(runtime_err)?;
        Ok(PyPackedWeight {
            inner,
            act,
            zeros: vec![0.0; n],
        })
    }

    /// Scaled dot-product attention: softmax(q·kᵀ/√D)·v over (B, H, S, D) float32 arrays;
    /// with `causal`, query i sees keys j ≤ i. Returns (B, H, S, D).
    ///
    /// mask: a padded batch: either the key lengths, (B,) integers in 0..=S (integral floats
    ///     such as 5.0 are taken; 5.5 or NaN raise ValueError), or a Hugging Face attention
    ///     mask, (B, S) of 1s then 0s (right padding); keys past a sequence's length are not
    ///     attended to, and a query that sees no key gets zeros.
    #[pyo3(signature = (q, k, v, causal=false, mask=None, out=None, *, copy=false))]
    #[allow(clippy::too_many_arguments)]
    fn attention<'py>(
        &self,
        py: Python<'py>,
        q: &Bound<'py, PyAny>,
        k: &Bound<'py, PyAny>,
        v: &Bound<'py, PyAny>,
        causal: bool,
        mask: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let q = operand::input(q, "q", copy)?;
        let shape = q.shape().to_vec();
        let [b, h, s, d] = shape[..] else {
            return Err(operand::shape_err(&q, "q", "(B, H, S, D)"));
        };
        let key_lens = match mask.filter(|m| !m.is_none()) {
            Some(m) => Some(key_lengths(py, m, b, s)?),
            None => None,
        };
        let k = operand::input(k, "k", copy)?;
        expect_shape(&k, "k", &shape, &format!("{} like q", dims(&shape)))?;
        let v = operand::input(v, "v", copy)?;
        expect_shape(&v, "v", &shape, &format!("{} like q", dims(&shape)))?;
        let o = out_array(py, out, &shape)?;
        if shape.contains(&0) {
            return o.finish(); // nothing to compute, nothing to write
        }
        with_views(&[(&q, "q"), (&k, "k"), (&v, "v")], &o.arr, |ins, o_out| {
            self.threads
                .run(py, || match &key_lens {
                    Some(lens) => self
                        .rt
                        .attention_masked(b, h, s, d, causal, lens, ins[0], ins[1], ins[2], o_out),
                    None => self
                        .rt
                        .attention(b, h, s, d, causal, ins[0], ins[1], ins[2], o_out),
                })?
                .map_err(runtime_err)
        })?;
        o.finish()
    }

    /// Self-attention straight from a fused QKV projection's output: `qkv` is (B, S, 3·H·D)
    /// float32 — each token's queries, then keys, then values, head h at columns h·D.. of
    /// each (what one Linear with the query, key and value weights stacked computes).
    /// Returns (B, S, H·D), head h at columns h·D.. (the output projection's input).
    /// Equivalent to splitting the heads, `attention`, and merging them back, without the
    /// copies: the tuned attention reads and writes the rows in place.
    ///
    /// heads: H (D is 3·H·D / 3 / H). causal, mask: as for `attention`.
    #[pyo3(signature = (qkv, heads, causal=false, mask=None, out=None, *, copy=false))]
    #[allow(clippy::too_many_arguments)]
    fn attention_qkv<'py>(
        &self,
        py: Python<'py>,
        qkv: &Bound<'py, PyAny>,
        heads: IntArg,
        causal: bool,
        mask: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let heads = dim("heads", heads)?;
        let qkv = operand::input(qkv, "qkv", copy)?;
        let [b, s, width] = qkv.shape()[..] else {
            return Err(operand::shape_err(&qkv, "qkv", "(B, S, 3·H·D)"));
        };
        let Some(per_token) = heads.checked_mul(3).filter(|&h3| width % h3 == 0) else {
            return Err(PyValueError::new_err(format!(
                "argument 'qkv' has {width} columns, not a multiple of 3·heads = 3·{heads}"
            )));
        };
        let d = width / per_token;
        let key_lens = match mask.filter(|m| !m.is_none()) {
            Some(m) => Some(key_lengths(py, m, b, s)?),
            None => None,
        };
        let o = out_array(py, out, &[b, s, heads * d])?;
        if [b, s, d].contains(&0) {
            return o.finish(); // nothing to compute, nothing to write
        }
        let dims = runtime::AttentionRows {
            batch: b,
            seq: s,
            heads,
            d,
            causal,
        };
        with_views(&[(&qkv, "qkv")], &o.arr, |ins, o_out| {
            self.threads
                .run(py, || {
                    self.rt
                        .attention_qkv(dims, key_lens.as_deref(), ins[0], o_out)
                })?
                .map_err(runtime_err)
        })?;
        o.finish()
    }

    /// In place: `x = LayerNorm(x + residual)` over the last axis (`residual` None: plain
    /// LayerNorm), `weight` and `bias` the (H,) scale and shift, as torch.nn.LayerNorm
    /// computes it. `x` (..., H) must be writable float32; `residual` has x's shape and
    /// shares no memory with it. Returns `x`.
    #[pyo3(signature = (x, residual, weight, bias, eps=Real::of(1e-12), *, copy=false), text_signature = "($self, x, residual, weight, bias, eps=1e-12, *, copy=False)")]
    #[allow(clippy::too_many_arguments)]
    fn add_layer_norm<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        residual: Option<&Bound<'py, PyAny>>,
        weight: &Bound<'py, PyAny>,
        bias: &Bound<'py, PyAny>,
        eps: Real,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let eps32 = eps_f32(eps.get("eps")?)?;
        // Written in place: checked as an output (never a converted copy).
        let shape: Vec<usize> = x
            .getattr("shape")
            .and_then(|s| s.extract())
            .unwrap_or_default();
        let xo = operand::output(x, "x", &shape)?;
        let Some(&h) = shape.last().filter(|&&h| h > 0) else {
            return Err(PyValueError::new_err(format!(
                "argument 'x' has shape {}, expected (..., H) with H ≥ 1",
                dims(&shape)
            )));
        };
        let weight = operand::input(weight, "weight", copy)?;
        expect_shape(&weight, "weight", &[h], &dims(&[h]))?;
        let bias = operand::input(bias, "bias", copy)?;
        expect_shape(&bias, "bias", &[h], &dims(&[h]))?;
        let residual = residual
            .filter(|r| !r.is_none())
            .map(|r| operand::input(r, "residual", copy))
            .transpose()?;
        let mut inputs = vec![(&weight, "weight"), (&bias, "bias")];
        if let Some(r) = &residual {
            expect_shape(r, "residual", &shape, &format!("{} like x", dims(&shape)))?;
            inputs.push((r, "residual"));
        }
        with_views_named(&inputs, (&xo, "x"), |ins, x_out| {
            self.threads
                .run(py, || {
                    runtime::add_layer_norm(x_out, ins.get(2).copied(), ins[0], ins[1], eps32)
                })?
                .map_err(runtime_err)
        })?;
        operand::mark_written(x)?;
        Ok(x.clone())
    }

    /// A whole BERT-style (post-LayerNorm) encoder layer served in one call:
    /// `x = LN1(x + attention(x·Wqkv + b)·Wo + bo)`, then `x = LN2(x + act(x·Wup + bup)·Wdown
    /// + bdown)`, the activation being the one `ffn_up` was packed with. Weights are
    /// PackedWeights (in_features → out_features: qkv hidden → 3·hidden, Q then K then V;
    /// out hidden → hidden; ffn_up hidden → F; ffn_down F → hidden); biases and the
    /// LayerNorms' (weight, bias) are copied. Returns an EncoderLayer: call it on
    /// (B, S, hidden) float32 hidden states.
    #[pyo3(signature = (qkv, qkv_bias, out, out_bias, ln1, ffn_up, ffn_up_bias, ffn_down, ffn_down_bias, ln2, heads, eps=Real::of(1e-12)), text_signature = "($self, qkv, qkv_bias, out, out_bias, ln1, ffn_up, ffn_up_bias, ffn_down, ffn_down_bias, ln2, heads, eps=1e-12)")]
    #[allow(clippy::too_many_arguments)]
    fn encoder_layer(
        slf: &Bound<'_, Self>,
        qkv: &Bound<'_, PyAny>,
        qkv_bias: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        out_bias: &Bound<'_, PyAny>,
        ln1: &Bound<'_, PyAny>,
        ffn_up: &Bound<'_, PyAny>,
        ffn_up_bias: &Bound<'_, PyAny>,
        ffn_down: &Bound<'_, PyAny>,
        ffn_down_bias: &Bound<'_, PyAny>,
        ln2: &Bound<'_, PyAny>,
        heads: IntArg,
        eps: Real,
    ) -> PyResult<crate::layer::PyEncoderLayer> {
        let heads = dim("heads", heads)?;
        let (ln1, ln2) = (pair(ln1, "ln1")?, pair(ln2, "ln2")?);
        let vec = |x: &Bound<'_, PyAny>, name: &str| -> PyResult<Vec<f32>> {
            let a = operand::input(x, name, true)?;
            let v = a
                .try_readonly()
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            Ok(v.as_slice()
                .map_err(|e| PyValueError::new_err(e.to_string()))?
                .to_vec())
        };
        crate::layer::PyEncoderLayer {
            rt: slf.clone().unbind(),
            weights: [
                packed_arg(qkv, "qkv")?.unbind(),
                packed_arg(out, "out")?.unbind(),
                packed_arg(ffn_up, "ffn_up")?.unbind(),
                packed_arg(ffn_down, "ffn_down")?.unbind(),
            ],
            biases: [
                vec(qkv_bias, "qkv_bias")?,
                vec(out_bias, "out_bias")?,
                vec(ffn_up_bias, "ffn_up_bias")?,
                vec(ffn_down_bias, "ffn_down_bias")?,
            ],
            norms: [
                (vec(&ln1.0, "ln1 weight")?, vec(&ln1.1, "ln1 bias")?),
                (vec(&ln2.0, "ln2 weight")?, vec(&ln2.1, "ln2 bias")?),
            ],
            heads,
            eps: eps_f32(eps.get("eps")?)?,
        }
        .checked()
    }

    /// Encoder layers made by this runtime (`encoder_layer`) run one after the other on
    /// hidden states `x`, (B, S, hidden) float32 (not modified), in one call: the GIL
    /// released and the runtime's threads entered once for the whole stack, not once per
    /// layer. Returns the last layer's output, (B, S, hidden), in `out` when given (it must
    /// not be `x`). `mask`: a padded batch, as for `attention`. copy: as for `gemm`.
    #[pyo3(signature = (layers, x, mask=None, out=None, *, copy=false))]
    fn encoder<'py>(
        slf: &Bound<'py, Self>,
        layers: &Bound<'py, PyAny>,
        x: &Bound<'py, PyAny>,
        mask: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let layers = layer_list(layers)?;
        let refs: Vec<&crate::layer::PyEncoderLayer> = layers.iter().map(|l| l.get()).collect();
        if let Some(i) = refs.iter().position(|l| !l.rt.is(slf)) {
            return Err(PyValueError::new_err(format!(
                "layers[{i}] was made by another Runtime: every layer must come from this one's encoder_layer"
            )));
        }
        crate::layer::run_layers(slf.py(), slf.get(), &refs, x, mask, out, copy)
    }

    /// What the runtime serves for a workload ('gemm:128x768x768',
    /// 'gemm_bias_gelu:128x3072x768', 'attention:1x12x128x64:causal', ...): the fields of
    /// `autokernel lookup --json` (workload as asked; dtype, the element type the call is
    /// served in under the precision policy; device, level, kernel, kernel_version, config,
    /// fingerprint, source, rel_err, precisions, precision, served_as, not_served: why a record
    /// of this machine was set aside, e.g. one to re-tune, or None).
    fn lookup<'py>(&self, py: Python<'py>, workload: &str) -> PyResult<Bound<'py, PyAny>> {
        let w: Workload = workload.parse().map_err(kernel_err)?;
        let json = self
            .threads
            .run(py, || self.rt.lookup_json(&w, "cpu"))?
            .map_err(runtime_err)?;
        crate::json::to_py(py, &json)
    }

    /// Re-reads the database file (it may have been replaced) and swaps the new index in
    /// while other threads keep serving; returns the new index's counts. On error the old
    /// index stays in service and AutokernelError is raised.
    fn reload<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.db_path.is_none() {
            return Err(crate::errors::AutokernelError::new_err(
                "this runtime has no database (db_path=None): there is nothing to reload",
            ));
        }
        let info = py.detach(|| self.rt.reload()).map_err(runtime_err)?;
        index_info(py, &info)
    }

    /// Counts describing the index in service (generation, exact, same_arch, ...).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        index_info(py, &self.rt.index_info())
    }

    /// Lookups served so far, by level: {'exact', 'same_arch', 'nearest_shape', 'default'},
    /// and under 'by_precision' by the element type served in: {'f32', 'bf16', 'int8'} (an
    /// f32 call the precision policy serves in int8 counts under 'int8').
    fn lookups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.rt.lookups();
        let d = PyDict::new(py);
        d.set_item("exact", c.levels.exact)?;
        d.set_item("same_arch", c.levels.same_arch)?;
        d.set_item("nearest_shape", c.levels.nearest_shape)?;
        d.set_item("default", c.levels.default)?;
        let p = PyDict::new(py);
        p.set_item("f32", c.f32)?;
        p.set_item("bf16", c.bf16)?;
        p.set_item("int8", c.int8)?;
        d.set_item("by_precision", p)?;
        Ok(d)
    }

    /// Database records that are not served, as (workload, reason) pairs: this machine's own,
    /// and a same-arch sibling machine's where nothing else serves that workload.
    fn skipped(&self) -> Vec<(String, String)> {
        self.rt
            .skipped()
            .into_iter()
            .map(|s| (s.workload, s.reason))
            .collect()
    }

    /// Appends every distinct workload served by a fallback level to `path`, once
    /// ('gemm:24x768x768  # nearest_shape'): the input of `autokernel tune --workloads-from`.
    fn log_fallbacks_to(&self, path: PathArg) -> PyResult<()> {
        self.rt.log_fallbacks_to(path.0).map_err(runtime_err)
    }

    /// Turns the first-use timing check of borrowed (nearest-shape) configs on or off.
    fn set_fallback_check(&self, on: bool) {
        self.rt.set_fallback_check(on);
    }

    fn __repr__(&self) -> String {
        format!(
            "Runtime(db_path={}, threads={}, precision='{}', fingerprint='{}'{}{})",
            self.db_path
                .as_ref()
                .map_or("None".into(), |p| format!("'{}'", p.display())),
            self.threads.count(),
            self.rt.precision(),
            self.rt.fingerprint().id,
            self.rt
                .load_error()
                .map_or(String::new(), |e| format!(", load_error='{e}'")),
            self.rt
                .settings_error()
                .map_or(String::new(), |e| format!(", settings_error='{e}'"))
        )
    }
}

/// The items of a list, tuple or other sequence `obj` (not a str, whose characters pyo3
/// would give), or None.
fn sequence_items<'py>(obj: &Bound<'py, PyAny>) -> Option<Vec<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return None;
    }
    obj.extract().ok()
}

/// A `(weight, bias)` pair from argument `name`: a tuple or list of two; else a TypeError
/// naming the argument.
fn pair<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let two = sequence_items(obj).filter(|v| v.len() == 2);
    match two {
        Some(v) => {
            let [w, b]: [Bound<'py, PyAny>; 2] = v.try_into().expect("two items");
            Ok((w, b))
        }
        None => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "argument '{name}' is {}: expected a (weight, bias) pair of arrays",
            obj.repr()?
        ))),
    }
}

/// The `layers` argument of `encoder`: a list or tuple of EncoderLayers; else a TypeError
/// naming the argument (or the item).
fn layer_list<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<Vec<Bound<'py, crate::layer::PyEncoderLayer>>> {
    let items = sequence_items(obj).ok_or_else(|| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "argument 'layers' is a {}: expected a list of EncoderLayers (from encoder_layer)",
            obj.get_type().name().map_or("?".into(), |n| n.to_string())
        ))
    })?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            item.cast_into::<crate::layer::PyEncoderLayer>()
                .map_err(|e| {
                    pyo3::exceptions::PyTypeError::new_err(format!(
                        "layers[{i}] is a {}: expected an EncoderLayer (from encoder_layer)",
                        e.into_inner()
                            .get_type()
                            .name()
                            .map_or("?".into(), |n| n.to_string())
                    ))
                })
        })
        .collect()
}

fn index_info<'py>(py: Python<'py>, info: &runtime::IndexInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("generation", info.generation)?;
    d.set_item("exact", info.exact)?;
    d.set_item("same_arch", info.same_arch)?;
    d.set_item("same_arch_fingerprints", info.same_arch_fingerprints)?;
    d.set_item("cached_misses", info.cached_misses)?;
    d.set_item("skipped", info.skipped)?;
    d.set_item("path", info.path.as_ref().map(|p| p.display().to_string()))?;
    Ok(d)
}

/// The id of this machine's hardware fingerprint at `threads` (None: all CPUs). Like making
/// a Runtime, it starts the process-wide pool's threads (its size is part of the
/// fingerprint): fork only before, or use the 'spawn' or 'forkserver' start methods.
#[pyfunction]
#[pyo3(signature = (threads=None))]
pub fn fingerprint(threads: Option<IntArg>) -> PyResult<String> {
    Threads::new(threads).map(|(_, hw)| hw.id)
}

/// The row counts of the blocks a GEMM call of `m` rows, `n` columns and depth `k` is served
/// in, each once (`[m]` where it is one workload): what the PyTorch integration records as
/// the call's workloads.
#[pyfunction]
#[pyo3(name = "_row_blocks")]
pub fn row_blocks(m: usize, n: usize, k: usize) -> Vec<usize> {
    runtime::row_blocks(m, n, k)
}

/// The sequence counts of the blocks an attention call on `batch` sequences of `heads` heads
/// of `seq × d` is served in, each once (see `_row_blocks`).
#[pyfunction]
#[pyo3(name = "_sequence_blocks")]
pub fn sequence_blocks(batch: usize, heads: usize, seq: usize, d: usize) -> Vec<usize> {
    runtime::sequence_blocks(batch, heads, seq, d)
}

//! `autokernel.PackedWeight`: a constant weight packed once for `Runtime.linear`.

use kernels::Act;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// The Python names of the activations fused into `linear`: `None`/`"identity"`/`"none"`, `"relu"`,
/// `"gelu_tanh"` (the tanh form: Hugging Face's `gelu_new`), `"gelu_erf"` (the exact form:
/// PyTorch's `gelu`, Hugging Face's `gelu`). `"gelu"` alone is refused as ambiguous.
pub fn parse_act(name: Option<&str>) -> PyResult<Act> {
    match name.map(str::trim) {
        None | Some("identity" | "none") => Ok(Act::Identity),
        Some("relu") => Ok(Act::Relu),
        Some("gelu_tanh" | "gelu_new") => Ok(Act::Gelu),
        Some("gelu") => Err(PyValueError::new_err(
            "act='gelu' is ambiguous: 'gelu_tanh' (the tanh form, Hugging Face's gelu_new) or \
             'gelu_erf' (the exact form, PyTorch's default)",
        )),
        Some("gelu_erf") => Ok(Act::GeluErf),
        Some(other) => Err(PyValueError::new_err(format!(
            "unknown act '{other}' (known: None, 'identity' or 'none', 'relu', 'gelu_tanh', 'gelu_erf')"
        ))),
    }
}

/// The Python name of `act`.
pub fn act_name(act: Act) -> &'static str {
    match act {
        Act::Identity => "identity",
        Act::Relu => "relu",
        Act::Gelu => "gelu_tanh",
        Act::GeluErf => "gelu_erf",
    }
}

/// A constant weight (`in_features × out_features` as the GEMM's B operand) packed once by
/// `Runtime.pack_weight` into the panel layouts of the variants that serve it, with the
/// activation fused into `Runtime.linear` calls that use it. Serves any number of rows;
/// read-only and safe to share between threads.
#[pyclass(name = "PackedWeight", module = "autokernel", frozen)]
pub struct PyPackedWeight {
    pub inner: runtime::PackedWeight,
    pub act: Act,
    /// The bias of calls that give none.
    pub zeros: Vec<f32>,
}

#[pymethods]
impl PyPackedWeight {
    /// Itself: a packed weight is immutable (`copy.deepcopy` of an optimized model shares it).
    fn __copy__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Itself, as `__copy__`.
    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf
    }

    /// Refused with a `TypeError`: a PackedWeight lives in native memory (save an optimized model's
    /// `state_dict` and optimize the loaded model again).
    fn __reduce__(&self) -> PyResult<Py<PyAny>> {
        Err(crate::errors::not_picklable("autokernel.PackedWeight"))
    }

    /// Input features (K, the rows of B).
    #[getter]
    fn in_features(&self) -> usize {
        self.inner.dims().1
    }

    /// Output features (N, the columns of B).
    #[getter]
    fn out_features(&self) -> usize {
        self.inner.dims().0
    }

    /// The activation fused into every `linear` with this weight: 'identity', 'relu',
    /// 'gelu_tanh' or 'gelu_erf'.
    #[getter]
    fn act(&self) -> &'static str {
        act_name(self.act)
    }

    /// The workload of the first row count it was planned for, e.g. 'gemm_bias:128x768x768'.
    #[getter]
    fn workload(&self) -> String {
        self.inner.workload().key()
    }

    /// Where the config serving that workload came from: 'exact', 'same_arch',
    /// 'nearest_shape' or 'default'.
    #[getter]
    fn level(&self) -> &'static str {
        self.inner.level().as_str()
    }

    /// The config serving that workload, as JSON text.
    #[getter]
    fn config(&self) -> String {
        self.inner.config().to_json()
    }

    /// The distinct f32 panel layouts (NR, KC) it is packed in: empty for a weight kept
    /// only in the reduced-precision form (bf16, int8) that serves it.
    #[getter]
    fn layouts(&self) -> Vec<(usize, usize)> {
        self.inner.layouts()
    }

    /// Bytes held by its copies: f32 panel layouts, reduced-precision forms, and the
    /// row-major copy, if one is kept.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.bytes()
    }

    /// The element types of the row counts planned so far (`"f32"`, `"bf16"`, `"i8"`): the
    /// precision policy's choice when it was packed.
    #[getter]
    fn dtypes(&self) -> Vec<&'static str> {
        self.inner.dtypes().iter().map(|d| d.name()).collect()
    }

    /// Copies of the weight it holds: f32 panel layouts, reduced-precision forms, and the
    /// row-major copy, if one is kept (one for a weight served in int8 or bf16 only).
    #[getter]
    fn copies(&self) -> usize {
        self.inner.copies()
    }

    fn __repr__(&self) -> String {
        format!(
            "PackedWeight(in_features={}, out_features={}, act='{}', workload='{}', level='{}', layouts={:?})",
            self.in_features(),
            self.out_features(),
            self.act(),
            self.workload(),
            self.level(),
            self.layouts()
        )
    }
}

/// Argument `name` as a PackedWeight; anything else is a `TypeError` naming the argument.
pub fn packed_arg<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Bound<'py, PyPackedWeight>> {
    match obj.cast::<PyPackedWeight>() {
        Ok(w) => Ok(w.clone()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "argument '{name}' is a {}, expected an autokernel.PackedWeight (made by \
             Runtime.pack_weight)",
            obj.get_type().name()?
        ))),
    }
}

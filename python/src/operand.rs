//! Operands from Python: numpy arrays and CPU torch tensors, read in place.
//!
//! An operand must be float32, C-contiguous and aligned, with the expected shape; anything
//! else raises `TypeError` (wrong kind or element type) or `ValueError` (layout, shape)
//! naming the argument. Nothing is copied unless the caller passed `copy=True`, which allows
//! a conversion (element type, layout, a list) for inputs; outputs are never copied. A tensor
//! that requires grad is refused, input or output, even under `torch.no_grad()`: an input's
//! result would be cut off from autograd (as `tensor.numpy()` refuses), an output would be
//! written outside it; pass `.detach()`. A numpy masked array is refused (its mask would be
//! ignored).

use numpy::{
    PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// An f32 operand: a C-contiguous, aligned numpy array (a view of a torch tensor's storage
/// when a tensor was given).
pub type F32Array<'py> = Bound<'py, PyArrayDyn<f32>>;

/// Reads input `name` as an f32 operand; with `copy`, converts what is not one.
pub fn input<'py>(obj: &Bound<'py, PyAny>, name: &str, copy: bool) -> PyResult<F32Array<'py>> {
    let arr = match as_ndarray(obj, name, Some(copy))? {
        Some(arr) => arr,
        None if copy => np_call(obj.py(), "asarray", obj)?,
        None => return Err(not_an_array(obj, name, Some(copy))),
    };
    checked(arr, name, Some(copy))
}

/// Reads output `name`: an f32, C-contiguous, writable array or CPU tensor of `shape`.
pub fn output<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    shape: &[usize],
) -> PyResult<F32Array<'py>> {
    let arr = as_ndarray(obj, name, None)?.ok_or_else(|| not_an_array(obj, name, None))?;
    let arr = checked(arr, name, None)?;
    expect_shape(&arr, name, shape, &dims(shape))?;
    Ok(arr)
}

/// Tells autograd that torch tensor `obj` was written in place (its version counter, which
/// a write through the storage's array view does not move): a tensor saved for backward
/// and then overwritten makes `backward()` raise, and the drop-in sees a changed weight.
/// Anything else is left alone.
pub fn mark_written(obj: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = obj.py();
    let Some((tensor, _)) = torch_types(py)? else {
        return Ok(());
    };
    if !obj.is_instance(tensor.bind(py))? {
        return Ok(());
    }
    static INCREMENT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let f = INCREMENT.get_or_try_init(py, || {
        let graph = py.import("torch.autograd.graph")?;
        PyResult::Ok(graph.getattr("increment_version")?.unbind())
    })?;
    f.call1(py, (obj,))?;
    Ok(())
}

/// Raises `ValueError` unless `arr` has `shape`; `expected` describes it for the message.
pub fn expect_shape(
    arr: &F32Array<'_>,
    name: &str,
    shape: &[usize],
    expected: &str,
) -> PyResult<()> {
    if arr.shape() == shape {
        Ok(())
    } else {
        Err(shape_err(arr, name, expected))
    }
}

/// `ValueError: argument 'name' has shape (..), expected <expected>`.
pub fn shape_err(arr: &F32Array<'_>, name: &str, expected: &str) -> PyErr {
    PyValueError::new_err(format!(
        "argument '{name}' has shape {}, expected {expected}",
        dims(arr.shape())
    ))
}

/// A shape as Python prints it: `(2, 3)`, `(5,)`.
pub fn dims(shape: &[usize]) -> String {
    match shape {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Outputs above this many bytes are allocated through `numpy.empty`, whose failure is a
/// Python `MemoryError`: numpy's C allocation, which small outputs take, has no error path
/// in the bindings (a failed one would be a panic).
const CHECKED_OUTPUT_BYTES: usize = 256 << 20;

/// A new, uninitialised f32 array of `shape` for an output every element of which the
/// kernel writes. A shape whose size overflows is a `ValueError`; memory that cannot be had
/// a `MemoryError`.
pub fn new_output<'py>(py: Python<'py>, shape: &[usize]) -> PyResult<F32Array<'py>> {
    let bytes = shape
        .iter()
        .try_fold(size_of::<f32>(), |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize);
    match bytes {
        None => Err(PyValueError::new_err(format!(
            "the output of shape {} is too big to allocate",
            dims(shape)
        ))),
        Some(n) if n > CHECKED_OUTPUT_BYTES => {
            let arr = py
                .import("numpy")?
                .call_method1("empty", (shape.to_vec(), intern!(py, "float32")))?;
            Ok(arr.cast_into::<PyArrayDyn<f32>>()?)
        }
        // SAFETY: the array is handed to Python only after a kernel has written every
        // element (C is overwritten by every kernel); on an error it is dropped unread.
        Some(_) => Ok(unsafe { PyArrayDyn::<f32>::new(py, shape, false) }),
    }
}

/// `obj` as something `numpy.asarray` reads without torch's errors (for integer operands
/// such as attention masks, not read in place): a CPU torch tensor detached from autograd
/// and made dense; anything else as it is. A tensor on another device is a `TypeError`.
pub fn detached<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    not_masked(obj, name)?;
    let Some((tensor, _)) = torch_types(py)? else {
        return Ok(obj.clone());
    };
    if !obj.is_instance(tensor.bind(py))? {
        return Ok(obj.clone());
    }
    cpu_only(obj, name)?;
    dense(&obj.call_method0(intern!(py, "detach"))?)
}

/// `TypeError` if `obj` is a numpy masked array: read as an array, its mask would be
/// ignored. (A plain ndarray is told apart by its exact type, without importing numpy.ma.)
fn not_masked(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
    let py = obj.py();
    if obj.is_exact_instance_of::<PyUntypedArray>() {
        return Ok(());
    }
    static MASKED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let masked = MASKED.get_or_try_init(py, || {
        PyResult::Ok(py.import("numpy.ma")?.getattr("MaskedArray")?.unbind())
    })?;
    if obj.is_instance(masked.bind(py))? {
        return Err(PyTypeError::new_err(format!(
            "argument '{name}' is a numpy masked array, whose mask autokernel would ignore: pass \
             {name}.filled(value) (or {name}.data to drop the mask)"
        )));
    }
    Ok(())
}

/// Torch tensor `t` as a plain strided one that `.numpy()` can view: sparse and MKL-DNN
/// layouts made dense, negated and conjugated views resolved (a copy where needed).
fn dense<'py>(t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let t = t.call_method0("to_dense")?.call_method0("resolve_neg")?;
    t.call_method0("resolve_conj")
}

/// Whether torch tensor `t` was made under `torch.inference_mode()` and is used outside it,
/// where PyTorch refuses in-place writes to it.
fn is_locked_inference_tensor(t: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = t.py();
    if !t.call_method0(intern!(py, "is_inference"))?.is_truthy()? {
        return Ok(false);
    }
    let torch = py.import("torch")?;
    Ok(!torch
        .call_method0("is_inference_mode_enabled")?
        .is_truthy()?)
}

/// `TypeError` unless torch tensor `t` is on the CPU.
fn cpu_only(t: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
    if t.getattr(intern!(t.py(), "is_cpu"))?.is_truthy()? {
        return Ok(());
    }
    let device = t.getattr("device")?.str()?.to_string();
    Err(PyTypeError::new_err(format!(
        "argument '{name}' is a torch tensor on {device}; autokernel runs on the CPU (move it with .cpu())"
    )))
}

/// The ndarray behind `obj` (itself, or the zero-copy view of a CPU torch tensor); `None`
/// for anything else. `copy`: `Some(allowed)` for an input, `None` for an output.
fn as_ndarray<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    copy: Option<bool>,
) -> PyResult<Option<Bound<'py, PyUntypedArray>>> {
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        not_masked(obj, name)?;
        return Ok(Some(arr.clone()));
    }
    let py = obj.py();
    let Some((tensor, float32)) = torch_types(py)? else {
        return Ok(None);
    };
    if !obj.is_instance(tensor.bind(py))? {
        return Ok(None);
    }
    cpu_only(obj, name)?;
    if copy.is_none() && is_locked_inference_tensor(obj)? {
        return Err(PyValueError::new_err(format!(
            "argument '{name}' is an inference tensor: PyTorch allows writing it only inside \
             torch.inference_mode()"
        )));
    }
    let mut t = obj.clone();
    if t.getattr(intern!(py, "requires_grad"))?.is_truthy()? {
        if copy.is_none() {
            // With grad enabled PyTorch refuses in-place writes to a leaf that requires
            // grad, and a write through the storage would bypass autograd's record of a
            // non-leaf's; refused in every mode, so a call means the same under no_grad.
            return Err(PyValueError::new_err(format!(
                "argument '{name}' is a tensor that requires grad: autokernel writes it in place, \
                 outside autograd (pass {name}.detach() to write its storage anyway)"
            )));
        }
        // A result computed from it would be cut off from autograd without a word (as
        // `tensor.numpy()`, refused in every mode and with copy=True too).
        return Err(PyValueError::new_err(format!(
            "argument '{name}' is a tensor that requires grad: call {name}.detach() first; the \
             runtime's ops have no backward"
        )));
    }
    let dtype = t.getattr(intern!(py, "dtype"))?;
    if !dtype.is(float32.bind(py)) {
        if dtype.getattr(intern!(py, "is_complex"))?.is_truthy()? {
            return Err(complex_err(name, &dtype.str()?.to_string()));
        }
        if copy != Some(true) {
            return Err(PyTypeError::new_err(format!(
                "argument '{name}' is a {} tensor, expected torch.float32{}",
                dtype.str()?,
                copy_hint(copy)
            )));
        }
        t = t.call_method0("float")?;
    }
    let arr = match t.call_method0(intern!(py, "numpy")) {
        Ok(arr) => arr,
        // A sparse, MKL-DNN or negated-view tensor has no array view of its storage.
        Err(_) if copy == Some(true) => dense(&t)?.call_method0("numpy")?,
        Err(e) => {
            let layout = t.getattr("layout")?.str()?.to_string();
            return Err(PyTypeError::new_err(format!(
                "argument '{name}' is a torch tensor ({layout}) with no array view of its \
                 storage: {e}{}",
                copy_hint(copy)
            )));
        }
    };
    Ok(Some(arr.cast_into::<PyUntypedArray>()?))
}

/// Checks element type, layout and alignment; with `copy = Some(true)`, converts instead of
/// refusing.
fn checked<'py>(
    arr: Bound<'py, PyUntypedArray>,
    name: &str,
    copy: Option<bool>,
) -> PyResult<F32Array<'py>> {
    let py = arr.py();
    let mut arr = arr;
    if !arr.dtype().is_equiv_to(&numpy::dtype::<f32>(py)) {
        if arr.dtype().kind() == b'c' {
            return Err(complex_err(name, &arr.dtype().to_string()));
        }
        if copy != Some(true) {
            return Err(PyTypeError::new_err(format!(
                "argument '{name}' has dtype {}, expected float32{}",
                arr.dtype(),
                copy_hint(copy)
            )));
        }
        arr = arr
            .call_method1("astype", ("float32",))?
            .cast_into::<PyUntypedArray>()?;
    }
    let aligned = |a: &Bound<'py, PyUntypedArray>| {
        a.cast::<PyArrayDyn<f32>>()
            .is_ok_and(|a| (a.data() as usize).is_multiple_of(4))
    };
    if !arr.is_c_contiguous() || !aligned(&arr) {
        if copy != Some(true) {
            return Err(PyValueError::new_err(format!(
                "argument '{name}' (shape {}) is not C-contiguous and aligned{}; autokernel reads operands in place",
                dims(arr.shape()),
                copy_hint(copy)
            )));
        }
        // A fresh array: `ascontiguousarray` would hand back a misaligned one as it is.
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("dtype", "float32")?;
        kwargs.set_item("order", "C")?;
        kwargs.set_item("copy", true)?;
        arr = (py.import("numpy")?.getattr("array")?)
            .call((arr,), Some(&kwargs))?
            .cast_into::<PyUntypedArray>()?;
    }
    Ok(arr.cast_into::<PyArrayDyn<f32>>()?)
}

/// `numpy.<f>(obj, dtype="float32")`.
fn np_call<'py>(
    py: Python<'py>,
    f: &str,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("dtype", "float32")?;
    let arr = py
        .import("numpy")?
        .getattr(f)?
        .call((obj,), Some(&kwargs))?;
    Ok(arr.cast_into::<PyUntypedArray>()?)
}

/// `torch.Tensor` and `torch.float32` once the process has imported torch (never imported
/// here: numpy alone is enough), looked up once.
fn torch_types(py: Python<'_>) -> PyResult<Option<&'static (Py<PyAny>, Py<PyAny>)>> {
    static TORCH: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();
    if let Some(t) = TORCH.get(py) {
        return Ok(Some(t));
    }
    let Ok(torch) = py.import("sys")?.getattr("modules")?.get_item("torch") else {
        return Ok(None);
    };
    let types = (
        torch.getattr("Tensor")?.unbind(),
        torch.getattr("float32")?.unbind(),
    );
    Ok(Some(TORCH.get_or_init(py, || types)))
}

/// `obj` is neither an array nor a tensor; `copy` as for [`as_ndarray`] (only an input may be
/// converted, so only an input's message suggests it).
fn not_an_array(obj: &Bound<'_, PyAny>, name: &str, copy: Option<bool>) -> PyErr {
    let ty = obj
        .get_type()
        .name()
        .map_or_else(|_| "?".to_string(), |n| n.to_string());
    let hint = match copy {
        Some(false) => " (pass copy=True to convert other array-likes)",
        _ => " (written in place: it cannot be a converted copy)",
    };
    PyTypeError::new_err(format!(
        "argument '{name}' is a {ty}, expected a float32 numpy array or CPU torch tensor{hint}"
    ))
}

/// A complex operand, refused even with `copy=True`: its conversion would drop the
/// imaginary part.
fn complex_err(name: &str, dtype: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "argument '{name}' has complex dtype {dtype}; autokernel computes in real float32 \
         (converting would drop the imaginary part)"
    ))
}

/// How to get past a refusal: only inputs may be converted, and only when asked.
fn copy_hint(copy: Option<bool>) -> &'static str {
    match copy {
        Some(false) => " (pass copy=True to allow a converted copy)",
        _ => "",
    }
}

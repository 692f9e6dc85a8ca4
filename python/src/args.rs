//! Scalar arguments as Python gives them: integers range-checked with the argument's name,
//! and filesystem paths (str, bytes or os.PathLike).

use std::fmt::Display;
use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// An integer argument as given, negatives included: taken as an unsigned Rust type
/// directly, a negative int would raise a bare `OverflowError` that names no argument, and
/// so would an int past `i128` (kept here as `i128::MAX` or `i128::MIN`, shown as such).
/// A bool (an int to Python, surely a mistake here) is remembered as one and refused by
/// [`int_in`] with the argument's name. Anything else is pyo3's `TypeError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntArg(pub i128, pub IsBool);

/// Whether an argument was given as a Python bool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IsBool(pub bool);

impl IntArg {
    /// `value` given as an int (a default).
    pub const fn of(value: i128) -> IntArg {
        IntArg(value, IsBool(false))
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for IntArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let is_bool = IsBool(obj.is_instance_of::<pyo3::types::PyBool>());
        match obj.extract::<i128>() {
            Ok(v) => Ok(IntArg(v, is_bool)),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) => {
                let v = if obj.gt(0)? { i128::MAX } else { i128::MIN };
                Ok(IntArg(v, is_bool))
            }
            Err(e) => Err(e),
        }
    }
}

/// A float argument (`eps`, `max_rel_err`, `timeout_s`) as given; [`Real::get`] refuses a
/// bool (which Python counts as 1.0 or 0.0) with the argument's name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Real(pub f64, pub IsBool);

impl Real {
    /// `value` given as a float (a default).
    pub const fn of(value: f64) -> Real {
        Real(value, IsBool(false))
    }

    /// The value of argument `name`; a `TypeError` naming it if it was a bool.
    pub fn get(self, name: &str) -> PyResult<f64> {
        refuse_bool(self.1, name, "a number", self.0 != 0.0)?;
        Ok(self.0)
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Real {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let is_bool = IsBool(obj.is_instance_of::<pyo3::types::PyBool>());
        obj.extract::<f64>().map(|v| Real(v, is_bool))
    }
}

/// A `TypeError` naming argument `name` when it was given as a bool where `what` is meant.
pub fn refuse_bool(is_bool: IsBool, name: &str, what: &str, value: bool) -> PyResult<()> {
    match is_bool.0 {
        true => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "argument '{name}' is {}: expected {what}, not a bool",
            if value { "True" } else { "False" }
        ))),
        false => Ok(()),
    }
}

impl Display for IntArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            i128::MAX => write!(f, "(an int ≥ 2**127)"),
            i128::MIN => write!(f, "(an int < -2**127)"),
            v => write!(f, "{v}"),
        }
    }
}

/// Argument `name`'s `value` as a `T` in `lo..=hi`; else `ValueError: name=-1: expected an
/// integer from lo to hi`.
pub fn int_in<T>(name: &str, value: IntArg, lo: T, hi: T) -> PyResult<T>
where
    T: Copy + Display + TryFrom<i128> + TryInto<i128>,
{
    refuse_bool(value.1, name, "an integer", value.0 != 0)?;
    let above_lo = lo.try_into().is_ok_and(|lo| value.0 >= lo);
    let below_hi = hi.try_into().map_or(true, |hi| value.0 <= hi);
    match T::try_from(value.0) {
        Ok(v) if above_lo && below_hi => Ok(v),
        _ => Err(PyValueError::new_err(format!(
            "{name}={value}: expected an integer from {lo} to {hi}"
        ))),
    }
}

/// A count of at least 1 (`budget`, ...) from argument `name`.
pub fn positive(name: &str, value: IntArg) -> PyResult<usize> {
    int_in(name, value, 1, usize::MAX)
}

/// A dimension (`heads`, a row count of `ms`, ...) from argument `name`: from 1 to the
/// workloads' limit ([`kernels::workload::MAX_DIM`]), so the message gives the real range.
pub fn dim(name: &str, value: IntArg) -> PyResult<usize> {
    int_in(name, value, 1, kernels::workload::MAX_DIM)
}

/// A filesystem path argument: str, bytes or os.PathLike (of either), as `os.fsdecode`
/// accepts; anything else is the TypeError `os.fsdecode` raises ("expected str, bytes or
/// os.PathLike object, not int").
pub struct PathArg(pub PathBuf);

impl<'a, 'py> FromPyObject<'a, 'py> for PathArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        let decoded = py
            .import(pyo3::intern!(py, "os"))?
            .call_method1(pyo3::intern!(py, "fsdecode"), (obj,))?;
        let path: PathBuf = decoded.extract()?;
        if path.as_os_str().is_empty() {
            return Err(PyValueError::new_err("the path is empty: it names no file"));
        }
        Ok(PathArg(path))
    }
}

/// A LayerNorm epsilon given as a Python float, as the f32 the kernels use: a positive
/// value that f32 rounds to zero (or to ∞) is a `ValueError` naming the value given (the
/// runtime refuses zero, negatives and NaN with the same wording).
pub fn eps_f32(eps: f64) -> PyResult<f32> {
    let e = eps as f32;
    if eps.is_finite() && eps > 0.0 && !(e > 0.0 && e.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "argument 'eps': {eps:e} is not a positive finite number in float32"
        )));
    }
    Ok(e)
}

/// Row counts (`ms`) from argument `name`: a non-empty iterable of integers, each at least
/// 1 (numpy integers too; one past a workload's rows is planned as the blocks it runs in).
/// A str, a bool or a float (which `int()` would truncate) is a `TypeError` naming the
/// argument, as is something that is not iterable.
pub fn row_counts(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    use pyo3::exceptions::PyTypeError;
    use pyo3::types::{PyBool, PyBytes, PyString};
    let kind = || {
        obj.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    };
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "argument '{name}' is a {}: expected a list of row counts, such as [1, 128]",
            kind()
        )));
    }
    let items = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "argument '{name}' is a {}: expected a list of row counts, such as [1, 128]",
            kind()
        ))
    })?;
    let mut ms = Vec::new();
    for item in items {
        let item = item?;
        // Integers, numpy's included (`__index__`); a bool is one to Python, not here.
        let value = match item.extract::<IntArg>() {
            Ok(v) if !item.is_instance_of::<PyBool>() => v,
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "argument '{name}' holds {}: expected integer row counts",
                    item.repr()?
                )))
            }
        };
        ms.push(positive(name, value)?);
    }
    if ms.is_empty() {
        return Err(PyValueError::new_err(format!(
            "{name}=[]: give at least one row count"
        )));
    }
    Ok(ms)
}

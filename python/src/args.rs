//! Scalar arguments as Python gives them: integers range-checked with the argument's name,
//! and filesystem paths (str, bytes or os.PathLike).

use std::fmt::Display;
use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// An integer argument as given, negatives included: taken as an unsigned Rust type
/// directly, a negative int would raise a bare `OverflowError` that names no argument.
/// Checked and converted by [`int_in`].
pub type IntArg = i128;

/// Argument `name`'s `value` as a `T` in `lo..=hi`; else `ValueError: name=-1: expected an
/// integer from lo to hi`.
pub fn int_in<T>(name: &str, value: IntArg, lo: T, hi: T) -> PyResult<T>
where
    T: Copy + Display + TryFrom<IntArg> + TryInto<IntArg>,
{
    let above_lo = lo.try_into().is_ok_and(|lo| value >= lo);
    let below_hi = hi.try_into().map_or(true, |hi| value <= hi);
    match T::try_from(value) {
        Ok(v) if above_lo && below_hi => Ok(v),
        _ => Err(PyValueError::new_err(format!(
            "{name}={value}: expected an integer from {lo} to {hi}"
        ))),
    }
}

/// A count of at least 1 (`budget`, `heads`, ...) from argument `name`.
pub fn positive(name: &str, value: IntArg) -> PyResult<usize> {
    int_in(name, value, 1, usize::MAX)
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
        Ok(PathArg(decoded.extract()?))
    }
}

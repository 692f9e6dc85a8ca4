//! Checked conversions of C arguments: handles, strings, buffers and out-pointers. Each
//! check turns a bad argument into an [`AUTOKERNEL_INVALID_ARGUMENT`] error naming it; only
//! what C cannot tell us (that a non-null pointer really points at `len` elements) is left
//! to the caller's contract.
//!
//! [`AUTOKERNEL_INVALID_ARGUMENT`]: crate::AUTOKERNEL_INVALID_ARGUMENT

use std::ffi::{c_char, CStr};
use std::mem::{align_of, size_of};

use crate::error::CapiError;

/// A shared reference to the object behind a handle.
///
/// # Safety
/// `ptr` is null or points at a live `T` made by this library.
pub(crate) unsafe fn handle<'a, T>(name: &str, ptr: *const T) -> Result<&'a T, CapiError> {
    // SAFETY: null is refused by `as_ref`; otherwise the caller promises a live `T`.
    unsafe { ptr.as_ref() }.ok_or_else(|| CapiError::invalid(format!("{name} is NULL")))
}

/// A NUL-terminated UTF-8 string.
///
/// # Safety
/// `ptr` is null or points at a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn string<'a>(name: &str, ptr: *const c_char) -> Result<&'a str, CapiError> {
    if ptr.is_null() {
        return Err(CapiError::invalid(format!("{name} is NULL")));
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string.
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|e| CapiError::invalid(format!("{name} is not UTF-8: {e}")))
}

/// An optional NUL-terminated UTF-8 string: `None` for NULL.
///
/// # Safety
/// As for [`string`].
pub(crate) unsafe fn optional_string<'a>(
    name: &str,
    ptr: *const c_char,
) -> Result<Option<&'a str>, CapiError> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    unsafe { string(name, ptr) }.map(Some)
}

/// Checks that `ptr` can be the start of a slice of `len` elements of `T`.
fn check_buffer<T>(name: &str, ptr: *const T, len: usize) -> Result<(), CapiError> {
    if ptr.is_null() {
        return Err(CapiError::invalid(format!("{name} is NULL")));
    }
    if !(ptr as usize).is_multiple_of(align_of::<T>()) {
        return Err(CapiError::invalid(format!(
            "{name} is not aligned to {} bytes",
            align_of::<T>()
        )));
    }
    if len
        .checked_mul(size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(CapiError::shape(format!(
            "{name}: {len} elements is more than any buffer can hold"
        )));
    }
    Ok(())
}

/// An input buffer of `len` elements.
///
/// # Safety
/// A non-null `ptr` points at `len` initialised elements that nothing writes during `'a`.
pub(crate) unsafe fn input<'a, T>(
    name: &str,
    ptr: *const T,
    len: usize,
) -> Result<&'a [T], CapiError> {
    check_buffer(name, ptr, len)?;
    // SAFETY: non-null, aligned and at most isize::MAX bytes (checked); the caller promises
    // `len` readable elements.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The bytes an input buffer spans: what [`output`] checks its output against.
pub(crate) fn span<T>(data: &[T]) -> std::ops::Range<usize> {
    let start = data.as_ptr() as usize;
    start..start + std::mem::size_of_val(data)
}

/// An output buffer of `len` elements, checked not to overlap any of `inputs` (name and
/// [`span`]: the float operands and the key lengths alike).
///
/// # Safety
/// A non-null `ptr` points at `len` elements that nothing else reads or writes during `'a`
/// (except through `inputs`, which the overlap check rules out).
pub(crate) unsafe fn output<'a>(
    name: &str,
    ptr: *mut f32,
    len: usize,
    inputs: &[(&str, std::ops::Range<usize>)],
) -> Result<&'a mut [f32], CapiError> {
    check_buffer(name, ptr.cast_const(), len)?;
    let out = (ptr as usize, ptr as usize + len * size_of::<f32>());
    for (input, bytes) in inputs {
        if bytes.start < out.1 && out.0 < bytes.end {
            return Err(CapiError::invalid(format!(
                "{name} overlaps {input}: outputs must not alias inputs"
            )));
        }
    }
    // SAFETY: non-null, aligned, at most isize::MAX bytes, disjoint from every input
    // (checked); the caller promises `len` writable elements nobody else touches.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// Writes `value` through an optional out-pointer (NULL: not wanted).
///
/// # Safety
/// `ptr` is null or valid for a write of one `T`.
pub(crate) unsafe fn put_optional<T>(ptr: *mut T, value: T) {
    if !ptr.is_null() {
        // SAFETY: non-null; the caller promises it is writable.
        unsafe { ptr.write(value) };
    }
}

/// The required out-pointer `ptr`, cleared to `empty` first so a failed call leaves it so.
///
/// # Safety
/// `ptr` is null or valid for a write of one `T`.
pub(crate) unsafe fn out_slot<'a, T>(
    name: &str,
    ptr: *mut T,
    empty: T,
) -> Result<&'a mut T, CapiError> {
    if ptr.is_null() {
        return Err(CapiError::invalid(format!("{name} is NULL")));
    }
    // SAFETY: non-null; the caller promises it is writable (it may be uninitialised, so
    // write before making a reference).
    unsafe {
        ptr.write(empty);
        Ok(&mut *ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_misaligned_and_overlapping_buffers_are_refused() {
        let data = [0.0f32; 8];
        // SAFETY (all calls): pointers into `data` with lengths inside it, or NULL.
        let e = unsafe { input::<f32>("a", std::ptr::null(), 4) }.unwrap_err();
        assert_eq!(e, CapiError::invalid("a is NULL"));
        let odd = (data.as_ptr() as *const u8).wrapping_add(1) as *const f32;
        let e = unsafe { input("b", odd, 2) }.unwrap_err();
        assert!(e.message.contains("b is not aligned to 4 bytes"), "{e}");
        let e = unsafe { input("c", data.as_ptr(), usize::MAX / 2) }.unwrap_err();
        assert_eq!(e.code, crate::AUTOKERNEL_SHAPE);

        let mut buf = [0.0f32; 8];
        let p = buf.as_mut_ptr();
        let a: &[f32] = unsafe { std::slice::from_raw_parts(p, 4) };
        let e = unsafe { output("c", p.add(2), 2, &[("a", span(a))]) }.unwrap_err();
        assert!(e.message.contains("c overlaps a"), "{e}");
        let ok = unsafe { output("c", p.add(4), 4, &[("a", span(a))]) }.unwrap();
        assert_eq!(ok.len(), 4);
        // Integer inputs too (attention's key lengths).
        let lens: &[i32] = unsafe { std::slice::from_raw_parts(p.add(6).cast::<i32>(), 1) };
        let e = unsafe { output("o", p.add(4), 4, &[("key_lens", span(lens))]) }.unwrap_err();
        assert!(e.message.contains("o overlaps key_lens"), "{e}");
    }

    #[test]
    fn strings_must_be_utf8_and_present() {
        let bad = [0xffu8 as c_char, 0];
        // SAFETY: NUL-terminated arrays, or NULL.
        let e = unsafe { string("workload", bad.as_ptr()) }.unwrap_err();
        assert!(e.message.contains("workload is not UTF-8"), "{e}");
        assert!(unsafe { string("w", std::ptr::null()) }.is_err());
        assert_eq!(
            unsafe { optional_string("p", std::ptr::null()) }.unwrap(),
            None
        );
        assert_eq!(
            unsafe { string("w", c"gemm:1x2x3".as_ptr()) }.unwrap(),
            "gemm:1x2x3"
        );
    }
}

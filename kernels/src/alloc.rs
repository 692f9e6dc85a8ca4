//! Allocations sized by a caller's operand (a packed weight, a copy of one), made fallibly: a
//! weight whose allocation is refused (an address-space limit, an impossible size) is an
//! [`Error::OutOfMemory`] the caller can report, where an ordinary allocation failure aborts
//! the whole process (a Python interpreter or a C host with it). Where the system grants
//! more than it has (overcommit, a cgroup limit) the allocation succeeds and the kernel may
//! still end the process when the memory is used: that no library can catch.

use crate::error::{Error, Result};

/// `len` copies of `value`, or [`Error::OutOfMemory`] naming `what` when the memory is not
/// there.
pub fn filled<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    reserve(&mut v, len, what)?;
    v.resize(len, value);
    Ok(v)
}

/// A copy of `src` (see [`filled`]).
pub fn copied<T: Clone>(src: &[T], what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    reserve(&mut v, src.len(), what)?;
    v.extend_from_slice(src);
    Ok(v)
}

/// Room for `more` elements in `v` beyond its length (see [`filled`]).
pub fn reserve<T>(v: &mut Vec<T>, more: usize, what: &str) -> Result<()> {
    v.try_reserve_exact(more).map_err(|_| Error::OutOfMemory {
        what: what.to_string(),
        bytes: more.saturating_mul(std::mem::size_of::<T>()) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impossible_size_is_an_error_not_an_abort() {
        let e = filled(usize::MAX / 2, 0u32, "packed B").unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
        assert!(e.to_string().contains("packed B"), "{e}");
        assert_eq!(filled(3, 7u8, "x").unwrap(), vec![7, 7, 7]);
        assert_eq!(copied(&[1.5f32, 2.0], "x").unwrap(), vec![1.5, 2.0]);
    }
}

//! [`CView`]: a mutable, row-major window on the output matrix that can be split into
//! disjoint row or column ranges and handed to different threads.
//!
//! A `&mut [f32]` can only be split into contiguous pieces, but the "split N across threads"
//! schedules need column slabs of a row-major matrix, whose elements interleave in memory.
//! `CView` keeps the raw pointer and the window's extent; every access goes through a
//! bounds-checked method, and the split methods hand out windows with disjoint elements, so
//! the views behave like disjoint `&mut` borrows.

use std::marker::PhantomData;

/// A `rows × cols` window with row stride `ld`, exclusively borrowed from a `&'a mut [f32]`.
#[derive(Debug)]
pub struct CView<'a> {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    ld: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: a `CView` is an exclusive borrow of the elements inside its window (no two views
// obtained through the safe API share an element), exactly like `&mut [f32]`, which is `Send`.
unsafe impl Send for CView<'_> {}
// SAFETY: `&CView` only allows reading the extent; writes need `&mut CView`.
unsafe impl Sync for CView<'_> {}

impl<'a> CView<'a> {
    /// The whole `rows × cols` matrix stored row-major in `data` with row stride `ld`.
    /// Panics if `data` is too short or `cols > ld`.
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize, ld: usize) -> Self {
        assert!(cols <= ld, "cols {cols} exceed the row stride {ld}");
        assert!(
            rows == 0 || cols == 0 || (rows - 1) * ld + cols <= data.len(),
            "a {rows}×{cols} view with stride {ld} does not fit in {} elements",
            data.len()
        );
        CView {
            ptr: data.as_mut_ptr(),
            rows,
            cols,
            ld,
            _borrow: PhantomData,
        }
    }

    /// Rows in the window.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns in the window.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row stride of the underlying matrix.
    pub fn ld(&self) -> usize {
        self.ld
    }

    /// Splits into rows `..at` and `at..` (`at ≤ rows`).
    pub fn split_rows(self, at: usize) -> (CView<'a>, CView<'a>) {
        assert!(at <= self.rows);
        let bottom = CView {
            // `wrapping_add`: no dereference happens here, and an empty bottom part may point
            // one row past the borrowed slice.
            ptr: self.ptr.wrapping_add(at * self.ld),
            rows: self.rows - at,
            ..self
        };
        let top = CView { rows: at, ..self };
        (top, bottom)
    }

    /// Splits into windows of `rows` rows (the last one fewer), each with its first row.
    pub fn row_chunks(self, rows: usize) -> Vec<(usize, CView<'a>)> {
        self.chunks(rows, CView::rows, CView::split_rows)
    }

    /// Splits into windows of `cols` columns (the last one fewer), each with its first column.
    pub fn col_chunks(self, cols: usize) -> Vec<(usize, CView<'a>)> {
        self.chunks(cols, CView::cols, CView::split_cols)
    }

    /// Windows of `size` along the dimension `len` measures and `split` cuts, each with its
    /// first index along it.
    fn chunks(
        self,
        size: usize,
        len: fn(&Self) -> usize,
        split: fn(Self, usize) -> (Self, Self),
    ) -> Vec<(usize, CView<'a>)> {
        let size = size.max(1);
        let mut chunks = Vec::with_capacity(len(&self).div_ceil(size));
        let (mut rest, mut first) = (self, 0);
        while len(&rest) > 0 {
            let take = size.min(len(&rest));
            let (head, tail) = split(rest, take);
            chunks.push((first, head));
            first += take;
            rest = tail;
        }
        chunks
    }

    /// Splits into columns `..at` and `at..` (`at ≤ cols`).
    pub fn split_cols(self, at: usize) -> (CView<'a>, CView<'a>) {
        assert!(at <= self.cols);
        let right = CView {
            ptr: self.ptr.wrapping_add(at),
            cols: self.cols - at,
            ..self
        };
        let left = CView { cols: at, ..self };
        (left, right)
    }

    /// Reborrows the sub-window of `rows × cols` starting at `(r0, c0)`.
    pub fn sub(&mut self, r0: usize, c0: usize, rows: usize, cols: usize) -> CView<'_> {
        assert!(r0 + rows <= self.rows && c0 + cols <= self.cols);
        CView {
            ptr: self.ptr.wrapping_add(r0 * self.ld + c0),
            rows,
            cols,
            ld: self.ld,
            _borrow: PhantomData,
        }
    }

    /// Row `r` of the window (`cols` elements).
    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        assert!(r < self.rows);
        // SAFETY: the window's row `r` is `cols` elements from `ptr + r·ld`, inside the borrowed
        // slice (checked in `new`, preserved by every split/sub), and no other view owns them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r * self.ld), self.cols) }
    }

    /// The whole window as one slice, where its rows are adjacent (`cols = ld`, or at most
    /// one row); `None` where other views' elements lie between its rows.
    pub fn contiguous_mut(&mut self) -> Option<&mut [f32]> {
        if self.rows > 1 && self.cols != self.ld {
            return None;
        }
        let len = self.rows * self.cols;
        // SAFETY: the window's rows are adjacent, so its `rows·cols` elements from `ptr` are
        // exactly the window: inside the borrowed slice, owned by no other view.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr, len) })
    }

    /// Pointer to element `(r, c)` for a micro-kernel that writes the `rows × cols` block there.
    /// Panics unless the block lies inside the window.
    pub(crate) fn block_ptr(&mut self, r: usize, c: usize, rows: usize, cols: usize) -> *mut f32 {
        assert!(
            rows >= 1 && cols >= 1 && r + rows <= self.rows && c + cols <= self.cols,
            "block {rows}×{cols} at ({r}, {c}) outside a {}×{} window",
            self.rows,
            self.cols
        );
        self.ptr.wrapping_add(r * self.ld + c)
    }
}

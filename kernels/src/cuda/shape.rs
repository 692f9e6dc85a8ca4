//! Problem sizes of the CUDA families, validated once at construction.
//!
//! They are plain sizes, independent of [`Workload`](crate::Workload): a GEMM workload maps to
//! a [`GemmShape`] and an attention workload to an [`AttentionShape`].

use crate::workload::{MAX_DIM, MAX_ELEMENTS};

use super::CudaError;

/// `C[m×n] = A[m×k] · B[k×n]`, row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Depth: columns of A, rows of B.
    pub k: usize,
}

impl GemmShape {
    /// A validated shape: every dimension in `1..=MAX_DIM`, operands within `MAX_ELEMENTS`,
    /// and `M`, `N`, `K` small enough for the kernels' 32-bit index arguments.
    pub fn new(m: usize, n: usize, k: usize) -> Result<Self, CudaError> {
        for (name, v) in [("M", m), ("N", n), ("K", k)] {
            if v == 0 || v > MAX_DIM {
                return Err(CudaError::BadShape(format!(
                    "gemm {name} = {v} is outside 1..={MAX_DIM}"
                )));
            }
        }
        let elems = (m * k + k * n + m * n) as u128;
        if elems > MAX_ELEMENTS {
            return Err(CudaError::BadShape(format!(
                "gemm {m}x{n}x{k} needs {elems} elements, more than {MAX_ELEMENTS}"
            )));
        }
        Ok(GemmShape { m, n, k })
    }

    /// Floating-point operations of one call.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// Largest head dimension the attention template accepts.
pub const MAX_HEAD_DIM: usize = 256;

/// Largest `batch × heads` (one grid row per head: `gridDim.y` is at most 65535).
pub const MAX_BATCH_HEADS: usize = 65_535;

/// Attention over `batch × heads` independent heads: `Q[seq_q×d]`, `K, V[seq_k×d]` per head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttentionShape {
    /// Batch size.
    pub batch: usize,
    /// Heads per batch entry.
    pub heads: usize,
    /// Queries per head.
    pub seq_q: usize,
    /// Keys (and values) per head.
    pub seq_k: usize,
    /// Head dimension D, at most [`MAX_HEAD_DIM`].
    pub head_dim: usize,
    /// Bottom-right aligned causal mask: query `i` sees key `j` iff `j <= i + seq_k - seq_q`.
    pub causal: bool,
}

impl AttentionShape {
    /// A validated shape.
    pub fn new(
        batch: usize,
        heads: usize,
        seq_q: usize,
        seq_k: usize,
        head_dim: usize,
        causal: bool,
    ) -> Result<Self, CudaError> {
        let bad = |s: String| Err(CudaError::BadShape(s));
        for (name, v) in [
            ("batch", batch),
            ("heads", heads),
            ("seq_q", seq_q),
            ("seq_k", seq_k),
        ] {
            if v == 0 || v > MAX_DIM {
                return bad(format!("attention {name} = {v} is outside 1..={MAX_DIM}"));
            }
        }
        if head_dim == 0 || head_dim > MAX_HEAD_DIM {
            return bad(format!(
                "attention head_dim = {head_dim} is outside 1..={MAX_HEAD_DIM}"
            ));
        }
        if batch * heads > MAX_BATCH_HEADS {
            return bad(format!(
                "attention batch × heads = {} exceeds {MAX_BATCH_HEADS}",
                batch * heads
            ));
        }
        let bh = (batch * heads) as u128;
        let elems = bh * (2 * seq_q as u128 + 2 * seq_k as u128) * head_dim as u128;
        if elems > MAX_ELEMENTS {
            return bad(format!(
                "attention operands need {elems} elements, more than {MAX_ELEMENTS}"
            ));
        }
        Ok(AttentionShape {
            batch,
            heads,
            seq_q,
            seq_k,
            head_dim,
            causal,
        })
    }

    /// `batch × heads`.
    pub fn batch_heads(&self) -> usize {
        self.batch * self.heads
    }

    /// Elements of Q and of O.
    pub fn q_len(&self) -> usize {
        self.batch_heads() * self.seq_q * self.head_dim
    }

    /// Elements of K and of V.
    pub fn kv_len(&self) -> usize {
        self.batch_heads() * self.seq_k * self.head_dim
    }

    /// Keys query `i` sees: `0..visible_keys(i)`.
    pub fn visible_keys(&self, i: usize) -> usize {
        if self.causal {
            (i + self.seq_k + 1)
                .saturating_sub(self.seq_q)
                .min(self.seq_k)
        } else {
            self.seq_k
        }
    }

    /// Floating-point operations of one call (two matmuls; masked products not counted).
    pub fn flops(&self) -> f64 {
        let pairs: f64 = (0..self.seq_q).map(|i| self.visible_keys(i) as f64).sum();
        4.0 * self.batch_heads() as f64 * pairs * self.head_dim as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_shapes_are_validated() {
        assert!(GemmShape::new(1, 1, 1).is_ok());
        assert!(GemmShape::new(0, 1, 1).is_err());
        assert!(GemmShape::new(1, MAX_DIM + 1, 1).is_err());
        let e = GemmShape::new(MAX_DIM, MAX_DIM, MAX_DIM).unwrap_err();
        assert!(e.to_string().contains("elements"), "{e}");
        assert_eq!(GemmShape::new(2, 3, 4).unwrap().flops(), 48.0);
    }

    #[test]
    fn attention_shapes_are_validated() {
        assert!(AttentionShape::new(2, 8, 128, 128, 64, true).is_ok());
        assert!(AttentionShape::new(1, 1, 1, 1, 0, false).is_err());
        assert!(AttentionShape::new(1, 1, 1, 1, 257, false).is_err());
        assert!(AttentionShape::new(300, 300, 1, 1, 64, false).is_err());
        assert!(AttentionShape::new(1, 0, 1, 1, 64, false).is_err());
    }

    #[test]
    fn causal_visibility_is_bottom_right_aligned() {
        let s = AttentionShape::new(1, 1, 4, 4, 8, true).unwrap();
        assert_eq!(
            (0..4).map(|i| s.visible_keys(i)).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        let s = AttentionShape::new(1, 1, 2, 5, 8, true).unwrap();
        assert_eq!(
            (0..2).map(|i| s.visible_keys(i)).collect::<Vec<_>>(),
            [4, 5]
        );
        let s = AttentionShape::new(1, 1, 5, 2, 8, true).unwrap();
        assert_eq!(
            (0..5).map(|i| s.visible_keys(i)).collect::<Vec<_>>(),
            [0, 0, 0, 1, 2]
        );
        let s = AttentionShape::new(1, 1, 3, 7, 8, false).unwrap();
        assert_eq!(s.visible_keys(0), 7);
        assert_eq!(s.flops(), 4.0 * 3.0 * 7.0 * 8.0);
    }
}

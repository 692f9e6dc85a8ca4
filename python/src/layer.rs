//! `autokernel.EncoderLayer`: a whole BERT-style encoder layer served in one call
//! ([`runtime::EncoderLayer`]), made by `Runtime.encoder_layer`.

use std::cell::RefCell;

use kernels::cpu::pool::{self, on_workers};
use kernels::Workload;
use numpy::PyUntypedArrayMethods;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::{EncoderLayer, LayerScratch};

use crate::args::{positive, IntArg};
use crate::errors::runtime_err;
use crate::operand;
use crate::packed::PyPackedWeight;
use crate::runtime_py::{key_lengths, out_array, with_views, PyRuntime};

thread_local! {
    /// This thread's activations of the last layer it ran (grown, never shrunk).
    static SCRATCH: RefCell<LayerScratch> = RefCell::new(LayerScratch::default());
}

/// A BERT-style encoder layer whose weights are packed for one Runtime: `layer(x)` runs the
/// whole layer (four GEMMs, attention, two residual LayerNorms) in one call with the GIL
/// released. Made by `Runtime.encoder_layer`; safe to share between threads.
///
/// layer(x, mask=None, out=None, *, copy=False) -> numpy.ndarray
///     x: hidden states, (B, S, hidden) float32 (not modified). mask: a padded batch, as for
///     `Runtime.attention` (per-sequence key lengths). out: where to write the (B, S, hidden)
///     output (not `x`). copy: as for `Runtime.gemm`.
#[pyclass(name = "EncoderLayer", module = "autokernel", frozen)]
pub struct PyEncoderLayer {
    pub rt: Py<PyRuntime>,
    /// qkv, out, ffn_up, ffn_down.
    pub weights: [Py<PyPackedWeight>; 4],
    pub biases: [Vec<f32>; 4],
    /// (weight, bias) of the two LayerNorms.
    pub norms: [(Vec<f32>, Vec<f32>); 2],
    pub heads: usize,
    pub eps: f32,
}

impl PyEncoderLayer {
    /// The layer if its pieces fit one another; else a ValueError naming the first that
    /// does not (they are the caller's arguments).
    pub fn checked(self) -> PyResult<Self> {
        self.view()
            .check()
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        Ok(self)
    }

    fn view(&self) -> EncoderLayer<'_> {
        let w = |i: usize| (&self.weights[i].get().inner, &self.biases[i][..]);
        let n = |i: usize| (&self.norms[i].0[..], &self.norms[i].1[..]);
        EncoderLayer {
            qkv: w(0),
            out: w(1),
            ln1: n(0),
            ffn_up: w(2),
            ffn_down: w(3),
            ln2: n(1),
            heads: self.heads,
            eps: self.eps,
        }
    }
}

#[pymethods]
impl PyEncoderLayer {
    /// Itself: a layer is immutable (`copy.deepcopy` of an optimized model shares it).
    fn __copy__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Itself, as `__copy__`.
    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf
    }

    /// Refused with a `TypeError`: an EncoderLayer lives in native memory (save an optimized model's
    /// `state_dict` and optimize the loaded model again).
    fn __reduce__(&self) -> PyResult<Py<PyAny>> {
        Err(crate::errors::not_picklable("autokernel.EncoderLayer"))
    }

    /// The layer on hidden states `x`, (B, S, hidden) float32 (not modified); returns the
    /// layer's output, (B, S, hidden), in `out` when given (it must not be `x`). `mask`: a
    /// padded batch, as for `Runtime.attention`. copy: as for `Runtime.gemm`.
    #[pyo3(signature = (x, mask=None, out=None, *, copy=false))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        mask: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        run_layers(py, self.rt.get(), &[self], x, mask, out, copy)
    }

    /// The runtime workloads one call on (batch, seq, hidden) runs, in order (as
    /// `Runtime.lookup` and `autokernel tune` spell them).
    fn workloads(&self, batch: IntArg, seq: IntArg) -> PyResult<Vec<String>> {
        let (batch, seq) = (positive("batch", batch)?, positive("seq", seq)?);
        let l = self.view();
        let m = batch.checked_mul(seq).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "batch {batch} × seq {seq} overflows the row count"
            ))
        })?;
        // A call past one workload's size is served in blocks: their workloads.
        let gemm = |w: &runtime::PackedWeight| {
            let (n, k) = w.dims();
            runtime::row_blocks(m, n, k)
                .into_iter()
                .map(|rows| Workload::gemm_bias_act(rows, n, k, w.act()))
                .collect::<Vec<_>>()
        };
        let h = l.hidden();
        let d = h / self.heads;
        let attention = runtime::sequence_blocks(batch, self.heads, seq, d)
            .into_iter()
            .map(|b| Workload::attention(b, self.heads, seq, d, false))
            .collect();
        [
            gemm(l.qkv.0),
            attention,
            gemm(l.out.0),
            gemm(l.ffn_up.0),
            gemm(l.ffn_down.0),
        ]
        .into_iter()
        .flatten()
        .map(|w| w.map(|w| w.key()).map_err(crate::errors::kernel_err))
        .collect()
    }

    /// The Runtime this layer's weights were packed for (whose `encoder` runs a stack of
    /// its layers in one call).
    #[getter(runtime)]
    fn get_runtime(&self, py: Python<'_>) -> Py<PyRuntime> {
        self.rt.clone_ref(py)
    }

    /// Hidden width.
    #[getter]
    fn hidden(&self) -> usize {
        self.view().hidden()
    }

    /// Attention heads.
    #[getter]
    fn heads(&self) -> usize {
        self.heads
    }

    fn __repr__(&self) -> String {
        let l = self.view();
        format!(
            "EncoderLayer(hidden={}, heads={}, ffn={}, workload={})",
            l.hidden(),
            self.heads,
            l.ffn_up.0.dims().0,
            l.ffn_up.0.workload().key()
        )
    }
}

/// `layers` one after the other on hidden states `x`, (B, S, hidden) float32 (not modified),
/// in one call on `rt`'s threads (one entry into its pool, the GIL released once): the
/// output, (B, S, hidden), in `out` when given. The layers must all be `hidden` wide.
pub fn run_layers<'py>(
    py: Python<'py>,
    rt: &PyRuntime,
    layers: &[&PyEncoderLayer],
    x: &Bound<'py, PyAny>,
    mask: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
    copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let views: Vec<EncoderLayer<'_>> = layers.iter().map(|l| l.view()).collect();
    let Some(h) = views.first().map(EncoderLayer::hidden) else {
        return Err(PyValueError::new_err(
            "layers: expected at least one EncoderLayer",
        ));
    };
    if let Some(i) = views.iter().position(|l| l.hidden() != h) {
        return Err(PyValueError::new_err(format!(
            "layers[{i}]: hidden width {} differs from layers[0]'s {h}",
            views[i].hidden()
        )));
    }
    let x = operand::input(x, "x", copy)?;
    let [b, s, width] = x.shape()[..] else {
        return Err(operand::shape_err(&x, "x", &format!("(B, S, {h})")));
    };
    if width != h {
        return Err(operand::shape_err(&x, "x", &format!("(B, S, {h})")));
    }
    let key_lens = match mask.filter(|m| !m.is_none()) {
        Some(m) => Some(key_lengths(py, m, b, s)?),
        None => None,
    };
    let y = out_array(py, out, &[b, s, h])?;
    with_views(&[(&x, "x")], &y.arr, |ins, y_out| {
        y_out.copy_from_slice(ins[0]);
        rt.threads
            .run(py, || {
                // Entered once for all layers; each layer's forward runs on this worker.
                on_workers(pool::threads(), || {
                    let mut scratch = SCRATCH.with(|c| std::mem::take(&mut *c.borrow_mut()));
                    let result = views.iter().try_for_each(|layer| {
                        let lens = key_lens.as_deref();
                        layer.forward(&rt.rt, (b, s), lens, y_out, &mut scratch, |_, _| {})
                    });
                    SCRATCH.with(|c| *c.borrow_mut() = scratch);
                    result
                })
            })?
            .map_err(runtime_err)
    })?;
    y.finish()
}

//! Packed weights and the linear layer `C = act(A·B + bias)` that uses them.

use std::ffi::c_int;

use kernels::Act;
use runtime::PackedWeight;

use crate::args::{self, span};
use crate::error::{guard, CapiError};
use crate::handle::{owned_string, AutokernelRuntime};
use crate::ops::level_code;

/// No activation: `C = A·B + bias`.
pub const AUTOKERNEL_ACT_NONE: c_int = 0;
/// `C = max(A·B + bias, 0)`.
pub const AUTOKERNEL_ACT_RELU: c_int = 1;
/// `C = gelu(A·B + bias)`, GELU in its tanh form.
pub const AUTOKERNEL_ACT_GELU: c_int = 2;
/// `C = gelu(A·B + bias)`, GELU in its exact erf form (`hidden_act: "gelu"` of most published
/// BERT checkpoints).
pub const AUTOKERNEL_ACT_GELU_ERF: c_int = 3;

/// A constant weight (the k×n B of a linear layer) packed once in the layouts of the tuned
/// variants that serve it. Opaque; made by `autokernel_weight_pack`, freed by
/// `autokernel_weight_free`. Shareable between threads.
pub struct AutokernelWeight {
    weight: PackedWeight,
    n: usize,
    k: usize,
}

fn act_of(code: c_int) -> Result<Act, CapiError> {
    match code {
        AUTOKERNEL_ACT_NONE => Ok(Act::Identity),
        AUTOKERNEL_ACT_RELU => Ok(Act::Relu),
        AUTOKERNEL_ACT_GELU => Ok(Act::Gelu),
        AUTOKERNEL_ACT_GELU_ERF => Ok(Act::GeluErf),
        other => Err(CapiError::invalid(format!(
            "act = {other}: use AUTOKERNEL_ACT_NONE (0), _RELU (1), _GELU (2) or _GELU_ERF (3)"
        ))),
    }
}

/// Packs the weight `b` (k×n row-major, `b_len` = k·n) for linear layers with activation
/// `act` (AUTOKERNEL_ACT_*), planned for each row count in `ms` (`ms_len` ≥ 1: the batch
/// shapes you expect; any other M works too, resolved on first use). Stores the weight in
/// `*out` (NULL on failure). `b` may be freed or changed afterwards.
///
/// # Safety
/// `rt` is NULL or a live runtime; `b` is NULL or holds `b_len` floats; `ms` is NULL or
/// holds `ms_len` values; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_weight_pack(
    rt: *const AutokernelRuntime,
    n: usize,
    k: usize,
    act: c_int,
    b: *const f32,
    b_len: usize,
    ms: *const usize,
    ms_len: usize,
    out: *mut *mut AutokernelWeight,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract above.
        let out = unsafe { args::out_slot("out", out, std::ptr::null_mut())? };
        let h = unsafe { args::handle("rt", rt)? };
        let b = unsafe { args::input("b", b, b_len)? };
        let ms = unsafe { args::input("ms", ms, ms_len)? };
        if ms.is_empty() {
            return Err(CapiError::invalid("ms_len is 0: plan for at least one M"));
        }
        let act = act_of(act)?;
        let weight = h.serve(|rt| rt.pack_weight_for(n, k, act, b, ms))?;
        *out = Box::into_raw(Box::new(AutokernelWeight { weight, n, k }));
        Ok(())
    })
}

/// Describes a packed weight as a JSON object: in_features (k), out_features (n), act
/// (`"none"`, `"relu"`, `"gelu"` or `"gelu_erf"`, as the AUTOKERNEL_ACT_* names), workload
/// (the first M it was planned for, with the element type it is served in, e.g.
/// `"gemm_bias:128x768x768:i8"`), level and config of that M, dtypes (the element types of
/// the M planned so far), layouts (its f32 panel layouts `[NR, KC]`: none for a weight kept
/// only in int8 or bf16), copies (f32 layouts, reduced-precision forms and row-major
/// copies held) and bytes (held in all). `*json_out` is a string to free with
/// `autokernel_string_free` (NULL on failure).
///
/// # Safety
/// `w` is NULL or a live weight; `json_out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_weight_info(
    w: *const AutokernelWeight,
    json_out: *mut *mut std::ffi::c_char,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract.
        let out = unsafe { args::out_slot("json_out", json_out, std::ptr::null_mut())? };
        let w = unsafe { args::handle("w", w)? };
        *out = owned_string(info(w).to_string());
        Ok(())
    })
}

fn info(w: &AutokernelWeight) -> serde_json::Value {
    let p = &w.weight;
    let act = match p.act() {
        Act::Identity => "none",
        Act::Relu => "relu",
        Act::Gelu => "gelu",
        Act::GeluErf => "gelu_erf",
    };
    let config: serde_json::Value =
        serde_json::from_str(&p.config().to_json()).unwrap_or(serde_json::Value::Null);
    serde_json::json!({
        "in_features": w.k,
        "out_features": w.n,
        "act": act,
        "workload": p.workload().key(),
        "level": p.level().as_str(),
        "config": config,
        "dtypes": p.dtypes().iter().map(|d| d.name()).collect::<Vec<_>>(),
        "layouts": p.layouts(),
        "copies": p.copies(),
        "bytes": p.bytes(),
    })
}

/// Frees a packed weight (NULL: nothing). No other thread may be using it.
///
/// # Safety
/// `w` is NULL or a weight from `autokernel_weight_pack` not freed before.
#[no_mangle]
pub unsafe extern "C" fn autokernel_weight_free(w: *mut AutokernelWeight) {
    if !w.is_null() {
        // SAFETY: made by Box::into_raw in autokernel_weight_pack, freed once (contract).
        let weight = unsafe { Box::from_raw(w) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(weight)));
    }
}

/// A linear layer with a packed weight: `C = act(A·B + bias)`, A m×k (`a_len` = m·k), bias
/// n (or NULL with `bias_len` 0: no bias), C m×n (overwritten), for any m ≥ 1. Use the
/// runtime that packed the weight.
/// `*level_out` (if not NULL) gets the AUTOKERNEL_LEVEL_* of the config serving this m.
///
/// # Safety
/// `rt` and `w` are NULL or live; each buffer is NULL or holds its stated number of floats;
/// `c` overlaps no input; `level_out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_linear(
    rt: *const AutokernelRuntime,
    w: *const AutokernelWeight,
    m: usize,
    a: *const f32,
    a_len: usize,
    bias: *const f32,
    bias_len: usize,
    c: *mut f32,
    c_len: usize,
    level_out: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract above.
        let h = unsafe { args::handle("rt", rt)? };
        let w = unsafe { args::handle("w", w)? };
        let a = unsafe { args::input("a", a, a_len)? };
        let zeros: Vec<f32>;
        let bias = if bias.is_null() && bias_len == 0 {
            zeros = vec![0.0; w.n];
            &zeros[..]
        } else {
            unsafe { args::input("bias", bias, bias_len)? }
        };
        let c = unsafe { args::output("c", c, c_len, &[("a", span(a)), ("bias", span(bias))])? };
        check_rows(m, w, a_len, c_len)?;
        let level = h.serve(|rt| rt.gemm_bias_act_packed(&w.weight, a, bias, c))?;
        unsafe { args::put_optional(level_out, level_code(level)) };
        Ok(())
    })
}

/// `m ≥ 1`, and A and C hold exactly m rows (the runtime takes m from A's length).
fn check_rows(m: usize, w: &AutokernelWeight, a_len: usize, c_len: usize) -> Result<(), CapiError> {
    let rows = |name: &str, len: usize, width: usize| {
        if m.checked_mul(width) == Some(len) {
            Ok(())
        } else {
            Err(CapiError::shape(format!(
                "'{name}' has {len} elements, m = {m} rows of {width} need {}",
                m.saturating_mul(width)
            )))
        }
    };
    if m == 0 {
        return Err(CapiError::shape(
            "m = 0: a linear layer needs at least one row",
        ));
    }
    rows("a", a_len, w.k)?;
    rows("c", c_len, w.n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_codes_are_checked() {
        assert_eq!(act_of(AUTOKERNEL_ACT_GELU).unwrap(), Act::Gelu);
        assert_eq!(act_of(AUTOKERNEL_ACT_GELU_ERF).unwrap(), Act::GeluErf);
        let e = act_of(4).unwrap_err();
        assert_eq!(e.code, crate::AUTOKERNEL_INVALID_ARGUMENT);
        assert!(e.message.contains("act = 4"), "{e}");
    }

    #[test]
    fn packed_weights_are_shareable() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<AutokernelWeight>();
        assert_send_sync::<AutokernelRuntime>();
    }
}

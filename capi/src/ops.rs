//! The operators on a runtime: GEMM and attention (f32, row-major).

use std::ffi::c_int;

use runtime::Level;

use crate::args::{self, span};
use crate::error::{guard, CapiError};
use crate::handle::AutokernelRuntime;

/// Served by a record of this workload on this machine.
pub const AUTOKERNEL_LEVEL_EXACT: c_int = 0;
/// Served by a record from a machine of the same micro-architecture and ISA.
pub const AUTOKERNEL_LEVEL_SAME_ARCH: c_int = 1;
/// Served by the config of the nearest tuned shape of the same op.
pub const AUTOKERNEL_LEVEL_NEAREST_SHAPE: c_int = 2;
/// Served by the kernel family's default config.
pub const AUTOKERNEL_LEVEL_DEFAULT: c_int = 3;

/// The AUTOKERNEL_LEVEL_* code of `level`.
pub(crate) fn level_code(level: Level) -> c_int {
    match level {
        Level::Exact => AUTOKERNEL_LEVEL_EXACT,
        Level::SameArch => AUTOKERNEL_LEVEL_SAME_ARCH,
        Level::NearestShape => AUTOKERNEL_LEVEL_NEAREST_SHAPE,
        Level::Default => AUTOKERNEL_LEVEL_DEFAULT,
    }
}

/// `C = A·B`, f32 row-major: A is m×k (`a_len` = m·k), B is k×n, C is m×n (overwritten).
/// `*level_out` (if not NULL) gets the AUTOKERNEL_LEVEL_* that served the call.
///
/// # Safety
/// `rt` is NULL or a live runtime; each buffer is NULL or holds its stated number of
/// floats; `c` overlaps no input; `level_out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_gemm(
    rt: *const AutokernelRuntime,
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    a_len: usize,
    b: *const f32,
    b_len: usize,
    c: *mut f32,
    c_len: usize,
    level_out: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract above.
        let h = unsafe { args::handle("rt", rt)? };
        let a = unsafe { args::input("a", a, a_len)? };
        let b = unsafe { args::input("b", b, b_len)? };
        let c = unsafe { args::output("c", c, c_len, &[("a", span(a)), ("b", span(b))])? };
        let level = h.serve(|rt| rt.gemm(m, n, k, a, b, c))?;
        unsafe { args::put_optional(level_out, level_code(level)) };
        Ok(())
    })
}

/// Scaled dot-product attention, f32: `O = softmax(Q·Kᵀ/√d)·V` for each of the b·h heads of
/// [b, h, s, d] row-major tensors (each buffer b·h·s·d floats); with `causal` non-zero,
/// query i sees keys j ≤ i. `o` is overwritten. For a padded batch, see
/// `autokernel_runtime_attention_masked`.
/// `*level_out` (if not NULL) gets the AUTOKERNEL_LEVEL_* that served the call.
///
/// # Safety
/// `rt` is NULL or a live runtime; each buffer is NULL or holds its stated number of
/// floats; `o` overlaps no input; `level_out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_attention(
    rt: *const AutokernelRuntime,
    b: usize,
    h: usize,
    s: usize,
    d: usize,
    causal: c_int,
    q: *const f32,
    q_len: usize,
    k: *const f32,
    k_len: usize,
    v: *const f32,
    v_len: usize,
    o: *mut f32,
    o_len: usize,
    level_out: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract above; no key lengths.
    unsafe {
        attention(
            rt,
            [b, h, s, d],
            causal,
            None,
            [(q, q_len), (k, k_len), (v, v_len)],
            (o, o_len),
            level_out,
        )
    }
}

/// `autokernel_runtime_attention` on a padded batch: `key_lens` holds `b` key lengths (each
/// in 0..=s, `key_lens_len` must be `b`); keys j ≥ `key_lens[batch]` are not attended to (what a
/// Hugging Face attention mask of 1s then 0s means), combined with `causal`; a query that sees
/// no key gets zeros. Same tuned variants as unmasked attention.
///
/// # Safety
/// As `autokernel_runtime_attention`; `key_lens` is NULL or holds `key_lens_len` ints.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn autokernel_runtime_attention_masked(
    rt: *const AutokernelRuntime,
    b: usize,
    h: usize,
    s: usize,
    d: usize,
    causal: c_int,
    key_lens: *const i32,
    key_lens_len: usize,
    q: *const f32,
    q_len: usize,
    k: *const f32,
    k_len: usize,
    v: *const f32,
    v_len: usize,
    o: *mut f32,
    o_len: usize,
    level_out: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract above.
    unsafe {
        attention(
            rt,
            [b, h, s, d],
            causal,
            Some((key_lens, key_lens_len)),
            [(q, q_len), (k, k_len), (v, v_len)],
            (o, o_len),
            level_out,
        )
    }
}

/// The body of both attention entry points: `key_lens` `None` for unmasked attention, else
/// the (pointer, length) of the key lengths, checked like every other buffer.
///
/// # Safety
/// As `autokernel_runtime_attention_masked`.
unsafe fn attention(
    rt: *const AutokernelRuntime,
    [b, h, s, d]: [usize; 4],
    causal: c_int,
    key_lens: Option<(*const i32, usize)>,
    [(q, q_len), (k, k_len), (v, v_len)]: [(*const f32, usize); 3],
    (o, o_len): (*mut f32, usize),
    level_out: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract.
        let handle = unsafe { args::handle("rt", rt)? };
        let lens = match key_lens {
            Some((p, n)) => Some(unsafe { args::input("key_lens", p, n)? }),
            None => None,
        };
        let q = unsafe { args::input("q", q, q_len)? };
        let k = unsafe { args::input("k", k, k_len)? };
        let v = unsafe { args::input("v", v, v_len)? };
        let mut inputs = vec![("q", span(q)), ("k", span(k)), ("v", span(v))];
        inputs.extend(lens.map(|l| ("key_lens", span(l))));
        let o = unsafe { args::output("o", o, o_len, &inputs)? };
        let causal = causal != 0;
        let level = handle.serve(|rt| match lens {
            Some(lens) => rt.attention_masked(b, h, s, d, causal, lens, q, k, v, o),
            None => rt.attention(b, h, s, d, causal, q, k, v, o),
        })?;
        unsafe { args::put_optional(level_out, level_code(level)) };
        Ok(())
    })
}

/// Self-attention straight from a fused QKV projection's output, f32: `qkv` holds b·s rows
/// of 3·heads·d floats (each token's queries, then keys, then values; head i at columns
/// i·d.. of each), `o` gets b·s rows of heads·d floats (head i at columns i·d..), ready for
/// the output projection. The tuned attention (`autokernel_runtime_attention`'s) reads and
/// writes the rows in place (a variant that cannot gets the heads split out and merged back
/// in buffers of the runtime). `key_lens` (b values, each in 0..=s) masks a padded
/// batch as in `autokernel_runtime_attention_masked`; NULL (with `key_lens_len` 0) for none.
/// `*level_out` (if not NULL) gets the AUTOKERNEL_LEVEL_* that served the attention.
///
/// # Safety
/// `rt` is NULL or a live runtime; each buffer is NULL or holds its stated number of
/// elements; `o` overlaps no input; `level_out` is NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn autokernel_runtime_attention_qkv(
    rt: *const AutokernelRuntime,
    b: usize,
    s: usize,
    heads: usize,
    d: usize,
    causal: c_int,
    key_lens: *const i32,
    key_lens_len: usize,
    qkv: *const f32,
    qkv_len: usize,
    o: *mut f32,
    o_len: usize,
    level_out: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract above.
        let handle = unsafe { args::handle("rt", rt)? };
        let lens = if key_lens.is_null() && key_lens_len == 0 {
            None
        } else {
            Some(unsafe { args::input("key_lens", key_lens, key_lens_len)? })
        };
        let qkv = unsafe { args::input("qkv", qkv, qkv_len)? };
        let mut inputs = vec![("qkv", span(qkv))];
        inputs.extend(lens.map(|l| ("key_lens", span(l))));
        let o = unsafe { args::output("o", o, o_len, &inputs)? };
        let dims = runtime::AttentionRows {
            batch: b,
            seq: s,
            heads,
            d,
            causal: causal != 0,
        };
        let level = handle.serve(|rt| rt.attention_qkv(dims, lens, qkv, o))?;
        unsafe { args::put_optional(level_out, level_code(level)) };
        Ok(())
    })
}

/// In place: `x = LayerNorm(x + residual)` over rows of `h` floats (`x_len` a multiple of
/// `h`), with scale `gamma` and shift `beta` (`h` floats each) and `eps` (a positive finite
/// number, else `AUTOKERNEL_INVALID_ARGUMENT`), as torch.nn.LayerNorm computes it;
/// `residual` (`x_len` floats) may be NULL (with `residual_len` 0) for a plain LayerNorm.
/// Parallel over rows. No rows (`x_len` 0) is an empty batch: nothing to do, `AUTOKERNEL_OK`.
///
/// # Safety
/// Each buffer is NULL or holds its stated number of floats; `x` overlaps no other buffer.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn autokernel_add_layer_norm(
    x: *mut f32,
    x_len: usize,
    residual: *const f32,
    residual_len: usize,
    gamma: *const f32,
    beta: *const f32,
    h: usize,
    eps: f32,
) -> c_int {
    guard(|| {
        if h == 0 {
            return Err(CapiError::shape(
                "h = 0: a LayerNorm row needs at least one value",
            ));
        }
        // SAFETY (this block): the caller's contract above.
        let gamma = unsafe { args::input("gamma", gamma, h)? };
        let beta = unsafe { args::input("beta", beta, h)? };
        let residual = if residual.is_null() && residual_len == 0 {
            None
        } else {
            Some(unsafe { args::input("residual", residual, residual_len)? })
        };
        let mut inputs = vec![("gamma", span(gamma)), ("beta", span(beta))];
        inputs.extend(residual.map(|r| ("residual", span(r))));
        let x = unsafe { args::output("x", x, x_len, &inputs)? };
        runtime::add_layer_norm(x, residual, gamma, beta, eps)?;
        Ok(())
    })
}

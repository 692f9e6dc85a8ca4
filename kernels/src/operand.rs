//! Operands: what [`Executable::run`](crate::Executable::run) takes — a view of a buffer with
//! its element type ([`DType`]), its quantisation scales where it has them, and its device.
//!
//! ```
//! use kernels::{default_for, HardwareFingerprint, Operand, OperandMut, Workload};
//!
//! let w: Workload = "gemm:2x3x4".parse()?;
//! let (kernel, config) = default_for(&w, HardwareFingerprint::current())?;
//! let exe = kernel.prepare(&w, &config)?;
//! let (a, b, mut c) = (vec![1.0f32; 8], vec![0.5f32; 12], vec![0.0f32; 6]);
//! exe.run(&[Operand::F32(&a), Operand::F32(&b)], OperandMut::F32(&mut c))?;
//! assert_eq!(c, vec![2.0; 6]);
//! // A wrong operand is an error naming it, never a panic:
//! let e = exe.run(&[Operand::F32(&a[..7]), Operand::F32(&b)], OperandMut::F32(&mut c));
//! assert!(e.unwrap_err().to_string().contains("operand 'a'"));
//! # Ok::<(), kernels::Error>(())
//! ```
//!
//! Host operands are slices; a CUDA operand is a device address with its length
//! ([`DeviceBuffer`]). Which element types a family takes for each operand follows from the
//! workload's element type: for an f32 workload every operand is f32.

use std::fmt;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::workload::Workload;

/// Most inputs any workload has (A, B, bias / Q, K, V), plus room.
pub const MAX_INPUTS: usize = 4;

/// A buffer in a CUDA device's memory: `len` elements of `dtype` at address `ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBuffer {
    /// The CUDA device ordinal the memory belongs to.
    pub ordinal: usize,
    /// The device address of the first element (a `CUdeviceptr`).
    pub ptr: u64,
    /// Number of elements (not bytes).
    pub len: usize,
    /// The element type.
    pub dtype: DType,
}

/// A read-only operand.
#[derive(Debug, Clone, Copy)]
pub enum Operand<'a> {
    /// f32 values on the host.
    F32(&'a [f32]),
    /// bf16 values as their bit patterns (the upper half of the f32 they round).
    Bf16(&'a [u16]),
    /// Symmetric int8 values and their scales (one per row or per column, as the op says):
    /// value = scale · q.
    I8 {
        /// The quantised values.
        data: &'a [i8],
        /// The scales, one per row or per column.
        scales: &'a [f32],
    },
    /// Asymmetric uint8 values, scales and zero points: value = scale · (q − zero_point).
    U8 {
        /// The quantised values.
        data: &'a [u8],
        /// The scales, one per row or per column.
        scales: &'a [f32],
        /// The zero points, one per scale.
        zero_points: &'a [i32],
    },
    /// i32 values on the host, e.g. attention's key lengths ([`KEY_LENS`]).
    I32(&'a [i32]),
    /// A buffer in a CUDA device's memory, of any element type.
    Cuda(DeviceBuffer),
}

/// A written operand (the output).
#[derive(Debug)]
pub enum OperandMut<'a> {
    /// f32 values on the host.
    F32(&'a mut [f32]),
    /// bf16 values on the host, as their bit patterns.
    Bf16(&'a mut [u16]),
    /// i32 values on the host.
    I32(&'a mut [i32]),
    /// A buffer in a CUDA device's memory, of any element type.
    Cuda(DeviceBuffer),
}

impl Operand<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Operand::F32(_) => DType::F32,
            Operand::Bf16(_) => DType::Bf16,
            Operand::I8 { .. } => DType::I8,
            Operand::U8 { .. } => DType::U8,
            Operand::I32(_) => DType::I32,
            Operand::Cuda(b) => b.dtype,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Operand::F32(x) => x.len(),
            Operand::Bf16(x) => x.len(),
            Operand::I8 { data, .. } => data.len(),
            Operand::U8 { data, .. } => data.len(),
            Operand::I32(x) => x.len(),
            Operand::Cuda(b) => b.len,
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where it lives.
    pub fn device(&self) -> Device {
        match self {
            Operand::Cuda(b) => Device::Cuda(b.ordinal),
            _ => Device::Cpu,
        }
    }
}

impl OperandMut<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            OperandMut::F32(_) => DType::F32,
            OperandMut::Bf16(_) => DType::Bf16,
            OperandMut::I32(_) => DType::I32,
            OperandMut::Cuda(b) => b.dtype,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            OperandMut::F32(x) => x.len(),
            OperandMut::Bf16(x) => x.len(),
            OperandMut::I32(x) => x.len(),
            OperandMut::Cuda(b) => b.len,
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where it lives.
    pub fn device(&self) -> Device {
        match self {
            OperandMut::Cuda(b) => Device::Cuda(b.ordinal),
            _ => Device::Cpu,
        }
    }
}

/// What an operand is, for error messages: `12 f32 values on cpu`.
struct Shape {
    len: usize,
    dtype: DType,
    device: Device,
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} values on {}", self.len, self.dtype, self.device)
    }
}

fn mismatch(w: &Workload, name: &str, want: Shape, got: Shape) -> Error {
    Error::Operand {
        workload: w.key(),
        operand: name.to_string(),
        reason: format!("expected {want}, got {got}"),
    }
}

/// The f32 host buffers of an f32 workload's operands, checked against `w`: as many inputs
/// as it has, each f32, on the CPU, of its length ([`Workload::input_lens`]); the same for
/// the output. The check every f32 CPU executable runs first.
pub fn host_f32<'a, 'o, const N: usize>(
    w: &Workload,
    inputs: &[Operand<'a>],
    output: OperandMut<'o>,
) -> Result<([&'a [f32]; N], &'o mut [f32])> {
    let names = w.input_names();
    let lens = w.input_lens();
    if inputs.len() != N || names.len() != N {
        return Err(Error::Operand {
            workload: w.key(),
            operand: "inputs".into(),
            reason: format!(
                "expected {} ({}), got {}",
                names.len(),
                names.join(", "),
                inputs.len()
            ),
        });
    }
    let host = |len| Shape {
        len,
        dtype: DType::F32,
        device: Device::Cpu,
    };
    let mut out: [&[f32]; N] = [&[]; N];
    for (i, x) in inputs.iter().enumerate() {
        match x {
            Operand::F32(s) if s.len() == lens[i] => out[i] = s,
            _ => {
                let got = Shape {
                    len: x.len(),
                    dtype: x.dtype(),
                    device: x.device(),
                };
                return Err(mismatch(w, names[i], host(lens[i]), got));
            }
        }
    }
    let want = w.output_len();
    match output {
        OperandMut::F32(c) if c.len() == want => Ok((out, c)),
        other => {
            let got = Shape {
                len: other.len(),
                dtype: other.dtype(),
                device: other.device(),
            };
            Err(mismatch(w, w.output_name(), host(want), got))
        }
    }
}

/// Attention's host operands: Q, K, V, the optional key lengths, and O.
pub type AttentionOperands<'a, 'o> = ([&'a [f32]; 3], Option<&'a [i32]>, &'o mut [f32]);

/// The name of attention's optional fourth operand in error messages.
pub const KEY_LENS: &str = "key_lens";

/// The host operands of an f32 attention workload: Q, K, V (checked as [`host_f32`] does),
/// then optionally the **key lengths** — an [`Operand::I32`] of B values, `key_lens[b]` in
/// `0..=S`: in batch `b`, keys `j ≥ key_lens[b]` are masked out for every query (a padded
/// batch: what a 0/1 attention mask of right-padded sequences means). A query that sees no
/// key gets zeros. Without it every key is seen. A workload that is not attention is an
/// error.
pub fn host_attention<'a, 'o>(
    w: &Workload,
    inputs: &[Operand<'a>],
    output: OperandMut<'o>,
) -> Result<AttentionOperands<'a, 'o>> {
    let Workload::Attention { b, .. } = *w else {
        return Err(not_attention(w));
    };
    let lens = match inputs {
        [_, _, _] => None,
        [_, _, _, Operand::I32(lens)] if lens.len() == b => Some(*lens),
        [_, _, _, x] => {
            let got = Shape {
                len: x.len(),
                dtype: x.dtype(),
                device: x.device(),
            };
            let want = Shape {
                len: b,
                dtype: DType::I32,
                device: Device::Cpu,
            };
            return Err(mismatch(w, KEY_LENS, want, got));
        }
        _ => {
            return Err(Error::Operand {
                workload: w.key(),
                operand: "inputs".into(),
                reason: format!(
                    "expected 3 (q, k, v) or 4 (q, k, v, {KEY_LENS}), got {}",
                    inputs.len()
                ),
            })
        }
    };
    check_key_lens(w, lens)?;
    let (qkv, out) = host_f32::<3>(w, &inputs[..3], output)?;
    Ok((qkv, lens, out))
}

/// The error of attention operands (Q, K, V, key lengths, QKV rows) given for a workload
/// that is not attention.
fn not_attention(w: &Workload) -> Error {
    Error::Operand {
        workload: w.key(),
        operand: "inputs".into(),
        reason: "attention operands (q, k, v, key lengths, qkv rows) given for a workload \
                 that is not attention"
            .into(),
    }
}

/// Checks that every key length is in `0..=S` (`w` is attention).
fn check_key_lens(w: &Workload, lens: Option<&[i32]>) -> Result<()> {
    let Workload::Attention { s, .. } = *w else {
        return Err(not_attention(w));
    };
    match lens
        .into_iter()
        .flatten()
        .enumerate()
        .find(|(_, l)| !(0..=s as i64).contains(&i64::from(**l)))
    {
        Some((batch, len)) => Err(Error::Operand {
            workload: w.key(),
            operand: KEY_LENS.into(),
            reason: format!("key length {len} of batch {batch} is outside 0..={s}"),
        }),
        None => Ok(()),
    }
}

/// The check of [`Executable::run_qkv_rows`]'s operands against an f32 attention workload
/// `w` (`B, H, S, D`): `qkv` holds `B·S` rows of `3·H·D`, `out` `B·S` rows of `H·D`, and
/// `key_lens`, if given, one length in `0..=S` per batch.
///
/// [`Executable::run_qkv_rows`]: crate::Executable::run_qkv_rows
pub fn host_qkv_rows(
    w: &Workload,
    qkv: &[f32],
    key_lens: Option<&[i32]>,
    out: &[f32],
) -> Result<()> {
    let Workload::Attention { b, .. } = *w else {
        return Err(not_attention(w));
    };
    let host = |len, dtype| Shape {
        len,
        dtype,
        device: Device::Cpu,
    };
    let n = w.output_len();
    if qkv.len() != 3 * n {
        let want = host(3 * n, DType::F32);
        return Err(mismatch(w, "qkv", want, host(qkv.len(), DType::F32)));
    }
    if out.len() != n {
        let want = host(n, DType::F32);
        return Err(mismatch(w, "out", want, host(out.len(), DType::F32)));
    }
    if let Some(lens) = key_lens.filter(|l| l.len() != b) {
        let got = host(lens.len(), DType::I32);
        return Err(mismatch(w, KEY_LENS, host(b, DType::I32), got));
    }
    check_key_lens(w, key_lens)
}

/// [`host_f32`] for [`Executable::run_prepared`]: the workload's f32 inputs without B (its
/// second input, the weight), then the output. `N` counts the inputs without B.
///
/// [`Executable::run_prepared`]: crate::Executable::run_prepared
pub fn host_f32_prepared<'a, 'o, const N: usize>(
    w: &Workload,
    inputs: &[&'a [f32]],
    output: &'o mut [f32],
) -> Result<([&'a [f32]; N], &'o mut [f32])> {
    let names = w.input_names();
    let lens = w.input_lens();
    if inputs.len() != N || names.len() != N + 1 {
        return Err(Error::Operand {
            workload: w.key(),
            operand: "inputs".into(),
            reason: format!(
                "expected {} without B ({}), got {}",
                names.len().saturating_sub(1),
                names.join(", "),
                inputs.len()
            ),
        });
    }
    let host = |len| Shape {
        len,
        dtype: DType::F32,
        device: Device::Cpu,
    };
    let mut out: [&[f32]; N] = [&[]; N];
    for (i, x) in inputs.iter().enumerate() {
        let j = if i == 0 { 0 } else { i + 1 };
        if x.len() != lens[j] {
            return Err(mismatch(w, names[j], host(lens[j]), host(x.len())));
        }
        out[i] = x;
    }
    let want = w.output_len();
    if output.len() != want {
        let got = host(output.len());
        return Err(mismatch(w, w.output_name(), host(want), got));
    }
    Ok((out, output))
}

/// `inputs` as f32 operands, on the stack (no allocation): for [`Executable::run_f32`].
///
/// [`Executable::run_f32`]: crate::Executable::run_f32
pub(crate) fn f32_operands<'a>(inputs: &[&'a [f32]]) -> Option<[Operand<'a>; MAX_INPUTS]> {
    if inputs.len() > MAX_INPUTS {
        return None;
    }
    let mut ops = [Operand::F32(&[]); MAX_INPUTS];
    for (slot, x) in ops.iter_mut().zip(inputs) {
        *slot = Operand::F32(x);
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_f32_names_the_wrong_operand() {
        let w: Workload = "gemm_bias:2x3x4".parse().unwrap();
        let (a, b, bias, mut c) = (vec![0f32; 8], vec![0f32; 12], vec![0f32; 3], vec![0f32; 6]);
        let ok = host_f32::<3>(
            &w,
            &[Operand::F32(&a), Operand::F32(&b), Operand::F32(&bias)],
            OperandMut::F32(&mut c),
        );
        assert!(ok.is_ok());
        let bits = vec![0u16; 12];
        let cuda = DeviceBuffer {
            ordinal: 1,
            ptr: 0x1000,
            len: 6,
            dtype: DType::F32,
        };
        for (inputs, needle) in [
            (
                vec![Operand::F32(&a), Operand::F32(&b)],
                "expected 3 (a, b, bias), got 2",
            ),
            (
                vec![Operand::F32(&a), Operand::Bf16(&bits), Operand::F32(&bias)],
                "operand 'b' of gemm_bias:2x3x4: expected 12 f32 values on cpu, got 12 bf16",
            ),
            (
                vec![Operand::F32(&a), Operand::F32(&b), Operand::F32(&a)],
                "operand 'bias' of gemm_bias:2x3x4: expected 3 f32 values on cpu, got 8",
            ),
        ] {
            let e = host_f32::<3>(&w, &inputs, OperandMut::F32(&mut c)).unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
        }
        let e = host_f32::<3>(
            &w,
            &[Operand::F32(&a), Operand::F32(&b), Operand::F32(&bias)],
            OperandMut::Cuda(cuda),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("operand 'c'") && e.to_string().contains("cuda:1"),
            "{e}"
        );
        assert_eq!(Operand::Cuda(cuda).device(), Device::Cuda(1));
        assert!(f32_operands(&[a.as_slice(); 5]).is_none());
    }

    #[test]
    fn host_attention_checks_the_key_lengths() {
        let w: Workload = "attention:2x1x3x2".parse().unwrap();
        let (x, mut o) = (vec![0f32; 12], vec![0f32; 12]);
        let ok = |lens: &[i32], o: &mut [f32]| {
            let ins = [
                Operand::F32(&x),
                Operand::F32(&x),
                Operand::F32(&x),
                Operand::I32(lens),
            ];
            host_attention(&w, &ins, OperandMut::F32(o)).map(|(_, l, _)| l.map(<[i32]>::to_vec))
        };
        assert_eq!(ok(&[0, 3], &mut o).unwrap(), Some(vec![0, 3]));
        let three = [Operand::F32(&x), Operand::F32(&x), Operand::F32(&x)];
        assert!(host_attention(&w, &three, OperandMut::F32(&mut o))
            .unwrap()
            .1
            .is_none());
        for (lens, needle) in [
            (&[1, 4][..], "key length 4 of batch 1 is outside 0..=3"),
            (&[-1, 0][..], "key length -1 of batch 0"),
            (
                &[1][..],
                "operand 'key_lens' of attention:2x1x3x2: expected 2 i32 values",
            ),
        ] {
            let e = ok(lens, &mut o).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        let f = [0f32; 2];
        let ins = [three[0], three[1], three[2], Operand::F32(&f)];
        let e = host_attention(&w, &ins, OperandMut::F32(&mut o)).unwrap_err();
        assert!(e.to_string().contains("got 2 f32 values"), "{e}");
        let e = host_attention(&w, &three[..2], OperandMut::F32(&mut o)).unwrap_err();
        assert!(
            e.to_string().contains("or 4 (q, k, v, key_lens), got 2"),
            "{e}"
        );
    }
}

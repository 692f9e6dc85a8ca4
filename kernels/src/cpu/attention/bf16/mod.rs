//! bf16 attention on the CPU (`attention:BxHxSxD[:causal]:bf16`): the `attention_bf16`
//! family, flash-style with `vdpbf16ps` (AVX512_BF16).
//!
//! Inputs and output are f32, as for the f32 family and the bf16 GEMM: Q, K and V are
//! rounded to bf16 (nearest even) as they are packed — K and V once per call, per head; Q per
//! query block — and `Q·Kᵀ` and `P·V` run as `vdpbf16ps` pair tiles (the bf16 GEMM's
//! `pair_body`), with f32 accumulation. The
//! softmax is online and in f32 (running maximum and sum); the weights `P` are rounded to
//! bf16 only for `P·V`, the running sum adds them unrounded. Padding (key lengths, the
//! optional fourth operand) and causal masks as in the f32 family: key blocks past a
//! sequence's end or a row group's last query are never visited, a length 0 gives zeros.
//!
//! A family of its own rather than a `dtype` knob of `attention_fused`: a workload carries
//! its element type (`:bf16`), records are stored per workload key, and every other family
//! is per element type (`gemm_bf16`, `gemm_i8`), so the runtime's precision policy and
//! `tune --precision` find bf16 attention the way they find bf16 GEMM; the layouts (bf16
//! pair panels, not f32 panels) and tiles differ from the f32 ones throughout.
//!
//! Where it runs: only where the CPU has AVX512_BF16 (with AVX-512F and AVX512BW, and
//! `AUTOKERNEL_ISA` not capping AVX-512 off). [`Kernel::supports`] says so for this
//! process, so on other CPUs no family serves `:bf16` attention: `tune --precision bf16`
//! skips it and the runtime serves attention in f32. Its tiles are offered in a space only
//! where the fingerprint has `avx512bf16` and `avx512bw`. The same step body runs in tests on
//! every CPU over a plain-Rust emulation of `vdpbf16ps` (emulated twins, never offered: an
//! emulated kernel is slow and must never be served). The AVX512_BF16 path ran and was
//! verified on an AMD Zen 4.
//!
//! Knobs: `tile` (`avx512bf16_{MR}x{NR}`: MR query rows, NR keys per score tile), `br` and
//! `bc` (query rows and keys per block, rounded up to MR and NR), `par` (`none`, `heads`:
//! tasks over B·H, `blocks`: heads × query blocks) and `threads`.

mod driver;
pub mod ukernel;

#[cfg(test)]
mod tests;

use super::{
    block_rules, blocks_fit, default_par, par_from_config, par_values, shape, AttnPar, BC_VALUES,
    BR_VALUES,
};
use crate::cpu::knobs::{int_knob, invalid, snap, str_knob, thread_values, unsupported};
use crate::cpu::Isa;
use crate::dtype::DType;
use crate::error::Result;
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::space::{Config, Space, Value};
use crate::workload::Workload as W;

pub use driver::Bf16Attention;
use ukernel::{Bf16Tile, TILES};

/// The bf16 attention family.
pub struct AttentionBf16;

const NAME: &str = "attention_bf16";

/// The tiles `hw`'s fingerprint offers: all of them where it has AVX-512 with `avx512bf16`
/// and `avx512bw`, none elsewhere.
fn offered(hw: &HardwareFingerprint) -> Vec<&'static Bf16Tile> {
    let bf16 = Isa::Avx512.offered_under(Isa::of(hw)) && hw.has("avx512bf16") && hw.has("avx512bw");
    TILES.iter().filter(|_| bf16).collect()
}

impl Kernel for AttentionBf16 {
    fn name(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> u32 {
        // 2: buffers reused across calls, keys and values packed per head by its task, rows
        // of query and weight pair words (no scattered stores), AVX-512 conversions.
        2
    }

    fn dtypes(&self) -> &'static [DType] {
        &[DType::Bf16]
    }

    /// bf16 attention, where this process runs a tile (AVX512_BF16): elsewhere nothing
    /// serves `:bf16` attention, and the runtime stays in f32 for it.
    fn supports(&self, w: &W) -> bool {
        matches!(w, W::Attention { .. })
            && w.dtype() == DType::Bf16
            && TILES.iter().any(|t| t.available())
    }

    fn missing_here(&self, w: &W) -> Option<String> {
        let bf16_attention = matches!(w, W::Attention { .. }) && w.dtype() == DType::Bf16;
        (bf16_attention && !self.supports(w)).then(|| {
            "bf16 attention (attention_bf16) runs only where the CPU has AVX512_BF16 \
             (and AUTOKERNEL_ISA allows AVX-512); this one does not"
                .to_string()
        })
    }

    fn config_fits(&self, w: &W, hw: &HardwareFingerprint, c: &Config) -> bool {
        c.0.len() == 5
            && c.str("tile")
                .is_some_and(|t| offered(hw).iter().any(|o| o.name == t))
            && blocks_fit(w, hw, c)
    }

    fn space(&self, w: &W, hw: &HardwareFingerprint) -> Space {
        let names: Vec<&str> = offered(hw).iter().map(|t| t.name).collect();
        if names.is_empty() {
            return Space::unsatisfiable("the fingerprint has AVX-512 with avx512bf16");
        }
        let space = Space::new()
            .knob("tile", names)
            .knob("br", BR_VALUES.iter().copied())
            .knob("bc", BC_VALUES.iter().copied())
            .knob("par", par_values(hw, "blocks"))
            .knob("threads", thread_values(hw));
        block_rules(space, w)
    }

    fn default_config(&self, w: &W, hw: &HardwareFingerprint) -> Config {
        let (_, _, s, _, _) = shape(w);
        // The first (largest) tile; 64 queries × 256 keys per block as the f32 family.
        let tile = offered(hw).first().map_or(TILES_FIRST, |t| t.name);
        let (par, threads) = default_par(w, hw);
        Config::from_pairs([
            ("tile", Value::from(tile)),
            ("br", snap(BR_VALUES, 64, s).into()),
            ("bc", snap(BC_VALUES, 256, s).into()),
            ("par", par.into()),
            ("threads", threads.into()),
        ])
    }

    fn build(&self, w: &W, c: &Config) -> Result<Box<dyn Executable>> {
        let W::Attention {
            b,
            h,
            s,
            d,
            causal,
            dtype: DType::Bf16,
        } = *w
        else {
            return Err(unsupported(NAME, w));
        };
        let tile_name = str_knob(NAME, c, "tile")?;
        let tile = ukernel::tile(tile_name).ok_or_else(|| {
            let why = "is unknown or needs AVX512_BF16, which this CPU lacks";
            invalid(NAME, c, format!("tile '{tile_name}' {why}"))
        })?;
        let par = match par_from_config(NAME, c, "blocks")? {
            (p, t) if p == "heads" => AttnPar::Heads(t),
            (p, t) if p == "blocks" => AttnPar::Blocks(t),
            _ => AttnPar::None,
        };
        let (br, bc) = (int_knob(NAME, c, "br")?, int_knob(NAME, c, "bc")?);
        if br == 0 || bc == 0 {
            return Err(invalid(NAME, c, "br and bc must be at least 1".into()));
        }
        let shape = (b, h, s, d, causal);
        Ok(Box::new(Bf16Attention::new(shape, tile, (br, bc), par)))
    }
}

/// The default's tile name where the fingerprint offers none (it then does not build).
const TILES_FIRST: &str = "avx512bf16_8x32";

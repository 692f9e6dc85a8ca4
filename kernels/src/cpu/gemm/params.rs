//! The typed view of the GEMM families' configs (`gemm_packed`, `gemm_direct` and their
//! `gemm_bias_act_*` epilogue variants): their knob names, defined once here, and their
//! values as types that read themselves from a [`Config`] (`TryFrom<&Config>`) and write
//! themselves back (`set_in`).
//!
//! The families build from these types, and the crates that reason about a GEMM config (the
//! cost model's features, the runtime's weight packing) read and adjust configs through
//! them, so no other crate spells a knob name or value. The stored form does not change: a
//! config's JSON keeps the same keys and values (`{"a_layout":"packed","kc":256,...}`).
//!
//! ```
//! use kernels::cpu::gemm::params::{BLayout, Par, UkernelId};
//! use kernels::cpu::Isa;
//! use kernels::Config;
//!
//! let mut c = Config::from_json(r#"{"ukernel":"avx2_6x16","par":"m","threads":4}"#)?;
//! let uk = UkernelId::try_from(&c)?;
//! assert_eq!((uk.isa, uk.rows, uk.cols), (Isa::Avx2, 6, 16));
//! assert_eq!(Par::try_from(&c)?, Par::M(4));
//! BLayout::Prepacked.set_in(&mut c);
//! assert_eq!(BLayout::try_from(&c)?, BLayout::Prepacked);
//! assert!(c.to_json().contains(r#""b_layout":"prepacked""#));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use super::ukernel::{DirectUkernel, PackedUkernel};
use crate::cpu::knobs::{int_value, str_value};
use crate::cpu::Isa;
use crate::space::Config;

/// The knob names of the GEMM families.
pub mod knob {
    pub use crate::cpu::knobs::{PAR, THREADS};

    /// The micro-kernel: [`UkernelId`](super::UkernelId).
    pub const UKERNEL: &str = "ukernel";
    /// Rows of A per packed block (packed families).
    pub const MC: &str = "mc";
    /// Depth per block (for the direct families, 0 means the whole of K).
    pub const KC: &str = "kc";
    /// Columns of B per packed block (packed families).
    pub const NC: &str = "nc";
    /// Whether A is packed: [`ALayout`](super::ALayout) (packed families).
    pub const A_LAYOUT: &str = "a_layout";
    /// How the epilogue runs: [`Fusion`](super::Fusion) (epilogue families).
    pub const FUSION: &str = "fusion";
    /// How B is read: [`BLayout`](super::BLayout) (packed families).
    pub const B_LAYOUT: &str = "b_layout";
}

/// The `ukernel` knob's value: a micro-kernel by ISA and register tile, named
/// `{isa}_{rows}x{cols}` (`avx2_6x16`). Packed micro-kernels are `MR × NR` (floats), direct
/// ones `R × V` (vectors of [`UkernelId::lanes`] floats). Only the name: whether this CPU
/// runs it is for [`ukernel::packed`](super::ukernel::packed) and
/// [`ukernel::direct`](super::ukernel::direct) to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UkernelId {
    /// The ISA the micro-kernel is written for (`avx2` in `avx2_6x16`).
    pub isa: Isa,
    /// Rows of the register tile (MR, or R).
    pub rows: usize,
    /// Columns of the register tile: floats for packed kernels (NR), vectors for direct ones.
    pub cols: usize,
}

impl UkernelId {
    /// The micro-kernel called `name`, in its one spelling (`avx2_6x16`, not `avx2_06x16`).
    pub fn parse(name: &str) -> Option<UkernelId> {
        let (isa, shape) = name.split_once('_')?;
        let (rows, cols) = shape.split_once('x')?;
        let id = UkernelId {
            isa: Isa::parse(isa)?,
            rows: rows.parse().ok()?,
            cols: cols.parse().ok()?,
        };
        (id.to_string() == name).then_some(id)
    }

    /// f32 lanes of one vector of its ISA: 16 for AVX-512, 8 for AVX2 and for the portable
    /// kernels (written over 8-wide arrays).
    pub fn lanes(self) -> usize {
        match self.isa {
            Isa::Avx512 => 16,
            Isa::Avx2 | Isa::Portable => 8,
        }
    }

    /// Sets `c`'s micro-kernel to this one.
    pub fn set_in(self, c: &mut Config) {
        c.set(knob::UKERNEL, self.to_string().as_str());
    }
}

impl fmt::Display for UkernelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}x{}", self.isa.name(), self.rows, self.cols)
    }
}

impl TryFrom<&Config> for UkernelId {
    type Error = String;

    fn try_from(c: &Config) -> Result<Self, String> {
        let name = str_value(c, knob::UKERNEL)?;
        UkernelId::parse(name).ok_or_else(|| unsupported_ukernel(name))
    }
}

/// Why a micro-kernel name does not build.
pub(crate) fn unsupported_ukernel(name: impl fmt::Display) -> String {
    format!("micro-kernel '{name}' is unknown or not supported by this CPU")
}

impl PackedUkernel {
    /// Its knob value, typed.
    pub fn id(&self) -> UkernelId {
        UkernelId {
            isa: self.isa,
            rows: self.mr,
            cols: self.nr,
        }
    }
}

impl DirectUkernel {
    /// Its knob value, typed.
    pub fn id(&self) -> UkernelId {
        UkernelId {
            isa: self.isa,
            rows: self.r,
            cols: self.v,
        }
    }
}

/// A knob whose values are names: the enum, its stored names, and its reading and writing.
macro_rules! named_knob {
    ($(#[$doc:meta])* $ty:ident = $knob:expr; $($(#[$vdoc:meta])* $var:ident => $name:literal),+ $(,)?) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $ty {
            $($(#[$vdoc])* $var),+
        }

        impl $ty {
            /// Every value, in the order the space lists them.
            pub const ALL: &'static [$ty] = &[$($ty::$var),+];

            /// The value as a config stores it.
            pub const fn name(self) -> &'static str {
                match self {
                    $($ty::$var => $name),+
                }
            }

            /// The value stored as `name`.
            pub fn parse(name: &str) -> Option<$ty> {
                Self::ALL.iter().copied().find(|v| v.name() == name)
            }

            /// `c`'s value, if set and known (lenient: for reading configs of any source).
            pub fn of(c: &Config) -> Option<$ty> {
                c.str($knob).and_then(Self::parse)
            }

            /// Sets this value in `c`.
            pub fn set_in(self, c: &mut Config) {
                c.set($knob, self.name());
            }
        }

        impl TryFrom<&Config> for $ty {
            type Error = String;

            fn try_from(c: &Config) -> Result<Self, String> {
                let v = str_value(c, $knob)?;
                Self::parse(v).ok_or_else(|| format!("unknown {} '{v}'", $knob))
            }
        }
    };
}

named_knob! {
    /// The `a_layout` knob of the packed families: where the micro-kernel reads A from.
    ALayout = knob::A_LAYOUT;
    /// Packed into aligned micro-panels.
    Packed => "packed",
    /// Read in place (only a partial last row tile is packed).
    InPlace => "inplace",
}

named_knob! {
    /// The `b_layout` knob of the packed families: how B is read.
    BLayout = knob::B_LAYOUT;
    /// Row-major, packed block by block on every call.
    RowMajor => "rowmajor",
    /// Packed once into the micro-kernel's panel layout and reused (a constant weight;
    /// epilogue family only).
    Prepacked => "prepacked",
    /// Row-major, read in place by the micro-kernel (only a partial last column panel is
    /// packed): no copy of B, at the price of strided panel reads.
    InPlace => "inplace",
}

named_knob! {
    /// The `fusion` knob of the epilogue families: where bias and activation are applied.
    Fusion = knob::FUSION;
    /// By the micro-kernel, while the C tile is in registers.
    Fused => "fused",
    /// In one vectorised pass over C after the GEMM.
    Separate => "separate",
}

named_knob! {
    /// The `par` knob: the dimension of C split across threads (how many: `threads`).
    Split = knob::PAR;
    /// None: one thread.
    None => "none",
    /// Row blocks of C.
    M => "m",
    /// Column blocks of C.
    N => "n",
}

/// The `par` values of the GEMM families.
pub const PAR_VALUES: &[&str] = &[Split::None.name(), Split::M.name(), Split::N.name()];

/// How the work is split across threads: the `par` and `threads` knobs together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Par {
    /// One thread.
    None,
    /// Row blocks of C on this many rayon tasks.
    M(usize),
    /// Column blocks of C on this many rayon tasks.
    N(usize),
}

impl Par {
    /// Tasks the work is split into.
    pub fn threads(self) -> usize {
        match self {
            Par::None => 1,
            Par::M(t) | Par::N(t) => t,
        }
    }

    /// The dimension split.
    pub fn split(self) -> Split {
        match self {
            Par::None => Split::None,
            Par::M(_) => Split::M,
            Par::N(_) => Split::N,
        }
    }

    /// Sets `c`'s `par` and `threads` knobs to this split.
    pub fn set_in(self, c: &mut Config) {
        self.split().set_in(c);
        c.set(knob::THREADS, self.threads());
    }
}

impl TryFrom<&Config> for Par {
    type Error = String;

    /// From the `par` and `threads` knobs; a split on one thread is [`Par::None`].
    fn try_from(c: &Config) -> Result<Self, String> {
        let threads = int_value(c, knob::THREADS)?.max(1);
        Ok(match Split::try_from(c)? {
            _ if threads == 1 => Par::None,
            Split::None => Par::None,
            Split::M => Par::M(threads),
            Split::N => Par::N(threads),
        })
    }
}

/// A `gemm_packed` config (the GEMM part of a `gemm_bias_act_packed` one), typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedParams {
    /// The micro-kernel (the `ukernel` knob).
    pub ukernel: UkernelId,
    /// Rows of A per packed block (the `mc` knob), as stored: rounded up to MR and capped by M
    /// when the GEMM is built.
    pub mc: usize,
    /// Depth per packed block (the `kc` knob), as stored: capped by K when the GEMM is built.
    pub kc: usize,
    /// Columns of B per packed block (the `nc` knob), as stored: rounded up to NR and capped by N
    /// when the GEMM is built.
    pub nc: usize,
    /// Where the micro-kernel reads A from (the `a_layout` knob).
    pub a_layout: ALayout,
    /// `RowMajor` or `InPlace` (a pre-packed B is the epilogue family's, outside the GEMM).
    pub b_layout: BLayout,
    /// How C is split across threads (the `par` and `threads` knobs).
    pub par: Par,
}

impl TryFrom<&Config> for PackedParams {
    type Error = String;

    fn try_from(c: &Config) -> Result<Self, String> {
        Ok(PackedParams {
            ukernel: UkernelId::try_from(c)?,
            par: Par::try_from(c)?,
            a_layout: ALayout::try_from(c)?,
            b_layout: BLayout::try_from(c)?,
            mc: int_value(c, knob::MC)?,
            kc: int_value(c, knob::KC)?,
            nc: int_value(c, knob::NC)?,
        })
    }
}

/// A `gemm_direct` config (the GEMM part of a `gemm_bias_act_direct` one), typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectParams {
    /// The micro-kernel family (the `ukernel` knob).
    pub ukernel: UkernelId,
    /// Depth per pass over B; 0 means the whole of K.
    pub kc: usize,
    /// How C is split across threads (the `par` and `threads` knobs).
    pub par: Par,
}

impl TryFrom<&Config> for DirectParams {
    type Error = String;

    fn try_from(c: &Config) -> Result<Self, String> {
        Ok(DirectParams {
            ukernel: UkernelId::try_from(c)?,
            par: Par::try_from(c)?,
            kc: int_value(c, knob::KC)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::Value;

    #[test]
    fn micro_kernel_names_round_trip_in_one_spelling() {
        for name in ["avx2_6x16", "avx512_14x32", "portable_4x8", "avx2_1x4"] {
            assert_eq!(UkernelId::parse(name).unwrap().to_string(), name);
        }
        for bad in ["avx9_1x1", "avx2_06x16", "avx2_6x", "avx2", "6x16", ""] {
            assert_eq!(UkernelId::parse(bad), None, "{bad}");
        }
        for uk in super::super::ukernel::packed_available() {
            assert_eq!(uk.id().to_string(), uk.name);
        }
        for uk in super::super::ukernel::direct_available() {
            assert_eq!(uk.id().to_string(), uk.name);
            assert_eq!(uk.id().lanes(), uk.lanes);
        }
        let uk = UkernelId::parse("avx512_4x32").unwrap();
        assert_eq!(
            (uk.isa, uk.rows, uk.cols, uk.lanes()),
            (Isa::Avx512, 4, 32, 16)
        );
    }

    #[test]
    fn typed_values_read_and_write_the_stored_form() {
        let mut c = Config::from_pairs([
            (knob::UKERNEL, Value::from("avx2_4x16")),
            (knob::MC, 96usize.into()),
            (knob::KC, 256usize.into()),
            (knob::NC, 1024usize.into()),
            (knob::A_LAYOUT, "inplace".into()),
            (knob::B_LAYOUT, "inplace".into()),
            (knob::PAR, "n".into()),
            (knob::THREADS, 1usize.into()),
        ]);
        let p = PackedParams::try_from(&c).unwrap();
        assert_eq!((p.mc, p.kc, p.nc), (96, 256, 1024));
        assert_eq!(
            (p.a_layout, p.b_layout, p.par),
            (ALayout::InPlace, BLayout::InPlace, Par::None),
            "n on one thread"
        );
        let json = c.to_json();
        p.ukernel.set_in(&mut c);
        p.a_layout.set_in(&mut c);
        p.b_layout.set_in(&mut c);
        assert_eq!(
            c.to_json(),
            json,
            "writing back what was read changes nothing"
        );
        Par::M(4).set_in(&mut c);
        assert_eq!(Par::try_from(&c), Ok(Par::M(4)));
        assert_eq!(Split::try_from(&c), Ok(Split::M));
        assert_eq!(c.str(knob::PAR), Some("m"));
        Fusion::Separate.set_in(&mut c);
        assert_eq!(c.str(knob::FUSION), Some("separate"));
        c.0.remove(knob::B_LAYOUT);
        assert_eq!(
            BLayout::try_from(&c),
            Err("knob 'b_layout' must be a name".into())
        );
        c.set(knob::B_LAYOUT, "sideways");
        assert_eq!(
            BLayout::try_from(&c),
            Err("unknown b_layout 'sideways'".into())
        );
        assert!(DirectParams::try_from(&Config::default()).is_err());
    }
}

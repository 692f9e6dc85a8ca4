//! The precision policy: which element types a runtime may serve an f32 call in, and under
//! what error budget.
//!
//! Callers hand the runtime f32 operands. A `:bf16` or `:i8` variant of the same workload
//! takes those operands too (it converts or quantises them itself), so the runtime can serve
//! an f32 call with a reduced-precision variant when its policy allows it:
//!
//! - [`PrecisionPolicy::exact`] (`"f32"`, the default): f32 variants only;
//! - [`PrecisionPolicy::only`] (`"bf16"`, `"int8"`): that element type wherever a family
//!   serves it (tuned or its default), and — with a budget — only where the record that serves
//!   it stores an error within the budget; f32 everywhere else;
//! - [`PrecisionPolicy::auto`] (`"auto"`): per workload, the fastest record measured on this
//!   shape among the element types whose stored error is within the budget
//!   ([`DEFAULT_AUTO_MAX_REL_ERR`] unless given); f32 when nothing else was measured faster.
//!
//! The error is the record's `max_rel_err` (`max |got − exact| / max |exact|` against the
//! f32 problem, stored with every record since schema v4). f32 itself is always within any
//! budget: it is the reference precision and the always-valid fallback.

use std::fmt;
use std::str::FromStr;

use kernels::DType;

/// The budget `auto` applies when none is given: 1% of the largest output magnitude, about
/// what dynamic int8 quantisation of a K = 768…3072 GEMM costs.
pub const DEFAULT_AUTO_MAX_REL_ERR: f64 = 1e-2;

/// Which element types an f32 call may be served in (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrecisionPolicy {
    mode: Mode,
    max_rel_err: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Exact,
    Only(DType),
    Auto,
}

/// The reduced element types a policy may choose, in the order `auto` tries them.
const REDUCED: [DType; 2] = [DType::I8, DType::Bf16];

impl PrecisionPolicy {
    /// f32 only: what a runtime serves unless told otherwise.
    pub fn exact() -> Self {
        PrecisionPolicy {
            mode: Mode::Exact,
            max_rel_err: None,
        }
    }

    /// `dtype` wherever a family serves it. f32 is [`exact`](Self::exact), and so is an
    /// element type that is not a workload precision (i32, u8: no workload is served in it).
    pub fn only(dtype: DType) -> Self {
        let mode = match dtype {
            d if d != DType::F32 && d.is_precision() => Mode::Only(d),
            _ => Mode::Exact,
        };
        PrecisionPolicy {
            mode,
            max_rel_err: None,
        }
    }

    /// The fastest measured element type within the budget, per workload.
    pub fn auto() -> Self {
        PrecisionPolicy {
            mode: Mode::Auto,
            max_rel_err: None,
        }
    }

    /// The same policy with an error budget: a reduced-precision record is served only if
    /// its stored `max_rel_err` is at most `e`. A negative or NaN budget allows no
    /// reduced precision.
    pub fn with_max_rel_err(self, e: f64) -> Self {
        PrecisionPolicy {
            max_rel_err: Some(e),
            ..self
        }
    }

    /// [`PrecisionPolicy::with_max_rel_err`] of a budget a user gave: a finite number ≥ 0
    /// (−0 taken as 0), else an error saying what it got.
    pub fn with_budget(self, e: f64) -> Result<Self, BadBudget> {
        if e.is_finite() && e >= 0.0 {
            Ok(self.with_max_rel_err(e + 0.0))
        } else {
            Err(BadBudget(e))
        }
    }

    /// The budget given, if any.
    pub fn max_rel_err(&self) -> Option<f64> {
        self.max_rel_err
    }

    /// Whether this is f32 only.
    pub fn is_exact(&self) -> bool {
        self.mode == Mode::Exact
    }

    /// The reduced element types this policy considers, in the order it tries them.
    pub fn reduced(&self) -> &[DType] {
        match &self.mode {
            Mode::Exact => &[],
            Mode::Only(d) => std::slice::from_ref(d),
            Mode::Auto => &REDUCED,
        }
    }

    /// Whether only measured speed decides (`auto`), rather than the caller's choice.
    pub fn picks_fastest(&self) -> bool {
        self.mode == Mode::Auto
    }

    /// Whether a record with stored error `err` (`None`: not measured) may be served.
    pub fn admits(&self, err: Option<f64>) -> bool {
        let budget = match (self.mode, self.max_rel_err) {
            (Mode::Exact, _) => return false,
            (Mode::Only(_), None) => return true,
            (Mode::Only(_), Some(e)) => e,
            (Mode::Auto, e) => e.unwrap_or(DEFAULT_AUTO_MAX_REL_ERR),
        };
        err.is_some_and(|x| x <= budget)
    }
}

impl Default for PrecisionPolicy {
    fn default() -> Self {
        PrecisionPolicy::exact()
    }
}

/// An error budget that is not a finite number ≥ 0.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("the error budget must be a finite number ≥ 0, not {0}")]
pub struct BadBudget(pub f64);

/// A precision name that is not one of `f32`, `bf16`, `int8` (`i8`) or `auto`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision '{0}' (known: f32, bf16, int8, auto)")]
pub struct UnknownPrecision(pub String);

impl FromStr for PrecisionPolicy {
    type Err = UnknownPrecision;

    /// `auto` or a precision [`DType::precision_named`] knows (`f32`, `bf16`, `int8`, ...).
    fn from_str(s: &str) -> Result<Self, UnknownPrecision> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(PrecisionPolicy::auto());
        }
        match DType::precision_named(s) {
            Some(DType::F32) => Ok(PrecisionPolicy::exact()),
            Some(d) => Ok(PrecisionPolicy::only(d)),
            None => Err(UnknownPrecision(s.to_string())),
        }
    }
}

impl fmt::Display for PrecisionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mode {
            Mode::Exact => f.write_str("f32")?,
            Mode::Only(DType::I8) => f.write_str("int8")?,
            Mode::Only(d) => write!(f, "{d}")?,
            Mode::Auto => f.write_str("auto")?,
        }
        match (self.mode, self.max_rel_err) {
            (Mode::Exact, _) => Ok(()),
            (_, Some(e)) => write!(f, " (max rel err {e:e})"),
            (Mode::Auto, None) => write!(f, " (max rel err {DEFAULT_AUTO_MAX_REL_ERR:e})"),
            (_, None) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_reduced_workload_precision_is_one() {
        assert_eq!(PrecisionPolicy::only(DType::I8).to_string(), "int8");
        for d in [DType::F32, DType::I32, DType::U8] {
            assert!(PrecisionPolicy::only(d).is_exact(), "{d}");
        }
    }

    #[test]
    fn names_parse_and_print() {
        for (s, shown) in [
            ("f32", "f32"),
            ("BF16", "bf16"),
            ("int8", "int8"),
            ("i8", "int8"),
            ("auto", "auto (max rel err 1e-2)"),
        ] {
            let p: PrecisionPolicy = s.parse().unwrap();
            assert_eq!(p.to_string(), shown, "{s}");
        }
        let e = "fp8".parse::<PrecisionPolicy>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown precision 'fp8' (known: f32, bf16, int8, auto)"
        );
        assert!(PrecisionPolicy::only(DType::F32).is_exact());
    }

    #[test]
    fn budgets_admit_what_they_should() {
        let exact = PrecisionPolicy::exact();
        assert!(!exact.admits(Some(0.0)));
        assert!(exact.reduced().is_empty());
        let int8 = PrecisionPolicy::only(DType::I8);
        assert!(int8.admits(None) && int8.admits(Some(0.5)));
        let tight = int8.with_max_rel_err(1e-3);
        assert!(tight.admits(Some(1e-3)) && !tight.admits(Some(2e-3)));
        assert!(
            !tight.admits(None),
            "an unmeasured error never fits a budget"
        );
        assert!(!int8.with_max_rel_err(f64::NAN).admits(Some(0.0)));
        let auto = PrecisionPolicy::auto();
        assert!(auto.admits(Some(DEFAULT_AUTO_MAX_REL_ERR)) && !auto.admits(Some(0.02)));
        assert!(!auto.admits(None));
        assert_eq!(auto.reduced(), &[DType::I8, DType::Bf16]);
        assert!(auto.picks_fastest() && !int8.picks_fastest());
    }

    #[test]
    fn budgets_users_give_are_checked() {
        let int8 = PrecisionPolicy::only(DType::I8);
        let zero = int8.with_budget(-0.0).unwrap();
        assert_eq!(zero.to_string(), "int8 (max rel err 0e0)");
        for bad in [f64::NAN, f64::INFINITY, -1e-3] {
            let e = int8.with_budget(bad).unwrap_err().to_string();
            assert!(e.contains("finite number ≥ 0"), "{e}");
        }
    }
}

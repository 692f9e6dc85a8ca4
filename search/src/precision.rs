//! Which element types a tuning job covers: `--precision f32,bf16,int8` (or `auto`) turns
//! each f32 workload into one per element type that some family serves on the device.

use kernels::{DType, DeviceKind, Workload};

/// A `--precision` list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadPrecisionList {
    /// The list is empty or blank.
    #[error("give at least one precision of {}", DType::PRECISION_NAMES)]
    Empty,
    /// An item between commas is empty (`f32,,int8`); holds the whole list.
    #[error("'{0}' has an empty item (give precisions of {names}, auto, comma-separated)", names = DType::PRECISION_NAMES)]
    EmptyItem(String),
    /// An item that names no precision; holds that item.
    #[error("unknown precision '{0}' (known: {names}, auto)", names = DType::PRECISION_NAMES)]
    Unknown(String),
}

/// The element types a `--precision` list names ([`DType::precision_named`]'s names; `auto`
/// = all three), in order, without repeats.
pub fn parse_precisions(list: &str) -> Result<Vec<DType>, BadPrecisionList> {
    if list.trim().is_empty() {
        return Err(BadPrecisionList::Empty);
    }
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(BadPrecisionList::EmptyItem(list.to_string()));
        }
        let add = match DType::precision_named(name) {
            Some(d) => vec![d],
            None if name.eq_ignore_ascii_case("auto") => DType::PRECISIONS.to_vec(),
            None => return Err(BadPrecisionList::Unknown(name.to_string())),
        };
        for d in add {
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    Ok(out)
}

/// Each f32 workload once per element type of `dtypes` that some family serves on
/// `device`; workloads written with a type suffix as they are (never skipped); no repeats. Returns the
/// workloads and those left out (no family runs them there).
pub fn with_precisions(
    workloads: &[Workload],
    dtypes: &[DType],
    device: DeviceKind,
) -> (Vec<Workload>, Vec<Workload>) {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    for w in workloads {
        let expand = w.dtype() == DType::F32;
        let each: Vec<Workload> = if expand {
            dtypes.iter().map(|&d| w.with_dtype(d)).collect()
        } else {
            vec![*w]
        };
        for wd in each {
            // Only the types added here are skipped: a suffix the caller wrote is kept (and
            // refused later, with its reason, if nothing runs it).
            let added = expand && wd.dtype() != DType::F32;
            if added && kernels::registry::check_runs_on(&wd, device).is_err() {
                skipped.push(wd);
            } else if !out.contains(&wd) {
                out.push(wd);
            }
        }
    }
    (out, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_expand() {
        assert_eq!(
            parse_precisions("f32, int8,i8").unwrap(),
            [DType::F32, DType::I8]
        );
        assert_eq!(parse_precisions("auto").unwrap().len(), 3);
        // The names `infer --precision` takes, as it takes them.
        assert_eq!(
            parse_precisions("FP32,BF16").unwrap(),
            [DType::F32, DType::Bf16]
        );
        assert!(parse_precisions("int4")
            .unwrap_err()
            .to_string()
            .contains("'int4'"));
        assert!(parse_precisions(" , ").is_err());
        assert!(parse_precisions("f32,,int8")
            .unwrap_err()
            .to_string()
            .contains("empty item"));
        let ws: Vec<Workload> = [
            "gemm:4x4x4",
            "gemm:2x2x2:i8",
            "attention:1x1x4x4",
            "attention:1x1x4x4:i8",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let (out, skipped) = with_precisions(&ws, &[DType::F32, DType::I8], DeviceKind::Cpu);
        let keys: Vec<String> = out.iter().map(|w| w.key()).collect();
        assert_eq!(
            keys,
            [
                "gemm:4x4x4",
                "gemm:4x4x4:i8",
                "gemm:2x2x2:i8",
                "attention:1x1x4x4",
                "attention:1x1x4x4:i8"
            ]
        );
        // The i8 attention added by the list is skipped; the one written with its suffix is
        // kept, to be refused later with its reason.
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].key(), "attention:1x1x4x4:i8");
    }
}

//! The JSON description of a lookup: what `autokernel lookup --json` prints, and what the C
//! ABI's `autokernel_runtime_lookup` and other bindings return, built in one place.

use kernels::{DType, Workload};
use serde_json::{json, Value};

use crate::{Choice, Runtime};

impl Choice {
    /// The lookup of `w` served by this choice as a JSON object: `workload`, `dtype`,
    /// `device` (as given, e.g. `cpu` or `cuda:0`), `level`, `kernel`, `kernel_version`,
    /// `config`, `fingerprint` (the one `rt` serves), `source` (the record behind it:
    /// `workload`, `fingerprint`, `trial_id`, `median_s`, `distance`, `max_rel_err`,
    /// `fro_rel_err`; `null` for `default`), `rel_err` (the record's stored `max_rel_err`
    /// against the f32 problem, `null` when none is stored), `precisions` (for each element
    /// type a family serves this shape in here: `level`, `kernel`, `median_s` and `rel_err` of
    /// what would serve it), `precision` (`rt`'s policy) and `served_as` (the workload an f32
    /// call of this shape is served as under it).
    pub fn to_json(&self, w: &Workload, rt: &Runtime, device: &str) -> Value {
        let accuracy = self.source.as_ref().and_then(|s| s.accuracy);
        let mut precisions = serde_json::Map::new();
        for d in DType::PRECISIONS {
            let wd = w.with_dtype(d);
            if let Some(c) = rt.peek(&wd) {
                let src = c.source.as_ref();
                precisions.insert(
                    d.name().into(),
                    json!({
                        "level": c.level.as_str(),
                        "kernel": c.kernel.name(),
                        "median_s": src.and_then(|s| s.median_s),
                        "rel_err": src.and_then(|s| s.accuracy).map(|a| a.max_rel_err),
                    }),
                );
            }
        }
        json!({
            "workload": w.key(),
            "dtype": w.dtype(),
            "device": device,
            "level": self.level.as_str(),
            "kernel": self.kernel.name(),
            "kernel_version": self.kernel.version(),
            "config": self.config,
            "fingerprint": rt.fingerprint().id,
            "source": self.source.as_ref().map(|s| json!({
                "workload": s.workload.key(),
                "fingerprint": s.fingerprint_id,
                "trial_id": s.trial_id,
                "median_s": s.median_s,
                "distance": s.distance,
                "max_rel_err": s.accuracy.map(|a| a.max_rel_err),
                "fro_rel_err": s.accuracy.map(|a| a.fro_rel_err),
            })),
            "rel_err": accuracy.map(|a| a.max_rel_err),
            "precisions": precisions,
            "precision": rt.precision().to_string(),
            "served_as": rt.serve_as(&w.with_dtype(DType::F32)).key(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_lookup_has_every_field_and_no_source() {
        let rt = Runtime::defaults_only();
        let w: Workload = "gemm:3x4x5".parse().unwrap();
        let c = rt.lookup(&w).unwrap();
        let j = c.to_json(&w, &rt, "cpu");
        assert_eq!(j["workload"], "gemm:3x4x5");
        assert_eq!(j["dtype"], "f32");
        assert_eq!(j["device"], "cpu");
        assert_eq!(j["level"], "default");
        assert_eq!(j["kernel"], c.kernel.name());
        assert_eq!(j["kernel_version"], c.kernel.version());
        assert_eq!(j["config"], serde_json::to_value(&c.config).unwrap());
        assert_eq!(j["fingerprint"], rt.fingerprint().id.as_str());
        assert!(j["source"].is_null());
        assert!(j["rel_err"].is_null());
        assert_eq!(j["precision"], "f32");
        assert_eq!(j["served_as"], "gemm:3x4x5");
        // f32 and int8 serve this shape on every CPU (their defaults).
        assert_eq!(j["precisions"]["f32"]["level"], "default");
        assert_eq!(j["precisions"]["i8"]["kernel"], "gemm_i8");
        rt.set_precision(crate::PrecisionPolicy::only(DType::I8));
        assert_eq!(c.to_json(&w, &rt, "cpu")["served_as"], "gemm:3x4x5:i8");
    }
}

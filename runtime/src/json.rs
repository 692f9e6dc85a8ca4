//! The JSON description of a lookup: what `autokernel lookup --json` prints, and what the C
//! ABI's `autokernel_runtime_lookup` and other bindings return, built in one place.

use kernels::{DType, Workload};
use serde_json::{json, Value};

use crate::{Choice, MedianFrom, Runtime, RuntimeError};

impl Runtime {
    /// What a call of `w` runs, as a JSON object: `workload` (`w`, as asked), `dtype` (the
    /// element type it is served in), `device` (as given, e.g. `cpu` or `cuda:0`), `level`,
    /// `kernel`, `kernel_version`, `config`, `fingerprint` (the one this runtime serves),
    /// `source` (the record behind it: `workload`, `fingerprint`, `trial_id`, `median_s`,
    /// `median_from` (`side_by_side`, `decision` or `search`: [`MedianFrom`]), `distance`,
    /// `max_rel_err`, `fro_rel_err`; `null` for `default`), `rel_err` (the
    /// record's stored `max_rel_err` against the f32 problem, `null` when none is stored),
    /// `precisions` (for each element type a family serves this shape in here: `level`,
    /// `kernel`, `median_s`, `median_from` and `rel_err` of what would serve it), `precision`
    /// (the policy)
    /// `served_as` (the workload the call is served as under it: [`Runtime::serve_as`]) and
    /// `not_served` (why the database's record of `served_as` on this machine is not served,
    /// e.g. one of an older kernel version to re-tune: [`Runtime::skipped`]; `null` when none
    /// was skipped). One description for `autokernel lookup --json`, the C ABI and Python.
    pub fn lookup_json(&self, w: &Workload, device: &str) -> Result<Value, RuntimeError> {
        let served = self.serve_as(w);
        let choice = self.lookup(&served)?;
        let mut v = choice.to_json(w, &served, self, device);
        let key = served.key();
        let skipped = self.skipped().into_iter().find(|s| s.workload == key);
        v["not_served"] = skipped.map_or(Value::Null, |s| s.reason.into());
        Ok(v)
    }
}

impl Choice {
    /// [`Runtime::lookup_json`] of `w`, served as `served` by this choice.
    fn to_json(&self, w: &Workload, served: &Workload, rt: &Runtime, device: &str) -> Value {
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
                        "median_from": src.and_then(|s| s.median_from).map(MedianFrom::as_str),
                        "rel_err": src.and_then(|s| s.accuracy).map(|a| a.max_rel_err),
                    }),
                );
            }
        }
        json!({
            "workload": w.key(),
            "dtype": served.dtype(),
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
                "median_from": s.median_from.map(MedianFrom::as_str),
                "distance": s.distance,
                "max_rel_err": s.accuracy.map(|a| a.max_rel_err),
                "fro_rel_err": s.accuracy.map(|a| a.fro_rel_err),
            })),
            "rel_err": accuracy.map(|a| a.max_rel_err),
            "precisions": precisions,
            "precision": rt.precision().to_string(),
            "served_as": served.key(),
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
        let j = rt.lookup_json(&w, "cpu").unwrap();
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
        assert!(j["not_served"].is_null());
        // f32 and int8 serve this shape on every CPU (their defaults).
        assert_eq!(j["precisions"]["f32"]["level"], "default");
        assert_eq!(j["precisions"]["i8"]["kernel"], "gemm_i8");
        // Under an int8 policy the call is described as asked, served in int8.
        rt.set_precision(crate::PrecisionPolicy::only(DType::I8));
        let j = rt.lookup_json(&w, "cpu").unwrap();
        assert_eq!(
            (&j["workload"], &j["served_as"], &j["dtype"]),
            (&"gemm:3x4x5".into(), &"gemm:3x4x5:i8".into(), &"i8".into())
        );
        assert_eq!(j["kernel"], "gemm_i8");
    }
}

//! The JSON description of a lookup: what `autokernel lookup --json` prints, and what the C
//! ABI's `autokernel_runtime_lookup` and other bindings return, built in one place.

use kernels::Workload;
use serde_json::{json, Value};

use crate::{Choice, Runtime};

impl Choice {
    /// The lookup of `w` served by this choice as a JSON object: `workload`, `dtype`,
    /// `device` (as given, e.g. `cpu` or `cuda:0`), `level`, `kernel`, `kernel_version`,
    /// `config`, `fingerprint` (the one `rt` serves) and `source` (the record behind it:
    /// `workload`, `fingerprint`, `trial_id`, `median_s`, `distance`; `null` for `default`).
    pub fn to_json(&self, w: &Workload, rt: &Runtime, device: &str) -> Value {
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
            })),
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
    }
}

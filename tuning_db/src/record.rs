//! One trial as stored: who, what, which variant, and how it went.

use std::time::{SystemTime, UNIX_EPOCH};

use kernels::{Accuracy, Config, Measurement, Status, Workload};
use serde::{Deserialize, Serialize};

/// One row of the `trials` table: a config of a kernel family tried on a workload on a
/// machine, with its outcome. Failures are records too (`status != Ok`, `message` says why).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Row id, `None` until inserted. Ids grow with insertion order.
    pub id: Option<i64>,
    /// [`HardwareFingerprint::id`](kernels::HardwareFingerprint::id) of the machine.
    pub fingerprint_id: String,
    /// The exact problem measured, stored as its key ([`Workload::key`]: `gemm:128x768x768`).
    pub workload: Workload,
    /// Kernel family name ([`Kernel::name`](kernels::Kernel::name)).
    pub kernel: String,
    /// [`Kernel::version`](kernels::Kernel::version) when the trial ran; a record read back
    /// carries the family's current version where its config was upgraded on reading
    /// (`kernels::registry::upgrade_record`).
    pub kernel_version: u32,
    /// The knob values tried, stored as compact JSON with sorted keys. A record read back
    /// from a file may carry an older version's config upgraded to the family's current
    /// version ([`kernels::registry::upgrade_record`]), with `kernel_version` to match.
    pub config: Config,
    /// How the trial ended; only [`Status::Ok`] records are timed and can be served.
    pub status: Status,
    /// Why it failed; `None` for `ok` records.
    pub message: Option<String>,
    /// The timing; present exactly when `status` is `ok`.
    pub measurement: Option<Measurement>,
    /// GFLOP/s at the median, when timed.
    pub gflops: Option<f64>,
    /// Its output's error against the exact result of the f32 problem, measured when it was
    /// verified (schema v4; `None` for older records and failures).
    #[serde(default)]
    pub accuracy: Option<Accuracy>,
    /// When the trial was recorded, RFC 3339 UTC (`2025-01-31T12:00:00Z`).
    pub created_at: String,
    /// Version of the tool that recorded it (the CLI passes its `CARGO_PKG_VERSION`).
    pub tool_version: String,
}

impl Record {
    /// A verified, timed trial, stamped now; GFLOP/s is computed from the workload.
    pub fn ok(
        fingerprint_id: impl Into<String>,
        workload: Workload,
        kernel: impl Into<String>,
        kernel_version: u32,
        config: Config,
        measurement: Measurement,
        tool_version: impl Into<String>,
    ) -> Record {
        let gflops = (measurement.median_s > 0.0).then(|| measurement.gflops(workload.flops()));
        Record {
            id: None,
            fingerprint_id: fingerprint_id.into(),
            workload,
            kernel: kernel.into(),
            kernel_version,
            config,
            status: Status::Ok,
            message: None,
            measurement: Some(measurement),
            gflops,
            accuracy: None,
            created_at: now_rfc3339(),
            tool_version: tool_version.into(),
        }
    }

    /// A failed trial (`status` must not be [`Status::Ok`]; `insert` refuses that), stamped now.
    #[allow(clippy::too_many_arguments)]
    pub fn failed(
        fingerprint_id: impl Into<String>,
        workload: Workload,
        kernel: impl Into<String>,
        kernel_version: u32,
        config: Config,
        status: Status,
        message: impl Into<String>,
        tool_version: impl Into<String>,
    ) -> Record {
        Record {
            id: None,
            fingerprint_id: fingerprint_id.into(),
            workload,
            kernel: kernel.into(),
            kernel_version,
            config,
            status,
            message: Some(message.into()),
            measurement: None,
            gflops: None,
            accuracy: None,
            created_at: now_rfc3339(),
            tool_version: tool_version.into(),
        }
    }

    /// The record with its measured accuracy.
    pub fn with_accuracy(mut self, accuracy: Option<Accuracy>) -> Record {
        self.accuracy = accuracy;
        self
    }

    /// The median time in seconds, for timed records.
    pub fn median_s(&self) -> Option<f64> {
        self.measurement.as_ref().map(|m| m.median_s)
    }
}

/// Counts over a whole database, for `autokernel db stats` and friends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Rows in `trials`.
    pub records: u64,
    /// Rows with `status = 'ok'`.
    pub ok: u64,
    /// Rows with any other status.
    pub failures: u64,
    /// Rows in `fingerprints`.
    pub fingerprints: u64,
    /// Distinct workload keys in `trials`.
    pub workloads: u64,
}

/// Now, as RFC 3339 UTC with second precision.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// `t` as RFC 3339 UTC (`YYYY-MM-DDTHH:MM:SSZ`); times before 1970 print as the epoch.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> String {
        rfc3339(UNIX_EPOCH + Duration::from_secs(secs))
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(951_868_799), "2000-02-29T23:59:59Z");
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH - Duration::from_secs(5)), at(0));
        assert_eq!(now_rfc3339().len(), 20);
    }

    #[test]
    fn constructors_fill_the_derived_fields() {
        let w = Workload::gemm(10, 10, 10).unwrap();
        let m = Measurement::from_samples(vec![1e-6, 2e-6, 3e-6]);
        let r = Record::ok("fp", w, "k", 3, Config::default(), m, "9.9.9");
        assert_eq!(r.status, Status::Ok);
        assert_eq!(r.median_s(), Some(2e-6));
        assert!((r.gflops.unwrap() - 2000.0 / 2e-6 / 1e9).abs() < 1e-9);
        assert!(r.created_at.ends_with('Z'));
        let f = Record::failed(
            "fp",
            w,
            "k",
            3,
            Config::default(),
            Status::Crashed,
            "SIGSEGV",
            "9.9.9",
        );
        assert_eq!(f.measurement, None);
        assert_eq!(f.gflops, None);
        assert_eq!(f.message.as_deref(), Some("SIGSEGV"));
    }
}

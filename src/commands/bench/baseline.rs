//! The baseline file: one `bench` run kept as JSON, to compare later runs with.
//!
//! ```json
//! {
//!   "format": "autokernel-bench-baseline",
//!   "format_version": 1,
//!   "tool_version": "0.1.0",
//!   "created_at": "2026-11-22T14:03:12Z",
//!   "fingerprint": { "id": "…", "brand": "…", "cores": 2, … },
//!   "protocol": "thorough",
//!   "db": "tuning.db",
//!   "workloads": [
//!     { "workload": "gemm:128x768x768", "level": "exact",
//!       "kernel": "gemm_packed", "config": {"kc": 256, …},
//!       "tuned":   { "median_s": 1.1e-3, "spread": 0.01, "gflops": 171.3,
//!                    "samples": [ … ], "round_sizes": [11, 14, 11] },
//!       "default_kernel": "gemm_packed", "default_config": { … },
//!       "default": { "median_s": 1.4e-3, "spread": 0.02, "gflops": 134.8, "samples": [ … ] } }
//!   ]
//! }
//! ```
//!
//! `samples` are seconds per call, every sample the protocol took, in order; a run measures
//! each workload in several rounds and `round_sizes` says how many samples each round took
//! (absent: one round). `median_s` and `spread` (MAD ÷ median) are of all samples. A reader refuses
//! files whose `format` is not ours and files of a newer `format_version`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use kernels::{Config, HardwareFingerprint, Measurement, Workload};
use serde::{Deserialize, Serialize};

/// The `format` field of every baseline file.
pub const FORMAT: &str = "autokernel-bench-baseline";
/// The `format_version` this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// One `bench` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub format: String,
    pub format_version: u32,
    pub tool_version: String,
    /// RFC 3339 UTC.
    pub created_at: String,
    pub fingerprint: HardwareFingerprint,
    /// `thorough` or `quick` (see `runner::Protocol`).
    pub protocol: String,
    /// The tuning database the winners came from, as given on the command line.
    pub db: String,
    pub workloads: Vec<WorkloadResult>,
}

/// The runtime's choice and the kernel default for one workload, both timed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadResult {
    pub workload: String,
    /// `exact` (a tuned record served it) or `default` (nothing tuned).
    pub level: String,
    pub kernel: String,
    pub config: Config,
    pub tuned: Timing,
    pub default_kernel: String,
    pub default_config: Config,
    pub default: Timing,
}

impl WorkloadResult {
    /// Tuned vs default: how many times faster the runtime's choice is.
    pub fn speedup_vs_default(&self) -> f64 {
        self.default.median_s / self.tuned.median_s
    }
}

/// The measurements of one variant over all rounds: every sample, pooled in round order, and
/// the statistics of the pool (GFLOP/s at the median).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub median_s: f64,
    pub spread: f64,
    pub gflops: f64,
    pub samples: Vec<f64>,
    /// How many of `samples` each round took, in order (absent: one round).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round_sizes: Vec<usize>,
}

impl Timing {
    /// Pools the rounds' measurements (at least one).
    pub fn new(rounds: Vec<Measurement>, w: &Workload) -> Timing {
        let round_sizes: Vec<usize> = rounds.iter().map(|m| m.samples.len()).collect();
        let pooled =
            Measurement::from_samples(rounds.into_iter().flat_map(|m| m.samples).collect());
        Timing {
            median_s: pooled.median_s,
            spread: pooled.spread,
            gflops: pooled.gflops(w.flops()),
            samples: pooled.samples,
            round_sizes,
        }
    }

    /// The samples split by round.
    pub fn rounds(&self) -> Vec<&[f64]> {
        if self.round_sizes.is_empty() {
            return vec![&self.samples];
        }
        let mut rest = self.samples.as_slice();
        self.round_sizes
            .iter()
            .map(|&n| {
                let (round, tail) = rest.split_at(n);
                rest = tail;
                round
            })
            .collect()
    }

    /// What makes the timing unusable, if anything.
    fn problem(&self) -> Option<String> {
        let in_rounds: usize = self.round_sizes.iter().sum();
        if self.samples.is_empty() {
            Some("has no samples".into())
        } else if let Some(s) = self.samples.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            Some(format!("has a sample of {s} s"))
        } else if !(self.median_s.is_finite() && self.median_s > 0.0) {
            Some(format!("has a median of {} s", self.median_s))
        } else if self.round_sizes.contains(&0) {
            Some("has an empty round".into())
        } else if !self.round_sizes.is_empty() && in_rounds != self.samples.len() {
            Some(format!(
                "has rounds of {in_rounds} samples in all but {} samples",
                self.samples.len()
            ))
        } else {
            None
        }
    }
}

impl Baseline {
    /// The result for workload `key`, if this run measured it.
    pub fn get(&self, key: &str) -> Option<&WorkloadResult> {
        self.workloads.iter().find(|r| r.workload == key)
    }

    /// `created_at` as a file-name stamp: `20261122T140312Z`.
    pub fn stamp(&self) -> String {
        self.created_at.replace(['-', ':'], "")
    }

    /// Reads and checks a baseline file; the error names the file and the problem.
    pub fn load(path: &Path) -> anyhow::Result<Baseline> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading baseline {}", path.display()))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not an autokernel bench baseline", path.display()))?;
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            bail!(
                "{} is not an autokernel bench baseline (no \"format\": \"{FORMAT}\")",
                path.display()
            );
        }
        let version = value.get("format_version").and_then(|v| v.as_u64());
        match version {
            Some(v) if v <= FORMAT_VERSION as u64 => {}
            Some(v) => bail!(
                "{} is a baseline of format version {v}, written by a newer autokernel; this one reads up to {FORMAT_VERSION}",
                path.display()
            ),
            None => bail!("{} has no valid \"format_version\"", path.display()),
        }
        let b: Baseline = serde_json::from_value(value)
            .with_context(|| format!("{} is a damaged baseline", path.display()))?;
        for (i, r) in b.workloads.iter().enumerate() {
            r.workload
                .parse::<Workload>()
                .with_context(|| format!("{}: bad workload", path.display()))?;
            if b.workloads[..i].iter().any(|o| o.workload == r.workload) {
                bail!("{}: lists {} twice", path.display(), r.workload);
            }
            for (what, t) in [("tuned", &r.tuned), ("default", &r.default)] {
                if let Some(why) = t.problem() {
                    bail!(
                        "{}: the {what} timing of {} {why}",
                        path.display(),
                        r.workload
                    );
                }
            }
        }
        Ok(b)
    }

    /// Writes the file (creating its directory), pretty-printed.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating directory {}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(self).context("serialising the baseline")?;
        // Never over an existing file (checked up front too; this closes the race).
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| format!("creating baseline {}", path.display()))?;
        std::io::Write::write_all(&mut f, (text + "\n").as_bytes())
            .with_context(|| format!("writing baseline {}", path.display()))
    }
}

/// `<results>/<fingerprint id>`: where this machine's baselines and reports live.
pub fn fingerprint_dir(results: &Path, hw: &HardwareFingerprint) -> PathBuf {
    results.join(&hw.id)
}

/// Every baseline of fingerprint `hw` in `dir`, oldest first. Files that are not baselines
/// (other results live there too) are skipped; a damaged baseline is reported and skipped.
pub fn find_all(dir: &Path, hw: &HardwareFingerprint) -> Vec<(PathBuf, Baseline)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, Baseline)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.is_file())
        .filter_map(|p| {
            // A file named as `--save-baseline` names them is reported when it does not load;
            // other JSON files are someone else's.
            let named = p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("baseline-"));
            let text = std::fs::read_to_string(&p).ok();
            if !named && !text.is_some_and(|t| t.contains(FORMAT)) {
                return None;
            }
            match Baseline::load(&p) {
                Ok(b) if b.fingerprint.id == hw.id => Some((p, b)),
                Ok(_) => None,
                Err(e) => {
                    eprintln!("warning: skipping {}", crate::error_line(&e));
                    None
                }
            }
        })
        .collect();
    found.sort_by(|a, b| (&a.1.created_at, &a.0).cmp(&(&b.1.created_at, &b.0)));
    found
}

/// Where `--save-baseline [FILE|DIR]` writes: a file as given; inside a directory (one that
/// exists, or a path ending in `/`) or, with no value, inside `<results>/<fingerprint>/`, as
/// `baseline-<created_at stamp>.json`.
pub fn save_path(arg: Option<&Path>, results: &Path, b: &Baseline) -> PathBuf {
    let name = format!("baseline-{}.json", b.stamp());
    match arg {
        Some(p) if !names_dir(p) => p.to_path_buf(),
        _ => save_dir(arg, results, &b.fingerprint).join(name),
    }
}

/// The directory [`save_path`] writes into for fingerprint `hw`.
pub fn save_dir(arg: Option<&Path>, results: &Path, hw: &HardwareFingerprint) -> PathBuf {
    match arg {
        None => fingerprint_dir(results, hw),
        Some(p) if names_dir(p) => p.to_path_buf(),
        Some(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
    }
}

/// Whether `--save-baseline P` names a directory: one that exists, or a path ending in `/`.
fn names_dir(p: &Path) -> bool {
    p.is_dir() || p.as_os_str().to_string_lossy().ends_with('/')
}

/// Refuses a baseline measured on another fingerprint, unless `allow_foreign`.
pub fn check_fingerprint(
    b: &Baseline,
    path: &Path,
    hw: &HardwareFingerprint,
    allow_foreign: bool,
) -> anyhow::Result<()> {
    if b.fingerprint.id == hw.id || allow_foreign {
        return Ok(());
    }
    bail!(
        "baseline {} was measured on another hardware fingerprint ({}: {}, {} threads) than this run ({}: {}, {} threads); timings do not compare across machines or thread counts — pass --allow-foreign-baseline to compare anyway",
        path.display(),
        b.fingerprint.id,
        b.fingerprint.brand,
        b.fingerprint.cores,
        hw.id,
        hw.brand,
        hw.cores
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(hw: &HardwareFingerprint, created_at: &str) -> Baseline {
        let w: Workload = "gemm:8x8x8".parse().unwrap();
        let t = Timing::new(
            vec![
                Measurement::from_samples(vec![1e-6, 2e-6, 3e-6]),
                Measurement::from_samples(vec![4e-6]),
            ],
            &w,
        );
        Baseline {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            tool_version: "0.1.0".into(),
            created_at: created_at.into(),
            fingerprint: hw.clone(),
            protocol: "quick".into(),
            db: "t.db".into(),
            workloads: vec![WorkloadResult {
                workload: w.key(),
                level: "default".into(),
                kernel: "gemm_direct".into(),
                config: Config::default(),
                tuned: t.clone(),
                default_kernel: "gemm_direct".into(),
                default_config: Config::default(),
                default: t,
            }],
        }
    }

    #[test]
    fn round_trips_and_is_found_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let hw = HardwareFingerprint::current();
        let newer = sample(hw, "2026-01-02T00:00:00Z");
        let older = sample(hw, "2026-01-01T00:00:00Z");
        let foreign = sample(&hw.with_cores(hw.cores + 7), "2026-01-03T00:00:00Z");
        for b in [&newer, &older, &foreign] {
            let p = save_path(Some(dir.path()), Path::new("unused"), b);
            assert!(p.starts_with(dir.path()));
            b.save(&p).unwrap();
        }
        std::fs::write(dir.path().join("gemm_peers.json"), "{\"rows\": []}").unwrap();
        let p = dir.path().join("baseline-20260102T000000Z.json");
        let loaded = Baseline::load(&p).unwrap();
        // serde_json parses floats to within an ulp, not always exactly: compare loosely.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        assert_eq!(
            (&loaded.created_at, &loaded.fingerprint, &loaded.protocol),
            (&newer.created_at, &newer.fingerprint, &newer.protocol)
        );
        let t = &loaded.workloads[0].tuned;
        let rounds = t.rounds();
        assert_eq!(rounds.iter().map(|r| r.len()).collect::<Vec<_>>(), [3, 1]);
        for (got, want) in rounds.concat().iter().zip([1e-6, 2e-6, 3e-6, 4e-6]) {
            assert!(close(*got, want), "{got} vs {want}");
        }
        assert!(close(t.median_s, 2.5e-6) && close(t.gflops, newer.workloads[0].tuned.gflops));
        let found = find_all(dir.path(), hw);
        let dates: Vec<&str> = found.iter().map(|f| f.1.created_at.as_str()).collect();
        assert_eq!(dates, ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]);
        assert!(check_fingerprint(&foreign, &p, hw, false)
            .unwrap_err()
            .to_string()
            .contains("--allow-foreign-baseline"));
        assert!(check_fingerprint(&foreign, &p, hw, true).is_ok());
        assert_eq!(
            save_path(None, Path::new("br"), &newer),
            Path::new("br")
                .join(&hw.id)
                .join("baseline-20260102T000000Z.json")
        );
    }

    #[test]
    fn foreign_newer_and_damaged_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        let hw = HardwareFingerprint::current();
        let mut v = serde_json::to_value(sample(hw, "2026-01-01T00:00:00Z")).unwrap();
        for (edit, needle) in [
            (serde_json::json!({"format": "other"}), "not an autokernel"),
            (serde_json::json!({"format_version": 9}), "newer autokernel"),
            (serde_json::json!({"workloads": 3}), "damaged"),
        ] {
            let mut doc = v.clone();
            for (k, val) in edit.as_object().unwrap() {
                doc[k] = val.clone();
            }
            std::fs::write(&p, doc.to_string()).unwrap();
            let e = format!("{:#}", Baseline::load(&p).unwrap_err());
            assert!(e.contains(needle), "{e}");
        }
        v["workloads"][0]["tuned"]["round_sizes"] = serde_json::json!([3, 2]);
        std::fs::write(&p, v.to_string()).unwrap();
        let e = format!("{:#}", Baseline::load(&p).unwrap_err());
        assert!(e.contains("has rounds of 5 samples in all but"), "{e}");
        v["workloads"][0]["tuned"]["round_sizes"] = serde_json::json!([]);
        v["workloads"][0]["tuned"]["samples"] = serde_json::json!([]);
        std::fs::write(&p, v.to_string()).unwrap();
        let e = format!("{:#}", Baseline::load(&p).unwrap_err());
        assert!(e.contains("has no samples"), "{e}");
        let mut twice = serde_json::to_value(sample(hw, "2026-01-01T00:00:00Z")).unwrap();
        let first = twice["workloads"][0].clone();
        twice["workloads"].as_array_mut().unwrap().push(first);
        std::fs::write(&p, twice.to_string()).unwrap();
        let e = format!("{:#}", Baseline::load(&p).unwrap_err());
        assert!(e.contains("twice"), "{e}");
        std::fs::write(&p, "not json").unwrap();
        assert!(Baseline::load(&p).is_err());
    }
}

//! The in-memory index a [`Runtime`](crate::Runtime) serves from: built once per database
//! load, immutable afterwards except for its cache of resolved misses.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use kernels::{default_for, Config, Executable, HardwareFingerprint, Kernel, Space, Workload};
use tuning_db::{Record, TuningDb};

use crate::hash::FxMap;
use crate::{Choice, Level, RuntimeError, Skipped, Source};

/// Resolved misses kept per index; past this, further misses are resolved on every call
/// (still correct, just slower) so a stream of random shapes cannot grow memory without bound.
pub const MISS_CACHE_CAPACITY: usize = 4096;

/// A tuned shape the nearest-shape level may borrow a config from.
pub(crate) struct Candidate {
    class: String,
    log2: Vec<f64>,
    choice: Arc<Choice>,
    workload: Workload,
}

pub(crate) struct Index {
    pub(crate) generation: u64,
    /// Exact and same-arch choices: the hot path is one probe here.
    pub(crate) hits: FxMap<Workload, Arc<Choice>>,
    candidates: Vec<Candidate>,
    /// Resolved misses (nearest-shape or default), copy-on-write so a repeated miss is a probe
    /// without a lock.
    pub(crate) misses: ArcSwap<FxMap<Workload, Arc<Choice>>>,
    pub(crate) skipped: Vec<Skipped>,
    pub(crate) same_arch_fingerprints: usize,
    pub(crate) loaded_from: Option<PathBuf>,
}

/// Counts describing an index, for `autokernel lookup` and monitoring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexInfo {
    /// Bumped by every [`Runtime::reload`](crate::Runtime::reload).
    pub generation: u64,
    /// Workloads served at level `exact`.
    pub exact: usize,
    /// Workloads served at level `same_arch`.
    pub same_arch: usize,
    /// Other fingerprints of this micro-architecture in the database.
    pub same_arch_fingerprints: usize,
    /// Resolved misses in the cache.
    pub cached_misses: usize,
    /// Records that could not be served.
    pub skipped: usize,
    /// The database file, if any.
    pub path: Option<PathBuf>,
}

impl Index {
    pub(crate) fn empty(generation: u64) -> Index {
        Index {
            generation,
            hits: FxMap::default(),
            candidates: Vec::new(),
            misses: ArcSwap::from_pointee(FxMap::default()),
            skipped: Vec::new(),
            same_arch_fingerprints: 0,
            loaded_from: None,
        }
    }

    /// Reads `path` read-only and indexes, for `hw`: the best verified record of every
    /// workload tuned on `hw` itself (`exact`), then for the workloads left, the best record
    /// of the other fingerprints with the same [`HardwareFingerprint::arch_key`], closest core
    /// count first (`same_arch`). A record is served only if its config passes this machine's
    /// space check and builds.
    pub(crate) fn load(
        path: &Path,
        hw: &HardwareFingerprint,
        generation: u64,
    ) -> Result<Index, RuntimeError> {
        let db = TuningDb::open_read_only(path)?;
        let mut idx = Index::empty(generation);
        idx.loaded_from = Some(path.to_path_buf());
        for rec in db.best_all(&hw.id)? {
            match serve(&rec, hw, Level::Exact) {
                Ok(choice) => {
                    idx.hits.insert(rec.workload, Arc::new(choice));
                }
                Err(reason) => idx.skipped.push(Skipped {
                    workload: rec.workload.key(),
                    reason,
                }),
            }
        }
        // Workloads with ok records on hw that best_all found nothing usable in: say why.
        for (w, _) in db.ok_workloads(&hw.id)? {
            if idx.hits.contains_key(&w) || idx.skipped.iter().any(|s| s.workload == w.key()) {
                continue;
            }
            let reason = db
                .trials(&hw.id, &w)?
                .iter()
                .filter(|r| r.measurement.is_some())
                .min_by(|a, b| {
                    a.median_s()
                        .unwrap_or(0.0)
                        .total_cmp(&b.median_s().unwrap_or(0.0))
                })
                .map_or_else(
                    || "no ok record reads back".to_string(),
                    |r| unusable_reason(r, hw),
                );
            idx.skipped.push(Skipped {
                workload: w.key(),
                reason,
            });
        }
        let key = hw.arch_key();
        let mut siblings: Vec<HardwareFingerprint> = db
            .fingerprints()?
            .into_iter()
            .filter(|f| f.id != hw.id && f.arch_key() == key)
            .collect();
        siblings.sort_by(|a, b| {
            (a.cores.abs_diff(hw.cores), &a.id).cmp(&(b.cores.abs_diff(hw.cores), &b.id))
        });
        idx.same_arch_fingerprints = siblings.len();
        for sib in &siblings {
            for rec in db.best_all(&sib.id)? {
                if idx.hits.contains_key(&rec.workload) {
                    continue;
                }
                if let Ok(choice) = serve(&rec, hw, Level::SameArch) {
                    idx.hits.insert(rec.workload, Arc::new(choice));
                }
            }
        }
        let mut cands: Vec<Candidate> = idx
            .hits
            .iter()
            .map(|(w, c)| Candidate {
                class: shape_class(w),
                log2: log2_dims(w),
                choice: c.clone(),
                workload: *w,
            })
            .collect();
        // Deterministic order for equal distances: exact before same_arch, then by key.
        cands.sort_by(|a, b| {
            (a.choice.level as u8, a.workload.dims())
                .cmp(&(b.choice.level as u8, b.workload.dims()))
        });
        idx.candidates = cands;
        Ok(idx)
    }

    pub(crate) fn info(&self) -> IndexInfo {
        IndexInfo {
            generation: self.generation,
            exact: self
                .hits
                .values()
                .filter(|c| c.level == Level::Exact)
                .count(),
            same_arch: self
                .hits
                .values()
                .filter(|c| c.level == Level::SameArch)
                .count(),
            same_arch_fingerprints: self.same_arch_fingerprints,
            cached_misses: self.misses.load().len(),
            skipped: self.skipped.len(),
            path: self.loaded_from.clone(),
        }
    }

    /// Resolves a workload that has no exact or same-arch record, without caching: the
    /// tuned shape of the same op nearest in log space whose config is valid for `w`
    /// (`nearest_shape`), else the kernel default (`default`).
    pub(crate) fn resolve_miss(
        &self,
        w: &Workload,
        hw: &HardwareFingerprint,
    ) -> Result<Choice, RuntimeError> {
        let target = log2_dims(w);
        let class = shape_class(w);
        let mut ranked: Vec<(f64, usize)> = self
            .candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.class == class)
            .map(|(i, c)| (distance(&target, &c.log2), i))
            .collect();
        // Stable: equal distances keep the index order (exact first).
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut spaces: Vec<(&'static str, Option<Space>)> = Vec::new();
        for (d, i) in ranked {
            let c = &self.candidates[i];
            let kernel = c.choice.kernel;
            let space = match spaces.iter().position(|(n, _)| *n == kernel.name()) {
                Some(p) => &spaces[p].1,
                None => {
                    let s = kernel.supports(w).then(|| space_for(kernel, w, hw));
                    spaces.push((kernel.name(), s));
                    &spaces.last().expect("just pushed").1
                }
            };
            let Some(space) = space else { continue };
            if space.check(&c.choice.config).is_err() {
                continue;
            }
            if let Ok(exe) = kernel.build(w, &c.choice.config) {
                let from = c.choice.source.as_ref();
                return Ok(Choice::new(
                    w,
                    kernel,
                    c.choice.config.clone(),
                    Level::NearestShape,
                    Some(Source {
                        workload: c.workload,
                        fingerprint_id: from.map(|s| s.fingerprint_id.clone()).unwrap_or_default(),
                        trial_id: from.and_then(|s| s.trial_id),
                        median_s: from.and_then(|s| s.median_s),
                        distance: d,
                    }),
                    exe.into(),
                ));
            }
        }
        let (kernel, config) = default_for(w, hw);
        let exe: Arc<dyn Executable> = kernel.prepare(w, &config)?.into();
        Ok(Choice::new(w, kernel, config, Level::Default, None, exe))
    }
}

/// The space a config must fit on this machine: the running CPU's (what `prepare` checks),
/// narrowed to `hw` when the runtime serves another fingerprint (e.g. fewer threads).
fn space_for(kernel: &dyn Kernel, w: &Workload, hw: &HardwareFingerprint) -> Space {
    let current = HardwareFingerprint::current();
    if hw.id == current.id || hw.cores >= current.cores {
        kernel.space(w, current)
    } else {
        kernel.space(w, hw)
    }
}

fn serve(rec: &Record, hw: &HardwareFingerprint, level: Level) -> Result<Choice, String> {
    let kernel = kernels::kernel(&rec.kernel).map_err(|e| e.to_string())?;
    check_config(kernel, &rec.workload, &rec.config, hw)?;
    let exe = kernel
        .build(&rec.workload, &rec.config)
        .map_err(|e| e.to_string())?;
    Ok(Choice::new(
        &rec.workload,
        kernel,
        rec.config.clone(),
        level,
        Some(Source {
            workload: rec.workload,
            fingerprint_id: rec.fingerprint_id.clone(),
            trial_id: rec.id,
            median_s: rec.median_s(),
            distance: 0.0,
        }),
        exe.into(),
    ))
}

fn check_config(
    kernel: &dyn Kernel,
    w: &Workload,
    c: &Config,
    hw: &HardwareFingerprint,
) -> Result<(), String> {
    if !kernel.supports(w) {
        return Err(format!("kernel {} does not support {w}", kernel.name()));
    }
    space_for(kernel, w, hw).check(c).map_err(|e| {
        format!(
            "config {c} does not fit {} v{} on this machine: {e}",
            kernel.name(),
            kernel.version()
        )
    })
}

/// Why a stored ok record is not served.
fn unusable_reason(r: &Record, hw: &HardwareFingerprint) -> String {
    match kernels::kernel(&r.kernel) {
        Err(e) => format!("record {}: {e}", r.id.unwrap_or(-1)),
        Ok(k) if k.version() != r.kernel_version => format!(
            "record {} is of {} v{}, this build has v{}: re-tune",
            r.id.unwrap_or(-1),
            r.kernel,
            r.kernel_version,
            k.version()
        ),
        Ok(k) => match check_config(k, &r.workload, &r.config, hw) {
            Err(e) => format!("record {}: {e}", r.id.unwrap_or(-1)),
            Ok(()) => format!("record {} is not usable", r.id.unwrap_or(-1)),
        },
    }
}

/// What must match for a tuned shape to lend its config: the workload's text form without
/// its dimensions (`gemm:`, `attention::causal`), i.e. the op and any non-shape attributes.
pub(crate) fn shape_class(w: &Workload) -> String {
    let key = w.key();
    let mut parts: Vec<&str> = key.split(':').collect();
    if parts.len() > 1 {
        parts[1] = "";
    }
    parts.join(":")
}

/// log2 of each dimension: the coordinates of the nearest-shape distance.
pub(crate) fn log2_dims(w: &Workload) -> Vec<f64> {
    w.dims().into_iter().map(|d| (d as f64).log2()).collect()
}

/// Euclidean distance between two shapes in log2 space: `sqrt(Σ (log2 a_i − log2 b_i)²)`.
/// Every dimension weighs the same, and a factor of 2 in one dimension is distance 1
/// whatever its size (16→32 is as far as 1024→2048).
pub fn distance(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt()
}

//! The in-memory index a [`Runtime`](crate::Runtime) serves from: built once per database
//! load, immutable afterwards except for its cache of resolved misses.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kernels::{default_for, Config, DeviceKind, Executable, HardwareFingerprint, Kernel, Workload};
use tuning_db::{Record, TuningDb};

use crate::hash::{class, dims4, Key, Table};
use crate::{Choice, Level, MedianFrom, RuntimeError, Skipped, Source};

/// Resolved misses kept per index; past this, further misses are resolved on every call
/// (still correct, just slower) so a stream of random shapes cannot grow memory without bound.
pub const MISS_CACHE_CAPACITY: usize = 4096;

/// Source of [`Index::uid`]: unique over every index of every runtime in the process.
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// A tuned shape the nearest-shape level may borrow a config from.
pub(crate) struct Candidate {
    log2: [f64; 4],
    choice: Arc<Choice>,
    workload: Workload,
}

pub(crate) struct Index {
    /// Unique in the process (never reused), so a thread's cached handle on an index can
    /// be checked against the runtime's current one by comparing two integers.
    pub(crate) uid: u64,
    pub(crate) generation: u64,
    /// Every workload served so far: exact and same-arch choices from the load, then
    /// resolved misses (nearest-shape or default) as they come. The hot path is one probe.
    pub(crate) table: Table,
    exact: usize,
    same_arch: usize,
    /// Tuned shapes by class ([`crate::hash::class`]), exact before same_arch, then by dims.
    candidates: Vec<(u8, Vec<Candidate>)>,
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
        Index::new(generation, HashMap::new(), Vec::new(), 0, None)
    }

    fn new(
        generation: u64,
        hits: HashMap<Workload, Arc<Choice>>,
        mut skipped: Vec<Skipped>,
        same_arch_fingerprints: usize,
        loaded_from: Option<PathBuf>,
    ) -> Index {
        let table = Table::with_capacity(hits.len() + MISS_CACHE_CAPACITY);
        let mut cands: Vec<(u8, Candidate)> = Vec::new();
        let (mut exact, mut same_arch) = (0, 0);
        for (w, c) in hits {
            let Some(key) = Key::of(&w) else {
                // Unreachable for a parsed (validated) workload; refused, not mis-served.
                skipped.push(Skipped {
                    workload: w.key(),
                    reason: "a dimension is too large to index".into(),
                });
                continue;
            };
            match c.level {
                Level::Exact => exact += 1,
                _ => same_arch += 1,
            }
            table.insert(key, c.clone());
            cands.push((
                class(&w),
                Candidate {
                    log2: log2_dims(&w),
                    choice: c,
                    workload: w,
                },
            ));
        }
        // Deterministic order for equal distances: exact before same_arch, then by dims.
        cands.sort_by(|(_, a), (_, b)| {
            (a.choice.level as u8, a.workload.dims())
                .cmp(&(b.choice.level as u8, b.workload.dims()))
        });
        let mut candidates: Vec<(u8, Vec<Candidate>)> = Vec::new();
        for (cl, c) in cands {
            match candidates.iter_mut().find(|(k, _)| *k == cl) {
                Some((_, v)) => v.push(c),
                None => candidates.push((cl, vec![c])),
            }
        }
        Index {
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            generation,
            table,
            exact,
            same_arch,
            candidates,
            skipped,
            same_arch_fingerprints,
            loaded_from,
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
        let mut hits: HashMap<Workload, Arc<Choice>> = HashMap::new();
        let mut skipped = exact_hits(&db, hw, &mut hits)?;
        let siblings = same_arch_siblings(&db, hw)?;
        let unserved = same_arch_hits(&db, hw, &siblings, &mut hits)?;
        let named: HashSet<String> = skipped.iter().map(|s| s.workload.clone()).collect();
        let mut unserved: Vec<Skipped> = unserved
            .into_iter()
            .filter(|(w, s)| !hits.contains_key(w) && !named.contains(&s.workload))
            .map(|(_, s)| s)
            .collect();
        unserved.sort_by(|a, b| a.workload.cmp(&b.workload));
        skipped.extend(unserved);
        Ok(Index::new(
            generation,
            hits,
            skipped,
            siblings.len(),
            Some(path.to_path_buf()),
        ))
    }

    pub(crate) fn info(&self) -> IndexInfo {
        IndexInfo {
            generation: self.generation,
            exact: self.exact,
            same_arch: self.same_arch,
            same_arch_fingerprints: self.same_arch_fingerprints,
            cached_misses: self.cached_misses(),
            skipped: self.skipped.len(),
            path: self.loaded_from.clone(),
        }
    }

    fn cached_misses(&self) -> usize {
        self.table.len().saturating_sub(self.exact + self.same_arch)
    }

    /// Keeps the resolved miss `c` of `key` for later lookups, unless the cache is full;
    /// returns the choice to serve (another thread's, if it stored one first).
    pub(crate) fn cache_miss(&self, key: Key, c: Arc<Choice>) -> Arc<Choice> {
        if self.cached_misses() >= MISS_CACHE_CAPACITY {
            return c;
        }
        match self.table.insert(key, c.clone()) {
            Some(stored) => stored.clone(),
            None => c,
        }
    }

    /// Resolves a workload that has no exact or same-arch record, without caching: the
    /// tuned shape of the same op nearest in log space whose config [`suits`] `w`, is valid
    /// for it and, when `check` is on, runs it at least as fast as the default on first use
    /// ([`crate::probe`]) (`nearest_shape`), else the kernel default (`default`).
    ///
    /// Validity is [`Kernel::config_fits`] (the space check without building the space)
    /// plus a successful build; the nearest candidate is found in one pass, and the rest
    /// are ranked only if it does not fit.
    pub(crate) fn resolve_miss(
        &self,
        w: &Workload,
        hw: &HardwareFingerprint,
        check: bool,
    ) -> Result<Choice, RuntimeError> {
        let Some(borrowed) = self.nearest(w, hw) else {
            return default_choice(w, hw);
        };
        if !check {
            return Ok(borrowed);
        }
        let default = default_choice(w, hw)?;
        // Timed on this machine, so only host executables (a GPU's borrowed config is served
        // by the structural rules alone).
        match (borrowed.executable(), default.executable()) {
            (Some(b), Some(d)) if !crate::probe::borrowed_is_faster(w, b, d) => Ok(default),
            _ => Ok(borrowed),
        }
    }

    /// The nearest tuned shape's config that [`borrow`] accepts for `w`, if any.
    fn nearest(&self, w: &Workload, hw: &HardwareFingerprint) -> Option<Choice> {
        let cl = class(w);
        let cands: &[Candidate] = self
            .candidates
            .iter()
            .find(|(k, _)| *k == cl)
            .map_or(&[], |(_, v)| v.as_slice());
        if cands.is_empty() {
            return None;
        }
        let target = log2_dims(w);
        let dist = |c: &Candidate| distance(&target, &c.log2);
        let threads = default_for(w, hw).ok()?.1.threads();
        // Nearest first (ties: index order, exact before same_arch), by the squared
        // distance: same order, no square root per candidate.
        let mut nearest: Option<(f64, usize)> = None;
        for (j, c) in cands.iter().enumerate() {
            let d2 = squared_distance(&target, &c.log2);
            if nearest.is_none_or(|(best, _)| d2 < best) {
                nearest = Some((d2, j));
            }
        }
        let (_, i) = nearest?;
        if let Some(choice) = borrow(w, &cands[i], dist(&cands[i]), threads, hw) {
            return Some(choice);
        }
        let mut ranked: Vec<(f64, usize)> = cands
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(j, c)| (dist(c), j))
            .collect();
        // Stable: equal distances keep the index order.
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
        ranked
            .into_iter()
            .find_map(|(d, j)| borrow(w, &cands[j], d, threads, hw))
    }
}

/// Adds to `hits` the best servable record of every workload tuned on `hw` itself; returns
/// the workloads with ok records none of which is served, each with the reason (that of its
/// fastest record).
fn exact_hits(
    db: &TuningDb,
    hw: &HardwareFingerprint,
    hits: &mut HashMap<Workload, Arc<Choice>>,
) -> Result<Vec<Skipped>, RuntimeError> {
    let mut skipped: Vec<Skipped> = Vec::new();
    let evidence = Evidence::of(db, hw)?;
    let (best, unreadable) = db.best_all_reporting(&hw.id)?;
    let medians = Medians::of(db, &hw.id)?;
    // A faster row that no longer reads back (its config damaged in the file): said, while
    // the next one serves.
    skipped.extend(unreadable.into_iter().map(|u| Skipped {
        workload: u.workload,
        reason: format!("record {} does not read back: {}", u.id, u.reason),
    }));
    for rec in best {
        match evidence
            .vouch(db, &rec)?
            .and_then(|()| serve(&rec, hw, Level::Exact, &medians))
        {
            Ok(choice) => {
                hits.insert(rec.workload, Arc::new(choice));
            }
            Err(reason) => skipped.push(Skipped {
                workload: rec.workload.key(),
                reason,
            }),
        }
    }
    // Workloads with ok records on hw that best_all found nothing usable in: say why.
    let named: HashSet<String> = skipped.iter().map(|s| s.workload.clone()).collect();
    for (w, _) in db.ok_workloads(&hw.id)? {
        if hits.contains_key(&w) || named.contains(&w.key()) {
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
        skipped.push(Skipped {
            workload: w.key(),
            reason,
        });
    }
    Ok(skipped)
}

/// The other fingerprints in `db` of `hw`'s micro-architecture and ISA, closest core count
/// first.
fn same_arch_siblings(
    db: &TuningDb,
    hw: &HardwareFingerprint,
) -> Result<Vec<HardwareFingerprint>, RuntimeError> {
    let key = hw.arch_key();
    let mut siblings: Vec<HardwareFingerprint> = db
        .fingerprints()?
        .into_iter()
        .filter(|f| f.id != hw.id && f.arch_key() == key)
        .collect();
    siblings.sort_by(|a, b| {
        (a.cores.abs_diff(hw.cores), &a.id).cmp(&(b.cores.abs_diff(hw.cores), &b.id))
    });
    Ok(siblings)
}

/// Adds to `hits` the best servable record of `siblings` (in order) for each workload not
/// in it yet. A sibling's record that does not fit here (a thread count above this
/// machine's cores, say) is skipped like an exact one: returned by workload, the closest
/// sibling's reason.
fn same_arch_hits(
    db: &TuningDb,
    hw: &HardwareFingerprint,
    siblings: &[HardwareFingerprint],
    hits: &mut HashMap<Workload, Arc<Choice>>,
) -> Result<HashMap<Workload, Skipped>, RuntimeError> {
    let mut unserved: HashMap<Workload, Skipped> = HashMap::new();
    for sib in siblings {
        let evidence = Evidence::of(db, sib)?;
        let medians = Medians::of(db, &sib.id)?;
        for rec in db.best_all(&sib.id)? {
            if hits.contains_key(&rec.workload) {
                continue;
            }
            match evidence
                .vouch(db, &rec)?
                .and_then(|()| serve(&rec, hw, Level::SameArch, &medians))
            {
                Ok(choice) => {
                    hits.insert(rec.workload, Arc::new(choice));
                }
                Err(reason) => {
                    unserved.entry(rec.workload).or_insert_with(|| Skipped {
                        workload: rec.workload.key(),
                        reason: format!("same-arch record of fingerprint {}: {reason}", sib.id),
                    });
                }
            }
        }
    }
    Ok(unserved)
}

/// What stands behind the best servable record of a workload on one fingerprint when it is
/// not the one the tuner chose: the decisions in force, and each workload's fastest record
/// of any kind (stale versions and configs that no longer fit included).
struct Evidence<'h> {
    hw: &'h HardwareFingerprint,
    winners: HashSet<i64>,
    fastest: HashMap<Workload, f64>,
}

impl<'h> Evidence<'h> {
    fn of(db: &TuningDb, hw: &'h HardwareFingerprint) -> Result<Evidence<'h>, RuntimeError> {
        Ok(Evidence {
            hw,
            winners: db.winner_ids(&hw.id)?,
            fastest: db.fastest_medians(&hw.id)?,
        })
    }

    /// Whether `rec`, the fastest servable record of its workload on this fingerprint, may be
    /// served: it is the decided winner, or no record of a rival config (a family that runs
    /// here and runs the workload) is faster, or it beat the default config as measured on
    /// the same machine (by any version of its family: the same config), or the default
    /// config failed there (crashed, timed out) and never ran.
    /// A runner-up left standing when the faster records went stale (a family's new version,
    /// a space that changed) and no such comparison exists may be far slower than the
    /// default: the workload is then skipped (listed as to re-tune) and served by the
    /// fallback levels, which never lose to the default.
    fn vouch(&self, db: &TuningDb, rec: &Record) -> Result<Result<(), String>, RuntimeError> {
        let median = rec.median_s().unwrap_or(f64::INFINITY);
        let fastest = self.fastest.get(&rec.workload).copied();
        if rec.id.is_some_and(|id| self.winners.contains(&id))
            || fastest.is_none_or(|f| median <= f)
        {
            return Ok(Ok(()));
        }
        let trials = db.trials(&self.hw.id, &rec.workload)?;
        // Faster records count only if they were this config's rivals: a family that runs
        // here and runs the workload, gone stale or out of its space (a record of another
        // device's family under this fingerprint says nothing about configs here).
        let rival = |r: &&Record| {
            kernels::kernel(&r.kernel)
                .is_ok_and(|k| k.device() == self.hw.device_kind() && k.supports(&r.workload))
        };
        let fastest_rival = trials
            .iter()
            .filter(rival)
            .filter_map(|r| Some((r.median_s()?, r)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let Some((_, first)) = fastest_rival.filter(|(m, _)| *m < median) else {
            return Ok(Ok(()));
        };
        if let Ok((k, c)) = default_for(&rec.workload, self.hw) {
            let runs: Vec<Option<f64>> = trials
                .iter()
                .filter(|r| r.kernel == k.name() && r.config == c)
                .map(|r| r.median_s())
                .collect();
            let best = runs.iter().flatten().copied().reduce(f64::min);
            let failed_only = !runs.is_empty() && best.is_none();
            if failed_only || best.is_some_and(|d| median <= d) {
                return Ok(Ok(()));
            }
        }
        let why = unusable_reason(first, self.hw);
        let hint = if why.contains("re-tune") {
            ""
        } else {
            ": re-tune"
        };
        Ok(Err(format!(
            "{why}; the fastest record left ({} v{}) was never compared with the default{hint}",
            rec.kernel, rec.kernel_version
        )))
    }
}

/// The kernel default for `w` on `hw`, built.
fn default_choice(w: &Workload, hw: &HardwareFingerprint) -> Result<Choice, RuntimeError> {
    let (kernel, config) = default_for(w, hw)?;
    // `prepare` without building the space when the default fits (it always should);
    // otherwise `prepare` itself, for its error.
    let current = fit_hardware(hw);
    let exe = if kernel.supports(w) && kernel.config_fits(w, current, &config) {
        host_exe(kernel, w, &config)?
    } else if kernel.device() == DeviceKind::Cpu {
        Some(kernel.prepare(w, &config)?.into())
    } else {
        kernel
            .space(w, hw)
            .check(&config)
            .map_err(|e| kernels::Error::InvalidConfig {
                kernel: kernel.name().into(),
                config: config.to_json(),
                reason: e.to_string(),
            })?;
        None
    };
    Ok(Choice::new(w, kernel, config, Level::Default, None, exe))
}

/// The host executable of a CPU family's config (unchecked: the callers checked it); `None`
/// for a device family, whose configs are served by lookup and run through a device session.
fn host_exe(
    kernel: &dyn Kernel,
    w: &Workload,
    config: &Config,
) -> Result<Option<Arc<dyn Executable>>, kernels::Error> {
    match kernel.device() {
        DeviceKind::Cpu => Ok(Some(kernel.build(w, config)?.into())),
        _ => Ok(None),
    }
}

/// The farthest (log2 distance, [`distance`]) a tuned shape lends its config: a factor of 4
/// in one dimension, or about 2.5 in each of three. Past it the blocking and the tile choice
/// of the tuned shape say little about the new one (measured: borrowed configs at distance
/// 4–10 ran 3–30× slower than the default; `bench_results/<fingerprint>/nearest_shape.md`).
pub const NEAREST_MAX_DISTANCE: f64 = 2.0;

/// Whether a tuned shape's config `c`, at distance `d`, is expected to beat the default for
/// the new shape: within [`NEAREST_MAX_DISTANCE`], and splitting the work over as many
/// threads as the default does there (`default_threads`). The default's thread count
/// follows the work per thread; a borrowed count does not (a two-thread config of a large
/// shape on a tiny one ran 28× slower than the serial default, a serial config of a small
/// shape on a large one 1.6×), so only the tile and blocking choices are borrowed.
pub(crate) fn suits(c: &Config, d: f64, default_threads: usize) -> bool {
    d <= NEAREST_MAX_DISTANCE && c.threads() == default_threads
}

/// The nearest-shape choice for `w` on `hw` from candidate `c` at distance `d`, if it
/// [`suits`] `w` (whose default runs `threads` threads), fits `w` on this machine
/// ([`fit_hardware`]) and builds.
fn borrow(
    w: &Workload,
    c: &Candidate,
    d: f64,
    threads: usize,
    hw: &HardwareFingerprint,
) -> Option<Choice> {
    let kernel = c.choice.kernel;
    if !kernel.supports(w)
        || !suits(&c.choice.config, d, threads)
        || !kernel.config_fits(w, fit_hardware(hw), &c.choice.config)
    {
        return None;
    }
    let exe = host_exe(kernel, w, &c.choice.config).ok()?;
    let from = c.choice.source.as_ref();
    Some(Choice::new(
        w,
        kernel,
        c.choice.config.clone(),
        Level::NearestShape,
        Some(Source {
            workload: c.workload,
            fingerprint_id: from.map(|s| s.fingerprint_id.clone()).unwrap_or_default(),
            trial_id: from.and_then(|s| s.trial_id),
            median_s: from.and_then(|s| s.median_s),
            median_from: from.and_then(|s| s.median_from),
            accuracy: from.and_then(|s| s.accuracy),
            distance: d,
        }),
        exe,
    ))
}

/// The hardware whose space a config must fit on this machine: the running CPU (what
/// `prepare` checks), or `hw` when the runtime serves another fingerprint with fewer cores,
/// or a GPU.
fn fit_hardware(hw: &HardwareFingerprint) -> &HardwareFingerprint {
    let current = HardwareFingerprint::current();
    if hw.device_kind() != DeviceKind::Cpu {
        return hw;
    }
    if hw.id == current.id || hw.cores >= current.cores {
        current
    } else {
        hw
    }
}

/// The winners' medians of one fingerprint as `auto` compares them, by trial id
/// ([`TuningDb::winner_medians`]).
struct Medians(HashMap<i64, tuning_db::WinnerMedian>);

impl Medians {
    fn of(db: &TuningDb, fingerprint_id: &str) -> Result<Medians, RuntimeError> {
        Ok(Medians(db.winner_medians(fingerprint_id)?))
    }

    /// `rec`'s median and where it was measured: a winner's re-measured one, else its
    /// search median.
    fn of_record(&self, rec: &Record) -> (Option<f64>, Option<MedianFrom>) {
        match rec.id.and_then(|id| self.0.get(&id)) {
            Some(m) if m.side_by_side => (Some(m.median_s), Some(MedianFrom::SideBySide)),
            Some(m) => (Some(m.median_s), Some(MedianFrom::Decision)),
            None => (rec.median_s(), rec.median_s().map(|_| MedianFrom::Search)),
        }
    }
}

/// `rec` as the choice of its workload at `level`. Its median (what `auto` compares across
/// element types) is the one `medians` holds for it (side by side with the shape's other
/// precisions, or its decision's re-measurement), else its search median.
fn serve(
    rec: &Record,
    hw: &HardwareFingerprint,
    level: Level,
    medians: &Medians,
) -> Result<Choice, String> {
    let kernel = servable(rec, hw)?;
    let exe = host_exe(kernel, &rec.workload, &rec.config).map_err(|e| e.to_string())?;
    let (median_s, median_from) = medians.of_record(rec);
    Ok(Choice::new(
        &rec.workload,
        kernel,
        rec.config.clone(),
        level,
        Some(Source {
            workload: rec.workload,
            fingerprint_id: rec.fingerprint_id.clone(),
            trial_id: rec.id,
            median_s,
            median_from,
            accuracy: rec.accuracy,
            distance: 0.0,
        }),
        exe,
    ))
}

/// `rec`'s family, if this build can serve `rec` on this machine: the registry's check
/// ([`kernels::registry::check_record`]) against the hardware its config must fit here
/// ([`fit_hardware`]); otherwise why not.
fn servable(rec: &Record, hw: &HardwareFingerprint) -> Result<&'static dyn Kernel, String> {
    kernels::registry::check_record(
        &rec.kernel,
        rec.kernel_version,
        &rec.workload,
        &rec.config,
        fit_hardware(hw),
    )
    .map_err(|e| format!("record {}: {e}", rec.id.unwrap_or(-1)))
}

/// Why a stored ok record is not served.
fn unusable_reason(r: &Record, hw: &HardwareFingerprint) -> String {
    match servable(r, hw) {
        Err(e) => e,
        Ok(_) => format!("record {} is not usable", r.id.unwrap_or(-1)),
    }
}

/// log2 of each dimension (zeros past the last): the coordinates of the nearest-shape
/// distance.
pub(crate) fn log2_dims(w: &Workload) -> [f64; 4] {
    let (dims, n) = dims4(w);
    let mut out = [0.0; 4];
    for (o, &d) in out.iter_mut().zip(&dims[..n]) {
        *o = (d as f64).log2();
    }
    out
}

fn squared_distance(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
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

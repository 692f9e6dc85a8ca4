//! Deterministic sharding of a tuning job: which workloads shard `I` of `N` tunes.
//!
//! ```
//! use kernels::Workload;
//! use search::shard::{assign, ShardSpec};
//!
//! let list: Vec<Workload> = ["gemm:128x768x768", "gemm:128x3072x768", "gemm:1x3072x768"]
//!     .iter()
//!     .map(|s| s.parse())
//!     .collect::<Result<_, _>>()?;
//! let spec: ShardSpec = "1/2".parse()?;
//! let mine = spec.select(&list, 32);
//! let shards = assign(&list, 2, 32);
//! assert_eq!(mine, shards[1]);
//! assert_eq!(shards.iter().map(Vec::len).sum::<usize>(), list.len());
//! assert_eq!(
//!     spec.db_path("out/tuning.db".as_ref()),
//!     std::path::PathBuf::from("out/tuning.shard-1-of-2.db")
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## The shard contract
//!
//! - A shard is written `I/N`: shard `I` (0-based, `0 ≤ I < N`) of `N`. `0/1` is the whole list.
//! - Every process of a job is given the **same workload list, budget and `N`**; each computes
//!   the same [`assign`]ment and tunes its own part. The shards partition the (de-duplicated)
//!   list exactly: every workload is tuned by exactly one shard, whatever `N` (shards beyond
//!   the number of workloads are empty).
//! - The assignment depends only on the *set* of workloads, the budget and `N` — not on the
//!   list's order, the machine or the time — so a requeued task gets the same part again.
//! - Shard `I/N` of a job whose database is `PATH` writes `PATH` with `.shard-I-of-N` inserted
//!   before the extension ([`ShardSpec::db_path`]): `tuning.db` → `tuning.shard-1-of-4.db`.
//!   One file per shard means no two tasks ever write the same SQLite file, and a task that is
//!   preempted and requeued finds its own trials there and resumes.
//!
//! ## From the environment ([`ShardSpec::from_vars`])
//!
//! When no shard is given explicitly, a batch system's variables name it:
//!
//! | variables                                                | shard                           |
//! |----------------------------------------------------------|---------------------------------|
//! | Slurm job array: `SLURM_ARRAY_TASK_ID`, `SLURM_ARRAY_TASK_COUNT`, `SLURM_ARRAY_TASK_MIN`, `SLURM_ARRAY_TASK_STEP` (both optional) | `(ID − MIN) / STEP` of `COUNT` |
//! | Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` + `AUTOKERNEL_SHARD_COUNT` (set it to the Job's `completions`) | `JOB_COMPLETION_INDEX` of `AUTOKERNEL_SHARD_COUNT` |
//!
//! Slurm's array ids are whatever `sbatch --array` said (`0-3`, `1-4`, `0-14:2` all work): the
//! index is the task's rank in the array, so the array must be one range (a list such as
//! `--array=1,5,9` is refused). Kubernetes does not tell a pod the Job's completion count,
//! hence `AUTOKERNEL_SHARD_COUNT`; a pod with `JOB_COMPLETION_INDEX` but no count is an error
//! rather than silently tuning the whole list in every pod. Slurm's variables win when both
//! kinds are present.
//!
//! ## Balance ([`assign`])
//!
//! Tuning time differs by orders of magnitude between workloads (a `1×768×768` GEMV is done in
//! seconds, a `512×4096×4096` GEMM takes minutes), so workloads are dealt by estimated cost, not
//! round robin: longest processing time first (LPT) — the most expensive workload goes to the
//! least loaded shard, ties broken by workload key and by shard index. Its makespan is within
//! `4/3` of the best possible one, and never more than the mean load plus the largest single
//! cost. The cost ([`estimated_cost_s`]) is a coarse model of the tuning loop's time; only its
//! ratios matter.

use std::cmp::Ordering;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use kernels::Workload;

/// Environment variable giving the shard count to a Kubernetes Indexed Job's pods (set it to
/// the Job's `completions`).
pub const SHARD_COUNT_VAR: &str = "AUTOKERNEL_SHARD_COUNT";

/// Largest accepted shard count (a typo guard: each shard is a batch task).
pub const MAX_SHARDS: usize = 1 << 20;

/// Why a shard could not be determined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// `--shard` text that is not `I/N` with `0 ≤ I < N`.
    #[error("bad shard '{input}': {reason} (expected I/N, shard I of N counted from 0, e.g. 0/4 .. 3/4)")]
    Parse {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Environment variables that do not describe a shard.
    #[error("{0}")]
    Env(String),
}

/// Where a shard came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardSource {
    /// `--shard I/N` on the command line.
    Flag,
    /// A Slurm job array task.
    Slurm,
    /// A Kubernetes Indexed Job pod.
    Kubernetes,
}

impl ShardSource {
    /// `flag`, `slurm` or `kubernetes`.
    pub fn as_str(self) -> &'static str {
        match self {
            ShardSource::Flag => "flag",
            ShardSource::Slurm => "slurm",
            ShardSource::Kubernetes => "kubernetes",
        }
    }
}

impl fmt::Display for ShardSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Shard `index` of `count` (0-based). See the module docs for the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShardSpec {
    index: usize,
    count: usize,
}

impl ShardSpec {
    /// This shard, counted from 0: below [`ShardSpec::count`].
    pub fn index(&self) -> usize {
        self.index
    }

    /// The number of shards the job is split into, from 1 to [`MAX_SHARDS`].
    pub fn count(&self) -> usize {
        self.count
    }

    /// Shard `index` of `count`, checked: `1 ≤ count ≤ MAX_SHARDS`, `index < count`.
    pub fn new(index: usize, count: usize) -> Result<ShardSpec, ShardError> {
        let bad = |reason: String| ShardError::Parse {
            input: format!("{index}/{count}"),
            reason,
        };
        if count == 0 {
            return Err(bad("the shard count must be at least 1".into()));
        }
        if count > MAX_SHARDS {
            return Err(bad(format!("at most {MAX_SHARDS} shards")));
        }
        if index >= count {
            return Err(bad(format!(
                "the index must be in 0..{count}, i.e. 0 to {}",
                count - 1
            )));
        }
        Ok(ShardSpec { index, count })
    }

    /// The whole list: shard 0 of 1.
    pub fn whole() -> ShardSpec {
        ShardSpec { index: 0, count: 1 }
    }

    /// The shard named by this process's environment, if any (see [`ShardSpec::from_vars`]).
    pub fn from_env() -> Result<Option<(ShardSpec, ShardSource)>, ShardError> {
        ShardSpec::from_vars(|name| std::env::var(name).ok())
    }

    /// The shard named by the variables `get` returns: a Slurm array task's, else a Kubernetes
    /// Indexed Job pod's, else `None`. Variables that are present but inconsistent are errors.
    pub fn from_vars(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<(ShardSpec, ShardSource)>, ShardError> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        if let Some(id) = var("SLURM_ARRAY_TASK_ID") {
            return slurm(&id, &var).map(|s| Some((s, ShardSource::Slurm)));
        }
        if let Some(index) = var("JOB_COMPLETION_INDEX") {
            let index = number("JOB_COMPLETION_INDEX", &index)?;
            let Some(count) = var(SHARD_COUNT_VAR) else {
                return Err(ShardError::Env(format!(
                    "JOB_COMPLETION_INDEX={index} is set (a Kubernetes Indexed Job pod) but \
                     {SHARD_COUNT_VAR} is not: set it to the Job's completions, or pass \
                     --shard I/N (--shard 0/1 tunes the whole list)"
                )));
            };
            let count = number(SHARD_COUNT_VAR, &count)?;
            let spec = ShardSpec::new(index, count).map_err(|_| {
                ShardError::Env(format!(
                    "JOB_COMPLETION_INDEX={index} is not below {SHARD_COUNT_VAR}={count}: \
                     the Job's completions and {SHARD_COUNT_VAR} must be equal and at least 1"
                ))
            })?;
            return Ok(Some((spec, ShardSource::Kubernetes)));
        }
        Ok(None)
    }

    /// This shard's workloads, in the order of `workloads` (see [`assign`]; duplicates count
    /// once).
    pub fn select(&self, workloads: &[Workload], budget: usize) -> Vec<Workload> {
        assign(workloads, self.count, budget).swap_remove(self.index)
    }

    /// The database this shard writes when the job's database is `base`: `.shard-I-of-N`
    /// inserted before the extension (`tuning.db` → `tuning.shard-1-of-4.db`; `db` →
    /// `db.shard-1-of-4`).
    pub fn db_path(&self, base: &Path) -> PathBuf {
        let tag = format!("shard-{}-of-{}", self.index, self.count);
        let stem = base.file_stem().map_or_else(
            || "tuning".to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        let name = match base.extension() {
            Some(ext) => format!("{stem}.{tag}.{}", ext.to_string_lossy()),
            None => format!("{stem}.{tag}"),
        };
        base.with_file_name(name)
    }
}

impl fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for ShardSpec {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<ShardSpec, ShardError> {
        let bad = |reason: &str| ShardError::Parse {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let (i, n) = s.trim().split_once('/').ok_or_else(|| bad("no '/'"))?;
        let i: usize = i.trim().parse().map_err(|_| bad("I is not a number"))?;
        let n: usize = n.trim().parse().map_err(|_| bad("N is not a number"))?;
        ShardSpec::new(i, n).map_err(|e| match e {
            ShardError::Parse { reason, .. } => bad(&reason),
            other => other,
        })
    }
}

fn number(name: &str, value: &str) -> Result<usize, ShardError> {
    value
        .trim()
        .parse()
        .map_err(|_| ShardError::Env(format!("{name}='{value}' is not a non-negative integer")))
}

/// A Slurm array task's shard: its rank `(ID − MIN) / STEP` in an array of `COUNT` tasks.
fn slurm(id: &str, var: &impl Fn(&str) -> Option<String>) -> Result<ShardSpec, ShardError> {
    let id = number("SLURM_ARRAY_TASK_ID", id)?;
    let Some(count) = var("SLURM_ARRAY_TASK_COUNT") else {
        return Err(ShardError::Env(format!(
            "SLURM_ARRAY_TASK_ID={id} is set but SLURM_ARRAY_TASK_COUNT is not (Slurm older \
             than 14.03?): pass --shard I/N"
        )));
    };
    let count = number("SLURM_ARRAY_TASK_COUNT", &count)?;
    let min = var("SLURM_ARRAY_TASK_MIN")
        .map(|v| number("SLURM_ARRAY_TASK_MIN", &v))
        .transpose()?
        .unwrap_or(0);
    let step = var("SLURM_ARRAY_TASK_STEP")
        .map(|v| number("SLURM_ARRAY_TASK_STEP", &v))
        .transpose()?
        .unwrap_or(1)
        .max(1);
    let irregular = |why: &str| {
        ShardError::Env(format!(
            "Slurm array task {id} (min {min}, step {step}, count {count}): {why}; submit the \
             array as one range (sbatch --array=0-{}) or pass --shard I/N",
            count.saturating_sub(1)
        ))
    };
    if id < min || !(id - min).is_multiple_of(step) {
        return Err(irregular("the task id is not on the array's range"));
    }
    if let Some(max) = var("SLURM_ARRAY_TASK_MAX") {
        let max = number("SLURM_ARRAY_TASK_MAX", &max)?;
        if max < min || (max - min) / step + 1 != count {
            return Err(irregular(
                "the array is not one range (a list such as 1,5,9?)",
            ));
        }
    }
    let index = (id - min) / step;
    if index >= count {
        return Err(irregular("the task's rank is not below the task count"));
    }
    ShardSpec::new(index, count).map_err(|e| ShardError::Env(e.to_string()))
}

/// Speed assumed for a candidate in the estimate, FLOP/s (only ratios matter).
const CANDIDATE_FLOPS_PER_S: f64 = 20e9;
/// Speed of the f64 reference every candidate is checked against, FLOP/s.
const REFERENCE_FLOPS_PER_S: f64 = 1e9;
/// Fixed cost of one workload: the worker's start and set-up, the decision's bookkeeping.
const WORKLOAD_OVERHEAD_S: f64 = 0.5;
/// Fixed cost of one trial: preparing it, the worker round trip, committing the record.
const TRIAL_OVERHEAD_S: f64 = 0.02;
/// Finalists re-measured (interleaved) before the winner is declared, by default.
const FINALISTS: f64 = 3.0;

/// Estimated seconds to tune `w` with `budget` configs: a fixed set-up, the f64 reference
/// once, then for each trial (the budget plus the default config) a verification call, a
/// warm-up call and the quick timing protocol (at least 5 samples of ≥ 2 ms, typically ~10,
/// stopped at 0.4 s unless 5 calls take longer), and the finalists' re-measurement. A model
/// of the tuning loop for balancing shards (calibrated within ~2× on small GEMMs), not a
/// promise.
pub fn estimated_cost_s(w: &Workload, budget: usize) -> f64 {
    let flops = w.flops().max(1.0);
    let call = flops / CANDIDATE_FLOPS_PER_S;
    let sample = call.max(0.002);
    let timing = (10.0 * sample).min(0.4).max(5.0 * sample);
    let trial = TRIAL_OVERHEAD_S + 2.0 * call + timing;
    WORKLOAD_OVERHEAD_S
        + flops / REFERENCE_FLOPS_PER_S
        + (budget as f64 + 1.0) * trial
        + FINALISTS * timing
}

/// Deals `workloads` (duplicates count once) to `count` shards, balanced by
/// [`estimated_cost_s`] (longest first, to the least loaded shard; ties by workload key, then
/// the lower shard index). Each shard lists its workloads in the order of `workloads`. The
/// shards partition the de-duplicated list exactly; with `count` above the number of
/// workloads, some are empty. `count` 0 is treated as 1.
pub fn assign(workloads: &[Workload], count: usize, budget: usize) -> Vec<Vec<Workload>> {
    let count = count.max(1);
    // First occurrence of each workload, with its position and cost.
    let mut items: Vec<(usize, &Workload, String, f64)> = Vec::new();
    for (pos, w) in workloads.iter().enumerate() {
        if !items.iter().any(|(_, seen, _, _)| *seen == w) {
            items.push((pos, w, w.key(), estimated_cost_s(w, budget)));
        }
    }
    // Longest first; equal costs by key, so the order of the input does not matter.
    items.sort_by(|a, b| b.3.total_cmp(&a.3).then_with(|| a.2.cmp(&b.2)));
    let mut load = vec![0.0f64; count];
    let mut owner: Vec<(usize, usize)> = Vec::with_capacity(items.len()); // (position, shard)
    for (pos, _, _, cost) in &items {
        let shard = (0..count)
            .min_by(|&a, &b| {
                load[a]
                    .partial_cmp(&load[b])
                    .unwrap_or(Ordering::Equal)
                    .then(a.cmp(&b))
            })
            .unwrap_or(0);
        load[shard] += cost;
        owner.push((*pos, shard));
    }
    owner.sort_unstable();
    let mut shards: Vec<Vec<Workload>> = vec![Vec::new(); count];
    for (pos, shard) in owner {
        shards[shard].push(workloads[pos]);
    }
    shards
}

/// Total [`estimated_cost_s`] of each shard of an assignment.
pub fn loads(shards: &[Vec<Workload>], budget: usize) -> Vec<f64> {
    shards
        .iter()
        .map(|s| s.iter().map(|w| estimated_cost_s(w, budget)).sum())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::Rng;
    use std::collections::{HashMap, HashSet};

    fn w(s: &str) -> Workload {
        s.parse().unwrap()
    }

    /// `len` distinct random GEMMs whose costs span orders of magnitude.
    fn random_list(rng: &mut Rng, len: usize) -> Vec<Workload> {
        let mut out: Vec<Workload> = Vec::new();
        while out.len() < len {
            let dim = |rng: &mut Rng| {
                let bits = 1 + rng.below(12);
                1 + rng.below(1 << bits) as usize
            };
            let cand = Workload::gemm(dim(rng), dim(rng), dim(rng)).unwrap();
            if !out.contains(&cand) {
                out.push(cand);
            }
        }
        out
    }

    fn check_partition(list: &[Workload], shards: &[Vec<Workload>]) {
        let mut seen: HashMap<Workload, usize> = HashMap::new();
        for (i, shard) in shards.iter().enumerate() {
            // Each shard keeps the list's order.
            let positions: Vec<usize> = shard
                .iter()
                .map(|x| list.iter().position(|y| y == x).expect("from the list"))
                .collect();
            assert!(
                positions.windows(2).all(|p| p[0] < p[1]),
                "shard {i} out of order"
            );
            for x in shard {
                assert!(seen.insert(*x, i).is_none(), "{x} in two shards");
            }
        }
        let distinct: HashSet<&Workload> = list.iter().collect();
        assert_eq!(seen.len(), distinct.len(), "a workload is missing");
    }

    #[test]
    fn shards_partition_the_list_for_every_count() {
        let mut rng = Rng::new(7);
        for len in [1usize, 2, 3, 5, 8, 13, 40] {
            for trial in 0..5 {
                let list = random_list(&mut rng, len);
                let budget = [1, 8, 64][trial % 3];
                for count in 1..=len + 2 {
                    let shards = assign(&list, count, budget);
                    assert_eq!(shards.len(), count);
                    check_partition(&list, &shards);
                    for (i, shard) in shards.iter().enumerate() {
                        let spec = ShardSpec::new(i, count).unwrap();
                        assert_eq!(&spec.select(&list, budget), shard);
                    }
                }
            }
        }
    }

    #[test]
    fn duplicates_are_tuned_once() {
        let list = [
            w("gemm:64x64x64"),
            w("gemm:8x8x8"),
            w("gemm:64x64x64"),
            w("gemm:8x8x8"),
        ];
        for count in 1..=4 {
            let shards = assign(&list, count, 4);
            let all: Vec<Workload> = shards.concat();
            assert_eq!(all.len(), 2);
            assert!(all.contains(&list[0]) && all.contains(&list[1]));
        }
    }

    #[test]
    fn assignment_ignores_the_order_of_the_list() {
        let mut rng = Rng::new(11);
        for _ in 0..20 {
            let list = random_list(&mut rng, 12);
            let mut shuffled = list.clone();
            for i in (1..shuffled.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                shuffled.swap(i, j);
            }
            for count in 1..=12 {
                let as_sets = |shards: Vec<Vec<Workload>>| -> Vec<HashSet<Workload>> {
                    shards
                        .into_iter()
                        .map(|s| s.into_iter().collect())
                        .collect()
                };
                assert_eq!(
                    as_sets(assign(&list, count, 16)),
                    as_sets(assign(&shuffled, count, 16))
                );
            }
        }
    }

    #[test]
    fn lpt_bound_holds_and_beats_round_robin_on_a_skewed_list() {
        let mut rng = Rng::new(3);
        for _ in 0..30 {
            let list = random_list(&mut rng, 16);
            let costs: Vec<f64> = list.iter().map(|x| estimated_cost_s(x, 32)).collect();
            let total: f64 = costs.iter().sum();
            let largest = costs.iter().cloned().fold(0.0, f64::max);
            for count in 1..=16 {
                let makespan = loads(&assign(&list, count, 32), 32)
                    .into_iter()
                    .fold(0.0, f64::max);
                // Greedy list scheduling: the last workload put on the fullest shard found
                // it the least loaded.
                assert!(makespan <= total / count as f64 + largest + 1e-9);
                assert!(makespan >= largest - 1e-9);
            }
        }
        // One big workload and many small ones: round robin puts small ones beside the big one.
        let mut list = vec![w("gemm:1024x1024x1024")];
        for i in 1..=7 {
            list.push(w(&format!("gemm:{}x64x64", 8 * i)));
        }
        let shards = assign(&list, 2, 32);
        assert_eq!(shards[0], vec![list[0]], "the big one alone");
        assert_eq!(shards[1].len(), 7);
    }

    #[test]
    fn costs_grow_with_work_and_budget() {
        let small = w("gemm:8x8x8");
        let big = w("gemm:512x512x512");
        assert!(estimated_cost_s(&big, 32) > estimated_cost_s(&small, 32));
        assert!(estimated_cost_s(&small, 64) > estimated_cost_s(&small, 32));
        assert!(estimated_cost_s(&small, 0) > 0.0);
    }

    #[test]
    fn parses_and_prints_i_of_n() {
        let s: ShardSpec = " 2/5 ".parse().unwrap();
        assert_eq!(s, ShardSpec { index: 2, count: 5 });
        assert_eq!(s.to_string(), "2/5");
        assert_eq!("0/1".parse::<ShardSpec>().unwrap(), ShardSpec::whole());
        for bad in [
            "", "3", "3/3", "4/3", "0/0", "-1/3", "a/3", "1/b", "1/2/3", "1.5/3",
        ] {
            let err = bad.parse::<ShardSpec>().unwrap_err();
            assert!(err.to_string().contains("expected I/N"), "{bad}: {err}");
        }
        let err = "3/3".parse::<ShardSpec>().unwrap_err().to_string();
        assert!(err.contains("0 to 2"), "{err}");
    }

    #[test]
    fn shard_databases_are_named_after_the_shard() {
        let s = ShardSpec::new(1, 4).unwrap();
        let p = |x: &str| s.db_path(Path::new(x));
        assert_eq!(p("tuning.db"), PathBuf::from("tuning.shard-1-of-4.db"));
        assert_eq!(
            p("/data/x/bert.sqlite"),
            PathBuf::from("/data/x/bert.shard-1-of-4.sqlite")
        );
        assert_eq!(p("plain"), PathBuf::from("plain.shard-1-of-4"));
        assert_eq!(p("a.b.db"), PathBuf::from("a.b.shard-1-of-4.db"));
        assert_ne!(
            ShardSpec::new(0, 4)
                .unwrap()
                .db_path(Path::new("tuning.db")),
            p("tuning.db")
        );
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn slurm_array_ids_map_to_ranks() {
        let get = |pairs: &[(&str, &str)]| ShardSpec::from_vars(vars(pairs));
        assert_eq!(get(&[]).unwrap(), None);
        // --array=0-3
        let s = get(&[
            ("SLURM_ARRAY_TASK_ID", "2"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
            ("SLURM_ARRAY_TASK_MIN", "0"),
            ("SLURM_ARRAY_TASK_MAX", "3"),
        ]);
        assert_eq!(
            s.unwrap(),
            Some((ShardSpec::new(2, 4).unwrap(), ShardSource::Slurm))
        );
        // --array=1-4: ids are 1-based, shards are not.
        let s = get(&[
            ("SLURM_ARRAY_TASK_ID", "4"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_MAX", "4"),
        ]);
        assert_eq!(s.unwrap().unwrap().0, ShardSpec::new(3, 4).unwrap());
        // --array=10-16:2%2 → ids 10,12,14,16.
        let s = get(&[
            ("SLURM_ARRAY_TASK_ID", "14"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
            ("SLURM_ARRAY_TASK_MIN", "10"),
            ("SLURM_ARRAY_TASK_MAX", "16"),
            ("SLURM_ARRAY_TASK_STEP", "2"),
        ]);
        assert_eq!(s.unwrap().unwrap().0, ShardSpec::new(2, 4).unwrap());
        // No MIN: ids taken as ranks.
        let s = get(&[
            ("SLURM_ARRAY_TASK_ID", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
        ]);
        assert_eq!(s.unwrap().unwrap().0, ShardSpec::new(1, 2).unwrap());
        // Slurm wins over Kubernetes.
        let s = get(&[
            ("SLURM_ARRAY_TASK_ID", "0"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
            ("JOB_COMPLETION_INDEX", "1"),
            (SHARD_COUNT_VAR, "2"),
        ]);
        assert_eq!(
            s.unwrap().unwrap(),
            (ShardSpec::new(0, 2).unwrap(), ShardSource::Slurm)
        );
    }

    #[test]
    fn irregular_slurm_arrays_are_refused() {
        let err =
            |pairs: &[(&str, &str)]| ShardSpec::from_vars(vars(pairs)).unwrap_err().to_string();
        // --array=1,5,9: count 3, min 1, max 9.
        let e = err(&[
            ("SLURM_ARRAY_TASK_ID", "5"),
            ("SLURM_ARRAY_TASK_COUNT", "3"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_MAX", "9"),
        ]);
        assert!(e.contains("not one range") && e.contains("--shard"), "{e}");
        let e = err(&[("SLURM_ARRAY_TASK_ID", "3")]);
        assert!(e.contains("SLURM_ARRAY_TASK_COUNT"), "{e}");
        let e = err(&[
            ("SLURM_ARRAY_TASK_ID", "x"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
        ]);
        assert!(e.contains("SLURM_ARRAY_TASK_ID='x'"), "{e}");
        let e = err(&[
            ("SLURM_ARRAY_TASK_ID", "5"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
        ]);
        assert!(e.contains("not below"), "{e}");
        let e = err(&[
            ("SLURM_ARRAY_TASK_ID", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
            ("SLURM_ARRAY_TASK_MIN", "2"),
        ]);
        assert!(e.contains("not on the array's range"), "{e}");
    }

    #[test]
    fn kubernetes_index_needs_the_count() {
        let got = ShardSpec::from_vars(vars(&[
            ("JOB_COMPLETION_INDEX", "3"),
            (SHARD_COUNT_VAR, "4"),
        ]));
        assert_eq!(
            got.unwrap(),
            Some((ShardSpec::new(3, 4).unwrap(), ShardSource::Kubernetes))
        );
        let e = ShardSpec::from_vars(vars(&[("JOB_COMPLETION_INDEX", "0")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(SHARD_COUNT_VAR) && e.contains("--shard 0/1"),
            "{e}"
        );
        let e = ShardSpec::from_vars(vars(&[
            ("JOB_COMPLETION_INDEX", "4"),
            (SHARD_COUNT_VAR, "4"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("not below"), "{e}");
        // Empty values count as absent.
        assert_eq!(
            ShardSpec::from_vars(vars(&[("JOB_COMPLETION_INDEX", " ")])).unwrap(),
            None
        );
    }
}

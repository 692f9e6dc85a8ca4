//! The end of a job that tuned several precisions of one shape: their winners re-measured
//! side by side.
//!
//! Each element type of a shape is its own workload, decided on its own finalists' rounds,
//! minutes apart from the others'; a load that comes or goes in between moves one
//! precision's medians and not another's. The runtime's `auto` policy serves the fastest
//! precision within the caller's error budget, so it compares medians across those
//! decisions. [`compare_precisions`] re-measures the winners in force of a shape's
//! precisions together, in one set of interleaved rounds on the same inputs (each built and
//! verified in its own element type), and records the set
//! ([`TuningDb::record_side_by_side`]): while every decision it measured stays in force,
//! its medians are the ones `auto` compares.

use kernels::{DType, HardwareFingerprint, Kernel, Measurement, Workload};
use runner::{median_ci, Contender, Evaluator};
use tuning_db::{Record, SideBySide, TuningDb};

use crate::tuner::{SearchError, TuneOptions, FALLBACK_TIMEOUT};

/// One precision's winner in a side-by-side re-measurement.
#[derive(Debug, Clone)]
pub struct PrecisionTiming {
    /// Its winning trial (the decision in force), of the shape in this element type.
    pub record: Record,
    /// Its timing in the shared rounds.
    pub measurement: Measurement,
    /// 95% confidence interval of that median, seconds.
    pub ci: (f64, f64),
}

/// The winners of a shape's precisions, re-measured side by side and recorded.
#[derive(Debug, Clone)]
pub struct PrecisionComparison {
    /// The shape, in f32.
    pub shape: Workload,
    /// Each precision's winner, in the order asked for.
    pub timings: Vec<PrecisionTiming>,
    /// The id of the recorded set.
    pub set_id: i64,
}

/// Re-measures the winners in force of `shape` in each of `dtypes` side by side (one set of
/// [`TuneOptions::remeasure_rounds`] interleaved rounds by [`TuneOptions::protocol`], on
/// `evaluator`, which this sets up anew) and records the set. `None` where the job asked for
/// no re-measurement ([`TuneOptions::finalists`] 0), or fewer than two of those precisions
/// (given, or with a decision in force whose winner the runtime still serves: its kernel
/// version registered, its config in the space).
pub fn compare_precisions(
    db: &TuningDb,
    shape: &Workload,
    dtypes: &[DType],
    hw: &HardwareFingerprint,
    opts: &TuneOptions,
    evaluator: &mut dyn Evaluator,
) -> Result<Option<PrecisionComparison>, SearchError> {
    if opts.finalists == 0 || dtypes.len() < 2 {
        return Ok(None);
    }
    let mut entries: Vec<(i64, Record, &'static dyn Kernel)> = Vec::new();
    for &d in dtypes {
        let w = shape.with_dtype(d);
        let Some(decision) = db.winner(&hw.id, &w)? else {
            continue;
        };
        // `best` serves the decision's trial while it is usable, another trial otherwise.
        let Some(record) = db
            .best(&hw.id, &w)?
            .filter(|r| r.id == Some(decision.trial_id))
        else {
            continue;
        };
        let kernel = kernels::registry()
            .iter()
            .copied()
            .find(|k| k.name() == record.kernel && k.version() == record.kernel_version);
        if let (Some(id), Some(kernel)) = (decision.id, kernel) {
            entries.push((id, record, kernel));
        }
    }
    if entries.len() < 2 {
        return Ok(None);
    }
    opts.check_stop()?;
    let setup = entries[0].1.workload;
    evaluator
        .setup(&setup, opts.seed ^ 0x5EED)
        .map_err(SearchError::Setup)?;
    // The limit the last tuned workload left is another shape's: this one's, unknown here,
    // gets the limit of a candidate whose default could not be timed. Building each other
    // type's reference counts against it too.
    evaluator.set_timeout(opts.timeout.unwrap_or(FALLBACK_TIMEOUT));
    let contenders: Vec<Contender<'_>> = entries
        .iter()
        .map(|(_, r, k)| Contender {
            kernel: *k,
            config: r.config.clone(),
            dtype: r.workload.dtype(),
        })
        .collect();
    let measured = evaluator.remeasure(&contenders, &opts.protocol, opts.remeasure_rounds)?;
    let rows: Vec<SideBySide> = entries
        .iter()
        .zip(&measured)
        .map(|((winner_id, _, _), m)| SideBySide {
            winner_id: *winner_id,
            measurement: m.clone(),
        })
        .collect();
    let set_id = db.record_side_by_side(&rows, &opts.tool_version)?;
    let timings = entries
        .into_iter()
        .zip(measured)
        .map(|((_, record, _), measurement)| PrecisionTiming {
            ci: median_ci(&measurement.samples),
            record,
            measurement,
        })
        .collect();
    Ok(Some(PrecisionComparison {
        shape: shape.with_dtype(DType::F32),
        timings,
        set_id,
    }))
}

/// The shapes of a job's `workloads` (in f32, first seen first), each with the element types
/// the job tuned it in: what [`compare_precisions`] compares.
pub fn shapes_and_types(workloads: &[Workload]) -> Vec<(Workload, Vec<DType>)> {
    let mut out: Vec<(Workload, Vec<DType>)> = Vec::new();
    for w in workloads {
        let shape = w.with_dtype(DType::F32);
        match out.iter_mut().find(|(s, _)| *s == shape) {
            Some((_, types)) => types.push(w.dtype()),
            None => out.push((shape, vec![w.dtype()])),
        }
    }
    out
}

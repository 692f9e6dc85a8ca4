//! The progress bar of a tuning job on stderr (`autokernel tune`, and `autokernel.tune`
//! from Python): one bar per workload, the trials done of the budget, the current and best
//! speed. Hidden when stderr is not a terminal.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use kernels::Workload;

use crate::{Event, SearchError, TuneSummary};

/// One workload's tuning job, given the sink for its progress events.
pub type TuneJob<'a> =
    dyn FnMut(&mut dyn FnMut(Event<'_>)) -> Result<TuneSummary, SearchError> + 'a;

/// Runs `job` (the tuning of `w` with `budget` configs) behind a progress bar, cleared when
/// it ends.
pub fn with_progress_bar(
    w: &Workload,
    budget: usize,
    job: &mut TuneJob<'_>,
) -> Result<TuneSummary, SearchError> {
    let bar = ProgressBar::new(budget as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>20} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_prefix(w.key());
    bar.enable_steady_tick(Duration::from_millis(200));
    let summary = job(&mut |event| on_event(&bar, event));
    bar.finish_and_clear();
    summary
}

fn on_event(bar: &ProgressBar, event: Event<'_>) {
    match event {
        Event::Started {
            already_tried,
            budget,
            ..
        } => {
            bar.set_position(already_tried.min(budget) as u64);
            bar.set_message("measuring the default config");
        }
        Event::Default { record } => {
            bar.set_message(format!(
                "default {:.1} GFLOP/s",
                record.gflops.unwrap_or(0.0)
            ));
        }
        Event::Trial {
            record,
            done,
            best_gflops,
            ..
        } => {
            bar.set_position(done as u64);
            let current = record
                .gflops
                .map_or_else(|| record.status.to_string(), |g| format!("{g:.1}"));
            bar.set_message(format!(
                "current {current}, best {:.1} GFLOP/s",
                best_gflops.unwrap_or(0.0)
            ));
        }
        Event::Deciding => bar.set_message("re-measuring the finalists, interleaved"),
    }
}

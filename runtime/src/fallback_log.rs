//! The untuned-workload log: every distinct workload served by a fallback level is appended
//! once to a file, `KEY  # level`, one per line — the input of
//! `autokernel tune --workloads-from FILE`.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use kernels::Workload;

use crate::{Level, RuntimeError};

/// An append-only log of fallback workloads.
pub(crate) struct FallbackLog {
    path: PathBuf,
    state: Mutex<State>,
    write_errors: AtomicU64,
}

struct State {
    file: File,
    seen: HashSet<Workload>,
    last_error: Option<String>,
}

/// The largest existing log read back (a line per distinct workload: a few KB in practice).
const MAX_LOG_BYTES: u64 = 64 << 20;

impl FallbackLog {
    /// Opens (creating) `path` for appending; workloads already in it are not written again.
    /// Anything but a regular file (a device, a FIFO, a terminal), or one larger than
    /// [`MAX_LOG_BYTES`], is refused: it is not a log, and reading it back would not end.
    pub(crate) fn open(path: &Path) -> Result<FallbackLog, RuntimeError> {
        let io = |context: &str, source| RuntimeError::FallbackLog {
            path: path.to_path_buf(),
            context: context.to_string(),
            cause: source,
        };
        let not_a_log = |why: String| io("refused", std::io::Error::other(why));
        if let Ok(meta) = std::fs::metadata(path) {
            if !meta.is_file() {
                return Err(not_a_log(
                    "not a regular file (a device, FIFO or terminal is not a log)".into(),
                ));
            }
        }
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(|e| io("opening for appending", e))?;
        let meta = file.metadata().map_err(|e| io("reading its size", e))?;
        if !meta.is_file() || meta.len() > MAX_LOG_BYTES {
            return Err(not_a_log(format!(
                "{} bytes, more than a workload log holds ({MAX_LOG_BYTES} at most)",
                meta.len()
            )));
        }
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|e| io("reading the existing log", e))?;
        let seen = parse_lines(&text).into_iter().flatten().collect();
        Ok(FallbackLog {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                file,
                seen,
                last_error: None,
            }),
            write_errors: AtomicU64::new(0),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `w` unless it is already in the log. One `write` per line (`O_APPEND`), so
    /// several processes can share the file.
    pub(crate) fn record(&self, w: &Workload, level: Level) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.seen.insert(*w) {
            return;
        }
        let line = format!("{}  # {}\n", w.key(), level.as_str());
        if let Err(e) = st.file.write_all(line.as_bytes()) {
            self.write_errors.fetch_add(1, Ordering::Relaxed);
            st.last_error = Some(format!("{}: {e}", self.path.display()));
            st.seen.remove(w);
        }
    }

    /// Failed appends so far, and the last error.
    pub(crate) fn errors(&self) -> (u64, Option<String>) {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (
            self.write_errors.load(Ordering::Relaxed),
            st.last_error.clone(),
        )
    }
}

/// A line of a workload list that does not parse: its 1-based number and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {error}")]
pub struct BadLine {
    /// The line's number, from 1.
    pub line: usize,
    /// Why its workload does not parse.
    pub error: kernels::Error,
}

/// Parses a workload list: one workload per line, `#` starts a comment, blank lines are
/// skipped. Each entry is the line's workload or why it does not parse.
pub fn parse_lines(text: &str) -> Vec<Result<Workload, BadLine>> {
    // A byte-order mark (editors on Windows write one) is not part of the first workload.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let body = line.split('#').next().unwrap_or("").trim();
            (!body.is_empty()).then(|| {
                body.parse::<Workload>()
                    .map_err(|error| BadLine { line: i + 1, error })
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comments_blanks_and_bad_lines() {
        let got = parse_lines("# fleet log\n\ngemm:1x2x3  # default\n  gemm:4x5x6\nconv:1x1\n");
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], Ok(Workload::gemm(1, 2, 3).unwrap()));
        assert_eq!(got[1], Ok(Workload::gemm(4, 5, 6).unwrap()));
        let e = got[2].clone().unwrap_err();
        assert_eq!(e.line, 5);
        assert!(
            e.to_string().starts_with("line 5: ") && e.to_string().contains("unknown op"),
            "{e}"
        );
        let bom = parse_lines("\u{feff}gemm:1x2x3\n");
        assert_eq!(bom, [Ok(Workload::gemm(1, 2, 3).unwrap())]);
    }

    #[test]
    fn each_workload_is_written_once_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("untuned.txt");
        let w = Workload::gemm(3, 4, 5).unwrap();
        let log = FallbackLog::open(&p).unwrap();
        log.record(&w, Level::Default);
        log.record(&w, Level::Default);
        drop(log);
        let log = FallbackLog::open(&p).unwrap();
        log.record(&w, Level::NearestShape);
        log.record(&Workload::gemm(6, 7, 8).unwrap(), Level::NearestShape);
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text, "gemm:3x4x5  # default\ngemm:6x7x8  # nearest_shape\n");
        assert_eq!(log.errors().0, 0);
    }
}

//! Private names for files made beside an output before they are moved into place (a
//! database being created, a bundle or a merge being written), and the sweep of those a
//! killed process left behind. Each name carries the host and the process that made it, so a
//! sweep removes only the files of processes of this host that no longer run: on a shared
//! filesystem (a Slurm cluster's), another node's files in progress are left alone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::db::temp_name;

/// `out`'s name with `.{kind}-{host}-{pid}-{n}` appended, in `out`'s directory (so the final
/// move is atomic).
pub(crate) fn beside(out: &Path, kind: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let tag = format!(".{kind}-{}-{}-{n}", host_tag(), std::process::id());
    temp_name(out, &tag)
}

/// Removes the files [`beside`] made for `out` (with `kind`) by processes of this host that
/// no longer run, SQLite's side files included. Without `/proc` (not Linux) nothing is
/// removed: whether a process runs cannot be told.
pub(crate) fn sweep(out: &Path, kind: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let prefix = temp_name(out, &format!(".{kind}-{}-", host_tag()));
    let (Some(dir), Some(prefix)) = (prefix.parent(), prefix.file_name()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = prefix.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&prefix).and_then(|r| r.split('-').next()) else {
            continue;
        };
        let dead = pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists();
        if dead {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// This host, as 8 hex digits (FNV-1a of its name; `-` free, so names split cleanly).
fn host_tag() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let h = name.trim().bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{h:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_removes_only_the_files_of_dead_processes_of_this_host() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.db");
        let mine = beside(&out, "tmp");
        std::fs::write(&mine, b"in progress").unwrap();
        // A process that cannot be running (pids stop far below), with its side file; one of
        // another host; one of another output; a plain file.
        let host = host_tag();
        let dead = dir.path().join(format!("out.db.tmp-{host}-4000000000-0"));
        let dead_wal = dir
            .path()
            .join(format!("out.db.tmp-{host}-4000000000-0-wal"));
        let other_host = dir.path().join("out.db.tmp-0badc0de-4000000000-0");
        let other_out = dir.path().join(format!("other.db.tmp-{host}-4000000000-0"));
        for p in [&dead, &dead_wal, &other_host, &other_out, &out] {
            std::fs::write(p, b"x").unwrap();
        }
        sweep(&out, "tmp");
        let left: Vec<bool> = [&mine, &dead, &dead_wal, &other_host, &other_out, &out]
            .iter()
            .map(|p| p.exists())
            .collect();
        if Path::new("/proc/self").exists() {
            assert_eq!(left, [true, false, false, true, true, true]);
        } else {
            eprintln!("skipped: no /proc on this OS, a sweep removes nothing");
            assert!(left.iter().all(|&x| x));
        }
    }
}

//! Private names for files made beside an output before they are moved into place (a
//! database being created, a bundle or a merge being written, a writability probe), and the
//! sweep of those a killed process left behind. Each name carries the system that made it —
//! this boot of this kernel and this PID namespace — and the process, so a sweep removes only
//! files of processes it can see have ended: same boot and namespace (so `/proc/PID` speaks of
//! that process), the sweeping user's own files (`/proc` may hide other users' processes),
//! and no process of that id. Another node's, another container's or another user's files in
//! progress are left alone; without `/proc` nothing is removed.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::db::temp_name;

/// `out`'s name with `.{kind}-{system}-{pid}-{n}` appended, in `out`'s directory (so the
/// final move is atomic).
pub(crate) fn beside(out: &Path, kind: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let system = system_tag().unwrap_or_else(|| "unknown".into());
    let tag = format!(".{kind}-{system}-{}-{n}", std::process::id());
    temp_name(out, &tag)
}

/// Whether new files can be made beside `near`: a probe file is created there (a temp of
/// `near`, swept like the others if its process is killed first) and removed.
pub(crate) fn probe(near: &Path) -> std::io::Result<()> {
    sweep(near, "probe");
    let probe = beside(near, "probe");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

/// Whether directory `dir` takes new files (a probe file made there and removed): for
/// outputs checked before the work that writes them starts.
pub fn probe_dir(dir: &Path) -> std::io::Result<()> {
    probe(&dir.join(".autokernel"))
}

/// Removes the files [`beside`] made for `out` (with `kind`) that were left by ended
/// processes of this system and user (see the module documentation), SQLite's side files
/// included.
pub(crate) fn sweep(out: &Path, kind: &str) {
    let (Some(system), Ok(me)) = (system_tag(), std::fs::metadata("/proc/self")) else {
        return;
    };
    let prefix = temp_name(out, &format!(".{kind}-{system}-"));
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
        let mine = entry.metadata().is_ok_and(|m| m.uid() == me.uid());
        let a_pid = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
        if mine && a_pid && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// This boot of this kernel and this PID namespace, as 16 hex digits (FNV-1a of the boot id
/// and the namespace's inode; `-` free, so names split cleanly); `None` where either cannot
/// be read. Read once per process (a writer's open names and sweeps several temps).
fn system_tag() -> Option<String> {
    static TAG: OnceLock<Option<String>> = OnceLock::new();
    TAG.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let pidns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let text = format!("{}|{}", boot.trim(), pidns.display());
        let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        Some(format!("{h:016x}"))
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_removes_only_the_files_of_ended_processes_of_this_system() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.db");
        let mine = beside(&out, "tmp");
        std::fs::write(&mine, b"in progress").unwrap();
        // A process that cannot be running (pids stop far below), with its side file; one of
        // another system; one of another output; the output itself; a name whose pid is not
        // all digits.
        let Some(host) = system_tag() else {
            eprintln!("skipped: no /proc boot id or PID namespace here, a sweep removes nothing");
            return;
        };
        let dead = dir.path().join(format!("out.db.tmp-{host}-4000000000-0"));
        let dead_wal = dir
            .path()
            .join(format!("out.db.tmp-{host}-4000000000-0-wal"));
        let other_host = dir.path().join("out.db.tmp-00000000deadbeef-4000000000-0");
        let other_out = dir.path().join(format!("other.db.tmp-{host}-4000000000-0"));
        let not_a_pid = dir.path().join(format!("out.db.tmp-{host}-+4000000000-0"));
        for p in [&dead, &dead_wal, &other_host, &other_out, &out, &not_a_pid] {
            std::fs::write(p, b"x").unwrap();
        }
        sweep(&out, "tmp");
        let left: Vec<bool> = [
            &mine,
            &dead,
            &dead_wal,
            &other_host,
            &other_out,
            &out,
            &not_a_pid,
        ]
        .iter()
        .map(|p| p.exists())
        .collect();
        assert_eq!(left, [true, false, false, true, true, true, true]);
    }
}

//! CPU pinning: which CPUs this process may run on, which of them `--pin` uses, and pinning
//! a thread (or, through [`WorkerSpec::cpus`](crate::WorkerSpec::cpus), a worker process)
//! to them.
//!
//! Linux only (`sched_getaffinity` / `sched_setaffinity`): the module is compiled there only.

use std::io;

use crate::worker::WorkerError;

/// The CPUs this thread may run on (Linux `sched_getaffinity`), ascending.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array, for which all-zero bits are the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: every index is below CPU_SETSIZE, inside the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// The CPUs `--pin` uses for `threads` threads: the last `threads` CPUs this process may run
/// on (CPU 0 usually takes more interrupts), or all of them if there are not that many.
pub fn pin_set(threads: usize) -> io::Result<Vec<usize>> {
    let allowed = allowed_cpus()?;
    let keep = threads.clamp(1, allowed.len().max(1));
    Ok(allowed[allowed.len().saturating_sub(keep)..].to_vec())
}

/// Pins the calling thread (and the threads it starts afterwards) to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), WorkerError> {
    match cpu_set(cpus)? {
        Some(set) => set_affinity(&set).map_err(WorkerError::Pin),
        None => Ok(()),
    }
}

/// `cpus` as a kernel CPU set (`None` for an empty list: not pinned), or
/// [`WorkerError::BadCpu`] for a CPU beyond what a set can hold.
pub(crate) fn cpu_set(cpus: &[usize]) -> Result<Option<libc::cpu_set_t>, WorkerError> {
    if cpus.is_empty() {
        return Ok(None);
    }
    // SAFETY: cpu_set_t is a plain bit array, for which all-zero bits are the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = libc::CPU_SETSIZE as usize - 1;
    for &cpu in cpus {
        if cpu > max {
            return Err(WorkerError::BadCpu { cpu, max });
        }
        // SAFETY: `cpu` < CPU_SETSIZE (checked above), so the bit is inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    Ok(Some(set))
}

/// Pins the calling thread to `set`. Async-signal-safe (one system call, no allocation), so
/// it also runs in a forked child before exec.
pub(crate) fn set_affinity(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: sched_setaffinity reads `size_of::<cpu_set_t>()` bytes from a valid set.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

//! Which CPU each process of a measurement runs on.
//!
//! Owns the layout (the proxy on [`PROXY_CPU`], every load generator and backend on
//! [`LOAD_CPU`]) and the two ways of applying it: pinning the bench's own thread (the
//! threads and processes it starts afterwards inherit its mask) and wrapping a proxy's
//! command line in `taskset`.
//!
//! Why: on a two-CPU machine a proxy, a load generator and a backend are three busy
//! processes on two CPUs; where the scheduler happens to put them (a request/response
//! turn within one CPU or across two, a proxy sharing its CPU with the client or not)
//! moved one peer's rate by 2× from one round to the next. With a CPU of its own the
//! proxy is measured as if the load ran on another machine, the same for every peer.
//!
//! Invariants: pinning happens only on a machine with more than [`PROXY_CPU`] CPUs
//! online; a [`Pinned`] guard restores every CPU when dropped.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The CPU a proxy runs on (the whole process, through `taskset`).
pub const PROXY_CPU: usize = 1;
/// The CPU every load generator and backend runs on.
pub const LOAD_CPU: usize = 0;

/// Whether the proxy and the load get a CPU each (a machine with at least two).
pub fn pinning() -> bool {
    online_cpus() > PROXY_CPU
}

/// One sentence for reports: how the CPUs were shared.
pub fn describe() -> String {
    if pinning() {
        format!(
            "each proxy pinned to CPU {PROXY_CPU}, every load generator and backend to \
             CPU {LOAD_CPU} (`direct` runs on CPU {LOAD_CPU} alone)"
        )
    } else {
        "one CPU: proxies, load generators and backends share it".to_string()
    }
}

/// `program args` pinned to [`PROXY_CPU`] when [`pinning`]: `taskset -c N program args`
/// (taskset execs the program, so the pid is the proxy's).
pub fn proxy_command(program: &Path, args: &[String]) -> (PathBuf, Vec<String>) {
    if !pinning() {
        return (program.to_path_buf(), args.to_vec());
    }
    let mut argv = vec![
        "-c".to_string(),
        PROXY_CPU.to_string(),
        program.display().to_string(),
    ];
    argv.extend(args.iter().cloned());
    (PathBuf::from("taskset"), argv)
}

/// CPUs online (not `available_parallelism`, which shrinks once this thread is pinned).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf reads a system constant; no memory is passed.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1)
}

/// This thread pinned to one CPU until dropped (then every CPU again).
pub struct Pinned;

impl Pinned {
    /// The calling thread on [`LOAD_CPU`] when [`pinning`], else `None`.
    pub fn load() -> Result<Option<Self>> {
        if !pinning() {
            return Ok(None);
        }
        set_affinity(&[LOAD_CPU]).context("cannot pin the load generators (sched_setaffinity)")?;
        Ok(Some(Pinned))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let all: Vec<usize> = (0..online_cpus()).collect();
        let _ = set_affinity(&all);
    }
}

/// Restrict the calling thread to `cpus`.
fn set_affinity(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data (all zero is the empty set); CPU_SET writes
    // inside it for indices below CPU_SETSIZE (checked); sched_setaffinity reads
    // size_of::<cpu_set_t>() bytes of it for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c, &mut set);
            }
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_command_goes_through_taskset_only_when_pinning() {
        let (p, a) = proxy_command(Path::new("/bin/shunt"), &["-f".into(), "x.cfg".into()]);
        if pinning() {
            assert_eq!(p, PathBuf::from("taskset"));
            assert_eq!(a, ["-c", "1", "/bin/shunt", "-f", "x.cfg"]);
        } else {
            assert_eq!(p, PathBuf::from("/bin/shunt"));
            assert_eq!(a, ["-f", "x.cfg"]);
        }
    }
}

//! The process's phase, broadcast to every worker: `Running` → (`SIGUSR1`)
//! `SoftStop` → (last flow ends or `hard-stop-after`) `HardStop`;
//! `SIGTERM`/`SIGINT` → `HardStop`. Only `daemon`'s signal loop moves it
//! (it holds the sender); everyone else reads.

use tokio::sync::watch;

/// Process phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    /// Stop accepting; exit when the last flow ends (bounded by hard-stop-after).
    SoftStop,
    /// Close everything now.
    HardStop,
}

/// Readers' side of the phase.
#[derive(Debug)]
pub struct Lifecycle {
    phase: watch::Receiver<Phase>,
}

impl Lifecycle {
    pub fn new(phase: watch::Receiver<Phase>) -> Self {
        Self { phase }
    }

    /// The phase now.
    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Whether the process is stopping (soft or hard).
    pub fn stopping(&self) -> bool {
        self.phase() != Phase::Running
    }

    /// A receiver of its own, to wait for changes.
    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.clone()
    }
}

//! TEMPORARY stub with the contract's signatures (replaced by the real lb).
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
pub struct ServerRt {
    pub idx: usize,
    pub name: String,
    pub id: u32,
    pub addr: SocketAddr,
    pub backup: bool,
    pub maxconn: usize,
    pub maxqueue: usize,
    cur: AtomicUsize,
    sel: AtomicU64,
    up: AtomicBool,
}
impl ServerRt {
    pub fn weight(&self) -> u32 {
        1
    }
    pub fn set_weight(&self, _w: u32) {}
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }
    pub fn set_up(&self, b: bool) {
        self.up.store(b, Ordering::Relaxed)
    }
    pub fn is_maint(&self) -> bool {
        false
    }
    pub fn set_maint(&self, _b: bool) {}
    pub fn cur_conns(&self) -> usize {
        self.cur.load(Ordering::Relaxed)
    }
    pub fn max_conns(&self) -> usize {
        0
    }
    pub fn selected(&self) -> u64 {
        self.sel.load(Ordering::Relaxed)
    }
    pub fn queue_cur(&self) -> usize {
        0
    }
    pub fn queue_max(&self) -> usize {
        0
    }
    pub fn usable(&self) -> bool {
        true
    }
}
pub struct BackendRt {
    pub name: String,
    pub servers: Vec<Arc<ServerRt>>,
    rr: AtomicUsize,
}
impl BackendRt {
    pub fn new(cfg: &crate::config::Backend) -> Arc<BackendRt> {
        Arc::new(BackendRt {
            name: cfg.name.clone(),
            rr: AtomicUsize::new(0),
            servers: cfg
                .servers
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    Arc::new(ServerRt {
                        idx: i,
                        name: s.name.clone(),
                        id: s.id,
                        addr: s.addr,
                        backup: s.backup,
                        maxconn: s.maxconn,
                        maxqueue: s.maxqueue,
                        cur: AtomicUsize::new(0),
                        sel: AtomicU64::new(0),
                        up: AtomicBool::new(true),
                    })
                })
                .collect(),
        })
    }
    pub fn pick(&self, _client: SocketAddr, exclude: Option<usize>) -> Option<usize> {
        let n = self.servers.len();
        if n == 0 {
            return None;
        }
        for _ in 0..n {
            let i = self.rr.fetch_add(1, Ordering::Relaxed) % n;
            if Some(i) != exclude {
                return Some(i);
            }
        }
        None
    }
    pub async fn acquire(
        self: &Arc<Self>,
        client: SocketAddr,
        exclude: Option<usize>,
        _q: Option<Duration>,
    ) -> Result<Slot, AcquireError> {
        let i = self.pick(client, exclude).ok_or(AcquireError::NoServer)?;
        self.servers[i].cur.fetch_add(1, Ordering::Relaxed);
        self.servers[i].sel.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            be: self.clone(),
            i,
        })
    }
    pub fn queue_cur(&self) -> usize {
        0
    }
    pub fn queue_max(&self) -> usize {
        0
    }
}
pub struct Slot {
    be: Arc<BackendRt>,
    i: usize,
}
impl Slot {
    pub fn server(&self) -> &Arc<ServerRt> {
        &self.be.servers[self.i]
    }
    pub fn index(&self) -> usize {
        self.i
    }
}
impl Drop for Slot {
    fn drop(&mut self) {
        self.be.servers[self.i].cur.fetch_sub(1, Ordering::Relaxed);
    }
}
#[derive(thiserror::Error, Debug)]
pub enum AcquireError {
    #[error("no server available")]
    NoServer,
    #[error("queue full")]
    QueueFull,
    #[error("queue timeout")]
    QueueTimeout,
}

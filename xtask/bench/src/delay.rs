//! A "delay wire": a network namespace reached from the root namespace through two
//! TUN devices, with every packet held a fixed time in each direction by xtask itself.
//!
//! This kernel has neither `sch_netem` nor `sch_fq`, so `tc netem delay` cannot put a
//! server 1 ms away. Instead: namespace [`NETNS`] holds TUN device [`FAR_DEV`]
//! ([`FAR_ADDR`]); the root namespace holds TUN device [`NEAR_DEV`] ([`NEAR_ADDR`]), both
//! in the /30 [`NET_PREFIX`] that exists only on these two devices. One thread per
//! direction reads IP packets from one device and writes them to the other once they
//! are due ([`DelayQueue`]): a packet read at `t` is written at `t + delay` (default
//! [`DEFAULT_DELAY`] each way, so a TCP round trip is twice that). Traffic never leaves
//! the machine.
//!
//! Invariants: packets leave in the order they arrived (a FIFO whose due times never
//! decrease); none is dropped silently (a full queue or a failed write is counted in
//! [`WireStats`] and reported); [`Wire`] stops its threads, closes both devices (TUN
//! devices die with their last descriptor) and deletes the namespace when dropped, on
//! error returns and after Ctrl-C alike (`proc::stop_requested` ends the scenario with
//! an error, which drops the guard); a namespace left by a killed run is deleted before
//! a new one is made.

use std::collections::VecDeque;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

/// The namespace that holds the far end.
pub const NETNS: &str = "shunt-far";
/// TUN device in the root namespace.
pub const NEAR_DEV: &str = "shfar0";
/// TUN device inside [`NETNS`].
pub const FAR_DEV: &str = "shfar1";
/// Address of [`NEAR_DEV`] (the root namespace's side).
pub const NEAR_ADDR: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 1);
/// Address of [`FAR_DEV`] (where servers inside the namespace listen).
pub const FAR_ADDR: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 2);
/// Prefix length of the wire's subnet (10.203.0.0/30: the two addresses above only).
pub const NET_PREFIX: u8 = 30;
/// Delay each way unless told otherwise.
pub const DEFAULT_DELAY: Duration = Duration::from_micros(500);
/// Packets held per direction; one more is dropped and counted. At 1 ms per round trip
/// the bench keeps far fewer than this in flight.
const QUEUE_CAP: usize = 16_384;
/// Largest packet read from a device (the MTU is 1500; TUN without a vnet header
/// delivers no GSO super-packets).
const MAX_PACKET: usize = 65_536;
/// Longest sleep of an idle direction, so a stop request is seen promptly.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// Below this wait a direction spins instead of sleeping (timer wake-up jitter).
const SPIN: Duration = Duration::from_micros(20);
/// Buffers kept for reuse per direction.
const SPARE_BUFFERS: usize = 256;
/// `SCHED_FIFO` priority asked for the delay threads, so a busy machine (the storm
/// saturates both cores) delays packets less; they sleep between packets and spin at
/// most [`SPIN`], and the kernel's RT throttling bounds them anyway.
const RT_PRIORITY: libc::c_int = 10;
/// A packet written more than this past its due time counts as late.
pub const LATE_MARK: Duration = Duration::from_micros(100);

/// `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// The kernel's `struct ifreq` as TUNSETIFF reads it: the name, then the flags in the
/// first bytes of the 24-byte union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// A FIFO of items each due `delay` after it was pushed; due times never decrease, so
/// items leave in arrival order even if the clock readings given are not monotonic.
#[derive(Debug)]
pub struct DelayQueue<T> {
    delay: Duration,
    cap: usize,
    items: VecDeque<(Instant, T)>,
}

impl<T> DelayQueue<T> {
    pub fn new(delay: Duration, cap: usize) -> Self {
        Self {
            delay,
            cap,
            items: VecDeque::new(),
        }
    }

    /// Queues `item` (arrived at `now`); false when full (the caller counts the drop).
    pub fn push(&mut self, now: Instant, item: T) -> bool {
        if self.items.len() >= self.cap {
            return false;
        }
        let mut due = now + self.delay;
        if let Some(&(last, _)) = self.items.back() {
            due = due.max(last);
        }
        self.items.push_back((due, item));
        true
    }

    /// The oldest item if it is due at `now`, with its due time.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, T)> {
        match self.items.front() {
            Some(&(due, _)) if due <= now => self.items.pop_front(),
            _ => None,
        }
    }

    /// When the oldest item is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.items.front().map(|&(due, _)| due)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }
}

/// Counters of one direction.
#[derive(Debug, Default)]
pub struct WireStats {
    pub packets: AtomicU64,
    /// Queue full or write failed.
    pub drops: AtomicU64,
    /// Largest time a packet was written after its due time, ns.
    pub max_late_ns: AtomicU64,
    /// Packets written more than [`LATE_MARK`] past their due time.
    pub late: AtomicU64,
    /// errno of the first failed write, 0 if none.
    pub first_errno: AtomicU64,
    /// 1 when the thread runs `SCHED_FIFO`.
    pub realtime: AtomicU64,
}

/// The namespace, both devices and the two delay threads; torn down on drop.
pub struct Wire {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Root → namespace, namespace → root.
    pub stats: [Arc<WireStats>; 2],
    ns_made: bool,
}

impl Wire {
    /// Makes the namespace and devices and starts the delay threads.
    pub fn start(delay: Duration) -> Result<Self> {
        // SAFETY: geteuid has no preconditions.
        ensure!(
            unsafe { libc::geteuid() } == 0,
            "the delay wire needs root (network namespaces and TUN devices)"
        );
        delete_netns_if_present();
        let mut wire = Wire {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            stats: [Arc::default(), Arc::default()],
            ns_made: false,
        };
        ip(&["netns", "add", NETNS])?;
        wire.ns_made = true;
        let near = open_tun(NEAR_DEV)?;
        let far = in_netns(|| open_tun(FAR_DEV))?;
        let near_cidr = format!("{NEAR_ADDR}/{NET_PREFIX}");
        let far_cidr = format!("{FAR_ADDR}/{NET_PREFIX}");
        ip(&["addr", "add", &near_cidr, "dev", NEAR_DEV])?;
        ip(&["link", "set", NEAR_DEV, "up"])?;
        ip(&["-n", NETNS, "link", "set", "lo", "up"])?;
        ip(&["-n", NETNS, "addr", "add", &far_cidr, "dev", FAR_DEV])?;
        ip(&["-n", NETNS, "link", "set", FAR_DEV, "up"])?;
        let near = Arc::new(near);
        let far = Arc::new(far);
        for (i, (src, dst)) in [(near.clone(), far.clone()), (far, near)]
            .into_iter()
            .enumerate()
        {
            let (stop, stats) = (wire.stop.clone(), wire.stats[i].clone());
            let name = if i == 0 {
                "xtask-wire-out"
            } else {
                "xtask-wire-back"
            };
            wire.threads.push(
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || pump(&src, &dst, delay, &stop, &stats))?,
            );
        }
        println!(
            "xtask: delay wire up: {NEAR_DEV} {NEAR_ADDR} <-> {FAR_DEV} {FAR_ADDR} in netns \
             {NETNS}, {} us each way",
            delay.as_micros()
        );
        Ok(wire)
    }

    /// Packets forwarded and dropped, both directions.
    pub fn totals(&self) -> (u64, u64) {
        let sum = |f: fn(&WireStats) -> &AtomicU64| -> u64 {
            self.stats
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .sum()
        };
        (sum(|s| &s.packets), sum(|s| &s.drops))
    }

    /// Since the previous call (or the start): the latest a packet left past its due
    /// time, and how many left more than [`LATE_MARK`] past it. Both restart from 0.
    pub fn window(&self) -> (Duration, u64) {
        let late = self
            .stats
            .iter()
            .map(|s| s.max_late_ns.swap(0, Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        let n = self
            .stats
            .iter()
            .map(|s| s.late.swap(0, Ordering::Relaxed))
            .sum();
        (Duration::from_nanos(late), n)
    }

    /// errno of the first failed write to a device, if any.
    pub fn first_errno(&self) -> Option<i32> {
        self.stats
            .iter()
            .map(|s| s.first_errno.load(Ordering::Relaxed))
            .find(|&e| e != 0)
            .map(|e| e as i32)
    }

    /// Both delay threads got `SCHED_FIFO`.
    pub fn realtime(&self) -> bool {
        self.stats
            .iter()
            .all(|s| s.realtime.load(Ordering::Relaxed) == 1)
    }

    /// Median of `n` TCP connects from the root namespace to `addr` (a listener inside
    /// the namespace): one round trip across the wire.
    pub fn connect_rtt(addr: SocketAddr, n: usize) -> Result<Duration> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            ensure!(!xtask::proc::stop_requested(), "interrupted");
            let t = Instant::now();
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                .with_context(|| format!("self-check connect to {addr}"))?;
            v.push(t.elapsed());
            drop(s);
            std::thread::sleep(Duration::from_millis(2));
        }
        v.sort();
        Ok(v.get(v.len() / 2).copied().unwrap_or_default())
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The devices closed with the threads' last Arc; the namespace goes now (a socket
        // still open inside keeps it alive, unnamed, until it closes).
        if self.ns_made {
            if let Err(e) = ip(&["netns", "del", NETNS]) {
                eprintln!("xtask: delay wire: {e:#}");
            } else {
                println!("xtask: delay wire down (netns {NETNS} deleted)");
            }
        }
    }
}

fn delete_netns_if_present() {
    let listed = xtask::proc::output("ip", &["netns", "list"]).unwrap_or_default();
    if listed
        .lines()
        .any(|l| l.split_whitespace().next() == Some(NETNS))
    {
        println!("xtask: deleting netns {NETNS} left by an earlier run");
        let _ = ip(&["netns", "del", NETNS]);
    }
}

/// `ip ARGS…`, quietly; an error quotes its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("cannot run ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `f` on a thread that joined [`NETNS`]: sockets and TUN devices it creates
/// belong to the namespace for their whole life, whichever thread uses them later.
pub fn in_netns<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let path = format!("/var/run/netns/{NETNS}");
    let ns = File::open(&path).with_context(|| format!("cannot open {path}"))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns with a namespace descriptor we hold open; it changes the
            // network namespace of this (scoped, short-lived) thread only.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!("setns({path}): {}", std::io::Error::last_os_error());
            }
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread in netns {NETNS} panicked"))?
    })
}

/// A listener on [`FAR_ADDR`] inside the namespace, on a port the kernel picks.
pub fn listen_far() -> Result<TcpListener> {
    in_netns(|| {
        TcpListener::bind(SocketAddr::from((FAR_ADDR, 0)))
            .with_context(|| format!("bind {FAR_ADDR}:0 in netns {NETNS}"))
    })
}

/// Opens /dev/net/tun and attaches it to a new TUN device `name` (IP packets, no
/// packet-information header) in the calling thread's network namespace.
fn open_tun(name: &str) -> Result<OwnedFd> {
    let path = c"/dev/net/tun";
    // SAFETY: open with a valid NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        bail!("open /dev/net/tun: {}", std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TUN | IFF_NO_PI,
        _pad: [0; 22],
    };
    ensure!(name.len() < libc::IFNAMSIZ, "device name {name} too long");
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads (and writes back the name into) a struct ifreq, which
    // IfReq lays out exactly (40 bytes); it lives across the call.
    let rc = unsafe { libc::ioctl(fd, TUNSETIFF as _, &mut req as *mut IfReq) };
    if rc != 0 {
        bail!("TUNSETIFF {name}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: fcntl on our open descriptor with integer arguments.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    Ok(owned)
}

/// One direction: packets read from `src` are written to `dst` `delay` later.
fn pump(src: &OwnedFd, dst: &OwnedFd, delay: Duration, stop: &AtomicBool, st: &WireStats) {
    // SAFETY: prctl(PR_SET_TIMERSLACK) with an integer changes this thread's timer slack
    // only: 1 ns instead of 50 µs, so ppoll wakes when asked.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    let param = libc::sched_param {
        sched_priority: RT_PRIORITY,
    };
    // SAFETY: pthread_setschedparam on this thread with a valid, initialised param.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    st.realtime.store(u64::from(rc == 0), Ordering::Relaxed);
    let mut q: DelayQueue<Vec<u8>> = DelayQueue::new(delay, QUEUE_CAP);
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; MAX_PACKET];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while let Some((due, pkt)) = q.pop_due(now) {
            write_packet(dst.as_raw_fd(), &pkt, st);
            let late = Instant::now().saturating_duration_since(due);
            st.max_late_ns
                .fetch_max(late.as_nanos() as u64, Ordering::Relaxed);
            if late > LATE_MARK {
                st.late.fetch_add(1, Ordering::Relaxed);
            }
            if spare.len() < SPARE_BUFFERS {
                spare.push(pkt);
            }
        }
        let wait = q
            .next_due()
            .map_or(IDLE_POLL, |d| d.saturating_duration_since(Instant::now()));
        if q.len() > 0 && wait <= SPIN {
            let due = Instant::now() + wait;
            while Instant::now() < due {
                std::hint::spin_loop();
            }
            continue;
        }
        let sleep = wait.saturating_sub(if q.len() > 0 { SPIN } else { Duration::ZERO });
        let ts = libc::timespec {
            tv_sec: sleep.as_secs() as libc::time_t,
            tv_nsec: sleep.subsec_nanos() as libc::c_long,
        };
        let mut pfd = libc::pollfd {
            fd: src.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd and a valid timespec, both living across the call.
        let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if n <= 0 || pfd.revents & libc::POLLIN == 0 {
            continue;
        }
        loop {
            // SAFETY: read into our buffer of buf.len() bytes from our open descriptor.
            let r = unsafe { libc::read(src.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                break;
            }
            let len = r as usize;
            let mut pkt = spare.pop().unwrap_or_default();
            pkt.clear();
            pkt.extend_from_slice(&buf[..len]);
            if !q.push(Instant::now(), pkt) {
                st.drops.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn write_packet(fd: RawFd, pkt: &[u8], st: &WireStats) {
    // SAFETY: write of our buffer to our open TUN descriptor (one packet per write).
    let w = unsafe { libc::write(fd, pkt.as_ptr().cast(), pkt.len()) };
    if w == pkt.len() as isize {
        st.packets.fetch_add(1, Ordering::Relaxed);
    } else {
        st.drops.fetch_add(1, Ordering::Relaxed);
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let _ =
            st.first_errno
                .compare_exchange(0, errno as u64, Ordering::Relaxed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_leave_in_order_once_due() {
        let d = Duration::from_micros(500);
        let t0 = Instant::now();
        let mut q = DelayQueue::new(d, 8);
        assert!(q.push(t0, 1));
        assert!(q.push(t0 + Duration::from_micros(100), 2));
        assert_eq!(q.next_due(), Some(t0 + d));
        assert!(q.pop_due(t0 + Duration::from_micros(499)).is_none());
        assert_eq!(q.pop_due(t0 + d), Some((t0 + d, 1)));
        assert!(q.pop_due(t0 + Duration::from_micros(599)).is_none());
        assert_eq!(
            q.pop_due(t0 + Duration::from_micros(700)).map(|x| x.1),
            Some(2)
        );
        assert!(q.pop_due(t0 + Duration::from_secs(1)).is_none());
        assert_eq!(q.next_due(), None);
    }

    #[test]
    fn a_clock_going_back_never_reorders() {
        let d = Duration::from_micros(500);
        let t0 = Instant::now() + Duration::from_millis(1);
        let mut q = DelayQueue::new(d, 8);
        q.push(t0, 'a');
        q.push(t0 - Duration::from_micros(300), 'b');
        // 'b' is held until 'a' has gone, not sent before it.
        assert_eq!(q.next_due(), Some(t0 + d));
        let now = t0 + d;
        assert_eq!(q.pop_due(now), Some((t0 + d, 'a')));
        assert_eq!(q.pop_due(now), Some((t0 + d, 'b')));
    }

    #[test]
    fn a_full_queue_counts_its_drops() {
        let t0 = Instant::now();
        let mut q = DelayQueue::new(Duration::ZERO, 2);
        assert!(q.push(t0, 1) && q.push(t0, 2));
        assert!(!q.push(t0, 3));
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_due(t0).map(|x| x.1), Some(1));
        assert!(q.push(t0, 4));
        assert_eq!(q.pop_due(t0).map(|x| x.1), Some(2));
        assert_eq!(q.pop_due(t0).map(|x| x.1), Some(4));
    }

    /// Needs root and makes namespace [`NETNS`]: run with `--ignored` on a machine
    /// where that is fine.
    #[test]
    #[ignore = "needs root; creates and deletes a network namespace"]
    fn a_round_trip_across_the_wire_takes_twice_the_delay() {
        let wire = Wire::start(DEFAULT_DELAY).unwrap();
        let l = listen_far().unwrap();
        let addr = l.local_addr().unwrap();
        let rtt = Wire::connect_rtt(addr, 20).unwrap();
        let (packets, drops) = wire.totals();
        let (late, _) = wire.window();
        println!("median connect {rtt:?}, {packets} packets, latest {late:?} late");
        drop(l);
        drop(wire);
        assert!(
            packets >= 40 && drops == 0,
            "{packets} packets, {drops} drops"
        );
        assert!(
            rtt >= Duration::from_micros(950) && rtt < Duration::from_millis(5),
            "median connect {rtt:?}"
        );
        let listed = xtask::proc::output("ip", &["netns", "list"]).unwrap_or_default();
        assert!(!listed.contains(NETNS), "{listed}");
    }

    #[test]
    fn ifreq_has_the_kernels_size() {
        assert_eq!(std::mem::size_of::<IfReq>(), 40);
    }
}

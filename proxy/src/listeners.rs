//! Every listening socket the process owns, bound fresh or inherited from a
//! predecessor (`-x`): the frontends' TCP sockets (one per thread per bind
//! address, `SO_REUSEPORT`), the Prometheus exporter's, the stats pages' and the
//! stats sockets'.
//!
//! Owns the sorting of the descriptors a predecessor handed over
//! ([`Inherited`]: TCP listeners by local address, Unix listeners by path) and
//! the TCP bind itself. Must not: touch a socket it was handed (no `listen`,
//! no option change but `O_NONBLOCK`, which the predecessor's accept loops set
//! too), or keep a descriptor nobody claimed (closed with a warning).
//!
//! Invariant: a socket whose address (or path) the new configuration still
//! names is reused, never rebound, so a reload with an unchanged address
//! cannot meet `EADDRINUSE`, and a client queued on it waits for whichever
//! process accepts next instead of being refused.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use crate::config::{BindOpts, Config};

/// Listen backlog per socket without `backlog` (HAProxy uses maxconn; the
/// kernel caps it at somaxconn).
const LISTEN_BACKLOG: i32 = 1024;
/// `defer-accept`'s `TCP_DEFER_ACCEPT` delay, HAProxy's: one second (the
/// kernel turns it into a count of SYN-ACK retransmissions).
const DEFER_ACCEPT_SECS: libc::c_int = 1;

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// HAProxy's wording: `Starting frontend fe: cannot bind socket (Address
    /// already in use) [127.0.0.1:80]`.
    #[error("Starting {what}: cannot bind socket ({reason}) [{addr}]")]
    Bind {
        what: String,
        addr: SocketAddr,
        reason: String,
        source: std::io::Error,
    },
    /// A `bind` option the kernel refused: `Starting frontend fe: cannot
    /// make listener socket transparent (Operation not permitted) [addr]`.
    #[error("Starting {what}: {step} ({reason}) [{addr}]")]
    Option {
        what: String,
        addr: SocketAddr,
        step: &'static str,
        reason: String,
        source: std::io::Error,
    },
}

impl ListenError {
    /// A failed bind of `addr` for `what` ("frontend fe", "prometheus exporter").
    pub fn bind(what: impl Into<String>, addr: SocketAddr, source: std::io::Error) -> Self {
        ListenError::Bind {
            what: what.into(),
            addr,
            reason: errno_text(&source),
            source,
        }
    }
}

/// The error's text without Rust's " (os error N)" suffix, as HAProxy prints it.
fn errno_text(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Bind one TCP listener on `addr` (`SO_REUSEADDR`, `SO_REUSEPORT`, non-blocking).
pub fn bind_tcp(addr: SocketAddr) -> std::io::Result<StdListener> {
    bind_tcp_with(addr, &BindOpts::default()).map_err(|(_, e)| e)
}

/// What failed in [`bind_tcp_with`]: a `bind` option's step (HAProxy's
/// words for it), or `None` for the socket, bind or listen themselves.
type BindFailure = (Option<&'static str>, std::io::Error);

/// [`bind_tcp`] with a `bind` line's options: `v6only` (else an IPv6 socket
/// takes IPv4 too, HAProxy's default and `v4v6`), `interface`
/// (`SO_BINDTODEVICE`), `transparent`, `backlog`, `defer-accept`, `tfo`
/// (its queue as long as the backlog). `name` and `maxconn` are the accept
/// loop's.
pub fn bind_tcp_with(addr: SocketAddr, opts: &BindOpts) -> Result<StdListener, BindFailure> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::AsFd;
    let plain = |e| (None, e);
    let sock =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(plain)?;
    sock.set_reuse_address(true).map_err(plain)?;
    sock.set_reuse_port(true).map_err(plain)?;
    if addr.is_ipv6() {
        sock.set_only_v6(opts.v6only)
            .map_err(|e| (Some("cannot set IPV6_V6ONLY"), e))?;
    }
    if let Some(dev) = &opts.interface {
        sock.bind_device(Some(dev.as_bytes()))
            .map_err(|e| (Some("cannot bind listener to device"), e))?;
    }
    if opts.transparent {
        crate::sys::sock::set_transparent(sock.as_fd(), addr.is_ipv6())
            .map_err(|e| (Some("cannot make listener socket transparent"), e))?;
    }
    sock.set_nonblocking(true).map_err(plain)?;
    // Accepted sockets inherit TCP_NODELAY from their listener, so a flow's
    // client needs no setsockopt of its own (the servers' is set at connect).
    sock.set_nodelay(true).map_err(plain)?;
    sock.bind(&addr.into()).map_err(plain)?;
    let backlog = opts
        .backlog
        .map_or(LISTEN_BACKLOG, |b| i32::try_from(b).unwrap_or(i32::MAX));
    if opts.defer_accept {
        crate::sys::sock::set_defer_accept(sock.as_fd(), DEFER_ACCEPT_SECS)
            .map_err(|e| (Some("cannot enable DEFER_ACCEPT"), e))?;
    }
    if opts.tfo {
        crate::sys::sock::set_fastopen(sock.as_fd(), backlog)
            .map_err(|e| (Some("cannot enable TCP_FASTOPEN"), e))?;
    }
    sock.listen(backlog).map_err(plain)?;
    Ok(sock.into())
}

/// The listening sockets a predecessor handed over, sorted for claiming.
#[derive(Debug, Default)]
pub struct Inherited {
    tcp: HashMap<SocketAddr, Vec<StdListener>>,
    unix: HashMap<PathBuf, UnixListener>,
}

impl Inherited {
    /// Sort `fds` by what they are: listening TCP sockets by local address,
    /// listening Unix stream sockets by path. Anything else is closed.
    pub fn sort(fds: Vec<OwnedFd>) -> Self {
        use nix::sys::socket::{getsockopt, sockopt};
        let mut out = Inherited::default();
        for fd in fds {
            let listening = getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
            let sock = socket2::Socket::from(fd);
            let stream = sock.r#type().ok() == Some(socket2::Type::STREAM);
            let local = sock.local_addr().ok();
            if !listening || !stream {
                tracing::warn!(
                    addr = ?local,
                    "inherited descriptor is not a listening stream socket; closing it"
                );
                continue;
            }
            if let Err(e) = sock.set_nonblocking(true) {
                tracing::warn!(addr = ?local, error = %e, "inherited socket: cannot set non-blocking; closing it");
                continue;
            }
            if let Some(a) = local.as_ref().and_then(socket2::SockAddr::as_socket) {
                // As `bind_tcp_with`: clients inherit it (a predecessor of an
                // earlier release may not have set it).
                if let Err(e) = sock.set_nodelay(true) {
                    tracing::warn!(addr = ?local, error = %e, "inherited socket: cannot set TCP_NODELAY");
                }
                out.tcp.entry(a).or_default().push(sock.into());
            } else if let Some(p) = local.as_ref().and_then(|a| a.as_pathname()) {
                let p = configured_path(p);
                let l = UnixListener::from(OwnedFd::from(sock));
                if out.unix.insert(p.clone(), l).is_some() {
                    tracing::warn!(path = %p.display(), "two inherited sockets on one path; closing one");
                }
            } else {
                tracing::warn!(addr = ?local, "inherited socket without an address or path; closing it");
            }
        }
        out
    }

    /// The predecessor's sockets on `addr` (none for port 0: the address is
    /// not known before binding).
    pub fn take_tcp(&mut self, addr: SocketAddr) -> Vec<StdListener> {
        if addr.port() == 0 {
            return Vec::new();
        }
        self.tcp.remove(&addr).unwrap_or_default()
    }

    /// The predecessor's Unix listener at `path`.
    pub fn take_unix(&mut self, path: &Path) -> Option<UnixListener> {
        self.unix.remove(path)
    }

    /// Leave the predecessor's stats sockets alone (closing our copies): a
    /// process that runs beside its predecessor (`-x` without `-sf`/`-st`)
    /// binds its own, so that commands reach the newest process only.
    pub fn drop_unix(&mut self) {
        self.unix.clear();
    }

    /// Close what no part of the configuration claimed (its address is gone
    /// from the configuration: the predecessor's copy closes when it stops).
    pub fn close_rest(self) {
        for (addr, socks) in self.tcp {
            tracing::warn!(%addr, sockets = socks.len(), "inherited listening sockets not in the configuration: closing them");
        }
        for path in self.unix.into_keys() {
            tracing::warn!(path = %path.display(), "inherited stats socket not in the configuration: closing it");
        }
    }
}

/// The configured path of a stats socket: a socket bound at `PATH.PID.tmp`
/// and then renamed to `PATH` (how stats sockets are put in place) still
/// names the temporary path as its address.
fn configured_path(bound: &Path) -> PathBuf {
    let Some(name) = bound.file_name().and_then(|n| n.to_str()) else {
        return bound.to_path_buf();
    };
    let stripped = name.strip_suffix(".tmp").and_then(|rest| {
        let (base, pid) = rest.rsplit_once('.')?;
        (!base.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
            .then_some(base)
    });
    match stripped {
        Some(base) => bound.with_file_name(base),
        None => bound.to_path_buf(),
    }
}

/// Listeners for one thread: `(frontend index, bind index, socket)`; the bind
/// index is the address's place in the frontend's `binds`.
pub type ThreadListeners = Vec<(usize, usize, StdListener)>;

/// One socket per thread per frontend bind address (`SO_REUSEPORT`), taking
/// the inherited sockets of the addresses they match first.
pub fn bind_frontends(
    config: &Config,
    nbthread: usize,
    inherited: &mut Inherited,
) -> Result<Vec<ThreadListeners>, ListenError> {
    let mut per_thread: Vec<ThreadListeners> = (0..nbthread).map(|_| Vec::new()).collect();
    let default_opts = BindOpts::default();
    for (fi, fe) in config.frontends.iter().enumerate() {
        for (bi, &addr) in fe.binds.iter().enumerate() {
            let opts = fe.bind_opts.get(bi).unwrap_or(&default_opts);
            let what = || format!("frontend {}", fe.name);
            // Inherited sockets keep the options their process set.
            let mut taken = inherited.take_tcp(addr);
            let adopted = taken.len();
            // The first bind may pick a port (port 0); siblings join the same one.
            let mut actual = addr;
            for list in per_thread.iter_mut() {
                let l = match taken.pop() {
                    Some(l) => l,
                    None => bind_tcp_with(actual, opts).map_err(|(step, e)| match step {
                        None => ListenError::bind(what(), addr, e),
                        Some(step) => ListenError::Option {
                            what: what(),
                            addr,
                            step,
                            reason: errno_text(&e),
                            source: e,
                        },
                    })?,
                };
                if let Ok(a) = l.local_addr() {
                    actual = a;
                }
                list.push((fi, bi, l));
            }
            // More inherited sockets than threads: each keeps an accept queue
            // that clients were hashed to, so each is served by some thread.
            for (i, l) in taken.into_iter().enumerate() {
                per_thread[i % nbthread].push((fi, bi, l));
            }
            let name = opts.name.as_deref().unwrap_or("");
            tracing::info!(frontend = %fe.name, addr = %actual, listener = %name, inherited = adopted, "listening");
        }
    }
    Ok(per_thread)
}

/// The Prometheus exporter's listener, if configured: the inherited one for
/// its address, else bound fresh.
pub fn bind_prometheus(
    config: &Config,
    inherited: &mut Inherited,
) -> Result<Option<StdListener>, ListenError> {
    let Some(addr) = config.global.prometheus else {
        return Ok(None);
    };
    let l = match inherited.take_tcp(addr).pop() {
        Some(l) => l,
        None => bind_tcp(addr).map_err(|e| ListenError::bind("prometheus exporter", addr, e))?,
    };
    if let Ok(a) = l.local_addr() {
        tracing::info!(addr = %a, "prometheus exporter listening");
    }
    Ok(Some(l))
}

/// The stats pages' listeners (`Config::stats_pages`): per page and bind address,
/// the inherited socket, else one bound fresh; each with its page's index.
pub fn bind_stats_pages(
    config: &Config,
    inherited: &mut Inherited,
) -> Result<Vec<(usize, StdListener)>, ListenError> {
    let mut out = Vec::new();
    for (pi, page) in config.stats_pages.iter().enumerate() {
        for &addr in &page.binds {
            let l = match inherited.take_tcp(addr).pop() {
                Some(l) => l,
                None => bind_tcp(addr)
                    .map_err(|e| ListenError::bind(format!("proxy {}", page.name), addr, e))?,
            };
            if let Ok(a) = l.local_addr() {
                tracing::info!(page = %page.name, addr = %a, uri = %page.uri, "stats page listening");
            }
            out.push((pi, l));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn dup(fd: impl AsFd) -> OwnedFd {
        fd.as_fd().try_clone_to_owned().unwrap()
    }

    #[test]
    fn inherited_sockets_are_sorted_by_address_and_path_and_the_rest_closed() {
        let dir = std::env::temp_dir().join(format!("shunt-inh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let tcp = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = tcp.local_addr().unwrap();
        let unix = UnixListener::bind(&path).unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut inh = Inherited::sort(vec![dup(&tcp), dup(&unix), dup(&udp)]);
        assert!(inh
            .take_tcp(SocketAddr::from(([127, 0, 0, 1], 0)))
            .is_empty());
        assert_eq!(inh.take_tcp(addr).len(), 1);
        assert!(inh.take_tcp(addr).is_empty(), "taken once");
        assert!(inh.take_unix(&path).is_some());
        assert!(inh.take_unix(&path).is_none());
        inh.close_rest();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_renamed_stats_socket_is_known_by_its_configured_path() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(configured_path(&p("/run/a.sock.123.tmp")), p("/run/a.sock"));
        assert_eq!(configured_path(&p("/run/a.sock")), p("/run/a.sock"));
        assert_eq!(configured_path(&p("/run/a.x.tmp")), p("/run/a.x.tmp"));
        assert_eq!(configured_path(&p("/run/.1.tmp")), p("/run/.1.tmp"));
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn bind_options_are_set_on_the_socket() {
        use crate::sys::sock::int_opt;
        let opts = BindOpts {
            defer_accept: true,
            tfo: true,
            backlog: Some(77),
            v6only: true,
            ..BindOpts::default()
        };
        let l = bind_tcp_with("[::]:0".parse().unwrap(), &opts).expect("bind [::]:0");
        let fd = l.as_fd();
        assert_eq!(
            int_opt(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap(),
            1
        );
        assert_ne!(
            int_opt(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT).unwrap(),
            0
        );
        assert_eq!(
            int_opt(fd, libc::IPPROTO_TCP, libc::TCP_FASTOPEN).unwrap(),
            77,
            "the TFO queue is the backlog"
        );
        let plain = bind_tcp("[::]:0".parse().unwrap()).expect("bind [::]:0");
        let fd = plain.as_fd();
        assert_eq!(
            int_opt(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap(),
            0,
            "v4v6 by default"
        );
        assert_eq!(
            int_opt(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT).unwrap(),
            0
        );
        assert_eq!(
            int_opt(fd, libc::IPPROTO_TCP, libc::TCP_FASTOPEN).unwrap(),
            0
        );
    }

    #[test]
    fn privileged_bind_options_are_set_or_refused_with_their_step() {
        let opts = BindOpts {
            transparent: true,
            interface: Some("lo".into()),
            ..BindOpts::default()
        };
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        match bind_tcp_with(addr, &opts) {
            Ok(l) => {
                assert!(is_root(), "transparent needs CAP_NET_ADMIN");
                let fd = l.as_fd();
                assert_eq!(
                    crate::sys::sock::int_opt(fd, libc::SOL_IP, libc::IP_TRANSPARENT).unwrap(),
                    1
                );
                let dev = socket2::SockRef::from(&l).device().unwrap();
                assert_eq!(dev.as_deref(), Some(&b"lo"[..]));
            }
            Err((step, e)) => {
                assert!(!is_root(), "refused as root: {step:?} {e}");
                assert!(step.is_some(), "an option's step: {e}");
            }
        }
    }

    #[test]
    fn a_bind_error_reads_as_haproxy_s() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let e = bind_tcp(addr).unwrap_err();
        let msg = ListenError::bind("frontend fe", addr, e).to_string();
        assert_eq!(
            msg,
            format!("Starting frontend fe: cannot bind socket (Address already in use) [{addr}]")
        );
    }
}

//! systemd's readiness protocol (`sd_notify`), by hand: one datagram of
//! `KEY=VALUE` lines to the socket named by `$NOTIFY_SOCKET` (a path, or an
//! abstract name written `@name`).
//!
//! Owns nothing but the send. Without `$NOTIFY_SOCKET` every call is a no-op,
//! so shunt run outside systemd (or as `Type=simple`) behaves the same. A failed
//! send is returned, never fatal: readiness is a courtesy to the supervisor.
//!
//! What the daemon sends: `READY=1` once its listeners are served (with
//! `MAINPID=` when it is a successor started by a reload, so systemd follows the
//! new process), `RELOADING=1` with `MONOTONIC_USEC=` when a successor starts,
//! `STOPPING=1` when the process that speaks for the service stops.

use std::os::unix::net::UnixDatagram;

/// The environment variable systemd sets for `Type=notify` services.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Send `state` (newline-separated assignments) to `$NOTIFY_SOCKET`.
/// `Ok(false)` when the variable is unset (not supervised), `Ok(true)` once sent.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(target) = std::env::var_os(NOTIFY_SOCKET) else {
        return Ok(false);
    };
    let target = target.to_string_lossy().into_owned();
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = target.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else if target.starts_with('/') {
        sock.send_to(state.as_bytes(), &target)?;
    } else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{NOTIFY_SOCKET}='{target}' is neither a path nor an abstract name"),
        ));
    }
    Ok(true)
}

/// Send and log a failure at warn (the caller has nothing better to do with it).
pub fn notify_or_warn(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!(error = %e, state = %state.replace('\n', " "), "sd_notify failed");
    }
}

/// `CLOCK_MONOTONIC` in microseconds, for `MONOTONIC_USEC=` with `RELOADING=1`.
pub fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call;
    // CLOCK_MONOTONIC exists on every Linux kernel.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let micros = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000;
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The variable is process-wide: the tests that set it run under this lock.
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn recv(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 512];
        let n = sock
            .recv(&mut buf)
            .expect("a datagram on the fake NOTIFY_SOCKET");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_fake_notify_socket_receives_ready() {
        let _g = ENV
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = std::env::temp_dir().join(format!("shunt-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).unwrap();
        // The lock serialises the tests that touch the variable.
        std::env::set_var(NOTIFY_SOCKET, &path);
        assert!(notify("READY=1\nSTATUS=test").unwrap());
        assert_eq!(recv(&sock), "READY=1\nSTATUS=test");
        std::env::remove_var(NOTIFY_SOCKET);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_abstract_notify_socket_receives_stopping() {
        use std::os::linux::net::SocketAddrExt;
        let _g = ENV
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let name = format!("shunt-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        std::env::set_var(NOTIFY_SOCKET, format!("@{name}"));
        assert!(notify("STOPPING=1").unwrap());
        assert_eq!(recv(&sock), "STOPPING=1");
        std::env::remove_var(NOTIFY_SOCKET);
    }

    #[test]
    fn without_notify_socket_nothing_is_sent() {
        let _g = ENV
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::env::remove_var(NOTIFY_SOCKET);
        assert!(!notify("READY=1").unwrap());
    }
}

//! The one accept loop of the tests, the demo and the bench: a listening socket served
//! on its own thread until the `Server` is dropped, and the echo that most of its
//! handlers are.
//!
//! Owns: `Server` (a thread per connection with `serve`, or a callback on the accept
//! thread itself with `on_accept`, for servers that only hold what they accept), the
//! deep-backlog listener on 127.0.0.1:0 of `Server::start`, and `relay`, the read loop
//! that echoes (or discards) until EOF.
//!
//! Invariants: the accept thread waits in poll(2) with a timeout (`ACCEPT_POLL`), so a
//! connection is taken as soon as it arrives and a drop stops the thread within that
//! timeout, whatever the listener (no wake-up connection needed); `accepted` counts a
//! connection before anything its handling does can be seen (before its thread starts
//! with `serve`, once `on_conn` returned with `on_accept`); an accept error other than
//! "nothing pending" (out of descriptors) backs off instead of spinning.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::backends::Counters;

/// How long the accept thread waits in poll(2) before it looks at the stop flag.
const ACCEPT_POLL_MS: libc::c_int = 10;
/// Pause after an accept error (e.g. out of descriptors) before the next try.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// Backlog of `Server::start`'s listener: tests open up to 1000 connections at once.
const DEEP_BACKLOG: i32 = 4096;
/// Buffer of `echo_until_eof`.
const ECHO_BUF: usize = 64 * 1024;

/// A listening server whose connections go to a handler; stops accepting when dropped.
pub struct Server {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// A server on 127.0.0.1:0 (deep backlog) serving each connection with `handler` on
    /// its own thread. Panics when it cannot listen (for tests).
    pub fn start<F>(handler: F) -> Server
    where
        F: Fn(TcpStream) + Send + Sync + 'static,
    {
        let l = listen_deep(SocketAddr::from(([127, 0, 0, 1], 0))).expect("listen");
        Self::serve(l, handler)
    }

    /// [`Server::try_serve`] that panics when the thread cannot start (for tests).
    pub fn serve<F>(l: TcpListener, handler: F) -> Server
    where
        F: Fn(TcpStream) + Send + Sync + 'static,
    {
        Self::try_serve(l, handler).expect("serve")
    }

    /// Serves each connection of `l` with `handler` on its own thread.
    pub fn try_serve<F>(l: TcpListener, handler: F) -> std::io::Result<Server>
    where
        F: Fn(TcpStream) + Send + Sync + 'static,
    {
        let handler = Arc::new(handler);
        Self::spawn(l, Counted::Before, move |s| {
            let h = Arc::clone(&handler);
            // A thread that cannot start drops (closes) its connection.
            let _ = std::thread::Builder::new()
                .name("conn".into())
                .spawn(move || h(s));
        })
    }

    /// Calls `on_conn` on the accept thread with every connection of `l` (blocking
    /// mode), for servers that hold or hand off what they accept without serving it.
    pub fn on_accept<F>(l: TcpListener, on_conn: F) -> std::io::Result<Server>
    where
        F: FnMut(TcpStream) + Send + 'static,
    {
        Self::spawn(l, Counted::After, on_conn)
    }

    fn spawn<F>(l: TcpListener, counted: Counted, on_conn: F) -> std::io::Result<Server>
    where
        F: FnMut(TcpStream) + Send + 'static,
    {
        let addr = l.local_addr()?;
        l.set_nonblocking(true)?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (accepted, stop) = (Arc::clone(&accepted), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("accept-{addr}"))
                .spawn(move || accept_loop(&l, &stop, &accepted, counted, on_conn))?
        };
        Ok(Server {
            addr,
            accepted,
            stop,
            thread: Some(thread),
        })
    }

    /// An echo server: writes back everything, then closes after EOF.
    pub fn echo() -> Server {
        Self::start(|mut s| echo_until_eof(&mut s))
    }

    /// A server that first writes its tag byte, then echoes until EOF (tells a test
    /// which server a flow reached).
    pub fn tagged_echo(tag: u8) -> Server {
        Self::start(move |mut s| {
            if s.write_all(&[tag]).is_ok() {
                echo_until_eof(&mut s);
            }
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// When a connection is counted in `accepted`, relative to its `on_conn` call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Counted {
    /// `on_conn` starts the handling elsewhere: count first.
    Before,
    /// `on_conn` is the handling: count once it is done.
    After,
}

fn accept_loop(
    l: &TcpListener,
    stop: &AtomicBool,
    accepted: &AtomicUsize,
    counted: Counted,
    mut on_conn: impl FnMut(TcpStream),
) {
    while !stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd that lives across the call; the listener's fd stays
        // open as long as `l` is borrowed.
        if unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) } <= 0 {
            continue;
        }
        match l.accept() {
            Ok((s, _)) => {
                if s.set_nonblocking(false).is_err() {
                    continue;
                }
                if counted == Counted::Before {
                    accepted.fetch_add(1, Ordering::SeqCst);
                }
                on_conn(s);
                if counted == Counted::After {
                    accepted.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(_) => std::thread::sleep(ACCEPT_BACKOFF),
        }
    }
}

/// A listener on `addr` with SO_REUSEADDR and a backlog of `DEEP_BACKLOG`.
pub fn listen_deep(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())?;
    sock.listen(DEEP_BACKLOG)?;
    Ok(sock.into())
}

/// Write back everything read from `s`, then shut its write side after EOF.
pub fn echo_until_eof(s: &mut TcpStream) {
    let mut buf = vec![0u8; ECHO_BUF];
    let _ = relay(s, &mut buf, true, None);
    let _ = s.shutdown(Shutdown::Write);
}

/// Reads `s` until EOF in chunks of `buf`'s size, writing every chunk back when `echo`
/// (else discarding it), with the bytes counted on `counters` (in when read, out when
/// written back). Returns the bytes read; an error ends the loop (EINTR is retried).
pub fn relay(
    s: &mut TcpStream,
    buf: &mut [u8],
    echo: bool,
    counters: Option<&Counters>,
) -> std::io::Result<u64> {
    let mut total: u64 = 0;
    loop {
        let n = match s.read(buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(c) = counters {
            c.add_in(n);
        }
        total += n as u64;
        if echo {
            s.write_all(&buf[..n])?;
            if let Some(c) = counters {
                c.add_out(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_server_echoes_counts_and_stops_on_drop() {
        let server = Server::echo();
        let addr = server.addr;
        let mut c = TcpStream::connect(addr).expect("connect");
        let data = crate::pattern(300_000, 5);
        let mut w = c.try_clone().expect("clone");
        let writer = std::thread::spawn(move || {
            w.write_all(&data).expect("write");
            w.shutdown(Shutdown::Write).expect("fin");
            data
        });
        let mut back = Vec::new();
        c.read_to_end(&mut back).expect("read to the server's FIN");
        assert!(back == writer.join().expect("writer"));
        assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
        let t0 = std::time::Instant::now();
        drop(server);
        assert!(t0.elapsed() < Duration::from_secs(1), "drop is prompt");
        assert!(TcpStream::connect(addr).is_err(), "no longer listening");
    }

    #[test]
    fn on_accept_runs_on_the_accept_thread_and_holds_connections() {
        let held = Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = Arc::clone(&held);
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let server =
            Server::on_accept(l, move |s| h.lock().expect("lock").push(s)).expect("on_accept");
        let clients: Vec<TcpStream> = (0..5)
            .map(|_| TcpStream::connect(server.addr).expect("connect"))
            .collect();
        let t0 = std::time::Instant::now();
        while server.accepted.load(Ordering::SeqCst) < 5 {
            assert!(t0.elapsed() < Duration::from_secs(5), "accepted all five");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(held.lock().expect("lock").len(), 5);
        drop(server);
        held.lock().expect("lock").clear();
        for mut c in clients {
            let mut b = [0u8; 1];
            assert_eq!(c.read(&mut b).expect("EOF"), 0);
        }
    }
}

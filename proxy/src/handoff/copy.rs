//! The userspace copy loop of one direction.
//!
//! Invariants: bytes are written in the order read, each exactly once;
//! partial writes resume where they stopped; the peer gets SHUT_WR only
//! after every byte read before EOF has been written.

use std::io;
use std::os::fd::AsFd;

use tokio::net::TcpStream;

use super::flow::{Dir, DirError, Flow};
use super::BURST_BYTES;
use crate::sys::sock;

/// Userspace buffer per direction: large enough to amortise syscalls on a
/// bulk flow, small enough for many flows (2 x 64 KiB each).
pub const COPY_BUF_SIZE: usize = 64 * 1024;

/// Writes all of `data` to `to`, waiting for writability as needed.
pub async fn write_all(
    flow: &Flow<'_>,
    dir: Dir,
    to: &TcpStream,
    mut data: &[u8],
) -> Result<(), DirError> {
    while !data.is_empty() {
        match to.try_write(data) {
            Ok(0) => return Err(DirError::new(dir.to, io::ErrorKind::WriteZero.into())),
            Ok(n) => {
                data = &data[n..];
                flow.wrote(dir.to, n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                to.writable().await.map_err(|e| DirError::new(dir.to, e))?;
            }
            Err(e) => return Err(DirError::new(dir.to, e)),
        }
    }
    Ok(())
}

/// Propagates EOF: SHUT_WR on `to`, and marks both sockets half-closed.
pub fn propagate_eof(flow: &Flow<'_>, dir: Dir, to: &TcpStream) -> Result<(), DirError> {
    sock::shutdown_write(to.as_fd()).map_err(|e| DirError::new(dir.to, e))?;
    flow.shut(dir.to);
    Ok(())
}

/// Copies `from` -> `to` until EOF (propagated) or an error.
pub async fn run(
    flow: &Flow<'_>,
    dir: Dir,
    from: &TcpStream,
    to: &TcpStream,
) -> Result<(), DirError> {
    let mut buf = vec![0u8; COPY_BUF_SIZE];
    let mut burst = 0usize;
    loop {
        match from.try_read(&mut buf) {
            Ok(0) => {
                flow.shut(dir.from);
                return propagate_eof(flow, dir, to);
            }
            Ok(n) => {
                flow.touch(dir.from);
                write_all(flow, dir, to, &buf[..n]).await?;
                burst += n;
                if burst >= BURST_BYTES {
                    burst = 0;
                    crate::scheduler::yield_now().await;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                burst = 0;
                from.readable()
                    .await
                    .map_err(|e| DirError::new(dir.from, e))?;
            }
            Err(e) => return Err(DirError::new(dir.from, e)),
        }
    }
}

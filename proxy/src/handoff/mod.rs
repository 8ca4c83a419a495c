//! TEMPORARY stub with the contract's signatures (replaced by the real handoff).
use std::time::Duration;
use tokio::io::AsyncWriteExt;
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Copy,
    Splice,
}
#[derive(Clone, Copy, Debug, Default)]
pub struct FlowTimeouts {
    pub client: Option<Duration>,
    pub server: Option<Duration>,
    pub tunnel: Option<Duration>,
    pub client_fin: Option<Duration>,
    pub server_fin: Option<Duration>,
}
pub trait Meter {
    fn to_server(&self, n: u64);
    fn to_client(&self, n: u64);
}
#[derive(Debug)]
pub enum End {
    Done,
    ClientReset,
    ServerReset,
    ClientTimeout,
    ServerTimeout,
    Error(std::io::Error),
}
pub struct Outcome {
    pub to_server: u64,
    pub to_client: u64,
    pub mode: Mode,
    pub end: End,
}
pub fn init_pipes(_pipesize: Option<usize>, _maxpipes: usize) {}
pub fn pipes_in_use() -> usize {
    0
}
pub fn pipes_free() -> usize {
    0
}
pub async fn forward(
    mut client: tokio::net::TcpStream,
    mut server: tokio::net::TcpStream,
    pending: Vec<u8>,
    mode: Mode,
    _t: FlowTimeouts,
    meter: &dyn Meter,
) -> Outcome {
    if server.write_all(&pending).await.is_err() {
        return Outcome {
            to_server: 0,
            to_client: 0,
            mode,
            end: End::ServerReset,
        };
    }
    match tokio::io::copy_bidirectional(&mut client, &mut server).await {
        Ok((a, b)) => {
            meter.to_server(a);
            meter.to_client(b);
            Outcome {
                to_server: a,
                to_client: b,
                mode,
                end: End::Done,
            }
        }
        Err(e) => Outcome {
            to_server: 0,
            to_client: 0,
            mode,
            end: End::Error(e),
        },
    }
}

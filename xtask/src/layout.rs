//! What a HAProxy-style configuration routes, as far as xtask needs it: the
//! frontends (`frontend`/`listen` with their `bind` ports and `default_backend` or
//! first `use_backend`), the backends with their `server` addresses, and the first
//! Unix `stats socket` of the global section.
//!
//! Used by the demo (which backends to start, where the stats socket is) and by the
//! bench's tests (its generated configurations route where they should).
//!
//! Invariant: tolerant, never an error: lines that do not matter here are ignored
//! (shunt itself validates the file).

use std::net::SocketAddr;
use std::path::PathBuf;

/// What a configuration declares, as far as the demo and the bench need it.
#[derive(Debug, Default, PartialEq)]
pub struct Layout {
    /// (name, bind ports, backend name)
    pub frontends: Vec<(String, Vec<u16>, Option<String>)>,
    /// (name, servers as (name, address))
    pub backends: Vec<(String, Vec<(String, SocketAddr)>)>,
    /// The first Unix `stats socket` of the global section.
    pub stats_socket: Option<PathBuf>,
}

/// Reads the sections of a HAProxy-style file that route traffic. Tolerant: lines the
/// demo and the bench do not need are ignored (shunt itself validates the file).
pub fn scan(text: &str) -> Layout {
    let mut layout = Layout::default();
    // Index into frontends / backends of the current section, if any.
    let mut fe: Option<usize> = None;
    let mut be: Option<usize> = None;
    let mut global = false;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(&kw) = words.first() else { continue };
        let arg = words.get(1).map(|s| s.trim_matches('"').to_string());
        match kw {
            "global" | "defaults" => {
                fe = None;
                be = None;
                global = kw == "global";
            }
            "stats" if global && arg.as_deref() == Some("socket") => {
                let path = words.get(2).map(|p| p.trim_matches('"'));
                let path = path.map(|p| p.strip_prefix("unix@").unwrap_or(p));
                if let Some(p) = path.filter(|p| !p.contains('@')) {
                    layout.stats_socket.get_or_insert_with(|| PathBuf::from(p));
                }
            }
            "frontend" | "backend" | "listen" => {
                let name = arg.unwrap_or_default();
                fe = None;
                be = None;
                global = false;
                if kw != "backend" {
                    let backend = (kw == "listen").then(|| name.clone());
                    layout.frontends.push((name.clone(), Vec::new(), backend));
                    fe = Some(layout.frontends.len() - 1);
                }
                if kw != "frontend" {
                    layout.backends.push((name, Vec::new()));
                    be = Some(layout.backends.len() - 1);
                }
            }
            "bind" => {
                if let (Some(i), Some(addrs)) = (fe, arg) {
                    let ports = addrs
                        .split(',')
                        .filter_map(|a| a.rsplit(':').next()?.parse::<u16>().ok());
                    layout.frontends[i].1.extend(ports);
                }
            }
            "default_backend" | "use_backend" => {
                if let (Some(i), Some(name)) = (fe, arg) {
                    if kw == "default_backend" || layout.frontends[i].2.is_none() {
                        layout.frontends[i].2 = Some(name);
                    }
                }
            }
            "server" => {
                let addr = words.get(2).and_then(|a| a.parse().ok());
                if let (Some(i), Some(name), Some(addr)) = (be, arg, addr) {
                    layout.backends[i].1.push((name, addr));
                }
            }
            _ => {}
        }
    }
    layout
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
global
    nbthread 2   # comment
    stats socket /tmp/a.sock mode 600 level admin
    stats socket /tmp/b.sock
defaults
    mode tcp
frontend fe_echo
    bind 127.0.0.1:10080
    default_backend be_echo
backend be_echo
    balance roundrobin
    server e1 127.0.0.1:10081 weight 1
    server e2 127.0.0.1:10082
listen sink
    bind :10090,127.0.0.1:10095
    server s1 127.0.0.1:10091 maxconn 10
";

    #[test]
    fn scan_finds_routes_binds_and_servers() {
        let l = scan(SAMPLE);
        assert_eq!(
            l.frontends,
            vec![
                ("fe_echo".into(), vec![10080], Some("be_echo".into())),
                ("sink".into(), vec![10090, 10095], Some("sink".into())),
            ]
        );
        assert_eq!(l.backends.len(), 2);
        assert_eq!(l.backends[0].0, "be_echo");
        assert_eq!(
            l.backends[0].1,
            vec![
                ("e1".into(), "127.0.0.1:10081".parse().expect("addr")),
                ("e2".into(), "127.0.0.1:10082".parse().expect("addr")),
            ]
        );
        assert_eq!(l.backends[1].1[0].0, "s1");
        assert_eq!(l.stats_socket, Some(PathBuf::from("/tmp/a.sock")));
    }

    #[test]
    fn stats_socket_only_from_global_and_unix() {
        let l = scan("frontend f\n    stats socket /tmp/x.sock\n");
        assert_eq!(l.stats_socket, None, "not in global");
        let l = scan("global\n    stats socket ipv4@127.0.0.1:9999\n");
        assert_eq!(l.stats_socket, None, "not a Unix socket");
        let l = scan("global\n    stats timeout 2m\n    stats socket unix@/run/s.sock\n");
        assert_eq!(l.stats_socket, Some(PathBuf::from("/run/s.sock")));
    }
}

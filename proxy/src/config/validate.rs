//! Cross-checks and the final build: drafts in, immutable [`Config`] out.
//!
//! Owns every rule that needs more than one line to decide: backend names
//! referenced by `default_backend`/`use_backend`, duplicate server ids, the
//! same address bound by two frontends, frontends without `bind`, missing
//! timeouts (a warning), ids, and `listen` expansion into a frontend plus a
//! backend of the same name sharing one proxy id.
//!
//! Invariant: a `Config` is returned only when no error at all was found.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use super::mapfile::MapKind;
use super::model::*;
use super::parse::{Kind, Parser, ProxyDraft, ServerDraft, UseBackendDraft};
use super::{ConfigError, Loaded};

pub fn build(p: Parser<'_>) -> Result<Loaded, Vec<ConfigError>> {
    let mut errors = p.errors;
    let mut warnings = p.warnings;
    let log_locs = p.global.log_locs;
    let crt_base = p.global.crt_base;
    let ca_base = p.global.ca_base;
    let mut tls_use = TlsUse::default();
    let mut global = p.global.global;
    if !p.global.maxpipes_set {
        global.maxpipes = global.maxconn / 4;
    }
    let proxies = p.proxies;

    // Stick tables first: rules of any proxy refer to them by index.
    let mut tables: Vec<TableSpec> = proxies
        .iter()
        .filter_map(|d| d.stick_table.clone())
        .collect();
    let table_index: HashMap<String, usize> = tables
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), i))
        .collect();
    let tix = |name: &str| table_index.get(name).copied();

    // Backends first: frontends refer to them by index.
    let mut backends = Vec::new();
    let mut own_backend: Vec<Option<usize>> = vec![None; proxies.len()];
    for (i, d) in proxies.iter().enumerate() {
        if d.kind.be() && !is_stats_page(d) {
            own_backend[i] = Some(backends.len());
            let mut be = make_backend(d, proxy_id(i), &mut errors);
            be.tcp_content = content_rules(d, &tix, &mut errors);
            be.stick = stick_rules(d, &tix, &mut tables, &mut errors);
            for (srv, draft) in be.servers.iter_mut().zip(&d.servers) {
                let base = ca_base.as_ref().map(|(p, _)| p.as_path());
                let wanted = draft.opts.ssl || srv.check_wants_tls();
                let tls = server_tls(d, draft, wanted, base, &mut tls_use, &mut errors);
                srv.tls = tls.clone().filter(|_| draft.opts.ssl);
                srv.check_tls = tls;
            }
            backends.push(be);
            if d.load_server_state {
                global.server_state.backends.push(d.name.clone());
            }
        }
    }
    let find = |name: &str| backends.iter().position(|b: &Backend| b.name == name);

    let mut maps: Vec<MapSource> = Vec::new();
    // The key kind of each entry of `maps`.
    let mut kinds: Vec<MapKind> = Vec::new();
    let mut frontends = Vec::new();
    let mut stats_pages = Vec::new();
    let mut bound: HashMap<SocketAddr, (String, Location)> = HashMap::new();
    for (i, d) in proxies.iter().enumerate() {
        if !d.kind.fe() {
            continue;
        }
        if d.binds.is_empty() {
            errors.push(ConfigError::NoBind {
                at: d.loc.clone(),
                name: d.name.clone(),
            });
        }
        let mut binds = Vec::with_capacity(d.binds.len());
        let mut bind_opts = Vec::with_capacity(d.binds.len());
        let mut line_tls: Option<(&Location, Option<std::sync::Arc<BindTls>>)> = None;
        for (n, (addr, opts, loc)) in d.binds.iter().enumerate() {
            if let Some((fe, prev)) = bound.get(addr) {
                errors.push(ConfigError::Parse {
                    at: loc.clone(),
                    msg: format!(
                        "'bind' : address {addr} is already bound by frontend '{fe}' at {prev}."
                    ),
                });
                continue;
            }
            bound.insert(*addr, (d.name.clone(), loc.clone()));
            binds.push(*addr);
            // The addresses of one line share what it loaded.
            let tls = match &line_tls {
                Some((at, tls)) if *at == loc => tls.clone(),
                _ => {
                    let base = crt_base.as_ref().map(|(p, _)| p.as_path());
                    let tls = bind_tls(d, *addr, opts, loc, base, &mut tls_use, &mut errors);
                    line_tls = Some((loc, tls.clone()));
                    tls
                }
            };
            bind_opts.push(BindOpts {
                id: u32::try_from(n + 1).unwrap_or(u32::MAX),
                tls,
                ..opts.clone()
            });
        }
        if let (true, Some(st)) = (is_stats_page(d), &d.stats) {
            stats_pages.push(StatsPage {
                name: d.name.clone(),
                id: proxy_id(i),
                binds,
                uri: st.uri.clone(),
                refresh: st.refresh,
                realm: st.realm.clone(),
                users: st.users.clone(),
                admin: complete(&st.admin, &d.acls),
                hide_version: st.hide_version,
                show_legends: st.show_legends,
                show_node: st.show_node.clone(),
                timeout_client: d.timeouts.client,
                line: d.loc.clone(),
            });
            continue;
        }
        let mut resolve = |rule: &'static str, target: &str, at: &Location| {
            let idx = find(target);
            if idx.is_none() {
                errors.push(ConfigError::UnknownBackend {
                    at: at.clone(),
                    proxy: d.name.clone(),
                    rule,
                    target: target.to_string(),
                });
            }
            idx
        };
        let default_backend = match &d.default_backend {
            Some((name, at)) => resolve("default_backend", name, at),
            // A listen section forwards to its own servers.
            None if d.kind == Kind::Listen => own_backend[i],
            None => None,
        };
        let mut use_backends = Vec::with_capacity(d.use_backends.len());
        let mut use_backend_conds = Vec::with_capacity(d.use_backends.len());
        let mut map_errors = Vec::new();
        for (rule, cond, loc) in &d.use_backends {
            // Each rule is pushed with its condition, or the config is refused.
            let mut cond = complete(cond, &d.acls);
            resolve_acl_tables(&mut cond, &d.name, loc, &tix, &mut map_errors);
            use_backend_conds.push(cond);
            match rule {
                UseBackendDraft::Name(name) => {
                    if let Some(i) = resolve("use_backend", name, loc) {
                        use_backends.push(UseBackend::Static(i));
                    }
                }
                UseBackendDraft::SrcMap { path, default } => {
                    // Resolved at run time, as HAProxy does: a value (or default) that
                    // names no backend falls back to `default_backend`.
                    let default_target = default.as_deref().and_then(find);
                    let want = (MapKind::Ip, "map_ip");
                    match load_map(&mut maps, &mut kinds, path, want, loc, d) {
                        Ok(map) => use_backends.push(UseBackend::SrcMap {
                            map,
                            default: default.clone(),
                            default_target,
                        }),
                        Err(e) => map_errors.push(e),
                    }
                }
                UseBackendDraft::SniMap { path, default, how } => {
                    let default_target = default.as_deref().and_then(find);
                    let conv = match how {
                        NameMatch::Exact => "map",
                        NameMatch::Dom => "map_dom",
                        NameMatch::Beg => "map_beg",
                    };
                    let want = (MapKind::Str, conv);
                    match load_map(&mut maps, &mut kinds, path, want, loc, d) {
                        Ok(map) => use_backends.push(UseBackend::SniMap {
                            map,
                            how: *how,
                            default: default.clone(),
                            default_target,
                        }),
                        Err(e) => map_errors.push(e),
                    }
                }
            }
        }
        errors.extend(map_errors);
        let tcp_connection = connection_rules(d, &tix, &mut errors);
        global.traffic_logs.push(traffic_log(d, &global.logs));
        frontends.push(Frontend {
            name: d.name.clone(),
            id: proxy_id(i),
            binds,
            bind_opts,
            clitcpka: d.clitcpka,
            default_backend,
            use_backends,
            use_backend_conds,
            tcp_connection,
            tcp_content: content_rules(d, &tix, &mut errors),
            own_backend: own_backend[i],
            maxconn: d.maxconn,
            timeouts: d.timeouts,
            splice: d.splice,
            log_global: d.log_global,
            line: d.loc.clone(),
        });
    }

    for d in &proxies {
        if is_stats_page(d) {
            check_stats_page(d, &mut errors);
        } else if let Some(at) = &d.mode_http_own {
            errors.push(ConfigError::Parse {
                at: at.clone(),
                msg: format!(
                    "'mode http' is supported by shunt only for the stats page ('stats enable'), and {} '{}' has no 'stats' line: use 'mode tcp'.",
                    d.kind.type_str(),
                    d.name
                ),
            });
        } else if let Some(at) = &d.mode_http {
            errors.push(ConfigError::Parse {
                at: d.loc.clone(),
                msg: format!(
                    "{} '{}' inherits 'mode http' from the defaults section at [{at}], and shunt does not speak HTTP: add 'mode tcp'.",
                    d.kind.type_str(),
                    d.name
                ),
            });
        }
        if d.stats.is_some() && d.mode_http.is_none() {
            warnings.push(format!(
                "config : 'stats' statement ignored for proxy '{}' as it requires HTTP mode.",
                d.name
            ));
        }
        if let (Some(at), true) = (&d.httplog, d.kind.fe() && !is_stats_page(d)) {
            warnings.push(format!(
                "config : parsing [{at}] : 'option httplog' not usable with {} '{}' (needs 'mode http'). Falling back to 'option tcplog'.",
                d.kind.type_str(),
                d.name
            ));
        }
        let t = &d.timeouts;
        let missing = (d.kind.fe() && t.client.is_none())
            || (d.kind.be() && (t.connect.is_none() || t.server.is_none()));
        if missing {
            warnings.push(missing_timeouts_warning(d));
        }
    }

    check_log_rings(&global, &log_locs, &proxies, &mut errors);
    resolve_proxy_args(&mut frontends, &mut backends, &mut errors);

    if !errors.is_empty() {
        return Err(errors);
    }
    for (base, used, kw, what) in [
        (&crt_base, tls_use.crt_base, "crt-base", "'bind ... crt'"),
        (&ca_base, tls_use.ca_base, "ca-base", "'server ... ca-file'"),
    ] {
        if let (Some((_, at)), false) = (base, used) {
            warnings.push(format!(
                "parsing [{at}] : '{kw}' ignored: no {what} path uses it."
            ));
        }
    }
    Ok(Loaded {
        config: Config {
            global,
            frontends,
            backends,
            stats_pages,
            maps,
            tables,
        },
        warnings,
    })
}

/// A frontend or listen in `mode http` with `stats` lines: the stats page, which
/// is neither a frontend nor a backend of the configuration.
fn is_stats_page(d: &ProxyDraft) -> bool {
    d.kind.fe() && d.stats.is_some() && d.mode_http.is_some()
}

/// A stats page forwards nothing: shunt does not speak HTTP to servers.
fn check_stats_page(d: &ProxyDraft, errors: &mut Vec<ConfigError>) {
    let forwarding = [
        (!d.servers.is_empty(), "server"),
        (d.default_backend.is_some(), "default_backend"),
        (!d.use_backends.is_empty(), "use_backend"),
        (!d.tcp_connection.is_empty(), "tcp-request connection"),
    ];
    for (_, kw) in forwarding.iter().filter(|(set, _)| *set) {
        errors.push(ConfigError::Parse {
            at: d.loc.clone(),
            msg: format!(
                "{} '{}' is a stats page ('mode http' with 'stats'): shunt does not forward HTTP, so '{kw}' is not allowed there.",
                d.kind.type_str(),
                d.name
            ),
        });
    }
}

/// The `tcp-request connection` rules of `d`, conditions completed and
/// every table they name resolved.
fn connection_rules(
    d: &ProxyDraft,
    tix: &dyn Fn(&str) -> Option<usize>,
    errors: &mut Vec<ConfigError>,
) -> Vec<TcpConnRule> {
    let mut out = Vec::with_capacity(d.tcp_connection.len());
    for (n, r) in d.tcp_connection.iter().enumerate() {
        let at = d.tcp_connection_locs.get(n).unwrap_or(&d.loc);
        let mut cond = complete(&r.cond, &d.acls);
        resolve_acl_tables(&mut cond, &d.name, at, tix, errors);
        let mut action = r.action.clone();
        if let TcpConnAction::TrackSc(t) = &mut action {
            resolve_track(t, &d.name, tix, errors);
        }
        out.push(TcpConnRule { action, cond });
    }
    out
}

/// The `stick` rules of backend `d`, tables resolved; every table one
/// names stores `server_id` and `server_key` (HAProxy adds both).
fn stick_rules(
    d: &ProxyDraft,
    tix: &dyn Fn(&str) -> Option<usize>,
    tables: &mut [TableSpec],
    errors: &mut Vec<ConfigError>,
) -> Vec<StickRule> {
    let mut out = Vec::with_capacity(d.stick_rules.len());
    for r in &d.stick_rules {
        let mut r = r.clone();
        r.cond = complete(&r.cond, &d.acls);
        let at = r.table.at.clone();
        resolve_acl_tables(&mut r.cond, &d.name, &at, tix, errors);
        let Some(i) = tix(&r.table.name) else {
            errors.push(ConfigError::Parse {
                at,
                msg: format!(
                    "Proxy '{}': unable to find stick-table '{}'.",
                    d.name, r.table.name
                ),
            });
            continue;
        };
        if tables[i].key == KeyType::Integer {
            errors.push(ConfigError::Parse {
                at,
                msg: format!(
                    "Proxy '{}': type of fetch not usable with type of stick-table '{}'.",
                    d.name, r.table.name
                ),
            });
            continue;
        }
        r.table.index = i;
        tables[i].store.add(DataType::ServerId, 0);
        tables[i].store.add(DataType::ServerKey, 0);
        out.push(r);
    }
    out
}

/// Resolves the tables the `src_*` fetches of `cond` read (no argument:
/// the proxy's own), as HAProxy's `smp_resolve_args`.
fn resolve_acl_tables(
    cond: &mut Option<Cond>,
    proxy: &str,
    at: &Location,
    tix: &dyn Fn(&str) -> Option<usize>,
    errors: &mut Vec<ConfigError>,
) {
    let Some(c) = cond else { return };
    for (kw, r) in c.table_refs_mut() {
        if r.name.is_empty() {
            r.name = proxy.to_string();
        }
        r.at = at.clone();
        match tix(&r.name) {
            Some(i) => r.index = i,
            None => errors.push(ConfigError::AclTable {
                at: at.clone(),
                table: r.name.clone(),
                keyword: kw.to_string(),
                proxy: proxy.to_string(),
            }),
        }
    }
}

/// `cond` with its named ACLs holding every declaration of the proxy's.
fn complete(cond: &Option<Cond>, acls: &[super::acl::NamedAcl]) -> Option<Cond> {
    cond.clone().map(|mut c| {
        c.complete(acls);
        c
    })
}

/// Points a `track-scN` action at its table (HAProxy's message, at the
/// rule's line, when there is none of that name).
fn resolve_track(
    t: &mut TrackSc,
    proxy: &str,
    tix: &dyn Fn(&str) -> Option<usize>,
    errors: &mut Vec<ConfigError>,
) {
    match tix(&t.table.name) {
        Some(i) => t.table.index = i,
        None => errors.push(ConfigError::Parse {
            at: t.table.at.clone(),
            msg: format!(
                "Proxy '{proxy}': unable to find table '{}' referenced by track-sc{}.",
                t.table.name, t.sc
            ),
        }),
    }
}

/// A proxy's `tcp-request content` rules: named ACLs completed, the tables
/// their conditions and `track-sc*` actions name resolved.
fn content_rules(
    d: &ProxyDraft,
    tix: &dyn Fn(&str) -> Option<usize>,
    errors: &mut Vec<ConfigError>,
) -> Vec<ContentRule> {
    d.tcp_content
        .iter()
        .map(|r| {
            let mut cond = complete(&r.cond, &d.acls);
            resolve_acl_tables(&mut cond, &d.name, &d.loc, tix, errors);
            let mut action = r.action.clone();
            if let ContentAction::TrackSc(t) = &mut action {
                resolve_track(t, &d.name, tix, errors);
            }
            ContentRule { action, cond }
        })
        .collect()
}

/// Points every `nbsrv`, `be_conn` and `fe_conn` at its proxy: the one its
/// argument names, else the proxy the rule is in (a `listen` is both a
/// frontend and a backend of one name). HAProxy's messages.
fn resolve_proxy_args(
    frontends: &mut [Frontend],
    backends: &mut [Backend],
    errors: &mut Vec<ConfigError>,
) {
    use super::acl::Fetch;
    let fe_names: Vec<String> = frontends.iter().map(|f| f.name.clone()).collect();
    let be_names: Vec<String> = backends.iter().map(|b| b.name.clone()).collect();
    let mut one = |cond: &mut Cond, here: &str| {
        for e in cond.exprs_mut() {
            let (names, side, cap) = match e.fetch {
                Fetch::FeConn => (&fe_names, "frontend", "frontend"),
                Fetch::Nbsrv | Fetch::BeConn => (&be_names, "backend", "backend"),
                _ => continue,
            };
            let kw = e.keyword.clone();
            let Some(px) = e.px.as_mut() else { continue };
            let want = px.name.as_deref().unwrap_or(here);
            match names.iter().position(|n| n == want) {
                Some(i) => px.idx = i,
                None => errors.push(ConfigError::Parse {
                    at: px.at.clone(),
                    msg: match &px.name {
                        Some(n) => format!("unable to find {side} '{n}' referenced in arg 1 of ACL keyword '{kw}' in proxy '{here}'."),
                        None => format!("proxy '{here}', referenced in arg 1 of ACL keyword '{kw}' in proxy '{here}', has not {cap} capability."),
                    },
                }),
            }
        }
    };
    for f in frontends.iter_mut() {
        let here = f.name.clone();
        let conds = f
            .use_backend_conds
            .iter_mut()
            .flatten()
            .chain(f.tcp_connection.iter_mut().filter_map(|r| r.cond.as_mut()))
            .chain(f.tcp_content.iter_mut().filter_map(|r| r.cond.as_mut()));
        for c in conds {
            one(c, &here);
        }
    }
    for b in backends.iter_mut() {
        let here = b.name.clone();
        for c in b.tcp_content.iter_mut().filter_map(|r| r.cond.as_mut()) {
            one(c, &here);
        }
    }
}

/// Proxy ids count frontends, backends and listens together from 1, in
/// declaration order (a listen takes one id for both halves).
fn proxy_id(index: usize) -> u32 {
    u32::try_from(index + 1).unwrap_or(u32::MAX)
}

/// HAProxy 2.6's warning text, as one string.
fn missing_timeouts_warning(d: &ProxyDraft) -> String {
    format!(
        "config : missing timeouts for {} '{}'.\n   | While not properly invalid, you will certainly encounter various problems\n   | with such a configuration. To fix this, please ensure that all following\n   | timeouts are set to a non-zero value: 'client', 'connect', 'server'.",
        d.kind.type_str(),
        d.name
    )
}

/// Whether a `crt-base` / `ca-base` was applied to some path.
#[derive(Default)]
struct TlsUse {
    crt_base: bool,
    ca_base: bool,
}

/// The certificates of a `bind` line, read now (HAProxy's messages, at the
/// line); `None` without `ssl` (a `crt` without `ssl` is read and checked,
/// as HAProxy does, but terminates nothing).
fn bind_tls(
    d: &ProxyDraft,
    addr: SocketAddr,
    opts: &BindOpts,
    loc: &Location,
    base: Option<&std::path::Path>,
    used: &mut TlsUse,
    errors: &mut Vec<ConfigError>,
) -> Option<std::sync::Arc<BindTls>> {
    if opts.ssl && opts.crt.is_empty() {
        errors.push(ConfigError::Check {
            msg: format!(
                "Proxy '{}': no SSL certificate specified for bind '{addr}' at [{loc}] (use 'crt').",
                d.name
            ),
        });
        return None;
    }
    let mut certs = Vec::new();
    for crt in &opts.crt {
        used.crt_base |= base.is_some() && !crt.starts_with('/');
        match super::tls::load_crt(&super::tls::resolve(base, crt)) {
            Ok(c) => certs.extend(c),
            Err(msg) => {
                errors.push(ConfigError::Parse {
                    at: loc.clone(),
                    msg: format!("'bind {addr}' in section '{}' : {msg}", d.kind.section()),
                });
                return None;
            }
        }
    }
    if certs.is_empty() && !opts.crt.is_empty() {
        errors.push(ConfigError::Parse {
            at: loc.clone(),
            msg: format!(
                "'bind {addr}' in section '{}' : no certificate found in '{}'.",
                d.kind.section(),
                opts.crt.join("', '")
            ),
        });
        return None;
    }
    opts.ssl.then(|| {
        std::sync::Arc::new(BindTls {
            certs,
            alpn: opts.alpn.iter().map(|a| a.as_bytes().to_vec()).collect(),
            min_ver: opts.ssl_min_ver,
        })
    })
}

/// A server line's TLS settings with its `ca-file` read, when `wanted`
/// (`ssl`, or checks that use TLS: `check-ssl`, `tcp-check connect ssl`);
/// `None` otherwise. As HAProxy (`ssl-server-verify required` by default),
/// verification without a CA file is an error that says how to opt out.
fn server_tls(
    d: &ProxyDraft,
    s: &ServerDraft,
    wanted: bool,
    base: Option<&std::path::Path>,
    used: &mut TlsUse,
    errors: &mut Vec<ConfigError>,
) -> Option<std::sync::Arc<ServerTls>> {
    if !wanted {
        return None;
    }
    let who = format!("'server {}/{}'", d.name, s.name);
    let verify = s.opts.verify.unwrap_or(true);
    let roots = match &s.opts.ca_file {
        Some(f) => {
            used.ca_base |= base.is_some() && !f.starts_with('/');
            match super::tls::load_ca_file(&super::tls::resolve(base, f)) {
                Ok(r) => r,
                Err(msg) => {
                    errors.push(ConfigError::At {
                        at: s.loc.clone(),
                        msg: format!("{who} : {msg}"),
                    });
                    return None;
                }
            }
        }
        None if verify => {
            errors.push(ConfigError::At {
                at: s.loc.clone(),
                msg: format!(
                    "{who} : verify is enabled by default but no CA file specified. If you're running on a LAN where you're certain to trust the server's certificate, please set an explicit 'verify none' statement on the 'server' line, or use 'ssl-server-verify none' in the global section to disable server-side verifications by default."
                ),
            });
            return None;
        }
        None => Vec::new(),
    };
    Some(std::sync::Arc::new(ServerTls {
        verify,
        roots,
        sni: s.opts.sni.clone(),
    }))
}

fn make_backend(d: &ProxyDraft, id: u32, errors: &mut Vec<ConfigError>) -> Backend {
    // Explicit ids first, then the smallest free id for the others.
    let mut used: HashMap<u32, &Location> = HashMap::new();
    let mut names: HashMap<u32, &str> = HashMap::new();
    for s in &d.servers {
        let Some(sid) = s.id else { continue };
        if let Some(prev) = used.get(&sid) {
            errors.push(ConfigError::Parse {
                at: s.loc.clone(),
                msg: format!(
                    "'server {}/{}' : 'id' : custom id {sid} already used at {prev} ('server {}').",
                    d.name,
                    s.name,
                    names.get(&sid).copied().unwrap_or("")
                ),
            });
            continue;
        }
        used.insert(sid, &s.loc);
        names.insert(sid, &s.name);
    }
    let mut taken: HashSet<u32> = used.keys().copied().collect();
    let mut next = 1u32;
    let servers = d
        .servers
        .iter()
        .map(|s| {
            let sid = match s.id {
                Some(sid) => sid,
                None => {
                    while taken.contains(&next) {
                        next += 1;
                    }
                    taken.insert(next);
                    next
                }
            };
            Server {
                name: s.name.clone(),
                id: sid,
                addr: s.addr,
                weight: s.opts.weight,
                maxconn: s.opts.maxconn,
                maxqueue: s.opts.maxqueue,
                backup: s.opts.backup,
                disabled: s.opts.disabled,
                check: CheckParams {
                    tcp_check: d.tcp_check.then(|| d.tcp_check_rules.clone()),
                    ..s.opts.check.clone()
                },
                line: s.loc.clone(),
                pool: s.opts.pool,
                send_proxy: s.opts.send_proxy,
                source: s.opts.source.or(d.source),
                tls: None,
                check_tls: None,
            }
        })
        .collect();
    Backend {
        name: d.name.clone(),
        id,
        balance: d.balance,
        servers,
        timeouts: d.timeouts,
        retries: d.retries,
        redispatch: d.redispatch,
        splice: d.splice,
        maxconn: d.fullconn,
        log_global: d.log_global,
        line: d.loc.clone(),
        opts: BackendOpts {
            srvtcpka: d.srvtcpka,
            allbackups: d.allbackups,
            log_health_checks: d.log_health_checks,
            hash_type: d.hash_type,
        },
        tcp_content: Vec::new(),
        stick: Vec::new(),
    }
}

/// The index of map file `path` in `maps`, loading it on first use (one map per file,
/// ids in load order, as HAProxy shares one pattern reference per file).
///
/// `want` is the key kind the rule's converter reads and the converter's name. A file
/// read both as `map_ip` and as a string map is refused: its keys cannot be both.
fn load_map(
    maps: &mut Vec<MapSource>,
    kinds: &mut Vec<MapKind>,
    path: &str,
    want: (MapKind, &str),
    at: &Location,
    proxy: &ProxyDraft,
) -> Result<usize, ConfigError> {
    let (kind, conv) = want;
    let rule_error = |msg: String| ConfigError::Parse {
        at: at.clone(),
        msg: format!(
            "error detected in {} '{}' while parsing 'use_backend' rule : {conv}: {msg}.",
            proxy.kind.type_str(),
            proxy.name
        ),
    };
    if let Some(i) = maps.iter().position(|m| m.path == path) {
        if kinds[i] != kind {
            return Err(rule_error(format!(
                "map file '{path}' is already used with {} keys at [{}] (a map file holds one kind of key)",
                kinds[i].type_name(),
                maps[i].used_at
            )));
        }
        return Ok(i);
    }
    let entries = super::mapfile::load_file(path, kind).map_err(|e| rule_error(e.to_string()))?;
    kinds.push(kind);
    maps.push(MapSource {
        path: path.to_string(),
        used_at: at.clone(),
        entries,
    });
    Ok(maps.len() - 1)
}

/// A frontend's traffic log settings: own `log` lines plus the global ones with
/// `log global`; the line from `log-format`, else `option tcplog`, else HAProxy's
/// "Connect from" line at accept.
fn traffic_log(d: &ProxyDraft, global_logs: &[LogTarget]) -> ProxyLog {
    let mut targets = d.logs.clone();
    if d.log_global {
        targets.extend(global_logs.iter().cloned());
    }
    let (format, at_accept) = match (&d.log_format, d.tcplog) {
        (Some(f), _) => (f.clone(), false),
        (None, true) => (LogFormat::tcplog(), false),
        (None, false) => (LogFormat::connect(), true),
    };
    ProxyLog {
        targets,
        format,
        at_accept,
        dontlognull: d.dontlognull,
    }
}

/// Every `log ring@NAME` names a declared ring; an error names the `log`
/// line (`log_locs`: the global section's, in order).
fn check_log_rings(
    global: &Global,
    log_locs: &[Location],
    proxies: &[ProxyDraft],
    errors: &mut Vec<ConfigError>,
) {
    let known = |name: &str| global.rings.iter().any(|r| r.name == name);
    let mut missing: Vec<(String, String, Location)> = Vec::new();
    for (t, at) in global.logs.iter().zip(log_locs) {
        if let LogDest::Ring(n) = &t.dest {
            if !known(n) {
                missing.push(("global section".to_string(), n.clone(), at.clone()));
            }
        }
    }
    for d in proxies {
        for (t, at) in d.logs.iter().zip(&d.log_locs) {
            if let LogDest::Ring(n) = &t.dest {
                if !known(n) {
                    missing.push((
                        format!("{} '{}'", d.kind.type_str(), d.name),
                        n.clone(),
                        at.clone(),
                    ));
                }
            }
        }
    }
    for (who, name, at) in missing {
        errors.push(ConfigError::Parse {
            at,
            msg: format!("{who}: log: unknown ring '{name}'."),
        });
    }
}

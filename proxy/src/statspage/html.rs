//! The stats page's HTML, laid out as HAProxy 2.6's: the process block (with
//! shunt's flows and bytes per forwarding mode), the legend of server colours,
//! the display options, then one table per proxy with HAProxy's column groups
//! (Queue, Session rate, Sessions, Bytes, Denied, Errors, Warnings, Server) and
//! shunt's own (Warm spares), and, for an admin, each backend's form.
//!
//! Owns only presentation: every number comes from `cli::render::stat_rows` (the
//! rows of `show stat`) or `show info`'s fields, read by column name; the server
//! state's CSS class is derived from the row's `status` word. Every text taken
//! from the configuration or a check is HTML-escaped.

use std::fmt::Write as _;

use crate::cli::command::InfoFormat;
use crate::cli::render::{self, StatFilter};
use crate::cli::Ctx;
use crate::config::StatsPage;

use super::admin::Status;
use super::Opts;

/// The stylesheet: HAProxy's classes and colours per server state, light only.
const STYLE: &str = "\
body { font-family: arial, helvetica, sans-serif; font-size: 12px; color: black; background: white; }
th, td { font-size: 10px; }
h1 { font-size: x-large; margin-bottom: 0.5em; }
h2 { font-size: x-large; font-weight: bold; font-style: italic; color: #6020a0; margin: 0; }
h3 { font-size: 16px; font-weight: bold; color: #b00040; background: #e8e8d0; margin: 0; }
.hr { margin-top: 0.25em; border-color: black; border-bottom-style: solid; }
.titre { background: #20D0D0; color: #000000; font-weight: bold; text-align: center; }
.frontend, .backend { background: #e8e8d0; }
.active_down, .backup_down { background: #ff9090; }
.active_going_up { background: #ffd020; }
.active_going_down { background: #ffffa0; }
.active_up { background: #c0ffc0; }
.active_nolb, .active_draining { background: #20a0ff; }
.active_no_check, .backup_no_check { background: #e0e0e0; }
.backup_going_up { background: #ff80ff; }
.backup_going_down { background: #c060ff; }
.backup_up { background: #b0d0ff; }
.backup_nolb { background: #90b0e0; }
.backup_draining { background: #cc9900; }
.maintain { background: #c07820; }
table.tbl { border-collapse: collapse; border-style: none; }
table.tbl td { text-align: right; border: 1px solid gray; padding: 2px 3px; white-space: nowrap; }
table.tbl td.ac { text-align: center; }
table.tbl th { border: 1px solid gray; }
table.tbl th.pxname { background: #b00040; color: #ffff40; font-weight: bold; padding: 2px 3px; white-space: nowrap; }
table.tbl th.empty { border-style: none; background: white; }
table.lgd { border-collapse: collapse; border-left: 1px solid black; }
table.lgd td { border: 1px solid gray; padding: 2px; }
table.lgd td.noborder { border-style: none; white-space: nowrap; }
a.px { color: #ffff40; text-decoration: none; }
a.lfsb { color: #000000; text-decoration: none; }
";

/// The legend: each server state's CSS class and its description.
const LEGEND: [(&str, &str); 10] = [
    ("active_up", "active UP"),
    ("backup_up", "backup UP"),
    ("active_going_down", "active UP, going down"),
    ("backup_going_down", "backup UP, going down"),
    ("active_going_up", "active DOWN, going up"),
    ("backup_going_up", "backup DOWN, going up"),
    ("active_down", "active or backup DOWN"),
    ("active_no_check", "not checked"),
    ("maintain", "active or backup DOWN for maintenance (MAINT)"),
    (
        "active_draining",
        "active or backup SOFT STOPPED for maintenance",
    ),
];

/// The column groups of a proxy table and their sub-columns, HAProxy's then shunt's.
const GROUPS: [(&str, &[&str]); 9] = [
    ("Queue", &["Cur", "Max", "Limit"]),
    ("Session rate", &["Cur", "Max", "Limit"]),
    (
        "Sessions",
        &["Cur", "Max", "Limit", "Total", "LbTot", "Last"],
    ),
    ("Bytes", &["In", "Out"]),
    ("Denied", &["Req", "Resp"]),
    ("Errors", &["Req", "Conn", "Resp"]),
    ("Warnings", &["Retr", "Redis"]),
    (
        "Server",
        &[
            "Status", "LastChk", "Wght", "Act", "Bck", "Chk", "Dwn", "Dwntme", "Thrtle",
        ],
    ),
    ("Warm spares", &["Hit", "Miss", "Dead", "Purged"]),
];

/// The admin form's actions: HAProxy's, then shunt's `weight`.
const ACTIONS: [(&str, &str); 14] = [
    ("ready", "Set state to READY"),
    ("drain", "Set state to DRAIN"),
    ("maint", "Set state to MAINT"),
    ("dhlth", "Health: disable checks"),
    ("ehlth", "Health: enable checks"),
    ("hrunn", "Health: force UP"),
    ("hnolb", "Health: force NOLB"),
    ("hdown", "Health: force DOWN"),
    ("dagent", "Agent: disable checks"),
    ("eagent", "Agent: enable checks"),
    ("arunn", "Agent: force UP"),
    ("adown", "Agent: force DOWN"),
    ("shutdown", "Kill Sessions"),
    ("weight", "Set weight to (below)"),
];

/// HTML-escaped text.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A `show stat` row, read by field name.
struct Row<'a>(&'a [String]);

impl Row<'_> {
    fn get(&self, name: &str) -> &str {
        render::stat_col(name)
            .and_then(|i| self.0.get(i))
            .map_or("", String::as_str)
    }

    /// `name`, or `-` when empty (HAProxy's "no limit").
    fn or_dash(&self, name: &str) -> String {
        match self.get(name) {
            "" => "-".to_string(),
            v => esc(v),
        }
    }

    /// A seconds field as HAProxy's human time.
    fn human(&self, name: &str) -> String {
        match self.get(name).parse::<u64>() {
            Ok(s) => render::human_time(s),
            Err(_) => String::new(),
        }
    }

    /// `lastsess`: `?` before the first session.
    fn last(&self) -> String {
        match self.get("lastsess").parse::<i64>() {
            Ok(s) if s >= 0 => render::human_time(s.unsigned_abs()),
            _ => "?".to_string(),
        }
    }

    fn is_backup(&self) -> bool {
        self.get("bck") == "1"
    }
}

/// The CSS class of a server row, from its status word and whether it is a backup.
pub fn server_class(status: &str, backup: bool) -> &'static str {
    let side = |a: &'static str, b: &'static str| if backup { b } else { a };
    let word = status.split_whitespace().next().unwrap_or("");
    let transitional = status.contains('/');
    match word {
        "MAINT" => "maintain",
        "DRAIN" => side("active_draining", "backup_draining"),
        "NOLB" => side("active_nolb", "backup_nolb"),
        "no" => side("active_no_check", "backup_no_check"),
        "UP" if transitional => side("active_going_down", "backup_going_down"),
        "UP" => side("active_up", "backup_up"),
        "DOWN" if transitional => side("active_going_up", "backup_going_up"),
        _ => side("active_down", "backup_down"),
    }
}

/// The whole page.
pub fn page(ctx: &Ctx, page: &StatsPage, opts: &Opts, admin: bool) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let info = info_map(ctx);
    let node = page.show_node.as_ref().map(|n| {
        if n.is_empty() {
            ctx.node.clone()
        } else {
            n.clone()
        }
    });
    let title = match &node {
        Some(n) => format!("Statistics Report for shunt on {}", esc(n)),
        None => "Statistics Report for shunt".to_string(),
    };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html><head><title>{title}</title>\n<link rel=\"icon\" href=\"data:,\">\n\
         <meta http-equiv=\"content-type\" content=\"text/html; charset=utf-8\">\n\
         <style type=\"text/css\">\n{STYLE}</style></head>\n<body>"
    );
    let version = if page.hide_version {
        String::new()
    } else {
        format!(
            " version {}, released {}",
            env!("CARGO_PKG_VERSION"),
            render::RELEASE_DATE
        )
    };
    let _ = write!(
        out,
        "<h1>shunt{version}</h1>\n<h2>Statistics Report for pid {}",
        std::process::id()
    );
    if let Some(n) = &node {
        let _ = write!(out, " on {}", esc(n));
    }
    out.push_str("</h2>\n<hr width=\"100%\" class=\"hr\">\n");
    if let Some((class, text)) = opts.st.as_deref().and_then(Status::banner) {
        let _ = writeln!(
            out,
            "<p><div class={class}><a class=lfsb href=\"{}\" title=\"Remove this message\">[X]</a> {text}</div>",
            esc(&page.uri)
        );
    }
    general(&mut out, ctx, page, opts, &info);
    let rows = render::stat_rows(ctx, StatFilter::ALL);
    // Rows come per proxy (FRONTEND, servers, BACKEND), grouped by proxy id.
    let mut start = 0;
    while start < rows.len() {
        let iid = Row(&rows[start]).get("iid").to_string();
        let end = rows[start..]
            .iter()
            .position(|r| Row(r).get("iid") != iid)
            .map_or(rows.len(), |n| start + n);
        proxy_table(&mut out, page, &rows[start..end], opts, admin);
        start = end;
    }
    out.push_str("</body></html>\n");
    out
}

/// `show info`'s fields, by name.
fn info_map(ctx: &Ctx) -> Vec<(String, String)> {
    render::show_info(ctx, InfoFormat::Plain)
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn info<'a>(info: &'a [(String, String)], name: &str) -> &'a str {
    info.iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

/// The process block, the legend and the display options.
fn general(out: &mut String, ctx: &Ctx, page: &StatsPage, opts: &Opts, inf: &[(String, String)]) {
    let i = |n: &str| esc(info(inf, n));
    out.push_str("<h3>&gt; General process information</h3>\n<table border=0><tr><td align=\"left\" nowrap width=\"1%\">\n");
    let _ = writeln!(
        out,
        "<p><b>pid = </b> {} (process #1, nbthread = {})<br>\n<b>uptime = </b> {}<br>\n\
         <b>system limits:</b> ulimit-n = {}<br>\n<b>maxsock = </b> {}; <b>maxconn = </b> {}; <b>maxpipes = </b> {}<br>\n\
         current conns = {}; current pipes = {}/{}<br>\nRunning tasks: {}; idle = {} %<br>",
        i("Pid"),
        i("Nbthread"),
        i("Uptime"),
        i("Ulimit-n"),
        i("Maxsock"),
        i("Maxconn"),
        i("Maxpipes"),
        i("CurrConns"),
        i("PipesUsed"),
        i("PipesFree"),
        i("Tasks"),
        i("Idle_pct"),
    );
    // shunt's own: how flows were forwarded, and what the kernel carried.
    let _ = writeln!(
        out,
        "<b>forwarding:</b> mode = {}; bpf = {}<br>",
        esc(ctx.state.facts.forward_mode().as_str()),
        esc(ctx.state.facts.bpf())
    );
    out.push_str("<b>flows per forwarding mode:</b> ");
    let modes = crate::handoff::Mode::ALL;
    for (n, m) in modes.iter().enumerate() {
        let _ = write!(
            out,
            "{}{} = <span id=\"flows-{}\">{}</span> ({} bytes)",
            if n > 0 { "; " } else { "" },
            m.name(),
            m.name(),
            ctx.state.stats.modes.flows(*m),
            ctx.state.stats.modes.bytes(*m)
        );
    }
    let _ = writeln!(
        out,
        "; promoted = {}<br>\n<b>kernel-forwarded bytes = </b> <span id=\"kernel-bytes\">{}</span><br>",
        ctx.state.stats.modes.promoted(),
        ctx.state.stats.modes.bytes(crate::handoff::Mode::Sockmap)
    );
    let _ = writeln!(
        out,
        "<b>warm spares:</b> hit = {}; miss = {}; dead = {}; purged = {}<br>",
        i("warm_hit"),
        i("warm_miss"),
        i("warm_dead"),
        i("warm_purged")
    );
    out.push_str("</td><td align=\"center\" nowrap>\n<table class=\"lgd\">");
    for pair in LEGEND.chunks(2) {
        out.push_str("<tr>");
        for (class, text) in pair {
            let _ = write!(
                out,
                "<td class=\"{class}\">&nbsp;</td><td class=\"noborder\">{text} </td>"
            );
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\nNote: \"NOLB\"/\"DRAIN\" = UP with load-balancing disabled.</td>\n");
    // The display options keep the others in force, as HAProxy's links do.
    let base = esc(&page.uri);
    let keep = |up: bool, norefresh: bool| {
        let mut s = base.clone();
        if up {
            s.push_str(";up");
        }
        if norefresh {
            s.push_str(";norefresh");
        }
        s
    };
    out.push_str("<td align=\"left\" valign=\"top\" nowrap width=\"1%\"><b>Display option:</b><ul style=\"margin-top: 0.25em;\">\n");
    let _ = writeln!(
        out,
        "<li><a href=\"{}\">{}</a><br>",
        keep(!opts.up, opts.norefresh),
        if opts.up {
            "Show all servers"
        } else {
            "Hide 'DOWN' servers"
        }
    );
    if page.refresh.is_some() {
        let _ = writeln!(
            out,
            "<li><a href=\"{}\">{}</a><br>",
            keep(opts.up, !opts.norefresh),
            if opts.norefresh {
                "Enable refresh"
            } else {
                "Disable refresh"
            }
        );
    }
    let _ = writeln!(
        out,
        "<li><a href=\"{}\">Refresh now</a><br>\n<li><a href=\"{base};csv;norefresh\">CSV export</a><br>\n\
         <li><a href=\"{base};json;norefresh\">JSON export</a><br>\n</ul></td></tr></table>",
        keep(opts.up, opts.norefresh)
    );
}

/// One proxy: its name bar, then its table (in a form for an admin when it has
/// servers).
fn proxy_table(out: &mut String, page: &StatsPage, rows: &[Vec<String>], opts: &Opts, admin: bool) {
    let Some(first) = rows.first().map(|r| Row(r)) else {
        return;
    };
    let name = esc(first.get("pxname"));
    let iid = esc(first.get("iid"));
    let has_fe = rows.iter().any(|r| Row(r).get("svname") == "FRONTEND");
    let has_be = rows.iter().any(|r| Row(r).get("svname") == "BACKEND");
    let servers: Vec<Row<'_>> = rows
        .iter()
        .map(|r| Row(r))
        .filter(|r| !matches!(r.get("svname"), "FRONTEND" | "BACKEND"))
        .collect();
    let form = admin && !servers.is_empty();
    if form {
        out.push_str("<form method=\"post\">");
    }
    let cap = match (has_fe, has_be) {
        (true, true) => "proxy",
        (true, false) => "frontend",
        _ => "backend",
    };
    let tip = if page.show_legends {
        format!(" title=\"cap: {cap}, mode: tcp, id: {iid}\"")
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "<table class=\"tbl\" width=\"100%\">\n<tr class=\"titre\"><th class=\"pxname\" width=\"10%\"><a name=\"{name}\"></a><a class=px href=\"#{name}\"{tip}>{name}</a></th><th class=\"empty\" width=\"90%\"></th></tr>\n</table>"
    );
    let _ = write!(
        out,
        "<table class=\"tbl\" width=\"100%\" id=\"px-{name}\">\n<tr class=\"titre\"><th rowspan=2>"
    );
    if form {
        out.push_str("<input type=\"checkbox\" onclick=\"for (const c of document.querySelectorAll('.px-checkbox')) c.checked = this.checked\">");
    }
    out.push_str("</th><th rowspan=2></th>");
    for (g, cols) in GROUPS {
        let _ = write!(out, "<th colspan={}>{g}</th>", cols.len());
    }
    out.push_str("</tr>\n<tr class=\"titre\">");
    for (_, cols) in GROUPS {
        for c in cols {
            let _ = write!(out, "<th>{c}</th>");
        }
    }
    out.push_str("</tr>\n");
    for r in rows.iter().map(|r| Row(r)) {
        match r.get("svname") {
            "FRONTEND" => frontend_row(out, &name, &r),
            "BACKEND" => backend_row(out, &name, &r),
            _ => {
                // `;up` hides what HAProxy's does: stopped servers and maintenance.
                let status = r.get("status");
                if opts.up && (status.starts_with("DOWN") || status.starts_with("MAINT")) {
                    continue;
                }
                server_row(out, &name, &r, form);
            }
        }
    }
    out.push_str("</table>");
    if form {
        out.push_str("Choose the action to perform on the checked servers : <select name=action><option value=\"\"></option>");
        for (v, text) in ACTIONS {
            let _ = write!(out, "<option value=\"{v}\">{text}</option>");
        }
        let _ = write!(
            out,
            "</select> weight: <input type=\"text\" name=\"weight\" size=\"4\"><input type=\"hidden\" name=\"b\" value=\"#{iid}\">&nbsp;<input type=\"submit\" value=\"Apply\"></form>"
        );
    }
    out.push_str("<p>\n");
}

/// Cells, each `<td>` with its content.
fn cells(out: &mut String, values: &[String]) {
    for v in values {
        let _ = write!(out, "<td>{v}</td>");
    }
}

fn frontend_row(out: &mut String, px: &str, r: &Row<'_>) {
    let _ = write!(
        out,
        "<tr class=\"frontend\" id=\"{px}/FRONTEND\"><td></td><td class=ac><a class=lfsb href=\"#{px}/Frontend\">Frontend</a></td><td colspan=3></td>"
    );
    let g = |n: &str| esc(r.get(n));
    cells(
        out,
        &[
            g("rate"),
            g("rate_max"),
            // No session rate limit (`rate_lim` 0) shows as HAProxy's `-`.
            match r.get("rate_lim") {
                "" | "0" => "-".to_string(),
                v => esc(v),
            },
            g("scur"),
            g("smax"),
            g("slim"),
            g("stot"),
            String::new(),
            String::new(),
            g("bin"),
            g("bout"),
            g("dreq"),
            g("dresp"),
            g("ereq"),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ],
    );
    let _ = writeln!(
        out,
        "<td class=ac>{}</td><td class=ac colspan=8></td><td colspan=4></td></tr>",
        g("status")
    );
}

fn server_row(out: &mut String, px: &str, r: &Row<'_>, form: bool) {
    let g = |n: &str| esc(r.get(n));
    let name = g("svname");
    let status = r.get("status");
    let class = server_class(status, r.is_backup());
    let _ = write!(out, "<tr class=\"{class}\" id=\"{px}/{name}\"><td>");
    if form {
        let _ = write!(
            out,
            "<input class=\"px-checkbox\" type=\"checkbox\" name=\"s\" value=\"{name}\">"
        );
    }
    let _ = write!(
        out,
        "</td><td class=ac><a name=\"{px}/{name}\"></a><a class=lfsb href=\"#{px}/{name}\" title=\"{}, id: {}\">{name}</a></td>",
        g("addr"),
        g("sid")
    );
    cells(
        out,
        &[
            g("qcur"),
            g("qmax"),
            r.or_dash("qlimit"),
            g("rate"),
            g("rate_max"),
            String::new(),
            g("scur"),
            g("smax"),
            r.or_dash("slim"),
            g("stot"),
            g("lbtot"),
            r.last(),
            g("bin"),
            g("bout"),
            String::new(),
            g("dresp"),
            String::new(),
            g("econ"),
            g("eresp"),
            g("wretr"),
            g("wredis"),
        ],
    );
    // Status: time in the state, then the word (`no check` in italics).
    let shown = if status == "no check" {
        "<i>no check</i>".to_string()
    } else {
        format!("{} {}", r.human("lastchg"), esc(status))
    };
    let check = match r.get("check_status") {
        "" => String::new(),
        st => {
            let dur = match r.get("check_duration") {
                "" => String::new(),
                d => format!(" in {}ms", esc(d)),
            };
            format!(
                "<span title=\"{}\">{}{dur}</span>",
                g("check_desc"),
                esc(st)
            )
        }
    };
    let yes = |b: bool| if b { "Y" } else { "-" };
    let _ = write!(
        out,
        "<td class=ac>{shown}</td><td class=ac>{check}</td><td class=ac>{}/{}</td><td class=ac>{}</td><td class=ac>{}</td>",
        g("weight"),
        g("uweight"),
        yes(!r.is_backup()),
        yes(r.is_backup())
    );
    if r.get("check_status").is_empty() {
        out.push_str("<td colspan=3></td>");
    } else {
        cells(out, &[g("chkfail"), g("chkdown"), r.human("downtime")]);
    }
    let _ = write!(out, "<td class=ac>{}</td>", r.or_dash("throttle"));
    cells(
        out,
        &[
            g("warm_hit"),
            g("warm_miss"),
            g("warm_dead"),
            g("warm_purged"),
        ],
    );
    out.push_str("</tr>\n");
}

fn backend_row(out: &mut String, px: &str, r: &Row<'_>) {
    let g = |n: &str| esc(r.get(n));
    let _ = write!(
        out,
        "<tr class=\"backend\" id=\"{px}/BACKEND\"><td></td><td class=ac><a name=\"{px}/Backend\"></a><a class=lfsb href=\"#{px}/Backend\" title=\"balancing: {}\">Backend</a></td>",
        g("algo")
    );
    cells(
        out,
        &[
            g("qcur"),
            g("qmax"),
            String::new(),
            g("rate"),
            g("rate_max"),
            String::new(),
            g("scur"),
            g("smax"),
            g("slim"),
            g("stot"),
            g("lbtot"),
            r.last(),
            g("bin"),
            g("bout"),
            g("dreq"),
            g("dresp"),
            String::new(),
            g("econ"),
            g("eresp"),
            g("wretr"),
            g("wredis"),
        ],
    );
    let _ = write!(
        out,
        "<td class=ac>{} {}</td><td class=ac>&nbsp;</td><td class=ac>{}/{}</td><td class=ac>{}</td><td class=ac>{}</td><td class=ac>&nbsp;</td>",
        r.human("lastchg"),
        g("status"),
        g("weight"),
        g("uweight"),
        g("act"),
        g("bck")
    );
    cells(out, &[g("chkdown"), r.human("downtime"), String::new()]);
    cells(
        out,
        &[
            g("warm_hit"),
            g("warm_miss"),
            g("warm_dead"),
            g("warm_purged"),
        ],
    );
    out.push_str("</tr>\n");
}

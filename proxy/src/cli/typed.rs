//! HAProxy's typed output formats built from shunt's plain ones: `show stat ... typed`
//! (one `T.iid.sid.pos.name.proc:TAGS:type:value` line per non-empty field) and the
//! JSON form of `show info`.
//!
//! Owns the per-field tags and types of HAProxy 2.6's stats fields (origin, nature,
//! scope letters as `stats_emit_typed_data_field` prints them) for each kind of row.
//! Invariants: a field is printed only when its CSV cell is non-empty, as HAProxy does;
//! the module fields after the `-` separator column are numbered from 103 (the
//! separator is not a field); a cell whose kind has no tag is never printed with an
//! invented one (the unit tests check shunt's rows never need that).

use std::fmt::Write as _;

/// Fields of the modules HAProxy appends after the `-` column (SSL, H2, H1), with their
/// tags and type; the same for every kind of row.
const MODULE_FIELDS: [(&str, &str); 24] = [
    ("ssl_sess", "MCP:u64"),
    ("ssl_reused_sess", "MCP:u64"),
    ("ssl_failed_handshake", "MCP:u64"),
    ("h2_headers_rcvd", "MCP:u64"),
    ("h2_data_rcvd", "MCP:u64"),
    ("h2_settings_rcvd", "MCP:u64"),
    ("h2_rst_stream_rcvd", "MCP:u64"),
    ("h2_goaway_rcvd", "MCP:u64"),
    ("h2_detected_conn_protocol_errors", "MCP:u64"),
    ("h2_detected_strm_protocol_errors", "MCP:u64"),
    ("h2_rst_stream_resp", "MCP:u64"),
    ("h2_goaway_resp", "MCP:u64"),
    ("h2_open_connections", "MGP:u64"),
    ("h2_backend_open_streams", "MGP:u64"),
    ("h2_total_connections", "MCP:u64"),
    ("h2_backend_total_streams", "MCP:u64"),
    ("h1_open_connections", "MGP:u64"),
    ("h1_open_streams", "MGP:u64"),
    ("h1_total_connections", "MCP:u64"),
    ("h1_total_streams", "MCP:u64"),
    ("h1_bytes_in", "MCP:u64"),
    ("h1_bytes_out", "MCP:u64"),
    ("h1_spliced_bytes_in", "MCP:u64"),
    ("h1_spliced_bytes_out", "MCP:u64"),
];

/// Number of generic stats fields (HAProxy 2.6's `ST_F_TOTAL_FIELDS`).
const GENERIC_FIELDS: usize = 103;
/// CSV columns holding the proxy id, the server id and the row type.
const COL_IID: usize = 27;
const COL_SID: usize = 28;
const COL_TYPE: usize = 32;
const COL_CHECK_STATUS: usize = 36;
const COL_LAST_CHK: usize = 56;

/// Columns 0 to 102 of `show stat`: name, then the typed tags and type of the
/// field for a frontend, a backend and a server (empty: never typed for that kind).
pub const STAT_FIELDS: [(&str, &str, &str, &str); 103] = [
    ("pxname", "KNS:str", "KNS:str", "KNS:str"),
    ("svname", "KNS:str", "KNS:str", "KNS:str"),
    ("qcur", "", "MGP:u32", "MGP:u32"),
    ("qmax", "", "MMP:u32", "MMP:u32"),
    ("scur", "MGP:u32", "MGP:u32", "MGP:u32"),
    ("smax", "MMP:u32", "MMP:u32", "MMP:u32"),
    ("slim", "CLP:u32", "CLP:u32", "CLP:u32"),
    ("stot", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("bin", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("bout", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("dreq", "MCP:u64", "MCP:u64", ""),
    ("dresp", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("ereq", "MCP:u64", "", ""),
    ("econ", "", "MCP:u64", "MCP:u64"),
    ("eresp", "", "MCP:u64", "MCP:u64"),
    ("wretr", "", "MCP:u64", "MCP:u64"),
    ("wredis", "", "MCP:u64", "MCP:u64"),
    ("status", "SGP:str", "SGP:str", "SGP:str"),
    ("weight", "", "MaP:u32", "MaP:u32"),
    ("act", "", "MGP:u32", "SGP:u32"),
    ("bck", "", "MGP:u32", "SGP:u32"),
    ("chkfail", "", "", "MCP:u64"),
    ("chkdown", "", "MCP:u64", "MCP:u64"),
    ("lastchg", "", "MAP:u32", "MAP:u32"),
    ("downtime", "", "MCP:u32", "MCP:u32"),
    ("qlimit", "", "", "CGS:u32"),
    ("pid", "KGP:u32", "KGP:u32", "KGP:u32"),
    ("iid", "KGS:u32", "KGS:u32", "KGS:u32"),
    ("sid", "KGS:u32", "KGS:u32", "KGS:u32"),
    ("throttle", "", "", "MaP:u32"),
    ("lbtot", "", "MCP:u64", "MCP:u64"),
    ("tracked", "", "", "CNS:str"),
    ("type", "CGS:u32", "CGS:u32", "CGS:u32"),
    ("rate", "MRP:u32", "MGP:u32", "MRP:u32"),
    ("rate_lim", "CLP:u32", "", ""),
    ("rate_max", "MMP:u32", "MGP:u32", "MMP:u32"),
    ("check_status", "", "", "MOP:str"),
    ("check_code", "", "", "MOP:u32"),
    ("check_duration", "", "", "MDP:u64"),
    ("hrsp_1xx", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("hrsp_2xx", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("hrsp_3xx", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("hrsp_4xx", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("hrsp_5xx", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("hrsp_other", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("hanafail", "", "", "MCP:u64"),
    ("req_rate", "MRP:u32", "", ""),
    ("req_rate_max", "MMP:u32", "", ""),
    ("req_tot", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("cli_abrt", "", "MCP:u64", "MCP:u64"),
    ("srv_abrt", "", "MCP:u64", "MCP:u64"),
    ("comp_in", "MCP:u64", "MCP:u64", ""),
    ("comp_out", "MCP:u64", "MCP:u64", ""),
    ("comp_byp", "MCP:u64", "MCP:u64", ""),
    ("comp_rsp", "MCP:u64", "MCP:u64", ""),
    ("lastsess", "", "MAP:s32", "MAP:s32"),
    ("last_chk", "", "", "MOP:str"),
    ("last_agt", "", "", "MOP:str"),
    ("qtime", "", "MaP:u32", "MaP:u32"),
    ("ctime", "", "MaP:u32", "MaP:u32"),
    ("rtime", "", "MaP:u32", "MaP:u32"),
    ("ttime", "", "MaP:u32", "MaP:u32"),
    ("agent_status", "", "", "MOP:str"),
    ("agent_code", "", "", "MOP:u32"),
    ("agent_duration", "", "", "MDP:u64"),
    ("check_desc", "", "", "MOP:str"),
    ("agent_desc", "", "", "MOP:str"),
    ("check_rise", "", "", "CGS:u32"),
    ("check_fall", "", "", "CGS:u32"),
    ("check_health", "", "", "CGS:u32"),
    ("agent_rise", "", "", "CGS:u32"),
    ("agent_fall", "", "", "CGS:u32"),
    ("agent_health", "", "", "CGS:u32"),
    ("addr", "", "", "CGS:str"),
    ("cookie", "", "CNS:str", "CNS:str"),
    ("mode", "CGS:str", "CGS:str", "CGS:str"),
    ("algo", "", "CGS:str", ""),
    ("conn_rate", "MRP:u32", "", ""),
    ("conn_rate_max", "MMP:u32", "", ""),
    ("conn_tot", "MCP:u64", "", ""),
    ("intercepted", "MCP:u64", "", ""),
    ("dcon", "MCP:u64", "", ""),
    ("dses", "MCP:u64", "", ""),
    ("wrew", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("connect", "", "MCP:u64", "MCP:u64"),
    ("reuse", "", "MCP:u64", "MCP:u64"),
    ("cache_lookups", "MCP:u64", "MCP:u64", ""),
    ("cache_hits", "MCP:u64", "MCP:u64", ""),
    ("srv_icur", "", "", "MGP:u32"),
    ("src_ilim", "", "", "CLP:u32"),
    ("qtime_max", "", "MMP:u32", "MMP:u32"),
    ("ctime_max", "", "MMP:u32", "MMP:u32"),
    ("rtime_max", "", "MMP:u32", "MMP:u32"),
    ("ttime_max", "", "MMP:u32", "MMP:u32"),
    ("eint", "MCP:u64", "MCP:u64", "MCP:u64"),
    ("idle_conn_cur", "", "", "MGP:u32"),
    ("safe_conn_cur", "", "", "MGP:u32"),
    ("used_conn_cur", "", "", "MGP:u32"),
    ("need_conn_est", "", "", "MGP:u32"),
    ("uweight", "", "MaP:u32", "MaP:u32"),
    ("agg_server_status", "", "MGP:u32", ""),
    ("agg_server_check_status", "", "MGP:u32", ""),
    ("agg_check_status", "", "MGP:u32", ""),
];

/// The letter and table column of a row type (`type` column: 0 frontend, 1 backend,
/// 2 server, 3 listener).
pub(crate) fn kind(ty: &str) -> Option<(char, usize)> {
    match ty {
        "0" => Some(('F', 0)),
        "1" => Some(('B', 1)),
        "2" => Some(('S', 2)),
        _ => None,
    }
}

/// Tags and type of CSV column `col` for a row of table column `k`, and the field's
/// typed position.
pub(crate) fn field(col: usize, k: usize) -> Option<(usize, &'static str, &'static str)> {
    if col < GENERIC_FIELDS {
        let f = STAT_FIELDS[col];
        let tags = [f.1, f.2, f.3][k];
        return (!tags.is_empty()).then_some((col, f.0, tags));
    }
    // Column GENERIC_FIELDS is the `-` separator.
    let m = col.checked_sub(GENERIC_FIELDS + 1)?;
    MODULE_FIELDS
        .get(m)
        .map(|(name, tags)| (GENERIC_FIELDS + m, *name, *tags))
}

/// One typed field of a `show stat` row.
struct TypedField<'a> {
    /// `F`, `B` or `S`.
    letter: char,
    iid: &'a str,
    sid: &'a str,
    pos: usize,
    name: &'static str,
    /// Tag letters and type, `MCP:u64`.
    tags: &'static str,
    value: &'a str,
}

/// The typed fields of each row of a `show stat` CSV answer, row by row: every
/// non-empty cell (and a checked server's `last_chk`). `None` when the answer is
/// not CSV (an error).
fn typed_rows(csv: &str) -> Option<Vec<Vec<TypedField<'_>>>> {
    let mut lines = csv.lines();
    match lines.next() {
        Some(h) if h.starts_with("# pxname,") => {}
        _ => return None,
    }
    let mut rows = Vec::new();
    for row in lines.filter(|l| !l.is_empty()) {
        let cells: Vec<&str> = row.split(',').collect();
        let Some((letter, k)) = cells.get(COL_TYPE).and_then(|t| kind(t)) else {
            continue;
        };
        let iid = cells.get(COL_IID).copied().unwrap_or("0");
        let sid = cells.get(COL_SID).copied().unwrap_or("0");
        // A checked server's `last_chk` is a typed field even when empty (HAProxy
        // sets the string whenever the check is enabled).
        let checked = k == 2 && cells.get(COL_CHECK_STATUS).is_some_and(|c| !c.is_empty());
        let mut fields = Vec::new();
        for (col, value) in cells.iter().enumerate() {
            if value.is_empty() && !(checked && col == COL_LAST_CHK) {
                continue;
            }
            if let Some((pos, name, tags)) = field(col, k) {
                fields.push(TypedField {
                    letter,
                    iid,
                    sid,
                    pos,
                    name,
                    tags,
                    value,
                });
            }
        }
        rows.push(fields);
    }
    Some(rows)
}

/// `show stat ... typed` from the CSV answer of the same query: every non-empty cell
/// of every row (and a checked server's `last_chk`), then the empty line. An answer that is not CSV (an error) is kept.
pub fn stat_typed(csv: &str) -> String {
    let Some(rows) = typed_rows(csv) else {
        return csv.to_owned();
    };
    let mut out = String::with_capacity(csv.len() * 4);
    for f in rows.iter().flatten() {
        // Writing into a String cannot fail.
        let _ = writeln!(
            out,
            "{}.{}.{}.{}.{}.1:{}:{}",
            f.letter, f.iid, f.sid, f.pos, f.name, f.tags, f.value
        );
    }
    out.push('\n');
    out
}

/// `show stat json` (and the stats page's `;json`) from the CSV answer of the same
/// query, as HAProxy 2.6 prints it: an array of rows, each an array of the typed
/// fields of the row, then a newline. An answer that is not CSV is kept.
pub fn stat_json(csv: &str) -> String {
    let Some(rows) = typed_rows(csv) else {
        return csv.to_owned();
    };
    let mut out = String::with_capacity(csv.len() * 12);
    out.push('[');
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('[');
        for (j, f) in row.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let obj = match f.letter {
                'F' => "Frontend",
                'B' => "Backend",
                _ => "Server",
            };
            let (tags, ty) = f.tags.split_once(':').unwrap_or((f.tags, "str"));
            let elem = info_json_element(f.pos as u32, f.name, tags, ty, f.value);
            // `{"field":...}` preceded by the object's identity, HAProxy's order.
            let _ = write!(
                out,
                "{{\"objType\":\"{obj}\",\"proxyId\":{},\"id\":{},{}",
                json_num(f.iid),
                json_num(f.sid),
                &elem[1..]
            );
        }
        out.push(']');
    }
    out.push_str("]\n");
    out
}

/// A CSV id cell as a JSON number (`0` if it is not one).
fn json_num(s: &str) -> u64 {
    s.parse().unwrap_or(0)
}

/// The word HAProxy's JSON output uses for each tag letter (origin, nature, scope).
fn tag_words(tags: &str) -> (&'static str, &'static str, &'static str) {
    let mut c = tags.chars();
    let origin = match c.next() {
        Some('S') => "Status",
        Some('K') => "Key",
        Some('C') => "Config",
        Some('P') => "Product",
        _ => "Metric",
    };
    let nature = match c.next() {
        Some('L') => "Limit",
        Some('m') => "Min",
        Some('M') => "Max",
        Some('R') => "Rate",
        Some('C') => "Counter",
        Some('D') => "Duration",
        Some('A') => "Age",
        Some('T') => "Time",
        Some('N') => "Name",
        Some('O') => "Output",
        Some('a') => "Avg",
        _ => "Gauge",
    };
    let scope = match c.next() {
        Some('S') => "Service",
        Some('s') => "System",
        Some('C') => "Cluster",
        _ => "Process",
    };
    (origin, nature, scope)
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One `show info json` element: `{"field":{...},"processNum":1,"tags":{...},"value":{...}}`.
/// Numeric types print their value as a JSON number (a value that is not one is quoted).
pub fn info_json_element(pos: u32, name: &str, tags: &str, ty: &str, value: &str) -> String {
    let (origin, nature, scope) = tag_words(tags);
    let numeric = matches!(ty, "u32" | "u64" | "s32" | "s64")
        && !value.is_empty()
        && value.parse::<i128>().is_ok();
    let v = if numeric {
        value.to_owned()
    } else {
        json_str(value)
    };
    format!(
        "{{\"field\":{{\"pos\":{pos},\"name\":{}}},\"processNum\":1,\"tags\":{{\"origin\":\"{origin}\",\
         \"nature\":\"{nature}\",\"scope\":\"{scope}\"}},\"value\":{{\"type\":\"{ty}\",\"value\":{v}}}}}",
        json_str(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_field_names_follow_the_csv_header() {
        let header = super::super::render::stat_header();
        let names: Vec<&str> = header
            .trim_start_matches("# ")
            .trim_end()
            .trim_end_matches(',')
            .split(',')
            .collect();
        for (i, f) in STAT_FIELDS.iter().enumerate() {
            assert_eq!(names[i], f.0, "column {i}");
        }
        assert_eq!(names[GENERIC_FIELDS], "-");
        for (i, (name, _)) in MODULE_FIELDS.iter().enumerate() {
            assert_eq!(names[GENERIC_FIELDS + 1 + i], *name);
        }
    }

    #[test]
    fn typed_stat_lines_as_haproxy_prints_them() {
        // A server row with a few cells set (columns 0, 1, 17, 27, 28, 32, 73, 104).
        let mut cells = vec![""; GENERIC_FIELDS + 1 + MODULE_FIELDS.len()];
        cells[0] = "b";
        cells[1] = "s1";
        cells[17] = "UP";
        cells[27] = "3";
        cells[28] = "1";
        cells[32] = "2";
        cells[73] = "127.0.0.1:19001";
        cells[GENERIC_FIELDS] = "-";
        cells[GENERIC_FIELDS + 1] = "0";
        let csv = format!("# pxname,svname\n{}\n\n", cells.join(","));
        let typed = stat_typed(&csv);
        let expected = "S.3.1.0.pxname.1:KNS:str:b\n\
                        S.3.1.1.svname.1:KNS:str:s1\n\
                        S.3.1.17.status.1:SGP:str:UP\n\
                        S.3.1.27.iid.1:KGS:u32:3\n\
                        S.3.1.28.sid.1:KGS:u32:1\n\
                        S.3.1.32.type.1:CGS:u32:2\n\
                        S.3.1.73.addr.1:CGS:str:127.0.0.1:19001\n\
                        S.3.1.103.ssl_sess.1:MCP:u64:0\n\n";
        assert_eq!(typed, expected);
        // Errors pass through.
        assert_eq!(stat_typed("No such proxy.\n\n"), "No such proxy.\n\n");
    }

    #[test]
    fn stat_json_is_haproxys_array_of_rows() {
        let mut fe = vec![""; GENERIC_FIELDS + 1 + MODULE_FIELDS.len()];
        fe[0] = "fe";
        fe[1] = "FRONTEND";
        fe[7] = "3";
        fe[27] = "2";
        fe[28] = "0";
        fe[32] = "0";
        let mut sv = fe.clone();
        sv[1] = "s1";
        sv[7] = "";
        sv[17] = "UP";
        sv[28] = "1";
        sv[32] = "2";
        let csv = format!("# pxname,svname\n{}\n{}\n\n", fe.join(","), sv.join(","));
        let json = stat_json(&csv);
        assert!(json.starts_with(
            "[[{\"objType\":\"Frontend\",\"proxyId\":2,\"id\":0,\"field\":{\"pos\":0,\"name\":\"pxname\"},\"processNum\":1,\"tags\":{\"origin\":\"Key\",\"nature\":\"Name\",\"scope\":\"Service\"},\"value\":{\"type\":\"str\",\"value\":\"fe\"}},"
        ), "{json}");
        assert!(json.contains("{\"objType\":\"Frontend\",\"proxyId\":2,\"id\":0,\"field\":{\"pos\":7,\"name\":\"stot\"},\"processNum\":1,\"tags\":{\"origin\":\"Metric\",\"nature\":\"Counter\",\"scope\":\"Process\"},\"value\":{\"type\":\"u64\",\"value\":3}}"), "{json}");
        assert!(
            json.contains("],[{\"objType\":\"Server\",\"proxyId\":2,\"id\":1,"),
            "{json}"
        );
        assert!(json.ends_with("}]]\n"), "{json}");
        assert_eq!(stat_json("No such proxy.\n"), "No such proxy.\n");
    }

    #[test]
    fn info_json_element_matches_haproxys_layout() {
        assert_eq!(
            info_json_element(0, "Name", "POS", "str", "HAProxy"),
            "{\"field\":{\"pos\":0,\"name\":\"Name\"},\"processNum\":1,\"tags\":{\"origin\":\"Product\",\"nature\":\"Output\",\"scope\":\"Service\"},\"value\":{\"type\":\"str\",\"value\":\"HAProxy\"}}"
        );
        assert_eq!(
            info_json_element(3, "Nbthread", "CGS", "u32", "2"),
            "{\"field\":{\"pos\":3,\"name\":\"Nbthread\"},\"processNum\":1,\"tags\":{\"origin\":\"Config\",\"nature\":\"Gauge\",\"scope\":\"Service\"},\"value\":{\"type\":\"u32\",\"value\":2}}"
        );
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}

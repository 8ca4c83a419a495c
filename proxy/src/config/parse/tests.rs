//! Tests of the keyword tables themselves, walked entry by entry: no table
//! holds a keyword twice for one section, every multi-word entry has its
//! one-word fallback, each entry stays within the places its table serves,
//! and each entry's [`Args`] holds: a keyword that needs an argument refuses
//! a line that stops after it, with an error naming file and line, and one
//! that needs none accepts it.

use super::super::{parse_str, ConfigError};
use super::{bind, global, log, proxy, server, stats_socket, tcp_check};
use super::{Args, Keyword, Sections};

/// A table as the walk sees it.
struct Table {
    name: &'static str,
    /// The places its scope can stand in.
    places: Sections,
    entries: Vec<(&'static [&'static str], Sections, Args)>,
}

fn table<C>(name: &'static str, places: Sections, t: &[Keyword<C>]) -> Table {
    Table {
        name,
        places,
        entries: t.iter().map(|k| (k.words, k.sections, k.args)).collect(),
    }
}

fn tables() -> Vec<Table> {
    vec![
        table("global", Sections::GLOBAL, global::GLOBAL),
        table("proxy", Sections::PROXIES, proxy::PROXY),
        table("ring", Sections::RING, log::RING),
        table(
            "server",
            Sections::SERVER.or(Sections::DEFAULT_SERVER),
            server::SERVER,
        ),
        table("stats socket", Sections::STATS_SOCKET, stats_socket::SOCKET),
        table("bind", Sections::BIND, bind::BIND),
        table(
            "tcp-check connect",
            Sections::TCP_CHECK_CONNECT,
            tcp_check::CONNECT,
        ),
        table(
            "tcp-check expect",
            Sections::TCP_CHECK_EXPECT,
            tcp_check::EXPECT,
        ),
    ]
}

/// Every place a keyword can stand in.
const PLACES: [(Sections, &str); 11] = [
    (Sections::GLOBAL, "global"),
    (Sections::DEFAULTS, "defaults"),
    (Sections::FRONTEND, "frontend"),
    (Sections::BACKEND, "backend"),
    (Sections::RING, "ring"),
    (Sections::SERVER, "server"),
    (Sections::DEFAULT_SERVER, "default-server"),
    (Sections::STATS_SOCKET, "stats socket"),
    (Sections::TCP_CHECK_CONNECT, "tcp-check connect"),
    (Sections::TCP_CHECK_EXPECT, "tcp-check expect"),
    (Sections::BIND, "bind"),
];

/// A configuration whose line 2 holds `words` in `place`. `tail` completes
/// the line where the place needs more than the keyword (an `expect` rule
/// needs a pattern); it is left off when the keyword must stop the line.
fn config(place: Sections, words: &str, tail: bool) -> String {
    let expect_tail = if tail { " string x" } else { "" };
    match place {
        Sections::GLOBAL => format!("global\n {words}\n"),
        Sections::DEFAULTS => format!("defaults\n {words}\n"),
        Sections::FRONTEND => format!("frontend fe\n {words}\n bind 127.0.0.1:1\n"),
        Sections::BACKEND => format!("backend be\n {words}\n"),
        Sections::RING => format!("ring r\n {words}\n"),
        Sections::SERVER => format!("backend be\n server s1 127.0.0.1:80 {words}\n"),
        Sections::DEFAULT_SERVER => format!("backend be\n default-server {words}\n"),
        Sections::STATS_SOCKET => format!("global\n stats socket /tmp/t.sock {words}\n"),
        Sections::TCP_CHECK_CONNECT => format!("backend be\n tcp-check connect {words}\n"),
        Sections::BIND => format!("frontend fe\n bind 127.0.0.1:1 {words}\n"),
        Sections::TCP_CHECK_EXPECT => {
            format!("backend be\n tcp-check expect {words}{expect_tail}\n")
        }
        _ => panic!("no configuration for {place:?}"),
    }
}

/// The errors `text` gets on line 2 of `kw.cfg`, as printed.
fn line2_errors(text: &str) -> Vec<String> {
    let Err(errors) = parse_str("kw.cfg", text) else {
        return Vec::new();
    };
    errors
        .iter()
        .filter(
            |e| matches!(e, ConfigError::Parse { at, .. } if at.file == "kw.cfg" && at.line == 2),
        )
        .map(ToString::to_string)
        .collect()
}

#[test]
fn no_keyword_twice_in_one_section() {
    for t in tables() {
        for (i, (words, sections, _)) in t.entries.iter().enumerate() {
            for (other, others, _) in &t.entries[i + 1..] {
                assert!(
                    words != other || !sections.meets(*others),
                    "table {}: '{}' appears twice in one section",
                    t.name,
                    words.join(" ")
                );
            }
        }
    }
}

#[test]
fn entries_fit_their_table() {
    for t in tables() {
        for (words, sections, args) in &t.entries {
            let kw = words.join(" ");
            assert!(
                !words.is_empty(),
                "table {}: an entry without words",
                t.name
            );
            assert!(
                sections.meets(t.places) && sections.or(t.places) == t.places,
                "table {}: '{kw}' is allowed outside the places its table serves",
                t.name
            );
            if words.len() > 1 {
                assert!(
                    t.entries.iter().any(|(w, _, _)| w[..] == words[..1]),
                    "table {}: '{kw}' has no one-word entry '{}' to parse the rest",
                    t.name,
                    words[0]
                );
            }
            // An option list walks on by the entry's Args: a value or nothing.
            let option_list = !t.places.meets(Sections::GLOBAL.or(Sections::PROXIES))
                && !t.places.meets(Sections::RING);
            assert!(
                !(option_list && *args == Args::Any),
                "table {}: option '{kw}' cannot take any number of words",
                t.name
            );
        }
    }
}

#[test]
fn each_keyword_needs_its_argument_or_none() {
    let mut walked = 0;
    for t in tables() {
        for (words, sections, args) in &t.entries {
            let kw = words.join(" ");
            for (place, place_name) in PLACES.iter().filter(|(p, _)| sections.meets(*p)) {
                walked += 1;
                match args {
                    Args::Required => {
                        let text = config(*place, &kw, false);
                        let errors = line2_errors(&text);
                        assert_eq!(
                            errors.len(),
                            1,
                            "table {}: '{kw}' without its argument in {place_name} should get one error on line 2, got {errors:?}\n{text}",
                            t.name
                        );
                        assert!(
                            errors[0].starts_with("parsing [kw.cfg:2] : "),
                            "table {}: '{kw}' : the error does not name file and line: {}",
                            t.name,
                            errors[0]
                        );
                    }
                    Args::None | Args::Any => {
                        let text = config(*place, &kw, true);
                        let errors = line2_errors(&text);
                        assert!(
                            errors.is_empty(),
                            "table {}: '{kw}' alone in {place_name} should be accepted, got {errors:?}\n{text}",
                            t.name
                        );
                    }
                }
            }
        }
    }
    // Every entry was walked in at least one place.
    let entries: usize = tables().iter().map(|t| t.entries.len()).sum();
    assert!(
        walked >= entries,
        "walked {walked} places for {entries} entries"
    );
}

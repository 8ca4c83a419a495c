//! Unit tests of the maps room: key syntax, the map file format, the persistent table
//! (longest-prefix match, duplicates, add/set/del, version sharing) and the registry.

use std::net::IpAddr;
use std::sync::Arc;

use super::*;
use crate::config::{Backend, Config, Location, MapSource};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    IpNet::parse(s).unwrap()
}

fn entry(seq: u64, key: &str, value: &str) -> Entry {
    Entry {
        seq,
        key: Arc::from(key),
        value: Arc::from(value),
        target: None,
    }
}

fn value_of(t: &Table, addr: &str) -> Option<String> {
    t.lookup(ip(addr)).map(|e| e.value.to_string())
}

#[test]
fn keys_parse_and_normalise_like_haproxy() {
    assert_eq!(net("10.0.0.1"), IpNet::v4(0x0a00_0001, 32));
    assert_eq!(net("10.1.2.3/8"), net("10.0.0.0/8"));
    assert_eq!(net("10.0.0.0/255.0.0.0"), net("10.0.0.0/8"));
    assert_eq!(net("0.0.0.0/0").prefix_len(), 0);
    assert_eq!(net("2001:db8::1/32"), net("2001:db8::/32"));
    assert_eq!(net("::1").prefix_len(), 128);
    for bad in [
        "k",
        "10.0.0.1/33",
        "10.0.0.1/",
        "10.0.0.0/255.0.255.0",
        "::1/129",
        "1.2.3",
        "",
    ] {
        assert_eq!(
            IpNet::parse(bad),
            Err(BadIpKey(bad.to_string())),
            "{bad} should be refused"
        );
    }
    assert_eq!(
        BadIpKey("k".into()).to_string(),
        "'k' is not a valid IPv4 or IPv6 address"
    );
}

#[test]
fn map_file_format_comments_blank_lines_and_values_with_spaces() {
    let text = "# key value\n\n  10.0.0.1 b\n127.0.0.1\tb\n10.0.0.0/8   be two  \r\n  # indented comment\n::1 six\n";
    let e = parse_text("x.map", text).unwrap();
    let kv: Vec<(&str, &str)> = e
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(
        kv,
        [
            ("10.0.0.1", "b"),
            ("127.0.0.1", "b"),
            ("10.0.0.0/8", "be two"),
            ("::1", "six")
        ]
    );
    let err = parse_text("/m/x.map", "10.0.0.1 a\nnope b\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "'nope' is not a valid IPv4 or IPv6 address at line 2 of file '/m/x.map'"
    );
    assert_eq!(
        load_file("/nonexistent/shunt.map", MapKind::Ip)
            .unwrap_err()
            .to_string(),
        "failed to open pattern file </nonexistent/shunt.map>"
    );
}

#[test]
fn longest_prefix_wins_in_both_families() {
    let mut t = Table::default();
    t.add(net("0.0.0.0/0"), entry(0, "0.0.0.0/0", "any"));
    t.add(net("10.0.0.0/8"), entry(1, "10.0.0.0/8", "ten"));
    t.add(net("10.1.0.0/16"), entry(2, "10.1.0.0/16", "ten-one"));
    t.add(net("10.1.2.3"), entry(3, "10.1.2.3", "host"));
    t.add(net("2001:db8::/32"), entry(4, "2001:db8::/32", "doc"));
    t.add(net("2001:db8:1::/48"), entry(5, "2001:db8:1::/48", "doc1"));
    assert_eq!(value_of(&t, "10.1.2.3").as_deref(), Some("host"));
    assert_eq!(value_of(&t, "10.1.2.4").as_deref(), Some("ten-one"));
    assert_eq!(value_of(&t, "10.2.0.1").as_deref(), Some("ten"));
    assert_eq!(value_of(&t, "192.168.0.1").as_deref(), Some("any"));
    assert_eq!(value_of(&t, "2001:db8:1::5").as_deref(), Some("doc1"));
    assert_eq!(value_of(&t, "2001:db8:2::5").as_deref(), Some("doc"));
    assert_eq!(value_of(&t, "2001:db9::1"), None);
    // A v4-mapped IPv6 client matches IPv4 keys.
    assert_eq!(value_of(&t, "::ffff:10.1.2.3").as_deref(), Some("host"));
    assert_eq!(t.len(), 6);
}

#[test]
fn add_set_del_and_duplicates_follow_haproxy() {
    let mut t = Table::default();
    t.add(net("10.0.0.1"), entry(0, "10.0.0.1", "a"));
    t.add(net("10.0.0.1"), entry(1, "10.0.0.1", "b"));
    assert_eq!(t.len(), 2);
    // The oldest of duplicates answers.
    assert_eq!(value_of(&t, "10.0.0.1").as_deref(), Some("a"));
    // `set` changes every entry of the key.
    assert!(t.set(net("10.0.0.1"), &Arc::from("c"), Some(3)));
    assert!(t.entries_in_order().iter().all(|e| &*e.value == "c"));
    assert_eq!(t.lookup(ip("10.0.0.1")).and_then(|e| e.target), Some(3));
    assert!(!t.set(net("10.0.0.2"), &Arc::from("x"), None));
    // `remove_seq` removes one entry, `remove` the rest.
    assert!(t.remove_seq(0));
    assert_eq!(t.len(), 1);
    assert!(!t.remove_seq(0));
    assert!(t.remove(net("10.0.0.1")));
    assert!(!t.remove(net("10.0.0.1")));
    assert!(t.is_empty());
    assert_eq!(value_of(&t, "10.0.0.1"), None);
    // Once its last /8 key is gone, that length is no longer probed.
    t.add(net("10.0.0.0/8"), entry(2, "10.0.0.0/8", "ten"));
    assert!(t.remove(net("10.0.0.0/8")));
    assert_eq!(value_of(&t, "10.9.9.9"), None);
}

#[test]
fn versions_share_structure_and_old_versions_are_untouched() {
    let mut v1 = Table::default();
    for i in 0..5000u32 {
        let k = std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string();
        v1.add(net(&k), entry(u64::from(i), &k, "old"));
    }
    let mut v2 = v1.clone();
    v2.add(net("192.168.1.1"), entry(9999, "192.168.1.1", "new"));
    assert!(v2.set(net("10.0.0.7"), &Arc::from("changed"), None));
    assert!(v2.remove(net("10.0.0.8")));
    // The published version a flow holds is unchanged.
    assert_eq!(value_of(&v1, "10.0.0.7").as_deref(), Some("old"));
    assert_eq!(value_of(&v1, "10.0.0.8").as_deref(), Some("old"));
    assert_eq!(value_of(&v1, "192.168.1.1"), None);
    assert_eq!(v1.len(), 5000);
    assert_eq!(value_of(&v2, "10.0.0.7").as_deref(), Some("changed"));
    assert_eq!(value_of(&v2, "10.0.0.8"), None);
    assert_eq!(value_of(&v2, "192.168.1.1").as_deref(), Some("new"));
    assert_eq!(v2.len(), 5000);
    // Insertion order survives the hashing.
    let seqs: Vec<u64> = v2.entries_in_order().iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
}

fn config_with_map(entries: &str) -> Config {
    let be = |name: &str| Backend {
        name: name.into(),
        id: 1,
        balance: Default::default(),
        servers: vec![],
        timeouts: Default::default(),
        retries: 3,
        redispatch: false,
        splice: Default::default(),
        maxconn: 0,
        log_global: false,
        line: Location::default(),
        opts: Default::default(),
        tcp_content: Vec::new(),
        stick: vec![],
    };
    Config {
        backends: vec![be("a"), be("b")],
        maps: vec![MapSource {
            path: "/etc/shunt/src.map".into(),
            used_at: Location {
                file: "shunt.cfg".into(),
                line: 16,
            },
            entries: parse_text("src.map", entries).unwrap(),
        }],
        ..Config::default()
    }
}

#[test]
fn registry_resolves_names_routes_and_applies_changes() {
    let maps = Maps::new(&config_with_map(
        "127.0.0.2 a\n127.0.0.3 b\n10.0.0.0/8 nosuch\n",
    ));
    let m = maps.find("#0").unwrap();
    assert!(std::ptr::eq(m, maps.find("/etc/shunt/src.map").unwrap()));
    assert!(maps.find("#1").is_none());
    assert!(maps.find("#x").is_none());
    assert!(maps.find("/other.map").is_none());
    assert_eq!(
        m.describe(),
        "0 (/etc/shunt/src.map) pattern loaded from file '/etc/shunt/src.map' used by map at file 'shunt.cfg' line 16. curr_ver=0 next_ver=0 entry_cnt=3"
    );
    assert_eq!(maps.route(0, ip("127.0.0.2")), Some(Some(0)));
    assert_eq!(maps.route(0, ip("127.0.0.3")), Some(Some(1)));
    // A value naming no backend is a match without a target.
    assert_eq!(maps.route(0, ip("10.1.1.1")), Some(None));
    assert_eq!(maps.route(0, ip("192.0.2.1")), None);

    let before = m.table();
    maps.set(m, "127.0.0.2", "b").unwrap();
    assert_eq!(maps.route(0, ip("127.0.0.2")), Some(Some(1)));
    // A version taken before the change still answers the old way.
    assert_eq!(
        before.lookup(ip("127.0.0.2")).and_then(|e| e.target),
        Some(0)
    );
    maps.del(m, "127.0.0.3").unwrap();
    assert_eq!(maps.route(0, ip("127.0.0.3")), None);
    assert_eq!(maps.del(m, "127.0.0.3"), Err(MapError::KeyNotFound));
    assert_eq!(maps.del(m, "garbage"), Err(MapError::KeyNotFound));
    assert_eq!(maps.set(m, "10.9.9.9", "a"), Err(MapError::EntryNotFound));
    assert_eq!(
        maps.add(m, "k", "v").unwrap_err().to_string(),
        "'k' is not a valid IPv4 or IPv6 address"
    );
    maps.add(m, "192.0.2.0/24", "a").unwrap();
    assert_eq!(maps.route(0, ip("192.0.2.1")), Some(Some(0)));

    // Delete by the reference `show map` prints.
    let e = m.table().get_exact(net("192.0.2.0/24")).cloned().unwrap();
    maps.del(m, &format!("#0x{:x}", entry_ptr(&e))).unwrap();
    assert_eq!(maps.route(0, ip("192.0.2.1")), None);

    // Payload: applied up to the first bad line.
    assert_eq!(
        maps.add_payload(m, "10.0.0.1 a\n10.0.0.2 b with space\nbad x\n10.0.0.3 a\n"),
        Err(MapError::BadKey(BadIpKey("bad".into())))
    );
    assert_eq!(maps.route(0, ip("10.0.0.1")), Some(Some(0)));
    assert_eq!(maps.route(0, ip("10.0.0.3")), Some(None)); // the /8 "nosuch"
    assert_eq!(
        maps.add_payload(m, "10.0.0.4\n").unwrap_err().to_string(),
        "Missing value for key '10.0.0.4'"
    );
    maps.clear(m);
    assert!(m.table().is_empty());
    assert_eq!(maps.route(0, ip("127.0.0.2")), None);
}

#[test]
fn deferred_changes_publish_on_publish_read_or_guard_drop() {
    let maps = Maps::new(&config_with_map("127.0.0.2 a\n"));
    let m = maps.find("#0").unwrap();
    {
        let _d = maps.defer();
        maps.add(m, "10.0.0.1", "a").unwrap();
        assert_eq!(
            maps.route(0, ip("10.0.0.1")),
            None,
            "staged, not yet published"
        );
        maps.publish();
        assert_eq!(maps.route(0, ip("10.0.0.1")), Some(Some(0)));
        maps.add(m, "10.0.0.2", "b").unwrap();
        // A CLI read publishes first, so it sees the change.
        assert_eq!(m.table().len(), 3);
        assert_eq!(maps.route(0, ip("10.0.0.2")), Some(Some(1)));
        maps.del(m, "10.0.0.1").unwrap();
        assert_eq!(maps.route(0, ip("10.0.0.1")), Some(Some(0)));
    }
    assert_eq!(maps.route(0, ip("10.0.0.1")), None, "guard drop publishes");
    // Without a guard every change is published at once.
    maps.add(m, "10.0.0.3", "a").unwrap();
    assert_eq!(maps.route(0, ip("10.0.0.3")), Some(Some(0)));
}

#[test]
fn map_beg_takes_the_first_key_in_file_order_that_starts_the_name() {
    let mut t = Table::new(MapKind::Str);
    t.add(MapKey::string("api"), entry(0, "api", "first"));
    t.add(MapKey::string("api.v2"), entry(1, "api.v2", "second"));
    t.add(MapKey::string("db"), entry(2, "db", "db"));
    let v = |e: Option<&Entry>| e.map(|e| e.value.to_string());
    assert_eq!(
        v(t.lookup_beg("api.v2.example")),
        Some("first".into()),
        "file order, not longest"
    );
    assert_eq!(v(t.lookup_beg("DB-1")), Some("db".into()));
    assert_eq!(v(t.lookup_beg("ap")), None);
    assert_eq!(v(t.lookup_beg("")), None);
}

#[test]
fn string_maps_match_exactly_and_by_domain_suffix() {
    let mut t = Table::new(MapKind::Str);
    t.add(MapKey::string("Example.com"), entry(0, "Example.com", "ex"));
    t.add(MapKey::string("b.test"), entry(1, "b.test", "b"));
    let v = |e: Option<&Entry>| e.map(|e| e.value.to_string());
    assert_eq!(v(t.lookup_str("EXAMPLE.com")), Some("ex".into()));
    assert_eq!(v(t.lookup_str("a.example.com")), None, "map is exact");
    assert_eq!(v(t.lookup_dom("a.b.example.com")), Some("ex".into()));
    assert_eq!(v(t.lookup_dom("example.com")), Some("ex".into()));
    assert_eq!(v(t.lookup_dom("badexample.com")), None, "labels, not bytes");
    assert_eq!(v(t.lookup_dom("com")), None);
    assert_eq!(v(t.lookup_dom("")), None);
    assert_eq!(v(t.lookup_text("b.test")), Some("b".into()));
    assert!(t.set(MapKey::string("B.TEST"), &Arc::from("c"), None));
    assert_eq!(v(t.lookup_str("b.test")), Some("c".into()));
    assert!(t.remove(MapKey::string("b.test")));
    assert_eq!(t.len(), 1);
    // An IP-looking key is just a string here.
    t.add(MapKey::string("10.0.0.1"), entry(2, "10.0.0.1", "ip"));
    assert_eq!(v(t.lookup_text("10.0.0.1")), Some("ip".into()));
    assert_eq!(t.lookup("10.0.0.1".parse().unwrap()), None);
}

#[test]
fn string_map_files_and_runtime_changes() {
    let entries = parse_text_as("s.map", "# names\nA.test a\n10.0.0.1 b\n", MapKind::Str).unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[1].pattern, MapKey::string("10.0.0.1"));
    // The same text as an IP map fails on the name.
    assert!(parse_text("s.map", "A.test a\n").is_err());
}

/// Every entry of `t` through [`OrderedScan`] passes of `max`, `budget` entries a step.
fn paged(t: &Table, max: usize, budget: usize) -> (Vec<u64>, usize) {
    let mut seqs = Vec::new();
    let mut passes = 0;
    let mut after = None;
    loop {
        let mut scan = table::OrderedScan::new(after, max);
        passes += 1;
        while !scan.step(t, budget) {}
        let got = scan.finish();
        assert!(got.len() <= max);
        seqs.extend(got.iter().map(|e| e.seq));
        if got.len() < max {
            return (seqs, passes);
        }
        after = got.last().map(|e| e.seq);
    }
}

#[test]
fn ordered_scan_pages_every_entry_once_in_insertion_order() {
    let mut t = Table::default();
    // Seqs out of step with the hash order, with gaps and duplicate keys.
    let mut want = Vec::new();
    for i in 0..3000u32 {
        let seq = u64::from(i) * 7 + 3;
        let k = std::net::Ipv4Addr::from(0x0a00_0000 + (i % 2500)).to_string();
        t.add(net(&k), entry(seq, &k, "v"));
        want.push(seq);
    }
    for (max, budget) in [(29, usize::MAX), (7, 1), (100, 13), (3000, 640), (5000, 0)] {
        let (got, passes) = paged(&t, max, budget);
        assert_eq!(got, want, "max {max}");
        assert_eq!(passes, 3000 / max + 1, "max {max}");
    }
    // An empty table: one pass, nothing.
    assert_eq!(paged(&Table::default(), 10, 100), (vec![], 1));
}

#[test]
fn a_selection_is_handed_out_oldest_first() {
    let mut t = Table::default();
    for i in 0..2000u32 {
        // Seqs in an order unrelated to the keys' hash order.
        let seq = u64::from((i * 7919) % 2000) + 10;
        let k = std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string();
        t.add(net(&k), entry(seq, &k, "v"));
    }
    let mut scan = table::OrderedScan::new(Some(109), 500);
    while !scan.step(&t, 64) {}
    assert_eq!(scan.newest(), (Some(609), 500));
    let mut oldest = scan.into_oldest();
    assert_eq!(oldest.len(), 500);
    let got: Vec<u64> = std::iter::from_fn(|| oldest.pop()).map(|e| e.seq).collect();
    assert_eq!(got, (110..610).collect::<Vec<_>>());
    assert!(oldest.is_empty());
}

#[test]
fn a_big_table_is_freed_off_the_dropping_thread_and_nothing_leaks() {
    let mut t = Table::default();
    let n = table::DROP_LATER_ENTRIES as u32 + 10;
    for i in 0..n {
        let k = std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string();
        t.add(net(&k), entry(u64::from(i), &k, "v"));
    }
    let probe = t.get_exact(net("10.0.0.1")).unwrap().key.clone();
    assert_eq!(Arc::strong_count(&probe), 2);
    assert!(!on_drop_thread());
    drop(t);
    // The entries are released by the shunt-drop thread, soon.
    let t0 = std::time::Instant::now();
    while Arc::strong_count(&probe) > 1 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "table never freed"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn prepared_versions_stay_private_until_commit() {
    let maps = Maps::new(&config_with_map("127.0.0.2 a\n127.0.0.3 a\n"));
    let m = maps.find("#0").unwrap();
    assert_eq!(m.versions(), (0, 0));
    // Adding to a version nobody prepared.
    assert_eq!(
        maps.add_at(m, Some(1), "127.0.0.2", "b"),
        Err(MapError::VersionInFuture)
    );
    assert_eq!(
        MapError::VersionInFuture.to_string(),
        "Version number in the future, please use 'prepare map' before"
    );
    // The future check comes before the key check, as in HAProxy.
    assert_eq!(
        maps.add_at(m, Some(1), "junk", "b"),
        Err(MapError::VersionInFuture)
    );
    assert_eq!(
        maps.add_payload_at(m, Some(1), "127.0.0.2 b\n"),
        Err(MapError::VersionInFuture)
    );
    assert_eq!(m.prepare(), 1);
    assert_eq!(m.versions(), (0, 1));
    assert!(m.describe().contains(" curr_ver=0 next_ver=1 entry_cnt=2"));
    maps.add_at(m, Some(1), "127.0.0.2", "b").unwrap();
    maps.add_payload_at(m, Some(1), "127.0.0.9 b\n10.0.0.0/8 a\n")
        .unwrap();
    // Flows and the current version do not see version 1.
    assert_eq!(maps.route(0, ip("127.0.0.2")), Some(Some(0)));
    assert_eq!(maps.route(0, ip("127.0.0.9")), None);
    assert_eq!(m.table().len(), 2);
    assert_eq!(m.table_at(1).len(), 3);
    assert_eq!(m.table_at(0).len(), 2);
    assert!(m.table_at(7).is_empty());
    // `@0` is the current version: a plain add.
    maps.add_at(m, Some(0), "127.0.0.4", "b").unwrap();
    assert_eq!(maps.route(0, ip("127.0.0.4")), Some(Some(1)));

    // A second prepared version survives the commit of the first.
    assert_eq!(m.prepare(), 2);
    maps.add_at(m, Some(2), "127.0.0.5", "a").unwrap();
    // Out of range: the current version, the future, nothing at all.
    for v in [0, 3, 100, u32::MAX] {
        assert_eq!(m.commit(v), Err(MapError::VersionOutOfRange), "@{v}");
    }
    // Staged changes of the outgoing table are discarded with it.
    let d = maps.defer();
    maps.add(m, "127.0.0.6", "a").unwrap();
    let held = m.current.load_full();
    m.commit(1).unwrap();
    drop(d);
    assert_eq!(m.versions(), (1, 2));
    assert_eq!(
        maps.route(0, ip("127.0.0.2")),
        Some(Some(1)),
        "version 1 live"
    );
    assert_eq!(maps.route(0, ip("127.0.0.9")), Some(Some(1)));
    assert_eq!(maps.route(0, ip("127.0.0.3")), None, "version 0 is gone");
    assert_eq!(maps.route(0, ip("127.0.0.4")), None);
    assert_eq!(maps.route(0, ip("127.0.0.6")), None);
    // A flow that loaded version 0 before the commit keeps answering by it.
    assert_eq!(held.lookup(ip("127.0.0.3")).and_then(|e| e.target), Some(0));
    assert_eq!(m.table().len(), 3);
    assert_eq!(m.commit(1), Err(MapError::VersionOutOfRange), "no recommit");
    assert_eq!(m.table_at(2).len(), 1);
    // Clearing a prepared version empties it; committing it empties the map.
    maps.clear_at(m, 2);
    assert!(m.table_at(2).is_empty());
    m.commit(2).unwrap();
    assert!(m.table().is_empty());
    assert_eq!(m.versions(), (2, 2));
    // `clear map @curr` clears the live table.
    maps.add(m, "127.0.0.2", "a").unwrap();
    maps.clear_at(m, 2);
    assert_eq!(maps.route(0, ip("127.0.0.2")), None);
}

#[test]
fn versions_wrap_like_haproxy_generations() {
    assert_eq!(parse_version("12"), 12);
    assert_eq!(parse_version("12abc"), 12);
    assert_eq!(parse_version(""), 0);
    assert_eq!(parse_version("x1"), 0);
    assert_eq!(parse_version("4294967297"), 1);
    assert!(ver_after(1, 0));
    assert!(ver_after(0, u32::MAX));
    assert!(!ver_after(u32::MAX, 0));
    assert!(!ver_after(5, 5));
}

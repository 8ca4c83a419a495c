//! Tables on a hand-driven clock: LRU eviction at `size`, `nopurge`,
//! expiry (lazy and by the purge), tracked entries surviving both, the
//! counters a tracked flow updates, and many threads on one table.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::{DataType, KeyType, Location, Store};

fn spec(size: usize, expire: Option<Duration>, nopurge: bool) -> TableSpec {
    let mut store = Store::default();
    for t in [DataType::ConnCnt, DataType::ConnCur, DataType::Gpc0] {
        store.add(t, 0);
    }
    store.add(DataType::ConnRate, 10_000);
    store.add(DataType::Gpc0Rate, 10_000);
    store.add(DataType::ServerId, 0);
    TableSpec {
        name: "t".into(),
        key: KeyType::Ip,
        size,
        expire,
        nopurge,
        store,
        line: Location::default(),
    }
}

fn ip(last: u8) -> Key {
    Key::V4([10, 0, 0, last])
}

fn keys(t: &Table, now: u32) -> Vec<String> {
    t.snapshot(now, &|_, _| true)
        .iter()
        .map(|e| e.key.to_string())
        .collect()
}

#[test]
fn a_full_table_evicts_the_least_recently_used() {
    let t = Table::new(&spec(2, None, false), 0);
    let name = "s1";
    t.store_server(&ip(1), 10, 1, name);
    t.store_server(&ip(2), 20, 1, name);
    // Touching 1 makes 2 the oldest.
    t.store_server(&ip(1), 30, 1, name);
    t.store_server(&ip(3), 40, 1, name);
    assert_eq!(keys(&t, 50), ["10.0.0.1", "10.0.0.3"]);
    assert_eq!(t.used(), 2);
}

#[test]
fn tracked_entries_are_not_evicted() {
    let t = Table::new(&spec(2, None, false), 0);
    let a = t.track(&ip(1), 10).expect("room");
    let b = t.track(&ip(2), 20).expect("room");
    assert!(t.track(&ip(3), 30).is_none(), "both entries are in use");
    t.release(a, 40, 0, 0);
    assert!(t.track(&ip(3), 50).is_some(), "1 is free to go now");
    assert_eq!(keys(&t, 60), ["10.0.0.2", "10.0.0.3"]);
    t.release(b, 70, 0, 0);
}

#[test]
fn nopurge_refuses_new_keys_when_full() {
    let t = Table::new(&spec(1, None, true), 0);
    let name = "db1";
    t.store_server(&ip(1), 10, 1, name);
    t.store_server(&ip(2), 20, 2, name);
    assert_eq!(keys(&t, 30), ["10.0.0.1"]);
    assert_eq!(t.server_of(&ip(1), 30), Some(1));
    assert_eq!(t.server_of(&ip(2), 30), None);
}

#[test]
fn entries_expire_unless_tracked() {
    let t = Table::new(&spec(10, Some(Duration::from_secs(1)), false), 0);
    let name = "s";
    t.store_server(&ip(1), 0, 1, name);
    let held = t.track(&ip(2), 0).expect("room");
    assert_eq!(t.server_of(&ip(1), 999), Some(1), "not yet");
    assert_eq!(t.server_of(&ip(1), 1000), None, "expired on lookup");
    assert_eq!(keys(&t, 5000), ["10.0.0.2"], "tracked: kept past expire");
    t.release(held, 5000, 0, 0);
    let e = &t.snapshot(5400, &|_, _| true)[0];
    assert_eq!(e.exp, 600, "expire counts from the release");
    assert_eq!(t.purge(5999, 100), 0);
    assert_eq!(t.purge(6000, 100), 1);
    assert_eq!(t.used(), 0);
}

#[test]
fn purge_stops_at_the_first_fresh_entry() {
    let t = Table::new(&spec(100, Some(Duration::from_millis(100)), false), 0);
    let name = "s";
    for i in 0..10 {
        t.store_server(&ip(i), u32::from(i) * 10, 1, name);
    }
    // At 150 the entries touched at 0..=50 are expired (6 of them).
    assert_eq!(t.purge(150, 100), 6);
    assert_eq!(t.used(), 4);
    assert_eq!(t.purge(150, 100), 0);
}

#[test]
fn a_tracked_flow_counts_connections_and_bytes() {
    let t = Table::new(&spec(10, None, false), 0);
    let a = t.track(&ip(1), 100).expect("room");
    let b = t.track(&ip(1), 200).expect("room");
    assert_eq!(a, b, "one entry per key");
    assert_eq!(t.fetch(a, StickFetch::ConnCnt, 300), Some(2));
    assert_eq!(t.fetch(a, StickFetch::ConnCur, 300), Some(2));
    assert_eq!(t.fetch(a, StickFetch::ConnRate, 300), Some(2));
    assert_eq!(t.fetch(a, StickFetch::SessCnt, 300), None, "not stored");
    assert_eq!(t.fetch(a, StickFetch::IncGpc0, 300), Some(1));
    assert_eq!(t.fetch(a, StickFetch::IncGpc0, 300), Some(2));
    assert_eq!(t.fetch(a, StickFetch::Gpc0Rate, 300), Some(2));
    t.release(a, 400, 10, 20);
    t.release(b, 400, 1, 2);
    assert_eq!(
        t.fetch_key(&ip(1), StickFetch::ConnCur, 500),
        Some(0),
        "both flows ended"
    );
    assert_eq!(
        t.fetch_key(&ip(9), StickFetch::ConnCnt, 500),
        Some(0),
        "absent: 0"
    );
    let e = &t.snapshot(500, &|_, _| true)[0];
    assert_eq!(e.refs, 0);
    assert_eq!(e.data.conn_cnt, 2);
}

#[test]
fn keys_from_addresses_follow_the_table_type() {
    let v4 = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("ip");
    let v6: IpAddr = "::1".parse().expect("ip");
    assert_eq!(
        Key::of_addr(KeyType::Ip, mapped),
        Some(Key::V4([127, 0, 0, 1]))
    );
    assert_eq!(Key::of_addr(KeyType::Ip, v6), None);
    assert_eq!(
        Key::of_addr(KeyType::Ipv6, v4)
            .map(|k| k.to_string())
            .as_deref(),
        Some("::ffff:127.0.0.1")
    );
    assert_eq!(
        Key::of_addr(KeyType::String { len: 5 }, v4)
            .map(|k| k.to_string())
            .as_deref(),
        Some("127.0")
    );
    assert_eq!(
        Key::parse(KeyType::Ip, "abc"),
        Ok(Key::V4([0; 4])),
        "HAProxy's quirk"
    );
    assert_eq!(Key::parse(KeyType::Ipv6, "1.2.3.4"), Err(KeyError::Invalid));
    assert_eq!(Key::parse(KeyType::Integer, "x42"), Err(KeyError::Invalid));
}

#[test]
fn many_threads_share_one_table() {
    const THREADS: u32 = 4;
    const FLOWS: u32 = 2000;
    let tables = Arc::new(Tables::new(&[spec(64, None, false)]));
    let workers: Vec<_> = (0..THREADS)
        .map(|n| {
            let tables = Arc::clone(&tables);
            std::thread::spawn(move || {
                for i in 0..FLOWS {
                    let mut tr = Tracker::new(&tables);
                    // 16 shared keys, so threads collide on entries.
                    tr.track(0, 0, IpAddr::V4(Ipv4Addr::new(10, 0, 0, (i % 16) as u8)));
                    assert!(tr.any(), "thread {n}: a 64-entry table holds 16 keys");
                    tr.set_bytes(1, 2);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let t = tables.get(0).expect("table");
    let all = t.snapshot(tables.now_ms(), &|_, _| true);
    assert_eq!(all.len(), 16);
    let total: u32 = all.iter().map(|e| e.data.conn_cnt).sum();
    assert_eq!(total, THREADS * FLOWS, "no update lost");
    assert!(all.iter().all(|e| e.refs == 0 && e.data.conn_cur == 0));
}

//! Byte counts and rates as xtask and the bench print them.

use std::time::Duration;

/// `bytes` in B, KiB, MiB or GiB (one decimal above bytes).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Gbit/s of `bytes` moved in `d`.
pub fn gbits(bytes: u64, d: Duration) -> f64 {
    bytes as f64 * 8.0 / d.as_secs_f64().max(1e-9) / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(8 << 20), "8.0 MiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}

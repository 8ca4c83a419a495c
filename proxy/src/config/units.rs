//! Time and size values as HAProxy writes them.
//!
//! Owns [`parse_time`] (default unit ms; `us ms s m h d`, case-sensitive as
//! in HAProxy) and [`parse_size`] (bytes; `k m g` suffixes, case-insensitive,
//! powers of 1024). Both are pure: no I/O, no global state.

use std::time::Duration;

/// HAProxy stores timers as signed 32-bit milliseconds: anything longer is
/// rejected rather than silently wrapped.
pub const MAX_TIMER_MS: u64 = i32::MAX as u64;

/// Why a time or size value was rejected; the caller adds which keyword it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("missing value")]
    Empty,
    #[error("unexpected character '{0}'")]
    UnexpectedChar(char),
    #[error("timer overflow in argument '{0}' (maximum value is 2147483647 ms or ~24.8 days)")]
    TimerOverflow(String),
    #[error("value '{0}' is too large")]
    SizeOverflow(String),
}

/// Splits `s` into its leading decimal digits and the rest.
fn split_number(s: &str) -> Result<(u64, &str), UnitError> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 {
        return match s.chars().next() {
            None => Err(UnitError::Empty),
            Some(c) => Err(UnitError::UnexpectedChar(c)),
        };
    }
    let n: u64 = s[..end]
        .parse()
        .map_err(|_| UnitError::SizeOverflow(s.to_string()))?;
    Ok((n, &s[end..]))
}

/// Parses an HAProxy time value: `10` (ms), `10us`, `10ms`, `10s`, `10m`, `10h`, `10d`.
///
/// Results longer than [`MAX_TIMER_MS`] are an error, as in HAProxy.
pub fn parse_time(s: &str) -> Result<Duration, UnitError> {
    let (n, unit) = split_number(s)?;
    let overflow = || UnitError::TimerOverflow(s.to_string());
    // Microseconds per unit.
    let per_unit: u64 = match unit {
        "" | "ms" => 1_000,
        "us" => 1,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => {
            // Skip the longest valid unit prefix and report what follows it.
            let rest = if unit.starts_with("us") || unit.starts_with("ms") {
                &unit[2..]
            } else if unit.starts_with(['s', 'm', 'h', 'd']) {
                &unit[1..]
            } else {
                unit
            };
            return Err(UnitError::UnexpectedChar(
                rest.chars().next().unwrap_or('?'),
            ));
        }
    };
    let us = n.checked_mul(per_unit).ok_or_else(overflow)?;
    if us / 1_000 > MAX_TIMER_MS {
        return Err(overflow());
    }
    Ok(Duration::from_micros(us))
}

/// Parses an HAProxy size value: `512`, `16k`, `1m`, `2g` (case-insensitive, powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let (n, unit) = split_number(s)?;
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1 << 10,
        "m" | "M" => 1 << 20,
        "g" | "G" => 1 << 30,
        _ => {
            let first = unit.chars().next().unwrap_or('?');
            let c = if "kKmMgG".contains(first) {
                unit[1..].chars().next().unwrap_or('?')
            } else {
                first
            };
            return Err(UnitError::UnexpectedChar(c));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| UnitError::SizeOverflow(s.to_string()))
}

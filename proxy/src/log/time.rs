//! Local broken-down time for log dates (HAProxy prints local time), and the
//! time-zone offset RFC 5424 timestamps carry.
//!
//! The one `unsafe` call of the log room lives here: `localtime_r`, which is
//! thread-safe (it writes only to the caller's buffer).

use std::time::SystemTime;

pub const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// A local date and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tm {
    pub year: i32,
    /// 0..=11.
    pub mon: usize,
    pub mday: u32,
    pub hour: u32,
    pub min: u32,
    pub sec: u32,
    pub nanos: u32,
    /// Offset from UTC, seconds east.
    pub gmtoff: i64,
}

impl Tm {
    /// `t` in the process's local time zone (UTC if the conversion fails).
    pub fn local(t: SystemTime) -> Self {
        let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let secs = libc::time_t::try_from(d.as_secs()).unwrap_or(0);
        // SAFETY: `tm` is a plain C struct for which all-zero bytes are valid;
        // localtime_r reads `secs` and writes only into `tm`, both live locals.
        let (ok, tm) = unsafe {
            let mut tm: libc::tm = std::mem::zeroed();
            let ok = !libc::localtime_r(&secs, &mut tm).is_null();
            (ok, tm)
        };
        if !ok {
            return Self::utc(d.as_secs(), d.subsec_nanos());
        }
        Self {
            year: tm.tm_year + 1900,
            mon: usize::try_from(tm.tm_mon).unwrap_or(0).min(11),
            mday: u32::try_from(tm.tm_mday).unwrap_or(1),
            hour: u32::try_from(tm.tm_hour).unwrap_or(0),
            min: u32::try_from(tm.tm_min).unwrap_or(0),
            sec: u32::try_from(tm.tm_sec).unwrap_or(0),
            nanos: d.subsec_nanos(),
            gmtoff: tm.tm_gmtoff,
        }
    }

    /// UTC from Unix seconds (civil-from-days, proleptic Gregorian).
    fn utc(secs: u64, nanos: u32) -> Self {
        let days = i64::try_from(secs / 86_400).unwrap_or(0);
        let rem = secs % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        Self {
            year: i32::try_from(y).unwrap_or(1970),
            mon: usize::try_from(m - 1).unwrap_or(0),
            mday: u32::try_from(d).unwrap_or(1),
            hour: u32::try_from(rem / 3600).unwrap_or(0),
            min: u32::try_from(rem / 60 % 60).unwrap_or(0),
            sec: u32::try_from(rem % 60).unwrap_or(0),
            nanos,
            gmtoff: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_civil_dates() {
        let t = Tm::utc(1_234_567_890, 0);
        assert_eq!(
            (t.year, t.mon, t.mday, t.hour, t.min, t.sec),
            (2009, 1, 13, 23, 31, 30)
        );
        let t = Tm::utc(951_782_400, 0); // 2000-02-29
        assert_eq!((t.year, t.mon, t.mday), (2000, 1, 29));
    }
}

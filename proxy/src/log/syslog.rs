//! Syslog framing: the header each format (named in `config::logspec`, with
//! the facilities and levels) puts before a log line (`rfc3164`, `rfc5424`, `short`, `raw`) as HAProxy writes
//! them, with `len` truncation.
//!
//! Owns no I/O: it turns a message into the bytes one transport sends.

use std::fmt::Write as _;
use std::time::SystemTime;

use super::time::{Tm, MONTHS};

pub use crate::config::logspec::{
    facility, level, SyslogFormat, DEFAULT_MAXLEN, FACILITIES, LEVELS, MAX_MAXLEN, MIN_MAXLEN,
};

/// The level traffic logs are emitted at (HAProxy: `info`).
pub const LEVEL_INFO: u8 = 6;

/// The tag (program name) every header carries, as HAProxy uses its own name.
pub const TAG: &str = "shunt";

/// Write the header of `fmt` for a message at `facility`/`level` sent at `now`.
pub fn header(
    fmt: SyslogFormat,
    facility: u8,
    level: u8,
    now: SystemTime,
    hostname: &str,
    out: &mut Vec<u8>,
) {
    let pri = u32::from(facility) * 8 + u32::from(level);
    let mut s = String::with_capacity(64);
    let _ = match fmt {
        SyslogFormat::Raw => Ok(()),
        SyslogFormat::Short => write!(s, "<{pri}>"),
        SyslogFormat::Rfc3164 => {
            let tm = Tm::local(now);
            write!(
                s,
                "<{pri}>{} {:>2} {:02}:{:02}:{:02} {TAG}[{}]: ",
                MONTHS[tm.mon],
                tm.mday,
                tm.hour,
                tm.min,
                tm.sec,
                std::process::id()
            )
        }
        SyslogFormat::Rfc5424 => {
            let tm = Tm::local(now);
            let off = tm.gmtoff.abs();
            let sign = if tm.gmtoff < 0 { '-' } else { '+' };
            write!(
                s,
                "<{pri}>1 {:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}{sign}{:02}:{:02} {} {TAG} {} - - ",
                tm.year,
                tm.mon + 1,
                tm.mday,
                tm.hour,
                tm.min,
                tm.sec,
                tm.nanos / 1000,
                off / 3600,
                off / 60 % 60,
                if hostname.is_empty() { "-" } else { hostname },
                std::process::id()
            )
        }
    };
    out.extend_from_slice(s.as_bytes());
}

/// How one target frames its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub format: SyslogFormat,
    pub facility: u8,
    pub level: u8,
    /// Longest message, header included (the trailing newline, when any, too).
    pub maxlen: usize,
}

/// One framed message: header and `msg`, cut to `f.maxlen` bytes.
pub fn frame(f: &Framing, now: SystemTime, hostname: &str, msg: &str, newline: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(msg.len() + 64);
    header(f.format, f.facility, f.level, now, hostname, &mut out);
    out.extend_from_slice(msg.as_bytes());
    let room = f.maxlen.saturating_sub(usize::from(newline));
    out.truncate(room);
    if newline {
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_numbers() {
        assert_eq!(facility("local0"), Some(16));
        assert_eq!(facility("kern"), Some(0));
        assert_eq!(facility("nope"), None);
        assert_eq!(level("info"), Some(6));
        assert_eq!(level("emerg"), Some(0));
    }

    fn fr(format: SyslogFormat, facility: u8, level: u8, maxlen: usize) -> Framing {
        Framing {
            format,
            facility,
            level,
            maxlen,
        }
    }

    #[test]
    fn short_and_raw_frames() {
        let t = SystemTime::now();
        let f = frame(&fr(SyslogFormat::Short, 16, 6, 1024), t, "h", "hello", true);
        assert_eq!(f, b"<134>hello\n");
        let f = frame(&fr(SyslogFormat::Raw, 16, 6, 1024), t, "h", "hello", false);
        assert_eq!(f, b"hello");
        let f = frame(&fr(SyslogFormat::Short, 16, 6, 8), t, "h", "hello", true);
        assert_eq!(f, b"<134>he\n");
    }

    #[test]
    fn rfc3164_and_rfc5424_headers() {
        let t = SystemTime::now();
        let f = frame(&fr(SyslogFormat::Rfc3164, 16, 6, 1024), t, "h", "m", true);
        let s = String::from_utf8(f).unwrap();
        let pid = std::process::id();
        assert!(s.starts_with("<134>"), "{s}");
        assert!(s.ends_with(&format!(" shunt[{pid}]: m\n")), "{s}");
        // "<134>Mmm dd HH:MM:SS " is 21 bytes.
        assert_eq!(s.len(), 21 + format!("shunt[{pid}]: m\n").len(), "{s}");
        let f = frame(
            &fr(SyslogFormat::Rfc5424, 1, 3, 1024),
            t,
            "host",
            "m",
            false,
        );
        let s = String::from_utf8(f).unwrap();
        assert!(s.starts_with("<11>1 "), "{s}");
        assert!(s.ends_with(&format!(" host shunt {pid} - - m")), "{s}");
    }
}

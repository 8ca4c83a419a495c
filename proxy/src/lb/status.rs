//! What a server's checks report, kept with the server (`ServerRt`): HAProxy's
//! check statuses and the `rise`/`fall` defaults. The check tasks
//! (`crate::checks`) produce them; `lb` stores them and the CLI renders them.
//! Here, below `checks`, so that `lb` needs nothing from the layers above it.
//! So is HAProxy's rise/fall machine ([`step`]), which `ServerRt::apply` runs,
//! and the status word `show stat` prints from a server's state
//! ([`status_word`]), a pure reading of `ServerRt`.

/// HAProxy's default `rise`.
pub const DEFAULT_RISE: u32 = 2;
/// HAProxy's default `fall`.
pub const DEFAULT_FALL: u32 = 3;
/// A check status, HAProxy's `HCHK_STATUS_*` that TCP checks can report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The agent answered without a health word (no status change).
    Checked,
    /// `observe layer4` saw `error-limit` consecutive errors on live traffic.
    Hana,
    Sockerr,
    L4Ok,
    L4Tout,
    L4Con,
    /// A TLS check's handshake completed (nothing else asked).
    L6Ok,
    /// A TLS check's handshake did not complete in time.
    L6Tout,
    /// A TLS check's handshake failed.
    L6Rsp,
    L7Tout,
    L7Rsp,
    L7Ok,
    L7Sts,
}

impl Status {
    /// HAProxy's numeric code (`show servers state` srv_check_status).
    pub fn code(self) -> u32 {
        match self {
            Status::Checked => 3,
            Status::Hana => 4,
            Status::Sockerr => 5,
            Status::L4Ok => 6,
            Status::L4Tout => 7,
            Status::L4Con => 8,
            Status::L6Ok => 9,
            Status::L6Tout => 10,
            Status::L6Rsp => 11,
            Status::L7Tout => 12,
            Status::L7Rsp => 13,
            Status::L7Ok => 15,
            Status::L7Sts => 17,
        }
    }

    /// The short name (`check_status` column).
    pub fn info(self) -> &'static str {
        match self {
            Status::Checked => "CHECKED",
            Status::Hana => "HANA",
            Status::Sockerr => "SOCKERR",
            Status::L4Ok => "L4OK",
            Status::L4Tout => "L4TOUT",
            Status::L4Con => "L4CON",
            Status::L6Ok => "L6OK",
            Status::L6Tout => "L6TOUT",
            Status::L6Rsp => "L6RSP",
            Status::L7Tout => "L7TOUT",
            Status::L7Rsp => "L7RSP",
            Status::L7Ok => "L7OK",
            Status::L7Sts => "L7STS",
        }
    }

    /// The description (`check_desc` column, `reason:` of the logs).
    pub fn desc(self) -> &'static str {
        match self {
            Status::Checked => "No status change",
            Status::Hana => "Health analyze",
            Status::Sockerr => "Socket error",
            Status::L4Ok => "Layer4 check passed",
            Status::L4Tout => "Layer4 timeout",
            Status::L4Con => "Layer4 connection problem",
            Status::L6Ok => "Layer6 check passed",
            Status::L6Tout => "Layer6 timeout",
            Status::L6Rsp => "Layer6 invalid response",
            Status::L7Tout => "Layer7 timeout",
            Status::L7Rsp => "Layer7 invalid response",
            Status::L7Ok => "Layer7 check passed",
            Status::L7Sts => "Layer7 wrong status",
        }
    }

    /// Passed, failed, or neutral (`None`: no status change).
    pub fn passed(self) -> Option<bool> {
        match self {
            Status::Checked => None,
            Status::L4Ok | Status::L6Ok | Status::L7Ok => Some(true),
            _ => Some(false),
        }
    }

    /// Layer 5-7 data available: the check code is meaningful (HAProxy prints it).
    pub fn has_code(self) -> bool {
        matches!(self, Status::L7Ok | Status::L7Sts)
    }
}

/// What one result does to the health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub health: u32,
    /// `Some(up)` when the server changes state.
    pub transition: Option<bool>,
    /// The failure counts in `chkfail`.
    pub counted_failure: bool,
}

/// Apply one check result (`passed`) to `health` of a server that is `up`.
pub fn step(health: u32, up: bool, passed: bool, rise: u32, fall: u32) -> Step {
    let max = (rise + fall).saturating_sub(1);
    let mut h = health.min(max);
    let mut counted_failure = false;
    if passed {
        if h < max {
            h += 1;
            if h >= rise {
                h = max;
            }
        }
    } else if h > 0 {
        counted_failure = true;
        h -= 1;
        if h < rise {
            h = 0;
        }
    }
    let transition = if !up && passed && h >= rise {
        Some(true)
    } else if up && !passed && h < rise {
        Some(false)
    } else {
        None
    };
    Step {
        health: h,
        transition,
        counted_failure,
    }
}

/// HAProxy's `show stat` status word of a server (`UP`, `DOWN 1/2`, `no check`, ...).
/// `cli_drain`: the CLI put the server in drain.
pub fn status_word(s: &super::ServerRt, cli_drain: bool) -> String {
    if s.is_maint() {
        return "MAINT".to_string();
    }
    let (rise, fall, h) = (s.rise(), s.fall(), s.health());
    let max = rise + fall - 1;
    if s.is_up() && s.is_stopping() {
        // HAProxy's SRV_ST_STOPPING (`set server B/S health stopping`).
        return if !s.checked() || h >= max {
            "NOLB".to_string()
        } else {
            format!("NOLB {}/{fall}", (h + 1).saturating_sub(rise))
        };
    }
    if s.is_up() {
        // Below `rise` while up only when forced up (the CLI): not "going down".
        let going_down = s.checked() && h < max && h >= rise;
        let n = (h + 1).saturating_sub(rise);
        if cli_drain || s.is_agent_drain() {
            return if s.agent_enabled() {
                "DRAIN (agent)".to_string()
            } else if going_down {
                format!("DRAIN {n}/{fall}")
            } else {
                "DRAIN".to_string()
            };
        }
        if going_down {
            format!("UP {n}/{fall}")
        } else if s.checked() {
            "UP".to_string()
        } else {
            "no check".to_string()
        }
    } else if s.agent_enabled() && s.is_agent_down() {
        "DOWN (agent)".to_string()
    } else if s.checked() && (h == 0 || h >= rise) {
        // At or above `rise` while down only when forced down (the CLI).
        "DOWN".to_string()
    } else if s.checked() || s.agent_enabled() {
        format!("DOWN {h}/{rise}")
    } else {
        "DOWN".to_string()
    }
}

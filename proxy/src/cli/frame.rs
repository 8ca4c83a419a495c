//! CLI framing: bytes in → command requests; the answer terminator and prompts out.
//!
//! Owns the wire rules of HAProxy's stats socket (3.x behaviour):
//! - one command line per `\n` (a trailing `\r` is dropped);
//! - unescaped `;` separates commands on a line, unescaped spaces/tabs separate words;
//! - `\` makes the next byte literal (so `\;`, `\\` and `\ ` escape `;`, `\` and space);
//! - a line ending in `<<` starts a payload: the following lines, up to an empty line,
//!   are attached to the line's last command;
//! - every answer ends with an empty line (a command without output answers exactly
//!   `\n`); in prompt mode the prompt `> ` (or, `prompt timed`, `[d:hh:mm:ss]> `)
//!   follows each answer, `+ ` each payload line.
//!
//! This file is pure (no I/O): [`Input`] buffers what the socket delivered and hands out
//! complete events; the connection driver in `mod.rs` decides when to read and flush.
//! Invariants: a line never grows past [`MAX_LINE`] and a payload never past
//! [`MAX_PAYLOAD`], so one client cannot make the process buffer without bound.

/// Longest command line accepted, terminator included (HAProxy's default `tune.bufsize`).
pub const MAX_LINE: usize = 16 * 1024;
/// Largest payload (`<<` form) accepted: big enough for a large `add map` batch.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;
/// Output is written to the socket once this much is pending, even mid-batch.
pub const OUT_FLUSH: usize = 64 * 1024;
/// Interactive prompt after each answer.
pub const PROMPT: &[u8] = b"> ";
/// Interactive prompt while a payload is being typed.
pub const PAYLOAD_PROMPT: &[u8] = b"+ ";
/// The marker that ends a line to open a payload.
const PAYLOAD_MARK: &[u8] = b"<<";

/// One command as typed: its words (unescaped) and an optional payload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    pub words: Vec<String>,
    pub payload: Option<String>,
}

/// What the input buffer yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A complete line: its `;`-separated commands, in order (may be empty for a blank line).
    Line(Vec<Request>),
    /// A payload line was absorbed; more are expected (interactive mode shows `+ `).
    PayloadMore,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("Line too long (more than {max} bytes).")]
    LineTooLong { max: usize },
    #[error("Payload too large (more than {max} bytes).")]
    PayloadTooLarge { max: usize },
}

/// Buffered input of one CLI connection.
#[derive(Debug, Default)]
pub struct Input {
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    start: usize,
    /// Commands waiting for their payload, and the payload so far.
    pending: Option<(Vec<Request>, String)>,
}

impl Input {
    pub fn new() -> Self {
        Self::default()
    }

    /// Append bytes read from the socket.
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Whether unconsumed bytes (a partial or complete line) are buffered.
    pub fn has_buffered(&self) -> bool {
        self.start < self.buf.len()
    }

    /// Whether a payload is being collected.
    pub fn in_payload(&self) -> bool {
        self.pending.is_some()
    }

    /// The next complete event, or `None` when more bytes are needed. With `eof`, a final
    /// unterminated line is taken as if it ended with `\n` (and an open payload is closed).
    pub fn next_event(&mut self, eof: bool) -> Result<Option<Event>, FrameError> {
        let rest = &self.buf[self.start..];
        let line_end = rest.iter().position(|&b| b == b'\n');
        let (line, consumed) = match line_end {
            Some(n) => (&rest[..n], n + 1),
            None if rest.len() >= MAX_LINE => {
                return Err(FrameError::LineTooLong { max: MAX_LINE })
            }
            None if eof && !rest.is_empty() => (rest, rest.len()),
            None if eof => {
                // Input is over: a payload left open is closed as an empty line would.
                return Ok(self
                    .pending
                    .take()
                    .map(|(reqs, payload)| attach(reqs, payload)));
            }
            None => return Ok(None),
        };
        if line.len() >= MAX_LINE {
            return Err(FrameError::LineTooLong { max: MAX_LINE });
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = line.to_vec();
        self.start += consumed;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }

        if let Some((reqs, mut payload)) = self.pending.take() {
            if line.is_empty() {
                return Ok(Some(attach(reqs, payload)));
            }
            if payload.len() + line.len() + 1 > MAX_PAYLOAD {
                return Err(FrameError::PayloadTooLarge { max: MAX_PAYLOAD });
            }
            payload.push_str(&String::from_utf8_lossy(&line));
            payload.push('\n');
            self.pending = Some((reqs, payload));
            return Ok(Some(Event::PayloadMore));
        }

        match line.strip_suffix(PAYLOAD_MARK) {
            Some(head) => {
                self.pending = Some((split_line(head), String::new()));
                if eof && !self.has_buffered() {
                    return Ok(self.pending.take().map(|(reqs, p)| attach(reqs, p)));
                }
                Ok(Some(Event::PayloadMore))
            }
            None => Ok(Some(Event::Line(split_line(&line)))),
        }
    }
}

/// Give the collected payload to the last command of the line.
fn attach(mut reqs: Vec<Request>, payload: String) -> Event {
    if let Some(last) = reqs.last_mut() {
        last.payload = Some(payload);
    }
    Event::Line(reqs)
}

/// Split one line (without its `\n`) into commands and words, resolving escapes.
/// Commands without any word (`;;`, blank line) are dropped.
pub fn split_line(line: &[u8]) -> Vec<Request> {
    let mut reqs = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word: Vec<u8> = Vec::new();
    let mut in_word = false;
    let mut bytes = line.iter().copied();
    let end_word = |word: &mut Vec<u8>, words: &mut Vec<String>, in_word: &mut bool| {
        if *in_word {
            words.push(String::from_utf8_lossy(word).into_owned());
            word.clear();
            *in_word = false;
        }
    };
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => {
                // A lone trailing backslash escapes nothing and is dropped.
                if let Some(next) = bytes.next() {
                    word.push(next);
                    in_word = true;
                }
            }
            b' ' | b'\t' => end_word(&mut word, &mut words, &mut in_word),
            b';' => {
                end_word(&mut word, &mut words, &mut in_word);
                if !words.is_empty() {
                    reqs.push(Request {
                        words: std::mem::take(&mut words),
                        payload: None,
                    });
                }
            }
            _ => {
                word.push(b);
                in_word = true;
            }
        }
    }
    end_word(&mut word, &mut words, &mut in_word);
    if !words.is_empty() {
        reqs.push(Request {
            words,
            payload: None,
        });
    }
    reqs
}

/// Append one answer to the output buffer: the body, the terminating empty line, and the
/// prompt (empty when the session shows none).
pub fn push_answer(out: &mut Vec<u8>, body: &str, prompt: &[u8]) {
    out.extend_from_slice(body.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(prompt);
}

/// The `prompt timed` prompt: the uptime as HAProxy 3.x prints it, `[d:hh:mm:ss]> `.
pub fn timed_prompt(uptime_secs: u64) -> Vec<u8> {
    let up = uptime_secs;
    format!(
        "[{}:{:02}:{:02}:{:02}]> ",
        up / 86_400,
        (up / 3_600) % 24,
        (up / 60) % 60,
        up % 60
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(reqs: &[Request]) -> Vec<Vec<&str>> {
        reqs.iter()
            .map(|r| r.words.iter().map(String::as_str).collect())
            .collect()
    }

    #[test]
    fn semicolons_split_commands_and_spaces_split_words() {
        let r = split_line(b"show info ;  show  stat\t-1 2 -1;;quit");
        assert_eq!(
            words(&r),
            vec![
                vec!["show", "info"],
                vec!["show", "stat", "-1", "2", "-1"],
                vec!["quit"]
            ]
        );
    }

    #[test]
    fn backslash_escapes_semicolon_backslash_and_space() {
        let r = split_line(br"add map #2 a\;b v\ w\\x; help");
        assert_eq!(
            words(&r),
            vec![vec!["add", "map", "#2", "a;b", r"v w\x"], vec!["help"]]
        );
        // A trailing lone backslash is dropped, not an error.
        assert_eq!(words(&split_line(b"help\\")), vec![vec!["help"]]);
        // An escaped space alone is a word.
        assert_eq!(words(&split_line(b"x \\  y")), vec![vec!["x", " ", "y"]]);
    }

    #[test]
    fn blank_line_is_an_empty_line_event() {
        let mut i = Input::new();
        i.push(b"\n \r\n");
        assert_eq!(i.next_event(false), Ok(Some(Event::Line(vec![]))));
        assert_eq!(i.next_event(false), Ok(Some(Event::Line(vec![]))));
        assert_eq!(i.next_event(false), Ok(None));
        assert!(!i.has_buffered());
    }

    #[test]
    fn lines_are_released_only_when_complete() {
        let mut i = Input::new();
        i.push(b"show in");
        assert_eq!(i.next_event(false), Ok(None));
        assert!(i.has_buffered());
        i.push(b"fo\r\nhel");
        assert_eq!(
            i.next_event(false).map(|e| match e {
                Some(Event::Line(r)) => r[0].words.join(" "),
                other => format!("{other:?}"),
            }),
            Ok("show info".to_string())
        );
        assert_eq!(i.next_event(false), Ok(None));
        // At EOF the unterminated tail counts as a line.
        assert!(matches!(i.next_event(true), Ok(Some(Event::Line(r))) if r[0].words == ["hel"]));
        assert_eq!(i.next_event(true), Ok(None));
    }

    #[test]
    fn overlong_line_is_an_error() {
        let mut i = Input::new();
        i.push(&vec![b'a'; MAX_LINE]);
        assert_eq!(
            i.next_event(false),
            Err(FrameError::LineTooLong { max: MAX_LINE })
        );
        let mut i = Input::new();
        let mut l = vec![b'a'; MAX_LINE + 5];
        l.push(b'\n');
        i.push(&l);
        assert!(i.next_event(false).is_err());
        // Just under the bound is fine.
        let mut i = Input::new();
        let mut l = vec![b'a'; MAX_LINE - 1];
        l[0] = b'x';
        i.push(&l);
        i.push(b"\n");
        assert!(matches!(i.next_event(false), Ok(Some(Event::Line(_)))));
    }

    #[test]
    fn payload_collects_lines_until_empty_line() {
        let mut i = Input::new();
        i.push(b"help; add map #2 <<\np1 v1\np2 v2 with spaces\n\nquit\n");
        assert_eq!(i.next_event(false), Ok(Some(Event::PayloadMore)));
        assert!(i.in_payload());
        assert_eq!(i.next_event(false), Ok(Some(Event::PayloadMore)));
        assert_eq!(i.next_event(false), Ok(Some(Event::PayloadMore)));
        let Ok(Some(Event::Line(r))) = i.next_event(false) else {
            panic!("expected the line with its payload");
        };
        assert_eq!(words(&r), vec![vec!["help"], vec!["add", "map", "#2"]]);
        assert_eq!(r[0].payload, None);
        assert_eq!(r[1].payload.as_deref(), Some("p1 v1\np2 v2 with spaces\n"));
        assert!(matches!(i.next_event(false), Ok(Some(Event::Line(r))) if r[0].words == ["quit"]));
    }

    #[test]
    fn unterminated_payload_is_closed_at_eof() {
        let mut i = Input::new();
        i.push(b"add map #2 <<\nk v\n");
        assert_eq!(i.next_event(true), Ok(Some(Event::PayloadMore)));
        assert_eq!(i.next_event(true), Ok(Some(Event::PayloadMore)));
        let Ok(Some(Event::Line(r))) = i.next_event(true) else {
            panic!("payload not closed at eof");
        };
        assert_eq!(r[0].payload.as_deref(), Some("k v\n"));
        assert_eq!(i.next_event(true), Ok(None));
    }

    #[test]
    fn answers_end_with_an_empty_line_and_prompt_when_interactive() {
        let mut out = Vec::new();
        push_answer(&mut out, "", b"");
        assert_eq!(out, b"\n");
        out.clear();
        push_answer(&mut out, "Permission denied\n", PROMPT);
        assert_eq!(out, b"Permission denied\n\n> ");
    }

    #[test]
    fn timed_prompt_is_days_then_two_digit_fields() {
        assert_eq!(timed_prompt(0), b"[0:00:00:00]> ");
        assert_eq!(
            timed_prompt(23 * 86_400 + 3 * 3_600 + 34 * 60 + 39),
            b"[23:03:34:39]> "
        );
        assert_eq!(timed_prompt(59), b"[0:00:00:59]> ");
    }
}

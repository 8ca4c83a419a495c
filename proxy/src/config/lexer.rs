//! Splits one configuration line into words, as HAProxy's `parse_line` does.
//!
//! Owns quoting and escapes only; it knows nothing about keywords.
//! Rules: words are separated by blanks; `#` outside quotes starts a comment;
//! `"..."` groups and expands `$NAME`, `${NAME}` and `${NAME-default}` from the
//! environment (unset = empty); `'...'` groups literally; outside single
//! quotes a backslash escapes ` `, `\`, `#`, `'`, `"`, `$` and understands
//! `\t \n \r \xHH`. Quoted parts concatenate with adjacent text into one word,
//! and `""` is an (empty) word.

/// HAProxy's MAX_LINE_ARGS: more words than this on one line is an error.
pub const MAX_LINE_ARGS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LexError {
    /// `pos` is the 1-based column of the opening quote.
    #[error("unmatched quote at position {pos}")]
    UnmatchedQuote { pos: usize },
    #[error("invalid escape sequence '\\x{seq}' at position {pos}")]
    BadHexEscape { seq: String, pos: usize },
    #[error("too many words (more than {MAX_LINE_ARGS}) on this line")]
    TooManyWords,
}

/// Splits `line` into words, looking environment variables up with `env`.
pub fn split_line(
    line: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, LexError> {
    let chars: Vec<char> = line.chars().collect();
    let mut words: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    // Some((quote char, column of the opening quote)).
    let mut quote: Option<(char, usize)> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some(('\'', _)) => {
                if c == '\'' {
                    quote = None;
                } else {
                    cur.push(c);
                }
                i += 1;
                continue;
            }
            Some(('"', _)) if c == '"' => {
                quote = None;
                i += 1;
                continue;
            }
            Some(('"', _)) if c == '$' => {
                i = expand_var(&chars, i, env, &mut cur);
                continue;
            }
            Some(_) | None => {}
        }
        if c == '\\' {
            i = unescape(&chars, i, &mut cur)?;
            in_word = true;
            continue;
        }
        if quote.is_none() {
            match c {
                ' ' | '\t' => {
                    if in_word {
                        words.push(std::mem::take(&mut cur));
                        in_word = false;
                    }
                    i += 1;
                    continue;
                }
                '#' => break,
                '"' | '\'' => {
                    quote = Some((c, i + 1));
                    in_word = true;
                    i += 1;
                    continue;
                }
                _ => {}
            }
        }
        cur.push(c);
        in_word = true;
        i += 1;
    }
    if let Some((_, pos)) = quote {
        return Err(LexError::UnmatchedQuote { pos });
    }
    if in_word {
        words.push(cur);
    }
    if words.len() > MAX_LINE_ARGS {
        return Err(LexError::TooManyWords);
    }
    Ok(words)
}

/// Handles the backslash at `chars[i]`; returns the index after the sequence.
fn unescape(chars: &[char], i: usize, out: &mut String) -> Result<usize, LexError> {
    let Some(&next) = chars.get(i + 1) else {
        // A trailing backslash stays literal.
        out.push('\\');
        return Ok(i + 1);
    };
    match next {
        ' ' | '\\' | '#' | '\'' | '"' | '$' => out.push(next),
        't' => out.push('\t'),
        'n' => out.push('\n'),
        'r' => out.push('\r'),
        'x' => {
            let hex: String = chars.iter().skip(i + 2).take(2).collect();
            let byte = if hex.len() == 2 {
                u8::from_str_radix(&hex, 16).ok().filter(u8::is_ascii)
            } else {
                None
            };
            let Some(b) = byte else {
                return Err(LexError::BadHexEscape {
                    seq: hex,
                    pos: i + 1,
                });
            };
            out.push(char::from(b));
            return Ok(i + 4);
        }
        // Not an escape sequence: keep both characters, as HAProxy does.
        other => {
            out.push('\\');
            out.push(other);
        }
    }
    Ok(i + 2)
}

fn is_var_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_var_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands the `$` at `chars[i]` inside double quotes; returns the next index.
fn expand_var(
    chars: &[char],
    i: usize,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut String,
) -> usize {
    let braced = chars.get(i + 1) == Some(&'{');
    let start = if braced { i + 2 } else { i + 1 };
    let mut j = start;
    if chars.get(j).is_some_and(|&c| is_var_start(c)) {
        while chars.get(j).is_some_and(|&c| is_var_char(c)) {
            j += 1;
        }
    }
    let name: String = chars[start..j].iter().collect();
    if name.is_empty() {
        out.push('$');
        return i + 1;
    }
    if !braced {
        out.push_str(&env(&name).unwrap_or_default());
        return j;
    }
    // `${NAME}` or `${NAME-default}`; anything else is kept literally.
    let mut default: Option<String> = None;
    if chars.get(j) == Some(&'-') {
        let Some(close) = chars[j..].iter().position(|&c| c == '}') else {
            out.push('$');
            return i + 1;
        };
        default = Some(chars[j + 1..j + close].iter().collect());
        j += close;
    }
    if chars.get(j) != Some(&'}') {
        out.push('$');
        return i + 1;
    }
    let value = env(&name).or(default).unwrap_or_default();
    out.push_str(&value);
    j + 1
}

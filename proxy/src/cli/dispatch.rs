//! The one place a CLI command takes effect.
//!
//! `dispatch` checks the session's level, applies the command (to the connection's
//! [`Session`] or, for later commands, to the runtime state behind [`Ctx`]), and returns
//! the answer body. Parsing (`command.rs`) and formatting (`render.rs`) stay out of here;
//! nothing else in the CLI changes state. Answers are HAProxy's exact strings.

use crate::config::CliLevel;
use crate::maps::{MapError, MapRt, Maps};

use super::command::{Command, ProxySel};
use super::render::{self, StatFilter};
use super::{Ctx, Session};

/// HAProxy's refusal text.
pub const PERMISSION_DENIED: &str = "Permission denied\n";
/// `show stat` naming a proxy that does not exist.
pub const NO_SUCH_PROXY: &str = "No such proxy.\n";
/// A map command naming no loaded map.
pub const UNKNOWN_MAP: &str = "Unknown map identifier. Please use #<id> or <file>.\n";

/// What a command answers. The body is empty or ends with `\n`; the framing adds the
/// empty line that ends every answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Text(String),
}

impl Output {
    fn empty() -> Self {
        Output::Text(String::new())
    }

    fn text(s: impl Into<String>) -> Self {
        Output::Text(s.into())
    }

    /// The body as text.
    pub fn as_str(&self) -> &str {
        match self {
            Output::Text(s) => s,
        }
    }
}

/// Run one command for one CLI session.
pub fn dispatch(ctx: &Ctx, sess: &mut Session, cmd: Command) -> Output {
    if !allowed(sess.level, cmd.level()) {
        return Output::text(PERMISSION_DENIED);
    }
    match cmd {
        Command::Empty => Output::empty(),
        Command::Help(words) => Output::Text(render::help(&words)),
        Command::Prompt => {
            sess.interactive = !sess.interactive;
            Output::empty()
        }
        Command::Quit => {
            sess.quit = true;
            Output::empty()
        }
        Command::SetLevel(l) => {
            // Only lowering reaches here (raising was refused by the level check).
            sess.level = l;
            Output::empty()
        }
        Command::ShowCliLevel => Output::Text(format!("{}\n", render::level_name(sess.level))),
        Command::ShowInfo(fmt) => Output::Text(render::show_info(ctx, fmt)),
        Command::ShowStat(q) => {
            let iid = match q.proxy {
                ProxySel::All => None,
                ProxySel::Id(n) => match u32::try_from(n) {
                    Ok(id) if id != 0 => Some(id),
                    _ => return Output::text(NO_SUCH_PROXY),
                },
                ProxySel::Name(name) => {
                    let found = render::proxies(ctx)
                        .into_iter()
                        .find(|p| render::proxy_name(ctx, p) == name);
                    match found {
                        Some(p) => Some(p.id),
                        None => return Output::text(NO_SUCH_PROXY),
                    }
                }
            };
            Output::Text(render::show_stat(
                ctx,
                StatFilter {
                    iid,
                    types: q.types,
                    sid: q.sid,
                },
            ))
        }
        Command::SetTimeoutCli(d) => {
            sess.timeout = d;
            Output::empty()
        }
        Command::ShowMaps => Output::Text(render::show_maps(&ctx.state.maps)),
        Command::ShowMap(name) => match ctx.state.maps.find(&name) {
            Some(map) => Output::Text(render::show_map(&map.table())),
            None => Output::text(UNKNOWN_MAP),
        },
        Command::GetMap { map, value } => match ctx.state.maps.find(&map) {
            Some(map) => Output::Text(render::get_map(&map.table(), &value)),
            None => Output::text(UNKNOWN_MAP),
        },
        Command::AddMap { map, key, value } => {
            map_change(ctx, &map, |maps, m| maps.add(m, &key, &value))
        }
        Command::AddMapPayload { map, payload } => {
            map_change(ctx, &map, |maps, m| maps.add_payload(m, &payload))
        }
        Command::SetMap { map, key, value } => {
            map_change(ctx, &map, |maps, m| maps.set(m, &key, &value))
        }
        Command::DelMap { map, key } => map_change(ctx, &map, |maps, m| maps.del(m, &key)),
        Command::ClearMap(map) => map_change(ctx, &map, |maps, m| {
            maps.clear(m);
            Ok(())
        }),
        Command::Bad { err, .. } => Output::Text(format!("{err}\n")),
        Command::Unknown(words) => Output::Text(render::unknown(&words)),
    }
}

/// Apply a change to the map named `name`: HAProxy's answers are empty on success,
/// the error text and a period otherwise.
fn map_change(
    ctx: &Ctx,
    name: &str,
    f: impl FnOnce(&Maps, &MapRt) -> Result<(), MapError>,
) -> Output {
    let maps = &ctx.state.maps;
    let Some(map) = maps.find(name) else {
        return Output::text(UNKNOWN_MAP);
    };
    match f(maps, map) {
        Ok(()) => Output::empty(),
        Err(e) => Output::Text(format!("{e}.\n")),
    }
}

/// Whether `have` may run what needs `need` (user < operator < admin).
pub fn allowed(have: CliLevel, need: CliLevel) -> bool {
    have >= need
}

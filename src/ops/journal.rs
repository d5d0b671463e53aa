//! Logging into systemd's journal with its priorities.
//!
//! Under systemd the node's standard error goes to the journal, which stamps every line itself and reads a
//! leading `<N>` as the line's syslog priority (sd-daemon(3), `SyslogLevelPrefix=`, on by default). Without the
//! prefix every line, errors included, is filed at the unit's default priority 6 (info), so
//! `journalctl -p warning` and priority-based alerting see nothing (issue 18, item 10). systemd says that standard
//! error is the journal by setting `$JOURNAL_STREAM` to the stream's device and inode (systemd.exec(5)); a
//! program whose standard error was redirected elsewhere inherits the variable, so it is compared with what
//! standard error is.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Whether standard error is the journal stream systemd gave this process.
pub fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    let stderr = std::io::stderr();
    let Ok(owned) = stderr.as_fd().try_clone_to_owned() else {
        return false;
    };
    let file = std::fs::File::from(owned);
    file.metadata()
        .is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// The syslog priority of a level: error 3, warning 4, info 6, debug and trace 7.
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// A line's priority prefix for the journal (`<3>` for an error).
pub fn prefix(level: &Level) -> String {
    format!("<{}>", priority(level))
}

/// Formats events as `inner` does, each behind its journal priority.
pub struct WithPriority<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for WithPriority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(&with_priority(event.metadata().level(), &line))
    }
}

/// `text` with the priority of `level` in front of each of its lines: the journal takes every line as an entry of
/// its own, so a message of several lines (a refused senders file lists its bad lines) keeps its priority on each.
pub fn with_priority(level: &Level, text: &str) -> String {
    let p = prefix(level);
    let mut out = String::with_capacity(text.len() + 8);
    for line in text.split_inclusive('\n') {
        out.push_str(&p);
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_syslogs() {
        assert_eq!(prefix(&Level::ERROR), "<3>");
        assert_eq!(prefix(&Level::WARN), "<4>");
        assert_eq!(prefix(&Level::INFO), "<6>");
        assert_eq!(prefix(&Level::DEBUG), "<7>");
        assert_eq!(
            with_priority(&Level::ERROR, "bad file\n  f:1: a\n"),
            "<3>bad file\n<3>  f:1: a\n"
        );
    }
}

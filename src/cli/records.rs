//! `pure-serve records`: print what the stores hold.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use clap::Args;

use crate::store;

#[derive(Args, Debug)]
pub struct RecordsArgs {
    /// The node's state directory. Default: $STATE_DIRECTORY or ./pure-state.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Only this app (default: every app with a store).
    #[arg(long, value_name = "NAME")]
    pub app: Option<String>,
    /// Only records from this sender.
    #[arg(long, value_name = "NAME")]
    pub source: Option<String>,
    /// One JSON object per line: app, source, seq, and payload (UTF-8) or payload_b64.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &RecordsArgs) -> anyhow::Result<()> {
    let state = args
        .state
        .clone()
        .unwrap_or_else(super::node::default_state_dir);
    let apps = match &args.app {
        Some(a) => vec![a.clone()],
        None => {
            let apps = store::list_apps(&state);
            if apps.is_empty() {
                anyhow::bail!(
                    "no stores in {}: is that the node's --state directory?",
                    state.join("apps").display()
                );
            }
            apps
        }
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut write_error = None;
    for app in &apps {
        let s = store::open_app_for_reading(&state, app)?;
        s.for_each_record(args.source.as_deref(), |source, seq, payload| {
            let r = if args.json {
                let mut obj = serde_json::json!({"app": app, "source": source, "seq": seq});
                match std::str::from_utf8(payload) {
                    Ok(text) => obj["payload"] = text.into(),
                    Err(_) => obj["payload_b64"] = STANDARD.encode(payload).into(),
                }
                writeln!(out, "{obj}")
            } else {
                let text = String::from_utf8_lossy(payload);
                writeln!(out, "{app}\t{source}\t{seq}\t{text}")
            };
            match r {
                Ok(()) => true,
                Err(e) => {
                    write_error = Some(e);
                    false
                }
            }
        })?;
        if write_error.is_some() {
            break;
        }
    }
    match write_error {
        // A closed pipe (`records | head`) is a normal end.
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Some(e) => Err(e.into()),
        None => Ok(out.flush().or_else(|e| {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                Ok(())
            } else {
                Err(e)
            }
        })?),
    }
}

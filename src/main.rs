//! The `pure-serve` binary: parse flags, set up logging, run the chosen subcommand. Nothing else lives here.

use std::io::IsTerminal;

use clap::Parser;
use pure_serve::cli::{self, Cli, Command};
use pure_serve::ops::journal;

/// Every directive of `--log` is a level (`debug`) or a target with its level (`pure_serve=debug`). tracing takes a
/// bare word as a target to log at every level, so a misspelt level (`warnings`, `inf`) would silence every other
/// line, errors included; it is refused instead, as is an empty directive.
fn log_filter(filter: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    for directive in filter.split(',') {
        let directive = directive.trim();
        if directive.is_empty() {
            return Err("an empty directive".to_string());
        }
        if !directive.contains('=') && !LEVELS.contains(&directive.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{directive:?} is not a level ({}) nor TARGET=LEVEL",
                LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| e.to_string())
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            let status = cli::usage_exit_status(&e, &args);
            if e.use_stderr() && journal::stderr_is_journal() {
                // Under systemd a bad flag (a drop-in's ExecStart=) is why the unit failed: filed as an error, so
                // `journalctl -p warning` shows it like every other reason the node gives.
                let text = e.render().to_string();
                eprint!("{}", journal::with_priority(&tracing::Level::ERROR, &text));
            } else {
                let _ = e.print();
            }
            std::process::exit(status);
        }
    };
    let filter = match &cli.log {
        Some(level) => match log_filter(level) {
            Ok(f) => f,
            Err(e) => {
                let text = format!(
                    "pure-serve: --log {level:?} is not a log level or filter ({e}); try --log debug\n"
                );
                if journal::stderr_is_journal() {
                    eprint!("{}", journal::with_priority(&tracing::Level::ERROR, &text));
                } else {
                    eprint!("{text}");
                }
                // A flag of the node is its configuration (cli::usage_exit_status).
                std::process::exit(if cli.command.is_none() {
                    cli::EXIT_CONFIG
                } else {
                    2
                });
            }
        },
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // The journal stamps every line itself, and files it by the priority in front of it (ops/journal.rs).
    let journal = journal::stderr_is_journal();
    if journal {
        let format = tracing_subscriber::fmt::format()
            .without_time()
            .with_ansi(false);
        builder.event_format(journal::WithPriority(format)).init();
    } else {
        builder.init();
    }
    let result = match &cli.command {
        None => cli::node::run(&cli.node),
        Some(Command::Keygen(a)) => cli::keygen(a),
        Some(Command::Pubkey(a)) => cli::pubkey(a),
        Some(Command::Send(a)) => cli::send::run(a),
        Some(Command::Records(a)) => cli::records::run(a),
        Some(Command::Senders(a)) => cli::senders::run(a),
        Some(Command::Push(a)) => cli::push::run(a),
        Some(Command::Demo(a)) => cli::demo::run(a),
        Some(Command::Check(a)) => cli::check(a),
    };
    if let Err(e) = result {
        let text = format!("pure-serve: {}\n", cli::one_line(&e));
        if journal {
            eprint!("{}", journal::with_priority(&tracing::Level::ERROR, &text));
        } else {
            eprint!("{text}");
        }
        // The node, `records` and `senders` tell a configuration at fault from a failure a restart may cure
        // (cli::EXIT_CONFIG).
        let status = match &cli.command {
            None | Some(Command::Records(_)) | Some(Command::Senders(_)) => cli::exit_status(&e),
            Some(Command::Push(_)) => cli::push::exit_status(&e),
            Some(_) => 1,
        };
        std::process::exit(status);
    }
}

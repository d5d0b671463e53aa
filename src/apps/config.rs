//! The apps file (`--apps FILE`, docs/apps.md): which apps a node hosts, the senders each accepts (and the nodes it
//! lets forward to it), its budgets, and its outlets — parsed, validated, and compared with the file in force when
//! SIGHUP asks for a reload.
//!
//! What this module owns:
//!
//! - the format: each `[apps.NAME]` table is one app, each `[apps.NAME.outlets.OUTLET]` one outlet
//!   (docs/apps.md documents every key; a test keeps its example parsing);
//! - validation that reports **every** problem at once, each with the file's line, the app, the key, what is wrong
//!   and how to fix it, like the senders file ([`crate::senders`]): a node that refuses to start should say all it
//!   will refuse, not one thing per attempt;
//! - [`plan_reload`]: what a reload can apply (new apps, accept and forwarders lists, budgets, outlets) and what
//!   needs a restart.
//!
//! Why the file is walked by hand rather than deserialized with `serde` and `deny_unknown_fields`: serde stops at
//! the first error of a struct, so a typo in one key would hide a bad key three lines down. The toml crate's
//! [`DeTable`] keeps a byte span for every key and value and recovers after a syntax error, which gives every
//! problem with its line; the walk below checks each key against the keys its table allows and names them.
//!
//! Nothing here panics on file contents: any text gives `Ok` or `Err` (a property test feeds it garbage).
//! [`AppsConfig::parse`] never touches the file system; [`AppsConfig::load`] reads the file and also checks that
//! every `ca_file` exists and holds a certificate, so `pure-serve check` catches a missing CA before a start does.

use std::collections::{HashMap, HashSet};
use std::fmt;

use std::ops::Range;
use std::path::{Path, PathBuf};

use thiserror::Error;
use toml::Spanned;
use toml::de::{DeArray, DeString, DeTable, DeValue};

use crate::common::address::{HttpUrl, parse_host_port};
use crate::files::{self, FileError};
use crate::proto::crypto::PublicKeyBytes;
use crate::proto::wire::{MAX_APP_LEN, valid_app_name};

/// The one app of a node started without `--apps` (today's node, and every existing state directory).
pub const DEFAULT_APP: &str = "main";
/// Default of `turn_records`. Enough records per turn that a commit's fsync (~190 µs here) is spread thin (the store
/// takes ~150k records/s at 4096 per commit and more with bigger turns), small enough that one busy app's turn
/// holds the others back for milliseconds, not seconds.
pub const DEFAULT_TURN_RECORDS: u64 = 16_384;
/// Largest `turn_records`: about a second of store work at the target rate. Above it one app's turn would starve
/// the others (the fairness a turn exists for) and a turn's memory would grow without a useful gain.
pub const MAX_TURN_RECORDS: u64 = 1 << 20;
/// Default of `memory_bytes`: records an outlet keeps in memory before the rest waits in the store.
pub const DEFAULT_MEMORY_BYTES: usize = 4 << 20;
/// Smallest `memory_bytes`: below this an outlet cannot keep a window of full datagrams (1472 bytes each, tens in
/// flight) and would go back to the store for every few packets.
pub const MIN_MEMORY_BYTES: usize = 64 << 10;
/// Default of a webhook's `batch_records`.
pub const DEFAULT_BATCH_RECORDS: usize = 500;
/// Largest `batch_records`: keeps one POST body to a few megabytes of JSON, which receivers take without tuning.
pub const MAX_BATCH_RECORDS: usize = 10_000;
/// Path of a wire's URL when it gives none: where a node's `--http-port` takes sealed packets.
pub const DEFAULT_WIRE_PATH: &str = "/link";
/// Problems shown in one message; the rest are counted. An apps file is small, so this only trims garbage.
const MAX_SHOWN: usize = 50;

/// The apps a node hosts, in the order of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppsConfig {
    pub apps: Vec<AppConfig>,
    /// The file it came from; `None` for [`AppsConfig::default_single`].
    pub path: Option<PathBuf>,
}

/// One app: `[apps.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppConfig {
    /// 1–32 of `[a-z0-9_-]`, the wire's grammar: senders name the app in every DATA frame. Its store is
    /// `STATE/apps/NAME.sqlite`.
    pub name: String,
    /// Which senders (names from the senders file) may send to it directly. Its inner inlet (outlets of kind
    /// `app` naming it) is open whatever this says.
    pub accept: Accept,
    /// The senders (names from the senders file: other nodes) that may send it forwarded records, FORWARD frames
    /// with the origin of each record (docs/protocol.md 5.4). Empty by default: a device that is merely accepted
    /// could otherwise have its records stored as another sender's. Each must also be accepted.
    pub forwarders: Vec<String>,
    /// Most records it takes in one turn, so a busy app cannot starve a quiet one.
    pub turn_records: u64,
    /// In the order of the file.
    pub outlets: Vec<OutletConfig>,
    /// What one sender may have waiting in its downlink (docs/apps.md, `[apps.NAME.downlink]`).
    pub downlink: crate::store::downlink::DownLimits,
    /// Line of its `[apps.NAME]` header, for messages; `None` when it does not come from a file.
    pub line: Option<usize>,
    /// Lines of its `accept` and `forwarders` values, for the warnings about the names they list.
    pub accept_line: Option<usize>,
    pub forwarders_line: Option<usize>,
}

/// Which senders an app takes records from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accept {
    /// Every sender in the senders file.
    All,
    /// Only these names; `Only(vec![])` takes no sender directly (only its inner inlet).
    Only(Vec<String>),
}

impl Accept {
    /// Whether the sender of this name (from the senders file) may send to the app. Linear in the list: lists are
    /// short; a caller with thousands of names should index them once.
    pub fn allows(&self, sender_name: &str) -> bool {
        match self {
            Accept::All => true,
            Accept::Only(names) => names.iter().any(|n| n == sender_name),
        }
    }
}

impl fmt::Display for Accept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Accept::All => write!(f, "every sender"),
            Accept::Only(names) if names.is_empty() => write!(f, "no sender directly"),
            Accept::Only(names) => {
                let n = names.len();
                write!(f, "{n} sender{} (", if n == 1 { "" } else { "s" })?;
                for (i, name) in names.iter().take(5).enumerate() {
                    write!(f, "{}{name}", if i == 0 { "" } else { ", " })?;
                }
                if n > 5 {
                    write!(f, ", …")?;
                }
                write!(f, ")")
            }
        }
    }
}

/// One outlet: `[apps.APP.outlets.NAME]`. Every kind has the same budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutletConfig {
    /// 1–32 of `[a-z0-9_-]`; unique within its app. Metrics label it `outlet`.
    pub name: String,
    pub kind: OutletKind,
    /// Bytes of records it may hold in memory; the rest waits in the app's store (the outbox) and is read back.
    pub memory_bytes: usize,
    /// When this many records are stored but not yet acknowledged by the far side, the app stops taking input
    /// (its senders get no ack and retry) instead of letting the backlog grow. 0: no limit.
    pub max_lag_records: u64,
    /// Where it starts when it is first applied (docs/apps.md, `from`); read only then.
    pub from: StartFrom,
    /// Line of its header, for messages; `None` when it does not come from a file.
    pub line: Option<usize>,
    /// Line of its `ca_file` key, for what `load` finds wrong with that file; `None` without one.
    pub ca_file_line: Option<usize>,
}

/// `from` of an outlet: what a new outlet sends of what its app stored before it was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartFrom {
    /// The app's whole store, from position 1 (the default: a new outlet forwards every record its app stores).
    #[default]
    First,
    /// Only the records stored from the moment the outlet is first applied.
    Next,
}

impl fmt::Display for StartFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StartFrom::First => "first",
            StartFrom::Next => "next",
        })
    }
}

/// Where an outlet forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutletKind {
    /// Sealed UDP (docs/protocol.md) to another node's `--link-port`, with this node's key as the sender key.
    Link {
        /// `HOST:PORT` as written; a name is resolved off the sending loop, and again when the far side goes quiet.
        to: String,
        node_key: PublicKeyBytes,
        /// The far app; defaults to this app's name.
        app: String,
    },
    /// The same sealed packets in HTTP/1.1 POSTs to another node's `--http-port`.
    Wire {
        url: HttpUrl,
        node_key: PublicKeyBytes,
        app: String,
        /// https only: trust this CA (PEM) instead of the system's roots. Absolute (a relative path in the file is
        /// taken from the apps file's directory).
        ca_file: Option<PathBuf>,
    },
    /// JSON batches POSTed to any HTTP(S) endpoint; a 2xx answer means stored.
    Webhook {
        url: HttpUrl,
        ca_file: Option<PathBuf>,
        /// Extra request headers, in the order of the file.
        headers: Vec<(String, String)>,
        batch_records: usize,
    },
    /// Inner: to another app of this host, with no socket and no sealing.
    App { app: String },
}

impl OutletKind {
    /// The kind's name and where it sends, as a string: equal for two outlets of the same kind and target (a link's
    /// `to`, far node and far app; a wire's url, far node and far app; a webhook's url; an inner outlet's app),
    /// whatever their other keys. What the store keeps of an outlet's start, and how a rename is recognised.
    pub fn target(&self) -> (&'static str, String) {
        match self {
            OutletKind::Link { to, node_key, app } => (
                "link",
                format!("{to} {} {app}", crate::keys::encode_key(node_key)),
            ),
            OutletKind::Wire {
                url, node_key, app, ..
            } => (
                "wire",
                format!("{url} {} {app}", crate::keys::encode_key(node_key)),
            ),
            OutletKind::Webhook { url, .. } => ("webhook", url.to_string()),
            OutletKind::App { app } => ("app", app.clone()),
        }
    }

    /// The far node's flow a link or wire forwards into (far node's key and far app): a link and a wire into the
    /// same far app are one flow, numbered alike (docs/protocol.md 5.4). `None` for webhooks and inner outlets.
    pub fn far_flow_key(&self) -> Option<String> {
        match self {
            OutletKind::Link { node_key, app, .. } | OutletKind::Wire { node_key, app, .. } => {
                Some(format!("{} {app}", crate::keys::encode_key(node_key)))
            }
            _ => None,
        }
    }

    /// The `kind` value in the file.
    pub fn kind_name(&self) -> &'static str {
        match self {
            OutletKind::Link { .. } => "link",
            OutletKind::Wire { .. } => "wire",
            OutletKind::Webhook { .. } => "webhook",
            OutletKind::App { .. } => "app",
        }
    }

    /// The far node and app of a link or wire: two outlets of one host must not share it.
    fn far_flow(&self) -> Option<(&PublicKeyBytes, &str)> {
        match self {
            OutletKind::Link { node_key, app, .. } | OutletKind::Wire { node_key, app, .. } => {
                Some((node_key, app))
            }
            _ => None,
        }
    }
}

impl fmt::Display for OutletKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutletKind::Link { to, node_key, app } => {
                write!(f, "link to {to}, app {app} on node {}", short_key(node_key))
            }
            OutletKind::Wire {
                url,
                node_key,
                app,
                ca_file,
            } => {
                write!(
                    f,
                    "wire to {url}, app {app} on node {}",
                    short_key(node_key)
                )?;
                if let Some(ca) = ca_file {
                    write!(f, ", CA {}", ca.display())?;
                }
                Ok(())
            }
            OutletKind::Webhook {
                url,
                ca_file,
                headers,
                batch_records,
            } => {
                write!(f, "webhook to {url}, {batch_records} records a batch")?;
                if !headers.is_empty() {
                    let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
                    write!(f, ", headers {}", names.join(", "))?;
                }
                if let Some(ca) = ca_file {
                    write!(f, ", CA {}", ca.display())?;
                }
                Ok(())
            }
            OutletKind::App { app } => write!(f, "into app {app} of this host"),
        }
    }
}

fn short_key(key: &PublicKeyBytes) -> String {
    let full = crate::keys::encode_key(key);
    format!("{}…", &full[..8])
}

/// One thing wrong with an apps file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line in the file, where known.
    pub line: Option<usize>,
    /// The app it is in, if it is in one.
    pub app: Option<String>,
    /// The key, dotted from inside the app (`outlets.cloud.node_key`), or from the top when outside an app.
    pub key: Option<String>,
    pub what: String,
    pub fix: String,
}

impl Problem {
    /// `FILE:LINE: app NAME, key KEY: WHAT; FIX` (the parts that are known), as the node and `check` print it.
    pub fn render(&self, path: &Path) -> String {
        let mut s = path.display().to_string();
        if let Some(line) = self.line {
            s.push_str(&format!(":{line}"));
        }
        s.push_str(": ");
        let mut parts = Vec::new();
        if let Some(app) = &self.app {
            parts.push(format!("app {app}"));
        }
        if let Some(key) = &self.key {
            parts.push(format!("key {key}"));
        }
        if !parts.is_empty() {
            s.push_str(&parts.join(", "));
            s.push_str(": ");
        }
        s.push_str(&self.what);
        if !self.fix.is_empty() {
            s.push_str("; ");
            s.push_str(&self.fix);
        }
        s
    }
}

#[derive(Debug, Error)]
pub enum AppsError {
    /// Not a regular file, too big, or unreadable (crate::files).
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{}", BadFile(path, problems))]
    Bad {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

impl AppsError {
    /// Every problem, one line each (`FILE:LINE: …`), for `check` to list.
    pub fn lines(&self) -> Vec<String> {
        match self {
            AppsError::File(_) => vec![self.to_string()],
            AppsError::Bad { path, problems } => problems.iter().map(|p| p.render(path)).collect(),
        }
    }
}

struct BadFile<'a>(&'a Path, &'a [Problem]);

impl fmt::Display for BadFile<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.1.len();
        write!(
            f,
            "apps file {} has {n} problem{}",
            self.0.display(),
            if n == 1 { "" } else { "s" }
        )?;
        for p in self.1.iter().take(MAX_SHOWN) {
            write!(f, "\n  {}", p.render(self.0))?;
        }
        if n > MAX_SHOWN {
            write!(f, "\n  … and {} more", n - MAX_SHOWN)?;
        }
        write!(f, "\n  every key, with an example, is in docs/apps.md")
    }
}

impl AppsConfig {
    /// The node without `--apps`: one app `main` that accepts every sender and forwards nothing — today's node, so
    /// an existing state directory keeps working. It lets no sender forward to it (docs/apps.md, `forwarders`):
    /// which senders are nodes is something only the operator knows.
    pub fn default_single() -> Self {
        AppsConfig {
            apps: vec![AppConfig {
                name: DEFAULT_APP.to_string(),
                accept: Accept::All,
                forwarders: Vec::new(),
                turn_records: DEFAULT_TURN_RECORDS,
                outlets: Vec::new(),
                downlink: Default::default(),
                line: None,
                accept_line: None,
                forwarders_line: None,
            }],
            path: None,
        }
    }

    /// Reads, parses and validates an apps file, and checks the files it names (`ca_file`): every problem at once.
    pub fn load(path: &Path) -> Result<Self, AppsError> {
        let bytes = files::read(path, &files::APPS)?;
        let text = match std::str::from_utf8(&bytes) {
            Ok(t) => t,
            Err(e) => {
                let at = e.valid_up_to();
                let line = bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1;
                return Err(AppsError::Bad {
                    path: path.to_path_buf(),
                    problems: vec![Problem {
                        line: Some(line),
                        app: None,
                        key: None,
                        what: "is not UTF-8 text".into(),
                        fix: "save the file as UTF-8 (TOML files are UTF-8)".into(),
                    }],
                });
            }
        };
        let (config, mut problems) = parse_all(path, text);
        problems.extend(check_files(&config));
        finish(path, config, problems)
    }

    /// Parses and validates the text of an apps file; `path` names it in messages and anchors relative `ca_file`
    /// paths. Touches no file: [`AppsConfig::load`] also checks that each `ca_file` can be read.
    pub fn parse(path: &Path, text: &str) -> Result<Self, AppsError> {
        let (config, problems) = parse_all(path, text);
        finish(path, config, problems)
    }

    /// Things that are allowed but probably not meant: names in `accept` or `forwarders` that the senders file does
    /// not have (`is_sender` says whether it does; not an error, since the senders file may gain them later), and
    /// apps that can never get a record. One line each, `FILE:LINE: …`.
    pub fn warnings(&self, is_sender: &dyn Fn(&str) -> bool) -> Vec<String> {
        let path = self.path.as_deref().unwrap_or(Path::new("apps"));
        let fed: HashSet<&str> = self
            .apps
            .iter()
            .flat_map(|a| a.outlets.iter())
            .filter_map(|o| match &o.kind {
                OutletKind::App { app } => Some(app.as_str()),
                _ => None,
            })
            .collect();
        let mut out = Vec::new();
        for app in &self.apps {
            for name in app.forwarders.iter().filter(|n| !is_sender(n)) {
                out.push(
                    Problem {
                        line: app.forwarders_line.or(app.line),
                        app: Some(app.name.clone()),
                        key: Some("forwarders".into()),
                        what: format!("sender {name} is not in the senders file"),
                        fix: "it cannot forward to this app until the senders file lists it under this name (the \
                              forwarding node's public key: `pure-serve pubkey` on it), or correct the name"
                            .into(),
                    }
                    .render(path),
                );
            }
            let Accept::Only(names) = &app.accept else {
                continue;
            };
            for name in names.iter().filter(|n| !is_sender(n)) {
                out.push(
                    Problem {
                        line: app.accept_line.or(app.line),
                        app: Some(app.name.clone()),
                        key: Some("accept".into()),
                        what: format!("sender {name} is not in the senders file"),
                        fix: "it cannot send to this app until the senders file lists it (or correct the name)"
                            .into(),
                    }
                    .render(path),
                );
            }
            if names.is_empty() && !fed.contains(app.name.as_str()) {
                out.push(
                    Problem {
                        line: app.accept_line.or(app.line),
                        app: Some(app.name.clone()),
                        key: Some("accept".into()),
                        what: "takes no senders and no outlet of kind \"app\" names it, so it never gets a record"
                            .into(),
                        fix: "list senders in accept, or point an inner outlet of another app at it".into(),
                    }
                    .render(path),
                );
            }
        }
        out
    }

    /// Links and wires that would send to this node itself: the parser cannot know the node's key, so the node
    /// (and `check`, when it can read the key) calls this once the key is known.
    pub fn check_own_key(&self, own: &PublicKeyBytes) -> Vec<Problem> {
        let mut out = Vec::new();
        for app in &self.apps {
            for o in &app.outlets {
                if let Some((key, far_app)) = o.kind.far_flow()
                    && key == own
                {
                    out.push(Problem {
                        line: o.line,
                        app: Some(app.name.clone()),
                        key: Some(format!("outlets.{}.node_key", o.name)),
                        what: "is this node's own key: the outlet would send to this node itself".into(),
                        fix: format!(
                            "to forward to an app of this host use kind = \"app\" with app = \"{far_app}\"; \
                             otherwise give the far node's key (`pure-serve pubkey` on it)"
                        ),
                    });
                }
            }
        }
        out
    }

    /// The app of that name.
    pub fn app(&self, name: &str) -> Option<&AppConfig> {
        self.apps.iter().find(|a| a.name == name)
    }

    /// Outlets of all apps.
    pub fn outlet_count(&self) -> usize {
        self.apps.iter().map(|a| a.outlets.len()).sum()
    }

    /// Which apps take forwarded records and from whom, as `check` says it: an operator who upgrades sees at once
    /// that other nodes' outlets to an app without `forwarders` are refused (docs/apps.md).
    pub fn forwarding_summary(&self) -> String {
        let taking: Vec<String> = self
            .apps
            .iter()
            .filter(|a| !a.forwarders.is_empty())
            .map(|a| format!("{} from {}", a.name, a.forwarders.join(", ")))
            .collect();
        if taking.is_empty() {
            "no app takes forwarded records (no `forwarders`): outlets of other nodes sending here are refused \
             (REFUSE reason 3)"
                .to_string()
        } else {
            format!(
                "forwarded records are taken by app {}; other senders' are refused (REFUSE reason 3)",
                taking.join("; app ")
            )
        }
    }

    /// `N apps (a, b), M outlets`, as `check` and the node's start line say it.
    pub fn summary(&self) -> String {
        let names: Vec<&str> = self.apps.iter().map(|a| a.name.as_str()).collect();
        let (n, m) = (self.apps.len(), self.outlet_count());
        format!(
            "{n} app{} ({}), {m} outlet{}",
            if n == 1 { "" } else { "s" },
            names.join(", "),
            if m == 1 { "" } else { "s" }
        )
    }
}

fn finish(
    path: &Path,
    config: AppsConfig,
    mut problems: Vec<Problem>,
) -> Result<AppsConfig, AppsError> {
    if problems.is_empty() {
        return Ok(config);
    }
    // By line, problems without a line last; the sort is stable, so one line's problems keep their order.
    problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
    Err(AppsError::Bad {
        path: path.to_path_buf(),
        problems,
    })
}

/// Checks what `load` can check beyond the text: each `ca_file` is readable and holds a PEM certificate.
fn check_files(config: &AppsConfig) -> Vec<Problem> {
    let mut out = Vec::new();
    for app in &config.apps {
        for o in &app.outlets {
            let (OutletKind::Wire {
                ca_file: Some(ca), ..
            }
            | OutletKind::Webhook {
                ca_file: Some(ca), ..
            }) = &o.kind
            else {
                continue;
            };
            let problem = |what: String, fix: &str| Problem {
                line: o.ca_file_line.or(o.line),
                app: Some(app.name.clone()),
                key: Some(format!("outlets.{}.ca_file", o.name)),
                what,
                fix: fix.to_string(),
            };
            match files::read(ca, &files::CA_FILE) {
                Ok(bytes) if !bytes.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") => out.push(problem(
                    format!("{} holds no PEM certificate", ca.display()),
                    "give the CA's certificate in PEM form (-----BEGIN CERTIFICATE----- …)",
                )),
                Ok(_) => {}
                // The OS's error needs the fix said; the others say theirs.
                Err(e @ FileError::Read { .. }) => out.push(problem(
                    e.to_string(),
                    "give a file the node's user can read (a relative path is taken from the apps file's directory)",
                )),
                Err(e) => out.push(problem(e.to_string(), "")),
            }
        }
    }
    out
}

/// Byte offset → line number.
struct Lines(Vec<usize>);

impl Lines {
    fn new(text: &str) -> Self {
        Lines(
            text.bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i)
                .collect(),
        )
    }

    fn of(&self, offset: usize) -> usize {
        self.0.partition_point(|&nl| nl < offset) + 1
    }
}

type Entry<'a, 'i> = (&'a Spanned<DeString<'i>>, &'a Spanned<DeValue<'i>>);

/// A table's entries in the order of the file (the toml crate keeps them sorted by key).
fn in_file_order<'a, 'i>(table: &'a DeTable<'i>) -> Vec<Entry<'a, 'i>> {
    let mut v: Vec<Entry<'a, 'i>> = table.iter().collect();
    v.sort_by_key(|(k, _)| k.span().start);
    v
}

/// The closest of `candidates` to a mistyped `word`, if it is close enough to be a typo.
fn did_you_mean<'c>(word: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|&(d, c)| d > 0 && d <= 2.max(c.len() / 4))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

const APP_KEYS: &[&str] = &[
    "accept",
    "forwarders",
    "turn_records",
    "outlets",
    "downlink",
];
/// Keys of an app's `[apps.NAME.downlink]` table.
const DOWNLINK_KEYS: &[&str] = &["max_records", "max_bytes", "expiry_seconds"];
/// Bounds of the downlink keys: a sender's waiting records are rows read per LISTEN, so a million is a lot.
const MAX_DOWN_RECORDS: u64 = 1 << 20;
const MAX_DOWN_BYTES: u64 = 1 << 30;
const MAX_DOWN_EXPIRY_SECONDS: u64 = 10 * 365 * 24 * 3600;
const COMMON_OUTLET_KEYS: &[&str] = &["kind", "memory_bytes", "max_lag_records"];
const KINDS: &[(&str, &[&str])] = &[
    ("link", &["to", "node_key", "app", "from"]),
    ("wire", &["url", "node_key", "app", "ca_file", "from"]),
    (
        "webhook",
        &["url", "ca_file", "headers", "batch_records", "from"],
    ),
    ("app", &["app"]),
];
/// Every key some outlet has, for an outlet whose kind is not known.
fn all_outlet_keys() -> Vec<&'static str> {
    let mut all: Vec<&str> = COMMON_OUTLET_KEYS.to_vec();
    for (_, keys) in KINDS {
        for k in *keys {
            if !all.contains(k) {
                all.push(k);
            }
        }
    }
    all
}

/// "an" before an outlet kind said aloud with a vowel first (an app outlet), else "a".
fn article(kind: &str) -> &'static str {
    if kind.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// Headers the webhook client writes itself; one from the file would contradict it (a second `Idempotency-Key`,
/// read first by many receivers, would give every batch the same key: docs/apps.md).
const OWN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "content-type",
    "idempotency-key",
];

/// The walk over one file: where problems go, and how offsets become lines.
struct Walk {
    lines: Lines,
    problems: Vec<Problem>,
    /// Directory of the apps file, for relative `ca_file` paths.
    base: PathBuf,
    /// Line of each outlet's `app` key, by (app, outlet): the whole-file checks of inner outlets point at it.
    app_lines: HashMap<(String, String), usize>,
}

/// Where in the file a value sits: its app and dotted key.
#[derive(Clone, Copy)]
struct At<'a> {
    app: Option<&'a str>,
    key: &'a str,
}

impl Walk {
    fn problem(
        &mut self,
        span: Option<Range<usize>>,
        at: At<'_>,
        what: impl Into<String>,
        fix: impl Into<String>,
    ) {
        let line = span.map(|s| self.lines.of(s.start));
        self.problem_on(line, at, what, fix);
    }

    fn problem_on(
        &mut self,
        line: Option<usize>,
        at: At<'_>,
        what: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.problems.push(Problem {
            line,
            app: at.app.map(str::to_string),
            key: (!at.key.is_empty()).then(|| at.key.to_string()),
            what: what.into(),
            fix: fix.into(),
        });
    }

    fn wrong_type(&mut self, v: &Spanned<DeValue<'_>>, at: At<'_>, want: &str, fix: &str) {
        let got = v.get_ref().type_str();
        self.problem(
            Some(v.span()),
            at,
            format!("must be {want}, not a{} {got}", an(got)),
            fix,
        );
    }

    fn string<'v>(
        &mut self,
        v: &'v Spanned<DeValue<'_>>,
        at: At<'_>,
        fix: &str,
    ) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            _ => {
                self.wrong_type(v, at, "a string", fix);
                None
            }
        }
    }

    fn table<'v, 'i>(
        &mut self,
        v: &'v Spanned<DeValue<'i>>,
        at: At<'_>,
        fix: &str,
    ) -> Option<&'v DeTable<'i>> {
        match v.get_ref() {
            DeValue::Table(t) => Some(t),
            _ => {
                self.wrong_type(v, at, "a table", fix);
                None
            }
        }
    }

    /// A whole number in `min..=max`.
    fn integer(
        &mut self,
        v: &Spanned<DeValue<'_>>,
        at: At<'_>,
        min: u64,
        max: u64,
        fix: &str,
    ) -> Option<u64> {
        let DeValue::Integer(i) = v.get_ref() else {
            self.wrong_type(v, at, "a whole number", fix);
            return None;
        };
        match i128::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) if n >= i128::from(min) && n <= i128::from(max) => Some(n as u64),
            Ok(n) => {
                self.problem(Some(v.span()), at, format!("is {n}, out of range"), fix);
                None
            }
            Err(_) => {
                self.problem(Some(v.span()), at, "is too large a number", fix);
                None
            }
        }
    }

    fn unknown_key(
        &mut self,
        span: Range<usize>,
        at: At<'_>,
        name: &str,
        allowed: &[&str],
        whose: &str,
    ) {
        let hint = did_you_mean(name, allowed.iter().copied())
            .map(|k| format!("did you mean `{k}`? "))
            .unwrap_or_default();
        self.problem(
            Some(span),
            at,
            format!("unknown key `{name}`"),
            format!("{hint}the keys of {whose} are: {}", allowed.join(", ")),
        );
    }

    fn document(&mut self, doc: &DeTable<'_>) -> Vec<AppConfig> {
        let mut apps = Vec::new();
        let mut saw_apps = false;
        // A stray top-level table already has its own problem (and its fix says [apps.NAME]).
        let mut saw_other = false;
        for (key, value) in in_file_order(doc) {
            let name: &str = key.get_ref();
            if name != "apps" {
                // `[app.s]` is `apps` mistyped, so the app is `s`; `[sensors]` is an app without `apps.`.
                let mistyped_apps = did_you_mean(name, ["apps"]).is_some();
                let fix = if let (true, DeValue::Table(t)) = (mistyped_apps, value.get_ref())
                    && let Some((first, _)) = in_file_order(t).first()
                {
                    format!(
                        "every app is a table [apps.NAME]: did you mean [apps.{}]?",
                        first.get_ref()
                    )
                } else if value.get_ref().is_table() {
                    format!("every app is a table [apps.NAME]: did you mean [apps.{name}]?")
                } else {
                    "the file holds only [apps.NAME] tables (docs/apps.md)".to_string()
                };
                self.problem(
                    Some(key.span()),
                    At {
                        app: None,
                        key: name,
                    },
                    format!("unknown top-level key `{name}`"),
                    fix,
                );
                saw_other = true;
                continue;
            }
            let at = At {
                app: None,
                key: "apps",
            };
            let Some(table) = self.table(value, at, "write each app as a table [apps.NAME]") else {
                saw_other = true;
                continue;
            };
            for (app_key, app_value) in in_file_order(table) {
                saw_apps = true;
                if let Some(app) = self.app(app_key, app_value) {
                    apps.push(app);
                }
            }
        }
        if !saw_apps && !saw_other {
            self.problem(
                None,
                At { app: None, key: "" },
                "no apps: the file has no [apps.NAME] table",
                "add one, such as `[apps.main]` with `accept = \"all\"` (docs/apps.md), or run without --apps \
                 for the one app `main`",
            );
        }
        apps
    }

    fn app(
        &mut self,
        key: &Spanned<DeString<'_>>,
        value: &Spanned<DeValue<'_>>,
    ) -> Option<AppConfig> {
        let name: &str = key.get_ref();
        let line = self.lines.of(key.span().start);
        let at = |key| At {
            app: Some(name),
            key,
        };
        if !valid_app_name(name.as_bytes()) {
            self.problem(
                Some(key.span()),
                at(""),
                format!("name {name:?} is not 1–{MAX_APP_LEN} characters of a-z, 0-9, _ and -"),
                format!(
                    "rename it, as [apps.{}] (senders name the app in every packet; its store is STATE/apps/NAME.sqlite)",
                    suggest_name(name)
                ),
            );
        }
        let table = self.table(
            value,
            at(""),
            "write the app as a table: [apps.NAME] and its keys below it",
        )?;
        let mut app = AppConfig {
            name: name.to_string(),
            accept: Accept::All,
            forwarders: Vec::new(),
            turn_records: DEFAULT_TURN_RECORDS,
            outlets: Vec::new(),
            downlink: Default::default(),
            line: Some(line),
            accept_line: None,
            forwarders_line: None,
        };
        for (k, v) in in_file_order(table) {
            match k.get_ref().as_ref() {
                "accept" => {
                    if let Some(a) = self.accept(v, at("accept")) {
                        app.accept_line = Some(self.lines.of(v.span().start));
                        app.accept = a;
                    }
                }
                "forwarders" => {
                    if let Some(f) = self.forwarders(v, at("forwarders")) {
                        // Each forwarder must also be accepted, which is known after the loop.
                        app.forwarders_line = Some(self.lines.of(v.span().start));
                        app.forwarders = f;
                    }
                }
                "turn_records" => {
                    if let Some(n) = self.integer(
                        v,
                        at("turn_records"),
                        1,
                        MAX_TURN_RECORDS,
                        &format!(
                            "give 1 to {MAX_TURN_RECORDS} records (default {DEFAULT_TURN_RECORDS})"
                        ),
                    ) {
                        app.turn_records = n;
                    }
                }
                "downlink" => {
                    let Some(t) = self.table(
                        v,
                        at("downlink"),
                        "write it as a table [apps.APP.downlink] with max_records, max_bytes, expiry_seconds",
                    ) else {
                        continue;
                    };
                    for (dk, dv) in in_file_order(t) {
                        let key = dk.get_ref().as_ref();
                        let at = At {
                            app: Some(name),
                            key: match key {
                                "max_records" => "downlink.max_records",
                                "max_bytes" => "downlink.max_bytes",
                                "expiry_seconds" => "downlink.expiry_seconds",
                                _ => "downlink",
                            },
                        };
                        match key {
                            "max_records" => {
                                if let Some(n) = self.integer(
                                    dv,
                                    at,
                                    1,
                                    MAX_DOWN_RECORDS,
                                    &format!(
                                        "give 1 to {MAX_DOWN_RECORDS} records waiting per sender (default 1024)"
                                    ),
                                ) {
                                    app.downlink.max_records = n;
                                }
                            }
                            "max_bytes" => {
                                if let Some(n) = self.integer(
                                    dv,
                                    at,
                                    1,
                                    MAX_DOWN_BYTES,
                                    &format!(
                                        "give 1 to {MAX_DOWN_BYTES} bytes waiting per sender (default 1048576)"
                                    ),
                                ) {
                                    app.downlink.max_bytes = n;
                                }
                            }
                            "expiry_seconds" => {
                                if let Some(n) = self.integer(
                                    dv,
                                    at,
                                    1,
                                    MAX_DOWN_EXPIRY_SECONDS,
                                    &format!(
                                        "give 1 to {MAX_DOWN_EXPIRY_SECONDS} seconds, or leave it out for \
                                         records that never expire"
                                    ),
                                ) {
                                    app.downlink.expiry_ms = Some(n * 1000);
                                }
                            }
                            other => self.unknown_key(
                                dk.span(),
                                at,
                                other,
                                DOWNLINK_KEYS,
                                "an app's downlink table",
                            ),
                        }
                    }
                }
                "outlets" => {
                    let Some(outlets) = self.table(
                        v,
                        at("outlets"),
                        "write each outlet as a table [apps.APP.outlets.NAME]",
                    ) else {
                        continue;
                    };
                    for (ok, ov) in in_file_order(outlets) {
                        if let Some(o) = self.outlet(name, ok, ov) {
                            app.outlets.push(o);
                        }
                    }
                }
                other => {
                    let whose = "an app";
                    if KINDS.iter().any(|(_, keys)| keys.contains(&other))
                        || COMMON_OUTLET_KEYS.contains(&other)
                    {
                        self.problem(
                            Some(k.span()),
                            at(other),
                            format!("`{other}` is a key of an outlet, not of an app"),
                            format!("put it under an outlet, [apps.{name}.outlets.NAME]"),
                        );
                    } else {
                        self.unknown_key(k.span(), at(other), other, APP_KEYS, whose);
                    }
                }
            }
        }
        for f in app.forwarders.iter().filter(|f| !app.accept.allows(f)) {
            self.problem_on(
                app.forwarders_line,
                at("forwarders"),
                format!(
                    "lists {f}, which accept does not: the node refuses its frames (REFUSE reason 2) before it \
                     looks at whether they are forwarded"
                ),
                format!("add {f:?} to accept as well (or write accept = \"all\")"),
            );
        }
        Some(app)
    }

    fn accept(&mut self, v: &Spanned<DeValue<'_>>, at: At<'_>) -> Option<Accept> {
        const FIX: &str = "write accept = \"all\", or a list of names from the senders file such as \
                           accept = [\"kitchen-1\", \"hall\"]; accept = [] takes no senders directly";
        match v.get_ref() {
            DeValue::String(s) if s == "all" => Some(Accept::All),
            DeValue::String(s) => {
                let fix = if ["none", "nobody", ""].contains(&s.as_ref()) {
                    "for no sender write accept = []; its records then come only from inner outlets"
                        .to_string()
                } else if crate::senders::valid_name(s) {
                    format!("for this one sender write accept = [{s:?}]; or {FIX}")
                } else {
                    FIX.to_string()
                };
                self.problem(
                    Some(v.span()),
                    at,
                    format!("is {s:?}, which is not \"all\""),
                    fix,
                );
                None
            }
            DeValue::Array(items) => self.sender_names(items, at, FIX).map(Accept::Only),
            _ => {
                self.wrong_type(v, at, "\"all\" or a list of sender names", FIX);
                None
            }
        }
    }

    /// `forwarders`: a list of sender names, and only a list. There is no "all" on purpose: a sender that may
    /// forward says where each record came from and is believed (docs/protocol.md 5.4, 9), so each is named.
    fn forwarders(&mut self, v: &Spanned<DeValue<'_>>, at: At<'_>) -> Option<Vec<String>> {
        const FIX: &str = "list the nodes whose outlets forward to this app, by their names in the senders file, \
                           such as forwarders = [\"edge-1\", \"edge-2\"]; the default, [], lets none";
        match v.get_ref() {
            DeValue::Array(items) => self.sender_names(items, at, FIX),
            DeValue::String(s) if s == "all" => {
                self.problem(
                    Some(v.span()),
                    at,
                    "is \"all\", which forwarders does not take: a sender that may forward says where each record \
                     came from and is believed, so a device among them could have its records stored as another's",
                    FIX,
                );
                None
            }
            DeValue::String(s) if crate::senders::valid_name(s) => {
                self.wrong_type(
                    v,
                    at,
                    "a list of sender names",
                    &format!("for this one sender write forwarders = [{s:?}]"),
                );
                None
            }
            _ => {
                self.wrong_type(v, at, "a list of sender names", FIX);
                None
            }
        }
    }

    /// A list of sender names (`accept`, `forwarders`): each in the senders file's grammar, none twice.
    fn sender_names(&mut self, items: &DeArray<'_>, at: At<'_>, fix: &str) -> Option<Vec<String>> {
        let mut names: Vec<String> = Vec::new();
        let mut ok = true;
        for item in items.iter() {
            let Some(name) = self.string(item, at, fix) else {
                ok = false;
                continue;
            };
            if !crate::senders::valid_name(name) {
                self.problem(
                    Some(item.span()),
                    at,
                    format!("{name:?} is not a sender name"),
                    format!(
                        "names in the senders file are 1–{} letters, digits and . _ : @ -",
                        crate::senders::MAX_NAME_LEN
                    ),
                );
                ok = false;
            } else if names.iter().any(|n| n == name) {
                self.problem(
                    Some(item.span()),
                    at,
                    format!("lists {name} twice"),
                    "remove one (or was another sender meant?)",
                );
                ok = false;
            } else {
                names.push(name.to_string());
            }
        }
        ok.then_some(names)
    }

    fn outlet(
        &mut self,
        app: &str,
        key: &Spanned<DeString<'_>>,
        value: &Spanned<DeValue<'_>>,
    ) -> Option<OutletConfig> {
        let name: &str = key.get_ref();
        let prefix = format!("outlets.{name}");
        let dotted = |k: &str| format!("{prefix}.{k}");
        let line = self.lines.of(key.span().start);
        let whole = At {
            app: Some(app),
            key: &prefix,
        };
        let mut ok = true;
        if !valid_app_name(name.as_bytes()) {
            self.problem(
                Some(key.span()),
                whole,
                format!(
                    "outlet name {name:?} is not 1–{MAX_APP_LEN} characters of a-z, 0-9, _ and -"
                ),
                format!(
                    "rename it, as [apps.{app}.outlets.{}] (metrics label outlets by name)",
                    suggest_name(name)
                ),
            );
            ok = false;
        }
        let table = self.table(
            value,
            whole,
            &format!("write the outlet as a table: [apps.{app}.{prefix}]"),
        )?;
        let kind_names: Vec<&str> = KINDS.iter().map(|(k, _)| *k).collect();
        let kind_fix = format!(
            "kind is one of {}",
            kind_names
                .iter()
                .map(|k| format!("\"{k}\""))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let kind: Option<&str> = match table.get("kind") {
            None => {
                self.problem(
                    Some(key.span()),
                    whole,
                    "has no `kind`",
                    format!("add a line `kind = \"…\"`: {kind_fix}"),
                );
                None
            }
            Some(v) => {
                let k_key = dotted("kind");
                let at = At {
                    app: Some(app),
                    key: &k_key,
                };
                match self.string(v, at, &kind_fix) {
                    Some(k) if kind_names.contains(&k) => Some(k),
                    Some(k) => {
                        let hint = did_you_mean(k, kind_names.iter().copied())
                            .map(|s| format!("did you mean \"{s}\"? "))
                            .unwrap_or_default();
                        self.problem(
                            Some(v.span()),
                            at,
                            format!("is {k:?}, not a kind of outlet"),
                            format!("{hint}{kind_fix}"),
                        );
                        None
                    }
                    None => None,
                }
            }
        };
        let own: &[&str] = KINDS
            .iter()
            .find(|(k, _)| Some(*k) == kind)
            .map(|(_, keys)| *keys)
            .unwrap_or(&[]);
        let allowed: Vec<&str> = COMMON_OUTLET_KEYS
            .iter()
            .chain(own.iter())
            .copied()
            .collect();

        let mut memory_bytes = DEFAULT_MEMORY_BYTES;
        let mut max_lag_records = 0u64;
        let mut from = StartFrom::default();
        let mut to: Option<String> = None;
        let mut url: Option<(HttpUrl, Range<usize>)> = None;
        let mut node_key: Option<PublicKeyBytes> = None;
        let mut far_app: Option<String> = None;
        let mut ca_file: Option<(PathBuf, Range<usize>)> = None;
        let mut headers: Vec<(String, String)> = Vec::new();
        let mut batch_records = DEFAULT_BATCH_RECORDS;
        let mut seen: HashSet<&str> = HashSet::new();
        let default_path = if kind == Some("wire") {
            DEFAULT_WIRE_PATH
        } else {
            "/"
        };

        for (k, v) in in_file_order(table) {
            let k_name: &str = k.get_ref();
            let k_key = dotted(k_name);
            let at = At {
                app: Some(app),
                key: &k_key,
            };
            if kind.is_none() && k_name != "kind" {
                // Without a known kind the keys cannot be judged; only names that no kind has are reported.
                if !COMMON_OUTLET_KEYS.contains(&k_name)
                    && !KINDS.iter().any(|(_, keys)| keys.contains(&k_name))
                {
                    self.unknown_key(k.span(), at, k_name, &all_outlet_keys(), "an outlet");
                }
                continue;
            }
            if !allowed.contains(&k_name) {
                let owners: Vec<&str> = KINDS
                    .iter()
                    .filter(|(_, keys)| keys.contains(&k_name))
                    .map(|(kn, _)| *kn)
                    .collect();
                let kind = kind.unwrap_or("?");
                if owners.is_empty() {
                    self.unknown_key(
                        k.span(),
                        at,
                        k_name,
                        &allowed,
                        &format!("{} {kind} outlet", article(kind)),
                    );
                } else {
                    self.problem(
                        Some(k.span()),
                        at,
                        format!(
                            "`{k_name}` is not a key of {} {kind} outlet (only of {})",
                            article(kind),
                            owners.join(" and ")
                        ),
                        format!(
                            "remove it; the keys of {} {kind} outlet are: {}",
                            article(kind),
                            allowed.join(", ")
                        ),
                    );
                }
                ok = false;
                continue;
            }
            seen.insert(k_name);
            match k_name {
                "kind" => {}
                "memory_bytes" => {
                    let max = u64::try_from(usize::MAX)
                        .unwrap_or(u64::MAX)
                        .min(i64::MAX as u64);
                    let fix = format!(
                        "give at least {MIN_MEMORY_BYTES} bytes (64 KiB; default {DEFAULT_MEMORY_BYTES}, 4 MiB)"
                    );
                    match self.integer(v, at, MIN_MEMORY_BYTES as u64, max, &fix) {
                        // In range of usize by the bound above.
                        Some(n) => memory_bytes = n as usize,
                        None => ok = false,
                    }
                }
                "max_lag_records" => {
                    match self.integer(
                        v,
                        at,
                        0,
                        i64::MAX as u64,
                        "give a number of records, or 0 for no limit",
                    ) {
                        Some(n) => max_lag_records = n,
                        None => ok = false,
                    }
                }
                "from" => {
                    let fix = "write \"first\" (the app's whole store, the default) or \"next\" (only what it \
                               stores from when the outlet is first applied)";
                    match self.string(v, at, fix) {
                        Some("first") => from = StartFrom::First,
                        Some("next") => from = StartFrom::Next,
                        Some(other) => {
                            self.problem(
                                Some(v.span()),
                                at,
                                format!("{other:?} is not a start"),
                                fix,
                            );
                            ok = false;
                        }
                        None => ok = false,
                    }
                }
                "to" => {
                    let fix = "write HOST:PORT, the far node's --link-port (7380 unless changed), such as \
                               \"cloud.example.net:7380\" or \"[2001:db8::1]:7380\"";
                    match self.string(v, at, fix) {
                        Some(s) => match parse_host_port(s, None) {
                            Ok(_) => to = Some(s.to_string()),
                            Err(e) => {
                                self.problem(Some(v.span()), at, e, fix);
                                ok = false;
                            }
                        },
                        None => ok = false,
                    }
                }
                "url" => {
                    let fix = if kind == Some("wire") {
                        "write http(s)://HOST:PORT/link with the far node's --http-port (7381 unless changed)"
                    } else {
                        "write the endpoint as http://HOST[:PORT]/PATH or https://…"
                    };
                    match self.string(v, at, fix) {
                        Some(s) => match HttpUrl::parse(s, default_path) {
                            Ok(u) => url = Some((u, v.span())),
                            Err(e) => {
                                self.problem(Some(v.span()), at, format!("{s:?} {e}"), fix);
                                ok = false;
                            }
                        },
                        None => ok = false,
                    }
                }
                "node_key" => {
                    let fix = "give the far node's public key: `pure-serve pubkey --key node.key` on it prints \
                               it (44 characters of base64)";
                    match self.string(v, at, fix).map(crate::keys::parse_public_key) {
                        Some(Ok(k)) if k == [0u8; 32] => {
                            self.problem(
                                Some(v.span()),
                                at,
                                "is all zeros, which no key pair has",
                                fix,
                            );
                            ok = false;
                        }
                        Some(Ok(k)) => node_key = Some(k),
                        Some(Err(e)) => {
                            self.problem(Some(v.span()), at, e.to_string(), fix);
                            ok = false;
                        }
                        None => ok = false,
                    }
                }
                "app" => {
                    let fix = if kind == Some("app") {
                        "name another app of this file, as app = \"counter\""
                    } else {
                        "name the app on the far node (1–32 of a-z, 0-9, _ and -); leave it out for this app's name"
                    };
                    match self.string(v, at, fix) {
                        Some(s) if valid_app_name(s.as_bytes()) => {
                            far_app = Some(s.to_string());
                            if kind == Some("app") {
                                let line = self.lines.of(v.span().start);
                                self.app_lines
                                    .insert((app.to_string(), name.to_string()), line);
                            }
                        }
                        Some(s) => {
                            self.problem(
                                Some(v.span()),
                                at,
                                format!("{s:?} is not an app name (1–{MAX_APP_LEN} of a-z, 0-9, _ and -)"),
                                fix,
                            );
                            ok = false;
                        }
                        None => ok = false,
                    }
                }
                "ca_file" => {
                    let fix = "give the path of a PEM file with the CA's certificate";
                    match self.string(v, at, fix) {
                        Some("") => {
                            self.problem(
                                Some(v.span()),
                                at,
                                "is empty",
                                format!("{fix}, or leave ca_file out to use the system's roots"),
                            );
                            ok = false;
                        }
                        Some(s) => ca_file = Some((self.base.join(s), v.span())),
                        None => ok = false,
                    }
                }
                "headers" => match self.headers(v, &k_key, app) {
                    Some(h) => headers = h,
                    None => ok = false,
                },
                "batch_records" => {
                    let fix = format!(
                        "give 1 to {MAX_BATCH_RECORDS} records (default {DEFAULT_BATCH_RECORDS})"
                    );
                    match self.integer(v, at, 1, MAX_BATCH_RECORDS as u64, &fix) {
                        Some(n) => batch_records = n as usize,
                        None => ok = false,
                    }
                }
                // `allowed` holds only the names above.
                _ => {}
            }
        }
        let kind = kind?;
        // Required keys, reported at the outlet's header.
        let required: &[(&str, &str)] = match kind {
            "link" => &[
                ("to", "to = \"HOST:PORT\", the far node's --link-port"),
                (
                    "node_key",
                    "node_key = \"…\", the far node's public key (`pure-serve pubkey` on it)",
                ),
            ],
            "wire" => &[
                (
                    "url",
                    "url = \"https://HOST:PORT/link\", the far node's --http-port",
                ),
                (
                    "node_key",
                    "node_key = \"…\", the far node's public key (`pure-serve pubkey` on it)",
                ),
            ],
            "webhook" => &[(
                "url",
                "url = \"https://HOST/PATH\", where the batches are POSTed",
            )],
            _ => &[(
                "app",
                "app = \"NAME\", the app of this host that takes the copies",
            )],
        };
        for (req, example) in required {
            if !seen.contains(req) {
                self.problem(
                    Some(key.span()),
                    whole,
                    format!("{} {kind} outlet needs `{req}`", article(kind)),
                    format!("add {example}"),
                );
                ok = false;
            }
        }
        if let (Some((_, span)), Some((u, _))) = (&ca_file, &url)
            && !u.tls
        {
            let k_key = dotted("ca_file");
            self.problem(
                Some(span.clone()),
                At {
                    app: Some(app),
                    key: &k_key,
                },
                "is for https only, and this url is http://",
                "use an https:// url, or remove ca_file",
            );
            ok = false;
        }
        if !ok {
            return None;
        }
        let far_or_this = far_app.clone().unwrap_or_else(|| app.to_string());
        let ca_file_line = ca_file.as_ref().map(|(_, span)| self.lines.of(span.start));
        let kind = match kind {
            "link" => OutletKind::Link {
                to: to?,
                node_key: node_key?,
                app: far_or_this,
            },
            "wire" => OutletKind::Wire {
                url: url?.0,
                node_key: node_key?,
                app: far_or_this,
                ca_file: ca_file.map(|(p, _)| p),
            },
            "webhook" => OutletKind::Webhook {
                url: url?.0,
                ca_file: ca_file.map(|(p, _)| p),
                headers,
                batch_records,
            },
            _ => OutletKind::App { app: far_app? },
        };
        Some(OutletConfig {
            name: name.to_string(),
            kind,
            memory_bytes,
            max_lag_records,
            from,
            line: Some(line),
            ca_file_line,
        })
    }

    fn headers(
        &mut self,
        v: &Spanned<DeValue<'_>>,
        key: &str,
        app: &str,
    ) -> Option<Vec<(String, String)>> {
        let at = At {
            app: Some(app),
            key,
        };
        let table = self.table(v, at, "write headers = { Authorization = \"Bearer …\" }")?;
        let mut out: Vec<(String, String)> = Vec::new();
        let mut ok = true;
        for (k, hv) in in_file_order(table) {
            let name: &str = k.get_ref();
            let h_key = format!("{key}.{name}");
            let h_at = At {
                app: Some(app),
                key: &h_key,
            };
            // RFC 9110 5.1: a field name is a token.
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token {
                self.problem(
                    Some(k.span()),
                    h_at,
                    format!("{name:?} is not a header name"),
                    "a header name is letters, digits and - (such as X-Api-Key)",
                );
                ok = false;
                continue;
            }
            let lower = name.to_ascii_lowercase();
            if OWN_HEADERS.contains(&lower.as_str()) {
                self.problem(
                    Some(k.span()),
                    h_at,
                    format!("{name} is set by the node itself"),
                    format!("remove it; the node writes {}", OWN_HEADERS.join(", ")),
                );
                ok = false;
                continue;
            }
            if out.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
                self.problem(
                    Some(k.span()),
                    h_at,
                    format!("{name} is given twice (header names ignore case)"),
                    "keep one",
                );
                ok = false;
                continue;
            }
            let Some(value) = self.string(hv, h_at, "give the header's value as a string") else {
                ok = false;
                continue;
            };
            // RFC 9110 5.5: no CR, LF or NUL (they would end the header and let the file inject others).
            if value.chars().any(|c| c.is_control() && c != '\t') {
                self.problem(
                    Some(hv.span()),
                    h_at,
                    "has a control character (such as a line break)",
                    "give the value on one line, without control characters",
                );
                ok = false;
                continue;
            }
            out.push((name.to_string(), value.to_string()));
        }
        ok.then_some(out)
    }

    /// What only the whole file can show: inner outlets to apps that are not there, cycles of inner outlets, and two
    /// outlets of this host that would share one flow on the far side.
    fn cross_check(&mut self, apps: &[AppConfig]) {
        let all_names: Vec<&str> = apps.iter().map(|a| a.name.as_str()).collect();
        let mut far: HashMap<(PublicKeyBytes, &str), (&str, &str, Option<usize>)> = HashMap::new();
        let mut inner: HashMap<(&str, &str), &str> = HashMap::new();
        for app in apps {
            for o in &app.outlets {
                let key = format!("outlets.{}.app", o.name);
                let at = At {
                    app: Some(&app.name),
                    key: &key,
                };
                let line = self
                    .app_lines
                    .get(&(app.name.clone(), o.name.clone()))
                    .copied()
                    .or(o.line);
                match &o.kind {
                    OutletKind::App { app: target } if target == &app.name => {
                        self.problem_on(
                            line,
                            at,
                            "names this app itself; its records would be copied into it forever",
                            "name another app of this file",
                        );
                    }
                    OutletKind::App { app: target } if !all_names.contains(&target.as_str()) => {
                        let hint = did_you_mean(target, all_names.iter().copied())
                            .map(|s| format!("did you mean \"{s}\"? "))
                            .unwrap_or_default();
                        self.problem_on(
                            line,
                            at,
                            format!("names app {target}, which is not in this file"),
                            format!("{hint}the apps of this file are: {}", all_names.join(", ")),
                        );
                    }
                    OutletKind::App { app: target } => {
                        if let Some(first) = inner.insert((&app.name, target), &o.name) {
                            self.problem_on(
                                line,
                                at,
                                format!("copies into app {target}, as outlet {first} of this app already does"),
                                "keep one of them: both would be one flow, and every record would go twice",
                            );
                        }
                    }
                    k => {
                        if let Some((node_key, far_app)) = k.far_flow()
                            && let Some((a, n, l)) =
                                far.insert((*node_key, far_app), (&app.name, &o.name, o.line))
                        {
                            let key = format!("outlets.{}", o.name);
                            let first_line = l.map(|l| format!(" (line {l})")).unwrap_or_default();
                            self.problem_on(
                                line,
                                At { app: Some(&app.name), key: &key },
                                format!(
                                    "sends to app {far_app} on node {}, as outlet {n} of app {a}{first_line} already does",
                                    short_key(node_key)
                                ),
                                "the far node keeps one heard sequence per app and sender, and both outlets send as \
                                 this node, so their records would be taken for each other's repeats and dropped; \
                                 forward through one outlet, or send to another far app",
                            );
                        }
                    }
                }
            }
        }
        self.cycles(apps);
    }

    /// Reports each cycle of inner outlets once, at the outlet that closes it.
    fn cycles(&mut self, apps: &[AppConfig]) {
        let index: HashMap<&str, usize> = apps
            .iter()
            .enumerate()
            .map(|(i, a)| (a.name.as_str(), i))
            .collect();
        // Edges in file order: (target app, outlet).
        let edges: Vec<Vec<(usize, &OutletConfig)>> = apps
            .iter()
            .map(|a| {
                a.outlets
                    .iter()
                    .filter_map(|o| match &o.kind {
                        OutletKind::App { app } if *app != a.name => {
                            index.get(app.as_str()).map(|&t| (t, o))
                        }
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        // 0 unvisited, 1 on the path, 2 done. Iterative, so a long chain of apps cannot overflow the stack.
        let mut state = vec![0u8; apps.len()];
        let mut reported: HashSet<Vec<usize>> = HashSet::new();
        for root in 0..apps.len() {
            if state[root] != 0 {
                continue;
            }
            let mut path: Vec<(usize, usize)> = vec![(root, 0)];
            state[root] = 1;
            while let Some(top) = path.last_mut() {
                let node = top.0;
                let Some(&(target, outlet)) = edges[node].get(top.1) else {
                    state[node] = 2;
                    path.pop();
                    continue;
                };
                top.1 += 1;
                match state[target] {
                    0 => {
                        state[target] = 1;
                        path.push((target, 0));
                    }
                    1 => {
                        let from = path.iter().position(|&(n, _)| n == target).unwrap_or(0);
                        let cycle: Vec<usize> = path[from..].iter().map(|&(n, _)| n).collect();
                        let mut canon = cycle.clone();
                        let min = canon
                            .iter()
                            .enumerate()
                            .min_by_key(|&(_, n)| *n)
                            .map_or(0, |(i, _)| i);
                        canon.rotate_left(min);
                        if reported.insert(canon) {
                            let mut names: Vec<&str> =
                                cycle.iter().map(|&n| apps[n].name.as_str()).collect();
                            names.push(&apps[target].name);
                            let key = format!("outlets.{}.app", outlet.name);
                            let line = self
                                .app_lines
                                .get(&(apps[node].name.clone(), outlet.name.clone()))
                                .copied()
                                .or(outlet.line);
                            self.problem_on(
                                line,
                                At { app: Some(&apps[node].name), key: &key },
                                format!("inner outlets form a cycle: {}", names.join(" → ")),
                                "each record would be copied around it forever; remove one of these outlets so \
                                 records flow one way",
                            );
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// `a` or `an` before a type name.
fn an(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "n"
    } else {
        ""
    }
}

/// A valid name close to an invalid one, for the fix: lower case, other characters as `-`, cut to 32.
fn suggest_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(MAX_APP_LEN)
        .collect();
    if s.is_empty() { "main".into() } else { s }
}

/// TOML's "duplicate key", said of what is given twice: the table whose header is on the line at `at` (and where
/// it was first), or the key there. `None` when the line says neither.
fn duplicate(text: &str, at: usize) -> Option<(String, String)> {
    let start = text.get(..at)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?.trim();
    if line.starts_with('[') && !line.starts_with("[[") {
        let header = &line[..=line.find(']')?];
        let first = text[..start]
            .lines()
            .position(|l| l.trim().starts_with(header))
            .map(|i| i + 1)?;
        return Some((
            format!("table {header} is given twice (first at line {first})"),
            format!("put its keys under one {header}"),
        ));
    }
    let key = line.split('=').next()?.trim();
    (!key.is_empty()).then(|| {
        (
            format!(
                "key `{key}` is given twice in its table (line {})",
                text[..at].matches('\n').count() + 1
            ),
            "keep one".to_string(),
        )
    })
}

/// Parses what can be parsed and collects every problem; the config holds what parsed well enough to cross-check.
fn parse_all(path: &Path, text: &str) -> (AppsConfig, Vec<Problem>) {
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut walk = Walk {
        lines: Lines::new(text),
        problems: Vec::new(),
        base,
        app_lines: HashMap::new(),
    };
    let mut config = AppsConfig {
        apps: Vec::new(),
        path: Some(path.to_path_buf()),
    };
    let (doc, errors) = DeTable::parse_recoverable(text);
    if !errors.is_empty() {
        // After a syntax error the recovered tables may miss keys; judging them would report problems that are not
        // there. Syntax first, all of it; the rest at the next check.
        for e in &errors {
            let what = e.message().trim().trim_end_matches('.').to_string();
            if what == "duplicate key"
                && let Some((what, fix)) = e.span().and_then(|span| duplicate(text, span.start))
            {
                walk.problem(e.span(), At { app: None, key: "" }, what, &fix);
                continue;
            }
            walk.problem(
                e.span(),
                At { app: None, key: "" },
                format!("TOML syntax: {what}"),
                "see the example in docs/apps.md",
            );
        }
        return (config, walk.problems);
    }
    let apps = walk.document(doc.get_ref());
    walk.cross_check(&apps);
    config.apps = apps;
    (config, walk.problems)
}

/// What a reload of the apps file would do, worked out before anything is touched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadPlan {
    /// Apps only in the new file: their stores are opened and they start taking input at the reload.
    pub added: Vec<String>,
    /// Apps in both whose accept list, forwarders, turn_records, downlink bounds or outlets differ: applied at the
    /// reload.
    pub changed: Vec<String>,
    /// Apps only in the old file. Removing (or renaming) an app needs a restart; until then it runs as before.
    pub needs_restart: Vec<String>,
    /// One line for each difference, for the log and the reply to the operator.
    pub lines: Vec<String>,
    /// Differences that may not be what the operator meant (an outlet renamed), for a warning.
    pub warnings: Vec<String>,
}

impl ReloadPlan {
    /// Nothing differs.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.needs_restart.is_empty()
    }
}

/// The warning for an outlet `old` of `app` removed while `new`, of the same kind and target, is added: a rename,
/// most likely, and a rename makes a new outlet (docs/apps.md, "Reload").
pub fn renamed_outlet(app: &str, old: &str, new: &OutletConfig) -> String {
    let what = match (&new.kind, new.from) {
        (OutletKind::Link { .. } | OutletKind::Wire { .. }, _) => format!(
            "a link or wire goes on from where the far node stands, so {} sends nothing twice",
            new.name
        ),
        (OutletKind::Webhook { .. }, StartFrom::First) => format!(
            "{} is a new outlet with from = \"first\": it sends every record of the app again, under its new name \
             and new idempotency keys; to send only what is stored from now on, set from = \"next\" on it, or keep \
             the old name",
            new.name
        ),
        (OutletKind::Webhook { .. }, StartFrom::Next) => format!(
            "{} is a new outlet with from = \"next\": it sends only what is stored from now on; what {old} had not \
             delivered yet is not sent to it",
            new.name
        ),
        (OutletKind::App { .. }, _) => format!(
            "an inner outlet goes on from where its destination stands, so {} copies nothing twice",
            new.name
        ),
    };
    format!(
        "app {app}: outlet {old} removed and {} added with the same kind and target ({}): renamed? {what}",
        new.name, new.kind
    )
}

fn same_outlet(a: &OutletConfig, b: &OutletConfig) -> bool {
    a.kind == b.kind && a.memory_bytes == b.memory_bytes && a.max_lag_records == b.max_lag_records
}

/// Compares the apps file in force with a new one: what a reload applies, and what only a restart can change.
///
/// Applied: new apps (a store is opened), accept and forwarders lists, turn_records, and outlets added, removed or
/// changed. Not applied: an app that is gone from the file — its store is open, its turn and its outlets' backlogs
/// are in flight, and its senders are mid-run; stopping it cleanly is what a restart does. A rename looks the same (one
/// app gone, one new), and it would start with an empty store, since the store is named after the app.
pub fn plan_reload(old: &AppsConfig, new: &AppsConfig) -> ReloadPlan {
    let mut plan = ReloadPlan::default();
    for n in &new.apps {
        let Some(o) = old.app(&n.name) else {
            plan.added.push(n.name.clone());
            plan.lines.push(format!(
                "app {} added: accepts {}, {} outlet{}; its store is STATE/apps/{}.sqlite (on a fleet's --store: \
                 its rows in the database)",
                n.name,
                n.accept,
                n.outlets.len(),
                if n.outlets.len() == 1 { "" } else { "s" },
                n.name
            ));
            continue;
        };
        let mut lines = Vec::new();
        if o.accept != n.accept {
            lines.push(format!(
                "app {}: accept {} → {}",
                n.name, o.accept, n.accept
            ));
        }
        if o.forwarders != n.forwarders {
            let list = |f: &[String]| {
                if f.is_empty() {
                    "none".to_string()
                } else {
                    f.join(", ")
                }
            };
            lines.push(format!(
                "app {}: forwarders {} → {}",
                n.name,
                list(&o.forwarders),
                list(&n.forwarders)
            ));
        }
        if o.turn_records != n.turn_records {
            lines.push(format!(
                "app {}: turn_records {} → {}",
                n.name, o.turn_records, n.turn_records
            ));
        }
        if o.downlink != n.downlink {
            let (a, b) = (&o.downlink, &n.downlink);
            let mut what = Vec::new();
            if a.max_records != b.max_records {
                what.push(format!("max_records {} → {}", a.max_records, b.max_records));
            }
            if a.max_bytes != b.max_bytes {
                what.push(format!("max_bytes {} → {}", a.max_bytes, b.max_bytes));
            }
            if a.expiry_ms != b.expiry_ms {
                let expiry =
                    |e: Option<u64>| e.map_or("none".to_string(), |ms| format!("{} s", ms / 1000));
                what.push(format!(
                    "expiry_seconds {} → {}",
                    expiry(a.expiry_ms),
                    expiry(b.expiry_ms)
                ));
            }
            lines.push(format!(
                "app {}: downlink {}; records already waiting stay as they are (a lower bound refuses only new \
                 pushes; an expiry is fixed when a record is queued)",
                n.name,
                what.join(", ")
            ));
        }
        for no in &n.outlets {
            match o.outlets.iter().find(|x| x.name == no.name) {
                None => lines.push(format!(
                    "app {}: outlet {} added ({})",
                    n.name, no.name, no.kind
                )),
                Some(oo) if !same_outlet(oo, no) => {
                    let mut what = Vec::new();
                    if oo.kind != no.kind {
                        what.push(format!("{} → {}", oo.kind, no.kind));
                    }
                    if oo.memory_bytes != no.memory_bytes {
                        what.push(format!(
                            "memory_bytes {} → {}",
                            oo.memory_bytes, no.memory_bytes
                        ));
                    }
                    if oo.max_lag_records != no.max_lag_records {
                        what.push(format!(
                            "max_lag_records {} → {}",
                            oo.max_lag_records, no.max_lag_records
                        ));
                    }
                    lines.push(format!(
                        "app {}: outlet {} changed: {}",
                        n.name,
                        no.name,
                        what.join("; ")
                    ));
                }
                Some(_) => {}
            }
        }
        for oo in o
            .outlets
            .iter()
            .filter(|x| !n.outlets.iter().any(|y| y.name == x.name))
        {
            lines.push(format!("app {}: outlet {} removed", n.name, oo.name));
            for no in n.outlets.iter().filter(|y| {
                !o.outlets.iter().any(|x| x.name == y.name) && y.kind.target() == oo.kind.target()
            }) {
                plan.warnings.push(renamed_outlet(&n.name, &oo.name, no));
            }
        }
        for no in &n.outlets {
            if let Some(oo) = o.outlets.iter().find(|x| x.name == no.name)
                && oo.from != no.from
                && oo.kind == no.kind
            {
                lines.push(format!(
                    "app {}: outlet {}: from {} → {} changes nothing: `from` is read only when an outlet is first \
                     applied, and {} keeps its position",
                    n.name, no.name, oo.from, no.from, no.name
                ));
            }
        }
        if !lines.is_empty() {
            plan.changed.push(n.name.clone());
            plan.lines.extend(lines);
        }
    }
    for o in old.apps.iter().filter(|o| new.app(&o.name).is_none()) {
        plan.needs_restart.push(o.name.clone());
        plan.lines.push(format!(
            "app {} is no longer in the file: removing or renaming an app needs a restart (its store is open and \
             its turn and outlets are in flight); it runs as before until then",
            o.name
        ));
    }
    if let ([gone], [new_name]) = (plan.needs_restart.as_slice(), plan.added.as_slice()) {
        plan.lines.push(format!(
            "if {gone} was renamed to {new_name}: the store is named after the app, so {new_name} starts empty; \
             to keep {gone}'s records under {new_name}, stop the node and, if {new_name} has taken no records, \
             delete STATE/apps/{new_name}.sqlite with its -wal and -shm files, rename {gone}.sqlite and its -wal \
             and -shm (those there) to {new_name}.sqlite, .sqlite-wal and .sqlite-shm, and start it"
        ));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "daMGbrvtfNPfdX0m7LxP65QWRxE6CrjCt7+W4FtVWgA=";
    const KEY_B: &str = "GwZpZIc4DqBOfCE63n3ep5L4oMabSAF6dyE8aM+90kI=";

    /// The block after `<!-- example: full -->` in docs/apps.md: the test fixture is the documentation.
    fn docs_example() -> &'static str {
        let doc = include_str!("../../docs/apps.md");
        let after = doc
            .split_once("<!-- example: full -->")
            .expect("docs/apps.md marks its full example")
            .1;
        let body = after
            .split_once("```toml\n")
            .expect("a toml block follows the marker")
            .1;
        body.split_once("```").expect("the block is closed").0
    }

    fn parse(text: &str) -> Result<AppsConfig, AppsError> {
        AppsConfig::parse(Path::new("/etc/pure-serve/apps.toml"), text)
    }

    fn problems(text: &str) -> Vec<Problem> {
        match parse(text) {
            Err(AppsError::Bad { problems, .. }) => problems,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    /// The one problem of `text`, rendered.
    fn one(text: &str) -> String {
        let p = problems(text);
        assert_eq!(p.len(), 1, "{p:#?}");
        p[0].render(Path::new("apps.toml"))
    }

    fn key(b: u8) -> String {
        crate::keys::encode_key(&[b; 32])
    }

    #[test]
    fn docs_example_parses() {
        let c = parse(docs_example()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.summary(), "2 apps (sensors, counter), 4 outlets");
        let s = &c.apps[0];
        assert_eq!(
            (s.name.as_str(), &s.accept, s.turn_records),
            ("sensors", &Accept::All, 16384)
        );
        assert_eq!(s.forwarders, ["edge-1"]);
        assert_eq!(s.line, Some(2));
        assert_eq!(s.downlink.expiry_ms, Some(86_400_000));
        let names: Vec<&str> = s.outlets.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["cloud", "archive", "hook", "copy"], "file order");
        let key_a = crate::keys::parse_public_key(KEY_A).unwrap();
        assert_eq!(
            s.outlets[0].kind,
            OutletKind::Link {
                to: "cloud.example.net:7380".into(),
                node_key: key_a,
                app: "ingest".into()
            }
        );
        assert_eq!(
            (s.outlets[0].memory_bytes, s.outlets[0].max_lag_records),
            (4 << 20, 0)
        );
        assert_eq!(s.outlets[0].line, Some(7));
        let OutletKind::Wire {
            url, app, ca_file, ..
        } = &s.outlets[1].kind
        else {
            panic!("{:?}", s.outlets[1]);
        };
        assert_eq!(url.to_string(), "https://cloud.example.net:7381/link");
        assert_eq!(app, "archive");
        assert_eq!(
            ca_file.as_deref(),
            Some(Path::new("/etc/pure-serve/cloud-ca.pem"))
        );
        let OutletKind::Webhook {
            url,
            headers,
            batch_records,
            ..
        } = &s.outlets[2].kind
        else {
            panic!("{:?}", s.outlets[2]);
        };
        assert_eq!(
            (url.host.as_str(), url.port, url.path_and_query.as_str()),
            ("hooks.example.com", 443, "/pure")
        );
        assert_eq!(
            headers,
            &[("Authorization".to_string(), "Bearer x".to_string())]
        );
        assert_eq!(*batch_records, 500);
        assert_eq!(
            s.outlets[3].kind,
            OutletKind::App {
                app: "counter".into()
            }
        );
        assert_eq!(c.apps[1].accept, Accept::Only(vec![]));
        // Its CA files do not exist here: `load` checks them, `parse` does not.
        assert!(
            c.warnings(&|_| true).is_empty(),
            "counter is fed by sensors.copy"
        );
    }

    #[test]
    fn defaults_and_the_single_app() {
        let d = AppsConfig::default_single();
        assert_eq!(d.apps.len(), 1);
        assert_eq!(
            (d.apps[0].name.as_str(), &d.apps[0].accept),
            ("main", &Accept::All)
        );
        assert!(d.apps[0].outlets.is_empty());
        let c = parse("[apps.main]\n").unwrap();
        assert_eq!(c.apps[0].turn_records, DEFAULT_TURN_RECORDS);
        assert_eq!(c.apps[0].accept, Accept::All);
        let c = parse(&format!(
            "[apps.a.outlets.up]\nkind = \"wire\"\nurl = \"http://[::1]\"\nnode_key = \"{KEY_A}\"\n"
        ))
        .unwrap();
        let OutletKind::Wire { url, app, .. } = &c.apps[0].outlets[0].kind else {
            panic!()
        };
        assert_eq!(
            (url.tls, url.port, url.path_and_query.as_str()),
            (false, 80, "/link")
        );
        assert_eq!(url.authority(), "[::1]:80");
        assert_eq!(app, "a", "the far app defaults to this app's name");
    }

    #[test]
    fn accept_allows() {
        assert!(Accept::All.allows("x"));
        let only = Accept::Only(vec!["hall".into(), "kitchen-1".into()]);
        assert!(only.allows("hall") && !only.allows("attic"));
        assert!(!Accept::Only(vec![]).allows("hall"));
        let c = parse("[apps.a]\naccept = [\"hall\", \"kitchen-1\"]\n").unwrap();
        assert_eq!(c.apps[0].accept, only);
    }

    #[test]
    fn problems_render_as_file_line_app_key_what_fix() {
        let err = parse("[apps.sensors]\nacept = \"all\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("apps file /etc/pure-serve/apps.toml has 1 problem\n"),
            "{err}"
        );
        assert!(
            err.contains(
                "\n  /etc/pure-serve/apps.toml:2: app sensors, key acept: unknown key `acept`; did you mean \
                 `accept`? the keys of an app are: accept, forwarders, turn_records, outlets"
            ),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_have_lines_and_all_are_listed() {
        let p = problems("[apps.a]\naccept = \"all\nturn_records = 5\n[apps.b\n");
        assert!(p.len() >= 2, "{p:#?}");
        assert!(
            p.iter().all(|p| p.what.starts_with("TOML syntax: ")),
            "{p:#?}"
        );
        assert_eq!(p[0].line, Some(2), "{p:#?}");
        assert!(p.iter().any(|p| p.line == Some(4)), "{p:#?}");
        let dup = one("[apps.a]\n[apps.b]\n\n[apps.a]\n");
        assert_eq!(
            dup,
            "apps.toml:4: table [apps.a] is given twice (first at line 1); put its keys under one [apps.a]"
        );
        let dup = one("[apps.a]\nturn_records = 5\nturn_records = 6\n");
        assert!(
            dup.starts_with("apps.toml:3: key `turn_records` is given twice in its table"),
            "{dup}"
        );
    }

    #[test]
    fn no_apps_is_a_problem() {
        for text in ["", "# nothing\n", "[apps]\n", "apps = {}\n"] {
            let p = one(text);
            assert!(
                p.contains("no apps: the file has no [apps.NAME] table"),
                "{text:?}: {p}"
            );
        }
    }

    #[test]
    fn top_level_tables_other_than_apps_are_refused() {
        let p = one("[sensors]\naccept = \"all\"\n");
        assert!(
            p.contains("apps.toml:1: key sensors: unknown top-level key `sensors`"),
            "{p}"
        );
        assert!(p.contains("did you mean [apps.sensors]?"), "{p}");
    }

    #[test]
    fn a_mistyped_apps_suggests_the_app_it_names() {
        let p = one("[app.s]\naccept = \"all\"\n");
        assert!(p.contains("unknown top-level key `app`"), "{p}");
        assert!(p.contains("did you mean [apps.s]?"), "{p}");
        assert!(!p.contains("[apps.app]"), "{p}");
    }

    #[test]
    fn names_follow_the_wire_grammar() {
        let p = one("[apps.Sensors]\n");
        assert!(
            p.contains("apps.toml:1: app Sensors: name \"Sensors\" is not 1–32 characters"),
            "{p}"
        );
        assert!(
            p.contains("[apps.sensors]"),
            "the fix suggests a valid name: {p}"
        );
        let long = "a".repeat(33);
        assert!(one(&format!("[apps.{long}]\n")).contains("is not 1–32"));
        let p = one("[apps.a.outlets.\"To Cloud\"]\nkind = \"app\"\napp = \"b\"\n[apps.b]\n");
        assert!(p.contains("outlet name \"To Cloud\""), "{p}");
        assert!(p.contains("outlets.to-cloud"), "{p}");
    }

    #[test]
    fn unknown_keys_name_the_allowed_ones() {
        let p = one(&format!(
            "[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{KEY_A}\"\nmemory_byte = 70000\n"
        ));
        assert!(
            p.contains(":5: app a, key outlets.up.memory_byte: unknown key `memory_byte`"),
            "{p}"
        );
        assert!(p.contains("did you mean `memory_bytes`?"), "{p}");
        assert!(
            p.contains("kind, memory_bytes, max_lag_records, to, node_key, app"),
            "{p}"
        );
        // A key of another kind says whose it is.
        let p = one(&format!(
            "[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{KEY_A}\"\nurl = \"http://h\"\n"
        ));
        assert!(
            p.contains("`url` is not a key of a link outlet (only of wire and webhook)"),
            "{p}"
        );
        // An outlet key on the app.
        let p = one("[apps.a]\nkind = \"link\"\n");
        assert!(
            p.contains("`kind` is a key of an outlet, not of an app"),
            "{p}"
        );
    }

    #[test]
    fn kinds_and_required_keys() {
        let p = one("[apps.a.outlets.up]\nto = \"h:1\"\n");
        assert!(
            p.contains(":1: app a, key outlets.up: has no `kind`"),
            "{p}"
        );
        let p = one("[apps.a.outlets.up]\nkind = \"lnk\"\n");
        assert!(p.contains(":2: app a, key outlets.up.kind: is \"lnk\", not a kind of outlet; did you mean \"link\"?"), "{p}");
        let cases = [
            ("link", vec!["needs `to`", "needs `node_key`"]),
            ("wire", vec!["needs `url`", "needs `node_key`"]),
            ("webhook", vec!["needs `url`"]),
            ("app", vec!["needs `app`"]),
        ];
        for (kind, wants) in cases {
            let p = problems(&format!("[apps.a.outlets.up]\nkind = \"{kind}\"\n"));
            assert_eq!(p.len(), wants.len(), "{kind}: {p:#?}");
            for (p, want) in p.iter().zip(wants) {
                assert!(p.what.contains(want), "{kind}: {p:?}");
                assert_eq!(p.line, Some(1), "at the outlet's header");
                assert!(p.fix.starts_with("add "), "{p:?}");
            }
        }
    }

    #[test]
    fn node_keys_are_checked_with_the_key_parser() {
        let link = |k: &str| {
            format!("[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{k}\"\n")
        };
        let p = one(&link("BASE64="));
        assert!(
            p.contains(":4: app a, key outlets.up.node_key: not valid base64; "),
            "{p}"
        );
        assert!(p.contains("pure-serve pubkey"), "{p}");
        let p = one(&link("AAAA"));
        assert!(p.contains("decodes to 3 bytes, a key is 32 bytes"), "{p}");
        let p = one(&link(&key(0)));
        assert!(p.contains("is all zeros"), "{p}");
    }

    #[test]
    fn to_is_host_and_port() {
        let link = |to: &str| {
            format!("[apps.a.outlets.up]\nkind = \"link\"\nto = \"{to}\"\nnode_key = \"{KEY_A}\"\n")
        };
        for good in [
            "cloud.example.net:7380",
            "192.0.2.1:1",
            "[2001:db8::1]:7380",
            "node_1.lan.:65535",
        ] {
            parse(&link(good)).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for (bad, says) in [
            ("cloud.example.net", "has no port"),
            ("cloud:0", "port 0"),
            ("cloud:99999", "not a number from 1 to 65535"),
            (":7380", "has no host"),
            ("2001:db8::1:7380", "in brackets"),
            ("[2001:db8::1:7380", "without closing"),
            ("[nothost]:1", "not an IPv6 address"),
            ("bad host:1", "neither an IP address nor a DNS name"),
            ("-x.lan:1", "neither an IP address"),
            ("999.1.1.1:1", "not a valid IPv4 address"),
        ] {
            let p = one(&link(bad));
            assert!(p.contains(":3: app a, key outlets.up.to: "), "{bad}: {p}");
            assert!(p.contains(says), "{bad}: {p}");
        }
    }

    #[test]
    fn a_bad_url_is_reported_with_its_line_and_key() {
        let p = one("[apps.a.outlets.h]\nkind = \"webhook\"\nurl = \"ftp://h/x\"\n");
        assert!(
            p.contains(":3: app a, key outlets.h.url: \"ftp://h/x\" has scheme \"ftp\""),
            "{p}"
        );
    }

    #[test]
    fn ca_file_is_for_https_and_must_be_readable() {
        let p = one(
            "[apps.a.outlets.h]\nkind = \"webhook\"\nurl = \"http://h/x\"\nca_file = \"/ca.pem\"\n",
        );
        assert!(
            p.contains(":4: app a, key outlets.h.ca_file: is for https only"),
            "{p}"
        );

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("apps.toml");
        let text = format!(
            "[apps.a.outlets.h]\nkind = \"webhook\"\nurl = \"https://h/x\"\nca_file = \"missing.pem\"\n\
             [apps.a.outlets.w]\nkind = \"wire\"\nurl = \"https://h:7381\"\nnode_key = \"{KEY_A}\"\nca_file = \"not-pem.txt\"\n\
             [apps.a.outlets.ok]\nkind = \"webhook\"\nurl = \"https://h/y\"\nca_file = \"ca.pem\"\n"
        );
        std::fs::write(&file, &text).unwrap();
        std::fs::write(dir.path().join("not-pem.txt"), "hello\n").unwrap();
        std::fs::write(
            dir.path().join("ca.pem"),
            "-----BEGIN CERTIFICATE-----\nMII=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        // parse looks at no file; load does, relative to the apps file's directory.
        let c = AppsConfig::parse(&file, &text).unwrap();
        let OutletKind::Webhook { ca_file, .. } = &c.apps[0].outlets[2].kind else {
            panic!()
        };
        assert_eq!(
            ca_file.as_deref(),
            Some(dir.path().join("ca.pem").as_path())
        );
        let err = AppsConfig::load(&file).unwrap_err();
        let lines = err.lines();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            // The line of the ca_file key, not of its outlet's table.
            lines[0].contains(":4: app a, key outlets.h.ca_file: cannot read "),
            "{lines:#?}"
        );
        assert!(lines[0].contains("missing.pem"), "{lines:#?}");
        assert!(
            lines[1].contains(":9: app a, key outlets.w.ca_file: "),
            "{lines:#?}"
        );
        assert!(lines[1].contains("holds no PEM certificate"), "{lines:#?}");
    }

    #[test]
    fn downlink_bounds_and_expiry_are_read_and_checked() {
        let c = parse(
            "[apps.a]\n[apps.a.downlink]\nmax_records = 10\nmax_bytes = 4096\nexpiry_seconds = 60\n",
        )
        .unwrap();
        assert_eq!(
            c.apps[0].downlink,
            crate::store::downlink::DownLimits {
                max_records: 10,
                max_bytes: 4096,
                expiry_ms: Some(60_000)
            }
        );
        assert_eq!(
            parse("[apps.a]\n").unwrap().apps[0].downlink,
            crate::store::downlink::DownLimits::default()
        );
        let p: String = problems("[apps.a.downlink]\nmax_records = 0\nmax_recrods = 5\n")
            .iter()
            .map(|p| p.render(Path::new("apps.toml")) + "\n")
            .collect();
        assert!(
            p.contains("key downlink.max_records: is 0, out of range"),
            "{p}"
        );
        assert!(p.contains("did you mean `max_records`?"), "{p}");
    }

    #[test]
    fn budgets_are_in_range() {
        for (text, says) in [
            (
                "[apps.a]\nturn_records = 0\n",
                ":2: app a, key turn_records: is 0, out of range; give 1 to 1048576 records (default 16384)",
            ),
            (
                "[apps.a]\nturn_records = 1048577\n",
                "is 1048577, out of range",
            ),
            (
                "[apps.a]\nturn_records = \"16k\"\n",
                "must be a whole number, not a string",
            ),
            (
                "[apps.a]\nturn_records = 1.5\n",
                "must be a whole number, not a float",
            ),
            (
                "[apps.a]\nturn_records = 99999999999999999999999999999999999999999\n",
                "too large",
            ),
            (
                "[apps.a.outlets.c]\nkind = \"app\"\napp = \"b\"\nmemory_bytes = 1000\n[apps.b]\n",
                ":4: app a, key outlets.c.memory_bytes: is 1000, out of range; give at least 65536 bytes",
            ),
            (
                "[apps.a.outlets.c]\nkind = \"app\"\napp = \"b\"\nmax_lag_records = -1\n[apps.b]\n",
                "is -1, out of range",
            ),
            (
                "[apps.a.outlets.h]\nkind = \"webhook\"\nurl = \"http://h\"\nbatch_records = 0\n",
                "is 0, out of range; give 1 to 10000 records",
            ),
            (
                "[apps.a.outlets.h]\nkind = \"webhook\"\nurl = \"http://h\"\nbatch_records = 10001\n",
                "is 10001, out of range",
            ),
        ] {
            let p = one(text);
            assert!(p.contains(says), "{text:?}: {p}");
        }
        let c = parse("[apps.a]\nturn_records = 0x10_00\n").unwrap();
        assert_eq!(c.apps[0].turn_records, 4096);
    }

    #[test]
    fn accept_lists() {
        for (text, says) in [
            (
                "[apps.a]\naccept = \"none\"\n",
                ":2: app a, key accept: is \"none\", which is not \"all\"",
            ),
            (
                "[apps.a]\naccept = \"hall\"\n",
                "for this one sender write accept = [\"hall\"]",
            ),
            (
                "[apps.a]\naccept = true\n",
                "must be \"all\" or a list of sender names, not a boolean",
            ),
            (
                "[apps.a]\naccept = [\"hall\", \"hall\"]\n",
                "lists hall twice",
            ),
            (
                "[apps.a]\naccept = [\"hall\", \"no spaces\"]\n",
                "\"no spaces\" is not a sender name",
            ),
            (
                "[apps.a]\naccept = [\"hall\", 3]\n",
                "must be a string, not an integer",
            ),
        ] {
            let p = one(text);
            assert!(p.contains(says), "{text:?}: {p}");
        }
    }

    /// `forwarders` is a list of sender names and nothing else (no "all": each forwarder is believed about origins),
    /// and each must be accepted too, or the node would refuse it before looking at its FORWARD frames.
    #[test]
    fn forwarders_lists() {
        let c = parse("[apps.a]\nforwarders = [\"edge-1\", \"edge-2\"]\n[apps.b]\n").unwrap();
        assert_eq!(c.apps[0].forwarders, ["edge-1", "edge-2"]);
        assert!(c.apps[1].forwarders.is_empty(), "none by default");
        assert!(AppsConfig::default_single().apps[0].forwarders.is_empty());
        let c = parse("[apps.a]\naccept = [\"hall\", \"edge-1\"]\nforwarders = [\"edge-1\"]\n")
            .unwrap();
        assert_eq!(c.apps[0].forwarders, ["edge-1"]);
        for (text, says) in [
            (
                "[apps.a]\nforwarders = \"all\"\n",
                ":2: app a, key forwarders: is \"all\", which forwarders does not take",
            ),
            (
                "[apps.a]\nforwarders = \"edge-1\"\n",
                "for this one sender write forwarders = [\"edge-1\"]",
            ),
            (
                "[apps.a]\nforwarders = true\n",
                "must be a list of sender names, not a boolean",
            ),
            (
                "[apps.a]\nforwarders = [\"edge-1\", \"edge-1\"]\n",
                "lists edge-1 twice",
            ),
            (
                "[apps.a]\nforwarders = [\"no spaces\"]\n",
                "\"no spaces\" is not a sender name",
            ),
            (
                "[apps.a]\naccept = [\"hall\"]\n\nforwarders = [\"edge-1\"]\n",
                ":4: app a, key forwarders: lists edge-1, which accept does not: the node refuses its frames \
                 (REFUSE reason 2) before it looks at whether they are forwarded; add \"edge-1\" to accept as well",
            ),
            (
                "[apps.a]\nforwarder = [\"edge-1\"]\n",
                "unknown key `forwarder`; did you mean `forwarders`?",
            ),
        ] {
            let p = one(text);
            assert!(p.contains(says), "{text:?}: {p}");
        }
    }

    #[test]
    fn headers_are_checked() {
        let hook = |h: &str| {
            format!("[apps.a.outlets.h]\nkind = \"webhook\"\nurl = \"https://h/\"\nheaders = {h}\n")
        };
        let c = parse(&hook("{ X-Api-Key = \"k\", Authorization = \"Bearer x\" }")).unwrap();
        let OutletKind::Webhook { headers, .. } = &c.apps[0].outlets[0].kind else {
            panic!()
        };
        let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["X-Api-Key", "Authorization"], "file order");
        for (h, says) in [
            ("{ Host = \"x\" }", "Host is set by the node itself"),
            ("{ content-length = \"1\" }", "is set by the node itself"),
            (
                "{ Idempotency-Key = \"fixed\" }",
                "Idempotency-Key is set by the node itself",
            ),
            ("{ X = \"a\\r\\nInjected: yes\" }", "control character"),
            ("{ \"Bad Name\" = \"x\" }", "is not a header name"),
            ("{ X-A = \"1\", x-a = \"2\" }", "given twice"),
            ("{ X = 1 }", "must be a string, not an integer"),
            ("\"Authorization: x\"", "must be a table, not a string"),
        ] {
            let p = one(&hook(h));
            assert!(p.contains(says), "{h}: {p}");
            assert!(p.contains(":4: app a, key outlets.h.headers"), "{h}: {p}");
        }
    }

    #[test]
    fn inner_outlets_name_another_app_of_the_file() {
        let p = one("[apps.a.outlets.c]\nkind = \"app\"\napp = \"a\"\n");
        assert!(
            p.contains(":3: app a, key outlets.c.app: names this app itself"),
            "{p}"
        );
        let p = one("[apps.a.outlets.c]\nkind = \"app\"\napp = \"countr\"\n[apps.counter]\n");
        assert!(
            p.contains("names app countr, which is not in this file; did you mean \"counter\"?"),
            "{p}"
        );
        assert!(p.contains("the apps of this file are: a, counter"), "{p}");
        let p = one(
            "[apps.a.outlets.c]\nkind = \"app\"\napp = \"b\"\n[apps.a.outlets.d]\nkind = \"app\"\napp = \"b\"\n[apps.b]\n",
        );
        assert!(
            p.contains(
                ":6: app a, key outlets.d.app: copies into app b, as outlet c of this app already does"
            ),
            "{p}"
        );
        // Two apps may both feed a third.
        parse("[apps.a.outlets.c]\nkind = \"app\"\napp = \"c\"\n[apps.b.outlets.c]\nkind = \"app\"\napp = \"c\"\n[apps.c]\n")
            .unwrap();
    }

    #[test]
    fn cycles_of_inner_outlets_are_named() {
        let text = "[apps.a.outlets.to-b]\nkind = \"app\"\napp = \"b\"\n\
                    [apps.b.outlets.to-c]\nkind = \"app\"\napp = \"c\"\n\
                    [apps.c.outlets.to-a]\nkind = \"app\"\napp = \"a\"\n\
                    [apps.d.outlets.to-e]\nkind = \"app\"\napp = \"e\"\n\
                    [apps.e.outlets.to-d]\nkind = \"app\"\napp = \"d\"\n";
        let p = problems(text);
        assert_eq!(p.len(), 2, "each cycle once: {p:#?}");
        let r: Vec<String> = p.iter().map(|p| p.render(Path::new("apps.toml"))).collect();
        assert!(r[0].contains("apps.toml:9: app c, key outlets.to-a.app: inner outlets form a cycle: a → b → c → a"), "{r:#?}");
        assert!(
            r[1].contains(
                "apps.toml:15: app e, key outlets.to-d.app: inner outlets form a cycle: d → e → d"
            ),
            "{r:#?}"
        );
        // A diamond is not a cycle.
        parse(
            "[apps.a.outlets.x]\nkind = \"app\"\napp = \"b\"\n[apps.a.outlets.y]\nkind = \"app\"\napp = \"c\"\n\
             [apps.b.outlets.x]\nkind = \"app\"\napp = \"d\"\n[apps.c.outlets.x]\nkind = \"app\"\napp = \"d\"\n[apps.d]\n",
        )
        .unwrap();
    }

    #[test]
    fn one_far_flow_per_destination() {
        let text = format!(
            "[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:7380\"\nnode_key = \"{KEY_A}\"\napp = \"ingest\"\n\
             [apps.b.outlets.up]\nkind = \"wire\"\nurl = \"https://h:7381\"\nnode_key = \"{KEY_A}\"\napp = \"ingest\"\n\
             [apps.b.outlets.other]\nkind = \"link\"\nto = \"h:7380\"\nnode_key = \"{KEY_B}\"\napp = \"ingest\"\n"
        );
        let p = one(&text);
        assert!(p.contains(":6: app b, key outlets.up: sends to app ingest on node daMGbrvt…, as outlet up of app a (line 1) already does"), "{p}");
        assert!(p.contains("one heard sequence per app and sender"), "{p}");
        // The far app defaults to this app's name, so these two differ.
        parse(&format!(
            "[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{KEY_A}\"\n\
             [apps.b.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{KEY_A}\"\n"
        ))
        .unwrap();
    }

    #[test]
    fn every_problem_at_once_in_line_order() {
        let text = format!(
            "[apps.Bad]\n\
             [apps.a]\n\
             acept = \"all\"\n\
             turn_records = 0\n\
             [apps.a.outlets.up]\n\
             kind = \"link\"\n\
             to = \"nowhere\"\n\
             node_key = \"{}\"\n\
             [apps.a.outlets.in]\n\
             kind = \"app\"\n\
             app = \"ghost\"\n\
             [apps.a.outlets.h]\n\
             kind = \"webhook\"\n",
            &KEY_A[..20]
        );
        let lines: Vec<Option<usize>> = problems(&text).iter().map(|p| p.line).collect();
        assert_eq!(
            lines,
            [
                Some(1),
                Some(3),
                Some(4),
                Some(7),
                Some(8),
                Some(11),
                Some(12)
            ]
        );
    }

    #[test]
    fn own_key_is_checked_once_known() {
        let c = parse(&format!(
            "[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{KEY_A}\"\napp = \"b\"\n[apps.b]\n"
        ))
        .unwrap();
        let own = crate::keys::parse_public_key(KEY_A).unwrap();
        let p = c.check_own_key(&own);
        assert_eq!(p.len(), 1);
        let r = p[0].render(Path::new("apps.toml"));
        assert!(
            r.contains("apps.toml:1: app a, key outlets.up.node_key: is this node's own key"),
            "{r}"
        );
        assert!(r.contains("kind = \"app\" with app = \"b\""), "{r}");
        assert!(c.check_own_key(&[9; 32]).is_empty());
    }

    #[test]
    fn warnings_for_unknown_senders_and_unfed_apps_at_the_lines_of_their_keys() {
        let c = parse(
            "[apps.a]\naccept = [\"hall\", \"attic\"]\n[apps.b]\naccept = []\n\
             [apps.c]\nforwarders = [\"hall\", \"edge-9\"]\n",
        )
        .unwrap();
        let w = c.warnings(&|n| n == "hall");
        assert_eq!(w.len(), 3, "{w:#?}");
        assert!(
            w[2].contains(
                "apps.toml:6: app c, key forwarders: sender edge-9 is not in the senders file; it cannot forward"
            ),
            "{w:#?}"
        );
        assert!(
            w[0].contains(
                "apps.toml:2: app a, key accept: sender attic is not in the senders file"
            ),
            "{w:#?}"
        );
        assert!(
            w[1].contains("apps.toml:4: app b, key accept: takes no senders and no outlet"),
            "{w:#?}"
        );
    }

    #[test]
    fn reload_plans() {
        let old = parse(&format!(
            "[apps.a]\n[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{KEY_A}\"\n\
             [apps.a.outlets.gone]\nkind = \"app\"\napp = \"b\"\n[apps.b]\n[apps.c]\n"
        ))
        .unwrap();
        assert!(plan_reload(&old, &old).is_empty());
        // The downlink bounds alone are a change, applied and said.
        let down = parse(&format!(
            "[apps.a]\n[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{KEY_A}\"\n\
             [apps.a.outlets.gone]\nkind = \"app\"\napp = \"b\"\n[apps.b]\n[apps.b.downlink]\nmax_records = 5\n\
             expiry_seconds = 60\n[apps.c]\n"
        ))
        .unwrap();
        let plan = plan_reload(&old, &down);
        assert_eq!(plan.changed, ["b"]);
        assert_eq!(plan.lines.len(), 1, "{:?}", plan.lines);
        assert!(
            plan.lines[0].starts_with(
                "app b: downlink max_records 1024 → 5, expiry_seconds none → 60 s; records already waiting"
            ),
            "{:?}",
            plan.lines
        );
        // The same settings on other lines are no change.
        let moved = parse(&format!(
            "\n\n[apps.c]\n[apps.b]\n[apps.a.outlets.gone]\nkind = \"app\"\napp = \"b\"\n\
             [apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{KEY_A}\"\n"
        ))
        .unwrap();
        assert!(
            plan_reload(&old, &moved).is_empty(),
            "{:?}",
            plan_reload(&old, &moved)
        );
        let new = parse(&format!(
            "[apps.a]\naccept = [\"hall\"]\nforwarders = [\"hall\"]\nturn_records = 100\n\
             [apps.a.outlets.up]\nkind = \"link\"\nto = \"h:2\"\nnode_key = \"{KEY_A}\"\n\
             [apps.a.outlets.new]\nkind = \"app\"\napp = \"b\"\n[apps.b]\n[apps.d]\n"
        ))
        .unwrap();
        let plan = plan_reload(&old, &new);
        assert_eq!(plan.added, ["d"]);
        assert_eq!(plan.changed, ["a"]);
        assert_eq!(plan.needs_restart, ["c"]);
        let all = plan.lines.join("\n");
        for want in [
            "app a: accept every sender → 1 sender (hall)",
            "app a: forwarders none → hall",
            "app a: turn_records 16384 → 100",
            "app a: outlet up changed: link to h:1, app a on node daMGbrvt… → link to h:2, app a on node daMGbrvt…",
            "app a: outlet new added (into app b of this host)",
            "app a: outlet gone removed",
            "app d added: accepts every sender, 0 outlets; its store is STATE/apps/d.sqlite (on a fleet's --store: \
             its rows in the database)",
            "app c is no longer in the file: removing or renaming an app needs a restart",
            "if c was renamed to d",
        ] {
            assert!(all.contains(want), "{want}\n{all}");
        }
    }

    #[test]
    fn not_utf8_is_a_problem_with_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("apps.toml");
        std::fs::write(&file, b"[apps.a]\naccept = \"\xff\"\n").unwrap();
        let err = AppsConfig::load(&file).unwrap_err().to_string();
        assert!(err.contains("apps.toml:2: is not UTF-8 text"), "{err}");
        let err = AppsConfig::load(&dir.path().join("none.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("cannot read apps file "), "{err}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any text: Ok or Err, never a panic.
        #[test]
        fn garbage_never_panics(text in "\\PC{0,400}") {
            let _ = parse(&text);
        }

        /// Text made of the file's own tokens reaches deeper than random characters do.
        #[test]
        fn token_soup_never_panics(tokens in proptest::collection::vec(proptest::sample::select(vec![
            "[", "]", "[[", "]]", "apps", ".", "outlets", "=", "\"", "\n", " ", "{", "}", ",", "kind", "\"link\"",
            "\"wire\"", "\"webhook\"", "\"app\"", "app", "to", "url", "node_key", "accept", "\"all\"", "0", "-1",
            "65536", "99999999999999999999", "\"https://h/\"", "\"h:1\"", "a", "b", "\"a\"", "\"b\"", "headers",
            "ca_file", "batch_records", "turn_records", "memory_bytes", "1.5", "true", "#", "\"\\r\\n\"", "[]",
            "\"[::1]:1\"", "\"daMGbrvtfNPfdX0m7LxP65QWRxE6CrjCt7+W4FtVWgA=\"",
        ]), 0..120)) {
            let _ = parse(&tokens.concat());
        }

        /// The documented example with bytes changed, inserted or removed.
        #[test]
        fn garbled_example_never_panics(edits in proptest::collection::vec((0usize..4000, 0u8..3, 0u8..128), 1..8)) {
            let mut bytes = docs_example().as_bytes().to_vec();
            for (at, op, b) in edits {
                let at = at % (bytes.len() + 1);
                match op {
                    0 if at < bytes.len() => bytes[at] = b,
                    1 => bytes.insert(at, b),
                    _ if at < bytes.len() => { bytes.remove(at); }
                    _ => {}
                }
            }
            if let Ok(text) = std::str::from_utf8(&bytes) {
                let _ = parse(text);
            }
        }
    }
}

//! `pure-serve check`: validate what the node would load, without serving, and list every problem at once.
//!
//! It reads the same files the node reads at start (and on a reload), through the same parsers, so "check passes"
//! means "the node will start with this" — useful before `systemctl reload`, which keeps the old list on a bad
//! file, and in a package's post-install step. Nothing is written: a missing key is reported as one the node will
//! make, not made.
//!
//! With `--apps FILE` it checks the apps file as the node would load it ([`crate::apps::config`]): every problem,
//! then the warnings that need the senders file (accept names it lacks) and the node's key (an outlet to itself).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::fds;
use crate::apps::config::{AppsConfig, DEFAULT_APP};

/// What to check, with the node's defaults already applied.
#[derive(Debug, Clone)]
pub struct CheckInput {
    pub state_dir: PathBuf,
    pub key_file: PathBuf,
    /// `None`: no senders file given and none in the state directory.
    pub senders_file: Option<PathBuf>,
    /// `None`: no `--apps`; the node hosts the one app `main`.
    pub apps_file: Option<PathBuf>,
    /// The UDP and TCP addresses the node would listen on (`None`: not checked).
    pub link_addr: Option<SocketAddr>,
    pub http_addr: Option<SocketAddr>,
    /// `--metrics-listen`.
    pub metrics_addr: Option<SocketAddr>,
    /// `--push-socket` and `--push-datagrams` as given (`None`: not given; the node's defaults apply).
    pub push_socket: Option<PathBuf>,
    pub push_datagrams: Option<PathBuf>,
}

/// The findings: facts that are fine, problems (each says what is wrong and how to fix it), and warnings (allowed,
/// but probably not meant; they do not stop the node).
#[derive(Debug, Default)]
pub struct Report {
    pub fine: Vec<String>,
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
}

fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path; access(2) only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The nearest of `path` and its ancestors that exists (`None` when none can be looked at).
fn nearest_existing(path: &Path) -> Option<std::path::PathBuf> {
    let absolute = std::path::absolute(path).ok()?;
    absolute
        .ancestors()
        .find(|p| p.symlink_metadata().is_ok())
        .map(Path::to_path_buf)
}

/// Why the store at `path` is not an SQLite database (a file of another kind, or one whose first page was
/// overwritten), or `None`: an empty file is one SQLite makes a database of.
fn not_a_database(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 16];
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(&mut head).ok()?;
    if n == 0 || head == *b"SQLite format 3\0" {
        return None;
    }
    Some(format!(
        "store {}: not an SQLite database (its first bytes are not SQLite's header); the node refuses to start \
         on it: restore it from a backup, or move it away with its -wal and -shm files to start that app with an \
         empty store",
        path.display()
    ))
}

/// Whether a pure-serve node answers HTTP on `addr` (its root page names it), within a second.
fn answers_as_a_node(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let mut to = addr;
    if to.ip().is_unspecified() {
        to.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let second = std::time::Duration::from_secs(1);
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&to, second) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(second));
    let _ = s.set_write_timeout(Some(second));
    if s.write_all(b"GET / HTTP/1.1\r\nHost: check\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = Vec::new();
    let _ = s.take(4096).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).contains("pure-serve:")
}

/// Checks the configuration.
pub fn check(input: &CheckInput) -> Report {
    let mut r = Report::default();
    let dir = &input.state_dir;
    let state = std::fs::metadata(dir);
    use std::io::ErrorKind;
    let state_unreadable = state
        .as_ref()
        .is_err_and(|e| !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory));
    // A key under a state directory that is a file (or lies under one) is that file's problem, said once.
    let state_not_dir = state
        .as_ref()
        .map_or_else(|e| e.kind() == ErrorKind::NotADirectory, |m| !m.is_dir());
    match state {
        Ok(m) if !m.is_dir() => r.problems.push(format!(
            "state directory {}: exists but is not a directory; give another with --state",
            dir.display()
        )),
        Ok(_) if !writable(dir) => r.problems.push(format!(
            "state directory {}: not writable by this user; the node stores records there (fix its owner or mode)",
            dir.display()
        )),
        Ok(_) => r.fine.push(format!("state directory {}", dir.display())),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => match nearest_existing(dir) {
            Some(up) if !up.is_dir() => r.problems.push(format!(
                "state directory {}: {} is a file, not a directory, so the node cannot make it there; give \
                 --state a directory, or move the file away",
                dir.display(),
                up.display()
            )),
            Some(up) if !writable(&up) => r.problems.push(format!(
                "state directory {}: missing, and this user may not make it in {} (not writable, or a read-only \
                 filesystem); make it and give it to the node's user (mkdir, then chown), or give --state a \
                 directory on a writable filesystem",
                dir.display(),
                up.display()
            )),
            _ => r.fine.push(format!(
                "state directory {}: missing; the node will make it",
                dir.display()
            )),
        },
        // Not "missing": a directory this user may not look into (the packaged node's /var/lib/private is root's
        // alone) would be reported as one the node makes, and its key as one the node makes too.
        Err(e) => r.problems.push(format!(
            "state directory {}: this user cannot look at it ({e}); run check as the node's user, or with sudo",
            dir.display()
        )),
    }
    // A node serving from this state holds its lock (and its ports): checking its configuration before a reload is
    // the usual case, so that is said, not a problem.
    let running = crate::store::state::StateLock::holder(dir);
    if let Some(pid) = &running {
        r.fine.push(format!(
            "state directory {}: a node (pid {pid}) is serving from it now",
            dir.display()
        ));
    }
    let mut own_key = None;
    let key_dir = input
        .key_file
        .parent()
        .filter(|d| !d.as_os_str().is_empty());
    let key_found = input.key_file.try_exists();
    if let Err(e) = &key_found {
        // Said once: a key under a state directory this user cannot look into is that directory's problem.
        if !((state_unreadable || state_not_dir) && input.key_file.starts_with(dir)) {
            r.problems.push(format!(
                "key {}: this user cannot look at it ({e}); run check as the node's user, or with sudo",
                input.key_file.display()
            ));
        }
    } else if key_found.is_ok_and(|found| found) {
        match crate::keys::read_identity(&input.key_file) {
            Ok(id) => {
                r.fine.push(format!(
                    "key {}: public key {}",
                    input.key_file.display(),
                    crate::keys::encode_key(id.public())
                ));
                own_key = Some(*id.public());
            }
            Err(e) => r.problems.push(e.to_string()),
        }
    } else if let Some(parent) = key_dir.filter(|d| *d != dir.as_path() && !d.is_dir()) {
        r.problems.push(format!(
            "key {}: its directory {} does not exist, so the node cannot make the key there; create the \
             directory, or give --key a path in one that exists",
            input.key_file.display(),
            parent.display()
        ));
    } else {
        r.fine.push(format!(
            "key {}: missing; the node will make one (mode 0600)",
            input.key_file.display()
        ));
    }
    // A store that is not a database: the node refuses to start on it.
    for app in crate::store::list_apps(dir) {
        let path = dir.join("apps").join(format!("{app}.sqlite"));
        if let Some(problem) = not_a_database(&path) {
            r.problems.push(problem);
        }
    }
    // What the node refuses at start as lost data (store/state.rs).
    if dir.is_dir() {
        let recorded = crate::store::state::Identity::read(dir);
        match recorded {
            Ok(recorded) => {
                let stores = crate::store::list_apps(dir);
                let apps: Vec<String> = match &input.apps_file {
                    Some(path) => AppsConfig::load(path)
                        .map(|a| a.apps.iter().map(|x| x.name.clone()).collect())
                        .unwrap_or_default(),
                    None => vec![DEFAULT_APP.to_string()],
                };
                let lost = crate::store::state::judge(&crate::store::state::Found {
                    dir,
                    identity: recorded.as_ref(),
                    key_file: &input.key_file,
                    key: own_key,
                    stores: &stores,
                    apps: &apps,
                });
                for p in lost {
                    r.problems.push(format!(
                        "{p}; the node refuses to start on this unless given {}",
                        crate::store::state::ACCEPT_FLAG
                    ));
                }
            }
            Err(e) => r.problems.push(e.to_string()),
        }
    }
    // A node serving from another state directory (the operator's usual `check --senders FILE` before a reload,
    // with the node under systemd) holds the ports too: its HTTP port says so.
    let node_on_http = input.http_addr.is_some_and(answers_as_a_node)
        || input.metrics_addr.is_some_and(answers_as_a_node);
    for (addr, udp, flag, addr_flag) in [
        (input.link_addr, true, "--link-port", "--bind"),
        (input.http_addr, false, "--http-port", "--bind"),
        (
            input.metrics_addr,
            false,
            "--metrics-listen",
            "--metrics-listen",
        ),
    ] {
        let Some(addr) = addr else { continue };
        let proto = if udp { "UDP" } else { "TCP" };
        let bound = if udp {
            crate::common::listen::udp_socket(addr).map(drop)
        } else {
            crate::common::listen::tcp_listener(addr).map(drop)
        };
        match bound {
            Ok(()) => r.fine.push(format!("{proto} {addr}: free to listen on")),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && running.is_some() => {
                r.warnings.push(format!(
                    "{proto} {addr}: in use, presumably by the node serving from this state"
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && node_on_http => {
                r.warnings.push(format!(
                    "{proto} {addr}: in use by a running pure-serve (its HTTP port answers); fine if it is the \
                     node this configuration is for, else choose another with {flag}"
                ))
            }
            Err(e) => r.problems.push(format!(
                "{proto} {addr}: {}",
                super::bind_problem(&e, addr, flag, addr_flag)
            )),
        }
    }
    // Sender names, for the apps file's accept lists: `None` when the senders file is bad (already a problem).
    let mut sender_names: Option<HashSet<String>> = Some(HashSet::new());
    match &input.senders_file {
        Some(path) => match crate::senders::load(path) {
            Ok(list) => {
                if list.is_empty() {
                    r.warnings.push(format!(
                        "senders {}: lists no senders, so nobody can send; add `NAME PUBLIC_KEY` lines",
                        path.display()
                    ));
                } else {
                    r.fine.push(format!(
                        "senders {}: {} sender{}",
                        path.display(),
                        list.len(),
                        if list.len() == 1 { "" } else { "s" }
                    ));
                }
                if input.apps_file.is_some() {
                    sender_names = Some(
                        (0..list.len() as u32)
                            .map(|i| list.name(i).to_string())
                            .collect(),
                    );
                }
            }
            Err(e) => {
                r.problems.push(e.to_string());
                sender_names = None;
            }
        },
        None => r.fine.push(format!(
            "senders: no file given and no {} — nobody can send until there is one",
            dir.join("senders").display()
        )),
    }
    match &input.apps_file {
        Some(path) => match AppsConfig::load(path) {
            Ok(apps) => {
                descriptors(&mut r, &apps);
                let own = own_key.map(|k| apps.check_own_key(&k)).unwrap_or_default();
                if own.is_empty() {
                    r.fine
                        .push(format!("apps {}: {}", path.display(), apps.summary()));
                    r.fine.push(format!(
                        "apps {}: {}",
                        path.display(),
                        apps.forwarding_summary()
                    ));
                }
                r.problems.extend(own.iter().map(|p| p.render(path)));
                if let Some(names) = &sender_names {
                    r.warnings.extend(apps.warnings(&|n| names.contains(n)));
                }
                r.warnings.extend(renamed_outlets(dir, &apps));
            }
            Err(e) => r.problems.extend(e.lines()),
        },
        None => {
            r.fine.push(format!(
                "apps: no --apps file; the node hosts the one app `{DEFAULT_APP}`, which accepts every sender and \
                 lets none forward to it: outlets of other nodes sending here are refused (REFUSE reason 3) until an \
                 apps file lists them in `forwarders` (docs/apps.md)"
            ));
            descriptors(&mut r, &AppsConfig::default_single());
        }
    }
    push_sockets(&mut r, input);
    r
}

/// The push sockets' paths, as the node will make them: problems it would refuse at its start (a path too long for
/// a Unix socket, named against the flag that made it; a directory not there; one path for both).
fn push_sockets(r: &mut Report, input: &CheckInput) {
    let (stream, datagrams) = crate::common::push::socket_paths(
        input.push_socket.as_deref(),
        input.push_datagrams.as_deref(),
        &input.state_dir,
    );
    let problems = crate::common::push::path_problems(
        stream.as_deref(),
        datagrams.as_deref(),
        input.push_datagrams.is_some(),
        Some(&input.state_dir),
    );
    if !problems.is_empty() {
        r.problems.extend(problems.iter().map(ToString::to_string));
        return;
    }
    let shown = |p: &Option<PathBuf>| {
        p.as_ref()
            .map_or("none".to_string(), |p| p.display().to_string())
    };
    r.fine.push(format!(
        "push sockets: {} and {} (datagrams)",
        shown(&stream),
        shown(&datagrams)
    ));
}

/// Outlets the file renames, as far as the state tells: an outlet the app's store knows (it was applied) that the
/// file no longer has, while the file has a new one of the same kind and target (docs/apps.md, "Reload").
fn renamed_outlets(dir: &Path, apps: &AppsConfig) -> Vec<String> {
    let mut out = Vec::new();
    for app in &apps.apps {
        let Ok(store) = crate::store::open_app_for_reading(dir, &app.name) else {
            continue;
        };
        let Ok((known, _)) = store.outlet_starts() else {
            continue;
        };
        for old in known.iter().filter(|k| {
            !k.name.starts_with(crate::store::FAR_FLOW_KEPT)
                && !app.outlets.iter().any(|o| o.name == k.name)
        }) {
            for new in app.outlets.iter().filter(|o| {
                let (kind, target) = o.kind.target();
                !known.iter().any(|k| k.name == o.name) && kind == old.kind && target == old.target
            }) {
                out.push(crate::apps::config::renamed_outlet(
                    &app.name, &old.name, new,
                ));
            }
        }
    }
    out
}

/// Whether the node, started from here, may open the descriptors the configuration needs: it raises its soft
/// limit to the hard one, so the hard limit is what counts.
fn descriptors(r: &mut Report, apps: &AppsConfig) {
    let need = fds::Need::of(apps);
    match fds::limits() {
        Ok(l) => match fds::enough(&need, l.hard) {
            Ok(()) => r.fine.push(format!(
                "file descriptors: the configuration needs about {}; a node started from here may open {} (it \
                 raises its soft limit to the hard one; under systemd, the unit's LimitNOFILE= sets it)",
                need.total(),
                l.hard
            )),
            Err(e) => r.problems.push(e.to_string()),
        },
        Err(e) => r.warnings.push(fds::FdError::Limit(e).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_every_problem() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("node.key");
        std::fs::write(&key, "not a key\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let senders = dir.path().join("senders");
        std::fs::write(&senders, "alpha\nbeta also wrong\n").unwrap();
        let r = check(&CheckInput {
            state_dir: dir.path().to_path_buf(),
            key_file: key,
            senders_file: Some(senders),
            apps_file: None,
            link_addr: None,
            http_addr: None,
            metrics_addr: None,
            push_socket: None,
            push_datagrams: None,
        });
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(r.problems[0].contains("node.key"), "{:?}", r.problems);
        assert!(r.problems[1].contains("senders:1:"), "{:?}", r.problems);
        assert!(r.problems[1].contains("senders:2:"), "{:?}", r.problems);
    }

    #[test]
    fn a_low_order_sender_key_is_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let senders = dir.path().join("senders");
        let mut order8 = [0u8; 32];
        order8.copy_from_slice(&[
            0x5f, 0x9c, 0x95, 0xbc, 0xa3, 0x50, 0x8c, 0x24, 0xb1, 0xd0, 0xb1, 0x55, 0x9c, 0x83,
            0xef, 0x5b, 0x04, 0x44, 0x5c, 0xc4, 0x58, 0x1c, 0x8e, 0x86, 0xd8, 0x22, 0x4e, 0xdd,
            0xd0, 0x9f, 0x11, 0x57,
        ]);
        std::fs::write(
            &senders,
            format!("small {}\n", crate::keys::encode_key(&order8)),
        )
        .unwrap();
        let r = check(&CheckInput {
            state_dir: dir.path().to_path_buf(),
            key_file: dir.path().join("node.key"),
            senders_file: Some(senders),
            apps_file: None,
            link_addr: None,
            http_addr: None,
            metrics_addr: None,
            push_socket: None,
            push_datagrams: None,
        });
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        assert!(
            r.problems[0].contains("senders:1: public key of small is a low-order point"),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn a_fresh_machine_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let r = check(&CheckInput {
            key_file: state.join("node.key"),
            state_dir: state,
            senders_file: None,
            apps_file: None,
            link_addr: None,
            http_addr: None,
            metrics_addr: None,
            push_socket: None,
            push_datagrams: None,
        });
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.fine.len(), 6);
        assert!(r.fine[5].starts_with("push sockets: "), "{:?}", r.fine);
        assert!(r.fine[3].contains("one app `main`"), "{:?}", r.fine);
        assert!(
            r.fine[4].starts_with("file descriptors: the configuration needs about"),
            "{:?}",
            r.fine
        );
    }

    #[test]
    fn apps_file_problems_each_with_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let apps = dir.path().join("apps.toml");
        std::fs::write(
            &apps,
            "[apps.a]\naccept = \"none\"\n[apps.a.outlets.x]\nkind = \"app\"\napp = \"ghost\"\n",
        )
        .unwrap();
        let r = check(&CheckInput {
            state_dir: dir.path().to_path_buf(),
            key_file: dir.path().join("node.key"),
            senders_file: None,
            apps_file: Some(apps.clone()),
            link_addr: None,
            http_addr: None,
            metrics_addr: None,
            push_socket: None,
            push_datagrams: None,
        });
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(
            r.problems[0].contains("apps.toml:2: app a, key accept:"),
            "{:?}",
            r.problems
        );
        assert!(
            r.problems[1].contains("apps.toml:5: app a, key outlets.x.app:"),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn apps_file_summary_warnings_and_own_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("node.key");
        let (id, _) = crate::keys::load_or_create_identity(&key).unwrap();
        let senders = dir.path().join("senders");
        std::fs::write(
            &senders,
            format!("hall {}\n", crate::keys::encode_key(&[7; 32])),
        )
        .unwrap();
        let apps = dir.path().join("apps.toml");
        std::fs::write(
            &apps,
            "[apps.a]\naccept = [\"hall\", \"attic\"]\n[apps.b]\n",
        )
        .unwrap();
        let input = CheckInput {
            state_dir: dir.path().to_path_buf(),
            key_file: key,
            senders_file: Some(senders),
            apps_file: Some(apps.clone()),
            link_addr: None,
            http_addr: None,
            metrics_addr: None,
            push_socket: None,
            push_datagrams: None,
        };
        let r = check(&input);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert!(
            r.fine
                .iter()
                .any(|f| f.ends_with("apps.toml: 2 apps (a, b), 0 outlets")),
            "{:?}",
            r.fine
        );
        assert!(
            r.fine.iter().any(|f| f.ends_with(
                "apps.toml: no app takes forwarded records (no `forwarders`): outlets of \
                                      other nodes sending here are refused (REFUSE reason 3)"
            )),
            "{:?}",
            r.fine
        );
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains("sender attic is not in the senders file"),
            "{:?}",
            r.warnings
        );
        // Forwarders: said in a line of their own, and a name the senders file lacks is warned of like accept's.
        std::fs::write(&apps, "[apps.a]\nforwarders = [\"hall\", \"edge-9\"]\n").unwrap();
        let r = check(&input);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert!(
            r.fine.iter().any(|f| f.ends_with(
                "apps.toml: forwarded records are taken by app a from hall, edge-9; other senders' are refused \
                 (REFUSE reason 3)"
            )),
            "{:?}",
            r.fine
        );
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains("key forwarders: sender edge-9 is not in the senders file"),
            "{:?}",
            r.warnings
        );
        let own = crate::keys::encode_key(id.public());
        std::fs::write(
            &apps,
            format!("[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{own}\"\n"),
        )
        .unwrap();
        let r = check(&input);
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        assert!(
            r.problems[0].contains("is this node's own key"),
            "{:?}",
            r.problems
        );
    }
}

//! `pure-serve check`: validate what the node would load, without serving, and list every problem at once.
//!
//! It reads the same files the node reads at start (and on a reload), through the same parsers, so "check passes"
//! means "the node will start with this" — useful before `systemctl reload`, which keeps the old list on a bad
//! file, and in a package's post-install step. Nothing is written: a missing key is reported as one the node will
//! make, not made.

use std::path::{Path, PathBuf};

/// What to check, with the node's defaults already applied.
#[derive(Debug, Clone)]
pub struct CheckInput {
    pub state_dir: PathBuf,
    pub key_file: PathBuf,
    /// `None`: no senders file given and none in the state directory.
    pub senders_file: Option<PathBuf>,
}

/// The findings: facts that are fine, and problems (each says what is wrong and how to fix it).
#[derive(Debug, Default)]
pub struct Report {
    pub fine: Vec<String>,
    pub problems: Vec<String>,
}

fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path; access(2) only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// Checks the configuration.
pub fn check(input: &CheckInput) -> Report {
    let mut r = Report::default();
    let dir = &input.state_dir;
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => r.problems.push(format!(
            "state directory {}: exists but is not a directory; give another with --state",
            dir.display()
        )),
        Ok(_) if !writable(dir) => r.problems.push(format!(
            "state directory {}: not writable by this user; the node stores records there (fix its owner or mode)",
            dir.display()
        )),
        Ok(_) => r.fine.push(format!("state directory {}", dir.display())),
        Err(_) => r.fine.push(format!(
            "state directory {}: missing; the node will make it",
            dir.display()
        )),
    }
    if input.key_file.exists() {
        match crate::keys::read_identity(&input.key_file) {
            Ok(id) => r.fine.push(format!(
                "key {}: public key {}",
                input.key_file.display(),
                crate::keys::encode_key(id.public())
            )),
            Err(e) => r.problems.push(e.to_string()),
        }
    } else {
        r.fine.push(format!(
            "key {}: missing; the node will make one (mode 0600)",
            input.key_file.display()
        ));
    }
    match &input.senders_file {
        Some(path) => match crate::senders::load(path) {
            Ok(list) => r.fine.push(format!(
                "senders {}: {} sender{}",
                path.display(),
                list.len(),
                if list.len() == 1 { "" } else { "s" }
            )),
            Err(e) => r.problems.push(e.to_string()),
        },
        None => r.fine.push(format!(
            "senders: no file given and no {} — nobody can send until there is one",
            dir.join("senders").display()
        )),
    }
    r
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
        });
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.fine.len(), 3);
    }
}

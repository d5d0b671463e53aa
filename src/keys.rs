//! Key files and the base64 key text (WireGuard's convention: base64 of the 32 raw bytes, one line).
//!
//! A private key file must not be readable by anyone but its owner; like ssh, the node refuses one that is,
//! because a leaked node key exposes every sender's traffic (docs/protocol.md 9).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use thiserror::Error;

use crate::files::{self, FileError};
use crate::proto::crypto::{Identity, PublicKeyBytes};

#[derive(Debug, Error)]
pub enum KeyError {
    #[error("not valid base64")]
    Base64,
    #[error("{0}")]
    Base64Shape(&'static str),
    #[error("decodes to {0} bytes, a key is 32 bytes")]
    Length(usize),
    /// Not a regular file, too big, or unreadable (crate::files).
    #[error(transparent)]
    File(#[from] FileError),
    #[error("key file {path}: {what}")]
    Content { path: PathBuf, what: String },
    #[error(
        "key file {path} is readable by others (mode {mode:o}); a private key must be private: run `chmod 600 {path}`"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error(
        "cannot write key file {path}: {source}{}",
        crate::files::write_fix(source)
    )]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "key file {path} already exists; refusing to overwrite a key (remove it first if you mean to)"
    )]
    Exists { path: PathBuf },
}

pub fn encode_key(key: &[u8; 32]) -> String {
    STANDARD.encode(key)
}

/// What is wrong with text that is not a key in standard base64, when it is a near miss: URL-safe base64 (`-`
/// and `_`), or standard base64 without its `=` padding. `None`: not base64 of 32 bytes in any usual shape.
pub fn base64_shape_problem(text: &str) -> Option<&'static str> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let len = |r: Result<Vec<u8>, _>| r.ok().map(|b| b.len());
    if len(URL_SAFE.decode(text)) == Some(32) || len(URL_SAFE_NO_PAD.decode(text)) == Some(32) {
        return Some(
            "is URL-safe base64 (with - or _); a key is standard base64: 44 characters of A-Z a-z 0-9 + /, ending in =",
        );
    }
    if len(STANDARD_NO_PAD.decode(text)) == Some(32) {
        return Some("lacks its = padding; a key is 44 characters of standard base64, ending in =");
    }
    None
}

pub fn decode_key(text: &str) -> Result<[u8; 32], KeyError> {
    let text = text.trim();
    let bytes = STANDARD
        .decode(text)
        .map_err(|_| base64_shape_problem(text).map_or(KeyError::Base64, KeyError::Base64Shape))?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| KeyError::Length(bytes.len()))
}

/// Reads a private key file, refusing one that group or others can read, and anything that is not a key file
/// (crate::files).
pub fn read_identity(path: &Path) -> Result<Identity, KeyError> {
    let file = files::open(path, &files::KEY)?;
    let mode = file.metadata().permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    let bytes = file.read_all()?;
    let content = |what: String| KeyError::Content {
        path: path.to_path_buf(),
        what: format!(
            "{what}; expected one line of base64 (make one with `pure-serve keygen --out FILE`)"
        ),
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| content("is not text".into()))?;
    let bytes = decode_key(text).map_err(|e| content(e.to_string()))?;
    Ok(Identity::from_secret_bytes(bytes))
}

/// The text of a private key file: one line, base64 of the 32 secret bytes ([`read_identity`] reads it).
pub fn private_key_text(identity: &Identity) -> String {
    format!("{}\n", encode_key(&identity.secret_bytes()))
}

/// Makes a new file of private bytes at `path`, mode 0600, and writes `bytes` to it; never overwrites (the error
/// is then `AlreadyExists`). Synced only if `sync`: `keygen --many` writes thousands and syncs the file system once.
/// On an error no file is left: one made but not written whole is removed again (it was made here, `O_EXCL`).
pub fn create_private_file(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| if sync { file.sync_all() } else { Ok(()) });
    if written.is_err() {
        drop(file);
        let _ = std::fs::remove_file(path);
    }
    written
}

/// Writes a new private key file with mode 0600; never overwrites.
pub fn write_new_identity(path: &Path, identity: &Identity) -> Result<(), KeyError> {
    create_private_file(path, private_key_text(identity).as_bytes(), true).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            KeyError::Exists {
                path: path.to_path_buf(),
            }
        } else {
            KeyError::Write {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// Reads the key at `path`, or makes one there if there is none. Returns whether it was made.
pub fn load_or_create_identity(path: &Path) -> Result<(Identity, bool), KeyError> {
    if path.exists() {
        return Ok((read_identity(path)?, false));
    }
    let identity = Identity::generate();
    write_new_identity(path, &identity)?;
    Ok((identity, true))
}

/// Parses a public key given on a command line.
pub fn parse_public_key(text: &str) -> Result<PublicKeyBytes, KeyError> {
    decode_key(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn key_files_are_private_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let (id, made) = load_or_create_identity(&path).unwrap();
        assert!(made);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let (again, made) = load_or_create_identity(&path).unwrap();
        assert!(!made);
        assert_eq!(again.public(), id.public());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_identity(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        assert!(matches!(
            write_new_identity(&path, &id),
            Err(KeyError::Exists { .. })
        ));
    }

    #[test]
    fn a_directory_is_not_told_to_chmod() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_identity(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("is a directory, not a regular file: point --key at a regular file"),
            "{err}"
        );
        assert!(!err.contains("chmod"), "{err}");
    }

    #[test]
    fn near_miss_base64_says_what_was_expected() {
        let mut key = [0u8; 32];
        key[0] = 0xfb; // encodes to a leading + in standard base64, - in URL-safe
        key[1] = 0xff;
        let url = base64::engine::general_purpose::URL_SAFE.encode(key);
        assert!(url.contains('-') || url.contains('_'), "{url}");
        let err = decode_key(&url).unwrap_err().to_string();
        assert!(err.contains("URL-safe"), "{err}");
        let unpadded = encode_key(&key).trim_end_matches('=').to_string();
        let err = decode_key(&unpadded).unwrap_err().to_string();
        assert!(err.contains("lacks its = padding"), "{err}");
        assert_eq!(decode_key(&encode_key(&key)).unwrap(), key);
    }

    #[test]
    fn bad_key_text_says_why() {
        assert!(matches!(decode_key("%%%"), Err(KeyError::Base64)));
        assert!(matches!(
            decode_key(&encode_key(&[0; 32])[..20]),
            Err(KeyError::Base64) | Err(KeyError::Length(_))
        ));
    }
}

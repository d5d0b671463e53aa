//! `pure-serve keygen --many`: key pairs for many devices at once (issue 35), and the senders-file lines that let
//! a node accept them.
//!
//! For each device `NAME` (`PREFIX` then its number) it writes, in the output directory, three files of its private
//! key, each mode 0600 and never over an existing file:
//! - `NAME.key`: the key file `keygen --out` writes (one line of base64), for `pure-serve send --key`;
//! - `NAME.bin`: the 32 raw bytes of the private key, what a firmware flashes;
//! - `NAME.h`: a C header with `static const uint8_t pure_device_key[32]`, the public key in a comment;
//!
//! and for all of them one senders-file fragment, `senders.fragment` (`NAME PUBLIC_KEY_BASE64` a line, the senders
//! file's own format), made whole under another name and linked into place only after every key file is on disk,
//! so a fragment never names a device whose key was lost.
//!
//! Keys are made on every core, and the files are not synced one by one (an fsync is ~190 µs here, 300,000 of them
//! a minute) but the file system once, before the fragment is written. A run that fails removes the files it made
//! (it made them with `O_EXCL`, so they are its own) and writes no fragment.

use std::fmt::Write as _;
use std::fs::{DirBuilder, File};
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use thiserror::Error;

use crate::keys::{create_private_file, encode_key, private_key_text};
use crate::proto::crypto::{Identity, PublicKeyBytes};
use crate::senders::name_problem;

/// Most devices one run makes: their public keys are held until the fragment is written (32 B each), and a run of
/// a million takes seconds. For more, run again with `--start` after the last number made.
pub const MAX_DEVICES: u64 = 1_000_000;

/// File name of the senders-file fragment in the output directory.
pub const FRAGMENT_FILE: &str = "senders.fragment";

/// Devices a worker takes at a time (one `getrandom` call for their secrets).
const CHUNK: u64 = 256;

/// How often the progress callback is called while devices are being made.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What to make: devices `PREFIX{start}` … `PREFIX{start + count - 1}` in `out_dir`.
#[derive(Debug, Clone)]
pub struct Plan {
    pub out_dir: PathBuf,
    pub prefix: String,
    pub start: u64,
    pub count: u64,
    /// The numbers are padded with zeros to this many digits (0: not padded).
    pub digits: usize,
}

impl Plan {
    /// The name of the device `offset` places after the first.
    pub fn name(&self, offset: u64) -> String {
        format!(
            "{}{:0digits$}",
            self.prefix,
            self.start + offset,
            digits = self.digits
        )
    }

    /// The three files of device `name`: its key file, raw key and C header.
    pub fn files(&self, name: &str) -> [PathBuf; 3] {
        DeviceFile::ALL.map(|f| self.out_dir.join(format!("{name}.{}", f.extension())))
    }

    pub fn fragment(&self) -> PathBuf {
        self.out_dir.join(FRAGMENT_FILE)
    }

    /// Checks the count and the names before anything is written.
    fn check(&self) -> Result<(), ProvisionError> {
        if self.count == 0 || self.count > MAX_DEVICES {
            return Err(ProvisionError::Count { count: self.count });
        }
        if self.start.checked_add(self.count - 1).is_none() {
            return Err(ProvisionError::Overflow {
                start: self.start,
                count: self.count,
            });
        }
        // Names differ only in their digits, so the first and the longest (the last) stand for all.
        for offset in [0, self.count - 1] {
            if let Some(what) = name_problem(&self.name(offset)) {
                return Err(ProvisionError::Name { what });
            }
        }
        Ok(())
    }
}

/// The files of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceFile {
    /// `NAME.key`: base64, one line, as `keygen --out`.
    Key,
    /// `NAME.bin`: the 32 raw bytes.
    Raw,
    /// `NAME.h`: a C header.
    Header,
}

impl DeviceFile {
    pub const ALL: [DeviceFile; 3] = [DeviceFile::Key, DeviceFile::Raw, DeviceFile::Header];

    pub fn extension(self) -> &'static str {
        match self {
            DeviceFile::Key => "key",
            DeviceFile::Raw => "bin",
            DeviceFile::Header => "h",
        }
    }
}

/// What a run made.
#[derive(Debug)]
pub struct Made {
    pub count: u64,
    pub first: String,
    pub last: String,
    pub fragment: PathBuf,
}

#[derive(Debug, Error)]
pub enum ProvisionError {
    #[error(
        "--many {count}: a run makes 1 to {MAX_DEVICES} devices (for more, run again with --start after the last \
         number made)"
    )]
    Count { count: u64 },
    #[error(
        "--start {start} with --many {count} goes past the largest number, {}",
        u64::MAX
    )]
    Overflow { start: u64, count: u64 },
    #[error(
        "device {what}: device names are --name-prefix then the number, so give a prefix of letters, digits and \
         . _ : @ - short enough for the numbers"
    )]
    Name { what: String },
    #[error(
        "{path} already exists; refusing to overwrite a device's key (this run made no files): give another \
         --out-dir, or a --start past the numbers made before, or another --name-prefix; remove the old files \
         first only if you mean to replace those devices' keys"
    )]
    KeyExists { path: PathBuf },
    #[error(
        "{path} already exists (the senders lines of an earlier run); refusing to overwrite it (this run made no \
         files): give another --out-dir, or move it away once it is in the node's senders file, and run again"
    )]
    FragmentExists { path: PathBuf },
    #[error("cannot make the directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path} (this run's files were removed again): {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot sync {path} to disk (this run's files were removed again): {source}")]
    Sync {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the operating system's random generator failed: {0}")]
    Random(String),
}

/// Makes the devices of `plan` on `workers` threads (at least one); calls `progress(made, total)` every
/// [`PROGRESS_EVERY`] while they are being made.
pub fn provision(
    plan: &Plan,
    workers: usize,
    mut progress: impl FnMut(u64, u64),
) -> Result<Made, ProvisionError> {
    plan.check()?;
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&plan.out_dir)
        .map_err(|source| ProvisionError::Dir {
            path: plan.out_dir.clone(),
            source,
        })?;
    let fragment = plan.fragment();
    if fragment.symlink_metadata().is_ok() {
        return Err(ProvisionError::FragmentExists { path: fragment });
    }

    let shared = Shared {
        plan,
        next: AtomicU64::new(0),
        made: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    };
    let workers = workers.clamp(1, plan.count.div_ceil(CHUNK) as usize);
    let mut results = Vec::with_capacity(workers);
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        for _ in 0..workers {
            let tx = tx.clone();
            let shared = &shared;
            s.spawn(move || {
                let _ = tx.send(shared.work());
            });
        }
        drop(tx);
        while results.len() < workers {
            match rx.recv_timeout(PROGRESS_EVERY) {
                Ok(r) => results.push(r),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    progress(shared.made.load(Ordering::Relaxed), plan.count)
                }
                // A worker that ended without a word cannot be (each sends before it ends); stop waiting.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    });

    let mut chunks = Vec::new();
    let mut partial = Vec::new();
    let mut error = None;
    for r in results {
        chunks.extend(r.chunks);
        partial.extend(r.partial);
        error = error.or(r.error);
    }
    let missing = chunks.iter().map(|(_, k)| k.len() as u64).sum::<u64>() != plan.count;
    let error = match error {
        Some(e) => Some(e),
        None if missing => Some(ProvisionError::Random(
            "a worker thread ended early".to_string(),
        )),
        None => sync_dir(&plan.out_dir).err(),
    };
    if let Some(e) = error {
        remove_made(plan, &chunks, &partial);
        return Err(e);
    }

    chunks.sort_unstable_by_key(|(offset, _)| *offset);
    let mut text =
        String::with_capacity(plan.count as usize * (plan.name(plan.count - 1).len() + 46) + 200);
    let (first, last) = (plan.name(0), plan.name(plan.count - 1));
    let _ = writeln!(
        text,
        "# {first} … {last}: {} devices made by `pure-serve keygen --many`; their private keys are in {}",
        plan.count,
        plan.out_dir.display()
    );
    for (offset, keys) in &chunks {
        for (i, key) in keys.iter().enumerate() {
            let _ = writeln!(text, "{} {}", plan.name(offset + i as u64), encode_key(key));
        }
    }
    if let Err(e) = write_fragment(&plan.out_dir, &fragment, text.as_bytes()) {
        remove_made(plan, &chunks, &partial);
        return Err(e);
    }
    Ok(Made {
        count: plan.count,
        first,
        last,
        fragment,
    })
}

/// Builds the text of `NAME.h`.
pub fn c_header(name: &str, identity: &Identity) -> String {
    let secret = identity.secret_bytes();
    let mut text = format!(
        "/* pure-serve device {name}: its PRIVATE key, for the firmware to embed. Keep it as secret as {name}.key.\n \
         * Made by `pure-serve keygen --many`. The node's senders file lists the device as (public key, base64,\n \
         * the same whatever node it sends to):\n \
         *   {name} {}\n \
         */\n\
         #ifndef PURE_DEVICE_KEY_H\n\
         #define PURE_DEVICE_KEY_H\n\
         \n\
         #include <stdint.h>\n\
         \n\
         static const uint8_t pure_device_key[32] = {{\n",
        encode_key(identity.public())
    );
    for row in secret.chunks(8) {
        text.push_str("   ");
        for b in row {
            let _ = write!(text, " 0x{b:02x},");
        }
        text.push('\n');
    }
    text.push_str("};\n\n#endif /* PURE_DEVICE_KEY_H */\n");
    text
}

struct Shared<'a> {
    plan: &'a Plan,
    next: AtomicU64,
    made: AtomicU64,
    stop: AtomicBool,
}

/// What one worker made: the public keys of each chunk it took, by the chunk's first offset (a chunk cut short by
/// an error holds the devices made whole before it), the files of a device it made in part, and its error.
struct WorkerResult {
    chunks: Vec<(u64, Vec<PublicKeyBytes>)>,
    partial: Vec<PathBuf>,
    error: Option<ProvisionError>,
}

impl Shared<'_> {
    fn work(&self) -> WorkerResult {
        let mut out = WorkerResult {
            chunks: Vec::new(),
            partial: Vec::new(),
            error: None,
        };
        let mut secrets = vec![0u8; CHUNK as usize * 32];
        while !self.stop.load(Ordering::Relaxed) {
            let from = self.next.fetch_add(CHUNK, Ordering::Relaxed);
            if from >= self.plan.count {
                break;
            }
            let n = CHUNK.min(self.plan.count - from);
            let secrets = &mut secrets[..n as usize * 32];
            if let Err(e) = getrandom::fill(secrets) {
                out.error = Some(ProvisionError::Random(e.to_string()));
                self.stop.store(true, Ordering::Relaxed);
                break;
            }
            let mut keys = Vec::with_capacity(n as usize);
            for (i, secret) in secrets.as_chunks::<32>().0.iter().enumerate() {
                let identity = Identity::from_secret_bytes(*secret);
                let name = self.plan.name(from + i as u64);
                if let Err(e) = self.make_device(&name, &identity, &mut out.partial) {
                    out.error = Some(e);
                    self.stop.store(true, Ordering::Relaxed);
                    break;
                }
                out.partial.clear();
                keys.push(*identity.public());
                self.made.fetch_add(1, Ordering::Relaxed);
            }
            secrets.fill(0);
            out.chunks.push((from, keys));
            if out.error.is_some() {
                break;
            }
        }
        out
    }

    /// Writes the three files of one device; `created` gets each as it is made.
    fn make_device(
        &self,
        name: &str,
        identity: &Identity,
        created: &mut Vec<PathBuf>,
    ) -> Result<(), ProvisionError> {
        let secret = identity.secret_bytes();
        for (kind, path) in DeviceFile::ALL.into_iter().zip(self.plan.files(name)) {
            let bytes = match kind {
                DeviceFile::Key => private_key_text(identity).into_bytes(),
                DeviceFile::Raw => secret.to_vec(),
                DeviceFile::Header => c_header(name, identity).into_bytes(),
            };
            match create_private_file(&path, &bytes, false) {
                Ok(()) => created.push(path),
                Err(source) if source.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(ProvisionError::KeyExists { path });
                }
                Err(source) => return Err(ProvisionError::Write { path, source }),
            }
        }
        Ok(())
    }
}

/// Removes every file this run made: the devices made whole, and the files of one made in part.
fn remove_made(plan: &Plan, chunks: &[(u64, Vec<PublicKeyBytes>)], partial: &[PathBuf]) {
    for (from, keys) in chunks {
        for i in 0..keys.len() as u64 {
            for path in plan.files(&plan.name(from + i)) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
    for path in partial {
        let _ = std::fs::remove_file(path);
    }
}

/// Syncs the file system that holds `dir` (syncfs(2)): every key file written, in one call.
fn sync_dir(dir: &Path) -> Result<(), ProvisionError> {
    let err = |source| ProvisionError::Sync {
        path: dir.to_path_buf(),
        source,
    };
    let file = File::open(dir).map_err(err)?;
    // SAFETY: syncfs(2) on a descriptor this function owns for the call.
    if unsafe { libc::syncfs(file.as_raw_fd()) } != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Writes the fragment whole beside its name, syncs it, and links it into place (never over a file that is
/// there), then syncs the directory.
fn write_fragment(dir: &Path, path: &Path, text: &[u8]) -> Result<(), ProvisionError> {
    let write_err = |source| ProvisionError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".senders.fragment.")
        .tempfile_in(dir)
        .map_err(write_err)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(write_err)?;
    tmp.write_all(text).map_err(write_err)?;
    tmp.as_file().sync_all().map_err(write_err)?;
    tmp.persist_noclobber(path).map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            ProvisionError::FragmentExists {
                path: path.to_path_buf(),
            }
        } else {
            write_err(e.error)
        }
    })?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(dir: &Path, count: u64) -> Plan {
        Plan {
            out_dir: dir.to_path_buf(),
            prefix: "dev-".into(),
            start: 1,
            count,
            digits: 0,
        }
    }

    #[test]
    fn files_round_trip_and_the_fragment_parses() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("batch");
        let p = plan(&out, 600);
        let made = provision(&p, 2, |_, _| {}).unwrap();
        assert_eq!(
            (made.first.as_str(), made.last.as_str()),
            ("dev-1", "dev-600")
        );
        let text = std::fs::read(&made.fragment).unwrap();
        let list = crate::senders::parse(&made.fragment, &text).unwrap();
        assert_eq!(list.len(), 600);
        let line = std::str::from_utf8(&text)
            .unwrap()
            .lines()
            .nth(1)
            .unwrap()
            .to_string();
        let (name, public) = line.split_once(' ').unwrap();
        assert_eq!(name, "dev-1");
        let id = crate::keys::read_identity(&out.join("dev-1.key")).unwrap();
        assert_eq!(encode_key(id.public()), public);
        assert_eq!(
            std::fs::read(out.join("dev-1.bin")).unwrap(),
            id.secret_bytes()
        );
        let h = std::fs::read_to_string(out.join("dev-1.h")).unwrap();
        assert!(h.contains(public), "{h}");
        for b in id.secret_bytes() {
            assert!(h.contains(&format!("0x{b:02x},")), "{h}");
        }
    }

    #[test]
    fn an_existing_file_stops_the_run_and_its_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("dev-300.bin"), b"old").unwrap();
        let err = provision(&plan(dir.path(), 600), 2, |_, _| {}).unwrap_err();
        assert!(matches!(err, ProvisionError::KeyExists { .. }), "{err}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["dev-300.bin"]);
    }

    #[test]
    fn names_are_checked_as_the_senders_file_checks_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plan(dir.path(), 3);
        p.prefix = "bad/".into();
        let err = provision(&p, 1, |_, _| {}).unwrap_err().to_string();
        assert!(err.contains("is not 1–64 characters"), "{err}");
        p.prefix = "x".repeat(62);
        p.count = 200; // x…x1 fits in 64, x…x100 does not
        assert!(matches!(
            provision(&p, 1, |_, _| {}),
            Err(ProvisionError::Name { .. })
        ));
        p.prefix = "d".into();
        p.digits = 4;
        assert_eq!(p.name(0), "d0001");
        p.count = 0;
        assert!(matches!(
            provision(&p, 1, |_, _| {}),
            Err(ProvisionError::Count { .. })
        ));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

//! The host side of the emulated board (`firmware/qemu-m4`): builds a firmware, runs it under
//! `qemu-system-arm -M mps2-an386`, and carries its datagrams between the board's UART and UDP.
//!
//! ```text
//!  firmware ── UART0 ── QEMU -serial chardev:uart0 ──unix socket──► Bridge ──UDP (one socket)──► `to`
//!     │         SLIP frames both ways                 (this module)   ◄── answers from `to` ──┘
//!     └─ semihosting: console on QEMU's stdout, flash in a host file, exit status = QEMU's exit status
//! ```
//!
//! The harness listens on a unix socket in a temp dir and QEMU connects to it as UART0's character device, so the
//! UART's bytes never meet the console (semihosting writes to QEMU's stdout, read here as [`Outcome::console`];
//! QEMU's own messages go to its stderr, [`Outcome::qemu_stderr`]).
//! Every SLIP frame from the firmware is sent as one datagram to `to`; every datagram from `to` goes back as one
//! frame. Bytes the firmware sends are never trusted: a bad escape or an overlong frame is dropped and counted
//! ([`Outcome::bad_frames`]), never a panic. [`Kill`] SIGKILLs QEMU at a chosen moment (a power cut); the next
//! [`run`] on the same flash file starts from what the cut left.
//!
//! Without `qemu-system-arm` or the `thumbv7em-none-eabihf` target, [`available`] says the test skipped and how
//! to run it, unless `PURE_REQUIRE_FIRMWARE=1` (CI, `.ci/run`), where it fails.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How long one run may take before the harness kills it and fails: generous, for a loaded CI machine.
pub const DEADLINE: Duration = Duration::from_secs(120);
/// The target the board's firmware is built for.
pub const TARGET: &str = "thumbv7em-none-eabihf";
/// The largest datagram carried (UDP's own limit); a longer frame from the firmware is dropped.
const MAX_DATAGRAM: usize = 65_507;

const END: u8 = 0xC0;
const ESC: u8 = 0xDB;
const ESC_END: u8 = 0xDC;
const ESC_ESC: u8 = 0xDD;

/// The flash file's geometry (firmware/qemu-m4/src/board/flash.rs, README.md "The flash file").
pub const FLASH_PAGE_SIZE: usize = 4096;
pub const FLASH_PAGES: usize = 16;

/// The firmware crate's directory.
pub fn crate_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("firmware/qemu-m4")
}

/// Whether QEMU and the target are here; if not, says so and returns false (the test passes having skipped) —
/// unless `PURE_REQUIRE_FIRMWARE=1`, where it fails.
pub fn available(test: &str) -> bool {
    let required = std::env::var_os("PURE_REQUIRE_FIRMWARE").is_some_and(|v| v == "1");
    let mut missing = Vec::new();
    let qemu = Command::new("qemu-system-arm")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !qemu.is_ok_and(|s| s.success()) {
        missing.push("qemu-system-arm (`apt-get install qemu-system-arm`)".to_string());
    }
    if !target_installed() {
        missing.push(format!(
            "the {TARGET} target (`rustup target add {TARGET}`)"
        ));
    }
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "this machine lacks {}; .ci/run installs them and sets PURE_REQUIRE_FIRMWARE=1",
        missing.join(" and ")
    );
    assert!(!required, "{test}: PURE_REQUIRE_FIRMWARE=1 but {why}");
    eprintln!("skipped: {test}: {why}");
    false
}

/// [`available`], and the distribution's `arm-none-eabi-gcc` with newlib for the C firmware
/// (`link-c/examples/mps2-an386`).
pub fn available_c(test: &str) -> bool {
    if !available(test) {
        return false;
    }
    let gcc = Command::new("arm-none-eabi-gcc")
        .args(["--specs=rdimon.specs", "-print-file-name=librdimon.a"])
        .output();
    let newlib = gcc.as_ref().is_ok_and(|o| {
        o.status.success() && Path::new(String::from_utf8_lossy(&o.stdout).trim()).is_absolute()
    });
    if newlib {
        return true;
    }
    let why = "this machine lacks arm-none-eabi-gcc with newlib (`apt-get install gcc-arm-none-eabi \
               libnewlib-arm-none-eabi`); .ci/run installs them and sets PURE_REQUIRE_FIRMWARE=1";
    let required = std::env::var_os("PURE_REQUIRE_FIRMWARE").is_some_and(|v| v == "1");
    assert!(!required, "{test}: PURE_REQUIRE_FIRMWARE=1 but {why}");
    eprintln!("skipped: {test}: {why}");
    false
}

/// Builds the C firmware once per test binary: the C library (`link-c`, `cargo build --release --target
/// thumbv7em-none-eabihf`, into its own target dir), then `make` in `link-c/examples/mps2-an386` with the
/// distribution's `arm-none-eabi-gcc` (warnings are errors there). Returns the ELF's path.
pub fn build_c() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let link_c = Path::new(env!("CARGO_MANIFEST_DIR")).join("link-c");
            let target_dir = link_c.join("target");
            cargo_release(&link_c, &["--target", TARGET]);
            let lib = target_dir.join(TARGET).join("release/libpure_link_c.a");
            let build = target_dir.join("mps2-an386");
            let out = Command::new("make")
                .arg("-C")
                .arg(link_c.join("examples/mps2-an386"))
                .arg(format!("LIB={}", lib.display()))
                .arg(format!("OUT={}", build.display()))
                .output()
                .expect("run make (apt-get install make)");
            assert!(
                out.status.success(),
                "building the C firmware: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            build.join("sender.elf")
        })
        .clone()
}

/// `cargo build --release` of the crate in `dir` (a workspace of its own), into its own `target` directory, with
/// `extra` arguments. The root's flags are not the crate's: RUSTFLAGS would replace the firmware's `-Tlink.x`.
fn cargo_release(dir: &Path, extra: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(dir)
        .args(["build", "--release"])
        .args(extra)
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(dir.join("target"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "building {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the standard library for [`TARGET`] is in the toolchain's sysroot (how rustup installs a target).
fn target_installed() -> bool {
    let Ok(out) = Command::new("rustc").args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Path::new(&sysroot)
        .join("lib/rustlib")
        .join(TARGET)
        .join("lib")
        .is_dir()
}

/// Builds the firmware crate once per test binary (`cargo build --release`, in its own directory so its
/// `.cargo/config.toml` applies, into its own target dir) and returns the path of the ELF of binary `bin`.
pub fn build(bin: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let dir = crate_dir();
    BUILT.get_or_init(|| cargo_release(&dir, &[]));
    let elf = dir.join("target").join(TARGET).join("release").join(bin);
    assert!(elf.is_file(), "no firmware at {}", elf.display());
    elf
}

/// When to cut the board's power (SIGKILL QEMU).
#[derive(Clone, Copy, Debug)]
pub enum Kill {
    /// Never: the firmware exits by itself.
    Never,
    /// When the firmware's `n`th datagram (from 1) has been read off the UART, before it is passed on.
    AtDatagram(usize),
    /// This long after QEMU was started.
    After(Duration),
}

/// One run of a firmware on the board.
pub struct RunConfig<'a> {
    pub elf: &'a Path,
    /// The flash file (made by the firmware if missing).
    pub flash: &'a Path,
    /// Where the firmware's datagrams go, and the only source whose answers go back.
    pub to: SocketAddr,
    pub kill: Kill,
    /// The firmware's own command-line words (`key=…`, `records=…` for the sender), before ` -- ` and the flash
    /// path; none for the probe, whose command line is `firmware FLASH-PATH`.
    pub args: &'a [String],
}

/// What a run did.
#[derive(Debug)]
pub struct Outcome {
    /// QEMU's exit status: the firmware's (semihosting exit), or a signal if killed.
    pub status: ExitStatus,
    /// The harness killed QEMU ([`Kill`]).
    pub killed: bool,
    /// Everything the firmware printed through semihosting.
    pub console: String,
    /// QEMU's own messages (`qemu-system-arm: …`).
    pub qemu_stderr: String,
    /// The datagrams the firmware sent, with when each came off the UART.
    pub datagrams: Vec<(Instant, Vec<u8>)>,
    /// Datagrams from `to` written to the UART.
    pub answers: usize,
    /// Frames from the firmware dropped: a bad escape, or longer than a datagram.
    pub bad_frames: usize,
    /// How long QEMU ran.
    pub took: Duration,
}

impl Outcome {
    /// The value of the console's first `key: value` line for `key`.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.console.lines().find_map(|l| {
            l.strip_prefix(key)
                .and_then(|r| r.strip_prefix(':'))
                .map(str::trim)
        })
    }

    /// The firmware's exit code (None when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// What the UART side found: frames passed on and frames dropped.
#[derive(Default)]
struct FromFirmware {
    datagrams: Vec<(Instant, Vec<u8>)>,
    bad_frames: usize,
}

/// Runs the firmware once: starts QEMU, bridges UART ↔ UDP until QEMU exits (or is killed), and returns what
/// happened. Fails the test if QEMU cannot start or outlives [`DEADLINE`].
pub fn run(cfg: &RunConfig) -> Outcome {
    let dir = tempfile::tempdir().expect("a temp dir for the UART socket");
    let sock_path = dir.path().join("uart0.sock");
    let listener = UnixListener::bind(&sock_path).expect("bind the UART socket");
    listener.set_nonblocking(true).unwrap();

    let started = Instant::now();
    let child = qemu_command(cfg.elf, cfg.flash, &sock_path, cfg.args)
        .spawn()
        .expect("start qemu-system-arm");
    let child = Arc::new(Mutex::new(child));
    let read_all = |mut from: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = from.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let console = read_all(Box::new(child.lock().unwrap().stdout.take().unwrap()));
    let qemu_stderr = read_all(Box::new(child.lock().unwrap().stderr.take().unwrap()));

    // QEMU connects to the UART socket as it starts; it may also die first (a bad ELF, a missing board).
    let uart = loop {
        match listener.accept() {
            Ok((s, _)) => break Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept on the UART socket: {e}"),
        }
        if child.lock().unwrap().try_wait().unwrap().is_some() {
            break None;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "QEMU never connected to the UART socket"
        );
        thread::sleep(Duration::from_millis(2));
    };

    let killed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(0usize));
    let mut threads = Vec::new();
    let from_firmware = Arc::new(Mutex::new(FromFirmware::default()));
    if let Some(uart) = uart {
        uart.set_nonblocking(false).unwrap();
        let udp = UdpSocket::bind(if cfg.to.is_ipv4() {
            "127.0.0.1:0"
        } else {
            "[::1]:0"
        })
        .expect("bind the bridge's UDP socket");
        udp.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();

        // UART → UDP: decode frames, send each as a datagram; kill at the chosen datagram.
        let (uart_in, udp_out, to, kill) = (
            uart.try_clone().unwrap(),
            udp.try_clone().unwrap(),
            cfg.to,
            cfg.kill,
        );
        let (child_k, killed_k, seen) = (child.clone(), killed.clone(), from_firmware.clone());
        threads.push(thread::spawn(move || {
            let mut decoder = SlipDecoder::default();
            let mut buf = [0u8; 4096];
            let mut uart_in = uart_in;
            loop {
                let n = match uart_in.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                for &b in &buf[..n] {
                    match decoder.push(b) {
                        Some(Ok(datagram)) => {
                            let count = {
                                let mut seen = seen.lock().unwrap();
                                seen.datagrams.push((Instant::now(), datagram.clone()));
                                seen.datagrams.len()
                            };
                            if matches!(kill, Kill::AtDatagram(k) if k == count) {
                                cut_power(&child_k, &killed_k);
                                return;
                            }
                            // A refused send (no route, a full buffer) is a lost datagram, as on the air.
                            let _ = udp_out.send_to(&datagram, to);
                        }
                        Some(Err(())) => seen.lock().unwrap().bad_frames += 1,
                        None => {}
                    }
                }
            }
        }));

        // UDP → UART: every answer from `to`, as one frame.
        let (mut uart_out, stop_a, answers_a, to) = (uart, stop.clone(), answers.clone(), cfg.to);
        threads.push(thread::spawn(move || {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            while !stop_a.load(Ordering::Relaxed) {
                let Ok((n, from)) = udp.recv_from(&mut buf) else {
                    continue;
                };
                if from != to {
                    continue;
                }
                if uart_out.write_all(&slip_encode(&buf[..n])).is_err() {
                    return;
                }
                *answers_a.lock().unwrap() += 1;
            }
        }));
    }

    let status = loop {
        if let Some(status) = child.lock().unwrap().try_wait().unwrap() {
            break status;
        }
        if matches!(cfg.kill, Kill::After(d) if started.elapsed() >= d) {
            cut_power(&child, &killed);
        }
        if started.elapsed() > DEADLINE {
            cut_power(&child, &killed);
            let _ = child.lock().unwrap().wait();
            panic!("the firmware ran past {DEADLINE:?}");
        }
        thread::sleep(Duration::from_millis(2));
    };
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let console = console.join().unwrap_or_default();
    let qemu_stderr = qemu_stderr.join().unwrap_or_default();
    let seen = std::mem::take(&mut *from_firmware.lock().unwrap());
    let answers = *answers.lock().unwrap();
    Outcome {
        status,
        killed: killed.load(Ordering::Relaxed),
        console,
        qemu_stderr,
        datagrams: seen.datagrams,
        answers,
        bad_frames: seen.bad_frames,
        took,
    }
}

/// SIGKILLs QEMU unless it has already been reaped (the lock keeps a reaped pid from being signalled).
fn cut_power(child: &Mutex<Child>, killed: &AtomicBool) {
    let mut child = child.lock().unwrap();
    if child.try_wait().ok().flatten().is_none() && child.kill().is_ok() {
        killed.store(true, Ordering::Relaxed);
    }
}

/// `qemu-system-arm` for the board: UART0 on the unix socket `uart`, semihosting on (console on stdout; the command
/// line `firmware FLASH-PATH`, or `firmware ARGS... -- FLASH-PATH` when there are `args`), no monitor, nothing on
/// stdin.
pub fn qemu_command(elf: &Path, flash: &Path, uart: &Path, args: &[String]) -> Command {
    // QEMU's option syntax doubles a comma inside a value.
    let quote = |p: &Path| p.to_string_lossy().replace(',', ",,");
    let mut line = String::from("enable=on,target=native,arg=firmware");
    for a in args {
        assert!(
            !a.contains(' ') && a != "--",
            "a firmware word has no space and is not --: {a:?}"
        );
        line.push_str(&format!(",arg={}", a.replace(',', ",,")));
    }
    if !args.is_empty() {
        line.push_str(",arg=--");
    }
    line.push_str(&format!(",arg={}", quote(flash)));
    let mut cmd = Command::new("qemu-system-arm");
    cmd.args(["-M", "mps2-an386", "-nographic", "-monitor", "none"])
        .arg("-chardev")
        .arg(format!("socket,id=uart0,path={}", quote(uart)))
        .args(["-serial", "chardev:uart0"])
        .arg("-semihosting-config")
        .arg(line)
        .arg("-kernel")
        .arg(elf)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// SLIP (RFC 1055): `END, escaped bytes, END`.
pub fn slip_encode(datagram: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(datagram.len() + 8);
    out.push(END);
    for &b in datagram {
        match b {
            END => out.extend_from_slice(&[ESC, ESC_END]),
            ESC => out.extend_from_slice(&[ESC, ESC_ESC]),
            b => out.push(b),
        }
    }
    out.push(END);
    out
}

/// A SLIP decoder that takes any bytes: empty frames are skipped, a frame with a bad escape (ESC followed by
/// anything but ESC_END or ESC_ESC, END included) or longer than [`MAX_DATAGRAM`] comes out as `Err` at its END.
#[derive(Default)]
pub struct SlipDecoder {
    frame: Vec<u8>,
    escaped: bool,
    bad: bool,
}

impl SlipDecoder {
    /// One byte in; a whole frame out when `b` ends one.
    pub fn push(&mut self, b: u8) -> Option<Result<Vec<u8>, ()>> {
        if b == END {
            let frame = std::mem::take(&mut self.frame);
            // ESC then END: the escaped byte never came.
            let bad = std::mem::replace(&mut self.bad, false)
                || std::mem::replace(&mut self.escaped, false);
            return match (bad, frame.is_empty()) {
                (true, _) => Some(Err(())),
                (false, true) => None,
                (false, false) => Some(Ok(frame)),
            };
        }
        if self.bad {
            return None;
        }
        let byte = match (std::mem::replace(&mut self.escaped, false), b) {
            (true, ESC_END) => END,
            (true, ESC_ESC) => ESC,
            (true, _) => {
                self.bad = true;
                self.frame.clear();
                return None;
            }
            (false, ESC) => {
                self.escaped = true;
                return None;
            }
            (false, b) => b,
        };
        if self.frame.len() == MAX_DATAGRAM {
            self.bad = true;
            self.frame.clear();
        } else {
            self.frame.push(byte);
        }
        None
    }
}

/// Per page of a flash file, (erases, programs) from its counts (README.md "The flash file").
pub fn flash_counts(flash: &Path) -> Vec<(u32, u32)> {
    let bytes = std::fs::read(flash).expect("read the flash file");
    let at = FLASH_PAGES * FLASH_PAGE_SIZE;
    assert_eq!(bytes.len(), at + FLASH_PAGES * 8, "the flash file's length");
    bytes[at..]
        .chunks_exact(8)
        .map(|c| {
            (
                u32::from_le_bytes(c[..4].try_into().unwrap()),
                u32::from_le_bytes(c[4..].try_into().unwrap()),
            )
        })
        .collect()
}

/// A UDP echo server of the test's own on loopback: every datagram goes back to where it came from. Stops when
/// dropped.
pub struct Echo {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Echo {
    pub fn start() -> Echo {
        let sock = UdpSocket::bind("127.0.0.1:0").expect("bind the echo server");
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_t = stop.clone();
        let thread = thread::spawn(move || {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            while !stop_t.load(Ordering::Relaxed) {
                if let Ok((n, from)) = sock.recv_from(&mut buf) {
                    let _ = sock.send_to(&buf[..n], from);
                }
            }
        });
        Echo {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

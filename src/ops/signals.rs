//! Signals of a service: SIGTERM and SIGINT ask for a clean stop, SIGHUP for a reload of the senders file.
//!
//! A signal handler may only do async-signal-safe work, so each handler sets a flag and writes to an eventfd the
//! receive loop polls beside its socket: the signal may be delivered to any thread, and the eventfd wakes the loop
//! wherever it landed, so a reload or a stop starts at once rather than at the loop's next timeout. The loop then
//! does the real work between turns, where nothing is half applied.
//!
//! A second SIGTERM or SIGINT while the first is being honoured exits at once (`_exit`, status 128 + signal):
//! whoever sends it has decided that waiting for the current turn is worse than losing it. Nothing acknowledged
//! is lost even then, because an ack only ever leaves after its commit.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);
/// The eventfd the handlers signal; -1 until `install` made it.
static WAKE: AtomicI32 = AtomicI32::new(-1);

/// The flags the handlers set, for the receive loop.
#[derive(Debug, Clone, Copy)]
pub struct Signals {
    /// Set by SIGTERM or SIGINT.
    pub stop: &'static AtomicBool,
    /// Set by SIGHUP; the loop clears it when it takes the reload.
    pub reload: &'static AtomicBool,
    /// Readable after any of these signals; the loop polls it and drains it.
    pub wake: Option<RawFd>,
}

fn wake_loop() {
    let fd = WAKE.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; 8 bytes from a live u64 to an eventfd that lives for the process.
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

extern "C" fn on_stop(signal: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        // SAFETY: `_exit` is async-signal-safe; it skips destructors, which is the point of a second signal.
        unsafe { libc::_exit(128 + signal) };
    }
    wake_loop();
}

extern "C" fn on_reload(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
    wake_loop();
}

fn handle(signal: libc::c_int, handler: extern "C" fn(libc::c_int)) {
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handlers above only touch atomics
    // and `_exit`, which are async-signal-safe. SA_RESTART keeps unrelated blocking calls (file reads on the
    // reload thread, the metrics thread's accept) from failing with EINTR; the receive loop's poll returns early
    // on a signal regardless, as poll(2) is never restarted.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

/// Installs the handlers (once per process; later calls just return the flags).
pub fn install() -> Signals {
    if WAKE.load(Ordering::SeqCst) < 0 {
        // SAFETY: eventfd returns a new descriptor or -1. It is kept for the life of the process (the handlers
        // may write to it at any time), so it is deliberately never closed.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd >= 0 {
            WAKE.store(fd, Ordering::SeqCst);
        }
    }
    handle(libc::SIGTERM, on_stop);
    handle(libc::SIGINT, on_stop);
    handle(libc::SIGHUP, on_reload);
    let wake = WAKE.load(Ordering::SeqCst);
    Signals {
        stop: &STOP,
        reload: &RELOAD,
        wake: (wake >= 0).then_some(wake),
    }
}

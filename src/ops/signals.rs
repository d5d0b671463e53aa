//! Signals of a service: SIGTERM and SIGINT ask for a clean stop, SIGHUP for a reload of the senders file.
//!
//! A signal handler may only do async-signal-safe work, so each handler sets a flag that the receive loop reads
//! every round (its wait is at most 100 ms, and a signal cuts the wait short with EINTR anyway). The loop then
//! does the real work between turns, where nothing is half applied.
//!
//! A second SIGTERM or SIGINT while the first is being honoured exits at once (`_exit`, status 128 + signal):
//! whoever sends it has decided that waiting for the current turn is worse than losing it. Nothing acknowledged
//! is lost even then, because an ack only ever leaves after its commit.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);

/// The flags the handlers set, for the receive loop.
#[derive(Debug, Clone, Copy)]
pub struct Signals {
    /// Set by SIGTERM or SIGINT.
    pub stop: &'static AtomicBool,
    /// Set by SIGHUP; the loop clears it when it takes the reload.
    pub reload: &'static AtomicBool,
}

extern "C" fn on_stop(signal: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        // SAFETY: `_exit` is async-signal-safe; it skips destructors, which is the point of a second signal.
        unsafe { libc::_exit(128 + signal) };
    }
}

extern "C" fn on_reload(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
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
    handle(libc::SIGTERM, on_stop);
    handle(libc::SIGINT, on_stop);
    handle(libc::SIGHUP, on_reload);
    Signals {
        stop: &STOP,
        reload: &RELOAD,
    }
}

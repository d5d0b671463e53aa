//! A wake-up another thread can give a loop that sleeps in poll(2): an eventfd.
//!
//! The receive loop sleeps on its UDP socket and on descriptors like this one. A producer on another thread (the
//! HTTP server handing over a `POST /link`) puts its work in a queue first and then calls [`Wake::wake`]; the loop
//! polls [`Wake::fd`], and [`Wake::clear`]s it before it looks at the queue, so a wake that lands between the two
//! is never lost: it leaves the descriptor readable for the next poll.
//!
//! Waking costs a system call and, when the loop sleeps, a context switch (35–60 µs here, BRIEF.md): a producer
//! wakes once per hand-over (a whole request of packets), never per packet. The signal handlers keep their own
//! eventfd in [`crate::ops::signals`], because a signal handler may not touch anything that is not static.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An eventfd: [`Wake::wake`] makes [`Wake::fd`] readable until [`Wake::clear`].
#[derive(Debug)]
pub struct Wake {
    fd: OwnedFd,
}

impl Wake {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no preconditions; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
        Ok(Wake {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Makes the descriptor readable. Never blocks: a counter already at its maximum (EAGAIN) is readable anyway.
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Makes the descriptor unreadable again (until the next wake). Call before looking at what the wake is for.
    pub fn clear(&self) {
        clear_eventfd(self.fd.as_raw_fd());
    }

    /// The descriptor to poll for reading.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Reads an eventfd's counter to zero; nothing happens if it is already zero (the descriptor is non-blocking).
pub fn clear_eventfd(fd: RawFd) {
    let mut count = 0u64;
    // SAFETY: reading 8 bytes into a live u64; a non-blocking eventfd returns EAGAIN when it is zero.
    unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) > 0 }
    }

    #[test]
    fn wake_makes_readable_until_cleared() {
        let w = Wake::new().unwrap();
        assert!(!readable(w.fd()));
        w.wake();
        w.wake();
        assert!(readable(w.fd()));
        w.clear();
        assert!(!readable(w.fd()));
        w.clear();
        assert!(!readable(w.fd()));
    }
}

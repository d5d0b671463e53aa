//! A wake for a loop that sleeps in poll(2): an eventfd another thread writes to.
//!
//! The receive loop sleeps on its UDP socket; the sending loop's outlets (an acknowledgement freed memory, a far
//! side told where to resume) and the HTTP thread (a link request arrived) must be able to wake it without a
//! datagram. One eventfd per loop: writing it is one syscall, reading it clears every wake since the last read, so
//! a thousand wakes while the loop works cost it one extra round, not a thousand.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

#[derive(Debug)]
pub struct Wake {
    fd: OwnedFd,
}

impl Wake {
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd returns a new descriptor or -1; a valid one is owned here from now on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nobody else owns.
        Ok(Wake {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Wakes the loop (or makes its next wait return at once).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: 8 bytes from a live u64 to our eventfd. A full counter (2^64 − 2 wakes unread) fails with
        // EAGAIN, which still leaves the fd readable: the wake is not lost.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears pending wakes; returns whether there were any.
    pub fn clear(&self) -> bool {
        let mut count = 0u64;
        // SAFETY: reading 8 bytes from the non-blocking eventfd into a u64.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        n == 8 && count > 0
    }

    /// The descriptor to poll for POLLIN.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_coalesce_and_clear() {
        let w = Wake::new().unwrap();
        assert!(!w.clear());
        w.wake();
        w.wake();
        assert!(w.clear());
        assert!(!w.clear());
    }
}

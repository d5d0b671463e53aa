//! The host, reached through semihosting (`bkpt 0xab`, answered by QEMU with `-semihosting-config
//! enable=on,target=native`): files for [`super::flash`], the command line, and the exit status.
//!
//! Each call stops the emulated CPU while QEMU does it on the host, so a file write here is one `write(2)` of the
//! QEMU process: done or not done when QEMU is killed, never half done.

use cortex_m_semihosting::{nr, syscall, syscall1};

/// Exit status of a panic (the probe's own statuses are below it).
pub const EXIT_PANIC: u32 = 101;

/// `SYS_EXIT_EXTENDED`: like `SYS_EXIT`, with an exit status on 32-bit ARM too.
const SYS_EXIT_EXTENDED: usize = 0x20;
/// `ADS_Stopped_ApplicationExit`: the program ended by itself; QEMU exits with the subcode.
const ADP_STOPPED_APPLICATION_EXIT: usize = 0x20026;

/// Ends the emulation; QEMU's process exits with `status` (0–255 on Linux).
pub fn exit(status: u32) -> ! {
    let block = [ADP_STOPPED_APPLICATION_EXIT, status as usize];
    // SAFETY: SYS_EXIT_EXTENDED reads the two words of `block`, which lives until the call (it does not return).
    unsafe { syscall(SYS_EXIT_EXTENDED, &block) };
    // A host that does not stop us (no semihosting would have faulted at the bkpt already): wait.
    loop {
        cortex_m::asm::wfi();
    }
}

/// The command line (`arg=`s joined by spaces) in `buf`, without its NUL; None when the host gives none or it does
/// not fit (`buf.len() - 1` bytes at most).
pub fn cmdline(buf: &mut [u8]) -> Option<&[u8]> {
    if buf.is_empty() {
        return None;
    }
    let mut block = [buf.as_mut_ptr() as usize, buf.len() - 1];
    // SAFETY: SYS_GET_CMDLINE writes at most block[1] bytes (and a NUL) to buf and the length it wrote to
    // block[1]; both outlive the call (the call's asm is not `nomem`, so the compiler sees them written).
    let r = unsafe { syscall1(nr::GET_CMDLINE, block.as_mut_ptr() as usize) };
    if r != 0 {
        return None;
    }
    let len = block[1].min(buf.len() - 1);
    Some(&buf[..len])
}

/// Where the flash file's path starts in a command line: after ` -- ` when the line has it (`NAME WORD... --
/// PATH`, a firmware's own words before it), else after the first word (`NAME PATH`). The path may hold spaces.
pub fn flash_path_at(line: &[u8]) -> Option<usize> {
    let start = match line.windows(4).position(|w| w == b" -- ") {
        Some(at) => at + 4,
        None => line.iter().position(|&b| b == b' ')? + 1,
    };
    (start < line.len()).then_some(start)
}

/// The flash file's path, NUL-terminated in `buf`: the command line after ` -- ` if it has one, else after its
/// first word ([`flash_path_at`]). None when there is no path or the line does not fit.
pub fn flash_path(buf: &mut [u8; 512]) -> Option<&[u8]> {
    let len = cmdline(buf)?.len();
    let start = flash_path_at(&buf[..len])?;
    buf[len] = 0;
    Some(&buf[start..=len])
}

/// A host file opened for reading and writing, binary (`"r+b"`), or made (`"w+b"`) when it does not exist.
pub struct File(usize);

impl File {
    /// Opens `path` (NUL-terminated).
    pub fn open_or_create(path: &[u8]) -> Option<File> {
        debug_assert_eq!(path.last(), Some(&0));
        for mode in [nr::open::RW_BINARY, nr::open::RW_TRUNC_BINARY] {
            let block = [path.as_ptr() as usize, mode, path.len() - 1];
            // SAFETY: SYS_OPEN reads the NUL-terminated path, which outlives the call.
            let fd = unsafe { syscall(nr::OPEN, &block) } as isize;
            if fd >= 0 {
                return Some(File(fd as usize));
            }
        }
        None
    }

    /// The file's size in bytes.
    pub fn size(&self) -> Option<u64> {
        // SAFETY: SYS_FLEN reads one word.
        let n = unsafe { syscall(nr::FLEN, &[self.0]) } as isize;
        (n >= 0).then_some(n as u64)
    }

    /// Reads `buf.len()` bytes at `pos`; false when the host read fewer.
    pub fn read_at(&mut self, pos: u32, buf: &mut [u8]) -> bool {
        self.seek(pos) && {
            let block = [self.0, buf.as_mut_ptr() as usize, buf.len()];
            // SAFETY: SYS_READ writes at most buf.len() bytes into buf; returns how many it did not read.
            unsafe { syscall(nr::READ, &block) == 0 }
        }
    }

    /// Writes `data` at `pos` in one host write.
    pub fn write_at(&mut self, pos: u32, data: &[u8]) -> bool {
        self.seek(pos) && self.write(data)
    }

    /// Writes `data` at the current position in one host write.
    pub fn write(&mut self, data: &[u8]) -> bool {
        let block = [self.0, data.as_ptr() as usize, data.len()];
        // SAFETY: SYS_WRITE reads data.len() bytes of data; returns how many it did not write.
        unsafe { syscall(nr::WRITE, &block) == 0 }
    }

    fn seek(&mut self, pos: u32) -> bool {
        // SAFETY: SYS_SEEK reads two words.
        unsafe { syscall(nr::SEEK, &[self.0, pos as usize]) == 0 }
    }
}

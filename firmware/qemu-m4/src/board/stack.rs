//! The stack's peak: cortex-m-rt (feature `paint-stack`) fills the RAM between the end of `.bss` and the top of
//! the stack with 0xCCCC_CCCC at reset, before `main`; the lowest word no longer holding it is as deep as the
//! stack (interrupt frames included) has been.

use cortex_m_rt::STACK_PAINT_VALUE;

extern "C" {
    /// The top of the stack (the end of RAM: 0x20010000 with this crate's `memory.x`).
    static _stack_start: u32;
    /// The lowest address the stack may reach: the end of `.bss` and `.uninit`.
    static _stack_end: u32;
}

/// Bytes of stack used so far, at most: from the top down to the lowest word that lost its paint.
pub fn peak() -> usize {
    let (top, bottom) = bounds();
    let mut at = bottom;
    // SAFETY: [bottom, top) is RAM (memory.x), word-aligned (cortex-m-rt's link.x asserts it).
    while at < top && unsafe { core::ptr::read_volatile(at as *const u32) } == STACK_PAINT_VALUE {
        at += 4;
    }
    top - at
}

/// Bytes the stack may use at most: from the top of RAM down to `.bss`.
pub fn size() -> usize {
    bounds().0 - bounds().1
}

/// (top, bottom) of the stack: the linker symbols' addresses (their values are never read).
fn bounds() -> (usize, usize) {
    (
        core::ptr::addr_of!(_stack_start) as usize,
        core::ptr::addr_of!(_stack_end) as usize,
    )
}

//! Where emitted bytes go: a growable `Vec` on the node, a fixed buffer the caller owns on a device.
//!
//! Every emitting function of [`crate::wire`] and [`crate::crypto::seal`] writes through [`Out`], so one encoder
//! serves both. A [`SliceOut`] never writes past its buffer and never panics: what does not fit is dropped and
//! remembered ([`SliceOut::overflowed`]), and the sender sizes what it writes from the datagram size, which a
//! device's buffer must hold ([`crate::sender::SenderConfig::max_datagram`]).

/// A byte sink that grows at its end and whose written bytes can be changed in place (to seal them).
pub trait Out {
    fn push(&mut self, byte: u8);
    fn extend_from_slice(&mut self, bytes: &[u8]);
    /// Bytes written so far.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes written so far, to change in place.
    fn written_mut(&mut self) -> &mut [u8];
    /// Forgets everything written.
    fn clear(&mut self);
    /// Forgets what was written past `len`.
    fn truncate(&mut self, len: usize);
    /// Appends `len` bytes for the caller to fill (zeros until it does), or `None` when they do not fit.
    fn grow(&mut self, len: usize) -> Option<&mut [u8]>;
}

#[cfg(feature = "alloc")]
impl Out for alloc::vec::Vec<u8> {
    fn push(&mut self, byte: u8) {
        alloc::vec::Vec::push(self, byte)
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        alloc::vec::Vec::extend_from_slice(self, bytes)
    }
    fn len(&self) -> usize {
        alloc::vec::Vec::len(self)
    }
    fn written_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
    fn clear(&mut self) {
        alloc::vec::Vec::clear(self)
    }
    fn truncate(&mut self, len: usize) {
        alloc::vec::Vec::truncate(self, len)
    }
    fn grow(&mut self, len: usize) -> Option<&mut [u8]> {
        let at = alloc::vec::Vec::len(self);
        self.resize(at + len, 0);
        Some(&mut self[at..])
    }
}

/// A fixed buffer written from its start: a device's datagram buffer.
pub struct SliceOut<'a> {
    buf: &'a mut [u8],
    len: usize,
    overflowed: bool,
}

impl<'a> SliceOut<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        SliceOut {
            buf,
            len: 0,
            overflowed: false,
        }
    }
    /// The bytes written.
    pub fn written(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    /// Whether a write did not fit (and was dropped): the buffer is smaller than what was asked of it.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }
}

impl Out for SliceOut<'_> {
    fn push(&mut self, byte: u8) {
        match self.buf.get_mut(self.len) {
            Some(b) => {
                *b = byte;
                self.len += 1;
            }
            None => self.overflowed = true,
        }
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.overflowed = true,
        }
    }
    fn len(&self) -> usize {
        self.len
    }
    fn written_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
    fn clear(&mut self) {
        self.len = 0;
        self.overflowed = false;
    }
    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    fn grow(&mut self, len: usize) -> Option<&mut [u8]> {
        let at = self.len;
        match self.buf.get_mut(at..at + len) {
            Some(dst) => {
                dst.fill(0);
                self.len += len;
                Some(dst)
            }
            None => {
                self.overflowed = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_drops_what_does_not_fit_and_says_so() {
        let mut b = [0u8; 4];
        let mut o = SliceOut::new(&mut b);
        o.extend_from_slice(b"abc");
        o.extend_from_slice(b"de");
        assert!(o.overflowed());
        o.push(b'x');
        assert_eq!(o.written(), b"abcx");
        o.push(b'y');
        assert_eq!(o.len(), 4);
        o.clear();
        assert!(!o.overflowed() && o.is_empty());
    }
}

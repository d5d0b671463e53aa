//! A flow's queued records: what the sender holds until the node acknowledges it, in the form a DATA frame
//! carries (each record's length as a varint, then its bytes), so a frame's records are one copy (research/022).
//!
//! [`RecordQueue`] is what the sender's state machine asks of a queue. Two forms of one implementation,
//! [`Records`], give it: [`VecQueue`] grows in the heap (the node's outlets hold up to a window of 16,384
//! records; `UdpLink`), and [`ArrayQueue`] is a fixed buffer for a device, which says [`QueueFull`] instead of
//! growing. A device's outbox in flash is another `RecordQueue`.

use crate::buf::Out;
use crate::wire;

/// The queue has no room for the record: the program keeps it and queues it again after acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// What the sender's state machine asks of a flow's queue of unacknowledged records, oldest first.
pub trait RecordQueue {
    /// Where [`RecordQueue::push_with`] has a record written.
    type Writer<'w>: Out
    where
        Self: 'w;
    /// Records queued.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes of the records before the `i`-th (0: the oldest), in their frame form.
    fn bytes_before(&self, i: usize) -> usize;
    /// The bytes of every record queued, in their frame form.
    fn queued_bytes(&self) -> usize;
    /// How many records from the `from`-th (at most `max`) fit in `room` bytes of a frame, each with its length.
    fn fit(&self, from: usize, max: usize, room: usize) -> usize;
    /// Writes records `from .. from + count` into `out` as a DATA frame carries them. False when they could not
    /// be read (a queue in flash that failed a read or a check): the datagram is not sent.
    fn put_range(&self, out: &mut (impl Out + ?Sized), from: usize, count: usize) -> bool;
    /// Appends one record of `len` bytes, which `write` writes (exactly `len` of them).
    fn push_with(
        &mut self,
        len: usize,
        write: impl FnOnce(&mut Self::Writer<'_>),
    ) -> Result<(), QueueFull>;
    /// Appends one record, copied from `record`.
    fn push_slice(&mut self, record: &[u8]) -> Result<(), QueueFull> {
        self.push_with(record.len(), |b| b.extend_from_slice(record))
    }
    /// The largest record this queue can ever take (a queue in flash: what a page holds); a longer one is
    /// [`crate::sender::SenderError::TooLarge`], not [`QueueFull`], since no acknowledgement makes room for it.
    fn largest_record(&self) -> usize {
        usize::MAX
    }
    /// Releases the `n` oldest records (acknowledged).
    fn release(&mut self, n: usize);
    /// Releases every record.
    fn clear(&mut self);
    /// An empty queue for a flow the sender opens by itself (a record queued for an app with no flow open), or
    /// `None` where a queue cannot be made from nothing (an outbox in flash: the program opens its flow).
    fn for_new_flow() -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
    /// The node has every record of the flow through `through`, and the first record queued is now
    /// `through + 1`: after an acknowledgement released records (`renumbered` false), or when the sender
    /// renumbered what it holds to follow the node (`renumbered` true: the node went back, docs/protocol.md 7.3,
    /// or a probe told it where to start). A queue that survives restarts keeps this; one in memory ignores it.
    fn acked(&mut self, through: u64, renumbered: bool) {
        let _ = (through, renumbered);
    }
}

/// Records back to back in one buffer, with where each ends: queueing a record copies its bytes and allocates
/// nothing per record, and an acknowledgement releases a prefix by moving an offset (research/006: an outlet's
/// loop spent about a third of its time allocating and freeing a `Vec` per record).
#[derive(Debug, Default)]
pub struct Records<B, E> {
    /// The records in their frame form; those before `start` are released.
    bytes: B,
    start: usize,
    /// Where each record ends in `bytes`.
    ends: E,
}

/// A growable queue, for the node and `UdpLink`.
#[cfg(feature = "alloc")]
pub type VecQueue = Records<alloc::vec::Vec<u8>, alloc::collections::VecDeque<usize>>;

/// A queue of at most `BYTES` bytes (records with their lengths) and `RECORDS` records, for a device.
pub type ArrayQueue<const BYTES: usize, const RECORDS: usize> =
    Records<heapless::Vec<u8, BYTES>, heapless::Deque<usize, RECORDS>>;

/// Released bytes are moved out of a growable buffer once they are at least this many and at least half of it.
#[cfg(feature = "alloc")]
const COMPACT_AFTER: usize = 64 << 10;

/// The byte buffer under [`Records`].
pub trait RecordBytes: Out + core::ops::Deref<Target = [u8]> {
    /// Whether `extra` more bytes fit once `released` bytes at the front are moved out; moves them if that is
    /// what makes room (a fixed buffer) or if the release is large enough to be worth it (a growable one).
    /// Returns how many bytes were moved out (0 if none).
    fn make_room(&mut self, released: usize, extra: usize) -> Result<usize, QueueFull>;
    /// Moves the first `n` bytes out after a release, where the buffer wants that; returns how many moved.
    fn compact(&mut self, released: usize) -> usize;
    /// The most bytes it can ever hold (`usize::MAX`: it grows).
    fn most(&self) -> usize {
        usize::MAX
    }
}

/// The ends under [`Records`].
pub trait RecordEnds {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn get(&self, i: usize) -> usize;
    fn push_back(&mut self, end: usize) -> Result<(), QueueFull>;
    fn drop_front(&mut self, n: usize);
    fn clear(&mut self);
    /// Every end moved `by` bytes earlier.
    fn shift(&mut self, by: usize);
    /// How many ends from the `from`-th, before the `to`-th, are at most `limit`.
    fn count_at_most(&self, from: usize, to: usize, limit: usize) -> usize;
}

#[cfg(feature = "alloc")]
impl RecordBytes for alloc::vec::Vec<u8> {
    fn make_room(&mut self, _released: usize, _extra: usize) -> Result<usize, QueueFull> {
        Ok(0)
    }
    fn compact(&mut self, released: usize) -> usize {
        if released >= COMPACT_AFTER && released * 2 >= self.len() {
            // Amortized: what moves is at most what was released since the last compaction.
            self.drain(..released);
            released
        } else {
            0
        }
    }
}

#[cfg(feature = "alloc")]
impl RecordEnds for alloc::collections::VecDeque<usize> {
    fn len(&self) -> usize {
        alloc::collections::VecDeque::len(self)
    }
    fn get(&self, i: usize) -> usize {
        self[i]
    }
    fn push_back(&mut self, end: usize) -> Result<(), QueueFull> {
        alloc::collections::VecDeque::push_back(self, end);
        Ok(())
    }
    fn drop_front(&mut self, n: usize) {
        self.drain(..n);
    }
    fn clear(&mut self) {
        alloc::collections::VecDeque::clear(self)
    }
    fn shift(&mut self, by: usize) {
        for e in self.iter_mut() {
            *e -= by;
        }
    }
    fn count_at_most(&self, from: usize, to: usize, limit: usize) -> usize {
        self.range(from..to)
            .take_while(|&&end| end <= limit)
            .count()
    }
}

impl<const N: usize> Out for heapless::Vec<u8, N> {
    // Room is made before a record is written (`RecordBytes::make_room`); a write past it is dropped.
    fn push(&mut self, byte: u8) {
        let _ = heapless::Vec::push(self, byte);
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        let _ = heapless::Vec::extend_from_slice(self, bytes);
    }
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn written_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
    fn clear(&mut self) {
        heapless::Vec::clear(self)
    }
    fn truncate(&mut self, len: usize) {
        heapless::Vec::truncate(self, len)
    }
    fn grow(&mut self, len: usize) -> Option<&mut [u8]> {
        let at = self.as_slice().len();
        self.resize(at + len, 0).ok()?;
        Some(&mut self.as_mut_slice()[at..])
    }
}

impl<const N: usize> RecordBytes for heapless::Vec<u8, N> {
    fn make_room(&mut self, released: usize, extra: usize) -> Result<usize, QueueFull> {
        if self.as_slice().len() + extra <= N {
            return Ok(0);
        }
        if self.as_slice().len() - released + extra > N {
            return Err(QueueFull);
        }
        let kept = self.as_slice().len() - released;
        self.as_mut_slice().copy_within(released.., 0);
        self.truncate(kept);
        Ok(released)
    }
    fn compact(&mut self, _released: usize) -> usize {
        // A fixed buffer moves its bytes only when it needs the room (`make_room`).
        0
    }
    fn most(&self) -> usize {
        N
    }
}

impl<const R: usize> RecordEnds for heapless::Deque<usize, R> {
    fn len(&self) -> usize {
        self.iter().len()
    }
    fn get(&self, i: usize) -> usize {
        heapless::Deque::get(self, i).copied().unwrap_or(0)
    }
    fn push_back(&mut self, end: usize) -> Result<(), QueueFull> {
        heapless::Deque::push_back(self, end).map_err(|_| QueueFull)
    }
    fn drop_front(&mut self, n: usize) {
        for _ in 0..n {
            self.pop_front();
        }
    }
    fn clear(&mut self) {
        heapless::Deque::clear(self)
    }
    fn shift(&mut self, by: usize) {
        for e in self.iter_mut() {
            *e -= by;
        }
    }
    fn count_at_most(&self, from: usize, to: usize, limit: usize) -> usize {
        self.iter()
            .skip(from)
            .take(to.saturating_sub(from))
            .take_while(|&&end| end <= limit)
            .count()
    }
}

impl<B: RecordBytes, E: RecordEnds> Records<B, E> {
    /// Where the `i`-th record (0: the oldest) begins, its length varint included.
    fn begin(&self, i: usize) -> usize {
        if i == 0 {
            self.start
        } else {
            self.ends.get(i - 1)
        }
    }
    /// The `i`-th record's bytes, without its length.
    pub fn get(&self, i: usize) -> &[u8] {
        let (from, to) = (self.begin(i), self.ends.get(i));
        let record = self.bytes.get(from..to).unwrap_or(&[]);
        let mut r = wire::Reader::new(record);
        match r.varint() {
            Ok(_) => &record[r.position()..],
            Err(_) => &[],
        }
    }
    fn moved_out(&mut self, gone: usize) {
        if gone > 0 {
            self.ends.shift(gone);
            self.start -= gone;
        }
    }
}

impl<B: RecordBytes + Default, E: RecordEnds + Default> RecordQueue for Records<B, E> {
    type Writer<'w>
        = B
    where
        Self: 'w;
    fn len(&self) -> usize {
        self.ends.len()
    }
    fn bytes_before(&self, i: usize) -> usize {
        self.begin(i) - self.start
    }
    fn queued_bytes(&self) -> usize {
        self.bytes.len() - self.start
    }
    fn largest_record(&self) -> usize {
        // A record takes its length's varint and its bytes: the longest whose both fit the whole buffer.
        let most = self.bytes.most();
        if most == usize::MAX {
            return most;
        }
        let mut len = most.saturating_sub(wire::varint_len(most as u64));
        while len + 1 + wire::varint_len(len as u64 + 1) <= most {
            len += 1;
        }
        len
    }
    fn fit(&self, from: usize, max: usize, room: usize) -> usize {
        let begin = self.begin(from);
        let to = self.ends.len().min(from.saturating_add(max));
        // Ends grow, so the records that fit are those whose end is within `room` of the first one's start.
        self.ends
            .count_at_most(from, to, begin.saturating_add(room))
    }
    fn put_range(&self, out: &mut (impl Out + ?Sized), from: usize, count: usize) -> bool {
        if count > 0 {
            let (a, b) = (self.begin(from), self.ends.get(from + count - 1));
            match self.bytes.get(a..b) {
                Some(bytes) => out.extend_from_slice(bytes),
                None => return false,
            }
        }
        true
    }
    fn push_with(&mut self, len: usize, write: impl FnOnce(&mut B)) -> Result<(), QueueFull> {
        if self.ends.is_empty() && self.start > 0 {
            self.clear();
        }
        let need = wire::varint_len(len as u64) + len;
        let gone = self.bytes.make_room(self.start, need)?;
        self.moved_out(gone);
        let end = self.bytes.len() + need;
        self.ends.push_back(end)?;
        wire::put_varint(&mut self.bytes, len as u64);
        write(&mut self.bytes);
        Ok(())
    }
    fn release(&mut self, n: usize) {
        if n >= self.ends.len() {
            self.clear();
            return;
        }
        if n == 0 {
            return;
        }
        self.start = self.ends.get(n - 1);
        self.ends.drop_front(n);
        let gone = self.bytes.compact(self.start);
        self.moved_out(gone);
    }
    fn clear(&mut self) {
        self.bytes.clear();
        self.start = 0;
        self.ends.clear();
    }
    fn for_new_flow() -> Option<Self> {
        Some(Self::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "alloc")]
    use alloc::vec;

    fn fill<Q: RecordQueue>(q: &mut Q, n: usize) -> usize {
        (0..n)
            .take_while(|i| q.push_slice(&[*i as u8; 10]).is_ok())
            .count()
    }

    #[test]
    fn a_fixed_queue_takes_records_up_to_its_whole_buffer_and_no_longer() {
        // A record of 47 bytes and its length byte fill 48; of 127 and its byte, 128; 128 takes two length bytes.
        for (largest, q) in [
            (47, ArrayQueue::<48, 2>::default().largest_record()),
            (127, ArrayQueue::<128, 2>::default().largest_record()),
            (127, ArrayQueue::<129, 2>::default().largest_record()),
            (128, ArrayQueue::<130, 2>::default().largest_record()),
        ] {
            assert_eq!(q, largest);
        }
        let mut q = ArrayQueue::<130, 2>::default();
        assert_eq!(q.push_slice(&[1; 129]), Err(QueueFull));
        assert_eq!(q.push_slice(&[1; 128]), Ok(()));
        assert_eq!(VecQueue::default().largest_record(), usize::MAX);
    }

    #[test]
    fn a_fixed_queue_says_full_and_takes_more_once_records_are_released() {
        // 4 records of 11 bytes (a length byte and 10) fit in 48 bytes.
        let mut q = ArrayQueue::<48, 8>::default();
        assert_eq!(fill(&mut q, 10), 4);
        assert_eq!(q.push_slice(&[9; 10]), Err(QueueFull));
        q.release(2);
        assert_eq!(q.push_slice(&[7; 10]), Ok(()));
        assert_eq!(q.len(), 3);
        assert_eq!(q.get(0), &[2; 10]);
        assert_eq!(q.get(2), &[7; 10]);
        assert_eq!(q.queued_bytes(), 33);
        assert_eq!(q.fit(0, 10, 22), 2);
        let mut out = heapless::Vec::<u8, 64>::new();
        assert!(q.put_range(&mut out, 1, 2));
        assert_eq!(out.len(), 22);
        assert_eq!(out[0], 10);
        assert_eq!(out[1], 3);
    }

    #[test]
    fn a_fixed_queue_is_bounded_by_its_records_too() {
        let mut q = ArrayQueue::<1024, 3>::default();
        assert_eq!(fill(&mut q, 10), 3);
        q.release(3);
        assert!(q.is_empty());
        assert_eq!(fill(&mut q, 10), 3);
    }

    #[cfg(feature = "alloc")]
    #[test]
    fn a_growable_queue_compacts_after_large_releases() {
        let mut q = VecQueue::default();
        let n = 2 * COMPACT_AFTER / 11 + 10;
        assert_eq!(fill(&mut q, n), n);
        q.release(n - 5);
        assert_eq!(q.len(), 5);
        assert_eq!(q.bytes_before(5), 55);
        assert_eq!(q.get(4), &[(n - 1) as u8; 10]);
    }
    #[cfg(feature = "alloc")]
    #[test]
    fn the_record_queue_keeps_records_in_order_through_releases_and_compaction() {
        let mut q = VecQueue::default();
        let record = |i: usize| vec![(i % 251) as u8; 1 + i % 700];
        let (mut first, mut next) = (0usize, 0usize);
        // Enough bytes that compaction runs many times; release in uneven steps.
        for round in 0..200 {
            for _ in 0..(50 + round % 37) {
                let r = record(next);
                q.push_slice(&r).unwrap();
                next += 1;
            }
            let n = (round * 7) % 60;
            q.release(n);
            first = (first + n).min(next);
            assert_eq!(q.len(), next - first);
            for k in [0, q.len() / 2, q.len().saturating_sub(1)] {
                if k < q.len() {
                    assert_eq!(
                        q.get(k),
                        &record(first + k)[..],
                        "record {} after round {round}",
                        first + k
                    );
                }
            }
        }
        assert!(q.start < COMPACT_AFTER || q.start * 2 < q.bytes.len());
        q.release(q.len() + 5);
        assert!(q.is_empty());
        assert_eq!((q.start, q.bytes.len()), (0, 0));
    }
}

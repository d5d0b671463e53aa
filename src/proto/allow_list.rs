//! The allow-list: every sender the node accepts, in one flat, immutable byte layout.
//!
//! This is all the node holds for an idle link (docs/protocol.md 6). The layout is the same in memory and on disk
//! (`STATE/senders.idx`, made from the senders file by [`crate::senders`]), so the node can map the file instead of
//! copying it: a million idle senders then cost page cache, which the kernel may drop and read back, rather than
//! anonymous memory (research/002). Keys are sorted by their bytes, which also sorts them by key id (the key id is
//! the key's first four bytes), so the candidates for a key id are found by binary search over the keys. A small
//! table in the heap, made when the list is checked, says where each prefix of key ids starts, so the search
//! covers a few keys rather than all of them (about 1 B per sender; [`AllowList::candidates`]). No allocation per
//! sender, so a million senders do not fragment the heap.
//!
//! A push names its sender, so pushes also look senders up by name. The layout has no order by name (a start with
//! a changed file of a million lines must be ready in 0.3 s, and sorting the names would be a third of that), so a
//! list is first searched by name with a scan of its name arena (about 0.4 ms at a million senders, research/024),
//! and an index by name ([`NameIndex`], about 5 B of heap per sender) is made only when asked for
//! ([`AllowList::index_names`]): a node never pushed to never holds one (research/046).
//!
//! Layout, all integers little-endian:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `PSALLOW1` |
//! | 8 | 8 | `count`: senders |
//! | 16 | 8 | `names_len`: bytes of the name arena |
//! | 24 | 40 | the source the list was made from (see [`SourceStamp`]); zeros when made in memory |
//! | 64 | 32 × count | public keys, sorted |
//! | … | 4 × count | end offset of each sender's name in the arena |
//! | … | names_len | the names, concatenated |

use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use thiserror::Error;

use super::crypto::PublicKeyBytes;

/// Position of a sender in an [`AllowList`]. Only meaningful for the list it came from.
pub type SenderIndex = u32;

pub const MAGIC: &[u8; 8] = b"PSALLOW1";
pub const HEADER_LEN: usize = 64;

/// Identifies the file a list was made from: if all of it matches the file now, the list is still that file's.
/// `ctime` cannot be set by users, so an edit that restores the size and mtime is still noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SourceStamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl SourceStamp {
    fn write(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.dev.to_le_bytes());
        out[8..16].copy_from_slice(&self.ino.to_le_bytes());
        out[16..24].copy_from_slice(&self.size.to_le_bytes());
        out[24..32].copy_from_slice(&self.mtime_ns.to_le_bytes());
        out[32..40].copy_from_slice(&self.ctime_ns.to_le_bytes());
    }
    fn read(b: &[u8]) -> Self {
        SourceStamp {
            dev: le_u64(&b[0..8]),
            ino: le_u64(&b[8..16]),
            size: le_u64(&b[16..24]),
            mtime_ns: le_u64(&b[24..32]) as i64,
            ctime_ns: le_u64(&b[32..40]) as i64,
        }
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum AllowListError {
    #[error("not an allow-list (bad magic)")]
    Magic,
    #[error("length {actual} does not match the header (expected {expected})")]
    Length { expected: u64, actual: u64 },
    #[error("keys are not sorted and unique at entry {0}")]
    Unsorted(u64),
    #[error("name offsets are not increasing at entry {0}")]
    Names(u64),
}

/// Bytes bound for one place in a file, written by position when the buffer is full.
struct Section<'f> {
    file: &'f std::fs::File,
    at: u64,
    buf: Vec<u8>,
}

impl<'f> Section<'f> {
    const BUF: usize = 256 << 10;

    fn new(file: &'f std::fs::File, at: usize) -> Self {
        Section {
            file,
            at: at as u64,
            buf: Vec::with_capacity(Self::BUF),
        }
    }

    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.buf.len() + bytes.len() > self.buf.capacity() {
            self.flush()?;
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(&self.buf, self.at)?;
        self.at += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

/// The bytes behind a list: a `Vec` made in memory, or a read-only mapping of `senders.idx`.
pub type Backing = Box<dyn AsRef<[u8]> + Send + Sync>;

pub struct AllowList {
    backing: Backing,
    count: usize,
    keys: Range<usize>,
    ends: Range<usize>,
    names: Range<usize>,
    stamp: SourceStamp,
    /// Where each key id prefix starts: `buckets[j]` is the first sender whose key id's top `bucket_bits` bits are at
    /// least `j`, and the last entry is `count`. See [`AllowList::candidates`].
    buckets: Vec<SenderIndex>,
    bucket_bits: u32,
    /// The index by name, once made ([`AllowList::index_names`]).
    by_name: OnceLock<NameIndex>,
    /// Whether someone has taken on making [`AllowList::by_name`] ([`AllowList::claim_name_index`]).
    by_name_claimed: AtomicBool,
}

/// The hash of a name in a [`NameIndex`]: foldhash with a fixed seed (the senders file's duplicate check uses it
/// too, src/senders.rs). Nothing depends on it being unguessable: the names are the operator's own, and a file
/// made to give every name one hash only makes its lookups slower.
const NAME_HASH: foldhash::fast::FixedState =
    foldhash::fast::FixedState::with_seed(0x0046_0a3e_1dea_5eed);

/// Slots of a [`NameIndex`] per sender, as a fraction: 5/4, so a lookup of a name not listed probes about a dozen
/// slots at most on average (linear probing at a load of 0.8), all in one or two cache lines, and the index costs
/// 5 B per sender.
const NAME_SLOTS_NUM: usize = 5;
const NAME_SLOTS_DEN: usize = 4;

/// An open-addressing table of a list's senders by name (linear probing). A slot is 0 when empty, else the sender's
/// index + 1 in its low bits and, in the bits the index does not need, the top bits of the name's hash: a probe
/// compares a name only when those agree (one name in 4,096 at a million senders), so a lookup reads the table's
/// cache line and one name. Made once per list from its name arena, in one pass, with no allocation per sender.
pub struct NameIndex {
    slots: Box<[u32]>,
    /// Bits of a slot that hold the index + 1; the rest hold the hash's tag.
    index_mask: u32,
}

impl NameIndex {
    fn slot_of(&self, hash: u64) -> usize {
        // The hash's top bits scaled onto the table (Lemire's multiply-shift: any table size, no division).
        ((u128::from(hash) * self.slots.len() as u128) >> 64) as usize
    }

    fn tag_of(&self, hash: u64) -> u32 {
        // The hash's low bits, which `slot_of` hardly uses, above the index's bits.
        (hash as u32) & !self.index_mask
    }

    fn build(list: &AllowList) -> Self {
        use std::hash::BuildHasher;
        let count = list.count;
        let len = count * NAME_SLOTS_NUM / NAME_SLOTS_DEN + 1;
        // Bits for the values 1..=count; a list of 2^32 - 1 senders leaves no bits for the tag, and every probe
        // compares names.
        let index_bits = u32::BITS - (count as u32).leading_zeros();
        let index_mask = if index_bits >= u32::BITS {
            u32::MAX
        } else {
            (1u32 << index_bits) - 1
        };
        let mut index = NameIndex {
            slots: vec![0u32; len].into_boxed_slice(),
            index_mask,
        };
        for i in 0..count {
            let hash = NAME_HASH.hash_one(list.name_bytes(i as SenderIndex));
            let mut at = index.slot_of(hash);
            // `len` > `count`: an empty slot is always found.
            while index.slots[at] != 0 {
                at = if at + 1 == len { 0 } else { at + 1 };
            }
            index.slots[at] = index.tag_of(hash) | (i as u32 + 1);
        }
        index
    }

    fn find(&self, list: &AllowList, name: &[u8]) -> Option<SenderIndex> {
        use std::hash::BuildHasher;
        let hash = NAME_HASH.hash_one(name);
        let tag = self.tag_of(hash);
        let len = self.slots.len();
        let mut at = self.slot_of(hash);
        loop {
            let slot = self.slots[at];
            if slot == 0 {
                return None;
            }
            let index = (slot & self.index_mask) - 1;
            if slot & !self.index_mask == tag && list.name_bytes(index) == name {
                return Some(index);
            }
            at = if at + 1 == len { 0 } else { at + 1 };
        }
    }

    /// Heap bytes the index holds.
    pub fn byte_len(&self) -> usize {
        self.slots.len() * std::mem::size_of::<u32>()
    }
}

/// Senders per bucket of the key id table, about: the table costs 4 / this bytes of heap per sender (1 B; 0.5 MB for
/// a million), and a lookup searches this many keys (2 cache lines of the index).
const SENDERS_PER_BUCKET: usize = 4;

/// A prefix of at most this many bits: 16M buckets, enough for 64M senders.
const MAX_BUCKET_BITS: u32 = 24;

fn bucket_bits_for(count: usize) -> u32 {
    (count / SENDERS_PER_BUCKET)
        .checked_ilog2()
        .unwrap_or(0)
        .min(MAX_BUCKET_BITS)
}

fn bucket_of(key_id: u32, bits: u32) -> usize {
    // A shift by 32 is not defined for u32: widen first (bits = 0 is one bucket).
    (u64::from(key_id) >> (32 - bits)) as usize
}

impl std::fmt::Debug for AllowList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllowList")
            .field("count", &self.count)
            .finish()
    }
}

impl Default for AllowList {
    fn default() -> Self {
        Self::from_unique(Vec::new())
    }
}

impl AllowList {
    /// Encodes (name, key) pairs already known to have unique names and unique keys into the list's layout.
    pub fn encode(mut entries: Vec<(&str, PublicKeyBytes)>, stamp: SourceStamp) -> Vec<u8> {
        entries.sort_unstable_by_key(|e| e.1);
        let names_len = entries.iter().map(|(n, _)| n.len()).sum();
        Self::encode_sorted(
            entries.len(),
            names_len,
            stamp,
            entries.iter().map(|(n, k)| (n.as_bytes(), k)),
        )
    }

    /// Encodes `count` entries given in key order, whose names add up to `names_len` bytes.
    pub fn encode_sorted<'a>(
        count: usize,
        names_len: usize,
        stamp: SourceStamp,
        sorted: impl Iterator<Item = (&'a [u8], &'a PublicKeyBytes)>,
    ) -> Vec<u8> {
        let mut out = vec![0u8; Self::encoded_len(count, names_len)];
        Self::encode_sorted_into(count, names_len, stamp, sorted, &mut out);
        out
    }

    /// Bytes of the layout for `count` senders whose names take `names_len` bytes.
    pub fn encoded_len(count: usize, names_len: usize) -> usize {
        HEADER_LEN + 36 * count + names_len
    }

    /// [`AllowList::encode_sorted`] into `out`, which is exactly [`AllowList::encoded_len`] bytes. Names are bytes
    /// here (the senders file's parser checked them to be ASCII), so none is checked to be UTF-8 again.
    pub fn encode_sorted_into<'a>(
        count: usize,
        names_len: usize,
        stamp: SourceStamp,
        sorted: impl Iterator<Item = (&'a [u8], &'a PublicKeyBytes)>,
        out: &mut [u8],
    ) {
        let n = count;
        out[..HEADER_LEN].copy_from_slice(&Self::header(n, names_len, stamp));
        let (keys_at, ends_at, names_at) = (HEADER_LEN, HEADER_LEN + 32 * n, HEADER_LEN + 36 * n);
        let mut end = 0usize;
        for (i, (name, key)) in sorted.take(n).enumerate() {
            out[keys_at + 32 * i..keys_at + 32 * (i + 1)].copy_from_slice(key);
            out[names_at + end..names_at + end + name.len()].copy_from_slice(name);
            end += name.len();
            out[ends_at + 4 * i..ends_at + 4 * (i + 1)]
                .copy_from_slice(&(end as u32).to_le_bytes());
        }
    }

    /// The layout's first [`HEADER_LEN`] bytes for a list of `count` senders whose names take `names_len` bytes.
    fn header(count: usize, names_len: usize, stamp: SourceStamp) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&(count as u64).to_le_bytes());
        h[16..24].copy_from_slice(&(names_len as u64).to_le_bytes());
        stamp.write(&mut h[24..64]);
        h
    }

    /// [`AllowList::encode_sorted_into`] written into `file` with positional writes through three small buffers,
    /// one per section (keys, name ends, names), in one pass over `sorted`: the pages go to the page cache, where a
    /// mapping written in place would make every one of them resident in the writer (research/018).
    pub fn encode_sorted_to_file<'a>(
        count: usize,
        names_len: usize,
        stamp: SourceStamp,
        sorted: impl Iterator<Item = (&'a [u8], &'a PublicKeyBytes)> + Clone,
        file: &std::fs::File,
    ) -> std::io::Result<()> {
        Self::write_header_to_file(count, names_len, stamp, file)?;
        Self::write_keys_to_file(count, sorted.clone().map(|(_, k)| k), file)?;
        Self::write_names_to_file(count, sorted.map(|(n, _)| n), file)
    }

    /// The header of the layout, at the start of `file` (see [`AllowList::encode_sorted_to_file`]).
    pub fn write_header_to_file(
        count: usize,
        names_len: usize,
        stamp: SourceStamp,
        file: &std::fs::File,
    ) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        file.write_all_at(&Self::header(count, names_len, stamp), 0)
    }

    /// The keys section of a list of `count` senders, from the keys in order, into `file`. The sections are
    /// written apart so that the keys and the names can be written on two threads at once (research/027).
    pub fn write_keys_to_file<'a>(
        count: usize,
        keys: impl Iterator<Item = &'a PublicKeyBytes>,
        file: &std::fs::File,
    ) -> std::io::Result<()> {
        let mut section = Section::new(file, HEADER_LEN);
        for key in keys.take(count) {
            section.put(key)?;
        }
        section.flush()
    }

    /// The name ends and the names of a list of `count` senders, from the names in key order, into `file`.
    pub fn write_names_to_file<'a>(
        count: usize,
        names: impl Iterator<Item = &'a [u8]>,
        file: &std::fs::File,
    ) -> std::io::Result<()> {
        let mut ends = Section::new(file, HEADER_LEN + 32 * count);
        let mut arena = Section::new(file, HEADER_LEN + 36 * count);
        let mut end = 0u32;
        for name in names.take(count) {
            arena.put(name)?;
            end += name.len() as u32;
            ends.put(&end.to_le_bytes())?;
        }
        ends.flush()?;
        arena.flush()
    }

    /// Builds a list in memory from (name, key) pairs with unique names and keys.
    pub fn from_unique(entries: Vec<(String, PublicKeyBytes)>) -> Self {
        let bytes = Self::encode(
            entries.iter().map(|(n, k)| (n.as_str(), *k)).collect(),
            SourceStamp::default(),
        );
        // Just encoded by `encode`, so it is well formed.
        Self::from_backing(Box::new(bytes)).expect("an encoded list is well formed")
    }

    /// The stamp in a list's header (its first [`HEADER_LEN`] bytes), if they are a list's header: enough to tell
    /// whether a list was made from a file as it is now before the whole list is checked.
    pub fn header_stamp(header: &[u8]) -> Option<SourceStamp> {
        (header.len() >= HEADER_LEN && &header[0..8] == MAGIC)
            .then(|| SourceStamp::read(&header[24..64]))
    }

    /// Checks and adopts bytes in the list's layout (from memory or a mapped file). O(n) checks, no copies: a
    /// damaged file is refused here rather than trusted later.
    pub fn from_backing(backing: Backing) -> Result<Self, AllowListError> {
        let b = (*backing).as_ref();
        if b.len() < HEADER_LEN || &b[0..8] != MAGIC {
            return Err(AllowListError::Magic);
        }
        let count = le_u64(&b[8..16]);
        let names_len = le_u64(&b[16..24]);
        let expected = count
            .checked_mul(36)
            .and_then(|x| x.checked_add(names_len))
            .and_then(|x| x.checked_add(HEADER_LEN as u64));
        if expected != Some(b.len() as u64) || names_len > u32::MAX as u64 {
            return Err(AllowListError::Length {
                expected: expected.unwrap_or(u64::MAX),
                actual: b.len() as u64,
            });
        }
        let n = count as usize;
        let keys = HEADER_LEN..HEADER_LEN + 32 * n;
        let ends = keys.end..keys.end + 4 * n;
        let names = ends.end..b.len();
        let key_bytes = &b[keys.clone()];
        // One pass over the keys: their order, and where each bucket of key ids starts (`buckets[j]` is the first
        // sender whose bucket is at least `j`; the senders before `i` all have buckets below `buckets.len()`).
        let bucket_bits = bucket_bits_for(n);
        let mut buckets: Vec<SenderIndex> = Vec::with_capacity((1 << bucket_bits) + 1);
        for i in 0..n {
            let key = &key_bytes[32 * i..32 * (i + 1)];
            if i > 0 && key_bytes[32 * (i - 1)..32 * i] >= *key {
                return Err(AllowListError::Unsorted(i as u64));
            }
            let bucket = bucket_of(
                u32::from_be_bytes([key[0], key[1], key[2], key[3]]),
                bucket_bits,
            );
            while buckets.len() <= bucket {
                buckets.push(i as SenderIndex);
            }
        }
        buckets.resize((1 << bucket_bits) + 1, n as SenderIndex);
        let mut prev = 0u32;
        for i in 0..n {
            let at = ends.start + 4 * i;
            let end = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            if end < prev || end as u64 > names_len {
                return Err(AllowListError::Names(i as u64));
            }
            prev = end;
        }
        let stamp = SourceStamp::read(&b[24..64]);
        Ok(AllowList {
            backing,
            count: n,
            keys,
            ends,
            names,
            stamp,
            buckets,
            bucket_bits,
            by_name: OnceLock::new(),
            by_name_claimed: AtomicBool::new(false),
        })
    }

    fn bytes(&self) -> &[u8] {
        (*self.backing).as_ref()
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The file this list was made from, as it was then.
    pub fn stamp(&self) -> SourceStamp {
        self.stamp
    }

    fn key_id_at(&self, i: usize) -> u32 {
        let at = self.keys.start + 32 * i;
        let b = self.bytes();
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// Senders whose key id is `key_id`, as a range of indices (empty when none).
    ///
    /// Every first packet asks this, garbage with a listed key id included, so it is on a flood's path. A binary
    /// search over all the keys was 5–7 % of the receive loop under 100k forged packets a second (research/011): a
    /// cache and TLB miss into the mapped index at each of its last steps. The bucket table narrows the search to the
    /// few keys that share the id's top bits first. (An interpolating search was tried too, and was slower.)
    pub fn candidates(&self, key_id: u32) -> Range<SenderIndex> {
        // Lower bound, then upper bound, over the sorted key ids of the bucket.
        let j = bucket_of(key_id, self.bucket_bits);
        let (mut lo, mut hi) = (self.buckets[j] as usize, self.buckets[j + 1] as usize);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.key_id_at(mid) < key_id {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let start = lo;
        let mut end = start;
        while end < self.count && self.key_id_at(end) == key_id {
            end += 1;
        }
        start as SenderIndex..end as SenderIndex
    }

    /// The key of sender `index` (which must come from this list).
    pub fn key(&self, index: SenderIndex) -> &PublicKeyBytes {
        let at = self.keys.start + 32 * index as usize;
        self.bytes()[at..at + 32]
            .try_into()
            .expect("a 32-byte slice is a key")
    }

    fn name_end(&self, i: usize) -> usize {
        let at = self.ends.start + 4 * i;
        let b = self.bytes();
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
    }

    /// The bytes of sender `index`'s name, unchecked: for comparing many names fast (`pure-serve senders` sorts a
    /// million of them).
    pub fn name_bytes(&self, index: SenderIndex) -> &[u8] {
        let i = index as usize;
        let start = if i == 0 { 0 } else { self.name_end(i - 1) };
        let end = self.name_end(i);
        &self.bytes()[self.names.start + start..self.names.start + end]
    }

    /// The name of sender `index`. A name that is not UTF-8 (only possible in a damaged file) reads as "".
    pub fn name(&self, index: SenderIndex) -> &str {
        let i = index as usize;
        let start = if i == 0 { 0 } else { self.name_end(i - 1) };
        let end = self.name_end(i);
        std::str::from_utf8(&self.bytes()[self.names.start + start..self.names.start + end])
            .unwrap_or("")
    }

    /// Finds a sender by its key.
    pub fn find(&self, key: &PublicKeyBytes) -> Option<SenderIndex> {
        self.candidates(super::crypto::key_id(key))
            .find(|&i| self.key(i) == key)
    }

    /// Finds a sender by its name (a push names its sender): through the index by name if it has been made
    /// ([`AllowList::index_names`]), else by [`AllowList::scan_name`].
    pub fn find_name(&self, name: &str) -> Option<SenderIndex> {
        if name.is_empty() || self.count == 0 {
            return None;
        }
        match self.by_name.get() {
            Some(index) => index.find(self, name.as_bytes()),
            None => self.scan_name(name),
        }
    }

    /// Finds a sender by its name without the index: the name arena is searched with a vectorised substring search,
    /// and each hit is checked to be a whole name through the end offsets (which grow with the index). Linear in the
    /// arena's bytes, and no memory: for the lookups before the index is made.
    pub fn scan_name(&self, name: &str) -> Option<SenderIndex> {
        let needle = name.as_bytes();
        if needle.is_empty() || self.count == 0 {
            return None;
        }
        let arena = &self.bytes()[self.names.clone()];
        for at in memchr::memmem::find_iter(arena, needle) {
            // The first sender whose name ends after `at` is the one whose name holds the hit.
            let (mut lo, mut hi) = (0usize, self.count);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if self.name_end(mid) <= at {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            if lo >= self.count {
                break;
            }
            let start = if lo == 0 { 0 } else { self.name_end(lo - 1) };
            if start == at && self.name_end(lo) == at + needle.len() {
                return Some(lo as SenderIndex);
            }
        }
        None
    }

    /// Makes the index by name if it is not made yet, and returns it. One pass over the names (tens of
    /// milliseconds at a million senders): the caller decides on which thread (never the receive loop, which
    /// scans until the index is there; `common::push::find_name`).
    pub fn index_names(&self) -> &NameIndex {
        self.by_name.get_or_init(|| NameIndex::build(self))
    }

    /// The index by name, if it has been made.
    pub fn name_index(&self) -> Option<&NameIndex> {
        self.by_name.get()
    }

    /// True once per list: the caller that gets it makes the index ([`AllowList::index_names`]), so that callers
    /// that would rather not wait for it start it once between them.
    pub fn claim_name_index(&self) -> bool {
        !self.by_name_claimed.swap(true, Ordering::AcqRel)
    }

    /// Bytes of the list (mapped or in memory).
    pub fn byte_len(&self) -> usize {
        self.bytes().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_found_whole_never_inside_another() {
        let names = ["kitchen-10", "itchen-1", "kitchen-1", "k", "en-1k", "x"];
        let entries: Vec<(String, PublicKeyBytes)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut k = [0u8; 32];
                k[0] = 200 - i as u8;
                k[31] = 1;
                (n.to_string(), k)
            })
            .collect();
        let list = AllowList::from_unique(entries);
        // By the scan, then by the index.
        for indexed in [false, true] {
            if indexed {
                list.index_names();
            }
            for n in names {
                let i = list.find_name(n).unwrap_or_else(|| panic!("{n} not found"));
                assert_eq!(list.name(i), n);
            }
            for absent in ["kitchen", "itchen-10", "1", "kitchen-1k", "", "xx", "en-1"] {
                assert_eq!(list.find_name(absent), None, "{absent:?}");
            }
        }
        assert_eq!(AllowList::from_unique(Vec::new()).find_name("k"), None);
    }

    /// The index by name finds what the scan finds, for every name and for names not listed (which share their
    /// ends or beginnings with listed ones), in lists small enough that many names share a slot's neighbourhood.
    #[test]
    fn the_index_by_name_finds_what_the_scan_finds() {
        for n in [0u32, 1, 2, 3, 7, 300, 5000] {
            let entries: Vec<(String, PublicKeyBytes)> = (0..n)
                .map(|i| {
                    let mut k = [0u8; 32];
                    k[..4].copy_from_slice(&(i.wrapping_mul(2_654_435_761)).to_be_bytes());
                    k[31] = 1;
                    (format!("sensor-{i}"), k)
                })
                .collect();
            let list = AllowList::from_unique(entries);
            assert!(list.name_index().is_none(), "made only when asked for");
            let scanned: Vec<Option<SenderIndex>> = (0..n + 5)
                .map(|i| list.find_name(&format!("sensor-{i}")))
                .collect();
            let index = list.index_names();
            assert_eq!(index.byte_len(), 4 * (n as usize * 5 / 4 + 1));
            for (i, found) in scanned.iter().enumerate() {
                let name = format!("sensor-{i}");
                assert_eq!(list.find_name(&name), *found, "{name}");
                assert_eq!(found.is_some(), (i as u32) < n, "{name}");
                if let Some(at) = found {
                    assert_eq!(list.name(*at), name);
                }
            }
            for absent in ["sensor-", "ensor-1", "sensor-1x", "", "x"] {
                assert_eq!(list.find_name(absent), None, "{absent:?} in {n}");
            }
        }
    }

    #[test]
    fn the_index_is_claimed_once_per_list() {
        let list = AllowList::from_unique(vec![("a".into(), [1u8; 32])]);
        assert!(list.claim_name_index());
        assert!(!list.claim_name_index());
        assert!(AllowList::from_unique(Vec::new()).claim_name_index());
    }

    #[test]
    fn the_streamed_layout_is_the_one_written_in_place() {
        let mut entries: Vec<(String, PublicKeyBytes)> = (0..300u32)
            .map(|i| {
                let mut k = [0u8; 32];
                k[..4].copy_from_slice(&(i.wrapping_mul(2_654_435_761)).to_be_bytes());
                k[31] = 1;
                (format!("sender-{i}"), k)
            })
            .collect();
        entries.sort_by_key(|e| e.1);
        let names_len: usize = entries.iter().map(|(n, _)| n.len()).sum();
        let stamp = SourceStamp {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: 4,
            ctime_ns: 5,
        };
        let sorted = || entries.iter().map(|(n, k)| (n.as_bytes(), k));
        let mut in_place = vec![0u8; AllowList::encoded_len(entries.len(), names_len)];
        AllowList::encode_sorted_into(entries.len(), names_len, stamp, sorted(), &mut in_place);
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create_new(dir.path().join("idx")).unwrap();
        AllowList::encode_sorted_to_file(entries.len(), names_len, stamp, sorted(), &file).unwrap();
        let streamed = std::fs::read(dir.path().join("idx")).unwrap();
        assert_eq!(streamed, in_place);
        let list = AllowList::from_backing(Box::new(streamed)).unwrap();
        assert_eq!(list.stamp(), stamp);
        assert_eq!(
            list.find(&entries[7].1).map(|i| list.name(i)),
            Some(entries[7].0.as_str())
        );
    }

    #[test]
    fn candidates_find_every_key_with_the_id() {
        let mut a = [1u8; 32];
        let mut b = [1u8; 32];
        b[31] = 9;
        a[0] = 0;
        let c = [2u8; 32];
        let list = AllowList::from_unique(vec![
            ("c".into(), c),
            ("b".into(), b),
            ("a".into(), a),
            ("one".into(), [1u8; 32]),
        ]);
        let r = list.candidates(u32::from_be_bytes([1, 1, 1, 1]));
        assert_eq!(r.len(), 2);
        let names: Vec<_> = r.map(|i| list.name(i)).collect();
        assert!(names.contains(&"b") && names.contains(&"one"));
        assert_eq!(list.candidates(u32::from_be_bytes([0, 1, 1, 1])).len(), 1);
        assert_eq!(list.candidates(7).len(), 0);
        assert_eq!(list.candidates(u32::MAX).len(), 0);
        assert_eq!(list.name(list.candidates(0x02020202).start), "c");
        assert_eq!(list.find(&c).map(|i| list.name(i)), Some("c"));
        assert_eq!(list.find(&[9; 32]), None);
    }

    /// The search against a plain scan, for evenly spread ids and for ids that are not: clustered on a few prefixes,
    /// all equal, packed at the bottom, one far outlier.
    #[test]
    fn candidates_agree_with_a_scan_however_the_ids_are_spread() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // A shape makes the key id of sender `i` from a random number.
        type Shape = fn(u64, usize) -> u32;
        let shapes: [(&str, Shape); 5] = [
            ("even", |r, _| r as u32),
            ("clustered", |r, _| {
                ((r % 3) as u32) << 30 | (r >> 40) as u32 & 0xff
            }),
            ("equal", |_, _| 0x5555_5555),
            ("packed low", |_, i| i as u32 / 3),
            ("one outlier", |_, i| if i == 0 { u32::MAX } else { 7 }),
        ];
        for (shape, id_of) in shapes {
            for count in [0usize, 1, 2, 3, 17, 1000] {
                let entries: Vec<(String, PublicKeyBytes)> = (0..count)
                    .map(|i| {
                        let mut key = [0u8; 32];
                        for chunk in key.chunks_mut(8) {
                            chunk.copy_from_slice(&next().to_le_bytes());
                        }
                        key[..4].copy_from_slice(&id_of(next(), i).to_be_bytes());
                        key[31] = i as u8; // distinct keys even when the id and the random bytes repeat
                        key[30] = (i >> 8) as u8;
                        (format!("s{i}"), key)
                    })
                    .collect();
                let list = AllowList::from_unique(entries);
                let ids: Vec<u32> = (0..list.len()).map(|i| list.key_id_at(i)).collect();
                let mut probes: Vec<u32> = vec![0, 1, u32::MAX, u32::MAX - 1];
                for &id in &ids {
                    probes.extend([id, id.wrapping_add(1), id.wrapping_sub(1)]);
                }
                probes.extend((0..200).map(|_| next() as u32));
                for probe in probes {
                    let start = ids.partition_point(|&id| id < probe);
                    let end = ids.partition_point(|&id| id <= probe);
                    assert_eq!(
                        list.candidates(probe),
                        start as SenderIndex..end as SenderIndex,
                        "{shape}, {count} senders, key id {probe:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn damaged_bytes_are_refused_not_trusted() {
        let good = AllowList::encode(vec![("a", [1; 32]), ("b", [2; 32])], SourceStamp::default());
        assert!(AllowList::from_backing(Box::new(good.clone())).is_ok());
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(
            AllowList::from_backing(Box::new(bad)).unwrap_err(),
            AllowListError::Magic
        );
        let short = good[..good.len() - 1].to_vec();
        assert!(matches!(
            AllowList::from_backing(Box::new(short)),
            Err(AllowListError::Length { .. })
        ));
        let mut unsorted = good.clone();
        unsorted[HEADER_LEN..HEADER_LEN + 32].copy_from_slice(&[3; 32]);
        assert_eq!(
            AllowList::from_backing(Box::new(unsorted)).unwrap_err(),
            AllowListError::Unsorted(1)
        );
        let mut ends = good;
        let at = HEADER_LEN + 64;
        ends[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
        assert_eq!(
            AllowList::from_backing(Box::new(ends)).unwrap_err(),
            AllowListError::Names(0)
        );
    }
}

//! The allow-list: every sender the node accepts, in one compact immutable table.
//!
//! This is all the node holds in memory for an idle link (docs/protocol.md 6). Keys are kept sorted by their raw
//! bytes, which also sorts them by key id (the key id is the key's first four bytes), so finding the candidates
//! for a key id is a binary search over the key array itself with no separate index. Names live in one byte arena
//! with an end offset per sender. Per sender that is 32 + 4 bytes plus the name's bytes, in three allocations for
//! the whole list — no allocation per sender, so a million senders do not fragment the heap.

use super::crypto::PublicKeyBytes;

/// Position of a sender in an [`AllowList`]. Only meaningful for the list it came from.
pub type SenderIndex = u32;

#[derive(Debug, Default)]
pub struct AllowList {
    keys: Vec<PublicKeyBytes>,
    name_ends: Vec<u32>,
    names: Vec<u8>,
}

impl AllowList {
    /// Builds the list from (name, key) pairs that are already known to have unique names and keys.
    pub fn from_unique(mut entries: Vec<(String, PublicKeyBytes)>) -> Self {
        entries.sort_unstable_by_key(|e| e.1);
        let total: usize = entries.iter().map(|(n, _)| n.len()).sum();
        let mut list = AllowList {
            keys: Vec::with_capacity(entries.len()),
            name_ends: Vec::with_capacity(entries.len()),
            names: Vec::with_capacity(total),
        };
        for (name, key) in entries {
            list.names.extend_from_slice(name.as_bytes());
            list.name_ends.push(list.names.len() as u32);
            list.keys.push(key);
        }
        list
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Senders whose key id is `key_id`, as a range of indices (empty when none).
    pub fn candidates(&self, key_id: u32) -> std::ops::Range<SenderIndex> {
        let prefix = key_id.to_be_bytes();
        let start = self.keys.partition_point(|k| k[..4] < prefix[..]);
        let end = start + self.keys[start..].partition_point(|k| k[..4] == prefix[..]);
        start as SenderIndex..end as SenderIndex
    }

    pub fn key(&self, index: SenderIndex) -> &PublicKeyBytes {
        &self.keys[index as usize]
    }

    pub fn name(&self, index: SenderIndex) -> &str {
        let i = index as usize;
        let start = if i == 0 {
            0
        } else {
            self.name_ends[i - 1] as usize
        };
        let end = self.name_ends[i] as usize;
        // Names are pushed whole from `String`s, so every range between two ends is valid UTF-8.
        std::str::from_utf8(&self.names[start..end]).unwrap_or("")
    }

    /// Bytes of heap this list holds (capacity, not length), for memory reports.
    pub fn heap_bytes(&self) -> usize {
        self.keys.capacity() * 32 + self.name_ends.capacity() * 4 + self.names.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(list.name(list.candidates(0x02020202).start), "c");
    }
}

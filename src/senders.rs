//! The senders file: `NAME PUBLIC_KEY_BASE64` per line, `#` comments and blank lines (BRIEF.md, the interface).
//!
//! Parsing collects every problem rather than stopping at the first, so one run of the node (or of `check`) shows
//! the user all that is wrong with the file, each with its line number and a fix. It makes no allocation per line:
//! a million senders are parsed into a few flat arrays and encoded into the allow-list layout
//! ([`crate::proto::allow_list`]).
//!
//! The node keeps the encoded list in `STATE/senders.idx` and maps it ([`load_indexed`]): a restart with an
//! unchanged senders file reads nothing but the index's header, and idle senders cost page cache, not anonymous
//! memory (research/002).
//!
//! A start with a changed file of a million lines must be ready in 0.3 s (issue 17), so that path is lean
//! (research/027): a plain sender line is parsed as bytes, its key decoded by a table for the one form a 32-byte key
//! has in standard base64 (the `base64` crate's general decoder was 5 % of a start; anything else goes through the
//! crate, which says what is wrong); the key order and the duplicate checks bucket first and sort within buckets;
//! a big file is parsed in two halves, checked and written on two threads at once, with the memory of one; and the
//! new index is synced and renamed after the node serves from it ([`wait_index_synced`]).

use std::fmt;
use std::fs::File;
use std::io::{BufRead, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use thiserror::Error;

use crate::files::{self, FileError};
use crate::proto::allow_list::{AllowList, SourceStamp};
use crate::proto::crypto::{self, PublicKeyBytes};

/// Longest sender name; names are stored as the `source` of every record.
pub const MAX_NAME_LEN: usize = 64;

/// Longest line taken: a sender line is a name (64 bytes), a key (44) and perhaps a comment, so a line of 64 KiB
/// is no line of a senders file (a file without newlines, say); it is reported without being held in memory.
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// Problems beyond this many are summarised, so a wholly wrong file does not flood the terminal.
const MAX_REPORTED: usize = 20;

/// Senders from which the checks and the writing of the index use a second core (a thread costs ~50 µs to start).
const PARALLEL_FROM: usize = 4096;

/// A short-lived helper thread of reading a senders file, beside the one reading it (at start, the main thread;
/// on reload, `pure-reload`).
fn helper() -> std::thread::Builder {
    std::thread::Builder::new().name("pure-senders".into())
}

/// File name of the mapped allow-list under the state directory.
pub const INDEX_FILE: &str = "senders.idx";

#[derive(Debug)]
pub struct LineProblem {
    pub line: usize,
    pub what: String,
}

#[derive(Debug, Error)]
pub enum SendersError {
    /// Not a regular file, too big, or unreadable (crate::files).
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{}", BadLines(path, problems, *more))]
    Bad {
        path: PathBuf,
        problems: Vec<LineProblem>,
        more: usize,
    },
    #[error("senders file {path} has {count} senders; at most {max} fit in one list")]
    TooMany {
        path: PathBuf,
        count: usize,
        max: usize,
    },
}

struct BadLines<'a>(&'a Path, &'a [LineProblem], usize);

impl fmt::Display for BadLines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.1.len() + self.2;
        write!(
            f,
            "senders file {} has {n} bad line{}",
            self.0.display(),
            if n == 1 { "" } else { "s" }
        )?;
        for p in self.1 {
            write!(f, "\n  {}:{}: {}", self.0.display(), p.line, p.what)?;
        }
        if self.2 > 0 {
            write!(f, "\n  … and {} more", self.2)?;
        }
        write!(
            f,
            "\n  each line is `NAME PUBLIC_KEY_BASE64` (make a key pair with `pure-serve keygen --out FILE`)"
        )
    }
}

/// Whether `name` is a valid sender name: 1–64 of letters, digits and `._:@-` (also used by the apps file's `accept`).
pub fn valid_name(name: &str) -> bool {
    valid_name_bytes(name.as_bytes())
}

/// What is wrong with `name` as a sender name, as a senders file's line problem says it, or `None` when it is a
/// valid one ([`valid_name`]); also used by `keygen --many` for the names it makes.
pub fn name_problem(name: &str) -> Option<String> {
    (!valid_name(name)).then(|| {
        format!(
            "name {} is not 1–{MAX_NAME_LEN} characters of letters, digits and . _ : @ -",
            shown(name)
        )
    })
}

fn valid_name_bytes(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && name.iter().all(|&b| NAME_BYTES[b as usize])
}

/// Which bytes a name may have: letters, digits and `._:@-` (a table: a million names are checked at a start).
const NAME_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'@' | b'-');
        b += 1;
    }
    t
};

/// The name and key of a line that is exactly a good sender — a valid name, ASCII white space, and a key in the one
/// form a 32-byte key takes in standard base64 (43 characters and `=`) that is neither all zeros nor a low-order
/// point — or `None`, and then [`Parser::line`] checks the line in full to say what is wrong. Nearly every line of
/// a big file is one of these, so they are taken as bytes, without `from_utf8` or the base64 crate's general
/// decoder (research/027: 0.18 s of a start with a million lines went on parsing them).
fn plain_sender(content: &[u8]) -> Option<(&[u8], PublicKeyBytes)> {
    let name_len = content.iter().position(u8::is_ascii_whitespace)?;
    let (name, rest) = content.split_at(name_len);
    if !valid_name_bytes(name) {
        return None;
    }
    let key = decode_key(rest.trim_ascii_start())?;
    if key == [0u8; 32] || crypto::is_low_order(&key) {
        return None;
    }
    Some((name, key))
}

/// Standard base64 value of each byte, or `INVALID`.
const BASE64_VALUES: [u8; 256] = {
    const INVALID: u8 = 0xff;
    let mut t = [INVALID; 256];
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut i = 0;
    while i < 64 {
        t[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// A 32-byte key from exactly its canonical standard base64 (44 bytes: 43 characters, the last with its two
/// unused bits zero, then `=`), the only text the base64 crate's `STANDARD` decodes to 32 bytes; anything else is
/// `None` (the crate then says what is wrong). Written here because the general decoder was 5 % of a start with a
/// million lines (research/027); `plain_sender_keys_are_what_base64_decodes` checks it against the crate.
fn decode_key(text: &[u8]) -> Option<PublicKeyBytes> {
    let text: &[u8; 44] = text.try_into().ok()?;
    if text[43] != b'=' {
        return None;
    }
    let mut key = [0u8; 32];
    let mut bad = 0u8;
    let v = |i: usize, bad: &mut u8| {
        let x = BASE64_VALUES[text[i] as usize];
        *bad |= x;
        u32::from(x)
    };
    for g in 0..10 {
        let at = 4 * g;
        let n = v(at, &mut bad) << 18
            | v(at + 1, &mut bad) << 12
            | v(at + 2, &mut bad) << 6
            | v(at + 3, &mut bad);
        key[3 * g..3 * g + 3].copy_from_slice(&n.to_be_bytes()[1..]);
    }
    let n = v(40, &mut bad) << 18 | v(41, &mut bad) << 12 | v(42, &mut bad) << 6;
    // A valid value is below 64: any invalid one (0xff) sets the top bits.
    if bad & 0xc0 != 0 || n & 0xff != 0 {
        return None;
    }
    key[30..32].copy_from_slice(&n.to_be_bytes()[1..3]);
    Some(key)
}

/// Reads and checks a senders file into an in-memory list (for `check`, tests, and when no index can be kept).
pub fn load(path: &Path) -> Result<AllowList, SendersError> {
    let file = files::open(path, &files::SENDERS)?;
    let sorted = read_sorted(path, file)?;
    let mut bytes = vec![0u8; sorted.encoded_len()];
    sorted.write(SourceStamp::default(), &mut bytes);
    drop(sorted);
    Ok(AllowList::from_backing(Box::new(bytes)).expect("a freshly encoded list is well formed"))
}

/// Files of at least this many bytes are read and parsed in two halves on two threads: below it a thread costs more
/// than it saves.
const HALVES_FROM_BYTES: u64 = 1 << 20;

/// Reads an opened senders file line by line into the parser's flat arrays, and checks and sorts it: the text is
/// never held whole (issue 8, item 7), and at most the file's limit is read (crate::files). A big file is read and
/// parsed in two halves at once, one per core, and the halves joined before the checks, so the result and every
/// problem with its line are as from one pass (research/023 tried this first, when the parse was slower and the
/// rest of the work larger, and measured no gain at loads 3–5; research/027 brought it back).
fn read_sorted(path: &Path, file: files::Opened) -> Result<Sorted, SendersError> {
    let started = Instant::now();
    let len = file.metadata().len();
    let mut parser = Parser::with_capacity((len / 46) as usize + 1);
    let split = if len >= HALVES_FROM_BYTES {
        split_at_line(&file, len)
    } else {
        None
    };
    let second = match split {
        Some(at) => Some((
            at,
            file.reader_from(at).map_err(|e| files::FileError::Read {
                spec: &files::SENDERS,
                path: path.to_path_buf(),
                source: e,
            })?,
        )),
        None => None,
    };
    let mut reader = file.reader();
    let Some((at, mut tail)) = second else {
        let mut buffered = std::io::BufReader::with_capacity(1 << 20, &mut reader);
        let read = read_lines(&mut buffered, &mut parser);
        drop(buffered);
        read.map_err(|e| reader.error(e))?;
        reader.finish()?;
        let parse = started.elapsed();
        let mut sorted = parser.finish(path)?;
        sorted.took.parse = parse;
        return Ok(sorted);
    };
    let (first, second) = {
        // Behind a lock only so that this thread can read it if no helper thread can be started.
        let tail_reader = Mutex::new(&mut tail);
        let read_tail = || {
            let mut tail = tail_reader.lock().unwrap_or_else(PoisonError::into_inner);
            // Sized for its half; its lines are numbered from 1 and renumbered when the halves are joined.
            let mut parser = Parser::with_capacity(((len - at) / 46) as usize + 1);
            parser.strip_bom = false;
            let mut buffered = std::io::BufReader::with_capacity(1 << 19, &mut **tail);
            read_lines(&mut buffered, &mut parser).map(|()| parser)
        };
        std::thread::scope(|s| {
            let beside = helper().spawn_scoped(s, read_tail);
            let mut head = (&mut reader).take(at);
            let mut buffered = std::io::BufReader::with_capacity(1 << 19, &mut head);
            let read = read_lines(&mut buffered, &mut parser);
            drop(buffered);
            let second = match beside {
                Ok(thread) => thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => read_tail(),
            };
            (read, second)
        })
    };
    first.map_err(|e| reader.error(e))?;
    reader.finish()?;
    let second = second.map_err(|e| tail.error(e))?;
    tail.finish()?;
    parser.append(second);
    let parse = started.elapsed();
    let mut sorted = parser.finish(path)?;
    sorted.took.parse = parse;
    Ok(sorted)
}

/// Where the second half of a file starts: just after the first `\n` at or past its middle, or `None` when no
/// line ends within [`MAX_LINE_BYTES`] of the middle (then the file is parsed in one pass).
fn split_at_line(file: &files::Opened, len: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mid = len / 2;
    let mut buf = vec![0u8; 64 << 10];
    let mut at = mid;
    while at < len && at - mid <= MAX_LINE_BYTES as u64 {
        let n = file.file().read_at(&mut buf, at).ok()?;
        if n == 0 {
            return None;
        }
        if let Some(i) = memchr::memchr(b'\n', &buf[..n]) {
            return Some(at + i as u64 + 1).filter(|&s| s < len);
        }
        at += n as u64;
    }
    None
}

/// Appends `src` to `dst` through `map`, a block at a time, giving the pages of each copied block of `src` back to
/// the system as it goes: `dst`'s new pages become resident as `src`'s are released, so the copy raises the
/// resident size by one block, not by the whole of `src` (the reload's peak, research/018).
fn append_releasing<T: Copy>(dst: &mut Vec<T>, src: Vec<T>, map: impl Fn(T) -> T) {
    const BLOCK_BYTES: usize = 1 << 20;
    let per_block = (BLOCK_BYTES / std::mem::size_of::<T>().max(1)).max(1);
    dst.reserve(src.len());
    let page = 4096usize;
    let base = src.as_ptr() as usize;
    let mut released = base.next_multiple_of(page);
    let ptr = src.as_ptr();
    let mut start = 0;
    while start < src.len() {
        let stop = (start + per_block).min(src.len());
        // SAFETY: `start..stop` is within `src`, whose buffer is alive until the drop below; it is read through
        // the raw pointer only, so no reference into it is held while its pages are released.
        dst.extend((start..stop).map(|i| map(unsafe { ptr.add(i).read() })));
        let end = (base + stop * std::mem::size_of::<T>()) / page * page;
        if end > released {
            // SAFETY: `released..end` is whole pages inside `src`'s buffer (rounded in from both ends) that are
            // read no more. MADV_DONTNEED on private anonymous memory keeps the range mapped and makes it read
            // back as zeros, a valid value of the plain `Copy` data appended here (keys, bytes, offsets), and
            // the allocator's own bookkeeping lies outside the rounded range.
            unsafe {
                libc::madvise(
                    released as *mut libc::c_void,
                    end - released,
                    libc::MADV_DONTNEED,
                )
            };
            released = end;
        }
        start = stop;
    }
    drop(src);
}

/// Feeds every line of `text` to the parser, each without its `\n`; a line longer than [`MAX_LINE_BYTES`] is
/// counted and reported, and not kept. Lines wholly inside the reader's buffer are parsed where they lie; only a
/// line cut by the buffer's end is copied.
fn read_lines(text: &mut impl BufRead, parser: &mut Parser) -> std::io::Result<()> {
    let mut line = Vec::with_capacity(256);
    let mut too_long = false;
    loop {
        let buf = text.fill_buf()?;
        if buf.is_empty() {
            if too_long {
                parser.too_long_line();
            } else if !line.is_empty() {
                parser.line(&line);
            }
            return Ok(());
        }
        if line.is_empty() && !too_long {
            let mut start = 0;
            for end in memchr::memchr_iter(b'\n', buf) {
                let whole = &buf[start..end];
                if whole.len() > MAX_LINE_BYTES {
                    parser.too_long_line();
                } else {
                    parser.line(whole);
                }
                start = end + 1;
            }
            if start > 0 {
                text.consume(start);
                continue;
            }
        }
        let (part, end, used) = match memchr::memchr(b'\n', buf) {
            Some(at) => (&buf[..at], true, at + 1),
            None => (buf, false, buf.len()),
        };
        if !too_long {
            if line.len() + part.len() > MAX_LINE_BYTES {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(part);
            }
        }
        text.consume(used);
        if end {
            if too_long {
                parser.too_long_line();
            } else {
                parser.line(&line);
            }
            line.clear();
            too_long = false;
        }
    }
}

/// Parses the text of a senders file; `path` is only used in messages.
pub fn parse(path: &Path, text: &[u8]) -> Result<AllowList, SendersError> {
    let bytes = encode(path, text, SourceStamp::default())?;
    Ok(AllowList::from_backing(Box::new(bytes)).expect("a freshly encoded list is well formed"))
}

/// A name as a message shows it: quoted, and cut after 40 characters (a 10 kB line is not echoed whole).
fn shown(name: &str) -> String {
    const SHOWN: usize = 40;
    match name.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{:?}… ({} bytes)", &name[..at], name.len()),
        None => format!("{name:?}"),
    }
}

/// The hash that brings equal names next to each other (equality is then checked in full): foldhash, already in the
/// tree through hashbrown, with a fixed seed, since nothing depends on it being unguessable (a file made to give
/// every name one hash is only slower to check). FNV-1a, a byte at a time, was slower on names of 10 bytes.
const NAME_HASH: foldhash::fast::FixedState =
    foldhash::fast::FixedState::with_seed(0x0005_eed0_f5e4_de75);

/// Parses a senders file and encodes it in the allow-list layout, or reports every bad line.
pub fn encode(path: &Path, text: &[u8], stamp: SourceStamp) -> Result<Vec<u8>, SendersError> {
    let mut parser = Parser::with_capacity(text.len() / 46 + 1);
    let mut text = text;
    read_lines(&mut text, &mut parser).expect("reading a slice cannot fail");
    let sorted = parser.finish(path)?;
    let mut out = vec![0u8; sorted.encoded_len()];
    sorted.write(stamp, &mut out);
    Ok(out)
}

/// The senders file read line by line into flat arrays: one key of 32 bytes, one name in a shared byte arena and
/// one line number per sender, and the problems found. Nothing per line is allocated, and the text itself is not
/// kept: a reload of a big file holds the arrays, not the file (issue 8, item 7).
struct Parser {
    keys: Vec<PublicKeyBytes>,
    /// Every name, one after another; `name_ends[i]` is where the i-th ends.
    names: Vec<u8>,
    name_ends: Vec<u32>,
    lines: Vec<u32>,
    problems: Vec<LineProblem>,
    /// Lines seen so far.
    line: usize,
    /// Set when the names outgrow the layout's 4-byte offsets (more than 4 GiB of names).
    too_many: bool,
    /// Whether a byte order mark is taken off the first line: not in the second half of a file.
    strip_bom: bool,
}

/// At most this many bits choose a bucket in [`scatter`]: 65,536 buckets (256 KB of counts), about 15 senders each
/// at a million.
const MAX_BUCKET_BITS: u32 = 16;

/// Bits of bucket for `n` items: about one bucket per item up to [`MAX_BUCKET_BITS`].
fn bucket_bits(n: usize) -> u32 {
    n.max(1).ilog2().min(MAX_BUCKET_BITS)
}

/// The items `item(i)` of `0..n` grouped by bucket `bucket(i)` (below `1 << bits`), in index order within each,
/// and where each bucket starts (`starts[b]..starts[b + 1]`). Two passes over the indices in order (a count and a
/// scatter), so whatever `bucket` and `item` read is read in file order; `item` gives the bucket too, so that what
/// both need is computed once in the second pass.
fn scatter<T: Copy + Default>(
    n: usize,
    bits: u32,
    bucket: impl Fn(usize) -> usize,
    item: impl Fn(usize) -> (usize, T),
) -> (Vec<T>, Vec<u32>) {
    // `starts[b + 1]` counts bucket b, then is summed into where bucket b + 1 starts; during the scatter
    // `starts[b]` is bucket b's next free place, after it where bucket b + 1 starts: shifted back at the end.
    let mut starts = vec![0u32; (1 << bits) + 1];
    for i in 0..n {
        starts[bucket(i) + 1] += 1;
    }
    for b in 1..starts.len() {
        starts[b] += starts[b - 1];
    }
    let mut items = vec![T::default(); n];
    for i in 0..n {
        let (b, it) = item(i);
        items[starts[b] as usize] = it;
        starts[b] += 1;
    }
    starts.rotate_right(1);
    starts[0] = 0;
    (items, starts)
}

/// Buckets of [`order_by_key`] bigger than this are sorted without a scratch copy (only a crafted file has them).
const BIG_BUCKET: usize = 4096;

/// The indices `0..keys.len()` in key order (equal keys in index order), and each pair of equal keys side by side
/// in it as (earlier index, later index).
///
/// The indices are bucketed by the keys' first 16 bits ([`scatter`]), then each bucket is sorted by whole key. A
/// least-significant-byte-first radix sort of the permutation took 8 passes, each reading the 32 MB of keys in
/// random order twice: at a million senders it was the largest part of a start (research/027). Keys are public
/// keys, so the buckets are even; a file made to put every key in one bucket only makes that bucket a comparison
/// sort of them all, O(n log n) still. Memory: the order (4 B per sender) and the counts (256 KB), where the radix
/// sort had a scratch copy of the order too.
fn order_by_key(keys: &[PublicKeyBytes]) -> (Vec<u32>, Vec<(u32, u32)>) {
    let bits = bucket_bits(keys.len());
    let bucket = |i: usize| {
        let k = &keys[i];
        (u64::from(u32::from_be_bytes([k[0], k[1], k[2], k[3]])) >> (32 - bits)) as usize
    };
    let (mut order, starts) = scatter(keys.len(), bits, bucket, |i| (bucket(i), i as u32));
    let mut equal = Vec::new();
    // A bucket's (first 8 bytes, index) pairs: each key is read once, in a loop of independent loads, and sorted
    // in the cache; only equal 8-byte starts (in practice only equal keys) are compared whole.
    let mut pairs: Vec<(u64, u32)> = Vec::new();
    let whole = |x: &u32, y: &u32| keys[*x as usize].cmp(&keys[*y as usize]).then(x.cmp(y));
    // Equal keys are side by side in a sorted span, in index order.
    let pair_equal = |span: &[u32], equal: &mut Vec<(u32, u32)>| {
        for w in span.windows(2) {
            if keys[w[0] as usize] == keys[w[1] as usize] {
                equal.push((w[0], w[1]));
            }
        }
    };
    for b in 0..starts.len() - 1 {
        let span = &mut order[starts[b] as usize..starts[b + 1] as usize];
        if span.len() < 2 {
            continue;
        }
        if span.len() > BIG_BUCKET {
            // Not the buckets of public keys: no scratch in proportion to a crafted file's bucket.
            span.sort_unstable_by(whole);
            pair_equal(span, &mut equal);
        } else {
            pairs.clear();
            pairs.extend(span.iter().map(|&i| {
                let k = &keys[i as usize];
                (
                    u64::from_be_bytes([k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]]),
                    i,
                )
            }));
            pairs.sort_unstable();
            for (o, p) in span.iter_mut().zip(&pairs) {
                *o = p.1;
            }
            let mut at = 0;
            while at < pairs.len() {
                let end = at
                    + pairs[at..]
                        .iter()
                        .take_while(|p| p.0 == pairs[at].0)
                        .count();
                if end - at > 1 {
                    span[at..end].sort_unstable_by(whole);
                    pair_equal(&span[at..end], &mut equal);
                }
                at = end;
            }
        }
    }
    (order, equal)
}

/// A parsed, checked list in key order, ready to be written in the allow-list layout.
struct Sorted {
    parser: Parser,
    /// Sender indices in key order.
    order: Vec<u32>,
    took: Took,
}

/// How long each step of reading a senders file took: logged at debug level, so a start can be timed step by step
/// without a profiler (research/027).
#[derive(Debug, Default, Clone, Copy)]
struct Took {
    /// Reading and parsing the lines.
    parse: Duration,
    /// The duplicate-name check.
    names: Duration,
    /// The key order and the duplicate-key check.
    keys: Duration,
    /// Writing the index (its sync is after, on `pure-index-sync`).
    write: Duration,
    /// Mapping the new index and checking it.
    map: Duration,
}

impl Took {
    fn log(&self, senders: usize) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        tracing::debug!(
            senders,
            parse_ms = ms(self.parse),
            names_ms = ms(self.names),
            keys_ms = ms(self.keys),
            write_ms = ms(self.write),
            map_ms = ms(self.map),
            "senders file read and indexed"
        );
    }
}

impl Parser {
    fn with_capacity(senders: usize) -> Self {
        Parser {
            keys: Vec::with_capacity(senders),
            names: Vec::with_capacity(senders * 12),
            name_ends: Vec::with_capacity(senders),
            lines: Vec::with_capacity(senders),
            problems: Vec::new(),
            line: 0,
            too_many: false,
            strip_bom: true,
        }
    }

    /// Appends the parse of the lines that follow this one's (the second half of the file), renumbering its lines
    /// and name offsets. Each array of `next` is copied into this one's spare room (sized for the whole file) a
    /// block at a time, and the block's pages given back as it goes, so the join holds no second copy of the
    /// halves' keys (the reload's peak, research/018 and 023).
    fn append(&mut self, next: Parser) {
        let lines = u32::try_from(self.line).unwrap_or(u32::MAX);
        let names = u32::try_from(self.names.len()).ok();
        let Parser {
            keys,
            names: next_names,
            name_ends,
            lines: next_lines,
            problems,
            line,
            too_many,
            strip_bom: _,
        } = next;
        append_releasing(&mut self.keys, keys, |k| k);
        match names.and_then(|base| {
            let last = name_ends.last().copied().unwrap_or(0);
            base.checked_add(last).map(|_| base)
        }) {
            Some(base) => append_releasing(&mut self.name_ends, name_ends, |e| e + base),
            None => self.too_many = true,
        }
        append_releasing(&mut self.names, next_names, |b| b);
        append_releasing(&mut self.lines, next_lines, |l| l.saturating_add(lines));
        self.problems
            .extend(problems.into_iter().map(|p| LineProblem {
                line: p.line + self.line,
                what: p.what,
            }));
        self.line += line;
        self.too_many |= too_many;
    }

    /// The name of sender `i`, as bytes: hashed, compared and written as such, since only names that passed
    /// `valid_name_bytes` (ASCII) are pushed.
    fn name_bytes(&self, i: usize) -> &[u8] {
        let start = if i == 0 {
            0
        } else {
            self.name_ends[i - 1] as usize
        };
        &self.names[start..self.name_ends[i] as usize]
    }

    /// The name of sender `i`, for messages.
    fn name(&self, i: usize) -> &str {
        std::str::from_utf8(self.name_bytes(i)).unwrap_or("")
    }

    /// Counts a line longer than [`MAX_LINE_BYTES`] and reports it.
    fn too_long_line(&mut self) {
        self.line += 1;
        self.problems.push(LineProblem {
            line: self.line,
            what: format!(
                "is longer than {MAX_LINE_BYTES} bytes, which no sender line is (a name, a key and perhaps a \
                 comment): is this the senders file?"
            ),
        });
    }

    /// Takes a sender whose name and key passed their checks.
    fn push(&mut self, name: &[u8], key: PublicKeyBytes, line: usize) {
        let end = self.names.len() + name.len();
        let Ok(end) = u32::try_from(end) else {
            self.too_many = true;
            return;
        };
        self.keys.push(key);
        self.names.extend_from_slice(name);
        self.name_ends.push(end);
        self.lines.push(u32::try_from(line).unwrap_or(u32::MAX));
    }

    /// Takes the next line of the file (without its `\n`).
    fn line(&mut self, raw: &[u8]) {
        self.line += 1;
        let line = self.line;
        // A byte order mark some editors put first is not part of the first name.
        let raw = if line == 1 && self.strip_bom {
            raw.strip_prefix(b"\xef\xbb\xbf").unwrap_or(raw)
        } else {
            raw
        };
        let content = match memchr::memchr(b'#', raw) {
            Some(at) => &raw[..at],
            None => raw,
        };
        let content = content.trim_ascii();
        if content.is_empty() {
            return;
        }
        if let Some((name, key)) = plain_sender(content) {
            self.push(name, key, line);
            return;
        }
        // Not a plain sender line: the same checks in full, to say what is wrong.
        let Ok(content) = std::str::from_utf8(content) else {
            self.problems.push(LineProblem {
                line,
                what: "is not UTF-8 text".into(),
            });
            return;
        };
        let mut fields = content.split_ascii_whitespace();
        let (Some(name), Some(key), None) = (fields.next(), fields.next(), fields.next()) else {
            let n = content.split_ascii_whitespace().count();
            self.problems.push(LineProblem {
                line,
                what: format!(
                    "has {n} field{}, expected 2: a name and a base64 public key",
                    if n == 1 { "" } else { "s" }
                ),
            });
            return;
        };
        if let Some(what) = name_problem(name) {
            self.problems.push(LineProblem { line, what });
            return;
        }
        let mut key_buf = [0u8; 48];
        let what = match STANDARD.decode_slice(key, &mut key_buf) {
            Ok(32) if key_buf[..32] == [0u8; 32] => format!(
                "public key of {name} is all zeros, which no key pair has; copy the key again"
            ),
            Ok(32) if crypto::is_low_order(key_buf[..32].try_into().expect("32 bytes")) => format!(
                "public key of {name} is a low-order point, which no key pair has (X25519 with it is all zeros); \
                 copy the key again"
            ),
            Ok(32) => {
                let mut k = [0u8; 32];
                k.copy_from_slice(&key_buf[..32]);
                self.push(name.as_bytes(), k, line);
                return;
            }
            Ok(n) => format!("public key of {name} decodes to {n} bytes, a key is 32 bytes"),
            Err(base64::DecodeSliceError::OutputSliceTooSmall) => {
                format!("public key of {name} is too long: a key is 44 characters of base64")
            }
            Err(_) => match crate::keys::base64_shape_problem(key) {
                Some(shape) => format!("public key of {name} {shape}"),
                None => format!("public key of {name} is not valid base64"),
            },
        };
        self.problems.push(LineProblem { line, what });
    }

    /// Each pair of senders with the same name, as (earlier index, later index), a name's third sender paired with
    /// its second.
    ///
    /// Equal names have equal hashes, so the names are first told apart by hash alone: 48 bits of each name's hash,
    /// bucketed by 16 of them ([`scatter`], which hashes every name twice rather than hold a second array) and the
    /// other 32 sorted within each bucket — 4 bytes per sender, read in file order. Only names whose hash another
    /// name has too (the repeated names, and by chance about one pair in 500 files of a million) are then looked
    /// up in one more pass and compared whole. A comparison sort of (hash, index) pairs of every name, 8 bytes per
    /// sender, was 50 ms of a start at a million senders (research/027). A file made to give its names one hash
    /// only makes a bucket a comparison sort of them all.
    fn duplicate_names(&self) -> Vec<(u32, u32)> {
        use std::hash::BuildHasher;
        self.duplicate_names_by(|name| NAME_HASH.hash_one(name))
    }

    /// [`Parser::duplicate_names`] with any hash (tests give it one that collides).
    fn duplicate_names_by(&self, hash: impl Fn(&[u8]) -> u64) -> Vec<(u32, u32)> {
        let n = self.name_ends.len();
        let bits = bucket_bits(n);
        let hash = |i: usize| hash(self.name_bytes(i));
        let bucket_of = |h: u64| (h >> 32 >> (32 - bits)) as usize;
        // The 48 bits compared: the bucket's and the low 32.
        let key = |h: u64| (bucket_of(h) as u64) << 32 | (h & 0xffff_ffff);
        let (mut low, starts) = scatter(
            n,
            bits,
            |i| bucket_of(hash(i)),
            |i| {
                let h = hash(i);
                (bucket_of(h), h as u32)
            },
        );
        let mut shared = Vec::new();
        for b in 0..starts.len() - 1 {
            let span = &mut low[starts[b] as usize..starts[b + 1] as usize];
            if span.len() < 2 {
                continue;
            }
            span.sort_unstable();
            for w in span.windows(2) {
                if w[0] == w[1] && shared.last() != Some(&((b as u64) << 32 | u64::from(w[0]))) {
                    shared.push((b as u64) << 32 | u64::from(w[0]));
                }
            }
        }
        drop(low);
        if shared.is_empty() {
            return Vec::new();
        }
        // `shared` is in order: by bucket, then by the low bits.
        let mut same_hash: Vec<(u64, u32)> = (0..n)
            .filter_map(|i| {
                let k = key(hash(i));
                shared.binary_search(&k).is_ok().then_some((k, i as u32))
            })
            .collect();
        same_hash.sort_unstable_by(|x, y| {
            x.0.cmp(&y.0)
                .then_with(|| {
                    self.name_bytes(x.1 as usize)
                        .cmp(self.name_bytes(y.1 as usize))
                })
                .then(x.1.cmp(&y.1))
        });
        same_hash
            .windows(2)
            .filter(|w| {
                w[0].0 == w[1].0
                    && self.name_bytes(w[0].1 as usize) == self.name_bytes(w[1].1 as usize)
            })
            .map(|w| (w[0].1, w[1].1))
            .collect()
    }

    /// Checks duplicates and sorts by key, or reports every problem.
    fn finish(mut self, path: &Path) -> Result<Sorted, SendersError> {
        let n = self.keys.len();
        if self.too_many || n > u32::MAX as usize {
            return Err(SendersError::TooMany {
                path: path.to_path_buf(),
                count: n,
                max: u32::MAX as usize,
            });
        }
        // The duplicate-name check and the key order are independent: on two cores at once for a big file. The
        // peak stays that of one: 4 bytes per sender each (research/027).
        let this = &self;
        let (same_names, names, (order, same_keys), keys) = std::thread::scope(|s| {
            let check_names = move || {
                let started = Instant::now();
                (this.duplicate_names(), started.elapsed())
            };
            let beside = (n >= PARALLEL_FROM)
                .then(|| helper().spawn_scoped(s, check_names).ok())
                .flatten();
            let started = Instant::now();
            let ordered = order_by_key(&this.keys);
            let keys = started.elapsed();
            let (same_names, names) = match beside {
                Some(thread) => thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                None => check_names(),
            };
            (same_names, names, ordered, keys)
        });
        for (first, dup) in same_names {
            let (first, dup) = (first as usize, dup as usize);
            self.problems.push(LineProblem {
                line: self.lines[dup] as usize,
                what: format!(
                    "duplicate name {}: line {} already has it; each sender needs its own name",
                    self.name(dup),
                    self.lines[first]
                ),
            });
        }
        for (first, dup) in same_keys {
            let (first, dup) = (first as usize, dup as usize);
            self.problems.push(LineProblem {
                line: self.lines[dup] as usize,
                what: format!(
                    "duplicate key: line {} ({}) has the same public key; each sender needs its own key pair",
                    self.lines[first],
                    self.name(first)
                ),
            });
        }
        if !self.problems.is_empty() {
            let mut problems = std::mem::take(&mut self.problems);
            problems.sort_by_key(|p| p.line);
            let more = problems.len().saturating_sub(MAX_REPORTED);
            problems.truncate(MAX_REPORTED);
            return Err(SendersError::Bad {
                path: path.to_path_buf(),
                problems,
                more,
            });
        }
        Ok(Sorted {
            parser: self,
            order,
            took: Took {
                names,
                keys,
                ..Took::default()
            },
        })
    }
}

impl Sorted {
    fn encoded_len(&self) -> usize {
        AllowList::encoded_len(self.order.len(), self.parser.names.len())
    }

    /// The senders in key order, as (name, key).
    fn in_order(&self) -> impl Iterator<Item = (&[u8], &PublicKeyBytes)> {
        let p = &self.parser;
        self.order
            .iter()
            .map(|&i| (p.name_bytes(i as usize), &p.keys[i as usize]))
    }

    /// Writes the list in the allow-list layout into `out` (exactly [`Sorted::encoded_len`] bytes).
    fn write(&self, stamp: SourceStamp, out: &mut [u8]) {
        let p = &self.parser;
        AllowList::encode_sorted_into(self.order.len(), p.names.len(), stamp, self.in_order(), out);
    }
}

/// The stamp of a file as it is now.
pub fn stamp_of(meta: &std::fs::Metadata) -> SourceStamp {
    SourceStamp {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
    }
}

/// The stamp in the header of the index at `path`, if it has one.
fn index_stamp(path: &Path) -> Option<SourceStamp> {
    use std::os::unix::fs::FileExt;
    let mut header = [0u8; crate::proto::allow_list::HEADER_LEN];
    open_index(path)?.read_exact_at(&mut header, 0).ok()?;
    AllowList::header_stamp(&header)
}

/// Opens an index file if it is a regular one. Without O_NONBLOCK an index that is a FIFO blocked the node's start
/// for ever, before `ready` and deaf to SIGTERM (an outside audit); anything but a regular file is an index that
/// fails its checks, and is rebuilt from the senders file (renamed over it).
fn open_index(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

/// Maps `STATE/senders.idx` read-only. The file is only ever replaced whole by rename (never written in place), so
/// a mapping stays valid for as long as it is held, even across a reload that replaces the file.
fn map_index(path: &Path) -> Option<AllowList> {
    map_file(&open_index(path)?)
}

/// Maps an index file read-only and checks it: `STATE/senders.idx`, or the new index just written and not yet
/// renamed over it ([`load_indexed`]).
fn map_file(file: &File) -> Option<AllowList> {
    // SAFETY: the file belongs to the node's state directory and is never truncated or written in place once
    // written: `senders.idx` is replaced only by rename, and a new index is mapped only once written whole, and
    // its temporary name is not opened again until it is renamed or removed (`wait_index_synced`). So the mapped
    // bytes do not change under us. Its contents are checked by `from_backing`.
    let map = unsafe { memmap2::Mmap::map(file) }.ok()?;
    let (start, len) = (map.as_ptr(), map.len());
    let list = AllowList::from_backing(Box::new(map)).ok()?;
    // The checks read every page of the index into this process; give them back. They stay in the page cache,
    // and a lookup faults in again the few it touches, so a checked index is not resident whole beside the one a
    // reload replaces (research/018).
    // SAFETY: `start..start + len` is the read-only mapping of a file that is never written in place (above), now
    // owned by `list`; MADV_DONTNEED on it only drops this process's page table entries, and the next access
    // reads the same bytes from the file again. Nothing here holds a reference into it across the call.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    Some(list)
}

/// How [`load_indexed`] got its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexUse {
    /// The index matched the senders file and was mapped: nothing was parsed.
    Mapped,
    /// The senders file changed (or there was no index): it was parsed and a new index written and mapped.
    Rebuilt,
    /// The index could not be written (see the log); the list is in memory.
    InMemory,
}

/// Loads the senders file through the mapped index under `state_dir`, rebuilding the index when the file changed.
pub fn load_indexed(path: &Path, state_dir: &Path) -> Result<(AllowList, IndexUse), SendersError> {
    // The index the last call wrote is in place before this one looks at it or writes another.
    wait_index_synced();
    let file = files::open(path, &files::SENDERS)?;
    // The stamp is taken before the read: a write during the read changes ctime, so the next start re-parses.
    let stamp = stamp_of(file.metadata());
    let index = state_dir.join(INDEX_FILE);
    // The header says whose index it is: only the index of the file as it is now is mapped and checked whole (the
    // check reads 36 MB of a million senders' index, for nothing when the file changed; research/027).
    if index_stamp(&index) == Some(stamp)
        && let Some(list) = map_index(&index)
        && list.stamp() == stamp
    {
        return Ok((list, IndexUse::Mapped));
    }
    // The index is written from the parser's arrays through a small buffer, so a reload of a million lines holds
    // those arrays and nothing else (issue 8, item 7; research/009, 018).
    let sorted = read_sorted(path, file)?;
    let started = Instant::now();
    let tmp = index.with_extension("idx.tmp");
    match write_index(&tmp, &sorted, stamp) {
        Ok(written) => {
            let mut took = sorted.took;
            took.write = started.elapsed();
            let n = sorted.order.len();
            // The parser's arrays go before the new index is mapped and checked, so the two are never resident
            // together (research/018).
            drop(sorted);
            let started = Instant::now();
            if let Some(list) = map_file(&written) {
                took.map = started.elapsed();
                took.log(n);
                sync_then_rename(written, tmp, index);
                return Ok((list, IndexUse::Rebuilt));
            }
            drop(written);
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(
                "{} was written but cannot be mapped; keeping the senders in memory",
                tmp.display()
            );
            return load(path).map(|list| (list, IndexUse::InMemory));
        }
        Err(e) => tracing::warn!(
            "cannot write {} ({e}); keeping the senders in memory, and the next start parses the file again",
            index.display()
        ),
    }
    let mut bytes = vec![0u8; sorted.encoded_len()];
    sorted.write(stamp, &mut bytes);
    drop(sorted);
    let list =
        AllowList::from_backing(Box::new(bytes)).expect("a freshly encoded list is well formed");
    Ok((list, IndexUse::InMemory))
}

/// Writes the new index under its temporary name — allocated first (a full disk is an error here, before any of it
/// is written), written through buffers — and returns it open, written but not synced.
fn write_index(tmp: &Path, sorted: &Sorted, stamp: SourceStamp) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)?;
    let len = sorted.encoded_len();
    // SAFETY: posix_fallocate on a descriptor we own; it only allocates the file's blocks.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    // Written, not mapped: the pages go to the page cache and never count in the node's memory (research/018).
    // The keys and the names are gathered in key order from all over the parser's arrays, a cache miss or two per
    // sender each: for a big file, on two cores at once, each section by positional writes of its own.
    let (p, order, count) = (&sorted.parser, &sorted.order, sorted.order.len());
    AllowList::write_header_to_file(count, p.names.len(), stamp, &file)?;
    let keys =
        || AllowList::write_keys_to_file(count, order.iter().map(|&i| &p.keys[i as usize]), &file);
    let names = || {
        AllowList::write_names_to_file(
            count,
            order.iter().map(|&i| p.name_bytes(i as usize)),
            &file,
        )
    };
    if count >= PARALLEL_FROM {
        std::thread::scope(|s| match helper().spawn_scoped(s, names) {
            Ok(thread) => {
                let keys = keys();
                let names = thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                keys.and(names)
            }
            Err(_) => keys().and_then(|()| names()),
        })?;
    } else {
        keys()?;
        names()?;
    }
    Ok(file)
}

/// The threads syncing and renaming new indexes into place (one at a time in practice: see [`wait_index_synced`]).
static INDEX_SYNCS: Mutex<Vec<std::thread::JoinHandle<()>>> = Mutex::new(Vec::new());

/// Syncs the new index `written` (named `tmp`) and renames it over `index`, on a short-lived thread
/// (`pure-index-sync`), so the node serves from the new index's mapping without waiting for the disk.
///
/// Why that is safe: the index is a cache of the senders file, and a start uses it only if its stamp is that of the
/// senders file as it is then. The rename comes after the sync, so `senders.idx` is only ever a whole, synced
/// index; a crash or a stop before the rename leaves the old index, whose stamp is not the senders file's any more,
/// so the next start parses the file again. What the node reads meanwhile is the page cache's, the bytes it wrote.
/// A sync or rename that fails removes the new file (the mapping stays valid) and says so: the node serves the list
/// it has, and the next start parses the file again. Here the sync was 16 ms of a 0.3 s start (research/027);
/// on a slow card it is the time to write 56 MB.
fn sync_then_rename(written: File, tmp: PathBuf, index: PathBuf) {
    let (at, to) = (tmp.clone(), index.clone());
    let spawned = std::thread::Builder::new()
        .name("pure-index-sync".into())
        .spawn(move || put_in_place(Ok(written), &at, &to));
    match spawned {
        Ok(thread) => INDEX_SYNCS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(thread),
        // No thread (the spawn dropped the descriptor): here, then, through the name, which nothing else opens.
        Err(_) => put_in_place(File::open(&tmp), &tmp, &index),
    }
}

/// Syncs `written` (the file at `tmp`) and renames it over `index`, or removes it.
fn put_in_place(written: std::io::Result<File>, tmp: &Path, index: &Path) {
    let started = Instant::now();
    let done = written
        .and_then(|file| file.sync_all())
        .and_then(|()| std::fs::rename(tmp, index));
    match done {
        Ok(()) => tracing::debug!(
            sync_ms = started.elapsed().as_secs_f64() * 1e3,
            "{} synced and in place",
            index.display()
        ),
        Err(e) => {
            let _ = std::fs::remove_file(tmp);
            tracing::warn!(
                "cannot sync {} into place ({e}); the node serves the senders it read, and the next start parses \
                 the file again",
                index.display()
            );
        }
    }
}

/// Waits until every index written so far is synced and renamed into place (or removed, if it could not be). A
/// reload calls it before it looks at the index or writes a new one, so a temporary index that is mapped is never
/// opened again; the node calls it at a clean stop, so a stop does not cost the next start a parse.
pub fn wait_index_synced() {
    // Joined with the list locked: a second caller meanwhile (another thread, or a test beside this one) then waits
    // for the joins rather than finding the list emptied and returning before the indexes are in place.
    let mut pending = INDEX_SYNCS.lock().unwrap_or_else(PoisonError::into_inner);
    for thread in pending.drain(..) {
        let _ = thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::encode_key;

    fn k(b: u8) -> String {
        encode_key(&[b; 32])
    }

    #[test]
    fn good_file_with_comments_loads() {
        let text = format!("# devices\n\nalpha {}  # kitchen\nbeta\t{}\n", k(1), k(2));
        let list = parse(Path::new("s.txt"), text.as_bytes()).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list.find(&[2; 32]).map(|i| list.name(i)), Some("beta"));
    }

    #[test]
    fn every_bad_line_is_named() {
        let text = format!(
            "alpha {}\nbeta\ngamma notbase64!\ndelta {}\nalpha {}\nepsilon {}\nzeta {}\n",
            k(1),
            STANDARD.encode([3u8; 16]),
            k(4),
            k(1),
            STANDARD.encode([5u8; 60]),
        );
        let err = parse(Path::new("s.txt"), text.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("s.txt:2: has 1 field"), "{err}");
        assert!(
            err.contains("s.txt:3: public key of gamma is not valid base64"),
            "{err}"
        );
        assert!(
            err.contains("s.txt:4: public key of delta decodes to 16 bytes"),
            "{err}"
        );
        assert!(
            err.contains("s.txt:5: duplicate name alpha: line 1"),
            "{err}"
        );
        assert!(
            err.contains("s.txt:6: duplicate key: line 1 (alpha)"),
            "{err}"
        );
        assert!(
            err.contains("s.txt:7: public key of zeta is too long"),
            "{err}"
        );
        assert!(err.contains("6 bad lines"), "{err}");
        let zero = format!("nil {}\n", k(0));
        let err = parse(Path::new("s.txt"), zero.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("s.txt:1: public key of nil is all zeros"),
            "{err}"
        );
        // Every other low-order point too, with or without the top bit X25519 ignores (protocol.md 2).
        let mut one = [0u8; 32];
        one[0] = 1;
        let mut p_minus_1 = [0xffu8; 32];
        p_minus_1[0] = 0xec;
        let mut order8 = [0u8; 32];
        order8[..8].copy_from_slice(&[0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae]);
        order8[8..].copy_from_slice(&[
            0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4, 0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32,
            0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x80,
        ]);
        let text = format!(
            "one {}\nminus {}\neight {}\nfine {}\n",
            encode_key(&one),
            encode_key(&p_minus_1),
            encode_key(&order8),
            k(1)
        );
        let err = parse(Path::new("s.txt"), text.as_bytes())
            .unwrap_err()
            .to_string();
        for (line, name) in [(1, "one"), (2, "minus"), (3, "eight")] {
            assert!(
                err.contains(&format!(
                    "s.txt:{line}: public key of {name} is a low-order point"
                )),
                "{err}"
            );
        }
        assert!(!err.contains("s.txt:4"), "{err}");
    }

    #[test]
    fn the_streamed_index_is_the_same_bytes_as_the_parsed_text() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("senders");
        let mut text = String::from("\u{feff}# many\r\n\n");
        // More than PARALLEL_FROM senders: checked and written on two threads.
        for i in 0..5000u32 {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_be_bytes());
            key[31] = 0x40;
            text.push_str(&format!(
                "dev-{i} {}{}\n",
                encode_key(&key),
                if i % 7 == 0 { " # c" } else { "" }
            ));
        }
        text.push_str(&format!("last {}", k(9))); // no newline at the end
        std::fs::write(&file, &text).unwrap();
        let (list, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!((list.len(), how), (5001, IndexUse::Rebuilt));
        let stamp = stamp_of(&std::fs::metadata(&file).unwrap());
        let want = encode(&file, text.as_bytes(), stamp).unwrap();
        wait_index_synced();
        assert_eq!(std::fs::read(dir.path().join(INDEX_FILE)).unwrap(), want);
        assert!(!dir.path().join("senders.idx.tmp").exists());
        // A bad line is named with the same line number either way.
        std::fs::write(&file, format!("{text}\nbroken\n")).unwrap();
        let err = load_indexed(&file, dir.path()).unwrap_err().to_string();
        assert!(err.contains("senders:5004: has 1 field"), "{err}");
    }

    /// A file big enough to be parsed in two halves: `n` good lines, a byte order mark first, no `\n` last.
    fn big_text(n: u32) -> String {
        let mut text = String::from("\u{feff}# many\r\n\n");
        for i in 0..n {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_be_bytes());
            key[31] = 0x40;
            text.push_str(&format!(
                "dev-{i} {}{}\n",
                encode_key(&key),
                if i % 7 == 0 { " # c" } else { "" }
            ));
        }
        text.push_str(&format!("last {}", k(9)));
        text
    }

    #[test]
    fn a_file_read_in_halves_is_the_same_list_and_the_same_problems_as_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("senders");
        let text = big_text(40_000);
        assert!(text.len() as u64 >= 2 * HALVES_FROM_BYTES, "{}", text.len());
        std::fs::write(&file, &text).unwrap();
        let f = files::open(&file, &files::SENDERS).unwrap();
        let at = split_at_line(&f, text.len() as u64).unwrap() as usize;
        assert_eq!(text.as_bytes()[at - 1], b'\n');
        drop(f);
        let (list, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!((list.len(), how), (40_001, IndexUse::Rebuilt));
        wait_index_synced();
        let stamp = stamp_of(&std::fs::metadata(&file).unwrap());
        let good_index = encode(&file, text.as_bytes(), stamp).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join(INDEX_FILE)).unwrap(),
            good_index
        );

        // Problems in both halves, and duplicates across them: each with its line, in line order. Line 1 is the
        // comment, 2 blank, line 3 + i is dev-i; the split is near line 20,000.
        let mut lines: Vec<String> = text.split('\n').map(String::from).collect();
        lines[4] = "broken".into(); // line 5, first half
        lines[30_002] = format!("dev-5 {}", k(3)); // line 30,003: name of line 8
        lines[30_003] = format!("again {}", lines[9].split(' ').nth(1).unwrap()); // line 30,004: key of line 10
        lines[35_000] = "x y z".into(); // line 35,001
        lines[20] = format!("early {}", lines[36_002].split(' ').nth(1).unwrap()); // line 21: key of 36,003
        let bad = lines.join("\n");
        let at = text.len() / 2;
        let split_line = bad[..at].matches('\n').count() + 1;
        assert!((5..30_003).contains(&split_line), "{split_line}");
        std::fs::write(&file, &bad).unwrap();
        let err = load_indexed(&file, dir.path()).unwrap_err().to_string();
        let want = [
            "senders:5: has 1 field",
            "senders:30003: duplicate name dev-5: line 8 already has it",
            "senders:30004: duplicate key: line 10 (dev-7)",
            "senders:35001: has 3 fields",
            "senders:36003: duplicate key: line 21 (early)",
        ];
        let mut from = 0;
        for w in want {
            let found = err[from..]
                .find(w)
                .unwrap_or_else(|| panic!("{w} not in order in {err}"));
            from += found + w.len();
        }
        assert!(err.contains("has 5 bad lines"), "{err}");
        // Refused: the index of the good file is left as it was.
        assert_eq!(
            std::fs::read(dir.path().join(INDEX_FILE)).unwrap(),
            good_index
        );
    }

    #[test]
    fn the_key_order_is_the_order_of_the_keys_and_equal_keys_are_paired() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Even keys, keys sharing their first 16 bits or 8 bytes, and equal keys (three of one, two of another).
        let mut keys: Vec<PublicKeyBytes> = (0..5000)
            .map(|i| {
                let mut k = [0u8; 32];
                for c in k.chunks_mut(8) {
                    c.copy_from_slice(&next().to_be_bytes());
                }
                if i % 10 == 0 {
                    k[..8].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, (i % 3) as u8]);
                }
                if i % 7 == 0 {
                    k[..2].copy_from_slice(&[0xab, 0xcd]);
                }
                k
            })
            .collect();
        keys[4000] = keys[17];
        keys[4999] = keys[17];
        keys[3000] = keys[2];
        for n in [0, 1, 2, 3, 17, 1000, 5000] {
            let keys = &keys[..n];
            let (got, equal) = order_by_key(keys);
            let mut want: Vec<u32> = (0..n as u32).collect();
            want.sort_by_key(|&i| (keys[i as usize], i));
            assert_eq!(got, want, "{n} keys");
            let want_equal: Vec<(u32, u32)> = want
                .windows(2)
                .filter(|w| keys[w[0] as usize] == keys[w[1] as usize])
                .map(|w| (w[0], w[1]))
                .collect();
            let mut equal = equal;
            equal.sort();
            let mut want_equal = want_equal;
            want_equal.sort();
            assert_eq!(equal, want_equal, "{n} keys");
        }
        let (_, mut equal) = order_by_key(&keys);
        equal.sort();
        assert_eq!(equal, vec![(2, 3000), (17, 4000), (4000, 4999)]);
        // Every key in one bucket: still the order of the keys.
        let same: Vec<PublicKeyBytes> = keys
            .iter()
            .map(|k| {
                let mut k = *k;
                k[..4].copy_from_slice(&[9, 9, 9, 9]);
                k
            })
            .collect();
        let mut want: Vec<u32> = (0..same.len() as u32).collect();
        want.sort_by_key(|&i| (same[i as usize], i));
        assert_eq!(order_by_key(&same).0, want);
    }

    /// Names of equal hash, in one bucket or in many, and names repeated two and three times: each repeat is paired
    /// with the one before it, whatever the hash.
    #[test]
    fn duplicate_names_are_found_whatever_the_hash() {
        let mut p = Parser::with_capacity(0);
        let names: Vec<String> = (0..3000)
            .map(|i| match i {
                2999 => "n-17".to_string(),
                2000 => "n-17".to_string(),
                1500 => "n-3".to_string(),
                i => format!("n-{i}"),
            })
            .collect();
        for (i, name) in names.iter().enumerate() {
            let mut key = [1u8; 32];
            key[..4].copy_from_slice(&(i as u32).to_be_bytes());
            p.push(name.as_bytes(), key, i + 1);
        }
        let want = vec![(3, 1500), (17, 2000), (2000, 2999)];
        type Hash = fn(&[u8]) -> u64;
        let hashes: [(&str, Hash); 6] = [
            ("foldhash", |n| {
                use std::hash::BuildHasher;
                NAME_HASH.hash_one(n)
            }),
            ("one hash", |_| 7),
            ("one bucket", |n| n.len() as u64),
            ("few", |n| u64::from(n.last().copied().unwrap_or(0)) << 60),
            ("low bits alike", |n| (n.len() as u64) << 56 | 5),
            ("buckets alike", |n| {
                use std::hash::BuildHasher;
                NAME_HASH.hash_one(n) & 0xffff_ffff
            }),
        ];
        for (what, hash) in hashes {
            let mut got = p.duplicate_names_by(hash);
            got.sort();
            assert_eq!(got, want, "{what}");
        }
    }

    /// A bad file is reported whole: every problem with its line, in line order, with the line each repeat repeats.
    #[test]
    fn a_bad_file_is_reported_with_every_line_in_line_order() {
        let mut text = String::new();
        // More than PARALLEL_FROM senders: the checks run on two threads.
        for i in 0..5000u32 {
            let mut key = [3u8; 32];
            key[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_be_bytes());
            let name = match i {
                1000 | 2500 => "dev-7".to_string(),
                _ => format!("dev-{i}"),
            };
            let key = match i {
                1200 | 2900 => {
                    let mut k = [3u8; 32];
                    k[..4].copy_from_slice(&5u32.wrapping_mul(2_654_435_761).to_be_bytes());
                    k
                }
                _ => key,
            };
            if i == 2000 {
                text.push_str("broken\n");
            }
            text.push_str(&format!("{name} {}\n", encode_key(&key)));
        }
        let err = parse(Path::new("s"), text.as_bytes()).unwrap_err();
        let SendersError::Bad { problems, more, .. } = &err else {
            panic!("{err}");
        };
        let got: Vec<(usize, &str)> = problems.iter().map(|p| (p.line, p.what.as_str())).collect();
        assert_eq!(*more, 0);
        assert_eq!(
            got,
            vec![
                (
                    1001,
                    "duplicate name dev-7: line 8 already has it; each sender needs its own name"
                ),
                (
                    1201,
                    "duplicate key: line 6 (dev-5) has the same public key; each sender needs its own key pair"
                ),
                (
                    2001,
                    "has 1 field, expected 2: a name and a base64 public key"
                ),
                (
                    2502,
                    "duplicate name dev-7: line 1001 already has it; each sender needs its own name"
                ),
                (
                    2902,
                    "duplicate key: line 1201 (dev-1200) has the same public key; each sender needs its own key pair"
                ),
            ]
        );
    }

    #[test]
    fn plain_sender_keys_are_what_base64_decodes() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let standard = |text: &[u8]| {
            let mut buf = [0u8; 48];
            match STANDARD.decode_slice(text, &mut buf) {
                Ok(32) => Some(<[u8; 32]>::try_from(&buf[..32]).unwrap()),
                _ => None,
            }
        };
        for _ in 0..2000 {
            let mut key = [0u8; 32];
            for c in key.chunks_mut(8) {
                c.copy_from_slice(&next().to_le_bytes());
            }
            let good = encode_key(&key).into_bytes();
            assert_eq!(decode_key(&good), Some(key));
            // One byte changed to any value, at a random place and at the last two: the same verdict as the crate.
            for at in [(next() % 44) as usize, 42, 43] {
                let mut text = good.clone();
                text[at] = next() as u8;
                assert_eq!(
                    decode_key(&text),
                    standard(&text),
                    "{:?}",
                    String::from_utf8_lossy(&text)
                );
            }
            // The last character's unused bits set: the crate refuses it, and so does this.
            let mut text = good.clone();
            let last = BASE64_VALUES[text[42] as usize] | 1;
            text[42] =
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[last as usize];
            assert_eq!((decode_key(&text), standard(&text)), (None, None));
        }
        for text in [&b""[..], b"=", &[b'A'; 44], &[b'A'; 45], &[b'A'; 43]] {
            assert_eq!(decode_key(text), standard(text));
        }
        let mut every = *b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        for b in 0..=255u8 {
            for at in [0, 41, 42] {
                let mut t = every;
                t[at] = b;
                assert_eq!(decode_key(&t), standard(&t), "byte {b} at {at}");
            }
        }
        every[0] = b'B';
        assert!(decode_key(&every).is_some());
    }

    /// The plain path takes a line only when the full checks would take the same sender from it.
    #[test]
    fn plain_sender_takes_only_what_the_full_checks_take() {
        let full = |content: &[u8]| -> Option<(String, PublicKeyBytes)> {
            let content = std::str::from_utf8(content).ok()?;
            let mut fields = content.split_ascii_whitespace();
            let (Some(name), Some(key), None) = (fields.next(), fields.next(), fields.next())
            else {
                return None;
            };
            if !valid_name(name) {
                return None;
            }
            let mut buf = [0u8; 48];
            let key: PublicKeyBytes = match STANDARD.decode_slice(key, &mut buf) {
                Ok(32) => buf[..32].try_into().unwrap(),
                _ => return None,
            };
            if key == [0; 32] || crypto::is_low_order(&key) {
                return None;
            }
            Some((name.to_string(), key))
        };
        let key = k(7);
        let mut low = [0u8; 32];
        low[0] = 1;
        let lines: Vec<Vec<u8>> = [
            format!("alpha {key}"),
            format!("alpha\t{key}"),
            format!("alpha \t\x0c\r {key}"),
            format!("alpha\x0b{key}"),
            format!("alpha\u{a0}{key}"),
            format!("alpha {key} extra"),
            format!("alpha {key} "),
            format!("alpha  {key}x"),
            format!("al pha {key}"),
            format!("a.b_c:d@e-f {key}"),
            format!("{} {key}", "n".repeat(64)),
            format!("{} {key}", "n".repeat(65)),
            format!("é {key}"),
            format!("alpha {}", k(0)),
            format!("alpha {}", encode_key(&low)),
            format!("alpha {}", &key[..43]),
            format!("alpha {}=", &key[..43]),
            "alpha".to_string(),
            format!(" {key}"),
        ]
        .into_iter()
        .map(String::into_bytes)
        .chain([[b"alpha \xff".as_slice(), key.as_bytes()].concat()])
        .collect();
        for line in &lines {
            let content = line.trim_ascii();
            let plain =
                plain_sender(content).map(|(n, k)| (String::from_utf8(n.to_vec()).unwrap(), k));
            if plain.is_some() {
                assert_eq!(plain, full(content), "{:?}", String::from_utf8_lossy(line));
            }
        }
        // The common shapes do take the plain path.
        for line in &lines[..3] {
            assert!(
                plain_sender(line.trim_ascii()).is_some(),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_first_name() {
        let text = format!("\u{feff}alpha {}\n", k(1));
        let list = parse(Path::new("s.txt"), text.as_bytes()).unwrap();
        assert_eq!(list.find(&[1; 32]).map(|i| list.name(i)), Some("alpha"));
    }

    #[test]
    fn a_long_bad_name_is_not_echoed_whole() {
        let name = "é".repeat(5000);
        let text = format!("{name} {}\n", k(1));
        let err = parse(Path::new("s.txt"), text.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("… (10000 bytes)"), "{err}");
        assert!(err.len() < 400, "{} bytes: {err}", err.len());
    }

    #[test]
    fn a_line_past_the_longest_is_reported_without_being_kept() {
        let text = format!(
            "alpha {}\n{}\nbeta {}\n{}",
            k(1),
            "x".repeat(MAX_LINE_BYTES + 1),
            k(2),
            "#".repeat(3 * MAX_LINE_BYTES)
        );
        let err = parse(Path::new("s.txt"), text.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("s.txt:2: is longer than 65536 bytes, which no sender line is"),
            "{err}"
        );
        assert!(err.contains("s.txt:4: is longer than"), "{err}");
        assert!(err.contains("has 2 bad lines"), "{err}");
        // Exactly the longest is a line like any other (here a comment).
        let text = format!("#{}\nalpha {}\n", "x".repeat(MAX_LINE_BYTES - 1), k(1));
        assert_eq!(parse(Path::new("s.txt"), text.as_bytes()).unwrap().len(), 1);
    }

    #[test]
    fn near_miss_base64_keys_say_what_was_expected() {
        let mut key = [7u8; 32];
        key[0] = 0xfb;
        key[1] = 0xff;
        let url = base64::engine::general_purpose::URL_SAFE.encode(key);
        let unpadded = STANDARD.encode(key).trim_end_matches('=').to_string();
        let text = format!("a {url}\nb {unpadded}\n");
        let err = parse(Path::new("s.txt"), text.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("s.txt:1: public key of a is URL-safe base64"),
            "{err}"
        );
        assert!(
            err.contains("s.txt:2: public key of b lacks its = padding"),
            "{err}"
        );
    }

    /// The node serves from the new index before it is synced; it is renamed into place after, and a load waits for
    /// that before it looks for the index. An index that cannot be put in place is removed, and the list read stays
    /// good (its mapping outlives the name).
    #[test]
    fn a_new_index_is_served_before_it_is_synced_and_put_in_place_after() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("senders");
        let tmp = dir.path().join("senders.idx.tmp");
        std::fs::write(&file, format!("a {}\nb {}\n", k(1), k(2))).unwrap();
        let (first, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!(how, IndexUse::Rebuilt);
        // Changed at once: this load waits for the last index to be in place, then writes its own.
        std::fs::write(&file, format!("a {}\nc {}\n", k(1), k(3))).unwrap();
        let (second, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!(how, IndexUse::Rebuilt);
        assert_eq!(first.find(&[2; 32]).map(|i| first.name(i)), Some("b"));
        assert_eq!(second.find(&[3; 32]).map(|i| second.name(i)), Some("c"));
        let (_, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!(how, IndexUse::Mapped);
        assert!(!tmp.exists());
        // A name the index cannot be renamed over (a directory that is not empty): removed, the list still good.
        std::fs::remove_file(dir.path().join(INDEX_FILE)).unwrap();
        std::fs::create_dir_all(dir.path().join(INDEX_FILE).join("x")).unwrap();
        std::fs::write(&file, format!("d {}\n", k(4))).unwrap();
        let (list, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!(how, IndexUse::Rebuilt);
        wait_index_synced();
        assert!(!tmp.exists());
        assert_eq!(list.find(&[4; 32]).map(|i| list.name(i)), Some("d"));
        assert!(dir.path().join(INDEX_FILE).is_dir());
    }

    #[test]
    fn the_index_is_reused_while_the_file_is_unchanged_and_rebuilt_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("senders");
        std::fs::write(&file, format!("a {}\n", k(1))).unwrap();
        let (list, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!((list.len(), how), (1, IndexUse::Rebuilt));
        let (list, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!((list.len(), how), (1, IndexUse::Mapped));
        // Same size, new content: the stamp (ctime) still tells.
        std::fs::write(&file, format!("b {}\n", k(2))).unwrap();
        let (list, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!(how, IndexUse::Rebuilt);
        assert_eq!(list.find(&[2; 32]).map(|i| list.name(i)), Some("b"));
        // A damaged index is rebuilt, not trusted (damaged once the last one is in place).
        wait_index_synced();
        std::fs::write(dir.path().join(INDEX_FILE), b"PSALLOW1 garbage").unwrap();
        let (_, how) = load_indexed(&file, dir.path()).unwrap();
        assert_eq!(how, IndexUse::Rebuilt);
        // A bad file is an error and the index is left as it was.
        std::fs::write(&file, "c not-a-key\n").unwrap();
        assert!(load_indexed(&file, dir.path()).is_err());
    }
}

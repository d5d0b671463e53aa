//! The wire parsers on any bytes: headers, the frames of both directions, record bodies. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pure_serve::proto::wire::{self, RecordIter};

fuzz_target!(|data: &[u8]| {
    let _ = wire::SenderHeader::parse(data);
    let _ = wire::NodeHeader::parse(data);
    let _ = wire::parse_sender_frames(data);
    let _ = wire::parse_node_frames(data);
    let _ = wire::Forwarded::parse(data);
    let mut it = RecordIter::new(data);
    while it.next().is_some() {}
    let _ = it.is_clean();
});

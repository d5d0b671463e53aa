//! The sender core on any node packet sealed as the node would seal it for the sender's run: the frames of a
//! hostile or broken node (ACKs, REFUSEs, DOWN frames with any `last`, `after`, sequences and records) reach the
//! sender's state machine past the AEAD, with a flow of records queued and a downlink flow listened on
//! (docs/protocol.md 7, 12.4). The first byte is the program's kept downlink heard sequence. Never a panic.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use pure_serve::proto::crypto::{self, Identity};
use pure_serve::proto::sender::{FlowStart, Sender, SenderConfig};
use pure_serve::proto::wire::{self, NodeHeader};

struct Fixture {
    node: Identity,
    sender: Identity,
    shared: [u8; 32],
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let node = Identity::from_secret_bytes([7; 32]);
        let sender = Identity::from_secret_bytes([9; 32]);
        let shared = sender.shared_secret(node.public()).expect("fixed keys are not low order");
        Fixture {
            node,
            sender,
            shared,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let Some((&heard, rest)) = data.split_first() else {
        return;
    };
    let run_id = 5;
    let mut config = SenderConfig::new(f.sender.clone(), *f.node.public());
    config.run_id = run_id;
    let Ok(mut sender) = Sender::new(config) else {
        return;
    };
    let _ = sender.open_flow("main", FlowStart::At(1));
    let _ = sender.queue("main", b"record".to_vec());
    let _ = sender.listen("main", u64::from(heard));
    let now = Instant::now();
    let mut out = Vec::new();
    while sender.poll_transmit(now, &mut out) {}
    let epoch = 1;
    let key = crypto::node_to_sender_key(&f.shared, run_id, epoch, f.sender.public(), f.node.public());
    // Up to 4 node packets, plaintexts split at 0xfe.
    for (i, plain) in rest.split(|&b| b == 0xfe).take(4).enumerate() {
        let mut p = Vec::new();
        NodeHeader {
            epoch,
            packet_number: i as u64,
        }
        .emit(&mut p);
        p.extend_from_slice(plain);
        crypto::seal(&key, i as u64, &mut p, wire::NODE_HEADER_LEN);
        sender.handle_datagram(now, &p);
    }
    while sender.poll_event().is_some() {}
    while sender.poll_transmit(now, &mut out) {}
    sender.handle_timeout(now + Duration::from_secs(10));
    while sender.poll_transmit(now + Duration::from_secs(10), &mut out) {}
});

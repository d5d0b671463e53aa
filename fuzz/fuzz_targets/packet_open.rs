//! The node core on any datagram, and on any plaintext sealed as a real listed sender would seal it: the first
//! byte chooses. Sealed input goes past the AEAD into the frame parser, the turn, a commit to an in-memory store
//! and the acks, so the fuzzer explores what an authenticated but hostile sender can send. The top bit of the first
//! byte lets the sender forward to `main` (docs/apps.md, `forwarders`), so FORWARD frames are both refused (reason
//! 3) and stored. One downlink record waits for the sender, so LISTEN frames are answered with DOWN frames
//! (docs/protocol.md 12). Never a panic.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use pure_serve::proto::allow_list::AllowList;
use pure_serve::proto::crypto::{self, Identity};
use pure_serve::proto::node::{HostedApp, NoMemo, Node, NodeConfig};
use pure_serve::proto::wire::{self, SenderHeader};
use pure_serve::store::Stores;
use pure_serve::store::downlink::DownLimits;

struct Fixture {
    node: Identity,
    sender: Identity,
    shared: [u8; 32],
    senders: Arc<AllowList>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let node = Identity::from_secret_bytes([7; 32]);
        let sender = Identity::from_secret_bytes([9; 32]);
        let shared = sender.shared_secret(node.public()).expect("fixed keys are not low order");
        let senders = Arc::new(AllowList::from_unique(vec![("dev".to_string(), *sender.public())]));
        Fixture {
            node,
            sender,
            shared,
            senders,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let now = Instant::now();
    let mut node = Node::new(
        NodeConfig {
            identity: f.node.clone(),
            epoch: 1,
            idle: Duration::from_secs(30),
            apps: vec!["main".to_string()],
        },
        f.senders.clone(),
    );
    if choice & 0x80 != 0 {
        node.set_apps(vec![HostedApp {
            forwarders: ["dev".into()].into_iter().collect(),
            ..HostedApp::open("main")
        }]);
    }
    let from: SocketAddr = "192.0.2.7:4000".parse().expect("a literal address");
    let datagrams: Vec<Vec<u8>> = if choice & 1 == 0 {
        vec![rest.to_vec()]
    } else {
        // Up to 4 sealed packets of the same run, plaintexts split at 0xff 0xfe.
        let run_id = 5;
        let key = crypto::sender_to_node_key(&f.shared, run_id, f.sender.public(), f.node.public());
        rest.split(|&b| b == 0xfe)
            .take(4)
            .enumerate()
            .map(|(i, plain)| {
                let mut p = Vec::new();
                let header = SenderHeader {
                    key_id: crypto::key_id(f.sender.public()),
                    run_id,
                    packet_number: i as u64 + u64::from((choice & 0x7f) >> 1),
                };
                header.emit(&mut p);
                p.extend_from_slice(plain);
                crypto::seal(&key, header.packet_number, &mut p, wire::SENDER_HEADER_LEN);
                p
            })
            .collect()
    };
    let mut stores = Stores::open_in_memory(&["main".to_string()]).expect("in-memory store");
    if let Some(store) = stores.app_mut(0) {
        let _ = store.queue_down("dev", &[b"down".to_vec()], &DownLimits::default());
    }
    for d in &datagrams {
        node.handle_datagram(now, from, d, &mut NoMemo);
    }
    if let Some(turn) = node.take_turn()
        && let Ok(committed) = stores.apply_turn(&turn, &f.senders)
    {
        node.handle_committed(&committed);
    }
    node.flush_acks();
    while node.poll_transmit().is_some() {}
    node.handle_timeout(now + Duration::from_secs(60));
});

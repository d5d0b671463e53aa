//! Synthetic turns for the benches that measure the store alone (`link_costs`, `send_path`): records from one
//! sender, cut into DATA frames as packets carry them, the shape the node core hands `Stores::apply_turn`.

use pure_serve::proto::turn::{Apply, Turn};
use pure_serve::proto::wire;

/// Turn `id`: `count` records of sender 0 (session 1) for app 0, numbered from `first_seq`, in frames of
/// `per_frame` records; record `seq`'s bytes are `payload(seq)`.
pub fn turn_of(
    id: u64,
    first_seq: u64,
    count: u64,
    per_frame: u64,
    payload: impl Fn(u64) -> Vec<u8>,
) -> Turn {
    let mut turn = Turn {
        id,
        ..Turn::default()
    };
    let mut seq = first_seq;
    let end = first_seq + count;
    while seq < end {
        let in_frame = per_frame.min(end - seq);
        let start = turn.arena.len();
        for k in 0..in_frame {
            wire::put_record(&mut turn.arena, &payload(seq + k));
        }
        turn.items.push(Apply {
            session: 1,
            sender: 0,
            app: 0,
            first_seq: seq,
            count: in_frame,
            format: wire::RecordFormat::Plain,
            records: start..turn.arena.len(),
        });
        turn.record_count += in_frame;
        seq += in_frame;
    }
    turn
}

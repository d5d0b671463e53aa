//! The receive loop's reading of a push socket request (src/receive/push_stream.rs, research/054) on any bytes: a
//! push to serve or "hyper's", never a panic; a push's body lies within the bytes read, within the loop's bound, with
//! what follows it after it; and its query goes through the target's parsing without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pure_serve::receive::push_stream::{MAX_BODY_HERE, Request, parse_request};

fuzz_target!(|data: &[u8]| {
    if let Request::Push {
        query, body, rest, ..
    } = parse_request(data)
    {
        assert!(body.start <= body.end && body.end == rest && rest <= data.len());
        assert!(body.len() <= MAX_BODY_HERE);
        let _ = pure_serve::common::push::target(&query);
    }
});

//! The `POST /link` body framing (docs/protocol.md 10) on any bytes: packets or an error, never a panic; what
//! parses is re-framed to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pure_serve::http::framing::Framed;

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = Framed::parse(data.to_vec()) {
        let packets: Vec<Vec<u8>> = body.iter().map(|p| p.to_vec()).collect();
        assert_eq!(packets.len(), body.len());
        if let Ok(again) = Framed::from_packets(&packets) {
            assert_eq!(again.as_bytes(), body.as_bytes());
        }
    }
});

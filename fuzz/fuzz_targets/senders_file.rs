//! The senders file's parser on any bytes: a list or a report of bad lines, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match pure_serve::senders::parse(std::path::Path::new("senders"), data) {
        Ok(list) => {
            for i in 0..list.len() {
                let _ = list.name(i as u32);
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});

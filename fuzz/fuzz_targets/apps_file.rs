//! The apps file's parser and checks on any text: a configuration or every problem with its line, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pure_serve::apps::config::AppsConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match AppsConfig::parse(std::path::Path::new("apps.toml"), text) {
        Ok(config) => {
            let _ = config.summary();
            let _ = config.forwarding_summary();
            let _ = config.warnings(&|_| false);
            let _ = config.check_own_key(&[9; 32]);
        }
        Err(e) => {
            let _ = e.lines();
        }
    }
});

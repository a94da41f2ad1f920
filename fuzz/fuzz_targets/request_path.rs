//! Client bytes through request framing and command parsing (see `src/lib.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| redlock_proxy_fuzz::request_path(data));

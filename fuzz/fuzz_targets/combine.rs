//! Masters' answers, described by the input, through the majority rule (see `src/lib.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| redlock_proxy_fuzz::combine_target(data));

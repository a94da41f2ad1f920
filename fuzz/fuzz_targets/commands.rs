//! A client's whole session through a real connection, embedded masters and a paused clock
//! (see `src/commands.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| redlock_proxy_fuzz::commands(data));

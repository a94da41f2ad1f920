//! `redlock-proxy`: the binary. Everything it does is in the library ([`redlock_proxy::cli`]),
//! under the crate's one list of denied lints (`src/lib.rs`).

fn main() -> std::process::ExitCode {
    redlock_proxy::cli::main()
}

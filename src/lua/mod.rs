//! The Lua the masters run for the proxy, below the backend: the fenced acquisition and its
//! counters ([`fence`]). Each recipe's own scripts are in its folder (`recipes/*/lua.rs`).

#[macro_use]
pub mod fence;

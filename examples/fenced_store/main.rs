//! The paused-client story, against a running proxy: two clients, one lock, one fenced store.
//!
//! ```sh
//! cargo run --release &                      # the proxy on 127.0.0.1:7379
//! cargo run --example fenced_store [redis://127.0.0.1:7379]
//! ```
//!
//! Client A takes the lock with `LOCK.ACQUIRE` and gets a fencing token, then stalls past
//! its validity. Client B takes the lock (a higher token) and writes. A wakes up and writes
//! with its old token: the fenced store refuses it; an unfenced store would have let A
//! overwrite B's data.

mod store;

use std::time::Duration;

use store::FencedStore;

fn main() -> redis::RedisResult<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:7379".into());
    let mut a = redis::Client::open(url.as_str())?.get_connection()?;
    let mut b = redis::Client::open(url.as_str())?.get_connection()?;
    let (mut fenced, mut plain) = (FencedStore::new(), FencedStore::unfenced());
    let key = format!("lock:demo:{}", std::process::id());

    let token_a: u64 = redis::cmd("LOCK.ACQUIRE")
        .arg(&key)
        .arg("client-a")
        .arg(500)
        .query(&mut a)?;
    println!("A holds {key} with fencing token {token_a}, and stalls (GC pause)...");
    std::thread::sleep(Duration::from_millis(700));

    let token_b: Option<u64> = redis::cmd("LOCK.ACQUIRE")
        .arg(&key)
        .arg("client-b")
        .arg(10_000)
        .query(&mut b)?;
    let token_b = token_b.expect("A's lock has expired");
    println!("B holds {key} with fencing token {token_b}");
    for store in [&mut fenced, &mut plain] {
        store.write("balance", "written by B", token_b).expect("B's write");
    }

    match fenced.write("balance", "written by A (late)", token_a) {
        Ok(()) => println!("fenced store: A's late write was accepted (a bug)"),
        Err(stale) => println!(
            "fenced store: A's late write was refused, token {} < {}; it keeps {:?}",
            stale.token,
            stale.highest,
            fenced.read("balance")
        ),
    }
    let _ = plain.write("balance", "written by A (late)", token_a);
    println!(
        "store without fencing: it now holds {:?}: B's write is lost",
        plain.read("balance")
    );
    let released: i64 = redis::cmd("LOCK.RELEASE").arg(&key).arg("client-b").query(&mut b)?;
    println!("B released the lock: {released}");
    Ok(())
}

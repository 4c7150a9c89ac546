//! A write fenced at the protected store: a holder that was paused past its lease wakes up
//! and tries to write, and the store refuses it because a newer holder of the slot wrote.
//!
//! Leases alone cannot stop a paused process (GC, swap, SIGSTOP) from acting after its lease
//! expired. The fencing token that comes with every permit can: the store keeps the highest
//! token seen per slot and rejects lower ones. Here the store is Redis itself, through
//! [`redsem::fencing::FencedStore`]; any database that can compare a number in a transaction
//! can do the same.
//!
//! Run with a Redis at REDIS_URL (default redis://127.0.0.1:6379/):
//! `cargo run -p redsem --example fenced_write`
use std::time::Duration;

use redsem::fencing::FencedStore;

#[tokio::main]
async fn main() -> Result<(), redsem::Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = redsem::Client::connect(&url).await?;
    // One writer at a time; a short lease so that the example is quick.
    let sem = client
        .semaphore("example-ledger", 1)
        .lease(Duration::from_millis(300))
        .open()
        .await?;
    // The fence record and the data share a hash tag (required in Redis Cluster).
    let store = FencedStore::new(&client, "{example-ledger}:fence");

    let old = sem.acquire().await?;
    let old_fence = old.fences()[0];
    assert!(
        store
            .write(old_fence, "{example-ledger}:balance", b"100")
            .await?
    );
    println!("writer A (fence {old_fence}) wrote balance=100");

    // Writer A "pauses": it stops renewing (as a frozen process would) and its lease expires.
    old.detach();
    println!("writer A pauses past its lease...");

    let new = sem.acquire().await?; // granted once A's lease has expired
    let new_fence = new.fences()[0];
    assert!(new_fence.generation > old_fence.generation);
    assert!(
        store
            .write(new_fence, "{example-ledger}:balance", b"70")
            .await?
    );
    println!("writer B (fence {new_fence}) wrote balance=70");

    // A wakes up and, still believing it holds the slot, writes: the store refuses.
    let accepted = store
        .write(old_fence, "{example-ledger}:balance", b"999")
        .await?;
    println!(
        "writer A (fence {old_fence}) wakes up and writes balance=999: {}",
        if accepted { "ACCEPTED" } else { "rejected" }
    );
    assert!(!accepted, "a stale fence must be rejected");
    new.release().await?;
    client.shutdown().await; // every release done before the process exits
    Ok(())
}

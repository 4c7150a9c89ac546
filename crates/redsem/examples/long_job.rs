//! A job that runs far longer than its lease: the permit is renewed in the background, so the
//! lease only bounds how long a *crashed* holder blocks the slot, not how long work may run.
//!
//! The lease is 1 s and the job takes about 3 s. While it runs, `stats` shows the holder's
//! lease being pushed forward. A helper task spawned by the job holds the permit's
//! cancellation token, which would stop it if the lease were lost.
//!
//! Run with a Redis at REDIS_URL (default redis://127.0.0.1:6379/):
//! `cargo run -p redsem --example long_job`
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(1);

#[tokio::main]
async fn main() -> Result<(), redsem::Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = redsem::Client::connect(&url).await?;
    let sem = client
        .semaphore("example-nightly-export", 1)
        .lease(LEASE)
        .open()
        .await?;

    let permit = sem.acquire().await?;
    let started = Instant::now();
    // A helper task that must stop if the permit is lost: give it the permit's token.
    let token = permit.cancellation_token();
    let helper = tokio::spawn(async move {
        token.cancelled().await;
        eprintln!("the lease was lost: the helper stops");
    });

    let job = async {
        for step in 1..=6 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let stats = sem.stats().await?;
            let holder = &stats.holders[0];
            println!(
                "step {step}/6 at {:.1}s: held for {:.1}s, lease left {:.2}s (lease is {:?})",
                started.elapsed().as_secs_f64(),
                holder.held.as_secs_f64(),
                holder.lease_left.as_secs_f64(),
                LEASE
            );
            assert!(holder.lease_left <= LEASE);
        }
        Ok::<_, redsem::Error>(())
    };
    // `run` releases the permit afterwards; it would stop the job if the lease were lost.
    permit.run(job).await??;
    helper.abort();
    let elapsed = started.elapsed();
    println!(
        "job finished after {:.1}s with a {:?} lease, renewed in the background",
        elapsed.as_secs_f64(),
        LEASE
    );
    assert!(elapsed > 2 * LEASE);
    client.flush_releases().await; // `run` released in the background; wait for it
    assert_eq!(sem.stats().await?.in_use, 0);
    client.shutdown().await; // before the process exits
    Ok(())
}

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), redsem::Error> {
    let url = std::env::var("REDIS_URL").unwrap_or("redis://127.0.0.1:6379/".into());
    let client = redsem::Client::connect(&url).await?;
    // At most 2 calls at once, across every process that opens "quickstart-api"
    let sem = client
        .semaphore("quickstart-api", 2)
        .lease(Duration::from_secs(10))
        .open()
        .await?;
    let sem = &sem;
    let calls = (0..6).map(|i| async move {
        let permit = sem.acquire().await?; // FIFO across all processes
        let (slot, fence) = (permit.slots()[0], permit.fences()[0]);
        // run() cancels the work if the slot is lost (its lease could not be renewed)
        permit
            .run(async move {
                println!("call {i}: slot {slot}, fencing token {fence}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            })
            .await
    });
    let done = futures_util::future::try_join_all(calls).await;
    // Every release done before the process exits: a rerun never waits for a lease.
    client.shutdown().await;
    done?;
    Ok(())
}

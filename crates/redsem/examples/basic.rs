//! Ten tasks share a semaphore of limit 3: at most three hold a permit at once, granted in
//! FIFO order. Run with a Redis at REDIS_URL (default redis://127.0.0.1:6379/):
//! `cargo run -p redsem --example basic`
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), redsem::Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = redsem::Client::connect(&url).await?;
    let sem = client
        .semaphore("example-basic", 3)
        .lease(Duration::from_secs(5))
        .open()
        .await?;
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..10 {
        let (sem, inside) = (sem.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let permit = sem.acquire().await?;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            println!(
                "task {task}: slot {} fence {} ({now} inside)",
                permit.slots()[0],
                permit.fences()[0]
            );
            assert!(now <= 3);
            tokio::time::sleep(Duration::from_millis(100)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            permit.release().await
        }));
    }
    for t in tasks {
        t.await.expect("task panicked")?;
    }
    println!("{:?}", sem.stats().await?);
    client.shutdown().await; // every release done before the process exits
    Ok(())
}

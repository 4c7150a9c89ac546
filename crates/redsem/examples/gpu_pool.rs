//! A pool of GPUs shared by every worker process: the permit's slot *is* the device index.
//!
//! The semaphore's limit is the number of devices. Each permit carries a slot in `0..limit`
//! that no other live holder has, so a job simply uses device `cuda:<slot>`: no second
//! registry of "who has which GPU", and a crashed worker's device comes back with its lease.
//! Start this example in several terminals at once and they share the two devices.
//!
//! Run with a Redis at REDIS_URL (default redis://127.0.0.1:6379/):
//! `cargo run -p redsem --example gpu_pool`
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEVICES: u32 = 2;

#[tokio::main]
async fn main() -> Result<(), redsem::Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = redsem::Client::connect(&url).await?;
    let gpus = client
        .semaphore("example-gpu-pool", DEVICES)
        .lease(Duration::from_secs(5))
        .open()
        .await?;

    // Which job uses each device right now, as this process sees it.
    let busy: Arc<Mutex<Vec<Option<u32>>>> = Arc::new(Mutex::new(vec![None; DEVICES as usize]));
    let mut jobs = Vec::new();
    for job in 0..6u32 {
        let (gpus, busy) = (gpus.clone(), busy.clone());
        jobs.push(tokio::spawn(async move {
            let permit = gpus.acquire().await?;
            let device = permit.slots()[0];
            {
                let mut busy = busy.lock().unwrap();
                let slot = &mut busy[device as usize];
                assert!(slot.is_none(), "cuda:{device} is already used by {slot:?}");
                *slot = Some(job);
            }
            println!("job {job}: running on cuda:{device}");
            // The training step; if the lease were lost, `run` would stop it here.
            permit
                .run(async {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    busy.lock().unwrap()[device as usize] = None;
                })
                .await?;
            Ok::<_, redsem::Error>(device)
        }));
    }
    let mut used = Vec::new();
    for j in jobs {
        used.push(j.await.expect("job panicked")?);
    }
    used.sort();
    used.dedup();
    println!("devices used: {used:?}");
    assert!(used.iter().all(|&d| d < DEVICES));
    client.shutdown().await; // every release done before the process exits
    Ok(())
}

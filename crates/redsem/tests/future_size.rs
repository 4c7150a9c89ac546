//! The size of a waiting acquisition's future. A task that waits for a permit carries this
//! future as long as it waits, so with many waiting tasks it is most of what waiting costs
//! in memory (the benchmark's `memory` scenario measures the whole process; this test keeps
//! the future from growing unnoticed, as it once did from 368 to 608 bytes).
//!
//! The size is fixed at compile time: this test is exact, not timed.
mod common;

use std::time::Duration;

use redsem::AcquireOptions;

/// The most a waiting acquisition's future may take, in bytes (296 on Rust 1.95; the bound
/// leaves room for a compiler's layout changes, not for a new field kept across the wait).
const MAX_FUTURE_BYTES: usize = 336;

#[tokio::test]
async fn a_waiting_acquisition_future_stays_small() {
    let server = common::Server::start(common::Flavor::Redis);
    let client = common::client(&server).await;
    let sem = common::open(&client, "future-size", 2, Duration::from_secs(10)).await;
    let sizes = [
        ("acquire", std::mem::size_of_val(&sem.acquire())),
        ("acquire_many", std::mem::size_of_val(&sem.acquire_many(2))),
        (
            "acquire_timeout",
            std::mem::size_of_val(&sem.acquire_timeout(Duration::from_secs(1))),
        ),
        ("try_acquire", std::mem::size_of_val(&sem.try_acquire())),
        (
            "acquire_with",
            std::mem::size_of_val(&sem.acquire_with(AcquireOptions::new().priority(1))),
        ),
    ];
    for (what, size) in sizes {
        assert!(
            size <= MAX_FUTURE_BYTES,
            "the future of {what} takes {size} bytes, more than {MAX_FUTURE_BYTES}: \
             a value kept across the wait (see engine/acquire.rs, acquire_untraced)"
        );
    }
}

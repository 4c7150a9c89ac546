//! [`Backoff`]: the one retry delay of the library (reconnects, background releases, failed
//! renewals, Sentinel lookups).

use std::time::Duration;

/// A doubling delay: `first`, then twice the one before, at most `max`; [`reset`](Self::reset)
/// starts over after a success. Pure: the caller sleeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first.min(max),
        }
    }

    /// The delay before the next try (and doubles the one after).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (delay * 2).min(self.max);
        delay
    }

    /// Starts over at the first delay.
    pub(crate) fn reset(&mut self) {
        self.next = self.first.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_maximum_and_start_over_after_a_reset() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(200), ms(2000));
        let delays: Vec<u128> = (0..6).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1600, 2000, 2000]);
        b.reset();
        assert_eq!(b.next_delay(), ms(200));
        assert_eq!(
            Backoff::new(ms(500), ms(300)).next_delay(),
            ms(300),
            "never above max"
        );
    }
}

//! [`HandoffToken`]: a held permit exported by one process for another to adopt or release,
//! and [`Permit::export`], which makes it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::Error;
use crate::permit::{Fence, Permit};

/// The version tag every token starts with.
const PREFIX: &str = "redsem-handoff-1:";

/// A held permit handed from one process to another: a scheduler acquires, a worker renews
/// and releases. Made by [`Permit::export`](crate::Permit::export), adopted by
/// [`Semaphore::adopt`](crate::Semaphore::adopt) or released by
/// [`Semaphore::release_handoff`](crate::Semaphore::release_handoff), in this process or
/// any other (Rust, Python or Node.js: the same string everywhere).
///
/// Its printed form ([`Display`](fmt::Display), parsed back by [`FromStr`]) is one line of
/// printable text without whitespace:
///
/// ```text
/// redsem-handoff-1:<holder id>:<ticket>:<lease ms>:<slots>:<generations>:<semaphore name>
/// ```
///
/// where `<slots>` and `<generations>` are comma-separated decimals in the same order (the
/// permit's [`fences`](Self::fences)), e.g.
/// `redsem-handoff-1:8156335641e74ba4.0-2a:42:30000:0,3:1733480000000001,1733480000000002:jobs`.
/// The name comes last and is everything after the sixth `:` (a name may contain `:`). The
/// version tag changes if the format ever does. `docs/PROTOCOL.md` ("Hand-off") specifies it.
///
/// A token is not a secret against the semaphore's own users (anyone who can reach the
/// semaphore's keys can release any holder), but whoever holds it can take the permit over:
/// pass it as you would pass the work itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HandoffToken {
    semaphore: String,
    holder_id: String,
    ticket: u64,
    lease: Duration,
    fences: Vec<Fence>,
}

impl HandoffToken {
    pub(crate) fn new(
        semaphore: &str,
        holder_id: &str,
        ticket: u64,
        lease: Duration,
        fences: Vec<Fence>,
    ) -> HandoffToken {
        HandoffToken {
            semaphore: semaphore.to_owned(),
            holder_id: holder_id.to_owned(),
            ticket,
            lease,
            fences,
        }
    }

    /// The name of the semaphore the permit belongs to.
    pub fn semaphore(&self) -> &str {
        &self.semaphore
    }

    /// The holder id in Redis (the exported permit's
    /// [`holder_id`](crate::Permit::holder_id), kept by its adopter).
    pub fn holder_id(&self) -> &str {
        &self.holder_id
    }

    /// The ticket the permit was granted under.
    pub fn ticket(&self) -> u64 {
        self.ticket
    }

    /// The holder lease: the adopter renews the permit with it.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The slots and their fencing tokens, as the exported permit had them (an adopted permit
    /// keeps them).
    pub fn fences(&self) -> &[Fence] {
        &self.fences
    }

    /// The slot numbers, ascending.
    pub fn slots(&self) -> Vec<u32> {
        self.fences.iter().map(|f| f.slot).collect()
    }

    /// How many permits the token carries.
    pub fn num_permits(&self) -> u32 {
        self.fences.len() as u32
    }
}

impl fmt::Display for HandoffToken {
    /// The printable form documented on [`HandoffToken`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |v: Vec<String>| v.join(",");
        write!(
            f,
            "{PREFIX}{}:{}:{}:{}:{}:{}",
            self.holder_id,
            self.ticket,
            self.lease.as_millis(),
            join(self.fences.iter().map(|x| x.slot.to_string()).collect()),
            join(
                self.fences
                    .iter()
                    .map(|x| x.generation.to_string())
                    .collect()
            ),
            self.semaphore
        )
    }
}

impl FromStr for HandoffToken {
    type Err = Error;

    /// Parses the printable form documented on [`HandoffToken`]; nothing is checked in Redis.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], saying what is wrong, for anything else (another version,
    /// a truncated token, a bad number, a holder id or name the protocol does not allow).
    fn from_str(s: &str) -> Result<HandoffToken, Error> {
        let bad = |why: &str| {
            Error::InvalidArgument(format!(
                "not a redsem hand-off token ({why}); pass the text Permit::export's token \
                 prints, unchanged (it starts with {PREFIX:?})"
            ))
        };
        let rest = s.strip_prefix(PREFIX).ok_or_else(|| {
            if s.starts_with("redsem-handoff-") {
                bad("another version of the token format: use the same redsem version to export and adopt")
            } else {
                bad("it does not start with the version tag")
            }
        })?;
        let parts: Vec<&str> = rest.splitn(6, ':').collect();
        let [holder_id, ticket, lease_ms, slots, gens, name] = parts[..] else {
            return Err(bad("too few fields"));
        };
        let id_ok = !holder_id.is_empty()
            && !holder_id.starts_with('!')
            && holder_id
                .chars()
                .all(|c| c.is_ascii_graphic() && !":;,|~".contains(c));
        if !id_ok {
            return Err(bad("the holder id has characters an id may not have"));
        }
        let ticket = ticket
            .parse()
            .map_err(|_| bad("the ticket is not a number"))?;
        let lease_ms: u64 = lease_ms
            .parse()
            .map_err(|_| bad("the lease is not a number of milliseconds"))?;
        let lease = Duration::from_millis(lease_ms);
        if lease.is_zero() || lease > crate::MAX_DURATION {
            return Err(bad("the lease is out of range"));
        }
        let slots = numbers::<u32>(slots).ok_or_else(|| bad("a slot is not a number"))?;
        let gens = numbers::<u64>(gens).ok_or_else(|| bad("a fence is not a number"))?;
        if slots.is_empty() || slots.len() != gens.len() {
            return Err(bad("the slots and fences do not match"));
        }
        crate::protocol::keys::validate_name(name)?;
        let fences = slots
            .into_iter()
            .zip(gens)
            .map(|(slot, generation)| Fence { slot, generation })
            .collect();
        Ok(HandoffToken::new(name, holder_id, ticket, lease, fences))
    }
}

impl Permit {
    /// Hands this permit to another process (or another semaphore handle): returns a
    /// [`HandoffToken`] that [`Semaphore::adopt`](crate::Semaphore::adopt) takes over
    /// (renewing it from then on) or
    /// [`Semaphore::release_handoff`](crate::Semaphore::release_handoff) releases. The
    /// permit is consumed without being released: this process stops renewing it, and
    /// detaches it in Redis (it leaves this handle's session for one nobody renews, keeping
    /// the lease it has now), so a token nobody adopts frees its slots within one lease.
    /// The adopter must therefore adopt it within [`lease_left`](Self::lease_left) of the
    /// export (a longer [`lease`](Self::lease), e.g. through
    /// [`AcquireOptions::lease`](crate::AcquireOptions::lease) or
    /// [`set_lease`](Self::set_lease), gives it longer). The slots and fences stay the same.
    ///
    /// The token is a printable string (`to_string()`, parsed back with `parse()`), the same
    /// in Rust, Python and Node.js: see [`HandoffToken`] for its format.
    ///
    /// # Cost
    /// One script call (`release.lua` with the id to detach), awaited: the token exists only
    /// once Redis no longer counts on this process to renew the entry.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes hands out no token: the permit is released in
    /// the background, as if dropped.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the permit is already lost; connection and permission
    /// errors. On error the permit is released in the background (no token was handed out).
    pub async fn export(self) -> Result<HandoffToken, Error> {
        let (held, fences) = self.into_parts();
        let token = HandoffToken::new(
            held.name(),
            held.id(),
            held.grant().ticket,
            held.lease_len(),
            fences,
        );
        held.export().await?;
        Ok(token)
    }
}

/// Comma-separated decimals; `None` if one is not.
fn numbers<T: FromStr>(s: &str) -> Option<Vec<T>> {
    s.split(',').map(|x| x.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> HandoffToken {
        let fences = vec![
            Fence {
                slot: 0,
                generation: 1_733_480_000_000_001,
            },
            Fence {
                slot: 3,
                generation: 1_733_480_000_000_002,
            },
        ];
        HandoffToken::new(
            "jobs:a",
            "8156335641e74ba4.0-2a",
            42,
            Duration::from_secs(30),
            fences,
        )
    }

    #[test]
    fn prints_the_documented_form_and_parses_it_back() {
        let t = token();
        let s = t.to_string();
        assert_eq!(
            s,
            "redsem-handoff-1:8156335641e74ba4.0-2a:42:30000:0,3:1733480000000001,1733480000000002:jobs:a"
        );
        assert_eq!(s.parse::<HandoffToken>().unwrap(), t);
        assert_eq!(t.num_permits(), 2);
        assert_eq!(t.slots(), vec![0, 3]);
    }

    #[test]
    fn refuses_what_is_not_a_token() {
        let good = token().to_string();
        for bad in [
            String::new(),
            "redsem-handoff-2:x:1:1000:0:1:jobs".to_owned(),
            "redsem-handoff-1:x:1:1000:0:1".to_owned(),
            good.replace(":42:", ":x:"),
            good.replace(":30000:", ":0:"),
            good.replace("0,3", "0"),
            good.replace("8156335641e74ba4.0-2a", "a|b"),
            good.replace("jobs:a", "jobs a"),
            good.replace("jobs:a", ""),
        ] {
            let e = bad.parse::<HandoffToken>().unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e}");
        }
    }
}

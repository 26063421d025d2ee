//! One owner per rank: a trainer's global rank belongs to the process (session) that first asks
//! for it, so two trainers started with the same `RANK` (a launcher mistake) fail fast instead of
//! moving each other's position in the stream. A request from another session is refused, before
//! it can change anything the daemon holds, until the owner has been silent for the owner
//! timeout; then the new session takes the rank over (a restarted trainer).
//!
//! Version 3 requests carry the owner (PROTOCOL.md "One owner per rank"); older ones are served
//! without the check. A client that exits cleanly releases its rank at once. Bounded: at most [`MAX_OWNERS`] ranks are tracked; when full, owners silent
//! past the timeout are forgotten first.

use dsprep_client::protocol::Owner;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Global ranks tracked at most.
pub const MAX_OWNERS: usize = 1 << 16;

/// The owners of global ranks, as the serving loop (one thread) sees them.
pub struct Owners {
    timeout: Duration,
    /// Per global rank: the owning session and when it last asked.
    table: RefCell<HashMap<u32, (u64, Instant)>>,
}

impl Owners {
    pub fn new(timeout: Duration) -> Self {
        Owners {
            timeout,
            table: RefCell::new(HashMap::new()),
        }
    }

    /// `owner` asks (for data-parallel rank `rank`) at `now`: Ok if the global rank is its (or
    /// free, or its owner silent past the timeout: it is taken over), else the refusal's message.
    pub fn claim(&self, owner: Owner, rank: u32, now: Instant) -> Result<(), String> {
        let mut table = self.table.borrow_mut();
        if let Some(&(session, last)) = table.get(&owner.global_rank) {
            let silent = now.saturating_duration_since(last);
            if session != owner.session && silent < self.timeout {
                return Err(format!(
                    "rank {} (data-parallel rank {rank}) belongs to another trainer process \
                     (session {session:016x}, which asked {:.1} s ago): were two trainers \
                     started with the same RANK? A restarted trainer takes the rank over once \
                     the other has been silent for {} s",
                    owner.global_rank,
                    silent.as_secs_f64(),
                    self.timeout.as_secs()
                ));
            }
        } else if table.len() >= MAX_OWNERS {
            table.retain(|_, (_, last)| now.saturating_duration_since(*last) < self.timeout);
            if table.len() >= MAX_OWNERS {
                return Err(format!(
                    "the daemon already tracks {MAX_OWNERS} trainer ranks, all active"
                ));
            }
        }
        table.insert(owner.global_rank, (owner.session, now));
        Ok(())
    }

    /// The owner is done with its rank (a clean exit): the rank is free at once.
    pub fn release(&self, owner: Owner) {
        let mut table = self.table.borrow_mut();
        if table
            .get(&owner.global_rank)
            .is_some_and(|&(s, _)| s == owner.session)
        {
            table.remove(&owner.global_rank);
        }
    }

    /// The owner asked again (a parked request answered): it is not silent.
    pub fn touch(&self, owner: Owner, now: Instant) {
        let mut table = self.table.borrow_mut();
        if let Some((session, last)) = table.get_mut(&owner.global_rank)
            && *session == owner.session
        {
            *last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(global_rank: u32, session: u64) -> Owner {
        Owner {
            global_rank,
            session,
        }
    }

    #[test]
    fn a_rank_is_its_first_sessions_until_that_one_falls_silent() {
        let owners = Owners::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(owners.claim(owner(3, 7), 1, t0).is_ok());
        assert!(
            owners
                .claim(owner(3, 7), 1, t0 + Duration::from_secs(5))
                .is_ok()
        );
        let err = owners
            .claim(owner(3, 8), 1, t0 + Duration::from_secs(9))
            .unwrap_err();
        assert_eq!(
            err,
            "rank 3 (data-parallel rank 1) belongs to another trainer process (session \
             0000000000000007, which asked 4.0 s ago): were two trainers started with the same \
             RANK? A restarted trainer takes the rank over once the other has been silent for 10 s"
        );
        assert!(
            owners.claim(owner(4, 8), 1, t0).is_ok(),
            "a tensor-parallel peer: its own rank"
        );
        owners.touch(owner(3, 7), t0 + Duration::from_secs(12));
        assert!(
            owners
                .claim(owner(3, 8), 1, t0 + Duration::from_secs(21))
                .is_err()
        );
        assert!(
            owners
                .claim(owner(3, 8), 1, t0 + Duration::from_secs(22))
                .is_ok(),
            "taken over"
        );
        assert!(
            owners
                .claim(owner(3, 7), 1, t0 + Duration::from_secs(23))
                .is_err(),
            "and kept"
        );
        owners.release(owner(3, 7));
        assert!(
            owners
                .claim(owner(3, 7), 1, t0 + Duration::from_secs(23))
                .is_err(),
            "not its to release"
        );
        owners.release(owner(3, 8));
        assert!(
            owners
                .claim(owner(3, 7), 1, t0 + Duration::from_secs(23))
                .is_ok(),
            "released: free at once"
        );
    }

    #[test]
    fn the_table_is_bounded_and_forgets_silent_owners_first() {
        let owners = Owners::new(Duration::from_secs(1));
        let t0 = Instant::now();
        for r in 0..MAX_OWNERS as u32 {
            assert!(owners.claim(owner(r, 1), 0, t0).is_ok());
        }
        let err = owners.claim(owner(u32::MAX, 2), 0, t0).unwrap_err();
        assert!(err.contains("already tracks 65536 trainer ranks"), "{err}");
        assert!(
            owners
                .claim(owner(u32::MAX, 2), 0, t0 + Duration::from_secs(2))
                .is_ok()
        );
        assert_eq!(owners.table.borrow().len(), 1);
    }
}

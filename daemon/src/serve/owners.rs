//! One owner per rank: a trainer's global rank belongs to the process (session) that first asks
//! for it, so two trainers started with the same `RANK` (a launcher mistake) fail fast instead of
//! moving each other's position in the stream. A request from another session is refused, before
//! it can change anything the daemon holds, while the owner lives: its requests and (v6) its
//! client's keepalives keep the rank, whatever the time between steps. The rank passes when the
//! owner releases it (a clean exit), when it has been silent for the owner timeout (a crash), or
//! at once to a session that started later (v6: a restarted trainer). A session that started
//! earlier than the owner is a zombie of a replaced job: refused as superseded, for good.
//!
//! Version 3 requests carry the owner (PROTOCOL.md "One owner per rank"). Versions 1 and 2 carry
//! none (nor does a v3 request with session 0), so such a request is held to the same rule by its
//! connection: the data-parallel rank it reads is its connection's while it asks, it is refused a
//! rank a trainer holds (with the advice to upgrade), and a trainer that asks for the rank takes
//! it over at once. Bounded: at most [`MAX_OWNERS`] ranks are tracked; when full, owners silent
//! past the timeout are forgotten first; at most [`MAX_WARNED`] refused sessions are remembered
//! for the log.

use dsprep_client::protocol::Owner;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

/// Global ranks tracked at most.
pub const MAX_OWNERS: usize = 1 << 16;
/// Refused sessions remembered, so each is logged at warn once (beyond, the set starts over).
pub const MAX_WARNED: usize = 4096;

/// Why a claim was refused: what the reply's status says, and the `/metrics` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// Another live session holds the rank (status 18).
    Owned,
    /// A session that started later holds the rank: the claimant belongs to a replaced job
    /// (status 19).
    Superseded,
}

impl RefusalReason {
    /// The `reason` label of `dsprep_owner_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Owned => "owned",
            Self::Superseded => "superseded",
        }
    }
}

/// A refused claim: why, the reply's message, and whether it is the claimant session's first
/// refusal (logged at warn; later ones at debug).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: RefusalReason,
    pub message: String,
    pub first: bool,
}

/// Who asks for a rank.
#[derive(Clone, Copy, Debug)]
pub enum Claimant {
    /// A version 3 client: its global rank and session.
    Trainer(Owner),
    /// A version 1 or 2 client, known by its connection (a hash of its ZeroMQ identity).
    OldClient { connection: u64, version: u16 },
}

impl Claimant {
    /// The claimant of a request with `owner` (v3), else of its `version` and connection.
    pub fn of(owner: Option<Owner>, version: u16, identity: &[u8]) -> Self {
        match owner {
            Some(owner) => Self::Trainer(owner),
            None => {
                let mut hasher = DefaultHasher::new();
                identity.hash(&mut hasher);
                Self::OldClient {
                    connection: hasher.finish(),
                    version,
                }
            }
        }
    }

    fn key(self, rank: u32) -> Holder {
        match self {
            Self::Trainer(owner) => Holder::Rank(owner.global_rank),
            Self::OldClient { .. } => Holder::Connection(rank),
        }
    }

    fn session(self) -> u64 {
        match self {
            Self::Trainer(owner) => owner.session,
            Self::OldClient { connection, .. } => connection,
        }
    }

    /// When the session started (v6), else 0.
    fn started(self) -> u64 {
        match self {
            Self::Trainer(owner) => owner.started,
            Self::OldClient { .. } => 0,
        }
    }
}

/// What an entry of the table is kept under.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Holder {
    /// A global rank, owned by a v3 session.
    Rank(u32),
    /// A data-parallel rank read by an old client's connection.
    Connection(u32),
}

struct Entry {
    session: u64,
    /// When the session started (v6), else 0.
    started: u64,
    /// The data-parallel rank asked for.
    rank: u32,
    last: Instant,
}

/// The owners of global ranks, as the serving loop (one thread) sees them.
pub struct Owners {
    timeout: Duration,
    table: RefCell<HashMap<Holder, Entry>>,
    /// Sessions already refused once (logged at warn).
    warned: RefCell<HashSet<u64>>,
}

/// How a claimant's start time compares with the owner's: both must be known (v6).
fn started_later(claimant: u64, owner: u64) -> bool {
    claimant != 0 && owner != 0 && claimant > owner
}

impl Owners {
    pub fn new(timeout: Duration) -> Self {
        Owners {
            timeout,
            table: RefCell::new(HashMap::new()),
            warned: RefCell::new(HashSet::new()),
        }
    }

    /// `who` asks for data-parallel rank `rank` at `now`: Ok if the rank is its (or free, or its
    /// owner gone or superseded: it is taken over), else the refusal, counted once per session
    /// as `first`.
    pub fn claim(&self, who: Claimant, rank: u32, now: Instant) -> Result<(), Refusal> {
        self.decide(who, rank, now).map_err(|(reason, message)| {
            let mut warned = self.warned.borrow_mut();
            if warned.len() >= MAX_WARNED {
                warned.clear();
            }
            Refusal {
                reason,
                message,
                first: warned.insert(who.session()),
            }
        })
    }

    /// The rule of [`Owners::claim`]: a session that started earlier than the owner is
    /// superseded (whether the owner is silent or not: its job was replaced); a live owner keeps
    /// the rank from any other session, except one that started later.
    fn decide(
        &self,
        who: Claimant,
        rank: u32,
        now: Instant,
    ) -> Result<(), (RefusalReason, String)> {
        let mut table = self.table.borrow_mut();
        let active = |entry: &Entry| now.saturating_duration_since(entry.last) < self.timeout;
        let key = who.key(rank);
        if let Some(entry) = table.get(&key)
            && entry.session != who.session()
        {
            if started_later(entry.started, who.started()) {
                return Err((
                    RefusalReason::Superseded,
                    self.superseded(who, rank, entry, now),
                ));
            }
            if active(entry) && !started_later(who.started(), entry.started) {
                return Err((
                    RefusalReason::Owned,
                    self.refusal(who, rank, key, entry, now),
                ));
            }
        }
        match who {
            // A trainer's claim outranks an ownerless connection's: it takes the rank over.
            Claimant::Trainer(_) => {
                table.remove(&Holder::Connection(rank));
            }
            // An ownerless connection may not read a rank any trainer holds (a scan, paid only
            // by ownerless requests).
            Claimant::OldClient { .. } => {
                let trainer = table.iter().find(|(holder, entry)| {
                    matches!(holder, Holder::Rank(_)) && entry.rank == rank && active(entry)
                });
                if let Some((&holder, entry)) = trainer {
                    return Err((
                        RefusalReason::Owned,
                        self.refusal(who, rank, holder, entry, now),
                    ));
                }
            }
        }
        if !table.contains_key(&key) && table.len() >= MAX_OWNERS {
            table.retain(|_, entry| active(entry));
            if table.len() >= MAX_OWNERS {
                return Err((
                    RefusalReason::Owned,
                    format!("the daemon already tracks {MAX_OWNERS} trainer ranks, all active"),
                ));
            }
        }
        table.insert(
            key,
            Entry {
                session: who.session(),
                started: who.started(),
                rank,
                last: now,
            },
        );
        Ok(())
    }

    /// Why `who`, a session that started before the owner `entry`, may not have `rank`.
    fn superseded(&self, who: Claimant, rank: u32, entry: &Entry, now: Instant) -> String {
        let silent = now.saturating_duration_since(entry.last).as_secs_f64();
        let global = match who {
            Claimant::Trainer(owner) => owner.global_rank,
            Claimant::OldClient { .. } => rank,
        };
        format!(
            "rank {global} (data-parallel rank {rank}) belongs to session {:016x}, started at \
             {} ns since the Unix epoch (it asked {silent:.1} s ago); this session {:016x} \
             started earlier, at {} ns: this process belongs to a job that was replaced, and \
             should exit",
            entry.session,
            entry.started,
            who.session(),
            who.started(),
        )
    }

    /// Why `who` may not have `rank`: `holder` (`entry`) has it.
    fn refusal(
        &self,
        who: Claimant,
        rank: u32,
        holder: Holder,
        entry: &Entry,
        now: Instant,
    ) -> String {
        let silent = now.saturating_duration_since(entry.last).as_secs_f64();
        let timeout = self.timeout.as_secs();
        let no_owner = |version: u16| {
            if version < 3 {
                format!(
                    "this request speaks protocol version {version}, which carries no owner: \
                     upgrade the client to a dsprep client of protocol version 3"
                )
            } else {
                "this request carries no owner (session 0): have the client send its session"
                    .to_string()
            }
        };
        match (who, holder) {
            (Claimant::Trainer(owner), _) => format!(
                "rank {} (data-parallel rank {rank}) belongs to another trainer process \
                 (session {:016x}, which asked {silent:.1} s ago): were two trainers \
                 started with the same RANK? A trainer process started later takes the rank \
                 over at once, any other once the owner has been silent for {timeout} s",
                owner.global_rank, entry.session,
            ),
            (Claimant::OldClient { version, .. }, Holder::Rank(global)) => format!(
                "data-parallel rank {rank} belongs to a trainer process (rank {global}, session \
                 {:016x}, which asked {silent:.1} s ago); {}",
                entry.session,
                no_owner(version)
            ),
            (Claimant::OldClient { version, .. }, Holder::Connection(_)) => format!(
                "data-parallel rank {rank} is being read by another connection, which asked \
                 {silent:.1} s ago (a second reader would move its place in the stream); {}, \
                 or wait until the other has been silent for {timeout} s",
                no_owner(version)
            ),
        }
    }

    /// The owner is done with its rank (a clean exit): the rank is free at once.
    pub fn release(&self, owner: Owner) {
        let mut table = self.table.borrow_mut();
        let key = Holder::Rank(owner.global_rank);
        if table.get(&key).is_some_and(|e| e.session == owner.session) {
            table.remove(&key);
        }
    }

    /// The owner's client is alive (a v6 keepalive): it is not silent. A keepalive from any
    /// other session changes nothing.
    pub fn keep(&self, owner: Owner, now: Instant) {
        let mut table = self.table.borrow_mut();
        if let Some(entry) = table.get_mut(&Holder::Rank(owner.global_rank))
            && entry.session == owner.session
        {
            entry.last = now;
        }
    }

    /// Whether `owner` holds its global rank now, for data-parallel rank `rank` (a loss report is
    /// taken only from the rank's owner; it claims nothing).
    pub fn owns(&self, owner: Owner, rank: u32) -> bool {
        let table = self.table.borrow();
        table
            .get(&Holder::Rank(owner.global_rank))
            .is_some_and(|e| e.session == owner.session && e.rank == rank)
    }

    /// `who` asked again for `rank` (a parked request answered): it is not silent.
    pub fn touch(&self, who: Claimant, rank: u32, now: Instant) {
        let mut table = self.table.borrow_mut();
        if let Some(entry) = table.get_mut(&who.key(rank))
            && entry.session == who.session()
        {
            entry.last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(global_rank: u32, session: u64) -> Claimant {
        started(global_rank, session, 0)
    }

    /// A v6 trainer: its session started at `started` ns.
    fn started(global_rank: u32, session: u64, started: u64) -> Claimant {
        Claimant::Trainer(Owner {
            global_rank,
            session,
            started,
        })
    }

    fn old(connection: u64) -> Claimant {
        Claimant::OldClient {
            connection,
            version: 1,
        }
    }

    fn release(owners: &Owners, who: Claimant) {
        let Claimant::Trainer(owner) = who else {
            panic!("only trainers release")
        };
        owners.release(owner);
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
        assert_eq!((err.reason, err.first), (RefusalReason::Owned, true));
        assert_eq!(
            err.message,
            "rank 3 (data-parallel rank 1) belongs to another trainer process (session \
             0000000000000007, which asked 4.0 s ago): were two trainers started with the same \
             RANK? A trainer process started later takes the rank over at once, any other once \
             the owner has been silent for 10 s"
        );
        assert!(
            owners.claim(owner(4, 8), 1, t0).is_ok(),
            "a tensor-parallel peer: its own rank"
        );
        owners.touch(owner(3, 7), 1, t0 + Duration::from_secs(12));
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
        release(&owners, owner(3, 7));
        assert!(
            owners
                .claim(owner(3, 7), 1, t0 + Duration::from_secs(23))
                .is_err(),
            "not its to release"
        );
        release(&owners, owner(3, 8));
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
        assert!(
            err.message.contains("already tracks 65536 trainer ranks"),
            "{err:?}"
        );
        assert!(
            owners
                .claim(owner(u32::MAX, 2), 0, t0 + Duration::from_secs(2))
                .is_ok()
        );
        assert_eq!(owners.table.borrow().len(), 1);
    }

    /// An old client (no owner) on one connection asks for ranks 0 and 1 while trainers hold
    /// them: refused, so it moves nothing. A trainer takes a rank over from such a connection.
    #[test]
    fn ownerless_requests_are_held_to_one_owner_by_their_connection() {
        let owners = Owners::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(owners.claim(owner(0, 7), 0, t0).is_ok());
        assert!(owners.claim(owner(1, 9), 1, t0).is_ok());
        let err = owners
            .claim(old(42), 0, t0 + Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(
            err.message,
            "data-parallel rank 0 belongs to a trainer process (rank 0, session \
             0000000000000007, which asked 1.0 s ago); this request speaks protocol version 1, \
             which carries no owner: upgrade the client to a dsprep client of protocol version 3"
        );
        assert!(owners.claim(old(42), 1, t0).is_err());
        assert!(owners.claim(old(42), 2, t0).is_ok(), "a free rank is its");
        assert!(
            owners
                .claim(old(42), 2, t0 + Duration::from_secs(3))
                .is_ok(),
            "and stays its"
        );
        let err = owners
            .claim(old(43), 2, t0 + Duration::from_secs(4))
            .unwrap_err();
        assert!(
            err.message
                .starts_with("data-parallel rank 2 is being read by another connection"),
            "{err:?}"
        );
        owners.touch(old(42), 2, t0 + Duration::from_secs(5));
        assert!(
            owners
                .claim(old(43), 2, t0 + Duration::from_secs(14))
                .is_err()
        );
        assert!(
            owners
                .claim(old(43), 2, t0 + Duration::from_secs(15))
                .is_ok(),
            "taken over once the first is silent"
        );
        assert!(
            owners
                .claim(owner(2, 11), 2, t0 + Duration::from_secs(16))
                .is_ok(),
            "a trainer takes the rank over at once"
        );
        assert!(
            owners
                .claim(old(43), 2, t0 + Duration::from_secs(16))
                .is_err()
        );
        // Tensor-parallel peers of one data-parallel rank keep their own global ranks.
        assert!(
            owners
                .claim(owner(3, 12), 2, t0 + Duration::from_secs(16))
                .is_ok()
        );
        // A silent trainer's rank is an ownerless connection's to read.
        assert!(
            owners
                .claim(old(43), 1, t0 + Duration::from_secs(10))
                .is_ok()
        );
    }

    /// v6: a session that started later takes a live owner's rank at once (a restarted
    /// trainer); one that started earlier is superseded for good, live owner or not; keepalives
    /// keep only the owner's rank; equal or unknown start times fall back to the timeout.
    #[test]
    fn a_later_session_wins_and_an_earlier_one_is_superseded() {
        let owners = Owners::new(Duration::from_secs(1));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(owners.claim(started(0, 7, 100), 0, t0).is_ok());
        // A slow step: the keepalives keep the rank past the timeout.
        for s in 1..=5 {
            owners.keep(
                Owner {
                    global_rank: 0,
                    session: 7,
                    started: 100,
                },
                at(s),
            );
        }
        let err = owners.claim(started(0, 8, 100), 0, at(5)).unwrap_err();
        assert_eq!(
            err.reason,
            RefusalReason::Owned,
            "same start: a launcher mistake"
        );
        let err = owners.claim(owner(0, 9), 0, at(5)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Owned, "no start time (v3 to v5)");
        let err = owners.claim(started(0, 6, 50), 0, at(5)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Superseded);
        assert_eq!(
            err.message,
            "rank 0 (data-parallel rank 0) belongs to session 0000000000000007, started at 100 \
             ns since the Unix epoch (it asked 0.0 s ago); this session 0000000000000006 started \
             earlier, at 50 ns: this process belongs to a job that was replaced, and should exit"
        );
        assert!(err.first);
        assert!(!owners.claim(started(0, 6, 50), 0, at(5)).unwrap_err().first);
        // A zombie's keepalive keeps nothing; a restarted trainer takes over at once.
        assert!(owners.claim(started(0, 10, 200), 0, at(5)).is_ok());
        let err = owners.claim(started(0, 7, 100), 0, at(5)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Superseded, "the old owner");
        let err = owners.claim(started(0, 7, 100), 0, at(60)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Superseded, "even once silent");
        assert!(
            owners.claim(owner(0, 9), 0, at(60)).is_ok(),
            "a silent owner's rank passes to a session without a start time"
        );
    }
}

//! One owner per rank for any step time (protocol v6), end to end on a real daemon: a trainer
//! whose steps are slower than `--owner-timeout` keeps its rank by its client's keepalives, and a
//! zombie of a replaced job (a session that started earlier) is refused as superseded, counted,
//! and can never move the stream under the new owner. Served bytes must equal `dsprep pack`'s.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::protocol::{Owner, PROTOCOL_VERSION, Request, RequestKind, Status};
use dsprep_client::{Client, ClientConfig, ClientError, PackedDataset, process_session_started};
use std::path::Path;
use std::time::{Duration, Instant};
use support::daemon::Daemon;
use support::raw_rank::RawRank;
use support::*;

/// A zombie's start time: this long before this process's sessions started.
const EARLIER_NS: u64 = 10_000_000_000;

/// The bytes rank `rank` of 2 (micro batch 1) must receive at `step`.
fn expected(dataset: &PackedDataset, rank: u64, step: u64) -> Vec<u8> {
    let window = dataset.window(step * 2 + rank).unwrap();
    window.tokens.as_bytes().to_vec()
}

/// `dsprep serve` for world size 2, micro batch 1, prefetch 4, with metrics and `owner_timeout`.
fn daemon(dir: &Path, owner_timeout: &str) -> Daemon {
    let endpoint = format!("ipc://{}", dir.join("d.sock").display());
    let args = [
        "--world-size",
        "2",
        "--micro-batch",
        "1",
        "--prefetch",
        "4",
        "--metrics",
        "127.0.0.1:0",
        "--owner-timeout",
        owner_timeout,
    ];
    Daemon::start_with(&quickstart(), &endpoint, &args).unwrap()
}

/// A client of rank `rank` of 2 in session `session` (started when this process's did).
fn trainer(endpoint: &str, rank: u32, session: u64) -> Client {
    let config = ClientConfig {
        endpoint: endpoint.into(),
        rank,
        world_size: 2,
        recipe_hash: None,
        timeout: Duration::from_secs(10),
        attempts: 1,
        parallel: Default::default(),
        session: Some(session),
        curve: None,
    };
    Client::with_config(config).unwrap()
}

/// A batch request in `version` for rank `rank` of 2 at `step`, by `session` started at
/// `started` (sent from v6 on); the request id is the step's.
fn batch(version: u16, rank: u32, step: u64, session: u64, started: u64) -> Request {
    Request {
        version,
        kind: RequestKind::Batch,
        request_id: step + 1,
        rank,
        world_size: 2,
        step,
        recipe_hash: None,
        owner: Some(Owner {
            global_rank: rank,
            session,
            started,
        }),
    }
}

/// NxD Llama 70B takes 244 s a step; here the steps take 3 s and the owner timeout is 1 s. The
/// owner's client keeps its rank between steps: a second trainer started at the same time (a
/// launcher mistake) and a v5 client are refused as "rank owned", the owner still heard within
/// the last second; a session started earlier is refused as superseded. None of them moves the
/// rank's position, and the owner gets the packed stream's bytes. Once the owner dies (its
/// keepalives stop) the rank passes after the timeout, as before.
#[test]
fn a_rank_stays_its_trainers_through_steps_slower_than_the_owner_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let daemon = daemon(tmp.path(), "1");
    let started = process_session_started();
    let (mut owner, mut other) = (
        trainer(&daemon.endpoint, 0, 0xa1),
        trainer(&daemon.endpoint, 1, 0xb1),
    );
    let peer = RawRank::connect(&daemon.endpoint);
    for step in 0..3 {
        let (r0, r1) = (
            owner.batch_at(step).unwrap().unwrap(),
            other.batch_at(step).unwrap().unwrap(),
        );
        assert!(
            r0.tokens().as_bytes() == expected(&dataset, 0, step),
            "step {step}"
        );
        assert!(
            r1.tokens().as_bytes() == expected(&dataset, 1, step),
            "step {step}"
        );
        if step == 2 {
            break;
        }
        std::thread::sleep(Duration::from_secs(3)); // the step: 3 owner timeouts
        let position = daemon.metric("dsprep_rank_step{rank=\"0\"}");
        let (h, m) = peer.ask(&batch(PROTOCOL_VERSION, 0, step + 3, 0x30, started));
        assert_eq!(
            (h.version, h.status),
            (PROTOCOL_VERSION, Status::RankOwned),
            "{m}"
        );
        assert!(
            m.starts_with(
                "rank 0 (data-parallel rank 0) belongs to another trainer process (session \
                 00000000000000a1, which asked 0."
            ),
            "heard within the last second: {m}"
        );
        let (h, m) = peer.ask(&batch(5, 0, step + 3, 0x40, 0));
        assert_eq!((h.version, h.status), (5, Status::RankOwned), "{m}");
        let zombie = started - EARLIER_NS;
        let (h, m) = peer.ask(&batch(PROTOCOL_VERSION, 0, step + 3, 0x20, zombie));
        assert_eq!(
            (h.version, h.status),
            (PROTOCOL_VERSION, Status::Superseded),
            "{m}"
        );
        let prefix = format!(
            "rank 0 (data-parallel rank 0) belongs to session 00000000000000a1, started at \
             {started} ns since the Unix epoch (it asked 0."
        );
        let suffix = format!(
            " s ago); this session 0000000000000020 started earlier, at {zombie} ns: this \
             process belongs to a job that was replaced, and should exit"
        );
        assert!(m.starts_with(&prefix) && m.ends_with(&suffix), "{m}");
        assert_eq!(
            daemon.metric("dsprep_rank_step{rank=\"0\"}"),
            position,
            "no refused request moved the rank"
        );
    }
    assert_eq!(
        daemon.metric("dsprep_owner_refused_total{reason=\"owned\"}"),
        4.0
    );
    assert_eq!(
        daemon.metric("dsprep_owner_refused_total{reason=\"superseded\"}"),
        2.0
    );
    // The owner's process dies: its keepalives stop, and 1 s later the rank passes.
    owner.abandon();
    let died = Instant::now();
    let deadline = died + Duration::from_secs(10);
    let (h, m) = loop {
        let (h, m) = peer.ask(&batch(PROTOCOL_VERSION, 0, 3, 0x30, started));
        if h.status != Status::RankOwned || Instant::now() > deadline {
            break (h, m);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(h.status, Status::Ok, "{m}");
    assert!(
        died.elapsed() >= Duration::from_millis(700),
        "{:?}",
        died.elapsed()
    );
}

/// A SIGKILLed job's workers survive and keep reading (they started before the new job's), and
/// read first: the daemon serves them, as it would a trainer that outlived a daemon restart. The
/// new job's trainers, resuming below the zombies' steps, take the ranks over at once (not after
/// the 30 s owner timeout) and put the ranks' positions back where they ask. From then on every
/// zombie request is refused as superseded, counted and logged once per session, before the
/// daemon looks at the step: the zombies push far ahead, which would have dropped the steps the
/// new owners still need, and the new owners read the packed stream's bytes on.
#[test]
fn a_zombie_of_a_replaced_job_is_refused_and_cannot_make_the_new_owners_step_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let daemon = daemon(tmp.path(), "30");
    let zombie_started = process_session_started() - EARLIER_NS;
    let zombie = RawRank::connect(&daemon.endpoint);
    for step in 0..12 {
        for rank in 0..2 {
            let ask = batch(
                PROTOCOL_VERSION,
                rank,
                step,
                0x50 + u64::from(rank),
                zombie_started,
            );
            let (h, m) = zombie.ask(&ask);
            assert_eq!(h.status, Status::Ok, "{m}");
        }
    }
    assert_eq!(daemon.metric("dsprep_rank_step{rank=\"0\"}"), 11.0);
    let taken = Instant::now();
    let (mut r0, mut r1) = (
        trainer(&daemon.endpoint, 0, 0x60),
        trainer(&daemon.endpoint, 1, 0x61),
    );
    let b0 = r0.batch_at(5).unwrap().unwrap();
    assert!(b0.tokens().as_bytes() == expected(&dataset, 0, 5));
    assert_eq!(
        daemon.metric("dsprep_rank_step{rank=\"0\"}"),
        5.0,
        "the new owner's step"
    );
    let b1 = r1.batch_at(5).unwrap().unwrap();
    assert!(b1.tokens().as_bytes() == expected(&dataset, 1, 5));
    assert!(
        taken.elapsed() < Duration::from_secs(5),
        "taken over at once"
    );

    // A zombie's keepalive is never answered and keeps nothing; its requests are refused.
    let keepalive = Request {
        kind: RequestKind::Keepalive,
        request_id: 999,
        ..batch(PROTOCOL_VERSION, 0, 0, 0x50, zombie_started)
    };
    zombie.socket.send(keepalive.encode(), 0).unwrap();
    let mut refused = 0;
    for step in 12..40 {
        for rank in 0..2 {
            let session = 0x50 + u64::from(rank);
            let (h, m) = zombie.ask(&batch(
                PROTOCOL_VERSION,
                rank,
                step,
                session,
                zombie_started,
            ));
            assert_eq!(
                (h.request_id, h.status),
                (step + 1, Status::Superseded),
                "{m}"
            );
            assert!(
                m.starts_with(&format!(
                    "rank {rank} (data-parallel rank {rank}) belongs to session 000000000000006{rank}"
                )),
                "{m}"
            );
            assert!(
                m.ends_with("this process belongs to a job that was replaced, and should exit"),
                "{m}"
            );
            refused += 1;
        }
    }
    assert_eq!(daemon.metric("dsprep_rank_step{rank=\"0\"}"), 5.0);
    assert_eq!(daemon.metric("dsprep_rank_step{rank=\"1\"}"), 5.0);
    for step in 6..20 {
        let b0 = r0.batch_at(step).unwrap().unwrap();
        let b1 = r1.batch_at(step).unwrap().unwrap();
        assert!(
            b0.tokens().as_bytes() == expected(&dataset, 0, step),
            "step {step}"
        );
        assert!(
            b1.tokens().as_bytes() == expected(&dataset, 1, step),
            "step {step}"
        );
    }
    assert_eq!(
        daemon.metric("dsprep_owner_refused_total{reason=\"superseded\"}"),
        f64::from(refused)
    );
    assert_eq!(
        daemon.metric("dsprep_replies_total{status=\"superseded\"}"),
        f64::from(refused)
    );
    let warned = daemon
        .log_text()
        .matches("refused a session its rank (logged once per session)")
        .count();
    assert_eq!(
        warned,
        2,
        "one warning per zombie session:\n{}",
        daemon.log_text()
    );

    // Two live trainers of one start (a launcher mistake) still fail fast, as before.
    let config = ClientConfig {
        session: Some(0x70),
        timeout: Duration::from_secs(1),
        ..r0.config().clone()
    };
    let mut same_start = Client::with_config(config).unwrap();
    let err = same_start.batch_at(20).unwrap_err();
    assert!(matches!(err, ClientError::RankOwned(_)), "{err}");
}

/// A trainer restarted while the old process still runs (the launcher started it again, a
/// torchelastic worker survived): the new process, a `dsprep tap` started after this test's
/// session, takes the rank over at once, though the old one is live and the owner timeout is
/// 30 s; the old process's client gets `ClientError::Superseded` at once, never retried, saying
/// to exit.
#[test]
fn a_restarted_trainer_takes_its_rank_from_the_live_old_one_which_is_told_to_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = daemon(tmp.path(), "30");
    let mut old = trainer(&daemon.endpoint, 0, 0x80);
    old.batch_at(0).unwrap().unwrap();
    // The new process reads steps 1 to 3, then waits for rank 1 (prefetch 4): it stays live.
    let mut new = support::daemon::tap(&daemon.endpoint, 0, 2, 1, 10, &tmp.path().join("t.bin"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while daemon.metric("dsprep_rank_step{rank=\"0\"}") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the restarted trainer never read"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let asked = Instant::now();
    let err = old.batch_at(1).unwrap_err();
    assert!(asked.elapsed() < Duration::from_secs(1), "never retried");
    let ClientError::Superseded(message) = &err else {
        panic!("{err}");
    };
    assert!(
        err.to_string()
            .starts_with("superseded: rank 0 (data-parallel rank 0) belongs to session "),
        "{err}"
    );
    let started = process_session_started();
    assert!(
        message.ends_with(&format!(
            "; this session 0000000000000080 started earlier, at {started} ns: this process \
             belongs to a job that was replaced, and should exit"
        )),
        "{message}"
    );
    assert_eq!(
        daemon.metric("dsprep_owner_refused_total{reason=\"superseded\"}"),
        1.0
    );
    new.kill().unwrap();
    new.wait().unwrap();
}

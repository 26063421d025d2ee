//! `dsprep serve` end to end: a real daemon process, real `dsprep tap` processes and the Rust
//! client on real ZeroMQ sockets. Served bytes must equal what `dsprep pack` writes.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::protocol::{Owner, PROTOCOL_VERSION, ReplyHeader, Request, RequestKind, Status};
use dsprep_client::{Client, ClientConfig, ClientError, PackedDataset};
use std::path::Path;
use std::time::Duration;
use support::daemon::{Daemon, headers, tap, tap_all};
use support::raw_rank::RawRank;
use support::*;

/// The quickstart packed with the same recipe, for comparison.
fn packed(dir: &Path) -> PackedDataset {
    pack_dataset(&quickstart(), &dir.join("packed"))
}

/// The bytes rank `rank` must receive for `steps`.
fn expected(
    dataset: &PackedDataset,
    world: u64,
    mb: u64,
    rank: u64,
    steps: std::ops::Range<u64>,
) -> Vec<u8> {
    steps
        .flat_map(|s| (0..mb).map(move |k| s * world * mb + rank * mb + k))
        .flat_map(|w| dataset.window(w).unwrap().tokens.as_bytes().to_vec())
        .collect()
}

fn client(endpoint: &str, rank: u32, world_size: u32) -> Client {
    let config = ClientConfig {
        endpoint: endpoint.into(),
        rank,
        world_size,
        recipe_hash: None,
        timeout: Duration::from_secs(10),
        attempts: 2,
        parallel: Default::default(),
        session: None,
        curve: None,
    };
    Client::with_config(config).unwrap()
}

#[test]
fn eight_ranks_get_the_packed_windows_and_all_end_at_the_same_step() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = packed(tmp.path());
    let daemon = Daemon::start(tmp.path(), &quickstart(), 8, 2, 4);
    let num_steps = dataset.num_windows() / 16;
    let outs: Vec<_> = (0..8)
        .map(|r| tmp.path().join(format!("rank{r}.bin")))
        .collect();
    let taps: Vec<_> = (0..8)
        .map(|r| tap(&daemon.endpoint, r, 8, 0, num_steps + 5, &outs[r as usize]))
        .collect();
    for (r, child) in taps.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "rank {r}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("rank {r}: wrote {num_steps} steps to {}", outs[r].display())
        );
    }
    for r in 0..8u64 {
        let got = std::fs::read(&outs[r as usize]).unwrap();
        assert!(
            got == expected(&dataset, 8, 2, r, 0..num_steps),
            "rank {r}'s bytes differ from the packed windows"
        );
        let h = headers(&outs[r as usize]);
        assert_eq!(h.len() as u64, num_steps + 1);
        assert_eq!(h.last().unwrap()["end_of_data"], true, "rank {r}");
        assert_eq!(
            h.last().unwrap()["step"],
            num_steps,
            "every rank ends at the same step"
        );
        let first = &h[3];
        assert_eq!(first["first_window"], (3 * 16 + r * 2));
        let window = dataset.window(3 * 16 + r * 2).unwrap();
        assert_eq!(first["doc_starts"][0], serde_json::json!(window.doc_starts));
        // Protocol v3: every row's document sources are the packed window's.
        for (s, step) in h[..num_steps as usize].iter().enumerate() {
            for k in 0..2u64 {
                let window = dataset.window(s as u64 * 16 + r * 2 + k).unwrap();
                let (docs, lead) = (window.doc_sources.unwrap(), window.lead_source.unwrap());
                assert_eq!(
                    step["doc_sources"][k as usize],
                    serde_json::json!(docs),
                    "rank {r} step {s}"
                );
                assert_eq!(
                    step["lead_sources"][k as usize],
                    serde_json::json!(lead),
                    "rank {r} step {s}"
                );
            }
        }
    }
    assert_eq!(
        daemon.metric("dsprep_steps{kind=\"total\"}"),
        num_steps as f64
    );
    assert_eq!(
        daemon.metric("dsprep_replies_total{status=\"end_of_data\"}"),
        8.0
    );
}

/// `/metrics` gives the mix ledger per phase (`dsprep_phase_mix{phase,source,kind}` and counters
/// per phase and source). Served to the end, phase 0 holds exactly what the packed manifest's
/// phase 0 holds; phase 1 holds the rest of what was produced (the dropped tail included).
#[test]
fn metrics_give_every_phase_ledger_as_the_manifest_does() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = quickstart_with_a_phase(tmp.path(), 400_000);
    let dataset = pack_dataset(&recipe, &tmp.path().join("packed"));
    let m = dataset.manifest();
    let daemon = Daemon::start(tmp.path(), &recipe, 8, 2, 4);
    let num_steps = dataset.num_windows() / 16;
    tap_all(tmp.path(), &[&daemon], 8, 0, num_steps + 1, "r", &[]);
    let metric = |name: &str, phase: usize, source: &str, kind: Option<&str>| {
        let kind = kind.map_or(String::new(), |k| format!(",kind=\"{k}\""));
        daemon.metric(&format!(
            "{name}{{phase=\"{phase}\",source=\"{source}\"{kind}}}"
        ))
    };
    for s in &m.phases[0].sources {
        let name = s.name.as_str();
        assert_eq!(
            metric("dsprep_phase_tokens_total", 0, name, None),
            s.tokens as f64
        );
        assert_eq!(
            metric("dsprep_phase_documents_total", 0, name, None),
            s.documents as f64
        );
        for (kind, value) in [
            ("target", s.target_fraction),
            ("tokens", s.realized_token_fraction),
            ("documents", s.realized_fraction),
            ("deviation", s.deviation),
        ] {
            // serde_json reads the manifest's floats to within an ulp or so.
            let served = metric("dsprep_phase_mix", 0, name, Some(kind));
            assert!(
                (served - value).abs() < 1e-15,
                "{name} {kind}: {served} {value}"
            );
        }
    }
    let phase1: f64 = (m.sources.iter())
        .map(|s| metric("dsprep_phase_tokens_total", 1, &s.name, None))
        .sum();
    assert_eq!(
        phase1,
        (m.phases[1].tokens + m.dropped_tail_tokens) as f64,
        "phase 1: its windows and the dropped tail"
    );
    for name in ["c4", "zyda-2"] {
        assert_eq!(metric("dsprep_phase_tokens_total", 1, name, None), 0.0);
        assert_eq!(metric("dsprep_phase_mix", 1, name, Some("target")), 0.0);
    }
    assert_eq!(
        metric("dsprep_phase_mix", 1, "finemath", Some("target")),
        0.3
    );
}

#[test]
fn a_killed_rank_restarts_and_gets_the_same_bytes_from_its_step() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = packed(tmp.path());
    let daemon = Daemon::start(tmp.path(), &quickstart(), 2, 1, 4);
    let steps = 200;
    let out0 = tmp.path().join("r0.bin");
    let rank0 = tap(&daemon.endpoint, 0, 2, 0, steps, &out0);
    let first = tmp.path().join("r1-first.bin");
    let mut rank1 = tap(&daemon.endpoint, 1, 2, 0, steps, &first);
    while headers(&first).len() < 20 {
        std::thread::sleep(Duration::from_millis(5));
    }
    rank1.kill().unwrap(); // SIGKILL
    rank1.wait().unwrap();
    let done = headers(&first).len() as u64;
    let restart_at = done - 1; // ask again for the last step it completed, then go on
    let second = tmp.path().join("r1-second.bin");
    let out = tap(
        &daemon.endpoint,
        1,
        2,
        restart_at,
        steps - restart_at,
        &second,
    )
    .wait_with_output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(rank0.wait_with_output().unwrap().status.success());
    let first_bytes = std::fs::read(&first).unwrap();
    let second_bytes = std::fs::read(&second).unwrap();
    assert!(second_bytes == expected(&dataset, 2, 1, 1, restart_at..steps));
    assert!(first_bytes[..(done * 513 * 2) as usize] == expected(&dataset, 2, 1, 1, 0..done)[..]);
    assert!(std::fs::read(&out0).unwrap() == expected(&dataset, 2, 1, 0, 0..steps));
}

#[test]
fn a_slow_rank_holds_the_pipeline_back_and_memory_stays_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(tmp.path(), &quickstart(), 2, 1, 3);
    let mut fast = client_in_session(&daemon.endpoint, 0, FAST_SESSION, 10);
    for step in 0..3 {
        assert!(fast.batch_at(step).unwrap().is_some());
    }
    std::thread::sleep(Duration::from_millis(300));
    // Rank 1 has not asked for anything: the pipeline stops 3 steps ahead of it.
    assert_eq!(daemon.metric("dsprep_steps{kind=\"produced\"}"), 3.0);
    assert_eq!(daemon.metric("dsprep_steps{kind=\"held\"}"), 3.0);
    // A step beyond the window is refused with a typed error rather than parked.
    // (Asked by hand in the fast trainer's session: rank 0 is its.)
    let raw = RawRank::connect(&daemon.endpoint);
    let (header, message) = raw.ask(&owned(request(0, 2, 10), FAST_SESSION));
    assert_eq!(header.status, Status::StepAhead);
    assert_eq!(
        message,
        "step 10 is too far ahead: slower ranks hold the daemon at steps below 3 (prefetch window)"
    );
    let mut slow = client(&daemon.endpoint, 1, 2);
    for step in 0..50 {
        assert!(slow.batch_at(step).unwrap().is_some());
        // The fast rank may run prefetch - 1 = 2 steps ahead of the slow one.
        assert!(
            fast.batch_at(step + 2).unwrap().is_some(),
            "the fast rank moves as the slow one does"
        );
        assert!(
            daemon.metric("dsprep_steps{kind=\"held\"}") <= 3.0 + 8.0,
            "prefetch + history (HISTORY_STEPS)"
        );
    }
    assert_eq!(daemon.metric("dsprep_rank_step{rank=\"0\"}"), 51.0);
    assert_eq!(daemon.metric("dsprep_rank_lag_steps{rank=\"1\"}"), 2.0);
}

const FAST_SESSION: u64 = 0x5e55_1017;

/// `request` sent by trainer session `session` (its global rank is its data-parallel rank).
fn owned(request: Request, session: u64) -> Request {
    Request {
        owner: Some(Owner {
            global_rank: request.rank,
            session,
            started: 0,
        }),
        ..request
    }
}

/// Ask until the daemon no longer answers "rank owned" (a trainer's release is on its way from
/// another socket), at most 5 s.
fn ask_once_released(raw: &RawRank, request: &Request) -> (ReplyHeader, String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (header, message) = raw.ask(request);
        if header.status != Status::RankOwned || std::time::Instant::now() > deadline {
            return (header, message);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn request(rank: u32, world_size: u32, step: u64) -> Request {
    Request {
        version: PROTOCOL_VERSION,
        kind: RequestKind::Batch,
        request_id: 42,
        rank,
        world_size,
        step,
        recipe_hash: None,
        owner: None,
    }
}

#[test]
fn every_protocol_error_is_typed_and_the_daemon_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(tmp.path(), &quickstart(), 2, 1, 2);
    let raw = RawRank::connect(&daemon.endpoint);

    let mut bad_version = request(0, 2, 0).encode();
    bad_version[4] = 9;
    let (h, m) = raw.ask_frames(&[&bad_version]);
    assert_eq!((h.status, h.request_id), (Status::UnsupportedVersion, 42));
    assert_eq!(
        m,
        "request rejected: protocol version 9 is not supported (this side speaks versions 1 to 7)"
    );

    let (h, m) = raw.ask_frames(&[b"hello"]);
    assert_eq!(h.status, Status::Malformed);
    assert_eq!(m, "request rejected: message is 5 bytes, expected 88");

    let (h, m) = raw.ask_frames(&[&request(0, 2, 0).encode(), b"extra"]);
    assert_eq!(h.status, Status::Malformed);
    assert_eq!(
        m,
        "a request is exactly one frame (a loss report two), got 2"
    );

    let mut garbage = [0xffu8; 64];
    garbage[8..16].copy_from_slice(&7u64.to_le_bytes());
    let (h, m) = raw.ask_frames(&[&garbage]);
    assert_eq!((h.status, h.request_id), (Status::Malformed, 7));
    assert!(m.starts_with("request rejected: bad magic bytes"), "{m}");

    let wrong_recipe = Request {
        recipe_hash: Some([1; 32]),
        ..request(0, 2, 0)
    };
    let (h, m) = raw.ask(&wrong_recipe);
    assert_eq!(h.status, Status::RecipeMismatch);
    let hash = dsprep::driver::load_recipe(&quickstart())
        .unwrap()
        .recipe
        .hash();
    assert_eq!(
        m,
        format!(
            "the daemon serves recipe {hash}, the trainer expects {}",
            "01".repeat(32)
        )
    );

    let (h, m) = raw.ask(&request(0, 4, 0));
    assert_eq!(h.status, Status::LayoutMismatch);
    assert_eq!(
        m,
        "the daemon serves world size 2 (micro batch 1); the request is rank 0 of world size 4"
    );
    let (h, _) = raw.ask(&request(2, 2, 0));
    assert_eq!(h.status, Status::LayoutMismatch);

    // Both ranks move on to step 11: steps below 3 (8 of history) are dropped.
    const R0: u64 = 0xa0;
    let (mut r0, mut r1) = (
        client_in_session(&daemon.endpoint, 0, R0, 10),
        client(&daemon.endpoint, 1, 2),
    );
    for step in 0..12 {
        r0.batch_at(step).unwrap();
        r1.batch_at(step).unwrap();
    }
    // Rank 0 is R0's: asked by hand in its session.
    let (h, m) = raw.ask(&owned(request(0, 2, 1), R0));
    assert_eq!(h.status, Status::StepGone);
    assert_eq!(
        m,
        "step 1 is no longer held: the oldest step held is 3 (resume from a checkpoint to go back further)"
    );

    // The typed errors reach the Rust client as typed errors.
    let mut stale = client_in_session(&daemon.endpoint, 0, R0, 10);
    assert!(matches!(stale.batch_at(0), Err(ClientError::StepGone(_))));
    let config = ClientConfig {
        recipe_hash: Some("ab".repeat(32)),
        ..client(&daemon.endpoint, 0, 2).config().clone()
    };
    let err = Client::with_config(config)
        .unwrap()
        .batch_at(5)
        .unwrap_err();
    assert!(matches!(err, ClientError::RecipeMismatch(_)), "{err}");

    // After all that, a good request is answered with the right bytes. Rank 1's trainer exits
    // first (its client releases the rank): a request without an owner, as this one and every
    // version 1 or 2 request is, may not read a rank a trainer holds.
    drop(r1);
    let (h, _) = ask_once_released(&raw, &request(1, 2, 5));
    assert_eq!(
        (h.status, h.step, h.rank, h.first_window),
        (Status::Ok, 5, 1, 11)
    );
    assert!(h.chain.is_some(), "a v2 reply carries the stream chain");
    // A version 1 client is still answered, in version 1 (no chain).
    let old = Request {
        version: 1,
        ..request(1, 2, 5)
    };
    let (h, _) = raw.ask(&old);
    assert_eq!(
        (h.version, h.status, h.first_window, h.chain),
        (1, Status::Ok, 11, None)
    );
    // A version 2 client gets its 3 frames; version 3 adds the document sources, 4 the real
    // tokens; 5 adds the segment to the header (256 bytes), which v2 to v4 never see; 6 changes
    // the request (88 bytes, the session's start time), not the reply. Every version's reply is
    // the same bytes but for its version field and the parts its version has.
    let versions = [
        (1u16, 64usize, 3usize, 96),
        (2, 64, 3, 224),
        (3, 80, 4, 224),
        (4, 80, 5, 224),
        (5, 80, 5, 256),
        (6, 88, 5, 256),
    ];
    let mut replies = Vec::new();
    for (version, request_bytes, frames, header) in versions {
        let ask = Request {
            version,
            ..request(1, 2, 5)
        };
        assert_eq!(ask.encode().len(), request_bytes, "version {version}");
        raw.socket.send_multipart([&ask.encode()[..]], 0).unwrap();
        let reply = raw.socket.recv_multipart(0).unwrap();
        assert_eq!(reply.len(), frames, "version {version}");
        assert_eq!(reply[0].len(), header, "version {version}");
        let segment = ReplyHeader::decode(&reply[0]).unwrap().segment;
        assert_eq!(segment.is_some(), version >= 5, "version {version}");
        if version == 4 {
            assert_eq!(&reply[0][41..48], &[0; 7], "v4's reserved bytes");
        }
        replies.push(reply);
    }
    for (v, reply) in replies.iter().enumerate().skip(1) {
        let shorter = &replies[v - 1];
        assert_eq!(
            reply[1..shorter.len()],
            shorter[1..],
            "version {}'s frames",
            v + 1
        );
        let (h, h_before) = (&reply[0], &shorter[0]);
        let common = h_before.len().min(h.len());
        let unchanged = |range: std::ops::Range<usize>| h[range.clone()] == h_before[range];
        assert!(
            unchanged(0..4) && unchanged(6..44) && unchanged(48..common),
            "version {}",
            v + 1
        );
    }
    assert_eq!(replies[5][0][6..], replies[4][0][6..], "v6's reply is v5's");
    assert_eq!(
        daemon.metric("dsprep_replies_total{status=\"malformed\"}"),
        3.0
    );
}

/// An old client (protocol version 1, no owner) on one connection asks for ranks 0 and 1 far
/// ahead while two trainers pull: it used to move their positions, so the daemon dropped the
/// steps they held and the honest rank 0 got "step gone". Now it is refused, naming the rank and
/// the upgrade, and moves nothing: both trainers get the packed stream's bytes, step after step.
#[test]
fn an_old_client_cannot_move_a_trainers_place_in_the_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = packed(tmp.path());
    let daemon = Daemon::start(tmp.path(), &quickstart(), 2, 1, 4);
    let (mut r0, mut r1) = (
        client_in_session(&daemon.endpoint, 0, 0x70, 10),
        client_in_session(&daemon.endpoint, 1, 0x71, 10),
    );
    let tokens = |b: dsprep_client::ServedBatch| b.tokens().as_bytes().to_vec();
    assert!(tokens(r0.batch_at(0).unwrap().unwrap()) == expected(&dataset, 2, 1, 0, 0..1));
    assert!(tokens(r1.batch_at(0).unwrap().unwrap()) == expected(&dataset, 2, 1, 1, 0..1));
    let stale = RawRank::connect(&daemon.endpoint);
    for step in 0..30 {
        for rank in 0..2 {
            let old = Request {
                version: 1,
                ..request(rank, 2, step)
            };
            let (h, m) = stale.ask(&old);
            assert_eq!((h.version, h.status), (1, Status::RankOwned), "{m}");
            assert!(
                m.starts_with(&format!(
                    "data-parallel rank {rank} belongs to a trainer process (rank {rank}, session \
                     {:016x}, which asked",
                    0x70 + rank
                )),
                "{m}"
            );
            assert!(
                m.ends_with(
                    "this request speaks protocol version 1, which carries no owner: upgrade the \
                     client to a dsprep client of protocol version 3"
                ),
                "{m}"
            );
        }
    }
    for step in 1..30 {
        assert!(
            tokens(r0.batch_at(step).unwrap().unwrap())
                == expected(&dataset, 2, 1, 0, step..step + 1)
        );
        assert!(
            tokens(r1.batch_at(step).unwrap().unwrap())
                == expected(&dataset, 2, 1, 1, step..step + 1)
        );
    }
    assert_eq!(
        daemon.metric("dsprep_replies_total{status=\"rank_owned\"}"),
        60.0
    );
}

/// A request for a step far past any stream (wrong recipe, rank or world size) is answered with
/// its error, `first_window` saturated: computing it overflowed and killed the daemon (a debug
/// build panicked on `attempt to add with overflow`; a release build wrapped).
#[test]
fn a_huge_step_is_refused_without_an_overflow_and_the_daemon_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(tmp.path(), &quickstart(), 2, 3, 2);
    let raw = RawRank::connect(&daemon.endpoint);
    for (rank, world, hash) in [(1, 2, Some([1; 32])), (7, 2, None), (0, 9, None)] {
        for step in [u64::MAX, u64::MAX / 2, 1 << 62] {
            let huge = Request {
                recipe_hash: hash,
                ..request(rank, world, step)
            };
            let (h, _) = raw.ask(&huge);
            assert!(
                matches!(h.status, Status::RecipeMismatch | Status::LayoutMismatch),
                "{h:?}"
            );
            assert_eq!((h.step, h.first_window), (step, u64::MAX));
        }
    }
    let (h, _) = raw.ask(&request(1, 2, 0));
    assert_eq!((h.status, h.first_window), (Status::Ok, 3));
    assert!(daemon.child.try_wait().unwrap().is_none(), "still up");
    daemon.terminate();
}

/// A frame larger than any request (64 MiB here) drops its peer's connection before the daemon
/// allocates it: it used to be received whole and answered as malformed, so a peer could make
/// the daemon hold frames of any size. The peer reconnects and is served as before.
#[test]
fn an_oversized_frame_drops_its_peer_and_is_never_read() {
    let tmp = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(tmp.path(), &quickstart(), 1, 1, 2);
    let raw = RawRank::connect(&daemon.endpoint);
    raw.socket.set_rcvtimeo(2_000).unwrap();
    let mut huge = request(0, 1, 0).encode();
    huge.resize(dsprep::serve::MAX_REQUEST_FRAME_BYTES + 1, 0);
    let (h, m) = raw.ask_frames(&[&huge[..dsprep::serve::MAX_REQUEST_FRAME_BYTES]]);
    assert_eq!(h.status, Status::Malformed, "{m}");
    for len in [huge.len(), 64 << 20] {
        huge.resize(len, 0);
        raw.socket.send(&huge[..], 0).unwrap();
        assert!(
            matches!(raw.socket.recv_multipart(0), Err(zmq::Error::EAGAIN)),
            "a frame of {len} bytes gets no reply: its connection is dropped"
        );
    }
    assert_eq!(
        daemon.metric("dsprep_replies_total{status=\"malformed\"}"),
        1.0,
        "only the frame within the limit was read"
    );
    raw.socket.set_rcvtimeo(10_000).unwrap();
    let (h, _) = raw.ask(&request(0, 1, 0));
    assert_eq!(h.status, Status::Ok, "the peer reconnected and is served");
    daemon.terminate();
}

#[test]
fn served_batches_expose_inputs_labels_and_document_boundaries() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = packed(tmp.path());
    let daemon = Daemon::start(tmp.path(), &quickstart(), 1, 4, 2);
    let mut c = client(&daemon.endpoint, 0, 1);
    for step in 0..5u64 {
        let batch = c.next_batch().unwrap().unwrap();
        assert_eq!(batch.step(), step);
        for i in 0..4 {
            let window = dataset.window(step * 4 + i as u64).unwrap();
            assert_eq!(batch.row(i).to_vec(), window.tokens.to_vec());
            assert_eq!(batch.inputs(i).to_vec(), window.tokens.to_vec()[..512]);
            assert_eq!(batch.labels(i).to_vec(), window.tokens.to_vec()[1..]);
            assert_eq!(batch.doc_starts(i), window.doc_starts);
            assert_eq!(batch.doc_sources(i), window.doc_sources);
            assert_eq!(batch.lead_source(i), window.lead_source);
            assert_eq!(batch.input_sources(i), window.input_sources());
            let cu = batch.cu_seqlens(i);
            assert_eq!((cu[0], *cu.last().unwrap()), (0, 512));
            let pos = batch.position_ids(i);
            assert_eq!(pos.len(), 512);
            for (k, &s) in window.doc_starts.iter().enumerate() {
                if s > 0 && s < 512 {
                    assert_eq!(
                        pos[s as usize], 0,
                        "positions restart at document start {k}"
                    );
                    assert_eq!(
                        pos[s as usize - 1] + 1,
                        s - cu[cu.iter().position(|&c| c == s).unwrap() - 1]
                    );
                }
            }
        }
        let counts = batch.source_token_counts().unwrap();
        assert_eq!(counts.iter().map(|&(_, n)| n).sum::<u64>(), 4 * 512);
        assert!(counts.iter().all(|&(s, n)| s < 5 && n > 0), "{counts:?}");
    }
}

/// A client of rank `rank` in trainer session `session`, waiting `patience` for a reply.
fn client_in_session(endpoint: &str, rank: u32, session: u64, patience: u64) -> Client {
    let config = ClientConfig {
        session: Some(session),
        curve: None,
        timeout: Duration::from_secs(patience),
        attempts: 1,
        ..client(endpoint, rank, 2).config().clone()
    };
    Client::with_config(config).unwrap()
}

/// One owner per rank (protocol v3): a second trainer process with the same RANK is refused with
/// a typed error naming the rank, and moves nothing the daemon holds; a crashed owner's rank is
/// taken over once it has been silent for --owner-timeout; a clean exit frees it at once.
#[test]
fn a_rank_belongs_to_one_trainer_process_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = packed(tmp.path());
    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let args = [
        "--world-size",
        "2",
        "--micro-batch",
        "1",
        "--prefetch",
        "64",
    ];
    let more = ["--metrics", "127.0.0.1:0", "--owner-timeout", "2"];
    let daemon =
        Daemon::start_with(&quickstart(), &endpoint, &[&args[..], &more[..]].concat()).unwrap();
    let mut first = client_in_session(&endpoint, 0, 1, 10);
    for step in 0..3 {
        first.batch_at(step).unwrap().unwrap();
    }
    let held = daemon.metric("dsprep_rank_step{rank=\"0\"}");
    let mut second = client_in_session(&endpoint, 0, 2, 1);
    let err = second.batch_at(30).unwrap_err();
    let ClientError::RankOwned(message) = &err else {
        panic!("{err}");
    };
    assert!(
        message.starts_with(
            "rank 0 (data-parallel rank 0) belongs to another trainer process (session \
             0000000000000001, which asked "
        ),
        "{message}"
    );
    assert!(
        message.ends_with("any other once the owner has been silent for 2 s"),
        "{message}"
    );
    assert_eq!(
        daemon.metric("dsprep_rank_step{rank=\"0\"}"),
        held,
        "nothing moved"
    );
    assert!(daemon.metric("dsprep_replies_total{status=\"rank_owned\"}") >= 1.0);
    let row = first.batch_at(3).unwrap().unwrap();
    assert_eq!(
        row.row(0).to_vec(),
        dataset.window(6).unwrap().tokens.to_vec(),
        "the owner goes on"
    );
    // The owner crashes (no clean exit, so no release, and its keepalives stop): its rank is
    // free 2 s after it was last heard.
    first.abandon();
    let mut restarted = client_in_session(&endpoint, 0, 2, 10);
    let row = restarted.batch_at(4).unwrap().unwrap();
    assert_eq!(
        row.row(0).to_vec(),
        dataset.window(8).unwrap().tokens.to_vec()
    );
    // A clean exit releases the rank: the next process gets it at once (within 1 s, while the
    // owner timeout is 2 s).
    drop(restarted);
    let mut next = client_in_session(&endpoint, 0, 3, 1);
    assert!(next.batch_at(5).unwrap().is_some());
    // Tensor-parallel peers share a data-parallel rank, not a global rank: both are served.
    let peer = |rank: u32, session: u64| {
        let config = ClientConfig {
            session: Some(session),
            curve: None,
            world_size: 4,
            parallel: dsprep_client::Parallelism {
                tensor: 2,
                ..Default::default()
            },
            ..client(&endpoint, rank, 4).config().clone()
        };
        Client::with_config(config).unwrap()
    };
    let (mut a, mut b) = (peer(2, 4), peer(3, 5));
    assert_eq!(a.data_parallel(), b.data_parallel());
    let (x, y) = (
        a.batch_at(5).unwrap().unwrap(),
        b.batch_at(5).unwrap().unwrap(),
    );
    assert_eq!(x.row(0).to_vec(), y.row(0).to_vec());
}

#[test]
fn an_endpoint_in_use_is_a_clear_error_and_sigterm_shuts_down_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(tmp.path(), &quickstart(), 1, 1, 2);
    let err = Daemon::start_with(
        &quickstart(),
        &daemon.endpoint,
        &[
            "--world-size",
            "1",
            "--micro-batch",
            "1",
            "--metrics",
            "off",
        ],
    )
    .err()
    .unwrap();
    assert!(
        err.contains(&format!(
            "error: endpoint {} is already in use by another process",
            daemon.endpoint
        )),
        "{err}"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("tcp://{}", port.local_addr().unwrap());
    let err = Daemon::start_with(
        &quickstart(),
        &endpoint,
        &[
            "--world-size",
            "1",
            "--micro-batch",
            "1",
            "--metrics",
            "off",
        ],
    )
    .err()
    .unwrap();
    assert!(
        err.contains(&format!("error: endpoint {endpoint} is already in use")),
        "{err}"
    );

    let mut daemon = daemon;
    daemon.terminate();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        daemon.log_text().contains("shut down"),
        "{}",
        daemon.log_text()
    );
    assert!(
        !tmp.path().join("d.sock").exists(),
        "the socket file is removed"
    );
}

#[test]
fn metrics_on_a_non_loopback_address_need_a_token_or_insecure_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let args = ["--world-size", "1", "--micro-batch", "1", "--metrics"];
    let refused = Daemon::start_with(
        &quickstart(),
        &endpoint,
        &[&args[..], &["0.0.0.0:0"]].concat(),
    )
    .err()
    .unwrap();
    assert!(
        refused.contains("error: --metrics 0.0.0.0:0 is not a loopback address"),
        "{refused}"
    );
    let open = Daemon::start_with(
        &quickstart(),
        &endpoint,
        &[&args[..], &["0.0.0.0:0", "--insecure-metrics"]].concat(),
    )
    .unwrap();
    assert!(
        open.log_text().contains(
            "METRICS ON A NON-LOOPBACK ADDRESS (0.0.0.0:0) WITHOUT A TOKEN: any host that can \
             reach it reads the daemon's counters"
        ),
        "{}",
        open.log_text()
    );
    drop(open);
    let local = Daemon::start_with(
        &quickstart(),
        &endpoint,
        &[&args[..], &["127.0.0.1:0"]].concat(),
    )
    .unwrap();
    assert!(
        !local.log_text().contains("NON-LOOPBACK"),
        "{}",
        local.log_text()
    );
}

/// A non-loopback TCP endpoint needs CURVE: without keys it is refused unless `--insecure-tcp`
/// is given, and then logged loudly; with CURVE keys it needs neither. Loopback TCP needs no
/// flag.
#[test]
fn a_non_loopback_tcp_endpoint_needs_curve_or_insecure_tcp() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let args = [
        "--world-size",
        "1",
        "--micro-batch",
        "1",
        "--metrics",
        "off",
    ];
    let open = format!("tcp://0.0.0.0:{port}");
    let err = Daemon::start_with(&quickstart(), &open, &args)
        .err()
        .unwrap();
    assert!(
        err.contains(&format!(
            "error: endpoint {open} is not a loopback address and the daemon has no CURVE keys: \
             anyone who can reach 0.0.0.0 could read the token stream and ask for any rank's \
             steps, moving what the daemon holds. Serve with --curve-secret-key FILE and \
             --curve-allow DIR (`dsprep keygen`; README \"Serving over TCP\"), bind 127.0.0.1 or \
             an ipc:// path, or pass --insecure-tcp to accept that (on a network only trusted \
             hosts reach)"
        )),
        "{err}"
    );
    let insecure = Daemon::start_with(
        &quickstart(),
        &open,
        &[&args[..], &["--insecure-tcp"]].concat(),
    )
    .unwrap();
    assert!(
        insecure
            .log_text()
            .contains("BINDING A NON-LOOPBACK ADDRESS WITHOUT CURVE"),
        "{}",
        insecure.log_text()
    );
    drop(insecure);

    let tmp = tempfile::tempdir().unwrap();
    let (server, client) = (tmp.path().join("server"), tmp.path().join("client"));
    let allow = tmp.path().join("allow");
    std::fs::create_dir(&allow).unwrap();
    for base in [&server, &client] {
        dsprep_ok(&["keygen", "--out", base.to_str().unwrap()]);
    }
    std::fs::copy(tmp.path().join("client.key"), allow.join("client.key")).unwrap();
    let secret = tmp.path().join("server.key_secret");
    let curve = [
        "--curve-secret-key",
        secret.to_str().unwrap(),
        "--curve-allow",
        allow.to_str().unwrap(),
    ];
    let authenticated =
        Daemon::start_with(&quickstart(), &open, &[&args[..], &curve[..]].concat()).unwrap();
    let log = authenticated.log_text();
    assert!(log.contains("CURVE on: server public key"), "{log}");
    assert!(!log.contains("NON-LOOPBACK"), "{log}");
    drop(authenticated);

    let local = format!("tcp://127.0.0.1:{port}");
    let daemon = Daemon::start_with(&quickstart(), &local, &args).unwrap();
    assert!(
        !daemon.log_text().contains("NON-LOOPBACK"),
        "{}",
        daemon.log_text()
    );
}

/// A rank waiting for the step past the last when the data ends hears so at once, also while the
/// daemon keeps writing checkpoints for the ranks still reading (it used to hear only at its
/// client's timeout).
#[test]
fn a_rank_parked_past_the_end_hears_the_end_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let args = [
        "--world-size",
        "1",
        "--micro-batch",
        "64",
        "--prefetch",
        "8",
        "--metrics",
        "off",
        "--state-dir",
        state.to_str().unwrap(),
        "--checkpoint-every",
        "2",
    ];
    let daemon = Daemon::start_with(&quickstart(), &endpoint, &args).unwrap();
    let raw = RawRank::connect(&daemon.endpoint);
    let asked = std::time::Instant::now();
    let (h, m) = raw.ask(&request(0, 1, 1000)); // parked: world 1 is never ahead
    assert_eq!(h.status, Status::EndOfData, "{m}");
    assert!(h.num_steps < 1000);
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(5),
        "heard after {:?}",
        asked.elapsed()
    );
}

//! Which recipe of a lineage made each served step, on the wire (PROTOCOL.md v5): a real daemon
//! of recipe A changes course to B (`--resume latest --change-course`), and a trainer rolled
//! back below the change is served A's steps, then B's, each header naming its segment. A v4
//! request still gets v4's header, byte for byte.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::protocol::{Owner, ReplyHeader, Request, RequestKind, Status};
use dsprep_client::{Client, ClientConfig};
use std::path::Path;
use std::time::{Duration, Instant};
use support::daemon::headers;
use support::serve_run::Run;
use support::*;

/// The quickstart with fineweb-edu weighted `weight` and a buffer of 100 (absolute paths).
fn variant(dir: &Path, name: &str, weight: &str) -> std::path::PathBuf {
    quickstart_variant(
        dir,
        name,
        &[
            ("weight = 0.40", weight),
            ("buffer_size = 1000", "buffer_size = 100"),
        ],
    )
}

/// Segment and segment recipe of each step a tap wrote (`<out>.jsonl`).
fn tapped_segments(out: &Path) -> Vec<(u64, u64, String, String)> {
    (headers(out).iter())
        .map(|h| {
            (
                h["step"].as_u64().unwrap(),
                h["segment"].as_u64().unwrap(),
                h["segment_recipe_hash"].as_str().unwrap().to_string(),
                h["recipe_hash"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// One request for rank 0 of 1 at `step` in `version`, as trainer session 7: the reply's frames.
fn ask(socket: &zmq::Socket, version: u16, step: u64) -> Vec<Vec<u8>> {
    let request = Request {
        version,
        kind: RequestKind::Batch,
        request_id: step + 1,
        rank: 0,
        world_size: 1,
        step,
        recipe_hash: None,
        owner: Some(Owner {
            global_rank: 0,
            session: 7,
            started: 0,
        }),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        socket.send(&request.encode()[..], 0).unwrap();
        let reply = socket.recv_multipart(0).unwrap();
        let status = ReplyHeader::decode(&reply[0]).unwrap().status;
        // A tap that just exited may still own the rank until its release lands.
        if status != Status::RankOwned || Instant::now() > deadline {
            return reply;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn every_served_step_names_the_segment_whose_recipe_made_it() {
    let tmp = tempfile::tempdir().unwrap();
    let a = variant(tmp.path(), "a.toml", "weight = 0.40");
    let b = variant(tmp.path(), "b.toml", "weight = 0.10");
    let run = Run {
        dir: tmp.path(),
        recipe: &a,
        state: tmp.path().join("state"),
        every: 5,
    };
    let daemon = run.start(1, 2, false).unwrap();
    run.pull(&daemon, 1, 0, 12);
    drop(daemon);
    let daemon = run
        .start_with(&b, 1, 2, &["--resume", "latest", "--change-course"])
        .unwrap();
    run.pull(&daemon, 1, 12, 3);
    drop(daemon);
    let lineage: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.state.join("lineage.json")).unwrap()).unwrap();
    let hashes: Vec<String> = (lineage["lineage"]["segments"].as_array().unwrap().iter())
        .map(|s| s["recipe_hash"].as_str().unwrap().to_string())
        .collect();
    let (ha, hb) = (hashes[0].clone(), hashes[1].clone());
    assert_ne!(ha, hb);

    // What the taps got: A's daemon made segment 0, B's daemon segment 1 from the change on.
    let from0 = tapped_segments(&tmp.path().join("rank0-from0.bin"));
    assert_eq!(from0.len(), 12);
    assert!(from0.iter().all(|s| (s.1, &s.2, &s.3) == (0, &ha, &ha)));
    let from12 = tapped_segments(&tmp.path().join("rank0-from12.bin"));
    let want: Vec<_> = (12..15).map(|k| (k, 1, hb.clone(), hb.clone())).collect();
    assert_eq!(from12, want);

    // A trainer pinned to A rolls back to step 9, below the change: B's daemon serves A's
    // steps as segment 0, then B's as segment 1, and the client says what it is served.
    let daemon = run.start_with(&b, 1, 2, &["--resume", "latest"]).unwrap();
    let mut client = Client::with_config(ClientConfig {
        endpoint: daemon.endpoint.clone(),
        rank: 0,
        world_size: 1,
        recipe_hash: Some(ha.clone()),
        timeout: Duration::from_secs(20),
        attempts: 3,
        parallel: Default::default(),
        session: Some(7),
        curve: None,
    })
    .unwrap();
    let mut seen = Vec::new();
    for step in 9..14 {
        let batch = client.batch_at(step).unwrap().unwrap();
        let hash = hex::encode(batch.segment_recipe_hash().unwrap());
        seen.push((step, batch.segment().unwrap(), hash));
        assert_eq!(
            hex::encode(batch.header.recipe_hash),
            hb,
            "the daemon's own"
        );
    }
    let want: Vec<(u64, u32, String)> = (9..14)
        .map(|s| match s < 12 {
            true => (s, 0, ha.clone()),
            false => (s, 1, hb.clone()),
        })
        .collect();
    assert_eq!(seen, want);
    assert_eq!(
        client.recipe_note(),
        Some(
            format!(
                "recipe {ha} this trainer pinned is an earlier recipe of the stream's lineage: \
                 the daemon changed course to recipe {hb} and serves the trainer that stream; \
                 step 9 is segment 0's (recipe {ha})"
            )
            .as_str()
        )
    );

    // The same step in v5 and in v4, by hand: v4's header has no segment, its bytes zero.
    let context = zmq::Context::new();
    let socket = context.socket(zmq::DEALER).unwrap();
    socket.set_rcvtimeo(20_000).unwrap();
    socket.connect(&daemon.endpoint).unwrap();
    let v5 = ask(&socket, 5, 13);
    let v4 = ask(&socket, 4, 13);
    assert_eq!((v5.len(), v4.len()), (5, 5));
    assert_eq!((v5[0].len(), v4[0].len()), (256, 224));
    assert_eq!(&v5[0][44..48], &1u32.to_le_bytes());
    assert_eq!(hex::encode(&v5[0][224..256]), hb);
    assert_eq!(&v4[0][41..48], &[0; 7], "v4's reserved bytes");
    assert_eq!(v4[0][4], 4);
    let (h5, h4) = (
        ReplyHeader::decode(&v5[0]).unwrap(),
        ReplyHeader::decode(&v4[0]).unwrap(),
    );
    assert_eq!(h4.segment, None);
    assert_eq!(
        ReplyHeader { version: 5, ..h4 },
        ReplyHeader {
            segment: None,
            ..h5
        },
        "every other field as v5's"
    );
    assert_eq!(&v5[0][..4], &v4[0][..4]);
    assert_eq!(&v5[0][6..44], &v4[0][6..44]);
    assert_eq!(&v5[0][48..224], &v4[0][48..224]);
    assert!((1..5).all(|f| v5[f] == v4[f]), "the same frames after it");
}

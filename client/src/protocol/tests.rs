use super::*;
use proptest::prelude::*;

fn request() -> Request {
    Request {
        version: PROTOCOL_VERSION,
        kind: RequestKind::Batch,
        request_id: 7,
        rank: 3,
        world_size: 8,
        step: 1234,
        recipe_hash: Some([0xab; 32]),
        owner: Some(Owner {
            global_rank: 11,
            session: 0x0123_4567_89ab_cdef,
            started: 1_764_000_000_123_456_789,
        }),
    }
}

fn header() -> ReplyHeader {
    ReplyHeader {
        version: PROTOCOL_VERSION,
        status: Status::Ok,
        request_id: 7,
        step: 1234,
        rank: 3,
        world_size: 8,
        micro_batch: 4,
        window_tokens: 2049,
        dtype_bytes: 2,
        recipe_hash: [0xcd; 32],
        num_steps: u64::MAX,
        first_window: 39_500,
        chain: Some(ReplyChain {
            step_start: [1; 32],
            rows_start: [2; 32],
            rows_end: [3; 32],
            step_end: [4; 32],
        }),
        segment: Some(ReplySegment {
            index: 2,
            recipe_hash: [0xee; 32],
        }),
    }
}

#[test]
fn request_round_trips_and_has_a_fixed_layout() {
    let bytes = request().encode();
    assert_eq!(&bytes[0..4], b"DSPQ");
    assert_eq!(&bytes[4..6], &[7, 0]);
    assert_eq!(&bytes[24..32], &1234u64.to_le_bytes());
    assert_eq!(bytes.len(), 88);
    assert_eq!(&bytes[68..72], &[0; 4], "reserved");
    assert_eq!(
        &bytes[80..88],
        &1_764_000_000_123_456_789u64.to_le_bytes(),
        "the session's start time"
    );
    assert_eq!(
        &bytes[64..68],
        &11u32.to_le_bytes(),
        "the owner's global rank"
    );
    assert_eq!(
        &bytes[72..80],
        &0x0123_4567_89ab_cdefu64.to_le_bytes(),
        "its session"
    );
    assert_eq!(Request::decode(&bytes), Ok(request()));
    let none = Request {
        recipe_hash: None,
        ..request()
    };
    assert_eq!(Request::decode(&none.encode()), Ok(none));
    // A v5 request is v6's first 80 bytes (its version aside): no start time.
    let v5 = Request {
        version: 5,
        ..request()
    };
    let v5_bytes = v5.encode();
    assert_eq!(v5_bytes.len(), 80);
    assert_eq!(v5_bytes[6..], bytes[6..80]);
    let decoded = Request::decode(&v5_bytes).unwrap();
    assert_eq!(decoded.owner.map(|o| o.started), Some(0));
    // A keepalive is v6's.
    let keepalive = Request {
        kind: RequestKind::Keepalive,
        ..request()
    };
    let beat = keepalive.encode();
    assert_eq!(&beat[6..8], &3u16.to_le_bytes());
    assert_eq!(Request::decode(&beat), Ok(keepalive));
    let mut v5_beat = v5_bytes.clone();
    v5_beat[6] = 3;
    assert_eq!(Request::decode(&v5_beat), Err(DecodeError::Kind(3)));
}

#[test]
fn header_round_trips() {
    let bytes = header().encode();
    assert_eq!(bytes.len(), 256);
    assert_eq!(&bytes[96..128], &[1; 32], "the chain follows v1's fields");
    assert_eq!(&bytes[192..224], &[4; 32]);
    assert_eq!(&bytes[41..44], &[0; 3], "reserved");
    assert_eq!(&bytes[44..48], &2u32.to_le_bytes(), "the segment's index");
    assert_eq!(&bytes[48..80], &[0xcd; 32], "the daemon's recipe");
    assert_eq!(&bytes[224..256], &[0xee; 32], "the segment's recipe");
    assert_eq!(ReplyHeader::decode(&bytes), Ok(header()));
    assert_eq!(header().payload_bytes(), 4 * 2049 * 2);
    // An error reply carries no chain and no segment (their bytes are zero).
    let error = ReplyHeader {
        status: Status::StepGone,
        chain: None,
        segment: None,
        ..header()
    };
    let bytes = error.encode();
    assert_eq!(bytes.len(), 256);
    assert!(bytes[44..48].iter().chain(&bytes[96..]).all(|&b| b == 0));
    assert_eq!(ReplyHeader::decode(&bytes), Ok(error));
}

/// The v4 header as PROTOCOL.md lays it out, field by field: what v4 clients have always read.
fn v4_layout(h: &ReplyHeader, c: &ReplyChain) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(b"DSPR");
    out.extend(4u16.to_le_bytes());
    out.extend((h.status as u16).to_le_bytes());
    out.extend(h.request_id.to_le_bytes());
    out.extend(h.step.to_le_bytes());
    for v in [h.rank, h.world_size, h.micro_batch, h.window_tokens] {
        out.extend(v.to_le_bytes());
    }
    out.push(h.dtype_bytes);
    out.extend([0; 7]);
    out.extend(h.recipe_hash);
    out.extend(h.num_steps.to_le_bytes());
    out.extend(h.first_window.to_le_bytes());
    for hash in [c.step_start, c.rows_start, c.rows_end, c.step_end] {
        out.extend(hash);
    }
    out
}

#[test]
fn a_v4_header_is_what_it_was_and_carries_no_segment() {
    let v4 = ReplyHeader {
        version: 4,
        ..header()
    };
    let chain = v4.chain.unwrap();
    let bytes = v4.encode();
    assert_eq!(bytes.len(), 224);
    assert_eq!(bytes, v4_layout(&v4, &chain), "a segment given is not sent");
    let decoded = ReplyHeader::decode(&bytes).unwrap();
    assert_eq!(
        decoded,
        ReplyHeader {
            segment: None,
            ..v4
        }
    );
    // A v5 header is v4's with the segment's index in reserved bytes and its recipe appended.
    let v5 = ReplyHeader {
        version: 5,
        ..header()
    }
    .encode();
    let mut v7 = header().encode();
    assert_eq!(v7[4], 7);
    v7[4] = 5;
    assert_eq!(v7, v5, "a v6 or v7 header is v5's");
    let mut expected = v4_layout(&v4, &chain);
    expected[4] = 5;
    expected[44..48].copy_from_slice(&2u32.to_le_bytes());
    expected.extend([0xee; 32]);
    assert_eq!(v5, expected);
    assert_eq!(
        ReplyHeader::decode(&v5[..224]),
        Err(DecodeError::Length {
            len: 224,
            expected: 256
        }),
        "a v5 header must have its segment"
    );
    assert_eq!(reply_header_len(4), 224);
    assert_eq!(reply_header_len(5), 256);
    assert_eq!(ok_reply_frames(5), 5);
}

#[test]
fn version_1_is_still_spoken() {
    let old = Request {
        version: 1,
        owner: None,
        ..request()
    };
    let bytes = old.encode();
    assert_eq!(&bytes[4..6], &[1, 0]);
    assert_eq!(bytes.len(), 64, "no owner before v3");
    assert_eq!(Request::decode(&bytes), Ok(old));
    let given = Request {
        version: 2,
        ..request()
    };
    assert_eq!(
        Request::decode(&given.encode()).unwrap().owner,
        None,
        "an owner given to a v2 request is not sent"
    );
    let v1 = ReplyHeader {
        version: 1,
        chain: None,
        segment: None,
        ..header()
    };
    let bytes = v1.encode();
    assert_eq!(bytes.len(), 96, "a v1 header is 96 bytes: no chain");
    assert_eq!(ReplyHeader::decode(&bytes), Ok(v1));
    // A chain given to a v1 header is not sent.
    let dropped = ReplyHeader {
        version: 1,
        ..header()
    };
    assert_eq!(ReplyHeader::decode(&dropped.encode()), Ok(v1));
    assert_eq!(
        ReplyHeader::decode(
            &ReplyHeader {
                version: 2,
                ..header()
            }
            .encode()[..96]
        ),
        Err(DecodeError::Length {
            len: 96,
            expected: 224
        }),
        "a v2 header must have its chain"
    );
}

#[test]
fn each_malformation_has_its_error() {
    let good = request().encode();
    assert_eq!(
        Request::decode(&good[..80]),
        Err(DecodeError::Length {
            len: 80,
            expected: 88
        })
    );
    let release = Request {
        kind: RequestKind::Release,
        ..request()
    };
    assert_eq!(Request::decode(&release.encode()), Ok(release));
    let mut v2_release = Request {
        version: 2,
        ..request()
    }
    .encode();
    v2_release[6] = 2;
    assert_eq!(
        Request::decode(&v2_release),
        Err(DecodeError::Kind(2)),
        "release is v3's"
    );
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(
        Request::decode(&bad),
        Err(DecodeError::Magic { found: *b"XSPQ" })
    );
    let mut bad = good.clone();
    bad[4] = 8;
    assert_eq!(
        Request::decode(&bad),
        Err(DecodeError::Version { found: 8 })
    );
    assert_eq!(
        DecodeError::Version { found: 8 }.to_string(),
        "protocol version 8 is not supported (this side speaks versions 1 to 7)"
    );
    bad[4] = 0;
    assert_eq!(
        Request::decode(&bad),
        Err(DecodeError::Version { found: 0 })
    );
    let mut bad = good.clone();
    bad[6] = 9;
    assert_eq!(Request::decode(&bad), Err(DecodeError::Kind(9)));
    let mut bad = header().encode();
    bad[6] = 99;
    assert_eq!(ReplyHeader::decode(&bad), Err(DecodeError::Status(99)));
}

#[test]
fn doc_starts_round_trip_and_are_checked() {
    let rows: [&[u32]; 3] = [&[0, 5], &[], &[3]];
    let bytes = encode_doc_starts(&rows);
    let (offsets, starts) = decode_doc_starts(&bytes, 3, 8).unwrap();
    assert_eq!(offsets, vec![0, 2, 2, 3]);
    assert_eq!(starts, vec![0, 5, 3]);
    assert!(
        decode_doc_starts(&bytes, 3, 4).is_err(),
        "a start outside the window"
    );
    assert!(decode_doc_starts(&bytes[..8], 3, 8).is_err());
    assert!(
        decode_doc_starts(&encode_doc_starts(&[&[4, 2]]), 1, 8).is_err(),
        "decreasing starts"
    );
}

#[test]
fn doc_sources_round_trip_and_are_checked() {
    let rows: [&[u16]; 3] = [&[4, 1], &[], &[2]];
    let bytes = encode_doc_sources(&[0, 1, 1], &rows);
    assert_eq!(bytes.len(), 2 * (3 + 3));
    let (leads, sources) = decode_doc_sources(&bytes, 3, 3).unwrap();
    assert_eq!((leads, sources), (vec![0, 1, 1], vec![4, 1, 2]));
    let err = decode_doc_sources(&bytes, 3, 4).unwrap_err().to_string();
    assert!(
        err.contains("12 bytes, 3 rows with 4 document starts need 14"),
        "{err}"
    );
    assert!(
        decode_doc_sources(&bytes[..11], 3, 3).is_err(),
        "odd length"
    );
    assert_eq!(ok_reply_frames(2), 3);
    assert_eq!(ok_reply_frames(3), 4);
}

/// A small deterministic generator: the fuzz loop below must be repeatable.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One million inputs — random bytes of every length around the frame sizes, and valid frames
/// with random bit flips, truncations and extensions — through every decoder: none may panic,
/// and a decoded request must re-encode to the bytes it came from.
#[test]
fn decoders_survive_a_million_hostile_inputs() {
    let mut rng = XorShift(0x9e3779b97f4a7c15);
    let valid = [
        request().encode().to_vec(),
        header().encode().to_vec(),
        encode_doc_starts(&[&[0, 9], &[1]]),
    ];
    let mut accepted = 0u32;
    for i in 0..1_000_000u32 {
        let mut bytes = if i % 2 == 0 {
            let len = (rng.next() % 128) as usize;
            (0..len).map(|_| rng.next() as u8).collect::<Vec<u8>>()
        } else {
            let mut b = valid[(rng.next() % 3) as usize].clone();
            for _ in 0..1 + rng.next() % 3 {
                let at = (rng.next() as usize) % b.len();
                b[at] ^= 1 << (rng.next() % 8);
            }
            b
        };
        if i % 7 == 0 {
            bytes.truncate((rng.next() as usize) % (bytes.len() + 1));
        }
        if i % 11 == 0 {
            bytes.push(rng.next() as u8);
        }
        if let Ok(req) = Request::decode(&bytes) {
            accepted += 1;
            let mut again = req.encode().to_vec();
            if req.recipe_hash.is_none() {
                again[32..64].copy_from_slice(&bytes[32..64]);
            }
            if req.version >= 3 {
                again[68..72].copy_from_slice(&bytes[68..72]); // reserved
                if req.owner.is_none() {
                    again[64..68].copy_from_slice(&bytes[64..68]); // a rank with session 0
                }
            }
            assert_eq!(again, bytes);
        }
        let _ = ReplyHeader::decode(&bytes);
        let _ = decode_doc_starts(&bytes, (rng.next() % 4) as usize, 16);
        let _ = decode_doc_sources(
            &bytes,
            (rng.next() % 4) as usize,
            (rng.next() % 64) as usize,
        );
        let _ = Request::salvage_request_id(&bytes);
    }
    assert!(
        accepted > 0,
        "bit flips in the id/rank/step fields still decode"
    );
}

proptest! {
    #[test]
    fn any_request_round_trips(id in any::<u64>(), rank in any::<u32>(), world in any::<u32>(), step in any::<u64>(), hash in any::<[u8; 32]>(), global_rank in any::<u32>(), session in 1..u64::MAX, started in any::<u64>()) {
        let owner = Some(Owner { global_rank, session, started });
        let req = Request { version: PROTOCOL_VERSION, kind: RequestKind::Batch, request_id: id, rank, world_size: world, step, recipe_hash: (hash != [0; 32]).then_some(hash), owner };
        prop_assert_eq!(Request::decode(&req.encode()), Ok(req));
    }
}

#[test]
fn the_real_token_frame_of_v4_is_checked() {
    assert_eq!(ok_reply_frames(4), 5);
    assert_eq!(ok_reply_frames(3), 4);
    let frame = encode_real_tokens(&[513, 7]);
    assert_eq!(decode_real_tokens(&frame, 2, 513), Ok(vec![513, 7]));
    let short = decode_real_tokens(&frame[..7], 2, 513).unwrap_err();
    assert_eq!(
        short.to_string(),
        "real-token frame: 7 bytes, 2 rows need 8"
    );
    for (bad, rows) in [(0u32, 1usize), (514, 1)] {
        let err = decode_real_tokens(&encode_real_tokens(&[bad]), rows, 513).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("real-token frame: a row of 513 tokens cannot hold {bad} real tokens")
        );
    }
}

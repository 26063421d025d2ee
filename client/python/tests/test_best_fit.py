"""`[packing] strategy = "best_fit"`: windows that end in padding, packed (format 5) and served
(protocol v4). Labels are the ignore index exactly where the next token is padding, cu_seqlens
and position ids cover the real tokens only, served batches equal the packed ones, a daemon that
pads refuses older clients, and the reader refuses what it cannot read: a newer format, a
real-token file that does not match the windows, a real-token frame that breaks the protocol."""

import json
import shutil
import struct

import numpy as np
import pytest
import zmq

from dsprep_client import IGNORE_INDEX, Client, PackedDataset, PackedFormatError, ProtocolError, UnsupportedVersion
from dsprep_client.protocol import decode_header, decode_real_tokens, decode_reply, encode_request


def expected_row(raw, w):
    """Window `w`'s labels, cu_seqlens and position ids by hand, in plain Python from the files."""
    seq_len, real = raw.window_tokens - 1, int(raw.real_tokens[w])
    window = raw.tokens[w].tolist()
    labels = [window[i + 1] if i + 1 < real else -100 for i in range(seq_len)]
    end = min(real, seq_len)
    cu = [0] + [s for s in raw.doc_starts(w).tolist() if 0 < s < end] + [end]
    positions = [p for a, b in zip(cu, cu[1:]) for p in range(b - a)] + [0] * (seq_len - end)
    return labels, cu, positions


def expected_flat(cus, seq_len):
    """cu_seqlens_flat as `Batch` documents it: each row's segments at `i × seq_len`, its padding
    one more segment."""
    flat = [0]
    for i, cu in enumerate(cus):
        flat += [c + i * seq_len for c in cu[1:]]
        if cu[-1] < seq_len:
            flat.append((i + 1) * seq_len)
    return flat


def test_a_best_fit_pack_masks_exactly_the_padding(best_fit_dir, best_fit_raw):
    raw, mb = best_fit_raw, 4
    m = raw.manifest
    assert m["format_version"] == 5 and m["real_tokens"]["file"] == "real_tokens.u32"
    packing = m["packing"]
    assert (packing["strategy"], packing["pool_documents"], packing["pad_id"]) == ("best_fit", 200, m["tokenizer"]["eos_id"])
    assert packing["padding_tokens"] == int((raw.window_tokens - raw.real_tokens.astype(np.int64)).sum())
    ds = PackedDataset(best_fit_dir, micro_batch=mb)
    seq_len = ds.seq_len
    assert seq_len == 512 and ds.num_steps == raw.num_windows // mb
    padded = ends_at_seq_len = 0
    for step in range(ds.num_steps):
        batch = ds.batch_at(step)
        windows = list(batch.window_indices())
        assert np.array_equal(batch.tokens, raw.tokens[windows])
        assert batch.real_tokens.tolist() == raw.real_tokens[windows].tolist()
        assert batch.labels.dtype == np.int64 and batch.labels.shape == (mb, seq_len)
        cus = []
        for i, w in enumerate(windows):
            real, starts = int(raw.real_tokens[w]), raw.doc_starts(w)
            # What FORMAT.md v5 promises: a window begins a document, all before the padding.
            assert starts[0] == 0 and starts[-1] < real, f"window {w}"
            assert np.all(raw.tokens[w, real:] == packing["pad_id"]), f"window {w}"
            labels, cu, positions = expected_row(raw, w)
            assert batch.labels[i].tolist() == labels, f"window {w}: labels"
            assert batch.cu_seqlens[i].tolist() == cu and batch.cu_seqlens[i].dtype == np.int32, f"window {w}: cu_seqlens"
            assert batch.position_ids[i].tolist() == positions, f"window {w}: position ids"
            assert np.array_equal(batch.input_ids[i], raw.tokens[w, :-1]), "inputs keep the padding's ids"
            cus.append(cu)
            padded += real < raw.window_tokens
            ends_at_seq_len += real == seq_len
        assert batch.cu_seqlens_flat.tolist() == expected_flat(cus, seq_len)
        assert batch.cu_seqlens_flat[-1] == mb * seq_len
    assert padded > 100, "many of these windows end in padding"
    assert padded < raw.num_windows, "and many do not"
    assert ds.window_real_tokens(0) == int(raw.real_tokens[0])


def test_a_concat_pack_is_format_4_and_has_no_padding(packed_dir, raw):
    """A pack without padding is written as format 4, byte for byte as before: no real-token
    file, and every row whole (labels are the next tokens, cu_seqlens end at seq_len)."""
    assert raw.manifest["format_version"] == 4
    assert "real_tokens" not in raw.manifest and "packing" not in raw.manifest
    assert not (packed_dir / "real_tokens.u32").exists()
    batch = PackedDataset(packed_dir, micro_batch=3).batch_at(5)
    assert batch.real_tokens.tolist() == [513] * 3
    assert batch.labels.dtype == np.int64 and np.array_equal(batch.labels, raw.tokens[15:18, 1:])
    assert [cu[-1] for cu in batch.cu_seqlens] == [512] * 3


def test_served_best_fit_batches_equal_the_packed_ones(daemon_factory, best_fit_recipe, best_fit_dir, best_fit_raw):
    world, mb, steps = 2, 2, 200
    daemon = daemon_factory(recipe=best_fit_recipe, world_size=world, micro_batch=mb, prefetch=8)
    served = [Client(daemon.endpoint, rank=r, world_size=world, timeout=10) for r in range(world)]
    packed = [PackedDataset(best_fit_dir, micro_batch=mb, rank=r, world_size=world) for r in range(world)]
    padded = 0
    for step in range(steps):
        for r in range(world):
            a, b = served[r].next_batch(), packed[r].next_batch()
            assert (a.step, a.rank, a.first_window) == (b.step, b.rank, b.first_window) == (step, r, (step * world + r) * mb)
            assert a.recipe_hash == b.recipe_hash == best_fit_raw.recipe_hash
            assert np.array_equal(a.tokens, b.tokens)
            assert a.real_tokens.dtype == np.uint32 and a.real_tokens.tolist() == b.real_tokens.tolist()
            assert np.array_equal(a.labels, b.labels) and np.array_equal(a.position_ids, b.position_ids)
            assert [cu.tolist() for cu in a.cu_seqlens] == [cu.tolist() for cu in b.cu_seqlens]
            assert np.array_equal(a.cu_seqlens_flat, b.cu_seqlens_flat)
            assert [s.tolist() for s in a.doc_starts] == [s.tolist() for s in b.doc_starts]
            assert [s.tolist() for s in a.doc_sources] == [s.tolist() for s in b.doc_sources]
            padded += int((a.real_tokens < best_fit_raw.window_tokens).sum())
    assert padded >= 10, "the steps compared hold padded rows"
    for c in served:
        c.close()


def test_a_daemon_that_pads_refuses_requests_older_than_v4(daemon_factory, best_fit_recipe, best_fit_raw):
    daemon = daemon_factory(recipe=best_fit_recipe, world_size=1, micro_batch=1, prefetch=600)
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(daemon.endpoint)

    def ask(request):
        socket.send(request)
        assert socket.poll(10_000), "the daemon replies"
        return socket.recv_multipart(copy=False)

    for version in (1, 2, 3):
        frames = ask(encode_request(version, 0, 1, 0, version=version))
        assert decode_header(frames[0]).version == version, "answered in the request's version"
        with pytest.raises(UnsupportedVersion, match=rf"best_fit .*padding.* protocol v{version} client") as e:
            decode_reply(frames)
        assert e.value.status == 10
    frames = ask(encode_request(4, 0, 1, 489))
    assert len(frames) == 5
    batch = decode_reply(frames)
    assert np.array_equal(batch.tokens[0], best_fit_raw.tokens[489])
    assert batch.real_tokens.tolist() == [int(best_fit_raw.real_tokens[489])] and batch.real_tokens[0] < 513
    socket.close(linger=0)


def test_a_daemon_that_does_not_pad_answers_v3_as_before_and_v4_with_whole_rows(daemon_factory, raw):
    daemon = daemon_factory(world_size=1, micro_batch=2)
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(daemon.endpoint)
    for version, frame_count in ((3, 4), (4, 5)):
        socket.send(encode_request(version, 0, 1, 1, version=version))
        assert socket.poll(10_000), "the daemon replies"
        frames = socket.recv_multipart(copy=False)
        assert len(frames) == frame_count
        batch = decode_reply(frames)
        assert np.array_equal(batch.tokens, raw.tokens[2:4])
        assert batch.real_tokens.tolist() == [513, 513]
        assert np.array_equal(batch.labels, raw.tokens[2:4, 1:])
    assert frames[4].bytes == struct.pack("<2I", 513, 513)
    socket.close(linger=0)


def test_a_newer_format_is_refused(best_fit_dir, tmp_path):
    manifest = json.loads((best_fit_dir / "manifest.json").read_text())
    manifest["format_version"] = 8
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackedFormatError, match=r"manifest.json: format version 8 is not supported \(this reader reads versions 1 to 7\)"):
        PackedDataset(tmp_path)


def test_a_format_7_pack_reads_its_real_tokens_as_5(best_fit_dir, tmp_path):
    """Format 7 (a lineage whose packing changed) adds each segment's packing to the manifest's
    `lineage`; the windows and their real tokens read as before."""
    copy = tmp_path / "packed"
    shutil.copytree(best_fit_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format_version"] = 7
    manifest["lineage"] = [
        {"recipe_hash": "a" * 64, "from_step": 0, "from_window": 0, "from_documents": 0, "global_batch": 4,
         "packing": {"strategy": "concat", "first_window": 0}},
        {"recipe_hash": manifest["recipe_hash"], "from_step": 1, "from_window": 4, "from_documents": 9, "global_batch": 4,
         "packing": {"strategy": "best_fit", "pad_id": manifest["packing"]["pad_id"], "first_window": 5}},
    ]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    old, new = PackedDataset(best_fit_dir), PackedDataset(copy)
    assert new.num_windows == old.num_windows
    assert [new.window_real_tokens(i) for i in range(new.num_windows)] == [old.window_real_tokens(i) for i in range(old.num_windows)]


def test_a_real_token_file_that_does_not_match_the_windows_is_refused(best_fit_dir, tmp_path):
    copy = tmp_path / "packed"
    shutil.copytree(best_fit_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    counts = copy / "real_tokens.u32"
    good, windows = counts.read_bytes(), manifest["num_windows"]

    def write(data, size_in_manifest=None):
        counts.write_bytes(bytes(data))
        manifest["real_tokens"]["size_bytes"] = len(data) if size_in_manifest is None else size_in_manifest
        (copy / "manifest.json").write_text(json.dumps(manifest))

    for data in (good[:-4], good + bytes(4)):
        write(data)
        with pytest.raises(PackedFormatError, match=rf"real_tokens.u32: holds {len(data)} bytes, not {windows} counts"):
            PackedDataset(copy)
    for bad in (0, 514):
        data = bytearray(good)
        data[4 * 7 : 4 * 8] = struct.pack("<I", bad)
        write(data)
        with pytest.raises(PackedFormatError, match=rf"real_tokens.u32: window 7 has {bad} real tokens; a window holds 1 to 513"):
            PackedDataset(copy)
    write(good[:-4], size_in_manifest=len(good))
    with pytest.raises(PackedFormatError, match=rf"real_tokens.u32: is {len(good) - 4} bytes, the manifest says {len(good)}"):
        PackedDataset(copy)
    write(good)
    assert PackedDataset(copy).num_windows == windows


def ok_reply(real_tokens: bytes, frames: int = 5, window_tokens: int = 8) -> list:
    """A v4 ok reply of 3 rows of `window_tokens` u16 tokens 0, 1, 2, …, built from PROTOCOL.md's
    tables: one document per row, all from source 0, then `real_tokens` as frame 5."""
    rows = 3
    header = struct.pack("<4sHHQQIIIIB7s32sQQ", b"DSPR", 4, 0, 1, 0, 0, 1, rows, window_tokens, 2, bytes(7), bytes(32), 2**64 - 1, 0)
    tokens = np.arange(rows * window_tokens, dtype="<u2").tobytes()
    boundaries = struct.pack(f"<{2 * rows + 1}I", *range(rows + 1), *[0] * rows)
    sources = bytes(2 * (rows + rows))
    return [header + bytes(128), tokens, boundaries, sources, real_tokens][:frames]


def test_the_real_token_frame_is_decoded_and_checked():
    batch = decode_reply(ok_reply(struct.pack("<3I", 8, 3, 7)))
    assert batch.real_tokens.tolist() == [8, 3, 7] and not batch.real_tokens.flags.writeable
    assert batch.labels.tolist() == [
        [1, 2, 3, 4, 5, 6, 7],
        [9, 10, -100, -100, -100, -100, -100],
        [17, 18, 19, 20, 21, 22, -100],
    ]
    assert IGNORE_INDEX == -100
    assert [cu.tolist() for cu in batch.cu_seqlens] == [[0, 7], [0, 3], [0, 7]]
    assert batch.position_ids.tolist()[1] == [0, 1, 2, 0, 0, 0, 0]
    assert batch.cu_seqlens_flat.tolist() == [0, 7, 10, 14, 21]
    with pytest.raises(ProtocolError, match=r"^an ok reply of version 4 has 5 frames, got 4$"):
        decode_reply(ok_reply(b"", frames=4))
    with pytest.raises(ProtocolError, match=r"^real-token frame: 8 bytes, 3 rows need 12$"):
        decode_reply(ok_reply(struct.pack("<2I", 8, 8)))
    with pytest.raises(ProtocolError, match=r"^real-token frame: 16 bytes, 3 rows need 12$"):
        decode_reply(ok_reply(struct.pack("<4I", 8, 8, 8, 8)))
    with pytest.raises(ProtocolError, match=r"^real-token frame: a row of 8 tokens cannot hold 0 real tokens$"):
        decode_reply(ok_reply(struct.pack("<3I", 8, 0, 8)))
    with pytest.raises(ProtocolError, match=r"^real-token frame: a row of 8 tokens cannot hold 9 real tokens$"):
        decode_reply(ok_reply(struct.pack("<3I", 8, 8, 9)))
    with pytest.raises(ProtocolError, match=r"^real-token frame: 3 bytes, 1 rows need 4$"):
        decode_real_tokens(memoryview(b"\x08\x00\x00"), 1, 8)

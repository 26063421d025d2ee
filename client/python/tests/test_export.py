"""`dsprep export` read by the readers trainers use: a Hugging Face `datasets` directory loaded
with `datasets.load_from_disk` (what the NeuronX Distributed Llama examples do), and Megatron's
IndexedDataset read by megatron-core itself and, byte for byte, with numpy as its `_IndexReader`
reads it. Every row and document is compared with the packed windows.

CI's venv (`client/python/extras-venv.sh`) has `datasets` and `megatron-core`, and sets
DSPREP_REQUIRE_EXTRAS=1: there a missing package fails instead of skipping."""

import os
import struct
import subprocess

import numpy as np
import pytest

from conftest import dsprep_bin

from extras import extra

datasets = extra("datasets")


def megatron_indexed_dataset():
    """megatron-core's IndexedDataset class (it imports torch)."""
    return extra("megatron.core.datasets.indexed_dataset").IndexedDataset


def export(packed_dir, to, out):
    done = subprocess.run([str(dsprep_bin()), "export", str(packed_dir), "--to", to, "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_load_from_disk_reads_the_stream_in_seq_len_blocks(packed_dir, raw, tmp_path):
    out = tmp_path / "hf"
    export(packed_dir, "hf-datasets", out)
    ds = datasets.load_from_disk(str(out))
    seq_len = raw.window_tokens - 1
    stream = raw.tokens.reshape(-1)
    assert len(ds) == len(stream) // seq_len
    assert ds.column_names == ["input_ids", "attention_mask", "labels"]
    for i in range(0, len(ds), 5):
        row = ds[i]
        want = stream[i * seq_len : (i + 1) * seq_len].astype(np.int64).tolist()
        assert row["input_ids"] == want and row["labels"] == want, f"row {i}"
        assert row["attention_mask"] == [1] * seq_len


def test_megatron_index_reads_as_megatron_core_reads_it(packed_dir, raw, tmp_path):
    prefix = tmp_path / "mega"
    export(packed_dir, "megatron", prefix)
    idx = (tmp_path / "mega.idx").read_bytes()
    # megatron/core/datasets/indexed_dataset.py, _IndexReader.__init__
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", idx[9:17])
    (dtype_code,) = struct.unpack("<B", idx[17:18])
    (sequence_count,) = struct.unpack("<Q", idx[18:26])
    (document_count,) = struct.unpack("<Q", idx[26:34])
    offset = 34
    lengths = np.frombuffer(idx, dtype=np.int32, count=sequence_count, offset=offset)
    offset += lengths.nbytes
    pointers = np.frombuffer(idx, dtype=np.int64, count=sequence_count, offset=offset)
    offset += pointers.nbytes
    documents = np.frombuffer(idx, dtype=np.int64, count=document_count, offset=offset)
    assert (version, dtype_code) == (1, 8)
    bin_ = np.memmap(tmp_path / "mega.bin", dtype=np.uint16, mode="r")
    stream = raw.tokens.reshape(-1)
    starts = np.concatenate([raw.doc_starts(w) + w * raw.window_tokens for w in range(raw.num_windows)])
    ends = np.append(starts[1:], len(stream))
    assert np.array_equal(lengths, ends - starts)
    assert np.array_equal(documents, np.arange(sequence_count + 1))
    for i in range(0, sequence_count, 3):
        # IndexedDataset.get(i): count=lengths[i] items at byte offset pointers[i]
        seq = np.frombuffer(bin_, dtype=np.uint16, count=int(lengths[i]), offset=int(pointers[i]))
        assert np.array_equal(seq, stream[starts[i] : ends[i]]), f"document {i}"


def test_megatron_core_itself_reads_the_export(packed_dir, raw, tmp_path):
    IndexedDataset = megatron_indexed_dataset()
    prefix = tmp_path / "mega"
    export(packed_dir, "megatron", prefix)
    dataset = IndexedDataset(str(prefix), mmap=True)
    stream = raw.tokens.reshape(-1)
    starts = np.concatenate([raw.doc_starts(w) + w * raw.window_tokens for w in range(raw.num_windows)])
    ends = np.append(starts[1:], len(stream))
    assert len(dataset) == len(starts)
    assert np.array_equal(dataset.sequence_lengths, ends - starts)
    assert np.array_equal(dataset.document_indices, np.arange(len(starts) + 1))
    for i in range(len(dataset)):
        assert np.array_equal(dataset[i], stream[starts[i] : ends[i]]), f"document {i}"
    # What GPTDataset asks for: a span of one document.
    assert np.array_equal(dataset.get(3, offset=2, length=5), stream[starts[3] + 2 : starts[3] + 7])

"""Write a corpus of many short documents (FineWeb-Edu's parquet schema) for the resume
benchmark: positions of 10^6 documents are reachable in seconds. Each document is one sentence of
the shipped C4 sample rows with a running number, so all are distinct.

usage: python make_short_docs.py OUT_DIR --docs 1200000 --files 12 --row-group-rows 10000
"""

import argparse
import gzip
import json
import pathlib
import re

import pyarrow as pa
import pyarrow.parquet as pq


def sentences(root: pathlib.Path) -> list[str]:
    out = []
    for path in sorted(root.glob("config/samples/c4/en/*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                text = json.loads(line)["text"]
                out.extend(s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 20)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--docs", type=int, default=1_200_000)
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--row-group-rows", type=int, default=10_000)
    args = ap.parse_args()
    root = pathlib.Path(__file__).resolve().parents[2]
    pool = sentences(root)
    out = pathlib.Path(args.out) / "short" / "sample" / "10BT"
    out.mkdir(parents=True, exist_ok=True)
    per_file = args.docs // args.files
    for k in range(args.files):
        first = k * per_file
        texts = [f"{pool[i % len(pool)]} ({i})" for i in range(first, first + per_file)]
        table = pa.table(
            {
                "text": pa.array(texts, pa.string()),
                "id": pa.array([f"<urn:uuid:{i:08d}>" for i in range(first, first + per_file)]),
                "int_score": pa.array([3] * per_file, pa.int64()),
            }
        )
        pq.write_table(table, out / f"{k:03d}_00000.parquet", row_group_size=args.row_group_rows)
    print(f"{args.docs} documents from {len(pool)} sentences in {args.files} files under {out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Generate the parquet sample datasets in config/samples/ (dsprep quickstart and tests).

Files copy the on-Hub layout, column names and types of FineWeb-Edu sample-10BT, Zyda-2 (fwe3,
dclm_crossdeduped), The Stack v2 train-smol-ids in "resolved" form (plus a `content` field) and
FineMath finemath-3plus. Only the schemas are real: all metadata (ids, urls, scores, dates, repo
names) is made up. Text is redistributable: Python stdlib docstrings and .py files (PSF-2.0),
verbatim licenses from /usr/share/common-licenses, math problems from the seeded generator below
(Apache-2.0). Token counts are estimates (ceil(bytes / 4)). C4 files and the tokenizer are byte
copies made outside this script (see SOURCES.md). Deterministic (fixed seed, sorted inputs) given
CPython 3.11.7 (the text source), Debian's common-licenses and pyarrow==26.0.1:
    python3 -m venv /tmp/samples-venv && /tmp/samples-venv/bin/pip install pyarrow==26.0.1
    /tmp/samples-venv/bin/python make_samples.py [OUT_DIR]   # default: this script's folder
"""
import ast
import datetime as dt
import hashlib
import json
import random
import re
import sys
import sysconfig
import uuid
from math import gcd
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

STDLIB = Path(sysconfig.get_paths()["stdlib"])
COMMON_LICENSES = Path("/usr/share/common-licenses")
LICENSE_DOCS = ["Apache-2.0", "BSD", "CC0-1.0", "GPL-1", "LGPL-3"]  # whole files, see SOURCES.md
# Not used: tests, IDE/demo code, generated codec tables (encodings/), and (conservatively) any
# file that names a copyright holder or licence other than the PSF's, so PSF-2.0 alone applies.
SKIP = {"site-packages", "test", "tests", "idlelib", "turtledemo", "lib2to3", "encodings", "__phello__"}
NON_PSF = re.compile(r"(?im)^(?!.*Python Software Foundation).*(copyright|\(c\) \d{4}|licen[cs]ed under)")
MAX_DOC, MIN_DOC = 8192, 300  # UTF-8 bytes per docstring document
SEED = 20250601
DUMPS = [f"CC-MAIN-{d}" for d in ("2013-20", "2017-26", "2019-30", "2021-43", "2023-50", "2024-10")]
OWNERS = ["dsprep-sample-ada", "dsprep-sample-bo", "dsprep-sample-chen", "dsprep-sample-dara"]
NAMES = ["Ana", "José", "Zoë", "Priya", "Tomás", "Renée", "Kofi", "Mei", "Lars", "Chloé"]
INT_SCORES = [2] * 8 + [3] * 14 + [4] * 12 + [5] * 6  # per 40-row file; 2 = below finemath-3plus
TYPES = {"str": pa.string(), "f64": pa.float64(), "i64": pa.int64(), "i32": pa.int32(),
         "bool": pa.bool_(), "ts": pa.timestamp("ns"), "list<str>": pa.list_(pa.string())}


def fields(spec):
    """'name:type name:type ...' -> list of pyarrow fields (all nullable, as on the Hub)."""
    return [pa.field(n, TYPES[t]) for n, t in (f.split(":", 1) for f in spec.split())]


FWE_SCHEMA = pa.schema(fields("text:str id:str dump:str url:str file_path:str language:str "
                              "language_score:f64 token_count:i64 score:f64 int_score:i64"))
FWE3_SCHEMA = pa.schema(fields("nemo_id:str text:str url:str language_score:f64"))
DCLM_SCHEMA = pa.schema(fields("nemo_id:str text:str url:str"))
# the Hub's file struct plus one extra field, `content` (the Hub has ids only; content lives on S3)
FILE_STRUCT = pa.struct(fields(
    "blob_id:str path:str content_id:str language:str length_bytes:i64 detected_licenses:list<str> "
    "license_type:str src_encoding:str is_vendor:bool is_generated:bool alphanum_fraction:f64 "
    "alpha_fraction:f64 num_lines:i64 avg_line_length:f64 max_line_length:i64 content:str"))
STACK_SCHEMA = pa.schema(fields(
    "repo_name:str repo_url:str snapshot_id:str revision_id:str directory_id:str branch_name:str "
    "visit_date:ts revision_date:ts committer_date:ts github_id:i64 star_events_count:i64 "
    "fork_events_count:i64 gha_license_id:str gha_created_at:ts gha_updated_at:ts gha_pushed_at:ts "
    "gha_language:str num_files:i64") + [pa.field("files", pa.list_(FILE_STRUCT))])
FM_SCHEMA = pa.schema(fields(
    "url:str fetch_time:i64 content_mime_type:str warc_filename:str warc_record_offset:i32 "
    "warc_record_length:i32 text:str token_count:i32 char_count:i32 metadata:str score:f64 "
    "int_score:i64 crawl:str snapshot_type:str language:str language_score:f64"))


def est_tokens(text):
    return (len(text.encode()) + 3) // 4


def write(rows, schema, path, codec, row_group, written):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression=codec,
                   row_group_size=row_group)
    written.append(path)


def stdlib_files():
    """(relative path, path) of the usable stdlib .py files, sorted."""
    for p in sorted(STDLIB.rglob("*.py")):
        rel = p.relative_to(STDLIB)
        if not SKIP.intersection(rel.parts) and not NON_PSF.search(p.read_text(encoding="utf-8")):
            yield rel.as_posix(), p


def clip(text, limit=MAX_DOC):
    """Cut at the last paragraph break so that the UTF-8 size stays <= limit."""
    if len(text.encode()) <= limit:
        return text
    head = text.encode()[:limit].decode("utf-8", "ignore")
    return head[: head.rfind("\n\n")] if "\n\n" in head else head


def docstring_docs():
    """(module, text): the module docstring, then 'name\\n\\ndocstring' for public top-level defs."""
    docs = []
    for rel, path in stdlib_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parts = [ast.get_docstring(tree) or ""]
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name[0] != "_":
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 40:
                    parts.append(f"{node.name}\n\n{doc}")
        text = clip("\n\n".join(p for p in parts if p))
        if len(text.encode()) >= MIN_DOC:
            docs.append((rel[:-3].replace("/", ".").removesuffix(".__init__"), text))
    return docs


def warc_path(rng, crawl):  # a made-up WARC path in Common Crawl's naming pattern
    t0 = dt.datetime(int(crawl[8:12]), rng.randint(1, 12), rng.randint(1, 28),
                     rng.randrange(22), rng.randrange(60))
    stamps = "-".join(t.strftime("%Y%m%d%H%M%S") for t in (t0, t0 + dt.timedelta(seconds=7200)))
    return (f"crawl-data/{crawl}/segments/{rng.randrange(10**12, 10**13)}.{rng.randrange(100):02d}/warc/"
            f"CC-MAIN-{stamps}-{rng.randrange(100000):05d}.warc.gz")


def fineweb_row(rng, module, text):
    dump = rng.choice(DUMPS)
    score = rng.randrange(41, 81) / 16  # 2.5625 .. 5.0, so int_score >= 3 as in FineWeb-Edu
    return {"text": text, "dump": dump, "id": f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}>",
            "url": f"https://docs.example.org/py/{module}.html",
            "file_path": "s3://commoncrawl/" + warc_path(rng, dump),
            "language": "en", "language_score": rng.uniform(0.80, 0.99),
            "token_count": est_tokens(text), "score": score, "int_score": int(score + 0.5)}


def file_entry(rel, data):
    text = data.decode("utf-8")
    lines = text.splitlines() or [""]
    return {"blob_id": hashlib.sha1(data).hexdigest(), "path": "/" + rel,
            "content_id": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),  # git blob id
            "language": "Python", "length_bytes": len(data), "detected_licenses": ["PSF-2.0"],
            "license_type": "permissive", "src_encoding": "UTF-8", "is_vendor": False, "is_generated": False,
            "alphanum_fraction": sum(c.isalnum() for c in text) / len(text),
            "alpha_fraction": sum(c.isalpha() for c in text) / len(text),
            "num_lines": len(lines), "avg_line_length": sum(map(len, lines)) / len(lines),
            "max_line_length": max(map(len, lines)), "content": text}


def stack_rows(rng, n_repos=20):
    """One made-up repository per stdlib package: 2-6 of its .py files of 200 B .. 20 KB."""
    pkgs = {}
    for rel, path in stdlib_files():
        if "/" in rel and 200 <= path.stat().st_size < 20_000:
            pkgs.setdefault(rel.rsplit("/", 1)[0], []).append((rel, path))
    rows = []
    for pkg in sorted(rng.sample(sorted(k for k, v in pkgs.items() if len(v) >= 2), n_repos)):
        files = sorted(rng.sample(pkgs[pkg], min(len(pkgs[pkg]), rng.randint(2, 6))))
        name = f"{rng.choice(OWNERS)}/py-{pkg.replace('/', '-')}"
        sha = lambda kind: hashlib.sha1(f"{kind}:{name}".encode()).hexdigest()  # noqa: E731
        created = dt.datetime(2012, 1, 1) + dt.timedelta(seconds=rng.randrange(300_000_000))
        pushed = created + dt.timedelta(seconds=rng.randrange(1, 60_000_000))
        rows.append({
            "repo_name": name, "repo_url": f"https://github.com/{name}", "snapshot_id": sha("snapshot"),
            "revision_id": sha("revision"), "directory_id": sha("directory"),
            "branch_name": rng.choice(["refs/heads/main", "refs/heads/master"]),
            "visit_date": dt.datetime(2023, 9, 6) + dt.timedelta(seconds=rng.randrange(2_000_000)),
            "revision_date": pushed, "committer_date": pushed, "github_id": rng.randrange(10**7, 7 * 10**8),
            "star_events_count": int(rng.paretovariate(1.2)) - 1,
            "fork_events_count": int(rng.paretovariate(1.6)) - 1,
            "gha_license_id": rng.choice(["PSF-2.0", "PSF-2.0", None]), "gha_created_at": created,
            "gha_updated_at": pushed + dt.timedelta(seconds=rng.randrange(10_000_000)),
            "gha_pushed_at": pushed, "gha_language": "Python", "num_files": len(files),
            "files": [file_entry(rel, p.read_bytes()) for rel, p in files]})
    return rows


class MathGen:
    """Seeded FineMath-style worked problems; fancy=True writes ×, −, ², ✓ and — (non-ASCII)."""

    def __init__(self, rng, fancy):
        self.r, self.fancy = rng, fancy
        self.mul, self.minus = ("×", "−") if fancy else ("*", "-")

    def linear(self):
        r, m = self.r, self
        a, x, b = r.randint(2, 12), r.randint(-15, 20), r.randint(-30, 30)
        c = a * x + b
        op, bb = ("+", b) if b >= 0 else (m.minus, -b)
        return (f"Solve for x: {a}x {op} {bb} = {c}.",
                [f"Move the constant across: {a}x = {c} {m.minus if b >= 0 else '+'} {bb} = {c - b}.",
                 f"Divide both sides by {a}: x = {c - b}/{a} = {x}.",
                 f"Check: {a} {m.mul} ({x}) {op} {bb} = {c}, {'✓' if m.fancy else 'correct.'}"], f"x = {x}")

    def percent(self):
        r, m = self.r, self
        who, price, p = r.choice(NAMES), r.randint(4, 60) * 5, r.choice([5, 10, 15, 20, 25, 30, 40])
        off = price * p / 100
        return (f"{who} buys a coffee machine for a café. It costs ${price}, and the shop gives "
                f"a {p}% discount. What does {who} pay?",
                [f"The discount is {p}% of {price} = {p}/100 {m.mul} {price} = {off:g} dollars.",
                 f"The price after the discount is {price} {m.minus} {off:g} = {price - off:g} dollars."],
                f"${price - off:g}")

    def fractions(self):
        r = self.r
        b, d = r.randint(2, 12), r.randint(2, 12)
        a, c = r.randint(1, b - 1), r.randint(1, d - 1)
        lcd = b * d // gcd(b, d)
        num = a * lcd // b + c * lcd // d
        g = gcd(num, lcd)
        frac = lambda p, q: f"$\\frac{{{p}}}{{{q}}}$"  # noqa: E731
        return (f"Add the fractions {frac(a, b)} + {frac(c, d)}.",
                [f"The least common denominator of {b} and {d} is {lcd}.",
                 f"{frac(a, b)} = {frac(a * lcd // b, lcd)} and {frac(c, d)} = {frac(c * lcd // d, lcd)}, "
                 f"so the sum is {frac(num, lcd)}.",
                 f"Divide numerator and denominator by gcd({num}, {lcd}) = {g}: {frac(num // g, lcd // g)}."],
                f"{num // g}/{lcd // g}")

    def quadratic(self):
        r, m = self.r, self
        r1, r2 = sorted(r.sample([v for v in range(-9, 10) if v], 2))
        s, p = -(r1 + r2), r1 * r2
        term = lambda v, t: "" if v == 0 else f" + {v}{t}" if v > 0 else f" {m.minus} {-v}{t}"  # noqa: E731
        return (f"Solve x{'²' if m.fancy else '^2'}{term(s, 'x')}{term(p, '')} = 0 by factoring.",
                [f"We need two numbers whose product is {p} and whose sum is {-s}: {r1} and {r2}.",
                 f"So (x{term(-r1, '')})(x{term(-r2, '')}) = 0, which gives x = {r1} or x = {r2}."],
                f"x = {r1} or x = {r2}")

    KINDS = ["linear", "percent", "fractions", "quadratic"]

    def document(self):
        r = self.r
        kind = r.choice(self.KINDS)
        out = [f"{kind.title()} {'—' if self.fancy else '-'} worked examples",
               f"Work through each problem, then compare with the solution. Level {r.randint(1, 8)}."]
        for i in range(1, 1 + r.choice([1, 2, 3, 4, 6, 8, 12, 16])):
            q, steps, ans = getattr(self, r.choice([kind, kind, r.choice(self.KINDS)]))()
            body = "\n".join(f"Step {j}: {s}" for j, s in enumerate(steps, 1))
            out.append(f"Problem {i}. {q}\n\nSolution.\n{body}\nAnswer: {ans}")
        return kind, "\n\n".join(out)


def finemath_row(rng, n, int_score):
    kind, text = MathGen(rng, fancy=rng.random() < 0.4).document()
    crawl = rng.choice(["CC-MAIN-2023-50", "CC-MAIN-2024-10", "CC-MAIN-2024-18"])
    epoch_s = int((dt.datetime(int(crawl[8:12]), 1, 1) - dt.datetime(1970, 1, 1)).total_seconds())
    meta = {"extraction_info": {"found_math": True, "script_math_tex": text.count("\\frac"),
                                "math_score": round(rng.uniform(0.3, 1.0), 4)}}
    return {"url": f"https://math.example.edu/{kind}/{n}.html",
            "fetch_time": (epoch_s + rng.randrange(30_000_000)) * 1000,  # epoch ms (unit unverified)
            "content_mime_type": "text/html", "warc_filename": warc_path(rng, crawl),
            "warc_record_offset": rng.randrange(2**30), "warc_record_length": rng.randrange(4000, 200000),
            "text": text, "token_count": est_tokens(text), "char_count": len(text), "metadata": json.dumps(meta),
            "score": int_score + rng.uniform(-0.45, 0.0 if int_score == 5 else 0.45),
            "int_score": int_score, "crawl": crawl, "snapshot_type": rng.choice(["latest", "largest"]),
            "language": "en", "language_score": rng.uniform(0.75, 0.98)}


def main(out):
    if sys.version_info[:3] != (3, 11, 7) or pa.__version__ != "26.0.1":
        print("warning: not CPython 3.11.7 + pyarrow 26.0.1; output will differ", file=sys.stderr)
    rng = random.Random(SEED)
    docs = docstring_docs()
    ascii_docs = [d for d in docs if d[1].isascii()]
    rng.shuffle(ascii_docs)
    non_ascii = [d for d in docs if not d[1].isascii()]  # dealt round-robin: every source gets some
    fwe, fwe3, dclm = parts = [non_ascii[k::3] for k in range(3)]
    for part, size in zip(parts, (119, 40, 40 - len(LICENSE_DOCS))):  # disjoint sets of modules
        part += [ascii_docs.pop() for _ in range(size - len(part))]
        rng.shuffle(part)
    written = []
    rows = [fineweb_row(rng, m, t) for m, t in fwe]
    rows.insert(21, fineweb_row(rng, "index", ""))  # the one empty document: file 000, row 21
    for i in range(2):
        write(rows[60 * i: 60 * (i + 1)], FWE_SCHEMA, out / f"fineweb-edu/sample/10BT/{i:03d}_00000.parquet",
              "snappy", 16, written)

    rows = [{"nemo_id": f"fwe3-0000-{i:06d}", "text": t, "url": f"https://pylib.example.com/{m}",
             "language_score": rng.uniform(0.85, 0.99)} for i, (m, t) in enumerate(fwe3)]
    write(rows, FWE3_SCHEMA, out / "zyda-2/data/fwe3/fwe3_0000.parquet", "snappy", 16, written)
    items = [(f"https://reference.example.net/{m}", t) for m, t in dclm]
    items += [(f"https://licenses.example.net/{n}.txt", (COMMON_LICENSES / n).read_text(encoding="utf-8"))
              for n in LICENSE_DOCS]  # whole license texts, verbatim
    rng.shuffle(items)
    rows = [{"nemo_id": f"dclm-0000-{i:06d}", "text": t, "url": u} for i, (u, t) in enumerate(items)]
    write(rows, DCLM_SCHEMA, out / "zyda-2/data/dclm_crossdeduped/dclm_0000.parquet", "snappy", 16, written)
    write(stack_rows(rng), STACK_SCHEMA, out / "the-stack-v2/data/smol_0000.parquet", "zstd", 8, written)
    for i in range(2):
        scores = INT_SCORES[:]
        rng.shuffle(scores)
        rows = [finemath_row(rng, 100 * i + j, s) for j, s in enumerate(scores)]
        write(rows, FM_SCHEMA, out / f"finemath/finemath-3plus/train-{i:05d}-of-00002.parquet",
              "snappy", 16, written)
    for path in written:
        meta = pq.ParquetFile(path).metadata
        print(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.stat().st_size:7d} B  "
              f"{meta.num_rows:3d} rows  {meta.num_row_groups} rg  {path.relative_to(out)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)

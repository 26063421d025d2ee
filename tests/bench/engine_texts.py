#!/usr/bin/env python3
"""The texts of tests/bench/engines.sh: four kinds that repeat nothing, and the seed mix, as
gzip JSON lines (field `text`, one document per row) that tokenize_bench reads.

    python3 tests/bench/engine_texts.py OUT_DIR [--mb 8]

  english.json.gz   English web prose: every C4 row the repository holds (tests/bench/data's
                    1,000 and config/samples/c4), then the fineweb-edu and Zyda-2 sample rows
                    of config/samples (parquet, read with pyarrow when installed). ~3 MB: all
                    the real web rows there are; documents as they are.
  code.json.gz      Python's standard library (sorted .py files) cut at line ends into ~4 KiB
                    documents, the first --mb MB (as tokenize_vs_gigatoken.sh does).
  cjk.json.gz       Japanese and Chinese (simplified, traditional) man pages, the Debian
                    packages manpages-ja and manpages-zh, roff markup stripped, one page a
                    document, taken in turn from each language, the first --mb MB.
  european.json.gz  German, French and Spanish man pages (manpages-de, -fr, -es), the same way.
  math.json.gz      the FineMath rows of config/samples (for the mix only).
  mix.json.gz       the seed mix, by bytes: English web prose 60 %, code 20 %, math 5 %, CJK
                    7.5 %, European 7.5 %; math is all the FineMath rows, the others scaled to
                    it up to what they hold, each document at most once, shuffled (seed 0).

    python3 tests/bench/engine_texts.py OUT_DIR --mb 8 --mix-mb 32

  With --mix-mb, the mix is that long instead (a long stream, so caches warm as in a pack):
  prose.json.gz     English technical prose: English man pages (/usr/share/man/man1-8) and
                    the chapters of the Rust books the toolchain ships (share/doc/rust/html:
                    book, reference, nomicon, cargo, rustc, edition-guide, embedded-book),
                    HTML tags dropped, taken in turn, as much as the English share needs.
                    The English share is every web row, then prose; math stays all FineMath
                    holds (under its 5 %), its missing share going to English; the kinds
                    are the --mb files (code, CJK, European) up to their shares.

A page that appears twice (the same bytes) is kept once. Prints each file's documents and MB.
"""

import gzip
import hashlib
import json
import random
import re
import sys
import sysconfig
import unicodedata
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIX = {"english": 0.60, "code": 0.20, "math": 0.05, "cjk": 0.075, "european": 0.075}


def json_gz_texts(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def parquet_texts(folder, column="text"):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        print(f"pyarrow not installed: {folder} left out", file=sys.stderr)
        return
    for path in sorted(Path(folder).rglob("*.parquet")):
        for text in pq.read_table(path, columns=[column]).column(column).to_pylist():
            if text:
                yield text


MARKS = {"'": "\u0301", "`": "\u0300", "^": "\u0302", ":": "\u0308", ",": "\u0327", "~": "\u0303"}
NAMED = {"aq": "'", "cq": "\u2019", "oq": "\u2018", "dq": '"', "hy": "-", "ss": "\u00df",
         "ae": "\u00e6", "oe": "\u0153", "AE": "\u00c6", "OE": "\u0152", "Fo": "\u00ab",
         "Fc": "\u00bb", "Bq": "\u201e", "lq": "\u201c", "rq": "\u201d", "em": "\u2014",
         "en": "\u2013", "co": "\u00a9", "bu": "\u2022", "mu": "\u00d7", "de": "\u00b0"}
ESCAPES = [
    # accented letters (\('e) and named characters (\(aq, \*(Aq, \[aq])
    (r"\\\((['`^:,~])([A-Za-z])",
     lambda m: unicodedata.normalize("NFC", m.group(2) + MARKS[m.group(1)])),
    (r"\\\*?\((..)|\\\[(..)\]",
     lambda m: NAMED.get(m.group(1) or m.group(2), NAMED.get((m.group(1) or "").lower(), ""))),
    (r"\\f(\[[^\]]*\]|\(..|.)", ""),  # font changes
    (r"\\s[-+]?\d", ""),  # size changes
    (r"\\\(..", ""),
    (r"\\\[[^\]]*\]", ""),
    (r"\\[&,/|^)]", ""),
    (r"\\[-~ 0]", lambda m: "-" if m.group(0) == "\\-" else " "),
    (r"\\e", "\\\\"),
    (r"\\\*\(..|\\\*.", ""),
]


def strip_roff(source):
    """The text of a man page: macros' arguments kept, requests and escapes dropped."""
    out = []
    for line in source.splitlines():
        line = line.split('\\"', 1)[0] if '\\"' in line else line
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].partition(" ")
            if macro in ("SH", "SS", "B", "I", "BI", "BR", "IB", "IR", "RB", "RI", "TP", "IP"):
                line = rest.replace('"', "")
            else:
                continue
        for pattern, replacement in ESCAPES:
            line = re.sub(pattern, replacement, line)
        out.append(line)
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def man_pages(languages):
    """Pages of each language in turn (sorted by path within each)."""
    lists = []
    for lang in languages:
        pages = sorted((Path("/usr/share/man") / lang).rglob("*.gz"))
        if not pages:
            print(f"no man pages for {lang}: install manpages-*", file=sys.stderr)
        lists.append(pages)
    for group in zip(*[iter_pages(p) for p in lists]):
        yield from group


def iter_pages(paths):
    for path in paths:
        try:
            source = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        if source.startswith(".so "):
            continue  # a link to another page
        text = strip_roff(source)
        if len(text) > 200:
            yield text


def english_man_pages():
    """English man pages (sections 1 to 8), sorted by path."""
    yield from iter_pages(sorted(p for n in range(1, 9)
                                 for p in Path(f"/usr/share/man/man{n}").glob("*.gz")))


class _HtmlText(HTMLParser):
    """The text of an mdBook chapter: what its <main> holds, tags dropped."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.parts = 0, []

    def handle_starttag(self, tag, attrs):
        if tag == "main" or self.depth:
            self.depth += 1

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.parts.append(data)


def rust_book_chapters():
    """Chapters of the Rust books the toolchain ships (print.html, the whole book, left out)."""
    books = ["book", "reference", "nomicon", "cargo", "rustc", "edition-guide", "embedded-book"]
    for toolchain in sorted(Path.home().glob(".rustup/toolchains/*/share/doc/rust/html"))[:1]:
        for book in books:
            for path in sorted((toolchain / book).rglob("*.html")):
                if path.name in ("print.html", "toc.html", "404.html"):
                    continue
                parser = _HtmlText()
                parser.feed(path.read_text(encoding="utf-8", errors="replace"))
                text = re.sub(r"\n{3,}", "\n\n", "".join(parser.parts)).strip() + "\n"
                if len(text) > 200:
                    yield text


def interleave(*iterables):
    """One from each in turn until all are spent."""
    iterators = [iter(i) for i in iterables]
    while iterators:
        for it in list(iterators):
            try:
                yield next(it)
            except StopIteration:
                iterators.remove(it)


def python_code(limit):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    total, doc = 0, ""
    for path in files:
        for line in path.read_bytes().decode("utf-8", "replace").splitlines(keepends=True):
            doc += line
            if len(doc.encode()) >= 4096:
                yield doc
                total += len(doc.encode())
                doc = ""
                if total >= limit:
                    return


def take(texts, limit, seen):
    """Documents not seen before, up to `limit` bytes."""
    docs, total = [], 0
    for text in texts:
        digest = hashlib.sha256(text.encode()).digest()
        if digest in seen:
            continue
        seen.add(digest)
        docs.append(text)
        total += len(text.encode())
        if total >= limit:
            break
    return docs


def write(path, docs):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"{path.name}: {len(docs)} documents, {mb:.2f} MB")


def main():
    out = Path(sys.argv[1])
    mb = float(sys.argv[sys.argv.index("--mb") + 1]) if "--mb" in sys.argv else 8.0
    mix_mb = float(sys.argv[sys.argv.index("--mix-mb") + 1]) if "--mix-mb" in sys.argv else None
    limit = mb * 1e6
    out.mkdir(parents=True, exist_ok=True)

    def english():
        yield from json_gz_texts(ROOT / "tests/bench/data/c4-en-1000.json.gz")
        for p in sorted((ROOT / "config/samples/c4/en").glob("*.json.gz")):
            yield from json_gz_texts(p)
        yield from parquet_texts(ROOT / "config/samples/fineweb-edu")
        yield from parquet_texts(ROOT / "config/samples/zyda-2")

    seen = set()
    kinds = {
        "english": take(english(), float("inf"), seen),
        "code": take(python_code(limit), limit, seen),
        "cjk": take(man_pages(["ja", "zh_CN", "zh_TW"]), limit, seen),
        "european": take(man_pages(["de", "fr", "es"]), limit, seen),
        "math": take(parquet_texts(ROOT / "config/samples/finemath"), float("inf"), seen),
    }
    for name, docs in kinds.items():
        write(out / f"{name}.json.gz", docs)

    size = {k: sum(len(d.encode()) for d in v) for k, v in kinds.items()}
    if mix_mb:
        # A long mix: English is the web rows then technical prose, up to its share plus what
        # math lacks of its own.
        total = mix_mb * 1e6
        want = total * (MIX["english"] + MIX["math"]) - size["math"] - size["english"]
        prose = take(interleave(english_man_pages(), rust_book_chapters()), want, seen)
        write(out / "prose.json.gz", prose)
        kinds["english"] = kinds["english"] + prose
        size["english"] += sum(len(d.encode()) for d in prose)
    else:
        # The mix: as many bytes as each kind holds allow at the blend's shares.
        total = min(size[k] / share for k, share in MIX.items())
    mix = []
    for kind, share in MIX.items():
        want, got = total * share, 0
        if mix_mb and kind == "english":
            want = total * (share + MIX["math"]) - size["math"]
        for d in kinds[kind]:
            if got + len(d.encode()) <= want * 1.02:
                mix.append(d)
                got += len(d.encode())
        print(f"mix: {kind} {got / 1e6:.2f} MB ({got / total:.1%})")
    random.Random(0).shuffle(mix)
    write(out / "mix.json.gz", mix)


if __name__ == "__main__":
    main()

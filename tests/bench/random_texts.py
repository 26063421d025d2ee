"""Random text made to find where a tokenizer's fast path and HF's part ways: runs of letters,
digits, marks and whitespace of every kind, from every script and plane, joined at random, with
combining marks, emoji sequences, variation selectors, bidi controls and unpaired line ends.
Seeded, so a run is repeatable; for tests/bench/engine_soak.sh.

    python3 tests/bench/random_texts.py OUT_DIR [MB] [SEED]   # default 50 MB, seed 0
"""

import random
import sys
import unicodedata
from pathlib import Path

FILE_BYTES = 1 << 20


def assigned(lo, hi):
    """The assigned code points in [lo, hi), surrogates excluded."""
    return [chr(c) for c in range(lo, hi) if not 0xD800 <= c < 0xE000 and unicodedata.category(chr(c)) != "Cn"]


POOL = assigned(0x20, 0x30000)
BY_CATEGORY = {}
for ch in POOL:
    BY_CATEGORY.setdefault(unicodedata.category(ch)[0], []).append(ch)
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u2028", "\u3000", "\u200b", "\u000b", "\u000c", "\u0085"]
SEQUENCES = [
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a family: ZWJ joins
    "\U0001f44d\U0001f3fd",  # a skin tone modifier
    "\u2764\ufe0f", "\u0031\ufe0f\u20e3",  # variation selector, keycap
    "\U0001f1fa\U0001f1f8",  # a flag: regional indicators
    "e\u0301", "\u1100\u1161\u11a8", "\u0915\u094d\u0937",  # combining, jamo, a conjunct
    "\u202e", "\u200f", "\u2066",  # bidi controls
    "'s", "'LL", "’t", "n't", "\u2581", "\u2581\u2581",
    "<|endoftext|>", "</s>", "<s>", "<unk>", "<0x0A>",
]


LETTER_BLOCKS = {}
for ch in BY_CATEGORY["L"]:
    LETTER_BLOCKS.setdefault(ord(ch) >> 7, []).append(ch)
LETTER_BLOCKS = list(LETTER_BLOCKS.values())


def word(rng):
    """Letters of one 128-code-point block (mostly one script, its cases mixed), now and then a
    combining mark, a modifier letter or a digit of the block's script inside."""
    block = rng.choice(LETTER_BLOCKS) if rng.random() < 0.6 else [chr(c) for c in range(0x41, 0x5B)] + [chr(c) for c in range(0x61, 0x7B)]
    out = []
    for _ in range(rng.randint(1, 16)):
        out.append(rng.choice(block))
        roll = rng.random()
        if roll < 0.05:
            out.append(rng.choice(BY_CATEGORY["M"]))
        elif roll < 0.07:
            out.append(rng.choice(BY_CATEGORY["N"]))
    return "".join(out)


def run(rng):
    kind = rng.random()
    if kind < 0.30:
        return word(rng)
    if kind < 0.40:
        digits = BY_CATEGORY["N"] if rng.random() < 0.3 else list("0123456789")
        return "".join(rng.choice(digits) for _ in range(rng.randint(1, 14)))
    if kind < 0.55:
        marks = BY_CATEGORY["P"] + BY_CATEGORY["S"] if rng.random() < 0.4 else list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
        return "".join(rng.choice(marks) for _ in range(rng.randint(1, 6)))
    if kind < 0.80:
        return "".join(rng.choice(WHITESPACE) for _ in range(rng.choice([1, 1, 1, 2, 3, 8, 40])))
    if kind < 0.90:
        return rng.choice(SEQUENCES)
    if kind < 0.95:
        return rng.choice(BY_CATEGORY["M"])
    return "".join(rng.choice(POOL) for _ in range(rng.randint(1, 4)))


def main():
    out = Path(sys.argv[1])
    megabytes = float(sys.argv[2]) if len(sys.argv) > 2 else 50
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    out.mkdir(parents=True, exist_ok=True)
    written, index = 0, 0
    while written < megabytes * 1e6:
        parts, size = [], 0
        while size < FILE_BYTES:
            part = run(rng)
            parts.append(part)
            size += len(part.encode())
        text = "".join(parts)
        (out / f"random-{index:04}.txt").write_text(text, encoding="utf-8", newline="")
        written += len(text.encode())
        index += 1
    print(f"{index} files, {written / 1e6:.1f} MB of random text in {out}")


if __name__ == "__main__":
    main()

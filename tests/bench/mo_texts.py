"""Every message catalogue (gettext `.mo`) under the given folders as one UTF-8 text file each:
each message and its translation, decoded with the catalogue's charset. Translations of the
same programs into some 200 languages and scripts, with their format strings and punctuation:
text in every script a machine already holds, for tests/bench/engine_soak.sh.

    python3 tests/bench/mo_texts.py OUT_DIR [FOLDER...]   # default /usr/share/locale
"""

import os
import struct
import sys
from pathlib import Path


def messages(data: bytes):
    """The catalogue's text, or None where `data` is no catalogue (GNU gettext's .mo layout)."""
    magic = struct.unpack("<I", data[:4])[0] if len(data) >= 20 else None
    order = {0x950412DE: "<", 0xDE120495: ">"}.get(magic)
    if order is None:
        return None
    _, _, count, originals, translations = struct.unpack(order + "5I", data[:20])
    charset, pairs = "utf-8", []
    for i in range(count):
        length, offset = struct.unpack(order + "2I", data[originals + 8 * i : originals + 8 * i + 8])
        t_length, t_offset = struct.unpack(order + "2I", data[translations + 8 * i : translations + 8 * i + 8])
        original, translated = data[offset : offset + length], data[t_offset : t_offset + t_length]
        if length == 0:  # the header: its Content-Type names the charset
            for line in translated.decode("ascii", "replace").splitlines():
                if "charset=" in line:
                    charset = line.split("charset=", 1)[1].strip()
            continue
        pairs.append((original, translated))
    try:
        "".encode(charset)
    except LookupError:
        charset = "utf-8"
    parts = []
    for original, translated in pairs:  # plural forms are NUL-separated
        parts.append(original.decode("utf-8", "replace").replace("\0", "\n"))
        parts.append(translated.decode(charset, "replace").replace("\0", "\n"))
    return "\n".join(parts)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    written = total = 0
    for root in sys.argv[2:] or ["/usr/share/locale"]:
        for folder, _, names in os.walk(root):
            for name in sorted(names):
                path = os.path.join(folder, name)
                if not name.endswith(".mo") or os.path.islink(path):
                    continue
                try:
                    text = messages(Path(path).read_bytes())
                except (struct.error, OSError):
                    continue  # a truncated or unreadable catalogue: not text to test with
                if not text:
                    continue
                relative = os.path.relpath(path, root).replace("/LC_MESSAGES", "").replace("/", "_")
                (out / f"{Path(root).name}-{relative}.txt").write_text(text, encoding="utf-8")
                written += 1
                total += len(text.encode())
    print(f"{written} catalogues, {total / 1e6:.1f} MB of text in {out}")


if __name__ == "__main__":
    main()

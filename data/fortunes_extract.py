#!/usr/bin/env python3
"""Builds data/fortunes.jsonl.gz from Debian's package `fortunes` (1:1.99.1-7.3, bookworm).

Usage: apt-get download fortunes && dpkg-deb -x fortunes_1%3a1.99.1-7.3_all.deb pkg
       python3 data/fortunes_extract.py pkg/usr/share/games/fortunes data/fortunes.jsonl.gz

Every fortune file of the directory (a regular file whose name has no dot: the `.dat` indices
and the `.u8` symbolic links are skipped), in sorted name order; in each, the fortunes in file
order. A fortune is the text between two lines that hold only `%` (the file's start and end
count as separators), its final newline removed; an empty or whitespace-only one is skipped.
No subsampling, no truncation. One JSON object per line, keys sorted:
  {"category": FILE NAME, "index": 0-based position among the file's kept fortunes, "text": TEXT}
written as UTF-8 (every file of 1:1.99.1-7.3 is valid UTF-8), then gzip level 9 with mtime 0
and no file name, so the output is byte for byte reproducible. Standard library only.
"""

import gzip
import hashlib
import json
import os
import sys


def fortunes(path: str):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    cur = []
    for line in lines:
        if line == "%":
            yield "\n".join(cur)
            cur = []
        else:
            cur.append(line)
    yield "\n".join(cur)


def main() -> int:
    src, out = sys.argv[1], sys.argv[2]
    names = sorted(
        n for n in os.listdir(src) if "." not in n and os.path.isfile(os.path.join(src, n))
        and not os.path.islink(os.path.join(src, n))
    )
    lines = []
    for name in names:
        index = 0
        for text in fortunes(os.path.join(src, name)):
            text = text.removesuffix("\n")
            if not text.strip():
                continue
            rec = {"category": name, "index": index, "text": text}
            lines.append(json.dumps(rec, ensure_ascii=False, sort_keys=True, separators=(",", ":")))
            index += 1
    raw = ("\n".join(lines) + "\n").encode("utf-8")
    with open(out, "wb") as f:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, compresslevel=9, mtime=0) as z:
            z.write(raw)
    with open(out, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    print(f"{len(names)} files, {len(lines)} fortunes, {len(raw)} bytes decoded, sha256 {digest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""tokfile.py — writes a coll-train token file (format in libtrain/include/train.h):

    magic "COLLTOK1" | u32 version 1 | u32 vocab | u64 N | N x u16 ids (little-endian)

usage: tokfile.py IN OUT [--vocab V] [--ids]
  default: IN is any file, tokenised byte by byte (vocab 256), like raw-text input;
  --ids:   IN holds whitespace-separated integer ids (< V), e.g. from another tokenizer.
Needs only the Python standard library.
"""
import argparse
import os
import struct
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--ids", action="store_true")
    a = ap.parse_args()
    if a.ids:
        ids = [int(t) for t in open(a.inp).read().split()]
    else:
        ids = list(open(a.inp, "rb").read())
    if not 2 <= a.vocab <= 65536:
        sys.exit("tokfile.py: --vocab must be in 2..65536")
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < a.vocab), None)
    if bad is not None:
        sys.exit("tokfile.py: token %d has id %d outside vocab %d" % (bad, ids[bad], a.vocab))
    tmp = a.out + ".tmp.%d" % os.getpid()
    with open(tmp, "wb") as f:
        f.write(b"COLLTOK1" + struct.pack("<IIQ", 1, a.vocab, len(ids)))
        f.write(struct.pack("<%dH" % len(ids), *ids))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, a.out)
    print("%s: %d tokens, vocab %d" % (a.out, len(ids), a.vocab))


if __name__ == "__main__":
    main()

"""Pixels of a PNG (8-bit, non-interlaced: what chromium's screenshots are), with only zlib and numpy.

The test environment has no imaging library; a QR decoder wants a grey (H, W) array, and a screenshot
is a PNG. PNG spec §9 (filters) and §11.2.2 (IHDR) are all this needs.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}        # colour type -> samples per pixel (grey, RGB, grey+alpha, RGBA)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def grey(png: bytes) -> np.ndarray:
    """The PNG as a (H, W) uint8 grey image (alpha dropped, RGB averaged with the usual luma weights)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(png):
        (length,), kind = struct.unpack(">I", png[pos:pos + 4]), png[pos + 4:pos + 8]
        body = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or interlace or colour not in CHANNELS:
        raise ValueError(f"PNG depth={depth} colour={colour} interlace={interlace}: only 8-bit, non-interlaced")
    bpp = CHANNELS[colour]
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up_left = prev[i - bpp] if i >= bpp else 0
            pred = (0, left, prev[i], (left + prev[i]) // 2, _paeth(left, prev[i], up_left))[kind]
            line[i] = (line[i] + pred) & 0xFF
        out[y] = np.frombuffer(bytes(line), dtype=np.uint8)
        prev = line
    px = out.reshape(height, width, bpp).astype(np.float64)
    if bpp >= 3:
        g = 0.299 * px[..., 0] + 0.587 * px[..., 1] + 0.114 * px[..., 2]
    else:
        g = px[..., 0]
    return np.rint(g).astype(np.uint8)

"""Bytes on disk: a streaming safetensors writer, a bounded header reader, box reads with ``pread``, fsync.

The files are ordinary safetensors (`safetensors.safe_open` reads them), written and read here by hand
for two reasons the course cares about:

- the writer streams each tensor's bytes from the rank's own memory into the file and into a sha256
  as it goes: no serialized copy of the shard is ever built (``safetensors.torch.save_file`` builds one);
- the reader fetches a box of a stored tensor with one ``os.pread`` per contiguous run of bytes, into a
  buffer of the box's size: what a rank reads is exactly what its plan names, and ``/proc/self/io``
  can confirm it (no memory map whose pages would count as this process's memory).

A safetensors file is ``u64 little-endian header length | JSON header | data``; the header maps each
key to ``{"dtype", "shape", "data_offsets": [begin, end]}`` relative to the data section.

Every file of a checkpoint (``latest``, ``manifest.json``, the shards, a DCP ``.metadata``) is opened
through `open_regular`, the one reader: a symbolic link (to ``/dev/zero``, say), a FIFO or a device is
refused before a byte is read, and opening never waits (a FIFO with no writer would block ``open`` forever).
"""
from __future__ import annotations

import errno
import hashlib
import itertools
import json
import math
import os
import re
import stat
import struct
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
CODES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 64 << 20
"""A header larger than this is refused before it is read (a hostile length field cannot exhaust memory)."""
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: missing, corrupted, tampered with, or made for another model."""


def plain_name(name: object, where: str) -> str:
    """``name`` if it is a plain file name (no separator, no '..', no absolute path), else a one-line refusal."""
    if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name) or ".." in name:
        raise CheckpointError(f"{where}: {name!r} is not a plain file name inside the checkpoint directory")
    return name


# --8<-- [start:open_regular]
def open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, refused in one line unless it is a regular file.

    ``O_NOFOLLOW``: a symbolic link is refused, not followed. ``O_NONBLOCK``: opening a FIFO returns at
    once instead of waiting for a writer; ``fstat`` on the descriptor (not the name, which could be
    swapped in between) then says what was opened. The descriptor is put back in blocking mode.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointError(f"{path}: is a symbolic link; a checkpoint file must be a regular file "
                                  "(copy the file itself into the directory)") from None
        raise CheckpointError(f"{path}: cannot be opened ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "special")
        raise CheckpointError(f"{path}: is {kind}, not a regular file; replace it with the file the checkpoint "
                              "wrote")
    os.set_blocking(fd, True)
    return fd


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The whole of regular file ``path``, refused if it holds more than ``limit`` bytes (checked before
    reading, and again while reading: a file that grows is cut off at ``limit + 1`` bytes)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        chunks, got = [], 0
        while size <= limit and got <= limit:
            chunk = os.read(fd, limit + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        size = max(size, got)
        if size > limit:
            raise CheckpointError(f"{path}: {size} bytes is larger than any {what} ({limit} bytes)")
        return b"".join(chunks)
    finally:
        os.close(fd)
# --8<-- [end:open_regular]


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raw(t: torch.Tensor) -> memoryview:
    """The bytes of a tensor without a copy when it is contiguous and on the CPU (any dtype, bf16 included)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


# --8<-- [start:stream_write]
def write_safetensors(path: Path, items: list[tuple[str, torch.dtype, tuple[int, ...], object]],
                      metadata: dict[str, str]) -> dict:
    """Write ``(key, dtype, shape, tensor or zero-argument function making it)`` items to ``path`` one at
    a time, hashing as it goes, then fsync; returns ``{"bytes": size, "sha256": hex}`` for the manifest.

    Extra memory: one tensor at a time (none for CPU tensors passed as they are: their bytes are written
    from where they live).
    """
    header, offset = {"__metadata__": metadata}, 0
    for key, dtype, shape, _ in items:
        n = math.prod(shape) * dtype.itemsize
        header[key] = {"dtype": CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)                        # the data section starts 8-byte aligned
    digest, per_item = hashlib.sha256(), []
    with open(path, "wb") as f:
        for chunk in (struct.pack("<Q", len(blob)), blob):
            f.write(chunk)
            digest.update(chunk)
        for key, dtype, shape, t in items:
            t = t() if callable(t) else t
            if t.dtype != dtype or tuple(t.shape) != tuple(shape):
                raise ValueError(f"{path}: {key} is {t.dtype}{tuple(t.shape)}, declared {dtype}{tuple(shape)}")
            raw = _raw(t)
            f.write(raw)
            digest.update(raw)
            per_item.append(hashlib.sha256(raw).hexdigest())
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": 8 + len(blob) + offset, "sha256": digest.hexdigest(), "items": per_item}
# --8<-- [end:stream_write]


def read_header(path: Path, fd: int | None = None) -> tuple[dict, int]:
    """(header, data start) of a safetensors file, checked: bounded size, known dtypes, offsets inside the file.

    ``fd``: a descriptor of it from `open_regular` (else the file is opened, through it, and closed).
    """
    if fd is None:
        fd = open_regular(path)
        try:
            return read_header(path, fd)
        finally:
            os.close(fd)
    size = os.fstat(fd).st_size
    head = os.pread(fd, 8, 0)
    if len(head) < 8:
        raise CheckpointError(f"{path}: too short to be a safetensors file ({size} bytes)")
    n = struct.unpack("<Q", head)[0]
    if n > min(MAX_HEADER, size - 8):
        raise CheckpointError(f"{path}: header length {n} exceeds the file ({size} bytes) or {MAX_HEADER}")
    try:
        header = json.loads(os.pread(fd, n, 8))
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: header is not JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    data_len, spans = size - 8 - n, []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        ok = (isinstance(info, dict) and info.get("dtype") in DTYPES and isinstance(info.get("shape"), list)
              and all(isinstance(d, int) and d >= 0 for d in info["shape"])
              and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2
              and all(isinstance(o, int) for o in info["data_offsets"]))
        if not ok:
            raise CheckpointError(f"{path}: header entry {key!r} is malformed")
        b, e = info["data_offsets"]
        want = math.prod(info["shape"]) * DTYPES[info["dtype"]].itemsize
        if not 0 <= b <= e <= data_len or e - b != want:
            raise CheckpointError(f"{path}: header entry {key!r}: data_offsets {info['data_offsets']} do not hold "
                                  f"{info['dtype']}{info['shape']} inside the {data_len}-byte data section")
        spans.append((b, e, key))
    spans.sort()
    for (_, e0, k0), (b1, _, k1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CheckpointError(f"{path}: header entries {k0!r} and {k1!r} overlap")
    return header, 8 + n


class Reader:
    """Reads boxes of stored tensors with ``os.pread``; counts the bytes it reads (``bytes_read``).

    ``digests``: ``{(path, key): sha256}``. A box that is a whole stored tensor is checked against its
    digest from the bytes just read (no extra I/O: the common case, resuming on the same layout); a
    part of one makes the reader hash the whole stored tensor once, streaming (``bytes_hashed``).
    """

    def __init__(self, digests: dict | None = None):
        self._open: dict[Path, tuple[int, dict, int]] = {}
        self.digests, self._verified = digests, set()
        self.bytes_read = self.bytes_hashed = 0

    def header(self, path: Path) -> dict:
        return self._file(path)[1]

    def _file(self, path: Path):
        if path not in self._open:
            fd = open_regular(path)
            try:
                header, start = read_header(path, fd)
            except BaseException:
                os.close(fd)
                raise
            self._open[path] = (fd, header, start)
        return self._open[path]

    def read_box(self, path: Path, key: str, offsets: tuple[int, ...], lengths: tuple[int, ...],
                 into: torch.Tensor | None = None) -> torch.Tensor:
        """Elements ``[offsets, offsets + lengths)`` of stored tensor ``key``, as a tensor of that shape.

        Reads one contiguous run per row of the box's leading dimensions (the trailing dimensions the box
        covers whole merge into one run), straight into ``into`` when that is a contiguous CPU tensor of
        the right shape and dtype (no read buffer), else into a new tensor.
        """
        fd, header, start = self._file(path)
        info = header[key]
        shape, dtype = info["shape"], DTYPES[info["dtype"]]
        whole = list(lengths) == shape
        if self.digests is not None and not whole:
            self.verify(path, key)
        direct = (into is not None and into.is_contiguous() and into.device.type == "cpu" and into.dtype == dtype
                  and tuple(into.shape) == tuple(lengths))
        out = into if direct else torch.empty(lengths, dtype=dtype)
        buf = _raw(out) if out.numel() else None
        if buf is None:
            return out
        k = len(shape)                                     # dims [k, n) are covered whole
        while k > 0 and offsets[k - 1] == 0 and lengths[k - 1] == shape[k - 1]:
            k -= 1
        if k == 0:
            runs, run = [()], math.prod(shape)
        else:
            run = lengths[k - 1] * math.prod(shape[k:])
            runs = itertools.product(*(range(o, o + n) for o, n in zip(offsets[:k - 1], lengths[:k - 1])))
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        item, base, pos = dtype.itemsize, start + info["data_offsets"][0], 0
        for idx in runs:
            first = sum(i * s for i, s in zip(idx, strides))
            if k:
                first += offsets[k - 1] * strides[k - 1]
            n = run * item
            got = os.preadv(fd, [buf[pos:pos + n]], base + first * item)
            if got != n:
                raise CheckpointError(f"{path}: short read of {key!r} ({got} of {n} bytes): the file is truncated")
            pos += n
        self.bytes_read += pos
        if self.digests is not None and whole and (path, key) not in self._verified:
            self._check(path, key, hashlib.sha256(buf).hexdigest())
        return out

    def _check(self, path: Path, key: str, digest: str) -> None:
        want = self.digests.get((path, key))
        if digest != want:
            raise CheckpointError(f"{path}: {key!r} checksum mismatch (sha256 {digest[:12]}… != manifest.json "
                                  f"{str(want)[:12]}…): the file is corrupted or was modified")
        self._verified.add((path, key))

    def verify(self, path: Path, key: str) -> None:
        """Hash stored tensor ``key`` whole, 1 MiB at a time, once; refuse it unless it matches its digest."""
        if (path, key) in self._verified:
            return
        fd, header, start = self._file(path)
        b, e = header[key]["data_offsets"]
        h, pos = hashlib.sha256(), start + b
        while pos < start + e:
            block = os.pread(fd, min(1 << 20, start + e - pos), pos)
            if not block:
                raise CheckpointError(f"{path}: short read of {key!r}: the file is truncated")
            h.update(block)
            pos += len(block)
        self.bytes_hashed += e - b
        self._check(path, key, h.hexdigest())

    def close(self) -> None:
        for fd, _, _ in self._open.values():
            os.close(fd)
        self._open.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

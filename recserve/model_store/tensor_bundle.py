"""A TensorFlow tensor bundle (`<prefix>.index` + `<prefix>.data-0000K-of-0000M`), read
without TensorFlow (DESIGN §4b).

The .index file is a LevelDB-format table (TensorFlow writes it uncompressed): data blocks
of prefix-compressed keys, an index block pointing at them, and a 48-byte footer pointing
at the index block. Its keys are tensor names, its values `BundleEntryProto`s (dtype, shape,
shard, offset, size, masked crc32c); the empty key holds the `BundleHeaderProto`. A
tensor's bytes are read from a memory mapping of its data shard: numeric tensors come back
as read-only views of the mapping (no copy: a table's rows are copied once, into the
engine), after their crc32c is checked.

A partitioned variable (`tf.compat.v1.train.Saver` with save_slice_info) is one *sliced*
tensor: its entry lists the slices (TensorSliceProto) and each slice has an entry of its
own under the binary key TensorFlow's `EncodeTensorNameSlice` makes (OrderedCode: 0, the
name, the rank, then start and length of each dimension, -1 meaning all of it). Reading
one assembles its slices into a new array.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

import google_crc32c
import numpy as np

from recserve.errors import CorruptVersionError
from recserve.proto import tensor_bundle_pb2 as pb

__all__ = ["BundleEntry", "TensorBundle", "masked_crc32c"]

_MAGIC = 0xDB4775248B80FB57
_FOOTER = 48
_BLOCK_TRAILER = 5  # compression type byte + masked crc32c of the block and that byte
# tensorflow.DataType -> numpy dtype; 7 (string) is read separately.
_DTYPES = {1: np.dtype("<f4"), 3: np.dtype("<i4"), 9: np.dtype("<i8"), 10: np.dtype("bool"), 19: np.dtype("<f2")}
_STRING = 7
_DTYPE_NAMES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
                8: "complex64", 9: "int64", 10: "bool", 14: "bfloat16", 17: "uint16", 19: "float16",
                20: "resource", 21: "variant", 22: "uint32", 23: "uint64"}


_CRC_CHUNK = 1 << 20


def masked_crc32c(data: bytes | memoryview) -> int:
    """LevelDB's and TensorFlow's masked crc32c. A mapping is checked a chunk at a time (the
    C library takes bytes only): a 1 MiB chunk's copy, never the tensor's."""
    if isinstance(data, bytes):
        crc = google_crc32c.value(data)
    else:
        crc = 0
        for start in range(0, len(data), _CRC_CHUNK):
            crc = google_crc32c.extend(crc, bytes(data[start:start + _CRC_CHUNK]))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(buf: bytes | memoryview, pos: int, where: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise CorruptVersionError(f"{where}: truncated or malformed varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


@dataclass(frozen=True)
class BundleEntry:
    name: str
    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int
    # (start, length) per dimension of each slice, length -1 meaning the whole dimension.
    slices: tuple[tuple[tuple[int, int], ...], ...] = ()

    @property
    def sliced(self) -> bool:
        return bool(self.slices)

    @property
    def dtype_name(self) -> str:
        return _DTYPE_NAMES.get(self.dtype, f"DataType {self.dtype}")


class TensorBundle:
    """One bundle, opened. Not thread-safe (mappings are opened on first use); close() frees
    the mappings once the arrays read from them are no longer used."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        index = f"{prefix}.index"
        try:
            with open(index, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise CorruptVersionError(f"{index}: cannot read the bundle index ({exc.strerror})") from exc
        header, self.entries, self._slice_entries = _read_index(data, index)
        self.num_shards = header.num_shards
        if header.endianness != pb.BundleHeaderProto.LITTLE:
            raise CorruptVersionError(f"{index}: a big-endian bundle; only little-endian ones are read")
        self._maps: dict[int, mmap.mmap] = {}

    def shard_paths(self) -> list[str]:
        n = self.num_shards
        return [f"{self.prefix}.data-{k:05d}-of-{n:05d}" for k in range(n)]

    def _shard(self, k: int) -> mmap.mmap:
        mapped = self._maps.get(k)
        if mapped is None:
            path = self.shard_paths()[k]
            try:
                with open(path, "rb") as f:
                    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else None
            except OSError as exc:
                raise CorruptVersionError(f"{path}: cannot read the data shard ({exc.strerror})") from exc
            if mapped is None:
                raise CorruptVersionError(f"{path}: the data shard is empty")
            self._maps[k] = mapped
        return mapped

    def _bytes(self, entry: BundleEntry) -> memoryview:
        if not 0 <= entry.shard < self.num_shards:
            raise CorruptVersionError(f"{self.prefix}: tensor {entry.name!r} names shard {entry.shard} "
                                      f"of {self.num_shards}")
        shard = self._shard(entry.shard)
        if entry.offset < 0 or entry.size < 0 or entry.offset + entry.size > len(shard):
            raise CorruptVersionError(
                f"{self.shard_paths()[entry.shard]}: tensor {entry.name!r} lies at bytes "
                f"[{entry.offset}, {entry.offset + entry.size}) but the file has {len(shard)} (truncated?)")
        view = memoryview(shard)[entry.offset:entry.offset + entry.size]
        if entry.dtype != _STRING and masked_crc32c(view) != entry.crc32c:
            raise CorruptVersionError(f"{self.shard_paths()[entry.shard]}: tensor {entry.name!r} fails its "
                                      "crc32c check (corrupt data)")
        return view

    def read(self, name: str) -> np.ndarray:
        """The tensor `name`: numeric ones as a read-only view of the mapped shard, strings as
        an object array of bytes. CorruptVersionError names the tensor on any problem."""
        entry = self.entries.get(name)
        if entry is None:
            raise CorruptVersionError(f"{self.prefix}: no tensor {name!r} in the bundle")
        if entry.sliced:
            return self._assemble(entry)
        return self._read_entry(entry)

    def _assemble(self, entry: BundleEntry) -> np.ndarray:
        """A sliced tensor: every slice read and written into its place in a new array."""
        dtype = _DTYPES.get(entry.dtype)
        if dtype is None:
            raise CorruptVersionError(f"{self.prefix}: sliced tensor {entry.name!r} has dtype {entry.dtype_name}; "
                                      "recserve assembles numeric slices only")
        out = np.zeros(entry.shape, dtype=dtype)
        covered = 0
        for extents in entry.slices:
            key = slice_key(entry.name, extents)
            part = self._slice_entries.get(key)
            if part is None:
                raise CorruptVersionError(f"{self.prefix}: tensor {entry.name!r} lists slice {list(extents)} "
                                          "but the bundle has no entry for it")
            region = tuple(slice(None) if length < 0 else slice(start, start + length) for start, length in extents)
            shape = out[region].shape
            piece = BundleEntry(f"{entry.name} slice {list(extents)}", part.dtype, shape, part.shard, part.offset,
                                part.size, part.crc32c)
            out[region] = self._read_entry(piece)
            covered += int(np.prod(shape, dtype=np.int64))
        if covered != out.size:
            raise CorruptVersionError(f"{self.prefix}: the slices of tensor {entry.name!r} cover {covered} of its "
                                      f"{out.size} values")
        return out

    def _read_entry(self, entry: BundleEntry) -> np.ndarray:
        name = entry.name
        view = self._bytes(entry)
        count = int(np.prod(entry.shape, dtype=np.int64)) if entry.shape else 1
        if entry.dtype == _STRING:
            return _strings(view, count, entry, self.prefix).reshape(entry.shape)
        dtype = _DTYPES.get(entry.dtype)
        if dtype is None:
            raise CorruptVersionError(
                f"{self.prefix}: tensor {name!r} has dtype {entry.dtype_name}; recserve reads float32, "
                "float16, int32, int64, bool and string tensors")
        if count * dtype.itemsize != entry.size:
            raise CorruptVersionError(f"{self.prefix}: tensor {name!r} of shape {list(entry.shape)} needs "
                                      f"{count * dtype.itemsize} bytes; its entry says {entry.size}")
        return np.frombuffer(view, dtype=dtype, count=count).reshape(entry.shape)

    def close(self) -> None:
        maps, self._maps = self._maps, {}
        for mapped in maps.values():
            try:
                mapped.close()
            except BufferError:
                pass  # arrays still view it: it closes when they go


def _strings(view: memoryview, count: int, entry: BundleEntry, where: str) -> np.ndarray:
    """A string tensor: [varint64 length] x count, the masked crc32c of the lengths, then the
    bytes; the entry's crc32c covers the lengths (as little-endian integers, not varints),
    the 4-byte checksum and the bytes (TensorFlow's WriteStringTensor)."""
    lengths = []
    pos = 0
    for _ in range(count):
        length, pos = _varint(view, pos, f"{where}: tensor {entry.name!r}")
        lengths.append(length)
    if pos + 4 + sum(lengths) != len(view):
        raise CorruptVersionError(f"{where}: tensor {entry.name!r}: its strings do not fill its bytes exactly")
    # Lengths below 2**32 are summed as uint32 (what older TensorFlow wrote), larger as uint64.
    crc = google_crc32c.extend(0, b"".join(struct.pack("<I" if n <= 0xFFFFFFFF else "<Q", n) for n in lengths))
    pos_lengths_end = pos
    crc = google_crc32c.extend(crc, bytes(view[pos:pos + 4]))
    pos += 4
    out = np.empty(count, dtype=object)
    for i, length in enumerate(lengths):
        out[i] = bytes(view[pos:pos + length])
        crc = google_crc32c.extend(crc, out[i])
        pos += length
    if (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF != entry.crc32c and not _wide_lengths_match(
            lengths, view, pos_lengths_end, entry):
        raise CorruptVersionError(f"{where}: tensor {entry.name!r} fails its crc32c check (corrupt data)")
    return out


def _wide_lengths_match(lengths: list[int], view: memoryview, lengths_end: int, entry: BundleEntry) -> bool:
    """The checksum with every length as uint64, as a writer that never narrows them sums it."""
    crc = google_crc32c.extend(0, struct.pack(f"<{len(lengths)}Q", *lengths))
    crc = google_crc32c.extend(crc, bytes(view[lengths_end:]))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF == entry.crc32c


def _block(data: bytes, offset: int, size: int, where: str) -> bytes:
    end = offset + size
    if offset < 0 or end + _BLOCK_TRAILER > len(data):
        raise CorruptVersionError(f"{where}: a block lies beyond the end of the file (truncated?)")
    compression = data[end]
    if compression != 0:
        raise CorruptVersionError(f"{where}: a compressed block (type {compression}); TensorFlow writes "
                                  "bundle indexes uncompressed")
    (stored,) = struct.unpack_from("<I", data, end + 1)
    if masked_crc32c(data[offset:end + 1]) != stored:
        raise CorruptVersionError(f"{where}: a block fails its crc32c check (corrupt index)")
    return data[offset:end]


def _entries(block: bytes, where: str) -> list[tuple[bytes, bytes]]:
    """The (key, value) pairs of a block, in order (prefix-compressed keys)."""
    if len(block) < 4:
        raise CorruptVersionError(f"{where}: a block is too short")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    limit = len(block) - 4 - 4 * restarts
    if restarts == 0 or limit < 0:
        raise CorruptVersionError(f"{where}: a block has a bad restart array")
    out: list[tuple[bytes, bytes]] = []
    key = b""
    pos = 0
    while pos < limit:
        shared, pos = _varint(block, pos, where)
        unshared, pos = _varint(block, pos, where)
        length, pos = _varint(block, pos, where)
        if shared > len(key) or pos + unshared + length > limit:
            raise CorruptVersionError(f"{where}: a block entry runs past its block")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        out.append((key, block[pos:pos + length]))
        pos += length
    return out


def _handle(value: bytes, pos: int, where: str) -> tuple[int, int, int]:
    offset, pos = _varint(value, pos, where)
    size, pos = _varint(value, pos, where)
    return offset, size, pos


def _ordered_unsigned(value: int) -> bytes:
    """OrderedCode's WriteNumIncreasing: the byte count, then the big-endian bytes."""
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big") if value else b""
    return bytes([len(raw)]) + raw


def _ordered_signed(value: int) -> bytes:
    """OrderedCode's WriteSignedNumIncreasing: `length` bytes of the sign-extended value
    whose first bits (ones for >= 0, zeros below) say the length."""
    x = ~value if value < 0 else value
    length = (x.bit_length() + 7) // 7 if x >= 64 else 1
    if length > 8:
        raise CorruptVersionError(f"slice bound {value} is out of the range recserve encodes")
    raw = bytearray((value & ((1 << (8 * length)) - 1)).to_bytes(length, "big"))
    raw[0] ^= (0xFF00 >> length) & 0xFF if length < 8 else 0xFF
    return bytes(raw)


def slice_key(name: str, extents: tuple[tuple[int, int], ...]) -> bytes:
    """TensorFlow's EncodeTensorNameSlice: the index key of one slice of tensor `name`."""
    escaped = b"".join(b"\x00\xff" if b == 0 else b"\xff\x00" if b == 0xFF else bytes([b]) for b in name.encode())
    key = _ordered_unsigned(0) + escaped + b"\x00\x01" + _ordered_unsigned(len(extents))
    for start, length in extents:
        key += _ordered_signed(start) + _ordered_signed(length)
    return key


def _read_index(data: bytes, where: str) -> tuple[pb.BundleHeaderProto, dict[str, BundleEntry],
                                                  dict[bytes, BundleEntry]]:
    if len(data) < _FOOTER:
        raise CorruptVersionError(f"{where}: {len(data)} bytes, too short for a bundle index")
    footer = data[-_FOOTER:]
    (magic,) = struct.unpack_from("<Q", footer, _FOOTER - 8)
    if magic != _MAGIC:
        raise CorruptVersionError(f"{where}: not a TensorFlow bundle index (bad magic number)")
    _, _, pos = _handle(footer, 0, where)  # the metaindex block: empty in bundles
    index_offset, index_size, _ = _handle(footer, pos, where)
    header: pb.BundleHeaderProto | None = None
    entries: dict[str, BundleEntry] = {}
    slices: dict[bytes, BundleEntry] = {}
    for _, handle in _entries(_block(data, index_offset, index_size, where), where):
        offset, size, _ = _handle(handle, 0, where)
        for key, value in _entries(_block(data, offset, size, where), where):
            try:
                if key.startswith(b"\x00"):  # a slice's own entry (binary key)
                    proto = pb.BundleEntryProto.FromString(value)
                    slices[key] = BundleEntry("", proto.dtype, (), proto.shard_id, proto.offset, proto.size,
                                              proto.crc32c)
                    continue
                if key == b"":
                    header = pb.BundleHeaderProto.FromString(value)
                    continue
                proto = pb.BundleEntryProto.FromString(value)
                name = key.decode()
            except Exception as exc:
                raise CorruptVersionError(f"{where}: an unreadable entry ({type(exc).__name__})") from exc
            entries[name] = BundleEntry(name, proto.dtype, tuple(d.size for d in proto.shape.dim), proto.shard_id,
                                        proto.offset, proto.size, proto.crc32c, _extents(proto))
    if header is None:
        raise CorruptVersionError(f"{where}: the bundle header (empty key) is missing")
    return header, entries, slices


def _extents(proto: pb.BundleEntryProto) -> tuple[tuple[tuple[int, int], ...], ...]:
    return tuple(tuple((e.start, e.length if e.HasField("length") else -1) for e in s.extent) for s in proto.slices)

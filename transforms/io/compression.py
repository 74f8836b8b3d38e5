"""Opening an input file by its name: the compression suffixes, the decompressors, and the
format an extension implies (looking through a compression suffix).

All file access goes through Beam's ``FileSystems``, so ``gs://`` paths work like local ones.
Decompression is done here rather than by Beam's ``CompressedFile`` because that class (like
zstandard's ``stream_reader``) ends quietly at the end of a truncated stream, which would drop the
rest of the file without a trace; the readers report it as ``unreadable_file``.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import posixpath
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

import pyarrow as pa
import zstandard
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.core.vocabulary import FILE_FORMATS

FORMAT_BY_EXTENSION = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".csv": "csv",
    ".tsv": "csv",
}
BLOCK = 1 << 20  # bytes read from a stream at a time


class _ZstdReader(io.RawIOBase):
    """Decompress concatenated zstd frames, raising EOFError when the input stops inside one."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        # Windows up to 2 GiB, as Beam allows, so that archives made with `zstd --long` open.
        self._dctx = zstandard.ZstdDecompressor(max_window_size=1 << 31)
        self._frame: zstandard.ZstdDecompressionObj | None = None
        self._tail = b""  # input that follows a finished frame
        self._pending = memoryview(b"")  # decompressed output not yet handed out

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:
        while not self._pending:
            data, self._tail = self._tail or self._raw.read(BLOCK // 4), b""
            if not data:
                if self._frame is not None and not self._frame.eof:
                    raise EOFError("zstd stream ended inside a frame (truncated file)")
                return 0
            if self._frame is None or self._frame.eof:
                self._frame = self._dctx.decompressobj()
            self._pending = memoryview(self._frame.decompress(data))
            if self._frame.eof:
                self._tail = self._frame.unused_data
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def _zstd_stream(raw: BinaryIO) -> BinaryIO:
    return io.BufferedReader(_ZstdReader(raw), buffer_size=BLOCK)


# Each opener wraps a raw FileSystems stream and raises on truncated or corrupt input.
_DECOMPRESSORS: dict[str, Callable[[BinaryIO], BinaryIO]] = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    ".zst": _zstd_stream,
    ".zstd": _zstd_stream,
    ".bz2": bz2.BZ2File,
    ".xz": lzma.LZMAFile,
}

# What a broken or vanished file raises while it is read; anything else is a bug and propagates.
READ_ERRORS = (
    OSError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    zstandard.ZstdError,
    pa.ArrowException,
)


def compression_suffix(path: str) -> str | None:
    lower = path.lower()
    return next((suffix for suffix in _DECOMPRESSORS if lower.endswith(suffix)), None)


def uncompressed_name(path: str) -> str:
    """The lower-cased path without its compression suffix, for telling formats apart."""
    lower = path.lower()
    suffix = compression_suffix(lower)
    return lower[: -len(suffix)] if suffix else lower


@contextlib.contextmanager
def open_input(path: str) -> Iterator[BinaryIO]:
    """Open ``path`` for reading, decompressing by its suffix."""
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(
            FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
        )
        suffix = compression_suffix(path)
        yield raw if suffix is None else stack.enter_context(_DECOMPRESSORS[suffix](raw))


def file_format(path: str) -> str:
    """The format implied by the file extension, looking through a compression suffix."""
    fmt = FORMAT_BY_EXTENSION.get(posixpath.splitext(uncompressed_name(path))[1])
    if fmt is None:
        raise ValueError(
            f"cannot tell the format of {path!r} from its extension; declare it on the input, "
            f"e.g. PATTERN#format=jsonl (one of {', '.join(FILE_FORMATS)})"
        )
    return fmt

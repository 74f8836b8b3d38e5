"""The local runner's shuffle on disk, so a simulation can shuffle more than the machine's memory.

The FnApiRunner keeps every PCollection that crosses a stage boundary in its own memory: a
``GroupingBuffer`` per shuffle (decoded values, in a dict by key) and a ``ListBuffer`` per
materialized PCollection. That is the runner standing in for Dataflow's shuffle service, not
the workers being measured, but at 10^7 documents it is about 34 GB, more than this machine
has. ``spill_shuffles`` makes the runner create buffers that keep their bytes in temporary
files instead; a shuffle is grouped one hash partition at a time (at most ``PARTITION_BYTES``
of encoded input), with Beam's own ``GroupingBuffer`` doing the grouping, so keys and windows
are grouped exactly as before. Only the order in which keys reach the worker changes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zlib
from collections.abc import Iterator

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.runners.portability.fn_api_runner import execution

PARTITION_BYTES = 64 << 20
FLUSH_BYTES = 1 << 20


class SpilledListBuffer(execution.ListBuffer):
    """A ``ListBuffer`` whose encoded blobs are segments of append-only temporary files.

    A copy shares the segments (the files only grow, so a segment never changes); a file is
    deleted once no buffer refers to it."""

    def __init__(self, coder_impl, directory: str | None = None) -> None:
        # The base keeps blobs in ``_inputs``; every method that touches it is replaced here.
        self._coder_impl = coder_impl
        self._directory = directory
        self._file = None
        self._segments: list[tuple[object, int, int]] = []
        self._grouped_output = None
        self.cleared = False

    @property
    def _inputs(self) -> list[bytes]:
        """What an in-memory ``ListBuffer.extend`` reads from its argument (a rare path)."""
        return list(self)

    @property
    def size(self) -> int:
        return sum(length for _, _, length in self._segments)

    def copy(self) -> SpilledListBuffer:
        new = SpilledListBuffer(self._coder_impl, self._directory)
        new._segments = list(self._segments)
        return new

    def append(self, element: bytes) -> None:
        if self.cleared:
            raise RuntimeError("Trying to append to a cleared ListBuffer.")
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self._directory)  # noqa: SIM115 (lives with its segments)
        offset = self._file.seek(0, os.SEEK_END)
        self._file.write(element)
        self._file.flush()
        self._segments.append((self._file, offset, len(element)))

    def extend(self, extra: execution.ListBuffer) -> None:
        if self.cleared:
            raise RuntimeError("Trying to append to a cleared ListBuffer.")
        if isinstance(extra, SpilledListBuffer):
            self._segments.extend(extra._segments)
        else:
            for element in extra:
                self.append(element)

    def partition(self, n: int) -> list[list[bytes]]:
        """Only the parallel bundle manager partitions; it gets the blobs in memory."""
        blobs = list(self)
        return [blobs[k::n] for k in range(n)]

    def __iter__(self) -> Iterator[bytes]:
        if self.cleared:
            raise RuntimeError("Trying to iterate through a cleared ListBuffer.")
        for file, offset, length in list(self._segments):
            yield os.pread(file.fileno(), length, offset)

    def clear(self) -> None:
        self.cleared = True
        self._segments = []
        self._file = None


class SpilledGroupingBuffer(execution.GroupingBuffer):
    """A ``GroupingBuffer`` that writes what it is sent to disk and groups it, when first read,
    one hash partition of keys at a time."""

    def __init__(self, pre_grouped_coder, post_grouped_coder, windowing,
                 directory: str | None = None) -> None:
        super().__init__(pre_grouped_coder, post_grouped_coder, windowing)
        self._directory = directory
        self._received = SpilledListBuffer(None, directory)
        self._grouped: SpilledListBuffer | None = None

    def append(self, elements_data: bytes) -> None:
        if self._grouped is not None:
            raise RuntimeError("Grouping table append after read.")
        self._received.append(elements_data)

    def extend(self, input_buffer) -> None:
        if isinstance(input_buffer, execution.ListBuffer):  # as the base class: nothing to add
            return
        assert isinstance(input_buffer, SpilledGroupingBuffer), input_buffer
        self._received.extend(input_buffer._received)

    def partition(self, n: int) -> list[list[bytes]]:
        blobs = list(self)
        return [blobs[k::n] for k in range(n)]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._group())

    def _group(self) -> SpilledListBuffer:
        if self._grouped is None:
            parts = self._hash_partitions()
            self._received = SpilledListBuffer(None, self._directory)  # its files go now
            grouped = SpilledListBuffer(None, self._directory)
            while parts:  # a partition's file goes once it is grouped: disk holds about 2x
                table = execution.GroupingBuffer(self._pre_grouped_coder,
                                                 self._post_grouped_coder, self._windowing)
                for blob in parts.pop():
                    table.append(blob)
                for blob in table.partition(1)[0]:
                    grouped.append(blob)
            self._grouped = grouped
        return self._grouped

    def _hash_partitions(self) -> list[SpilledListBuffer]:
        """The received elements re-cut into partitions by a hash of the encoded key."""
        count = max(1, -(-self._received.size // PARTITION_BYTES))
        parts = [SpilledListBuffer(None, self._directory) for _ in range(count)]
        if count == 1:
            parts[0].extend(self._received)
            return parts
        streams = [create_OutputStream() for _ in range(count)]
        coder = self._pre_grouped_coder.get_impl()
        key_coder = self._key_coder.get_impl()
        for blob in self._received:
            stream = create_InputStream(blob)
            while stream.size() > 0:
                element = coder.decode_from_stream(stream, True)
                index = zlib.crc32(key_coder.encode(element.value[0])) % count
                coder.encode_to_stream(element, streams[index], True)
                if streams[index].size() >= FLUSH_BYTES:
                    parts[index].append(streams[index].get())
                    streams[index] = create_OutputStream()
        for part, stream in zip(parts, streams, strict=True):
            if stream.size():
                part.append(stream.get())
        return parts


@contextlib.contextmanager
def spill_shuffles(directory: str | None = None) -> Iterator[None]:
    """While open, the runner's shuffles and materialized PCollections are kept on disk
    (side inputs and timers stay in memory: the simulated steps have neither)."""
    original = execution.BundleContextManager.get_buffer

    def get_buffer(self, buffer_id: bytes, transform_id: str):
        buffers = self.execution_context.pcoll_buffers
        kind, _ = execution.split_buffer_id(buffer_id)
        if kind in ("materialize", "group") and buffer_id not in buffers:
            made = original(self, buffer_id, transform_id)
            buffers[buffer_id] = (
                SpilledListBuffer(made._coder_impl, directory) if kind == "materialize" else
                SpilledGroupingBuffer(made._pre_grouped_coder, made._post_grouped_coder,
                                      made._windowing, directory))
        return buffers[buffer_id] if kind in ("materialize", "group") else original(
            self, buffer_id, transform_id)

    execution.BundleContextManager.get_buffer = get_buffer
    try:
        yield
    finally:
        execution.BundleContextManager.get_buffer = original

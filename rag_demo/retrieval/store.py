"""A knowledge base's rows kept on disk: vectors and passages read as they are needed.

Three forms of (N, D) passage vectors reach the search code:
- an in-memory float32 `np.ndarray` (the default KBs, a visitor's own text);
- a read-only `np.memmap` of a float16 or float32 .npy (`np.load(path, mmap_mode="r")`), the
  form large KBs are saved in;
- `BlockRows`: the record batches of a `datasets` Arrow column (transformers' KB format), read in
  place from the memory-mapped Arrow file, never joined into one array.

`row_chunks` walks any of them in bounded blocks; `gather_rows` reads a few rows by id.
`ColumnRows` is a title or text column read row by row from the Arrow table.
"""

from __future__ import annotations

import bisect
import functools
import json
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHUNK_ROWS = 1 << 15  # rows per block: 48 MB of float32 at D=384, small next to a model, large enough for BLAS


@dataclass(frozen=True)
class BlockRows:
    """(N, D) rows stored as consecutive blocks, e.g. an Arrow column's record batches.

    >>> rows = BlockRows((np.zeros((2, 3)), np.ones((1, 3))))
    >>> rows.shape, rows[[2, 0]].tolist()
    ((3, 3), [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    """

    blocks: tuple[np.ndarray, ...]  # each (n_i, D)

    def __post_init__(self):
        if not self.blocks or any(b.ndim != 2 or b.shape[1] != self.blocks[0].shape[1] for b in self.blocks):
            raise ValueError("BlockRows needs at least one block, all (n_i, D) with the same D")

    @functools.cached_property
    def starts(self) -> tuple[int, ...]:
        """Row id of each block's first row, then N."""
        return tuple(np.cumsum([0] + [len(b) for b in self.blocks]).tolist())

    @property
    def shape(self) -> tuple[int, int]:
        return (self.starts[-1], int(self.blocks[0].shape[1]))

    @property
    def dtype(self) -> np.dtype:
        return self.blocks[0].dtype

    @property
    def ndim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        """Rows by id (an int, a slice, or a sequence / array of ints) as a new array."""
        if isinstance(rows, slice):
            rows = range(*rows.indices(len(self)))
        if isinstance(rows, (int, np.integer)):
            return self[[int(rows)]][0]
        ids = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < -len(self) or ids.max() >= len(self)):
            raise IndexError(f"row ids must lie in [0, {len(self)})")
        ids = np.where(ids < 0, ids + len(self), ids)
        starts = np.asarray(self.starts)
        block_of = np.searchsorted(starts, ids, side="right") - 1  # (M,)
        out = np.empty((len(ids), self.shape[1]), dtype=self.dtype)
        for b in np.unique(block_of):
            where = block_of == b
            out[where] = self.blocks[b][ids[where] - starts[b]]
        return out


def arrow_rows(column) -> BlockRows:
    """The (N, D) rows of a `datasets` list column (a pyarrow ChunkedArray of lists), without copying.

    Raises ValueError when the lists are not all of one length or hold nulls.
    """
    import pyarrow.compute as pc

    blocks = []
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        if chunk.null_count or chunk.flatten().null_count:
            raise ValueError("the embeddings column holds empty (null) vectors")
        low, high = (v.as_py() for v in pc.min_max(pc.list_value_length(chunk)).values())
        if low != high or (blocks and high != blocks[0].shape[1]):
            raise ValueError("the embeddings do not all have the same length")
        values = chunk.flatten().to_numpy(zero_copy_only=True)  # a read-only view of the mapped file
        blocks.append(values.reshape(len(chunk), high))
    if not blocks:
        raise ValueError("the embeddings column is empty")
    return BlockRows(tuple(blocks))


class ColumnRows(Sequence):
    """One string column of an Arrow table as a read-only sequence; a row is decoded when asked for.

    A million passages as Python strings take about a gigabyte; read this way they stay in the
    memory-mapped Arrow file and an ask decodes only the k it shows.
    """

    def __init__(self, column):
        self._chunks = [c for c in column.chunks if len(c)]
        self._starts = np.cumsum([0] + [len(c) for c in self._chunks]).tolist()

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        row = int(row)
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} is outside [0, {len(self)})")
        block = bisect.bisect_right(self._starts, row) - 1
        value = self._chunks[block][row - self._starts[block]].as_py()
        return "" if value is None else str(value)

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks:  # a whole record batch at a time: far faster than row by row
            yield from ("" if v is None else str(v) for v in chunk.to_pylist())


def scratch(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialized array in its own anonymous mapping, unmapped when the last view of it goes.

    A scan needs tens of MB of buffer per question. Allocated with malloc, glibc keeps such blocks
    in its heap once freed, and with small results still alive between them the heap only grows
    (measured: +300 MB resident after 100 questions over a 10k-row KB). A mapping of its own goes
    straight back to the kernel.
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    return np.frombuffer(mmap.mmap(-1, max(1, count * dtype.itemsize)), dtype=dtype, count=count).reshape(shape)


class Workspace:
    """Scratch arrays that one thread reuses from scan to scan, each in its own mapping (`scratch`).

    Fresh buffers for every question cost page faults (about 10 ms a question on a 10k-row KB, more
    than the scan itself); malloc'd ones bloat glibc's heap. Keep one Workspace per thread.
    """

    def __init__(self):
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, int], dtype) -> np.ndarray:
        """The first shape[0] rows of the array called `name`, made (again) when it is too small."""
        have = self._arrays.get(name)
        if have is None or have.dtype != np.dtype(dtype) or have.shape[1:] != tuple(shape[1:]) or len(have) < shape[0]:
            have = self._arrays[name] = scratch(shape, dtype)
        return have[: shape[0]]


def in_memory(xb) -> bool:
    """Whether xb is an ordinary float32 array in memory (then searches may use it as it is)."""
    return type(xb) is np.ndarray and xb.dtype == np.float32


def _whole_file_map(xb) -> bool:
    """An np.memmap over its whole file as `np.load(..., mmap_mode="r")` makes it (not a view of one)."""
    return isinstance(xb, np.memmap) and isinstance(xb.base, mmap.mmap) and xb.flags.c_contiguous and bool(xb.filename)


def row_chunks(xb, rows: int = CHUNK_ROWS, *, workspace: Workspace | None = None,
               start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """(start, block) for consecutive blocks of at most `rows` rows of xb (N, D), in xb's dtype,
    from row `start` on (a multiple of `rows` keeps the blocks of a walk from row 0).

    A memmap of a whole .npy is read with plain file reads into one reused buffer, so a scan's
    resident memory is that buffer, not the file: pages read through a mapping stay counted in
    the process until the kernel needs them. A yielded block may be overwritten by the next one;
    use it before asking for the next. Buffers come from `workspace` (a fresh one when None).
    """
    n = len(xb)
    first = start
    if first >= n:
        return
    workspace = workspace if workspace is not None else Workspace()
    if _whole_file_map(xb):
        row_bytes = xb.shape[1] * xb.dtype.itemsize
        buffer = workspace.get("read", (min(rows, n), xb.shape[1]), xb.dtype)
        with Path(xb.filename).open("rb", buffering=0) as handle:
            for start in range(first, n, rows):
                block = buffer[: min(rows, n - start)]
                handle.seek(xb.offset + start * row_bytes)
                view = memoryview(block).cast("B")
                got = 0
                while got < len(view):
                    read = handle.readinto(view[got:])
                    if not read:
                        raise OSError(f"{xb.filename} ended early (truncated after it was opened?)")
                    got += read
                yield start, block
        return
    if isinstance(xb, BlockRows):
        if first:  # the rows from `first` on as blocks of their own: no record batch before it is read
            at = bisect.bisect_right(xb.starts, first) - 1
            xb = BlockRows((xb.blocks[at][first - xb.starts[at] :], *xb.blocks[at + 1 :]))
        for start, block in _block_chunks(xb, rows, workspace):
            yield first + start, block
        return
    for start in range(first, n, rows):
        yield start, xb[start : start + rows]


def _block_chunks(xb: BlockRows, rows: int, workspace: Workspace) -> Iterator[tuple[int, np.ndarray]]:
    """Blocks of `rows` rows (the last may be shorter): runs of small record batches are copied
    together into one reused buffer, whole `rows`-row runs inside a large one are sliced."""
    buffer, filled, buffer_start = None, 0, 0
    for start, block in zip(xb.starts, xb.blocks):
        offset = 0
        while offset < len(block):
            if filled == 0 and len(block) - offset >= rows:
                yield start + offset, block[offset : offset + rows]
                offset += rows
                continue
            if buffer is None:
                buffer = workspace.get("join", (rows, xb.shape[1]), xb.dtype)
            if filled == 0:
                buffer_start = start + offset
            take = min(rows - filled, len(block) - offset)
            buffer[filled : filled + take] = block[offset : offset + take]
            filled, offset = filled + take, offset + take
            if filled == rows:
                yield buffer_start, buffer
                filled = 0
    if filled:
        yield buffer_start, buffer[:filled]


def gather_rows(xb, ids) -> np.ndarray:
    """Rows `ids` of xb as a new float32 array (M, D).

    From a memory-mapped .npy the rows are read with one positioned read each: touching them through
    the mapping would also map the pages around each row (the kernel's fault-around, 64 KB), and
    100 candidates a question over 100 questions then leave most of a 768 MB file counted resident.
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if _whole_file_map(xb) and len(ids) and hasattr(os, "pread"):
        return _read_rows(xb, ids).astype(np.float32)
    return np.asarray(xb[ids], dtype=np.float32).reshape(len(ids), xb.shape[1])


def _read_rows(xb: np.memmap, ids: np.ndarray) -> np.ndarray:
    n, dim = xb.shape
    if ids.min() < -n or ids.max() >= n:
        raise IndexError(f"row ids must lie in [0, {n})")
    ids = np.where(ids < 0, ids + n, ids)
    row_bytes = dim * xb.dtype.itemsize
    out = np.empty((len(ids), dim), dtype=xb.dtype)
    handle = os.open(xb.filename, os.O_RDONLY)
    try:
        for i, row in enumerate(ids.tolist()):
            data = os.pread(handle, row_bytes, xb.offset + row * row_bytes)
            if len(data) != row_bytes:
                raise OSError(f"{xb.filename} ended early (truncated after it was opened?)")
            out[i] = np.frombuffer(data, dtype=xb.dtype)
    finally:
        os.close(handle)
    return out


def abs_mean(xb) -> float | np.floating:
    """Mean absolute value of every entry of xb, read in blocks (no whole-matrix temporary)."""
    if in_memory(xb):
        return np.abs(xb).mean()  # float32, exactly as the measure of in-memory KBs always was
    total = sum(float(np.abs(block, dtype=np.float64).sum()) for _, block in row_chunks(xb))
    return total / max(1, xb.shape[0] * xb.shape[1])


def saved_table(folder: Path):
    """The Arrow table of a folder written by `datasets.Dataset.save_to_disk`, memory-mapped as
    `datasets` maps it, but read with pyarrow alone: importing `datasets` costs about a second of
    every start. None for a folder in a form this does not read (an indices mapping, no state
    file, a file pyarrow refuses), which `datasets.load_from_disk` then reads or explains."""
    try:
        state = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError):
        return None
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not files or state.get("_indices_data_files"):
        return None
    import pyarrow as pa

    tables = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or Path(name).name != name:
            return None
        try:
            tables.append(pa.ipc.open_stream(pa.memory_map(str(folder / name))).read_all())
        except (OSError, pa.ArrowException):
            return None
    try:
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    except pa.ArrowException:
        return None

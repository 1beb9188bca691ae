"""CSV file readers and writers."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.scope import ChunkContext


class CsvItemReader:
    """Reads a CSV file's records as dicts (header row, or ``fieldnames``). Restartable: it saves
    how many records it returned and skips that many when reopened."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fieldnames: Sequence[str] | None = None,
        name: str | None = None,
        encoding: str = "utf-8",
        **csv_options: Any,
    ) -> None:
        self.path = Path(path)
        self.fieldnames = list(fieldnames) if fieldnames else None
        self.name = name or f"csv:{self.path.name}"
        self.encoding = encoding
        self.csv_options = csv_options
        self._file: IO[str] | None = None
        self._reader: csv.DictReader[str] | None = None
        self._count = 0

    @property
    def _state_key(self) -> str:
        return f"{self.name}.read_count"

    def open(self, context: ExecutionContext) -> None:
        self._file = self.path.open(newline="", encoding=self.encoding)
        self._reader = csv.DictReader(self._file, fieldnames=self.fieldnames, **self.csv_options)
        self._count = 0
        for _ in range(int(context.get(self._state_key, 0))):
            if next(self._reader, None) is None:
                break
            self._count += 1

    def read(self) -> dict[str, Any] | None:
        if self._reader is None:
            self.open(ExecutionContext())
        assert self._reader is not None
        row = next(self._reader, None)
        if row is None:
            return None
        self._count += 1
        return dict(row)

    def update(self, context: ExecutionContext) -> None:
        context.put(self._state_key, self._count)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._reader = None


class CsvItemWriter:
    """Writes items (dicts) as CSV rows under a header of ``fieldnames``.

    Restartable: ``update`` flushes and saves the file's size at each commit; a chunk that rolls
    back, or a restart, truncates the file back to the last committed size before writing again.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fieldnames: Sequence[str],
        *,
        header: bool = True,
        name: str | None = None,
        encoding: str = "utf-8",
        **csv_options: Any,
    ) -> None:
        self.path = Path(path)
        self.fieldnames = list(fieldnames)
        self.header = header
        self.name = name or f"csv:{self.path.name}"
        self.encoding = encoding
        self.csv_options = csv_options
        self._file: IO[str] | None = None
        self._committed = 0

    @property
    def _state_key(self) -> str:
        return f"{self.name}.offset"

    def open(self, context: ExecutionContext) -> None:
        saved = context.get(self._state_key)
        if saved is None:
            self._file = self.path.open("w", newline="", encoding=self.encoding)
            if self.header:
                csv.writer(self._file, **self.csv_options).writerow(self.fieldnames)
            self._file.flush()
            self._committed = self._file.tell()
        else:
            self._file = self.path.open("r+", newline="", encoding=self.encoding)
            self._committed = int(saved)
            self._file.truncate(self._committed)
            self._file.seek(self._committed)

    def write(self, items: Sequence[Any], ctx: ChunkContext) -> None:
        if self._file is None:
            self.open(ExecutionContext())
        assert self._file is not None
        self._file.seek(self._committed)
        self._file.truncate(self._committed)
        writer = csv.DictWriter(self._file, fieldnames=self.fieldnames, **self.csv_options)
        for item in items:
            writer.writerow(dict(item))

    def update(self, context: ExecutionContext) -> None:
        if self._file is None:
            return
        self._file.flush()
        self._committed = self._file.tell()
        context.put(self._state_key, self._committed)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None

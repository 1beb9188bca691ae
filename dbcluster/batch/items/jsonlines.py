"""JSON lines files: one JSON value per line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.items.base import refuse_code
from dbcluster.batch.scope import ChunkContext


class JsonLinesItemReader:
    """Reads a JSON-lines file, one item per non-blank line. Restartable: it saves the byte
    offset after the last line it returned and seeks there when reopened."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        loads: Callable[[str], Any] = json.loads,
    ) -> None:
        self.path = Path(path)
        self.name = name or f"jsonl:{self.path.name}"
        self.loads = loads
        self._file: IO[bytes] | None = None
        self._offset = 0

    @property
    def _state_key(self) -> str:
        return f"{self.name}.offset"

    def open(self, context: ExecutionContext) -> None:
        self.close()
        self._file = self.path.open("rb")
        self._offset = int(context.get(self._state_key, 0))
        self._file.seek(self._offset)

    def read(self) -> Any:
        if self._file is None:
            self.open(ExecutionContext())
        assert self._file is not None
        while True:
            line = self._file.readline()
            if not line:
                return None
            self._offset = self._file.tell()
            if line.strip():
                return self.loads(line.decode("utf-8"))

    def update(self, context: ExecutionContext) -> None:
        context.put(self._state_key, self._offset)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None


class JsonLinesItemWriter:
    """Writes each item as one JSON line (``dumps``: default ``json.dumps`` with ``default=str``,
    so dates and decimals become strings).

    Restartable and rollback-safe: each chunk is written from the offset the step context holds
    (the last committed chunk's end, restored with the context when a transaction is repeated),
    cutting off whatever a rolled-back chunk left; ``update`` flushes (and with ``sync``,
    fsyncs) and saves the new end, in the chunk's transaction.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        dumps: Callable[[Any], str] | None = None,
        sync: bool = False,
    ) -> None:
        self.path = Path(path)
        self.name = name or f"jsonl:{self.path.name}"
        self.dumps = dumps or (lambda item: json.dumps(item, default=str, ensure_ascii=False))
        self.sync = sync
        self._file: IO[bytes] | None = None

    @property
    def _state_key(self) -> str:
        return f"{self.name}.offset"

    def open(self, context: ExecutionContext) -> None:
        self.close()
        saved = context.get(self._state_key)
        if saved is None:
            self._file = self.path.open("wb")
        else:
            self._file = self.path.open("r+b")
            self._file.truncate(int(saved))

    def write(self, items: Sequence[Any], ctx: ChunkContext) -> None:
        refuse_code(items, self)
        if self._file is None:
            self.open(ExecutionContext())
        assert self._file is not None
        start = int(ctx.step_context.get(self._state_key, 0))
        self._file.seek(start)
        self._file.truncate(start)
        self._file.write(b"".join((self.dumps(item) + "\n").encode("utf-8") for item in items))

    def update(self, context: ExecutionContext) -> None:
        if self._file is None:
            return
        self._file.flush()
        if self.sync:
            os.fsync(self._file.fileno())
        context.put(self._state_key, self._file.tell())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None

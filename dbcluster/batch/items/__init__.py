"""Item readers and writers for chunk steps."""

from dbcluster.batch.items.base import (
    FunctionItemWriter,
    ItemProcessor,
    ItemReader,
    ItemStream,
    ItemWriter,
    item_writer,
)
from dbcluster.batch.items.csv import CsvItemReader, CsvItemWriter
from dbcluster.batch.items.iterable import IterableItemReader, ListItemWriter
from dbcluster.batch.items.sql import SqlItemWriter, SqlKeyRangeReader

__all__ = [
    "CsvItemReader",
    "CsvItemWriter",
    "FunctionItemWriter",
    "ItemProcessor",
    "ItemReader",
    "ItemStream",
    "ItemWriter",
    "IterableItemReader",
    "ListItemWriter",
    "SqlItemWriter",
    "SqlKeyRangeReader",
    "item_writer",
]

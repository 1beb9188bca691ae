"""Item readers and writers for chunk steps."""

from dbcluster.batch.items.base import (
    FunctionItemWriter,
    ItemProcessor,
    ItemReader,
    ItemStream,
    ItemWriter,
    item_writer,
)
from dbcluster.batch.items.composite import ClassifierItemWriter, CompositeItemWriter
from dbcluster.batch.items.csv import CsvItemReader, CsvItemWriter
from dbcluster.batch.items.iterable import IterableItemReader, ListItemWriter
from dbcluster.batch.items.jsonlines import JsonLinesItemReader, JsonLinesItemWriter
from dbcluster.batch.items.sql import (
    SqlCursorItemReader,
    SqlItemWriter,
    SqlKeyRangeReader,
    SqlPagingItemReader,
)

__all__ = [
    "ClassifierItemWriter",
    "CompositeItemWriter",
    "CsvItemReader",
    "CsvItemWriter",
    "FunctionItemWriter",
    "ItemProcessor",
    "ItemReader",
    "ItemStream",
    "ItemWriter",
    "IterableItemReader",
    "JsonLinesItemReader",
    "JsonLinesItemWriter",
    "ListItemWriter",
    "SqlCursorItemReader",
    "SqlItemWriter",
    "SqlKeyRangeReader",
    "SqlPagingItemReader",
    "item_writer",
]

"""Bulk exports of the collector's tables for researchers: Parquet (``columnar``), the API's
``GET /api/v1/<table>.parquet`` routes and ``iwscope export``."""

from iwscope.exports.columnar import FORMATS, TABLES, ExportFilters, TableSpec, iter_parquet, write_csv, write_parquet

__all__ = ["FORMATS", "TABLES", "ExportFilters", "TableSpec", "iter_parquet", "write_csv", "write_parquet"]

"""Reading raw inputs into documents: JSONL, Parquet and text trees (readers), WARC archives and web pages
(warc, web) and HTML text extraction (extract)."""

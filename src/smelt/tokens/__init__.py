"""Token shards (shards.py: writer, reader) and the training loader (loader.py)."""

"""How training is laid out over processes: the device mesh, DDP/FSDP2, tensor, context and pipeline
parallelism, and the collectives they share."""

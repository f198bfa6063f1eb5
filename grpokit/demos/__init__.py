"""The embedded demos: a tiny model and task built locally (the default), its process-reward and tool-use variants, the R1 pipeline."""

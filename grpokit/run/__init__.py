"""What a run keeps and shows: the run loop every trainer shares, its state on disk, its log and metrics, the output-folder lock, checks before loading, plots."""

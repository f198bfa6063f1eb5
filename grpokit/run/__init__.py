"""What a run keeps and shows: its state on disk, its log and metrics, the output-folder lock, checks before loading, plots."""

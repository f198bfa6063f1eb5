"""What every layer may use: errors, whole-file writes, YAML reading, loading user code, forked workers, the hub probe, notices."""

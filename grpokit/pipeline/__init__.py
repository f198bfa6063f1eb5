"""Multi-stage runs (grpokit pipeline): the pipeline file, running its stages in order, the report after each."""

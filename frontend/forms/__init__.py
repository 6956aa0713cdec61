"""Console forms, one module per page area."""

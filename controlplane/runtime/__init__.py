"""The imperative shell around the pure core: gather -> decide -> commit -> act, logging, metrics."""

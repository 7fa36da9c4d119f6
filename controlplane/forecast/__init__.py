"""Demand forecasts (issue 16): learned online from the replicated demand history, computed outside
the pure core on their own cadence, passed into the scaling decision as values (docs/forecasting.md)."""

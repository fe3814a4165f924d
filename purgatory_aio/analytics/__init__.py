"""Analytics over the operation event log (PySpark)."""

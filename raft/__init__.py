"""Everything that knows pysyncobj exists lives in this package (``lease.py`` is pure and does not)."""

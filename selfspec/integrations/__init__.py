"""Bridges to serving engines other than this package's own (installed as extras)."""

"""Test helpers shared by the store tests and the fetch benchmark (fake GCS, fault proxy, artifacts)."""

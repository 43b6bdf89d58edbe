"""Test-only helpers (browser, builds, canary, guard engine, publisher zygote); what bench/ shares is in aotc/testing/."""

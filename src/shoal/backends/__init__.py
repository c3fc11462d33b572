"""Backends drive the pure policies: `sim` on a virtual clock, `ray` on real processes."""

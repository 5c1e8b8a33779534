"""The distributed runtime: Ray actors around the pure engine, llumlet and LlumSched."""

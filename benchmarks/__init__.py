"""Side-by-side benchmarks against named references; figures in BENCHMARKS.md."""

"""Hand-run benchmarks (never part of the test suite): `python -m bench [name] [args]`.

Each benchmark measures the figures it compares side by side in one run and prints them
as ratios, because the machine it runs on is small and shared, so absolute timings move
from run to run while ratios of interleaved measurements hold.
"""

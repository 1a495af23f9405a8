"""Peer servers the benchmarks compare recserve with, each a script run as its own process."""

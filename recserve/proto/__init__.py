"""Code generated from `proto/*.proto` by `python -m recserve.proto.generate` (`make proto`).

Never edit the generated modules by hand: change the .proto and regenerate; a test fails
when they are out of date.
"""

"""The wire format: DeepRec's PredictRequest/PredictResponse/ServingModelInfo bytes to and
from numpy (native parser first, the generated protobuf code as its spec and fallback).
Every front door and the C ABI share it, so it sits below `processor/`."""

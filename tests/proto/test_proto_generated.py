"""recserve/proto/ is generated from proto/ and committed: it must be in sync, importable,
and keep DeepRec's numbering (existing clients' bytes must parse)."""

from __future__ import annotations

import filecmp
from pathlib import Path

from recserve.proto import generate, predict_pb2


def test_committed_generated_code_is_up_to_date(tmp_path: Path) -> None:
    written = generate.generate(out_dir=tmp_path)
    assert written, "generator wrote nothing"
    committed = sorted(p.name for pattern in generate.GENERATED_GLOBS for p in generate.OUT_DIR.glob(pattern))
    assert committed == sorted(p.name for p in written), "run `make proto`: generated file set differs"
    stale = [p.name for p in written if not filecmp.cmp(p, generate.OUT_DIR / p.name, shallow=False)]
    assert not stale, f"run `make proto`: {stale} differ from what proto/ generates"


def test_generated_imports_are_package_relative(tmp_path: Path) -> None:
    # A second file importing predict.proto must import it through the package.
    (tmp_path / "proto").mkdir()
    (tmp_path / "proto" / "predict.proto").write_text((generate.PROTO_DIR / "predict.proto").read_text())
    (tmp_path / "proto" / "svc.proto").write_text(
        'syntax = "proto3";\npackage tensorflow.eas;\nimport "predict.proto";\n'
        "service Predict { rpc Predict(PredictRequest) returns (PredictResponse); }\n")
    out = tmp_path / "out"
    names = [p.name for p in generate.generate(tmp_path / "proto", out)]
    assert names == ["predict_pb2.py", "predict_pb2.pyi", "svc_pb2.py", "svc_pb2.pyi", "svc_pb2_grpc.py"]
    for name in ("svc_pb2.py", "svc_pb2_grpc.py"):
        text = (out / name).read_text()
        assert "from recserve.proto import predict_pb2 as predict__pb2" in text
        assert "\nimport predict_pb2" not in text


def test_deeprec_numbering() -> None:
    dtypes = {v.name: v.number for v in predict_pb2.ArrayDataType.DESCRIPTOR.values}
    assert dtypes == {
        "DT_INVALID": 0, "DT_FLOAT": 1, "DT_DOUBLE": 2, "DT_INT32": 3, "DT_UINT8": 4,
        "DT_INT16": 5, "DT_INT8": 6, "DT_STRING": 7, "DT_COMPLEX64": 8, "DT_INT64": 9,
        "DT_BOOL": 10, "DT_QINT8": 11, "DT_QUINT8": 12, "DT_QINT32": 13, "DT_BFLOAT16": 14,
        "DT_QINT16": 15, "DT_QUINT16": 16, "DT_UINT16": 17, "DT_COMPLEX128": 18,
        "DT_HALF": 19, "DT_RESOURCE": 20, "DT_VARIANT": 21,
    }

    def fields(message) -> dict[str, tuple[int, int]]:
        return {f.name: (f.number, f.type) for f in message.DESCRIPTOR.fields}

    fd = predict_pb2.ArrayProto.DESCRIPTOR.fields_by_name["dtype"]
    assert predict_pb2.DESCRIPTOR.package == "tensorflow.eas"
    assert fields(predict_pb2.ArrayShape) == {"dim": (1, fd.TYPE_INT64)}
    assert fields(predict_pb2.ArrayProto) == {
        "dtype": (1, fd.TYPE_ENUM), "array_shape": (2, fd.TYPE_MESSAGE),
        "float_val": (3, fd.TYPE_FLOAT), "double_val": (4, fd.TYPE_DOUBLE),
        "int_val": (5, fd.TYPE_INT32), "string_val": (6, fd.TYPE_BYTES),
        "int64_val": (7, fd.TYPE_INT64), "bool_val": (8, fd.TYPE_BOOL),
    }
    assert fields(predict_pb2.PredictRequest) == {
        "signature_name": (1, fd.TYPE_STRING), "inputs": (2, fd.TYPE_MESSAGE),
        "output_filter": (3, fd.TYPE_STRING),
    }
    assert fields(predict_pb2.PredictResponse) == {"outputs": (1, fd.TYPE_MESSAGE)}
    info = fields(predict_pb2.ServingModelInfo)
    assert info["model_path"] == (1, fd.TYPE_STRING)
    assert info == {
        "model_path": (1, fd.TYPE_STRING), "model_version": (2, fd.TYPE_STRING),
        "global_step": (3, fd.TYPE_INT64), "delta_step": (4, fd.TYPE_INT64),
        "update_time": (5, fd.TYPE_INT64), "signature_name": (6, fd.TYPE_STRING),
    }

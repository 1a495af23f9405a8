"""libserving_processor.so served from a C host (not Python, RTLD_LOCAL, no PYTHONPATH):
responses are byte-for-byte `Processor.process`, from 8 threads, over several handles."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from recserve import Processor
from recserve.export import write_checkpoint
from recserve.export.demo import GLOBAL_STEP, demo_dense, demo_tables, write_demo
from recserve.processor.cabi import LIBRARY_NAME, include_dir, library_path
from recserve.proto import predict_pb2

DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "c_abi.md"


def test_library_path_is_the_built_library() -> None:
    path = Path(library_path())
    assert path.is_absolute() and path.name == LIBRARY_NAME and path.is_file()


def test_a_host_linking_the_library_with_the_installed_header(client, demo, processor) -> None:
    """The recipe docs/c_abi.md gives for linking: -I"$(recserve include-path)" and
    -lserving_processor, run as a plain (non-Python) process; its reply is process()'s."""
    cli = Path(sys.executable).with_name("recserve")
    printed = subprocess.run([str(cli), "include-path"], check=True, capture_output=True, text=True).stdout.strip()
    assert printed == include_dir() and (Path(printed) / "processor.h").is_file()
    lib_dir = str(Path(library_path()).parent)
    binary = client.compile(
        Path(__file__).with_name("linked_client.c"), "linked_client",
        f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-Wl,--no-as-needed", "-lserving_processor",
    )
    reply = client.workdir / "linked.reply"
    result = client.execute([binary, demo.config_path, demo.warmup_path, reply])
    assert result.returncode == 0, result.stderr[-2000:]
    assert (int(result.stdout), reply.read_bytes()) == processor.process_python(demo.warmup_path.read_bytes())


def test_8_threads_x_2000_requests_equal_python_process(
    client, demo, processor, make_requests
) -> None:
    requests = [*make_requests(demo, 24, batch=4), b""]  # b"": the input_size == 0 probe
    expected = [processor.process_python(r) for r in requests]
    assert [s for s, _ in expected] == [200] * len(requests)
    result = client.run(
        "serve",
        demo.config_path,
        client.requests_file("serve.req", requests),
        client.replies_file("serve.exp", expected),
        8,
        2000,
    )
    assert result.returncode == 0, result.stderr
    assert re.match(r"sent 16000 mismatched 0 seconds ", result.stdout), (
        result.stdout + result.stderr
    )


def test_each_reply_equals_python_process(client, demo, processor, make_requests) -> None:
    requests = [*make_requests(demo, 6, batch=8, seed=1), b""]
    result = client.run(
        "once",
        demo.config_path,
        client.requests_file("once.req", requests),
        client.workdir / "once.out",
    )
    assert result.returncode == 0, result.stderr
    replies = client.read_replies("once.out")
    assert replies == [processor.process_python(r) for r in requests]
    response = predict_pb2.PredictResponse.FromString(replies[0][1])
    assert set(response.outputs) == {"probabilities", "logits"}
    assert replies[-1] == (200, json.dumps(processor.signature_info()).encode())


def test_batch_process_gives_each_request_its_own_reply(
    client, demo, processor, make_requests
) -> None:
    requests = [
        *make_requests(demo, 3, seed=2),
        b"\xff\xff not a request",
        *make_requests(demo, 2, seed=3),
    ]
    result = client.run(
        "batch",
        demo.config_path,
        client.requests_file("batch.req", requests),
        client.workdir / "batch.out",
    )
    assert result.returncode == 0, result.stderr
    assert client.read_replies("batch.out") == [processor.process_python(r) for r in requests]
    assert result.stdout == "batch_status 400\n"  # the first status that is not 200


def test_get_serving_model_info(client, demo, processor) -> None:
    result = client.run("info", demo.config_path, client.workdir / "info.out")
    assert result.returncode == 0, result.stderr
    [(status, data)] = client.read_replies("info.out")
    assert status == 200
    info = predict_pb2.ServingModelInfo.FromString(data)
    assert info.model_path == str(demo.checkpoint_dir)
    expected = predict_pb2.ServingModelInfo.FromString(processor.model_info_bytes())
    assert info.model_path == expected.model_path


def _second_model(root: Path) -> Path:
    """The demo plus a newer version with another last layer: different outputs."""
    other = write_demo(root)
    dense = {name: value * -2.0 for name, value in demo_dense().items()}
    write_checkpoint(other.checkpoint_dir, demo_tables(), global_step=GLOBAL_STEP + 1, dense=dense)
    return other.config_path


def test_two_handles_serve_concurrently_and_destroy_frees_one(
    client, demo, processor, make_requests, tmp_path
) -> None:
    config_b = _second_model(tmp_path / "b")
    processor_b = Processor(config_b.read_text())
    try:
        requests = make_requests(demo, 12, batch=4, seed=4)
        expected_a = [processor.process_python(r) for r in requests]
        expected_b = [processor_b.process(r) for r in requests]
    finally:
        processor_b.close()
    assert all(a != b for a, b in zip(expected_a, expected_b))
    reqs = client.requests_file("two.req", requests)
    result = client.run(
        "two",
        demo.config_path,
        reqs,
        client.replies_file("two_a.exp", expected_a),
        config_b,
        reqs,
        client.replies_file("two_b.exp", expected_b),
        4,
        500,
    )
    assert result.returncode == 0, result.stderr
    counts = dict(zip(*[iter(result.stdout.split())] * 2))
    assert counts["a_sent"] == "2000" and counts["a_mismatched"] == "0", (
        result.stdout + result.stderr
    )
    assert int(counts["b_sent"]) >= 2000 and counts["b_mismatched"] == "0", (
        result.stdout + result.stderr
    )
    assert int(counts["b_after_destroy"]) > 0, result.stdout


def test_readme_example_compiles_and_runs(client, demo, processor) -> None:
    [source] = [
        b for b in re.findall(r"```c\n(.*?)```", DOCS.read_text(), re.DOTALL) if "int main" in b
    ]
    path = client.workdir / "example.c"
    path.write_text(source)
    binary = client.compile(path, "example")
    result = client.execute([binary, client.library, demo.config_path, demo.warmup_path])
    assert result.returncode == 0, result.stderr
    status, response = processor.process_python(demo.warmup_path.read_bytes())
    signature = json.dumps(processor.signature_info())
    assert result.stdout.splitlines() == [
        f"process: status {status}, PredictResponse of {len(response)} bytes",
        f"signature: {signature}",
        f"get_serving_model_info: status 200, ServingModelInfo of {len(processor.model_info_bytes())} bytes",
    ]


def test_initialize_in_a_host_without_python_installs_no_signal_handlers(client, demo) -> None:
    result = client.run("init", demo.config_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "state 0 handle set signals_changed 0\n"
